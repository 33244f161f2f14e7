"""Runtime arithmetic of a process: threads, seeding and CUDA determinism, in one place.

The CPU pin (which kernels torch and MKL run) is set before torch is imported, by rlhf.pin
(run from rlhf/__init__.py). Everything that needs torch lives here, below every stage:

    configure_torch(profile)        the profile's thread count and the global torch seed
    seed_system_rngs(seed)          the RNGs a saved state holds (torch global, python `random`)
    rng_state() / set_rng_state()   those RNGs' state, saved in and restored from resume states
    configure_determinism(profile)  CUDA's deterministic switches for a CUDA profile

Nothing here imports from rlhf (the profile's type only for annotations): every module may use it.
"""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rlhf.config import Profile

__all__ = [
    "CUBLAS_WORKSPACE",
    "configure_determinism",
    "configure_torch",
    "describe_determinism",
    "is_deterministic",
    "rng_state",
    "seed_system_rngs",
    "set_rng_state",
]


def configure_torch(profile: Profile) -> None:
    """Apply the profile's runtime settings (thread count) and the global torch seed."""
    if profile.runtime.torch_threads:
        torch.set_num_threads(profile.runtime.torch_threads)
    torch.manual_seed(profile.seeds.torch)


def seed_system_rngs(seed: int) -> None:
    """Seed the RNGs that `rng_state` saves (torch global, python `random`). Nothing in rlhf
    draws from python's `random`, but a saved state holds it: seeded, two processes running the
    same stage write byte-identical state files."""
    torch.manual_seed(seed)
    random.seed(seed)


def rng_state() -> dict:
    """The system RNGs (torch global, python `random`)."""
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
    deterministic kernel raises instead of drifting), `CUBLAS_WORKSPACE_CONFIG=:4096:8` (set
    before the first cuBLAS call creates its handle, which is why the lab's Context applies it
    before any role is built), TF32 off for matmuls and cuDNN, cuDNN deterministic and without
    autotuning. A different CUBLAS_WORKSPACE_CONFIG the user set is replaced and reported.
    CPU profiles are left alone: their arithmetic is pinned by rlhf.pin, and the golden hashes
    of the embedded lab were made without these switches.
    """
    if profile.device != "cuda":
        return describe_determinism(applied=False)
    previous = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    overridden = {"CUBLAS_WORKSPACE_CONFIG": previous} if previous not in (None, CUBLAS_WORKSPACE) else {}
    return describe_determinism(applied=True, overridden=overridden)


def describe_determinism(*, applied: bool, overridden: dict | None = None) -> dict:
    """The deterministic settings as torch and the environment report them now (not as asked)."""
    state = {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
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
