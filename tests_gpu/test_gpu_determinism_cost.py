"""What CUDA's deterministic settings cost: one PPO leg with them and one without, side by side
(a benchmark, run in the gpu tier: `pytest -m gpu tests_gpu/test_gpu_determinism_cost.py`; the
last part of scripts/gpu_check.sh).

The smoke profile's SFT and judge (gpu_lab.smoke_profile, --random-weights or --model-dir),
then PPO's continuous leg of LEG_ITERATIONS iterations from them twice in this process: with
`torch.use_deterministic_algorithms(True)` (the lab's setting, rlhf.runtime.configure_determinism)
and without it, interleaved (on, off, on, off) so that both see the same machine; the best of each
and their ratio go to the numbers file. The two legs' states are not compared: without
deterministic algorithms they may differ, which is why the lab keeps them on."""

from __future__ import annotations

import time

import pytest
import torch
from gpu_lab import Numbers, qwen_model_dir, smoke_profile

from rlhf.config import override

pytestmark = pytest.mark.gpu

LEG_ITERATIONS = 20
ROUNDS = 2


def test_what_deterministic_algorithms_cost_in_a_ppo_leg(request, tmp_path, benchmark, record_result):
    from rlhf import lab
    from rlhf.ppo import train_ppo
    from rlhf.runtime import configure_determinism

    if not torch.cuda.is_available():
        pytest.fail("the gpu tier needs CUDA: no CUDA device is visible to torch")
    try:
        model_dir, profile = qwen_model_dir(request.config, tmp_path, smoke_profile())
    except RuntimeError as err:
        pytest.fail(str(err))
    profile = override(profile, {("ppo", "iterations"): LEG_ITERATIONS, ("ppo", "resume_stop_iteration"): 1})
    ctx = lab.open_context(tmp_path / "run", profile, model_dir=model_dir)
    lab.run_stages(ctx, protocol=False, until="judge")
    view = ctx.corpus.learning_view()
    seconds: dict[str, list[float]] = {"deterministic": [], "not_deterministic": []}

    def leg(deterministic: bool) -> None:
        torch.use_deterministic_algorithms(deterministic)
        roles = lab.ppo_roles(ctx)
        torch.cuda.synchronize()
        t = time.perf_counter()
        train_ppo(roles, view, ctx.tokens(), ctx.profile)
        torch.cuda.synchronize()
        seconds["deterministic" if deterministic else "not_deterministic"].append(time.perf_counter() - t)

    def run():
        try:
            for _ in range(ROUNDS):
                leg(True)
                leg(False)
        finally:
            configure_determinism(ctx.profile)  # the lab's settings back

    benchmark.pedantic(run, rounds=1, iterations=1)
    best = {k: min(v) for k, v in seconds.items()}
    cost = {
        "iterations": LEG_ITERATIONS,
        "best_seconds": best,
        "deterministic_over_not": best["deterministic"] / best["not_deterministic"],
    }
    Numbers(request.config._rlhf_gpu_out).add("determinism", "ppo_leg", cost)
    record_result("gpu_determinism_cost", cost)
    assert all(s > 0 for v in seconds.values() for s in v) and len(seconds["deterministic"]) == ROUNDS
