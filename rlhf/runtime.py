"""A process's runtime arithmetic: the CPU pin, threads, seeding and CUDA determinism.

Everything that decides which arithmetic a process runs lives here, at the bottom of the import
graph: nothing here imports from rlhf (the profile's type only for annotations), so every module
may use it, and nothing imports torch at module level, because the pin must be set before torch
exists in the process.

    apply() / release()             the CPU pin, set before torch is imported
    describe() / identity_tag()     the arithmetic in force, for results files and identities
    configure_torch(profile)        the profile's thread count and the global torch seed
    seed_system_rngs(seed)          the RNGs a saved state holds (torch global, python `random`)
    rng_state() / set_rng_state()   those RNGs' state, saved in and restored from resume states
    configure_determinism(profile)  CUDA's deterministic switches for a CUDA profile
    cpu_flags() / choose_dtype()    the dtype a profile's base computes in, chosen by what the CPU can do

Pinned CPU arithmetic: the same bytes on every x86-64 machine. torch picks its CPU kernels by
what the processor offers, and so does MKL: the same code and seed give different bytes on an
AVX-512 Xeon, an AVX2 laptop and an AMD EPYC. Before torch is imported, `apply()` (run by
`rlhf/__init__.py`, so by the `rlhf` command, `python -m rlhf`, `conftest.py` and every
subprocess that imports the package) sets

    ATEN_CPU_CAPABILITY = avx2         torch's own vectorised kernels: the AVX2 build on every CPU
    MKL_CBWR            = COMPATIBLE   MKL's reproducibility branch that Intel documents as the same
                                       on Intel and non-Intel processors
    ONEDNN_MAX_CPU_ISA  = AVX2         oneDNN (BF16 matmuls on CPU) no wider than AVX2

and the stages set the thread count the profile names (`runtime.torch_threads`, through
`configure_torch`).

The variables are requests; `describe()` reads what is in force: torch's kernel capability and
the branch MKL itself reports (`mkl_serv_cbwr_get`). MKL accepts `MKL_CBWR=AVX2` on an AMD CPU
and runs its AUTO branch instead, so only the branch in force proves the pin. The run's identity
(`identity_tag`) is built from those values, never from the request.

The pin alone does not make two CPU vendors agree: an operation built on the processor's
approximate instructions (MKL's vector square root, whose reciprocal-square-root estimate
differs between Intel and AMD) parts them under any pin. The lab avoids such operations
(rlhf.optim.adamw), and `rlhf arithmetic` (rlhf.arithmetic) measures whether a machine computes
like the machines the golden numbers were verified on (docs/reproducibility.md).

Off switch: `RLHF_CPU_PIN=off` (or 0/no/false) before the process starts. The run's identity
and every results file then say "unpinned", so pinned and unpinned states never mix. A BF16
profile on the CPU runs unpinned unless asked (`release()`, called by the command line before
torch is imported; `--pin` keeps the pin): capped at AVX2, oneDNN's BF16 matmuls are tens of
times slower, and no golden numbers exist for those profiles. A CPU that cannot honour the pin
(not x86-64, or no AVX2, or torch without MKL) still runs; `describe()` says plainly that its
hashes cannot be compared with the pinned golden numbers.

Compute dtype: a BF16 checkpoint computes in BF16 on CUDA and on a CPU with native BF16
instructions (the `avx512_bf16` or `amx_bf16` flag). Elsewhere (AVX2-only CPUs, most laptops)
oneDNN emulates BF16 matrix products through a slow path: on an AMD EPYC Zen 3 the full-width
Qwen vocabulary projection ran at 10 GFLOP/s in BF16 against 65 in FP32, and one SFT update of
the 2-layer full-width model took minutes. There `choose_dtype` widens the BF16 weights to FP32
(exactly: every BF16 number is an FP32 number) and says so; `--dtype` forces either. The flags
are read from the CPU (/proc/cpuinfo), never guessed from the vendor.

CUDA determinism: a CUDA profile runs with torch's deterministic algorithms, a fixed cuBLAS
workspace and TF32 off (`configure_determinism`); CPU profiles are left alone, their arithmetic
is the pin's.
"""

from __future__ import annotations

import ctypes
import os
import platform
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlhf.config import Profile

