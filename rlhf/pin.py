"""Pinned CPU arithmetic: the same bytes on every x86-64 machine (issue 12).

torch picks its CPU kernels by what the processor offers, and so does MKL: the same code and
seed give different bytes on an AVX-512 Xeon, an AVX2 laptop and an AMD EPYC. Before torch is
imported, `apply()` (run by `rlhf/__init__.py`, so by the `rlhf` command, `python -m rlhf`,
`conftest.py` and every subprocess that imports the package) sets

    ATEN_CPU_CAPABILITY = avx2         torch's own vectorised kernels: the AVX2 build on every CPU
    MKL_CBWR            = COMPATIBLE   MKL's reproducibility branch that Intel documents as the same
                                       on Intel and non-Intel processors (SSE2-level code paths)
    ONEDNN_MAX_CPU_ISA  = AVX2         oneDNN (BF16 matmuls on CPU) no wider than AVX2

and the stages set the thread count the profile names (`runtime.torch_threads`).

How it was chosen (measured on an Intel Xeon with AVX-512, the SFT state after epoch 1): without
the pin the state has three different SHA-256 for ATEN_CPU_CAPABILITY default/avx2/avx512, and
a fourth when MKL is limited to AVX2 (`MKL_ENABLE_INSTRUCTIONS=AVX2`, what an AVX2-only machine
offers). With `MKL_CBWR=AVX2` the state still changes when MKL is limited to SSE4.2, and on an
AMD EPYC that setting gave the same bytes as no setting at all. With `MKL_CBWR=COMPATIBLE` the
state is the same whether MKL may use AVX-512, AVX2 or only SSE4.2, and with 1 or 2 OpenMP
threads. The pin costs little here: see README "Same numbers on every machine".

Off switch: `RLHF_CPU_PIN=off` (or 0/no/false) before the process starts. The run's identity
and every results file then say "unpinned", so pinned and unpinned states never mix. A CPU that
cannot honour the pin (not x86-64, or no AVX2, or torch without MKL) still runs; `describe()`
says plainly that its hashes cannot be compared with the pinned golden numbers.

This module must not import torch at module level: it runs before torch exists in the process.
"""

from __future__ import annotations

import os
import platform
import sys

PIN = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}
SWITCH = "RLHF_CPU_PIN"
_OFF_VALUES = ("0", "off", "no", "false")

# What apply() found and did, for describe(): "pinned", "off" (the switch), or "late" (torch was
# imported before rlhf, so the environment could no longer choose its kernels).
_applied: dict = {"status": None, "overridden": {}}


def requested() -> bool:
    """False when the user turned the pin off with RLHF_CPU_PIN."""
    return os.environ.get(SWITCH, "on").strip().lower() not in _OFF_VALUES


def apply() -> str:
    """Set the pin in os.environ if torch is not imported yet; returns the status."""
    if _applied["status"] is not None:
        return _applied["status"]
    if not requested():
        _applied["status"] = "off"
    elif "torch" in sys.modules:
        _applied["status"] = "late"
    else:
        for key, value in PIN.items():
            old = os.environ.get(key)
            if old is not None and old != value:
                _applied["overridden"][key] = old
            os.environ[key] = value
        _applied["status"] = "pinned"
    return _applied["status"]


def describe() -> dict:
    """What arithmetic this process really runs (imports torch): recorded in every results file.

    `comparable` is True only when the pin is set and honoured, i.e. when this process's hashes
    can be compared with the committed golden numbers of another machine.
    """
    import torch

    machine = platform.machine().lower()
    capability = torch.backends.cpu.get_cpu_capability()
    mkl = bool(torch.backends.mkl.is_available())
    status = _applied["status"] or ("off" if not requested() else "late")
    problems = []
    if status == "off":
        problems.append(f"turned off with {SWITCH}")
    elif status == "late":
        problems.append("torch was imported before rlhf, so the pin could not be set")
    if machine not in ("x86_64", "amd64"):
        problems.append(f"{machine} is not x86-64: the AVX2/MKL pin does not exist there")
    elif status == "pinned" and capability != "AVX2":
        problems.append(f"torch runs {capability} kernels, not AVX2 (this CPU cannot honour the pin)")
    if status == "pinned" and not mkl:
        problems.append("this torch has no MKL, so MKL_CBWR pins nothing")
    return {
        "status": status,
        "pin": dict(PIN) if status == "pinned" else {},
        "overridden_user_settings": dict(_applied["overridden"]),
        "environment": {k: os.environ.get(k) for k in PIN},
        "machine": machine,
        "cpu_capability": capability,
        "mkl": mkl,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "comparable": not problems,
        "note": "pinned arithmetic: hashes comparable across x86-64 CPUs"
        if not problems
        else "hashes NOT comparable with the pinned golden numbers: " + "; ".join(problems),
    }


def identity_tag() -> str:
    """The short form that goes into every state's identity (a resume refuses a different one)."""
    d = describe()
    if d["comparable"]:
        return f"pinned:{d['machine']}:aten-avx2:mkl-compatible:onednn-avx2:threads={d['threads']}"
    return f"unpinned:{d['machine']}:{d['cpu_capability']}:threads={d['threads']}:{d['status']}"
