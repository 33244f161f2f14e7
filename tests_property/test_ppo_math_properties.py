"""Hypothesis properties of rlhf.ppo_math and rlhf.masks (SPEC §6).

Ranges cover what the lab produces, with margin: judge scores were seen from about -14 to +21
(SCORES: [-30, 30]), sampled log-probs down to about -20 (LOGPS: [-20, 0]; the numerical-safety
test goes to -50), values and returns on the scale of the scores (VALUES: [-30, 30]), and the
lab's own gamma 1 and lambda 0.95 are always among the drawn discount factors. Finite inputs
(the padding garbage) are looped over, not sampled. Expected numbers come from formulas written
out independently of the code (sums of deltas, per-token case analysis), never from the
expression under test.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from property_budget import examples

from conftest import rollout_rewards
from rlhf.masks import last_active_index, response_mean
from rlhf.ppo_math import (
    clip_fraction,
    clipped_policy_loss,
    gae,
    mean_sampled_log_ratio,
    sampled_log_ratio,
    value_loss,
)

# SPEC §5-§6 numbers, passed explicitly (ppo_math has no defaults; the profiles own these values,
# and test_the_constants_these_tests_pass_are_both_profiles_values in tests_unit/test_ppo_math.py
# checks that both profiles agree).
REWARD = {"kl_coef": 0.02, "truncation_penalty": -1.0}
GAE = {"gamma": 1.0, "lam": 0.95}
CLIP = {"clip": 0.2}
VALUE = {"coef": 0.5}
WARMUP_RATIO, MIN_LR_RATIO = 0.1, 0.1


pytestmark = pytest.mark.unit

F64 = torch.float64
SETTINGS = examples(80)

SCORES = (-30.0, 30.0)
LOGPS = (-20.0, 0.0)
VALUES = (-30.0, 30.0)
ADVANTAGES = (-30.0, 30.0)
KL_COEF, PENALTY = 0.02, -1.0  # the profiles' kl_coef and truncation_penalty


def floats(bounds):
    return st.floats(min_value=bounds[0], max_value=bounds[1], allow_nan=False, allow_infinity=False)


unit_interval = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
gammas = st.one_of(st.just(1.0), unit_interval)  # the lab runs gamma = 1 ...
lams = st.one_of(st.just(0.95), unit_interval)  # ... and lambda = 0.95


@st.composite
def episode(draw, max_len=12):
    """One row: rewards, values, dones, and the index of the first done (None if none).

    After the first done, dones are arbitrary (padding may carry anything)."""
    length = draw(st.integers(1, max_len))
    rewards = draw(st.lists(floats(SCORES), min_size=length, max_size=length))
    values = draw(st.lists(floats(VALUES), min_size=length, max_size=length))
    end = draw(st.one_of(st.none(), st.integers(0, length - 1)))
    dones = [0] * length
    if end is not None:
        dones[end] = 1
        for t in range(end + 1, length):
            dones[t] = draw(st.integers(0, 1))
    return rewards, values, dones, end


@st.composite
def masked_batch(draw, max_b=4, max_t=10, ranges=(VALUES,)):
    """B x T tensors (float64), one per (low, high) in `ranges`, and a mask with at least one
    active token per row, active tokens anywhere (right padding, left padding, holes)."""
    b = draw(st.integers(1, max_b))
    t = draw(st.integers(1, max_t))
    rows = []
    for _ in range(b):
        row = draw(st.lists(st.booleans(), min_size=t, max_size=t))
        if not any(row):
            row[draw(st.integers(0, t - 1))] = True
        rows.append(row)
    mask = torch.tensor(rows, dtype=torch.bool)
    tensors = [
        torch.tensor(draw(st.lists(floats(r), min_size=b * t, max_size=b * t)), dtype=F64).reshape(b, t) for r in ranges
    ]
    return mask, tensors


def direct_advantages(rewards, values, dones, end, gamma, lam):
    """A_t = sum_{k=t}^{stop} (gamma*lam)^(k-t) * delta_k with the deltas written out;
    stop = the terminal (or the last column); 0 after the terminal."""
    n = len(rewards)
    stop = n - 1 if end is None else end
    delta = []
    for k in range(n):
        v_next = values[k + 1] if k + 1 < n else 0.0
        delta.append(rewards[k] + gamma * (1 - dones[k]) * v_next - values[k])
    return [
        sum((gamma * lam) ** (k - t) * delta[k] for k in range(t, stop + 1)) if t <= stop else 0.0 for t in range(n)
    ]


# ----------------------------------------------------------------- GAE


@SETTINGS
@given(ep=episode(), gamma=gammas, lam=lams)
def test_gae_equals_direct_discounted_sum_of_deltas(ep, gamma, lam):
    rewards, values, dones, end = ep
    adv, ret = gae(
        torch.tensor(rewards, dtype=F64), torch.tensor(values, dtype=F64), torch.tensor(dones), gamma=gamma, lam=lam
    )
    expected = torch.tensor(direct_advantages(rewards, values, dones, end, gamma, lam), dtype=F64)
    assert torch.allclose(adv, expected, atol=1e-9, rtol=1e-9)
    returns_by_hand = [a + v for a, v in zip(expected.tolist(), values)]
    assert torch.allclose(ret, torch.tensor(returns_by_hand, dtype=F64), atol=1e-9, rtol=1e-9)


@SETTINGS
@given(ep=episode())
def test_gae_lambda_one_returns_are_reward_to_go(ep):
    rewards, values, dones, end = ep
    _, ret = gae(
        torch.tensor(rewards, dtype=F64), torch.tensor(values, dtype=F64), torch.tensor(dones), gamma=1.0, lam=1.0
    )
    stop = len(rewards) - 1 if end is None else end
    # Values telescope away: R_t = sum_{k=t}^{stop} r_k, whatever the critic said.
    to_go = [sum(rewards[t : stop + 1]) for t in range(stop + 1)]
    assert torch.allclose(ret[: stop + 1], torch.tensor(to_go, dtype=F64), atol=1e-9, rtol=0)


@SETTINGS
@given(
    ep=episode(),
    pad_values=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=6),
    pad_dones=st.lists(st.integers(0, 1), min_size=6, max_size=6),
    gamma=gammas,
    lam=lams,
)
def test_gae_appended_padding_changes_nothing_on_active_part(ep, pad_values, pad_dones, gamma, lam):
    rewards, values, _, _ = ep
    n, p = len(rewards), len(pad_values)
    dones = [0] * (n - 1) + [1]
    adv0, ret0 = gae(
        torch.tensor(rewards, dtype=F64), torch.tensor(values, dtype=F64), torch.tensor(dones), gamma=gamma, lam=lam
    )
    adv1, ret1 = gae(
        torch.tensor(rewards + [0.0] * p, dtype=F64),
        torch.tensor(values + pad_values, dtype=F64),
        torch.tensor(dones + pad_dones[:p]),
        gamma=gamma,
        lam=lam,
    )
    # Bit for bit on every CPU: the terminal cuts the recursion, so the active part is computed by
    # the same elementwise IEEE 754 operations on the same numbers (see test_batched_gae_equals_row_by_row).
    assert torch.equal(adv1[:n], adv0)
    assert torch.equal(ret1[:n], ret0)
    assert torch.equal(adv1[n:], torch.zeros(p, dtype=F64))


@SETTINGS
@given(eps=st.lists(episode(max_len=8), min_size=1, max_size=5), gamma=gammas, lam=lams)
def test_batched_gae_equals_row_by_row(eps, gamma, lam):
    width = max(len(e[0]) for e in eps)
    rows_r, rows_v, rows_d = [], [], []
    for rewards, values, dones, end in eps:
        pad = width - len(rewards)
        if end is None and pad:
            dones = dones[:-1] + [1]  # a row shorter than the batch must end before the padding
        rows_r.append(rewards + [0.0] * pad)
        rows_v.append(values + [3.0] * pad)
        rows_d.append(dones + [0] * pad)
    adv, ret = gae(
        torch.tensor(rows_r, dtype=F64), torch.tensor(rows_v, dtype=F64), torch.tensor(rows_d), gamma=gamma, lam=lam
    )
    for i in range(len(eps)):
        a_i, r_i = gae(
            torch.tensor(rows_r[i], dtype=F64),
            torch.tensor(rows_v[i], dtype=F64),
            torch.tensor(rows_d[i]),
            gamma=gamma,
            lam=lam,
        )
        # Bit for bit on every CPU: GAE is elementwise over rows (no sum across them); +, - and *
        # are correctly rounded in IEEE 754 (one result on any CPU) and rlhf.runtime makes every CPU
        # run the same AVX2 code, so whether a row depends on the batch around it is a property
        # of that code, the same on an Intel Xeon and an AMD EPYC (and it does not).
        assert torch.equal(adv[i], a_i)
        assert torch.equal(ret[i], r_i)


# ----------------------------------------------------------------- reductions


@SETTINGS
@given(batch=masked_batch())
def test_each_response_carries_total_weight_one_over_b(batch):
    mask, (x,) = batch
    b = mask.shape[0]
    x.requires_grad_(True)
    response_mean(x, mask).backward()
    per_row = x.grad.sum(dim=-1)
    assert torch.allclose(per_row, torch.full((b,), 1.0 / b, dtype=F64), atol=1e-12, rtol=0)
    assert torch.equal(x.grad[~mask], torch.zeros(int((~mask).sum()), dtype=F64))
    # The same through the actor loss at rho = 1, A = 1: each row's gradient sums to -1/B.
    logp = torch.zeros_like(x, requires_grad=True)
    clipped_policy_loss(logp, torch.zeros_like(x), torch.ones_like(x), mask, **CLIP).backward()
    assert torch.allclose(logp.grad.sum(dim=-1), torch.full((b,), -1.0 / b, dtype=F64), atol=1e-12, rtol=0)


def clipped_loss_by_cases(logp_cur, logp_old, adv, mask, clip):
    """The clipped loss and clip fraction written as the SPEC's case analysis, token by token in
    Python floats (no min, no clamp): a positive advantage gains nothing from rho above 1 + clip,
    a negative one nothing from rho below 1 - clip. Returns (loss, fraction, clipped [B][T])."""
    losses, fractions, clipped = [], [], []
    for b in range(mask.shape[0]):
        row_losses, row_clipped = [], []
        for t in range(mask.shape[1]):
            if not mask[b, t]:
                row_clipped.append(False)
                continue
            rho, a = math.exp(float(logp_cur[b, t]) - float(logp_old[b, t])), float(adv[b, t])
            cut = (a > 0 and rho > 1 + clip) or (a < 0 and rho < 1 - clip)
            objective = (1 + clip if a > 0 else 1 - clip) * a if cut else rho * a
            row_losses.append(-objective)
            row_clipped.append(cut)
        n = len(row_losses)
        losses.append(sum(row_losses) / n)
        fractions.append(sum(row_clipped) / n)
        clipped.append(row_clipped)
    return sum(losses) / len(losses), sum(fractions) / len(fractions), clipped


@SETTINGS
@given(
    batch=masked_batch(ranges=(LOGPS, LOGPS, ADVANTAGES)),
    clip=st.one_of(st.just(0.2), st.floats(min_value=0.01, max_value=0.9)),
)
def test_clipped_loss_and_clip_fraction_equal_the_case_analysis(batch, clip):
    """The code's loss, clip fraction and gradient against the case analysis: the loss is the
    by-hand number, never below the unclipped loss, and the tokens with zero gradient are
    exactly the clipped ones (the others get -A * rho / (B * n_b))."""
    mask, (logp_cur, logp_old, adv) = batch
    want_loss, want_fraction, clipped = clipped_loss_by_cases(logp_cur, logp_old, adv, mask, clip)
    lc = logp_cur.clone().requires_grad_(True)
    loss = clipped_policy_loss(lc, logp_old, adv, mask, clip=clip)
    loss.backward()
    assert loss.item() == pytest.approx(want_loss, rel=1e-9, abs=1e-9)
    assert clip_fraction(logp_cur, logp_old, adv, mask, clip=clip).item() == pytest.approx(want_fraction, abs=1e-12)
    rho = torch.exp(logp_cur - logp_old)
    unclipped = response_mean(-rho * adv, mask).item()
    assert loss.item() >= unclipped - 1e-9 * (1 + abs(unclipped))
    counts = mask.sum(-1, keepdim=True).to(F64)
    free_grad = -adv * rho / (mask.shape[0] * counts)
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            g = float(lc.grad[b, t])
            if not mask[b, t] or clipped[b][t]:
                assert g == 0.0, (b, t, g)
            else:
                assert g == pytest.approx(float(free_grad[b, t]), rel=1e-9, abs=1e-12)


@SETTINGS
@given(
    batch=masked_batch(ranges=(LOGPS, LOGPS)),
    score=st.lists(floats(SCORES), min_size=4, max_size=4),
    truncated=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_rewards_sum_to_kl_penalty_plus_score_plus_penalty(batch, score, truncated):
    """Each response's rewards add up to -kl_coef * (its summed sampled log-ratio) + its score
    (+ the penalty when cut), the score paid at the last active token alone."""
    mask, (logp_old, logp_ref) = batch
    b = mask.shape[0]
    s, cut = torch.tensor(score[:b], dtype=F64), torch.tensor(truncated[:b])
    rewards = rollout_rewards(logp_old, logp_ref, s, mask, cut, kl_coef=KL_COEF, truncation_penalty=PENALTY)
    for i in range(b):
        active = [t for t in range(mask.shape[1]) if mask[i, t]]
        kl = [-KL_COEF * (float(logp_old[i, t]) - float(logp_ref[i, t])) for t in active]
        terminal = score[i] + (PENALTY if truncated[i] else 0.0)
        assert float(rewards[i].sum()) == pytest.approx(sum(kl) + terminal, rel=1e-9, abs=1e-9)
        for k, t in enumerate(active):
            want = kl[k] + (terminal if t == active[-1] else 0.0)
            assert float(rewards[i, t]) == pytest.approx(want, rel=1e-12, abs=1e-12)
        assert all(float(rewards[i, t]) == 0.0 for t in range(mask.shape[1]) if not mask[i, t])


GARBAGE = (0.0, -1e4, 1e4, 123.0, -math.inf, math.inf, math.nan)


@examples(40)
@given(batch=masked_batch(ranges=(LOGPS, LOGPS, LOGPS, ADVANTAGES, VALUES, VALUES)), score=floats(SCORES))
def test_reductions_use_active_tokens_only(batch, score):
    """Whatever sits in the padding (each of the GARBAGE fills, looped), every loss, gradient,
    reward and log is the one computed with clean padding."""
    mask, (logp_cur, logp_old, logp_ref, adv, values, returns) = batch
    b = mask.shape[0]

    def outputs(tensors):
        lc, lo, lr, a, v, r = [t.clone() for t in tensors]
        lc.requires_grad_(True)
        v.requires_grad_(True)
        actor = clipped_policy_loss(lc, lo, a, mask, **CLIP)
        critic = value_loss(v, r, mask, **VALUE)
        (actor + critic).backward()
        rewards = rollout_rewards(
            lo, lr, torch.full((b,), score, dtype=F64), mask, torch.zeros(b, dtype=torch.bool), **REWARD
        )
        return [
            actor.detach(),
            critic.detach(),
            lc.grad,
            v.grad,
            rewards,
            clip_fraction(lc.detach(), lo, a, mask, **CLIP),
            response_mean(r, mask),
            mean_sampled_log_ratio(lo, lr, mask),
            sampled_log_ratio(lo, lr, mask),
        ]

    clean = [logp_cur, logp_old, logp_ref, adv, values, returns]
    want = outputs(clean)
    for fill in GARBAGE:
        dirty = [torch.where(mask, t, torch.full_like(t, fill)) for t in clean]
        for got, expected in zip(outputs(dirty), want):
            assert torch.equal(got, expected), fill


# ----------------------------------------------------------------- numerical safety


@examples(60)
@given(
    batch=masked_batch(ranges=((-50.0, 0.0),) * 3 + (VALUES,)),
    adv=floats(ADVANTAGES),
    ret=floats(VALUES),
    score=floats(SCORES),
    cut=st.booleans(),
)
def test_no_nan_or_inf_for_logprobs_down_to_minus_50(batch, adv, ret, score, cut):
    mask, tensors = batch
    logp_cur, logp_old, logp_ref, values = [t.to(torch.float32) for t in tensors]
    b, t = mask.shape
    advantages = torch.full((b, t), adv)
    lc = logp_cur.clone().requires_grad_(True)
    actor = clipped_policy_loss(lc, logp_old, advantages, mask, **CLIP)
    actor.backward()
    v = values.clone().requires_grad_(True)
    critic = value_loss(v, torch.full((b, t), ret), mask, **VALUE)
    critic.backward()
    rewards = rollout_rewards(
        logp_old, logp_ref, torch.full((b,), score), mask, torch.full((b,), cut, dtype=torch.bool), **REWARD
    )
    dones = torch.zeros(b, t, dtype=torch.bool)
    dones[torch.arange(b), last_active_index(mask)] = True
    a, r = gae(rewards, values, dones, **GAE)
    for x in (
        actor,
        critic,
        lc.grad,
        v.grad,
        rewards,
        a,
        r,
        clip_fraction(logp_cur, logp_old, advantages, mask, **CLIP),
        mean_sampled_log_ratio(logp_old, logp_ref, mask),
    ):
        assert torch.isfinite(x).all()