__all__ = [
    "CUBLAS_WORKSPACE",
    "MKL_BRANCHES",
    "PIN",
    "SWITCH",
    "apply",
    "configure_determinism",
    "choose_dtype",
    "configure_torch",
    "cpu_flags",
    "describe",
    "describe_determinism",
    "identity_tag",
    "is_deterministic",
    "mkl_branch_in_force",
    "mkl_sees_intel",
    "release",
    "requested",
    "rng_state",
    "seed_system_rngs",
    "set_rng_state",
]

PIN = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}
SWITCH = "RLHF_CPU_PIN"
_OFF_VALUES = ("0", "off", "no", "false")

# MKL's code branches as mkl_serv_cbwr_get(MKL_CBWR_BRANCH) reports them (mkl_service.h).
MKL_BRANCHES = {
    1: "OFF",
    2: "AUTO",
    3: "COMPATIBLE",
    4: "SSE2",
    6: "SSSE3",
    7: "SSE4_1",
    8: "SSE4_2",
    9: "AVX",
    10: "AVX2",
    12: "AVX512",
    14: "AVX512_E1",
}
_MKL_CBWR_BRANCH = 1
_MKL_CBWR_STRICT = 0x10000

# What apply() found and did, for describe(): "pinned", "off" (the switch), "late" (torch was
# imported before rlhf, so the environment could no longer choose its kernels) or "released"
# (a BF16 profile on the CPU, unpinned by default). `saved` holds the user's own values.
_applied: dict = {"status": None, "overridden": {}, "saved": {}, "reason": ""}


def requested() -> bool:
    """False when the user turned the pin off with RLHF_CPU_PIN."""
    return os.environ.get(SWITCH, "on").strip().lower() not in _OFF_VALUES


def apply() -> str:
    """Set the pin in os.environ if torch is not imported yet; returns the status."""
    if _applied["status"] is not None:
        return _applied["status"]
    if not requested():
        status = "off"
    elif "torch" in sys.modules:
        status = "late"
    else:
        for key, value in PIN.items():
            old = os.environ.get(key)
            _applied["saved"][key] = old
            if old is not None and old != value:
                _applied["overridden"][key] = old
            os.environ[key] = value
        status = "pinned"
    _applied["status"] = status
    return status


def release(reason: str) -> str:
    """Undo apply() before torch is imported (the user's own variables come back); returns the
    status. For runs the pin does not serve: a BF16 profile on the CPU. Too late once torch is
    imported: the status then stays as it was and the caller's run stays pinned."""
    if _applied["status"] != "pinned" or "torch" in sys.modules:
        return _applied["status"]
    for key, old in _applied["saved"].items():
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old
    _applied.update(status="released", overridden={}, reason=reason)
    return "released"


def _mkl_service():
    """torch's CPU library, where its MKL's service functions live, or None. Imports torch."""
    import torch

    lib_dir = Path(torch.__file__).parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
        if (lib_dir / name).is_file():
            try:
                lib = ctypes.CDLL(str(lib_dir / name))
                lib.mkl_serv_cbwr_get  # noqa: B018 - present only where torch carries MKL
                return lib
            except (OSError, AttributeError):
                return None
    return None


def mkl_branch_in_force() -> str | None:
    """The code branch MKL reports it runs ("COMPATIBLE", "AUTO", ...; "+STRICT" when set), or
    None where torch carries no MKL service functions. Imports torch."""
    lib = _mkl_service()
    if lib is None:
        return None
    get = lib.mkl_serv_cbwr_get
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    value = get(_MKL_CBWR_BRANCH)
    branch = MKL_BRANCHES.get(value & ~_MKL_CBWR_STRICT, f"unknown-{value}")
    return branch + ("+STRICT" if value & _MKL_CBWR_STRICT else "")


def mkl_sees_intel() -> bool | None:
    """Whether MKL takes this processor for an Intel one (its CPUID vendor check), or None without
    MKL. MKL honours some of its switches (MKL_ENABLE_INSTRUCTIONS) on Intel processors only."""
    lib = _mkl_service()
    if lib is None:
        return None
    check = lib.mkl_serv_intel_cpu_true
    check.restype = ctypes.c_int
    return bool(check())


