"""Properties of DPO's and GRPO's formulas (rlhf.dpo_math, rlhf.grpo_math) over drawn numbers:
the identities the published losses obey, whatever the log-probs, rewards and masks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from property_budget import examples

from rlhf.dpo_math import dpo_loss, sequence_logp
from rlhf.grpo_math import group_advantages, grpo_loss

pytestmark = pytest.mark.unit

F64 = torch.float64
SETTINGS = examples(60)
LOGP = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False)
BETA = st.floats(min_value=0.01, max_value=2.0, allow_nan=False)


@st.composite
def pairs(draw):
    """P pairs of sequence log-probs under the policy and the reference: four [P] tensors."""
    p = draw(st.integers(1, 6))
    return [torch.tensor(draw(st.lists(LOGP, min_size=p, max_size=p)), dtype=F64) for _ in range(4)]


@SETTINGS
@given(pairs(), BETA)
def test_swapping_chosen_and_rejected_mirrors_the_loss_and_the_gradient(four, beta):
    """-log sigma(x) - (-log sigma(-x)) = -x: the swapped pair's loss exceeds the pair's by the
    mean of beta * margin; and within a pair the gradient on the chosen answer is minus the one on
    the rejected answer, both under the pair and swapped."""
    chosen, rejected, ref_c, ref_r = (t.clone().requires_grad_(True) for t in four)
    loss = dpo_loss(chosen, rejected, ref_c, ref_r, beta=beta)
    swapped = dpo_loss(rejected, chosen, ref_r, ref_c, beta=beta)
    margin = (four[0] - four[2]) - (four[1] - four[3])
    assert torch.allclose(swapped - loss, beta * margin.mean(), rtol=1e-9, atol=1e-9)
    g_c, g_r = torch.autograd.grad(loss, (chosen, rejected))
    assert torch.allclose(g_c, -g_r, rtol=0, atol=1e-15) and bool((g_c <= 0).all())
    s_r, s_c = torch.autograd.grad(swapped, (rejected, chosen))
    assert torch.allclose(s_r, -s_c, rtol=0, atol=1e-15) and bool((s_r <= 0).all())


@SETTINGS
@given(st.integers(1, 5), st.integers(1, 8), st.data())
def test_padding_never_counts_in_a_sequence_log_prob(p, t, data):
    """Whatever a padding position holds (nan, inf, any number), the sequence log-prob and the DPO
    loss built on it are those of the active tokens alone."""
    lengths = data.draw(st.lists(st.integers(1, t), min_size=p, max_size=p))
    mask = torch.arange(t).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)  # [P, T]
    logp = torch.tensor(data.draw(st.lists(st.lists(LOGP, min_size=t, max_size=t), min_size=p, max_size=p)), dtype=F64)
    junk = data.draw(st.sampled_from([float("nan"), float("inf"), float("-inf"), 123.0]))
    padded = torch.where(mask, logp, torch.full_like(logp, junk))
    by_hand = [sum(logp[i, :n].tolist()) for i, n in enumerate(lengths)]
    assert torch.allclose(sequence_logp(padded, mask), torch.tensor(by_hand, dtype=F64), rtol=1e-12, atol=1e-12)


@SETTINGS
@given(st.integers(2, 6), st.integers(1, 4), st.data())
def test_group_advantages_centre_each_group_and_ignore_a_shift(size, groups, data):
    rewards = torch.tensor(
        data.draw(st.lists(st.floats(-50, 50, allow_nan=False), min_size=size * groups, max_size=size * groups)),
        dtype=F64,
    )
    shift = data.draw(st.floats(-100, 100, allow_nan=False))
    adv = group_advantages(rewards, size)
    assert torch.allclose(adv.view(-1, size).sum(dim=1), torch.zeros(groups, dtype=F64), atol=1e-9)
    assert torch.allclose(group_advantages(rewards + shift, size), adv, atol=1e-6)
    equal = torch.full((size,), data.draw(st.floats(-50, 50, allow_nan=False)), dtype=F64)
    assert group_advantages(equal, size).abs().max().item() == 0.0  # a group of equal rewards: nothing to learn


@SETTINGS
@given(st.integers(1, 5), st.integers(1, 6), st.data())
def test_at_the_sampling_policy_without_kl_the_grpo_loss_is_minus_the_mean_advantage(n, t, data):
    """rho = 1 on every token, beta = 0: each answer's tokens all carry its advantage, so the
    per-answer mean is A_i and the loss -mean_i A_i, whatever the lengths and the padding."""
    lengths = data.draw(st.lists(st.integers(1, t), min_size=n, max_size=n))
    mask = torch.arange(t).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    logp = torch.tensor(data.draw(st.lists(st.lists(LOGP, min_size=t, max_size=t), min_size=n, max_size=n)), dtype=F64)
    adv = torch.tensor(data.draw(st.lists(st.floats(-5, 5, allow_nan=False), min_size=n, max_size=n)), dtype=F64)
    padded = torch.where(mask, logp, torch.full_like(logp, float("nan")))
    loss = grpo_loss(padded, padded, padded, adv, mask, clip=0.2, beta=0.0)
    assert loss.item() == pytest.approx(-adv.mean().item(), abs=1e-12)
    with_kl = grpo_loss(padded, padded, padded, adv, mask, clip=0.2, beta=0.5)  # k3 is 0 at equal log-probs
    assert with_kl.item() == pytest.approx(loss.item(), abs=1e-12)
