"""The DPO arm's trainer (rlhf.dpo) on the embedded model and r001's pairs: the loss it starts
from, what it learns, what stays frozen, its resume, its validation numbers recomputed by hand,
and its budget's refusals. The loss's own formula is tests_unit/test_dpo_grpo_math.py's."""

import math

import pytest
import torch

from rlhf.checkpoint import Leg
from rlhf.config import Dpo, ProfileError, override

pytestmark = pytest.mark.unit

CUT = {("judge", "max_updates_per_epoch"): 3, ("judge", "max_validation_examples"): 6}


@pytest.fixture(scope="module")
def r001_view():
    from rlhf.corpus import Corpus

    return Corpus.build("r001").learning_view()


@pytest.fixture(scope="module")
def profile(embedded_profile):
    return override(embedded_profile, CUT)


@pytest.fixture
def sft_pair(profile, embedded_dir, move_adapters):
    """A stand-in SFT actor (adapters moved from the identity) and its frozen copy, the reference."""
    from rlhf.roles import new_role

    actor, reference = (new_role("actor", profile, embedded_dir) for _ in range(2))
    for role in (actor, reference):
        move_adapters(role.model, 41)
    reference.freeze()
    return actor, reference


def _pairs(view, base, profile, n=None):
    from rlhf.judge import encode_pairs

    pairs = encode_pairs(view.pairs("train"), base.tokenizer, base.eos_id, profile.limits)
    return pairs[:n] if n else pairs


@torch.no_grad()
def answer_logps(model, pairs, k: int, pad_id: int) -> torch.Tensor:
    """Each pair's answer k (2: chosen, 3: rejected) summed log-prob under `model`: [P]."""
    from rlhf.masks import masked_sum
    from rlhf.scoring import response_logprobs
    from rlhf.tokens import collate

    batch = collate([p[1] for p in pairs], [p[k] for p in pairs], pad_id)
    return masked_sum(response_logprobs(model, batch), batch.response_mask, dim=-1)


def test_the_first_loss_is_log_2_and_every_margin_zero(sft_pair, r001_view, embedded_base, profile):
    """Policy = reference before the first update: the same padded batch gives both the same
    log-probs, so each margin is exactly 0 and the loss is log 2 (float32's)."""
    from rlhf.dpo import pair_loss

    actor, reference = sft_pair
    loss, margins = pair_loss(actor, reference, _pairs(r001_view, embedded_base, profile, 8), embedded_base.pad_id, 0.1)
    assert torch.equal(margins, torch.zeros(8))
    assert float(loss.detach()) == pytest.approx(math.log(2), rel=1e-7)


def test_dpo_learns_its_pairs_and_only_the_actor_changes(sft_pair, r001_view, embedded_base, profile):
    """Three epochs of one update on 8 of r001's train pairs: the first update's loss is log 2,
    the loss of those pairs then falls below it and their margins turn positive; the actor's
    adapters move, the reference's do not."""
    from types import SimpleNamespace

    from rlhf import dpo
    from rlhf.roles import fingerprint

    actor, reference = sft_pair
    few = SimpleNamespace(pairs=lambda split: r001_view.pairs("train")[:8])  # validation: the same 8
    before = [fingerprint(r)["learned_sha256"] for r in sft_pair]
    cfg = dpo.budget(profile, 8, beta=0.5, epochs=3)
    base = embedded_base
    state = dpo.train_dpo(actor, reference, few, base.tokenizer, base.eos_id, base.pad_id, profile, cfg)
    updates = state["history"]["updates"]
    assert [u["step"] for u in updates] == [0, 1, 2] == list(range(cfg.expected_updates))
    assert updates[0]["loss"] == pytest.approx(math.log(2), rel=1e-6) and updates[0]["margin"] == 0.0
    # The margin gained, from each answer alone (its own batch, not the trainer's chosen-then-rejected one)
    pairs = _pairs(few, base, profile)
    roles = {"pi": actor, "ref": reference}
    logp = {(who, k): answer_logps(roles[who].model, pairs, k, base.pad_id) for who in roles for k in (2, 3)}
    margins = (logp["pi", 2] - logp["ref", 2]) - (logp["pi", 3] - logp["ref", 3])
    assert float(margins.mean()) > 0.05 and (margins > 0).float().mean() >= 0.75
    after = [fingerprint(r)["learned_sha256"] for r in sft_pair]
    assert after[0] != before[0] and after[1] == before[1]
    assert state["history"]["epochs"][-1]["validation_loss"] < math.log(2)  # the same 8 pairs


