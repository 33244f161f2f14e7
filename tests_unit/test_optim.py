"""The lab's optimizer is torch's fused AdamW, by its bytes and on every training path.

The cross-CPU golden numbers rest on it (rlhf.optim.adamw's docstring): the single-tensor and
multi-tensor AdamW take their square root through MKL's vector math, whose low bits differ
between CPU vendors. Two checks, neither reading a flag:

* bytes: three steps of `rlhf.optim.adamw` equal three steps of torch's fused AdamW, byte for
  byte, and differ from the single-tensor and multi-tensor paths on the same inputs;
* use: SFT, the judge, PPO (actor and critic) and an iterated judge's refresh each step through
  the fused kernel at least once, and never through another AdamW path (torch's dispatch is
  intercepted where it picks the kernel);
* rate: each update of SFT, the judge, the actor and the critic runs at the SPEC §5 schedule's
  rate for its index, written out below apart from rlhf.ppo_math: in the history the loop
  records and in the optimizer's param_groups at the moment it steps (a global step pre-hook of
  torch.optim), on a few updates with a warm-up of two (so that a schedule applied one update
  early or late shows at the first update, the peak and the decay).
"""

from __future__ import annotations

import pytest
import torch
import torch.optim.adam as torch_adam
from torch.optim.optimizer import register_optimizer_step_pre_hook

from rlhf import lab, ppo, refresh
from rlhf.config import load_profile, override
from rlhf.corpus import Corpus
from rlhf.judge import train_judge
from rlhf.optim import adamw
from rlhf.roles import PpoRoles, new_role
from rlhf.sft import train_sft

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


# ---------------------------------------------------------------- the rate of every update

UPDATES = 6  # per stage: 2 epochs of 3 updates (SFT, judge), 3 PPO iterations of 2 updates
WARMUP_RATIO = 0.34  # warm = int(0.34 * 6) = 2: peak/2, peak, peak, then the decay to 10%


def spec_rate(step: int, total: int, peak: float, warmup_ratio: float, min_ratio: float) -> float:
    """SPEC §5: warm = max(1, int(warmup_ratio * total)); step < warm: peak * (step + 1) / warm;
    else peak * (1 - min(1, (step - warm) / max(1, total - warm - 1)) * (1 - min_ratio))."""
    warm = max(1, int(warmup_ratio * total))
    if step < warm:
        return peak * (step + 1) / warm
    return peak * (1 - min(1, (step - warm) / max(1, total - warm - 1)) * (1 - min_ratio))


@pytest.fixture
def rates_in_force():
    """[(optimizer, its param_groups' rates)] at the moment of each optimizer step, in order."""
    steps: list = []
    handle = register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: steps.append((optimizer, [g["lr"] for g in optimizer.param_groups]))
    )
    yield steps
    handle.remove()


@pytest.fixture(scope="module")
def schedule_profile(embedded_profile):
    """Six updates per stage, two items per update, a warm-up of two updates, short answers."""
    return override(
        embedded_profile,
        {
            ("optim", "warmup_ratio"): WARMUP_RATIO,
            ("sft", "epochs"): 2,
            ("sft", "max_updates_per_epoch"): UPDATES // 2,
            ("sft", "examples_per_update"): 2,
            ("sft", "max_validation_examples"): 2,
            ("judge", "epochs"): 2,
            ("judge", "max_updates_per_epoch"): UPDATES // 2,
            ("judge", "pairs_per_update"): 2,
            ("judge", "max_validation_examples"): 2,
            ("ppo", "iterations"): UPDATES // 2,
            ("ppo", "max_new_tokens"): 8,
        },
    )


def scheduled(profile, peak: float) -> list[float]:
    optim = profile.optim
    return [spec_rate(s, UPDATES, peak, optim.warmup_ratio, optim.min_lr_ratio) for s in range(UPDATES)]


@pytest.mark.parametrize("stage", ["sft", "judge"])
def test_each_sft_and_judge_update_runs_at_its_scheduled_rate(
    stage, schedule_profile, embedded_dir, embedded_base, rates_in_force
):
    profile = schedule_profile
    kind, train, peak = {
        "sft": ("actor", train_sft, profile.sft.lr),
        "judge": ("judge", train_judge, profile.judge.lr),
    }[stage]
    want = scheduled(profile, peak)
    assert want[0] == peak / 2 and want[1] == want[2] == peak and want[-1] == pytest.approx(0.1 * peak)
    role = new_role(kind, profile, embedded_dir)
    view = Corpus.build("r001").learning_view()
    state = train(role, view, embedded_base.tokenizer, embedded_base.eos_id, embedded_base.pad_id, profile)
    assert [u["lr"] for u in state["history"]["updates"]] == pytest.approx(want, rel=1e-12)
    assert all(len(rates) == 1 for _, rates in rates_in_force)  # one parameter group
    assert [rates[0] for _, rates in rates_in_force] == pytest.approx(want, rel=1e-12)


def test_each_actor_and_critic_update_runs_at_its_scheduled_rate(
    schedule_profile, embedded_dir, embedded_base, rates_in_force
):
    profile = schedule_profile
    roles = PpoRoles(
        **{kind: new_role(kind, profile, embedded_dir) for kind in ("actor", "reference", "critic", "judge")}
    )
    view = Corpus.build("r001").learning_view()
    state, _ = ppo.train_ppo(roles, view, embedded_base.tokens, profile)
    iterations = state["history"]["iterations"]
    for kind, role, peak in (
        ("actor", roles.actor, profile.ppo.actor_lr),
        ("critic", roles.critic, profile.ppo.critic_lr),
    ):
        want = scheduled(profile, peak)
        assert [lr for it in iterations for lr in it[f"{kind}_lr"]] == pytest.approx(want, rel=1e-12), kind
        learned = {id(p) for p in role.learned_parameters()}
        stepped = [rates for opt, rates in rates_in_force if id(opt.param_groups[0]["params"][0]) in learned]
        assert all(len(rates) == 1 for rates in stepped), kind  # one parameter group
        assert [rates[0] for rates in stepped] == pytest.approx(want, rel=1e-12), kind
    assert len(rates_in_force) == 2 * UPDATES  # the actor's and the critic's steps, nothing else
