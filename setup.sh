#!/usr/bin/env bash
# Creates ./.venv (if missing) and installs the pinned dependencies, `rlhf` itself and the `test`
# and `bench` extras (bench: trl 1.12.0 for the TRL side-by-side benchmark, which CI runs once;
# it adds about 15 s and 0.1 GB to a 1.5 GB environment and changes no installed version).
# Idempotent: a second run only compares a stamp and returns in well under a second.
#   bash setup.sh --verl   instead builds ./.venv-verl, verl 0.9.1's own environment for the
#                          hand-off checks of tests_verl/ (requirements-verl.txt); only on request.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
if [ "${1:-}" = "--verl" ]; then
    stamp_verl=$(cat requirements-verl.txt setup.sh | sha256sum | cut -c1-16)
    if [ -f .venv-verl/.rlhf-stamp ] && [ "$(cat .venv-verl/.rlhf-stamp)" = "$stamp_verl" ]; then
        exit 0
    fi
    echo "setup: creating .venv-verl (verl 0.9.1 for the hand-off checks)" >&2
    [ -x .venv-verl/bin/python ] || "$PY" -m venv .venv-verl
    pipv() { quiet .venv-verl/bin/pip install --quiet --disable-pip-version-check "$@"; }
    pipv torch==2.13.0
    # No dependencies: verl's own list pulls vllm, flash-attn and CUDA builds the CPU checks never import.
    pipv --no-deps verl==0.9.1 torchdata==0.11.0
    # OpenRLHF's model code needs flash-attn (no CPU build) and pins transformers 5.15.0: only its
    # dataset classes are used, so without its dependencies.
    pipv --no-deps openrlhf==0.11.2
    pipv -r requirements-verl.txt
    echo "$stamp_verl" > .venv-verl/.rlhf-stamp
    echo "setup: .venv-verl done" >&2
    exit 0
fi
# Headless Chromium (Debian's package) renders report.html in tests_heldout/test_report_render.py.
# Checked before the stamp so that a machine with a ready .venv still gets it; a no-op once present.
if [ ! -x /usr/bin/chromium ]; then
    echo "setup: installing Debian's chromium (renders report.html in the held-out report test)" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
# Debian's qemu-user runs the arithmetic fingerprint on an emulated CPU of the other vendor
# (tests_unit/test_arithmetic.py): the same bytes on Intel and AMD, checked on every machine.
if ! command -v qemu-x86_64 >/dev/null 2>&1; then
    echo "setup: installing Debian's qemu-user (the other-vendor arithmetic check)" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user >/dev/null
fi
stamp_src=$(cat pyproject.toml setup.sh | sha256sum | cut -c1-16)
if [ -f .venv/.rlhf-stamp ] && [ "$(cat .venv/.rlhf-stamp)" = "$stamp_src" ]; then
    exit 0
fi
echo "setup: creating .venv and installing pinned dependencies (first run only)" >&2
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# torch first and pinned: pip takes the CPU wheel from local disk instead of a CUDA build.
# (pip's notes about this machine's missing local index folders are filtered out; errors are not)
quiet .venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
quiet .venv/bin/pip install --quiet --disable-pip-version-check -e ".[test,bench]"
echo "$stamp_src" > .venv/.rlhf-stamp
echo "setup: done" >&2
