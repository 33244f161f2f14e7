"""The lab's optimizer is torch's fused AdamW, by its bytes and on every training path.

The cross-CPU golden numbers rest on it (rlhf.optim.adamw's docstring): the single-tensor and
multi-tensor AdamW take their square root through MKL's vector math, whose low bits differ
between CPU vendors. Two checks, neither reading a flag:

* bytes: three steps of `rlhf.optim.adamw` equal three steps of torch's fused AdamW, byte for
  byte, and differ from the single-tensor and multi-tensor paths on the same inputs;
* use: SFT, the judge, PPO (actor and critic) and an iterated judge's refresh each step through
  the fused kernel at least once, and never through another AdamW path (torch's dispatch is
  intercepted where it picks the kernel).
"""

from __future__ import annotations

import pytest
import torch
import torch.optim.adam as torch_adam

from rlhf import lab, refresh
from rlhf.config import load_profile, override
from rlhf.optim import adamw

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]


def _three_steps(make) -> bytes:
    """Parameters after three steps from fixed inputs (weight decay on, gradients of mixed scale)."""
    g = torch.Generator().manual_seed(7)
    params = [torch.randn(256, 64, generator=g).requires_grad_(), torch.randn(64, generator=g).requires_grad_()]
    opt = make(params)
    for step in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g) * 10.0 ** (step - 2)
        opt.step()
    return b"".join(p.detach().numpy().tobytes() for p in params)


def test_the_lab_optimizer_has_the_fused_kernels_bytes():
    def torch_adamw(**kw):
        return lambda ps: torch.optim.AdamW(ps, lr=3e-3, weight_decay=0.01, **kw)

    lab_bytes = _three_steps(lambda ps: adamw(ps, lr=3e-3, weight_decay=0.01))
    fused = _three_steps(torch_adamw(foreach=False, fused=True))
    single = _three_steps(torch_adamw(foreach=False, fused=False))
    multi = _three_steps(torch_adamw(foreach=True, fused=False))
    # The paths compute the same formula in another order (and another square root), so these
    # inputs tell them apart: without that, the equality below would prove nothing.
    assert single != fused and multi != fused
    assert lab_bytes == fused


def test_every_training_path_steps_through_the_fused_kernel(small_profile_file, tmp_path, monkeypatch):
    calls = {"fused": 0, "other": []}
    fused = torch_adam._fused_adam

    def counted(*args, **kwargs):
        calls["fused"] += 1
        return fused(*args, **kwargs)

    def refused(name):
        def step(*args, **kwargs):
            calls["other"].append(name)
            raise AssertionError(f"AdamW took the {name} path")

        return step

    monkeypatch.setattr(torch_adam, "_fused_adam", counted)
    monkeypatch.setattr(torch_adam, "_single_tensor_adam", refused("single-tensor"))
    monkeypatch.setattr(torch_adam, "_multi_tensor_adam", refused("multi-tensor"))
    profile = override(
        load_profile(str(small_profile_file)),
        {
            ("sft", "epochs"): 1,
            ("sft", "max_updates_per_epoch"): 1,
            ("judge", "epochs"): 1,
            ("judge", "max_updates_per_epoch"): 1,
            ("ppo", "iterations"): 3,
            ("ppo", "resume_stop_iteration"): 1,
            ("ppo", "reward_design"): "iterated-judge",
            ("ppo", "refresh_every"): 2,
            ("ppo", "refresh_prompts"): 4,
            ("ppo", "refresh_updates"): 1,
        },
    )
    # A one-update SFT answers nothing right, so a refresh would label no pair and skip its update:
    # one labelled pair from the start makes the refresh train (which path it takes is the point).
    start = refresh.start

    def start_with_a_pair(*args, **kwargs):
        data = start(*args, **kwargs)
        if not data.pairs:
            data.pairs.append(("synthetic", [10, 11, 12], [13, 14, 2], [15, 16, 2]))
        return data

    monkeypatch.setattr(refresh, "start", start_with_a_pair)
    ctx = lab.open_context(tmp_path / "run", profile)
    seen = {}
    for name, stage in (("sft", lab.stage_sft), ("judge", lab.stage_judge), ("ppo", lab.stage_ppo)):
        before = calls["fused"]
        stage(ctx, protocol=False)
        seen[name] = calls["fused"] - before
    assert calls["other"] == []
    updates_per_iteration = profile.ppo.updates_per_iteration
    assert seen["sft"] == 1 and seen["judge"] == 1  # one update each, one parameter group
    # PPO: the actor and the critic at each update of 3 iterations, and the judge's one refresh update
    assert seen["ppo"] == 2 * updates_per_iteration * 3 + 1
