"""DPO's and GRPO's formulas (rlhf.dpo_math, rlhf.grpo_math) by hand, and against TRL's own loss
computations fed the same numbers.

TRL has no public function for either loss: its trainers compute them inside `_compute_loss`. The
parity tests call that method of DPOTrainer and GRPOTrainer (trl==1.12.0, the `bench` extra) on a
stand-in for the trainer that holds only the settings the method reads (the published method's:
DPO's "sigmoid" loss with the reverse KL; GRPO's loss_type "grpo", one clip range, beta > 0) and
a stand-in model whose logits are given, and compare loss and gradient with the lab's."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from rlhf.dpo_math import dpo_loss, dpo_margin, sequence_logp
from rlhf.grpo_math import EPS, group_advantages, grpo_loss, k3_kl

pytestmark = pytest.mark.unit

F64 = torch.float64


def t64(x):
    return torch.tensor(x, dtype=F64)


# ------------------------------------------------------------------------------ DPO by hand


def test_dpo_loss_by_hand():
    """Two pairs, beta 0.1: margins (−4 − −5) − (−7 − −6) = 2 and (−3 − −3) − (−2 − −2) = 0."""
    chosen, rejected = t64([-4.0, -3.0]), t64([-7.0, -2.0])
    ref_chosen, ref_rejected = t64([-5.0, -3.0]), t64([-6.0, -2.0])
    assert dpo_margin(chosen, rejected, ref_chosen, ref_rejected).tolist() == [2.0, 0.0]
    want = (-math.log(1 / (1 + math.exp(-0.2))) + math.log(2)) / 2
    assert dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.1).item() == pytest.approx(want, rel=1e-12)


def test_dpo_loss_at_equal_margins_is_log_2_and_its_gradient_pulls_chosen_up_and_rejected_down():
    chosen = t64([-4.0, -9.0]).requires_grad_(True)
    rejected = t64([-6.0, -1.0]).requires_grad_(True)
    loss = dpo_loss(chosen, rejected, t64([-4.0, -9.0]), t64([-6.0, -1.0]), beta=0.5)
    assert loss.item() == pytest.approx(math.log(2), rel=1e-12)
    loss.backward()
    # d/d chosen = -beta * sigma(0) / P = -0.5 * 0.5 / 2; d/d rejected the opposite
    assert chosen.grad.tolist() == pytest.approx([-0.125, -0.125]) and rejected.grad.tolist() == pytest.approx(
        [0.125] * 2
    )


def test_dpo_sequence_logp_sums_active_tokens_only_whatever_the_padding_holds():
    logp = t64([[-1.0, -2.0, float("nan")], [-0.5, float("-inf"), 7.0]]).requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    out = sequence_logp(logp, mask)
    assert out.tolist() == [-3.0, -0.5]
    out.sum().backward()
    assert logp.grad.tolist() == [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_dpo_refuses_a_beta_that_is_not_positive():
    with pytest.raises(ValueError, match="beta must be > 0"):
        dpo_loss(t64([0.0]), t64([0.0]), t64([0.0]), t64([0.0]), beta=0.0)


# ------------------------------------------------------------------------------ GRPO by hand


def test_group_advantages_by_hand_and_a_group_of_equal_rewards_gives_zero():
    rewards = t64([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])  # two groups of 3: the second all equal
    got = group_advantages(rewards, 3)
    sd = 1.0  # sample SD of 1, 2, 3
    assert got[:3].tolist() == pytest.approx([-1 / (sd + EPS), 0.0, 1 / (sd + EPS)], rel=1e-12)
    assert got[3:].tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="multiple of the group size"):
        group_advantages(rewards, 4)
    with pytest.raises(ValueError, match="group size >= 2"):
        group_advantages(rewards, 1)


def test_k3_is_zero_at_equal_log_probs_positive_elsewhere_and_by_hand():
    logp, ref = t64([-1.0, -2.0, -0.5]), t64([-1.0, -1.0, -2.5])
    got = k3_kl(logp, ref)
    # d = ref - logp = 0, 1, -2
    assert got.tolist() == pytest.approx([0.0, math.e - 1 - 1, math.exp(-2) + 2 - 1], rel=1e-12)


def test_grpo_loss_by_hand_with_a_clipped_token_and_padding():
    """Two answers: A = +1 and −0.5; clip 0.2, beta 0.1. Answer 0: tokens with rho 1.5 (clipped
    to 1.2, A > 0) and 1.0; answer 1: one token with rho 0.5 (A < 0: min(−0.25, −0.4) → the
    clipped branch −0.4... as a loss, −min(rho A, clip(rho) A) = −min(−0.25, −0.4) = 0.4),
    then padding."""
    logp_old = t64([[-1.0, -2.0], [-1.0, -3.0]])
    logp = logp_old + t64([[math.log(1.5), 0.0], [math.log(0.5), 99.0]])
    logp_ref = t64([[-1.0, -2.5], [-1.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    adv = t64([1.0, -0.5])
    got = grpo_loss(logp, logp_old, logp_ref, adv, mask, clip=0.2, beta=0.1)
    policy = ((-1.2) + (-1.0)) / 2 / 2 + 0.4 / 1 / 2

    def k3(lp, ref):
        return math.exp(ref - lp) - (ref - lp) - 1

    kl = (k3(logp[0, 0].item(), -1.0) + k3(-2.0, -2.5)) / 2 / 2 + k3(logp[1, 0].item(), -1.0) / 2
    assert got.item() == pytest.approx(policy + 0.1 * kl, rel=1e-12)


# ------------------------------------------------------------------------------ TRL parity


def _accelerator():
    return SimpleNamespace(
        device=torch.device("cpu"),
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction="sum": x,
        num_processes=1,
        sync_gradients=True,
    )


def test_dpo_loss_equals_trls_on_the_same_logits():
    """DPOTrainer._compute_loss (sigmoid loss, reverse KL, reference log-probs precomputed) on
    given logits against the lab's dpo_loss on the same per-token log-probs: loss and gradient
    agree. TRL's batch is the chosen answers then the rejected ones; its completion mask marks
    the answer's tokens of input_ids, the label of logit t is token t + 1."""
    pytest.importorskip("trl")  # the bench extra (setup.sh installs it with the tests)
    from trl.trainer.dpo_trainer import DPOTrainer

    g = torch.Generator().manual_seed(3)
    pairs, length, vocab, beta = 3, 7, 11, 0.1
    input_ids = torch.randint(0, vocab, (2 * pairs, length), generator=g)
    completion = torch.zeros(2 * pairs, length, dtype=torch.long)
    for row, (start, end) in enumerate([(2, 7), (3, 6), (2, 4), (3, 7), (2, 5), (4, 7)]):
        completion[row, start:end] = 1  # a prompt, then the answer, then padding
    logits = torch.randn(2 * pairs, length, vocab, generator=g, dtype=torch.float32)
    ref = torch.randn(2 * pairs, generator=g, dtype=torch.float32) - 5.0  # [chosen..., rejected...]

    theirs_logits = logits.clone().requires_grad_(True)
    stand_in = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=_accelerator(), aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=["sigmoid"], loss_weights=[1.0],
        beta=beta, label_smoothing=0.0, use_weighting=False, _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0,
    )  # fmt: skip
    inputs = {
        "input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "completion_mask": completion,
        "ref_chosen_logps": ref[:pairs], "ref_rejected_logps": ref[pairs:],
    }  # fmt: skip
    theirs = DPOTrainer._compute_loss(stand_in, lambda **kw: SimpleNamespace(logits=theirs_logits), inputs, False)
    theirs.backward()

    ours_logits = logits.clone().requires_grad_(True)
    per_token = torch.log_softmax(ours_logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    seq = sequence_logp(per_token, completion[:, 1:].bool())  # [2P]
    ours = dpo_loss(seq[:pairs], seq[pairs:], ref[:pairs], ref[pairs:], beta=beta)
    ours.backward()
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    assert torch.allclose(ours_logits.grad, theirs_logits.grad, rtol=1e-5, atol=1e-7)


def test_grpo_loss_and_advantages_equal_trls_on_the_same_numbers():
    """GRPOTrainer._compute_loss (loss_type "grpo": per answer then over answers; one clip range;
    beta 0.04 with its k3 term) on given per-token log-probs against the lab's grpo_loss: loss and
    gradient agree. The advantages: TRL standardises a group's rewards with its nanstd and 1e-4
    inside _generate_and_score_completions; the same arithmetic with TRL's own nanstd gives the
    lab's group_advantages."""
    pytest.importorskip("trl")
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import nanstd

    g = torch.Generator().manual_seed(5)
    groups, size, length, clip, beta = 2, 4, 6, 0.2, 0.04
    n = groups * size
    rewards = torch.randn(n, generator=g)
    rewards[size:] = 0.7  # the second group all equal
    grouped = rewards.view(-1, size)
    trl_adv = (rewards - grouped.mean(dim=1).repeat_interleave(size)) / (
        nanstd(grouped, dim=1).repeat_interleave(size) + 1e-4
    )
    adv = group_advantages(rewards, size)
    assert torch.allclose(adv, trl_adv, rtol=1e-6, atol=1e-7) and adv[size:].abs().max() == 0

    mask = (torch.arange(length).unsqueeze(0) < torch.randint(2, length + 1, (n, 1), generator=g)).long()
    logp_old = -torch.rand(n, length, generator=g) * 3
    logp_ref = logp_old - 0.3 * torch.randn(n, length, generator=g)
    start = logp_old + 0.4 * torch.randn(n, length, generator=g)  # some tokens beyond the clip range

    theirs_logp = start.clone().requires_grad_(True)
    stand_in = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (theirs_logp, torch.ones_like(theirs_logp), None),
        top_entropy_quantile=1.0, aux_loss_enabled=False, off_policy_mask_threshold=None,
        importance_sampling_level="token", beta=beta, args=SimpleNamespace(use_bias_correction_kl=False, delta=None),
        loss_type="grpo", epsilon_low=clip, epsilon_high=clip, use_vllm=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, _entropy_bonus_enabled=False, accelerator=_accelerator(),
        _metrics=defaultdict(lambda: defaultdict(list)),
    )  # fmt: skip
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long), "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.zeros(n, length, dtype=torch.long), "completion_mask": mask, "advantages": adv,
        "old_per_token_logps": logp_old, "ref_per_token_logps": logp_ref,
    }  # fmt: skip
    theirs = GRPOTrainer._compute_loss(stand_in, None, inputs)
    theirs.backward()

    ours_logp = start.clone().requires_grad_(True)
    ours = grpo_loss(ours_logp, logp_old, logp_ref, adv, mask.bool(), clip=clip, beta=beta)
    ours.backward()
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    active = mask.bool()
    assert torch.allclose(ours_logp.grad[active], theirs_logp.grad[active], rtol=1e-5, atol=1e-8)
    assert ours_logp.grad[~active].abs().max() == 0  # padding never counts


def test_trls_default_grpo_loss_differs_from_the_published_one_the_lab_follows():
    """TRL's default loss_type ("dapo": every token of the batch at once) and the published
    per-answer mean the lab follows (TRL's "grpo") part on answers of different lengths: the
    parity test above compares the lab with the one TRL calls "grpo", on purpose."""
    logp = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])
    per_answer = grpo_loss(logp, logp, logp, adv, mask, clip=0.2, beta=0.0)  # -(1 + (-1)) / 2 = 0
    all_tokens = -(adv.unsqueeze(-1) * mask).sum() / mask.sum()  # dapo: -(3 - 1) / 4
    assert per_answer.item() == pytest.approx(0.0, abs=1e-7) and all_tokens.item() == pytest.approx(-0.5)