def test_a_stopped_dpo_continues_bit_for_bit(profile, embedded_dir, embedded_base, r001_view, move_adapters):
    """Two epochs in one leg against one epoch, then a leg from its state: the same adapters."""
    from rlhf import dpo
    from rlhf.roles import fingerprint, new_role

    base = embedded_base
    cfg = dpo.budget(profile, len(r001_view.pairs("train")), epochs=2)

    def fresh():
        actor, reference = (new_role("actor", profile, embedded_dir) for _ in range(2))
        for role in (actor, reference):
            move_adapters(role.model, 7)
        reference.freeze()
        return actor, reference

    def run(actor, reference, leg):
        torch.manual_seed(0)
        return dpo.train_dpo(actor, reference, r001_view, base.tokenizer, base.eos_id, base.pad_id, profile, cfg, leg)

    whole = fresh()
    reference_state = run(*whole, Leg())
    first = fresh()
    half = run(*first, Leg(stop=1))
    second = fresh()
    state = run(*second, Leg(state=half))
    assert fingerprint(second[0])["learned_sha256"] == fingerprint(whole[0])["learned_sha256"]
    assert state["history"] == reference_state["history"]
    assert len(state["history"]["updates"]) == cfg.expected_updates == 6


def test_the_validation_numbers_equal_their_formulas_by_hand(sft_pair, r001_view, embedded_base, profile):
    """evaluate_dpo_pairs against the loss, accuracy and implicit rewards written out from the
    four sequence log-probs of each pair (math, not torch), after a move of the actor."""
    from rlhf import dpo

    actor, reference = sft_pair
    with torch.no_grad():
        for p in actor.learned_parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    pairs, beta = _pairs(r001_view, embedded_base, profile, 5), 0.3
    got = dpo.evaluate_dpo_pairs(actor, reference, pairs, embedded_base.pad_id, beta, batch_size=2)
    c, r = dpo.sequence_logps(actor.model, pairs, embedded_base.pad_id)
    rc, rr = dpo.sequence_logps(reference.model, pairs, embedded_base.pad_id)
    margins = [(a - b) - (x - y) for a, b, x, y in zip(c.tolist(), rc.tolist(), r.tolist(), rr.tolist())]
    assert any(m != 0 for m in margins)
    assert got["loss"] == pytest.approx(sum(math.log1p(math.exp(-beta * m)) for m in margins) / 5, rel=1e-5)
    assert got["accuracy"] == sum(m > 0 for m in margins) / 5
    assert got["chosen_reward"] == pytest.approx(beta * sum(a - b for a, b in zip(c.tolist(), rc.tolist())) / 5)
    assert got["rejected_reward"] == pytest.approx(beta * sum(a - b for a, b in zip(r.tolist(), rr.tolist())) / 5)


def test_the_budget_takes_ppos_actor_rate_and_refuses_what_it_cannot_run(profile, embedded_base, r001_view, sft_pair):
    from rlhf import dpo

    cfg = dpo.budget(profile, 840, beta=0.2, epochs=2)
    assert (cfg.lr, cfg.beta, cfg.pairs_per_update) == (profile.ppo.actor_lr, 0.2, dpo.PAIRS_PER_UPDATE)
    assert cfg.expected_updates == 2 * min(3, math.ceil(840 / 8))
    with pytest.raises(ProfileError, match=r"\[dpo\] beta must be greater than 0, not 0"):
        Dpo(epochs=1, lr=1e-4, expected_updates=1, beta=0.0, pairs_per_update=8)
    wrong = Dpo(epochs=1, lr=1e-4, expected_updates=5, beta=0.1, pairs_per_update=8, max_updates_per_epoch=3)
    base = embedded_base
    with pytest.raises(ValueError, match="expects 5 updates, but 1 epoch"):
        dpo.train_dpo(*sft_pair, r001_view, base.tokenizer, base.eos_id, base.pad_id, profile, wrong)