def describe() -> dict:
    """What arithmetic this process really runs (imports torch): recorded in every results file.

    `comparable` is True only when the pin is set and in force, i.e. when this process's hashes
    can be compared with the committed golden numbers of another machine.
    """
    import torch

    machine = platform.machine().lower()
    capability = torch.backends.cpu.get_cpu_capability()
    mkl = bool(torch.backends.mkl.is_available())
    branch = mkl_branch_in_force() if mkl else None
    status = _applied["status"] or ("off" if not requested() else "late")
    problems = []
    if status == "off":
        problems.append(f"turned off with {SWITCH}")
    elif status == "late":
        problems.append("torch was imported before rlhf, so the pin could not be set")
    elif status == "released":
        problems.append(f"unpinned by default: {_applied['reason']}")
    if machine not in ("x86_64", "amd64"):
        problems.append(f"{machine} is not x86-64: the AVX2/MKL pin does not exist there")
    elif status == "pinned" and capability != "AVX2":
        problems.append(f"torch runs {capability} kernels, not AVX2 (this CPU cannot honour the pin)")
    if status == "pinned" and not mkl:
        problems.append("this torch has no MKL, so MKL_CBWR pins nothing")
    elif status == "pinned" and branch != PIN["MKL_CBWR"]:
        problems.append(f"MKL runs its {branch} branch, not {PIN['MKL_CBWR']} (MKL_CBWR={os.environ.get('MKL_CBWR')})")
    return {
        "status": status,
        "pin": dict(PIN) if status == "pinned" else {},
        "overridden_user_settings": dict(_applied["overridden"]),
        "environment": {k: os.environ.get(k) for k in PIN},
        "machine": machine,
        "cpu_capability": capability,
        "mkl": mkl,
        "mkl_branch": branch,
        "mkl_sees_intel": mkl_sees_intel() if mkl else None,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "comparable": not problems,
        "note": "pinned arithmetic: hashes comparable across x86-64 CPUs"
        if not problems
        else "hashes NOT comparable with the pinned golden numbers: " + "; ".join(problems),
    }


def identity_tag() -> str:
    """The short form that goes into every state's identity (a resume refuses a different one),
    built from the settings in force."""
    d = describe()
    if d["comparable"]:
        onednn = (d["environment"]["ONEDNN_MAX_CPU_ISA"] or "default").lower()
        return (
            f"pinned:{d['machine']}:aten-{d['cpu_capability'].lower()}:mkl-{d['mkl_branch'].lower()}"
            f":onednn-{onednn}:threads={d['threads']}"
        )
    why = "pin-not-in-force" if d["status"] == "pinned" else d["status"]
    return f"unpinned:{d['machine']}:{d['cpu_capability']}:threads={d['threads']}:{why}"


# The CPU flags that mean native BF16 matrix arithmetic (AVX-512 BF16 dot products, AMX tiles).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
CPUINFO = Path("/proc/cpuinfo")
DTYPE_CHOICES = ("auto", "float32", "bfloat16")


def cpu_flags(path: Path = CPUINFO) -> frozenset[str] | None:
    """The feature flags the kernel reports for the first CPU (`flags` line of /proc/cpuinfo),
    or None where they cannot be read (not Linux, no such line)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return None


def choose_dtype(stored: str, device: str, requested: str = "auto", flags: frozenset[str] | None = None) -> dict:
    """The dtype a base stored as `stored` computes in on `device`, and why.

        requested float32/bfloat16   that dtype (asked for: --dtype)
        auto, stored float32         float32
        auto, BF16 on CUDA           bfloat16
        auto, BF16 on a CPU          bfloat16 where the flags show native BF16 (NATIVE_BF16_FLAGS),
                                     else float32 (the BF16 weights widened exactly)

    `flags`: the CPU's flags (default: read with `cpu_flags()`). Returns {"dtype", "stored",
    "requested", "reason", "force"}: `force` is the option that asks for the other dtype (None for
    float32 weights, which are never rounded to BF16)."""
    if requested not in DTYPE_CHOICES:
        raise ValueError(f"compute dtype must be one of {', '.join(DTYPE_CHOICES)}, not {requested!r}")
    if stored not in DTYPE_CHOICES[1:]:
        raise ValueError(f"stored dtype must be float32 or bfloat16, not {stored!r}")
    if stored == "float32" and requested == "bfloat16":
        raise ValueError("the weights are stored in float32: --dtype bfloat16 would round them (use auto or float32)")
    if requested != "auto":
        dtype, reason = requested, f"asked for (--dtype {requested})"
    elif stored == "float32":
        dtype, reason = "float32", "the weights are stored in float32"
    elif device != "cpu":
        dtype, reason = "bfloat16", f"{device} computes BF16 natively"
    else:
        flags = cpu_flags() if flags is None else flags
        native = sorted(set(NATIVE_BF16_FLAGS) & set(flags or ()))
        if native:
            dtype, reason = "bfloat16", f"this CPU has native BF16 instructions ({', '.join(native)})"
        elif flags is None:
            dtype, reason = "float32", "this CPU's flags cannot be read, so native BF16 is not assumed"
        else:
            dtype = "float32"
            reason = (
                "this CPU has no native BF16 instructions (no avx512_bf16 or amx_bf16 among its flags): "
                "BF16 matrix products would run through a slow emulation, so the BF16 weights are "
                "widened to float32 (exactly)"
            )
    other = "bfloat16" if dtype == "float32" else "float32"
    force = f"--dtype {other}" if stored == "bfloat16" else None  # float32 weights are never rounded to BF16
    return {"dtype": dtype, "stored": stored, "requested": requested, "reason": reason, "force": force}


def configure_torch(profile: Profile) -> None:
    """Apply the profile's runtime settings (thread count) and the global torch seed."""
    import torch

    if profile.runtime.torch_threads:
        torch.set_num_threads(profile.runtime.torch_threads)
    torch.manual_seed(profile.seeds.torch)


