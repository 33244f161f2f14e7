"""Fast equivalents of the lab's slow resume and role checks.

The session's small-budget lab (conftest `small_run`: the embedded profile with
conftest.SMALL_BUDGET, SFT and judge 2 epochs of 3 updates, PPO 4 iterations stopped after 2)
ran SFT, the judge and PPO with the interrupt/resume protocol once per test run. Then:

* resumed = continuous, read back from disk, tensor by tensor, for the three stages;
* the same again in this process: each stage is resumed from its saved boundary state after
  the global RNGs were disturbed, and must end in the continuous state exactly, optimizer
  moments, data-order / sampling generators, prompt sampler and system RNGs included. A resume
  that dropped any of those restores (rlhf.optim._start_epochs, rlhf.ppo.train_ppo) differs;
* the PPO roles as `stage_ppo` hands them to `train_ppo` share no storage, and a change to the
  actor's tensors does not reach the reference, the critic or the judge.
"""

from __future__ import annotations

import random

import pytest
import torch

from rlhf import lab, ppo
from rlhf.checkpoint import Leg, assert_states_equal, load_state
from rlhf.io import read_json
from rlhf.judge import train_judge
from rlhf.lab import stages as lab_stages
from rlhf.roles import FROZEN_KINDS, ROLE_KINDS, Role, RoleIsolationError, assert_role_isolation
from rlhf.sft import train_sft

pytestmark = pytest.mark.unit

STAGES = {
    "sft": ("actor", train_sft, "epochs_done", 1),
    "judge": ("judge", train_judge, "epochs_done", 1),
    "ppo": (None, None, "iterations_done", 2),
}


@pytest.fixture(scope="module")
def small_lab(small_run, one_thread):
    """The session's small-budget lab (conftest `small_run`), read only."""
    return small_run


def saved(ctx, stage: str, leg: str) -> dict:
    return load_state(ctx.run / stage / f"state-{leg}.pt.gz")


def disturb_global_rngs() -> None:
    """What a fresh process (or a previous stage) may have left in the global RNGs."""
    torch.manual_seed(987654)
    torch.rand(7)
    random.seed(987654)


def resume_in_process(ctx, stage: str, boundary: dict) -> dict:
    """Continue `stage` from `boundary` to the end with the lab's own roles and trainers, but in
    a process whose global RNGs were disturbed: only the state's restore makes it exact."""
    kind, train_fn, _, _ = STAGES[stage]
    view = ctx.corpus.learning_view()
    if stage == "ppo":
        roles = lab.ppo_roles(ctx)
        disturb_global_rngs()
        state, _ = ppo.train_ppo(roles, view, ctx.tokens(), ctx.profile, Leg(state=boundary))
        return state
    role = ctx.role(kind)
    disturb_global_rngs()
    return train_fn(role, view, ctx.tokenizer, ctx.eos_id, ctx.pad_id, ctx.profile, Leg(state=boundary))


@pytest.mark.parametrize("stage", list(STAGES))
def test_protocol_resumed_state_equals_continuous_on_disk(small_lab, stage, record_result):
    """Catches a protocol whose resumed leg does not end where the continuous one does, or a
    comparison that compares nothing (the boundary state must differ from the final one)."""
    _, _, key, boundary = STAGES[stage]
    s = {leg: saved(small_lab, stage, leg) for leg in ("boundary", "resumed", "continuous")}
    assert s["boundary"][key] == boundary < s["continuous"][key] == s["resumed"][key]
    compared = assert_states_equal(s["continuous"], s["resumed"], stage)
    with pytest.raises(AssertionError):
        assert_states_equal(s["continuous"], s["boundary"], stage)
    check = read_json(small_lab.run / stage / "resume_check.json")
    assert check["identical"] is True and check["sha256_resumed"] == check["sha256_continuous"]
    record_result(f"{stage}.tensors_compared", compared)


