"""Hypothesis properties of rlhf.ppo_math and rlhf.masks (SPEC §6)."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.masks import last_active_index, response_mean
from rlhf.ppo_math import (clip_fraction, clipped_policy_loss, gae, mean_sampled_log_ratio,
                           policy_ratio, sampled_log_ratio, token_rewards, value_loss)

pytestmark = pytest.mark.unit

F64 = torch.float64
SETTINGS = settings(max_examples=80)

finite = st.floats(min_value=-5.0, max_value=5.0, allow_nan=False, allow_infinity=False)
unit_interval = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@st.composite
def episode(draw, max_len=12):
    """One row: rewards, values, dones, and the index of the first done (None if none).

    After the first done, dones are arbitrary (padding may carry anything)."""
    length = draw(st.integers(1, max_len))
    rewards = draw(st.lists(finite, min_size=length, max_size=length))
    values = draw(st.lists(finite, min_size=length, max_size=length))
    end = draw(st.one_of(st.none(), st.integers(0, length - 1)))
    dones = [0] * length
    if end is not None:
        dones[end] = 1
        for t in range(end + 1, length):
            dones[t] = draw(st.integers(0, 1))
    return rewards, values, dones, end


@st.composite
def masked_batch(draw, max_b=4, max_t=10, low=-5.0, high=5.0, n_tensors=1):
    """B x T tensors (float64) and a mask with at least one active token per row, active
    tokens anywhere (right padding, left padding, holes)."""
    b = draw(st.integers(1, max_b))
    t = draw(st.integers(1, max_t))
    rows = []
    for _ in range(b):
        row = draw(st.lists(st.booleans(), min_size=t, max_size=t))
        if not any(row):
            row[draw(st.integers(0, t - 1))] = True
        rows.append(row)
    mask = torch.tensor(rows, dtype=torch.bool)
    vals = st.floats(min_value=low, max_value=high, allow_nan=False)
    tensors = [torch.tensor(draw(st.lists(vals, min_size=b * t, max_size=b * t)),
                            dtype=F64).reshape(b, t) for _ in range(n_tensors)]
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
    return [sum((gamma * lam) ** (k - t) * delta[k] for k in range(t, stop + 1)) if t <= stop
            else 0.0 for t in range(n)]


# ----------------------------------------------------------------- GAE

@SETTINGS
@given(ep=episode(), gamma=unit_interval, lam=unit_interval)
def test_gae_equals_direct_discounted_sum_of_deltas(ep, gamma, lam):
    rewards, values, dones, end = ep
    adv, ret = gae(torch.tensor(rewards, dtype=F64), torch.tensor(values, dtype=F64),
                   torch.tensor(dones), gamma=gamma, lam=lam)
    expected = torch.tensor(direct_advantages(rewards, values, dones, end, gamma, lam), dtype=F64)
    assert torch.allclose(adv, expected, atol=1e-9, rtol=1e-9)
    assert torch.allclose(ret, adv + torch.tensor(values, dtype=F64), atol=1e-12, rtol=0)


@SETTINGS
@given(ep=episode())
def test_gae_lambda_one_returns_are_reward_to_go(ep):
    rewards, values, dones, end = ep
    _, ret = gae(torch.tensor(rewards, dtype=F64), torch.tensor(values, dtype=F64),
                 torch.tensor(dones), gamma=1.0, lam=1.0)
    stop = len(rewards) - 1 if end is None else end
    # Values telescope away: R_t = sum_{k=t}^{stop} r_k, whatever the critic said.
    to_go = [sum(rewards[t:stop + 1]) for t in range(stop + 1)]
    assert torch.allclose(ret[:stop + 1], torch.tensor(to_go, dtype=F64), atol=1e-9, rtol=0)


@SETTINGS
@given(ep=episode(), pad_values=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1,
                                         max_size=6),
       pad_dones=st.lists(st.integers(0, 1), min_size=6, max_size=6),
       gamma=unit_interval, lam=unit_interval)
def test_gae_appended_padding_changes_nothing_on_active_part(ep, pad_values, pad_dones,
                                                             gamma, lam):
    rewards, values, _, _ = ep
    n, p = len(rewards), len(pad_values)
    dones = [0] * (n - 1) + [1]
    adv0, ret0 = gae(torch.tensor(rewards, dtype=F64), torch.tensor(values, dtype=F64),
                     torch.tensor(dones), gamma=gamma, lam=lam)
    adv1, ret1 = gae(torch.tensor(rewards + [0.0] * p, dtype=F64),
                     torch.tensor(values + pad_values, dtype=F64),
                     torch.tensor(dones + pad_dones[:p]), gamma=gamma, lam=lam)
    assert torch.equal(adv1[:n], adv0)
    assert torch.equal(ret1[:n], ret0)
    assert torch.equal(adv1[n:], torch.zeros(p, dtype=F64))


@SETTINGS
@given(eps=st.lists(episode(max_len=8), min_size=1, max_size=5), gamma=unit_interval,
       lam=unit_interval)
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
    adv, ret = gae(torch.tensor(rows_r, dtype=F64), torch.tensor(rows_v, dtype=F64),
                   torch.tensor(rows_d), gamma=gamma, lam=lam)
    for i in range(len(eps)):
        a_i, r_i = gae(torch.tensor(rows_r[i], dtype=F64), torch.tensor(rows_v[i], dtype=F64),
                       torch.tensor(rows_d[i]), gamma=gamma, lam=lam)
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
    clipped_policy_loss(logp, torch.zeros_like(x), torch.ones_like(x), mask).backward()
    assert torch.allclose(logp.grad.sum(dim=-1), torch.full((b,), -1.0 / b, dtype=F64),
                          atol=1e-12, rtol=0)


@SETTINGS
@given(batch=masked_batch(low=-10.0, high=0.0, n_tensors=3),
       clip=st.floats(min_value=0.01, max_value=0.9))
def test_clipped_objective_never_exceeds_unclipped(batch, clip):
    mask, (logp_cur, logp_old, adv_raw) = batch
    adv = adv_raw + 5.0  # advantages in [-5, 5]
    rho = policy_ratio(logp_cur, logp_old)
    per_token_clipped = torch.min(rho * adv, torch.clamp(rho, 1 - clip, 1 + clip) * adv)
    assert (per_token_clipped <= rho * adv).all()
    loss_clipped = clipped_policy_loss(logp_cur, logp_old, adv, mask, clip=clip)
    loss_unclipped = response_mean(-rho * adv, mask)
    assert loss_clipped.item() >= loss_unclipped.item() - 1e-9 * (1 + abs(loss_unclipped.item()))
    frac = clip_fraction(logp_cur, logp_old, adv, mask, clip=clip).item()
    assert 0.0 <= frac <= 1.0
    if frac == 0.0:  # nothing clipped: the two objectives coincide
        assert loss_clipped.item() == pytest.approx(loss_unclipped.item(), rel=1e-9, abs=1e-12)


garbage = st.sampled_from([0.0, -1e4, 1e4, 123.0, -math.inf, math.inf, math.nan])


@SETTINGS
@given(batch=masked_batch(low=-8.0, high=0.0, n_tensors=6), fill=garbage,
       score=st.floats(-3.0, 3.0))
def test_reductions_use_active_tokens_only(batch, fill, score):
    mask, (logp_cur, logp_old, logp_ref, adv, values, returns) = batch
    b = mask.shape[0]

    def outputs(tensors):
        lc, lo, lr, a, v, r = [t.clone() for t in tensors]
        lc.requires_grad_(True)
        v.requires_grad_(True)
        actor = clipped_policy_loss(lc, lo, a, mask)
        critic = value_loss(v, r, mask)
        (actor + critic).backward()
        rewards = token_rewards(lo, lr, torch.full((b,), score, dtype=F64), mask,
                                torch.zeros(b, dtype=torch.bool))
        return [actor.detach(), critic.detach(), lc.grad, v.grad, rewards,
                clip_fraction(lc.detach(), lo, a, mask), response_mean(r, mask),
                mean_sampled_log_ratio(lo, lr, mask), sampled_log_ratio(lo, lr, mask)]

    clean = [logp_cur, logp_old, logp_ref, adv, values, returns]
    dirty = [torch.where(mask, t, torch.full_like(t, fill)) for t in clean]
    for got, want in zip(outputs(dirty), outputs(clean)):
        assert torch.equal(got, want)


# ----------------------------------------------------------------- numerical safety

@settings(max_examples=60)
@given(batch=masked_batch(low=-50.0, high=0.0, n_tensors=3),
       adv=st.floats(-10.0, 10.0), ret=st.floats(-10.0, 10.0))
def test_no_nan_or_inf_for_logprobs_down_to_minus_50(batch, adv, ret):
    mask, tensors = batch
    logp_cur, logp_old, logp_ref = [t.to(torch.float32) for t in tensors]
    b, t = mask.shape
    advantages = torch.full((b, t), adv)
    lc = logp_cur.clone().requires_grad_(True)
    actor = clipped_policy_loss(lc, logp_old, advantages, mask)
    actor.backward()
    v = torch.zeros(b, t, requires_grad=True)
    critic = value_loss(v, torch.full((b, t), ret), mask)
    critic.backward()
    rewards = token_rewards(logp_old, logp_ref, torch.zeros(b), mask,
                            torch.ones(b, dtype=torch.bool))
    dones = torch.zeros(b, t, dtype=torch.bool)
    dones[torch.arange(b), last_active_index(mask)] = True
    a, r = gae(rewards, torch.zeros(b, t), dones)
    for x in (actor, critic, lc.grad, v.grad, rewards, a, r,
              clip_fraction(logp_cur, logp_old, advantages, mask),
              mean_sampled_log_ratio(logp_old, logp_ref, mask)):
        assert torch.isfinite(x).all()