def seed_system_rngs(seed: int) -> None:
    """Seed the RNGs that `rng_state` saves (torch global, python `random`). Nothing in rlhf
    draws from python's `random`, but a saved state holds it: seeded, two processes running the
    same stage write byte-identical state files."""
    import torch

    torch.manual_seed(seed)
    random.seed(seed)


def rng_state() -> dict:
    """The system RNGs (torch global, python `random`)."""
    import torch

    state = {
        "torch": torch.get_rng_state(),
        "python": list(random.getstate()[1]),
        "python_version": random.getstate()[0],
        "python_gauss": random.getstate()[2],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate((state["python_version"], tuple(state["python"]), state["python_gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# CUDA's deterministic settings: the GPU tier demands a bit-identical resume, and
# cuBLAS picks reduction orders by workspace and TF32 rounds FP32 matmul inputs to 10 bits.
CUBLAS_WORKSPACE = ":4096:8"


def configure_determinism(profile: Profile) -> dict:
    """Make a CUDA profile's arithmetic deterministic; returns what is now in force (recorded in
    run.json and the evaluation's results.json by the callers).

    For `device = "cuda"`: `torch.use_deterministic_algorithms(True)` (an op without a
    deterministic kernel raises instead of drifting) without its NaN fills of uninitialised
    memory (a launch per allocation, no number changed), `CUBLAS_WORKSPACE_CONFIG=:4096:8` (set
    before the first cuBLAS call creates its handle, which is why the lab's Context applies it
    before any role is built), TF32 off for matmuls and cuDNN, cuDNN deterministic and without
    autotuning. A different CUBLAS_WORKSPACE_CONFIG the user set is replaced and reported.
    CPU profiles are left alone: their arithmetic is pinned by `apply()`, and the golden hashes
    of the embedded lab were made without these switches.
    """
    import torch

    if profile.device != "cuda":
        return describe_determinism(applied=False)
    previous = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    torch.use_deterministic_algorithms(True)
    # Deterministic mode also fills every uninitialised tensor (torch.empty, a dtype cast's
    # output) with NaN: a kernel launch each, about 870 of a decode step's 2,900 at 24 layers.
    # The lab reads no tensor before writing it, so the fills change no number; they are off.
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    overridden = {"CUBLAS_WORKSPACE_CONFIG": previous} if previous not in (None, CUBLAS_WORKSPACE) else {}
    return describe_determinism(applied=True, overridden=overridden)


def describe_determinism(*, applied: bool, overridden: dict | None = None) -> dict:
    """The deterministic settings as torch and the environment report them now (not as asked)."""
    import torch

    state = {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "fill_uninitialized_memory": bool(torch.utils.deterministic.fill_uninitialized_memory),  # type: ignore[attr-defined]
    }
    return {
        "applied": applied,
        "overridden_user_settings": overridden or {},
        **state,
        "complete": applied and is_deterministic(state),
    }


def is_deterministic(state: dict) -> bool:
    """True when every CUDA determinism switch of `describe_determinism` is in its safe position."""
    return (
        state["deterministic_algorithms"]
        and state["cublas_workspace_config"] == CUBLAS_WORKSPACE
        and not state["matmul_allow_tf32"]
        and not state["cudnn_allow_tf32"]
        and state["cudnn_deterministic"]
        and not state["cudnn_benchmark"]
    )