@pytest.mark.parametrize("stage", list(STAGES))
def test_resume_restores_optimizer_generators_and_rngs(small_lab, stage):
    """Resumed in this process from the saved boundary state, each stage ends bit for bit in the
    continuous state. Catches a resume that drops the optimizer state (AdamW moments and step
    counts), the data-order generator (SFT, judge), the prompt sampler or the sampling
    generator (PPO), or the system RNGs."""
    boundary = saved(small_lab, stage, "boundary")
    continuous = saved(small_lab, stage, "continuous")
    if stage == "ppo":
        assert all(boundary["optimizers"][k]["state"] for k in ("actor", "critic")), "AdamW moments are saved"
        assert 0 < boundary["sampler"]["pointer"] < boundary["sampler"]["permutation"].numel()
    else:
        assert boundary["optimizer"]["state"] and boundary["step"] > 0
    resumed = resume_in_process(small_lab, stage, boundary)
    assert assert_states_equal(continuous, resumed, stage) > 0


def test_ppo_roles_as_trained_are_isolated(small_lab, monkeypatch):
    """The four roles `stage_ppo` gives `train_ppo`: four backbones, no shared storage, frozen
    reference and judge, and an in-place change to the actor (adapter and base) reaches no other
    role. Catches a reference (or critic) that shares the actor's model."""
    captured = {}

    class Captured(Exception):
        """Raised by the spy to stop stage_ppo once it has handed over its roles."""

    def spy(roles, *args, **kwargs):
        captured["roles"] = roles
        raise Captured

    monkeypatch.setattr(lab_stages, "train_ppo", spy)  # the stages bind train_ppo at import
    with pytest.raises(Captured):
        lab.stage_ppo(small_lab, stop_after=1)  # nothing is saved: train_ppo never returns
    roles = captured["roles"]
    by_kind = roles.by_kind()
    assert set(by_kind) == set(ROLE_KINDS)
    assert len({id(r.model) for r in by_kind.values()}) == 4

    storages = {}
    for kind, role in by_kind.items():
        tensors = list(role.model.parameters()) + list(role.model.buffers())
        tensors += list(role.head.parameters()) if role.head is not None else []
        storages[kind] = {t.untyped_storage().data_ptr() for t in tensors if t.numel()}
    for a in ROLE_KINDS:
        for b in ROLE_KINDS:
            if a < b:
                assert not storages[a] & storages[b], f"roles {a} and {b} share tensor storage"
    for kind in FROZEN_KINDS:
        assert not any(p.requires_grad for p in by_kind[kind].all_parameters()), f"{kind} can learn"
    assert all(p.requires_grad for p in roles.actor.learned_parameters())

    # Reference and actor start from the same SFT adapters, as values, not as shared tensors.
    actor, reference = roles.actor.learned_state(), roles.reference.learned_state()
    assert actor.keys() == reference.keys() and all(torch.equal(actor[k], reference[k]) for k in actor)
    others = {k: by_kind[k].learned_state() for k in ("reference", "critic", "judge")}
    base_name, base = next((n, p) for n, p in roles.actor.model.named_parameters() if not p.requires_grad)
    others_base = {
        k: dict(by_kind[k].model.named_parameters())[base_name].detach().clone()
        for k in ("reference", "critic", "judge")
    }
    with torch.no_grad():
        for p in roles.actor.learned_parameters():
            p.add_(1.0)
        base.add_(1.0)
    for k, before in others.items():
        after = by_kind[k].learned_state()
        assert all(torch.equal(before[n], after[n]) for n in before), f"changing the actor changed {k}"
        assert torch.equal(dict(by_kind[k].model.named_parameters())[base_name], others_base[k]), (
            f"changing the actor's base changed {k}'s base"
        )
    assert_role_isolation(roles)


def test_role_isolation_check_refuses_a_reference_sharing_the_actor(small_lab):
    """The library's own check (run by stage_ppo before and after training) can fail."""
    roles = lab.ppo_roles(small_lab)
    roles = roles._replace(reference=Role(kind="reference", model=roles.actor.model, head=None))
    with pytest.raises(RoleIsolationError, match="share tensor storage"):
        assert_role_isolation(roles)
