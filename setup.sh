#!/usr/bin/env bash
# Creates ./.venv (if missing) and installs the pinned dependencies, `rlhf` itself and the `test`
# and `bench` extras (bench: trl 1.12.0 for the TRL side-by-side benchmark, which CI runs once;
# it adds about 15 s and 0.1 GB to a 1.5 GB environment and changes no installed version).
# Idempotent: a second run only compares stamps and returns in well under a second.
#   bash setup.sh          the lab and the inner test loop (pytest -m "unit and not e2e")
#   bash setup.sh --tests  also what the whole unit tier needs beyond .venv: Debian's chromium
#                          and qemu-user, and ./.venv-verl (about 100 s and 1.8 GB more, once)
#   bash setup.sh --verl   only ./.venv-verl, verl 0.9.1's own environment for the hand-off
#                          checks of tests_verl/ (requirements-verl.txt)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
MODE=${1:-}
case "$MODE" in "" | --tests | --verl) ;; *) echo "setup.sh: unknown option $MODE (use --tests or --verl)" >&2; exit 2 ;; esac
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

build_verl() {
    local stamp
    stamp=$(cat requirements-verl.txt setup.sh | sha256sum | cut -c1-16)
    if [ -f .venv-verl/.rlhf-stamp ] && [ "$(cat .venv-verl/.rlhf-stamp)" = "$stamp" ]; then
        return 0
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
    echo "$stamp" > .venv-verl/.rlhf-stamp
    echo "setup: .venv-verl done" >&2
}

apt_install() {  # $1: the command it provides, $2: the Debian package, $3: why
    command -v "$1" >/dev/null 2>&1 && return 0
    echo "setup: installing Debian's $2 ($3)" >&2
    local SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}

build_lab() {
    local stamp
    stamp=$(cat pyproject.toml setup.sh | sha256sum | cut -c1-16)
    if [ -f .venv/.rlhf-stamp ] && [ "$(cat .venv/.rlhf-stamp)" = "$stamp" ]; then
        return 0
    fi
    echo "setup: creating .venv and installing pinned dependencies (first run only)" >&2
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    # torch first and pinned: pip takes the CPU wheel from local disk instead of a CUDA build.
    # (pip's notes about this machine's missing local index folders are filtered out; errors are not)
    quiet .venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
    quiet .venv/bin/pip install --quiet --disable-pip-version-check -e ".[test,bench]"
    echo "$stamp" > .venv/.rlhf-stamp
    echo "setup: done" >&2
}

if [ "$MODE" = "--verl" ]; then
    build_verl
    exit 0
fi
build_lab
if [ "$MODE" = "--tests" ]; then
    # Checked on every call, so that a machine with a ready .venv still gets them; no-ops once present.
    apt_install chromium chromium "renders report.html in tests_heldout/test_report_render.py"
    apt_install qemu-x86_64 qemu-user "runs the arithmetic fingerprint on an emulated CPU of the other vendor"
    build_verl
fi
