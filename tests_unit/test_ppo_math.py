"""Analytic tests of rlhf.ppo_math: every number below is worked by hand in the comments."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from conftest import rollout_rewards
from rlhf import ppo_math
from rlhf.config import load_profile
from rlhf.ppo_math import (
    bradley_terry_loss,
    clip_fraction,
    clipped_policy_loss,
    gae,
    learning_rate,
    log_ratio_penalty,
    mean_sampled_log_ratio,
    policy_ratio,
    sampled_log_ratio,
    token_rewards,
    value_loss,
    warmup_steps,
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


def t64(values):
    return torch.tensor(values, dtype=F64)


def assert_close(actual, expected, tol=1e-12):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=tol, rtol=0), (actual.tolist(), expected.tolist())


# ============================================================ the 3-token episode, by hand
#
# Shared inputs (one response of 3 tokens, kl_coef = 0.02, gamma = 1, lam = 0.95):
#   logp_old = [-1.0, -2.0, -0.5]     logp_ref = [-1.5, -1.0, -0.5]
#   sampled log-ratio = logp_old - logp_ref = [0.5, -1.0, 0.0]   (the middle one is negative)
#   -0.02 * ratio     = [-0.01, 0.02, 0.0]
#   judge score = 0.7 ; values V = [0.3, 0.5, 0.4] ; done only at the last token.
#
# (a) EOS end:
#   rewards  r = [-0.01, 0.02, 0.0 + 0.7]                 = [-0.01, 0.02, 0.7]
#   delta_2 = 0.7  - 0.4            (terminal: no V_3)    = 0.3
#   delta_1 = 0.02 + 0.4 - 0.5                            = -0.08
#   delta_0 = -0.01 + 0.5 - 0.3                           = 0.19
#   A_2 = 0.3
#   A_1 = -0.08 + 0.95 * 0.3    = -0.08 + 0.285           = 0.205
#   A_0 = 0.19  + 0.95 * 0.205  = 0.19 + 0.19475          = 0.38475
#   returns = A + V = [0.68475, 0.705, 0.7]
#
# (b) truncated end (no EOS, cut at the limit): the -1 penalty joins the score at the last token
#   rewards  r = [-0.01, 0.02, 0.7 - 1.0]                 = [-0.01, 0.02, -0.3]
#   delta_2 = -0.3 - 0.4                                   = -0.7
#   delta_1 = -0.08 ; delta_0 = 0.19                       (as in (a))
#   A_2 = -0.7
#   A_1 = -0.08 + 0.95 * (-0.7)   = -0.08 - 0.665          = -0.745
#   A_0 = 0.19  + 0.95 * (-0.745) = 0.19 - 0.70775         = -0.51775
#   returns = A + V = [-0.21775, -0.245, -0.3]
#
# (c) EOS end followed by 2 padding positions (mask [1,1,1,0,0]), with garbage there:
#   padding logp_old = [-3.0, -4.0], logp_ref = [-7.0, 0.0], values = [9.0, -4.0]
#   rewards  = [-0.01, 0.02, 0.7, 0, 0]   (no reward on padding)
#   advantages = [0.38475, 0.205, 0.3, 0, 0]   (as (a); 0 on padding by design)
#   returns    = [0.68475, 0.705, 0.7, 9.0, -4.0]   (returns = A + V, so V on padding)
#   A GAE that bootstraps past the terminal would use V_3 = 9.0:
#   delta_2 = 0.7 + 9.0 - 0.4 = 9.3  -> caught.
#
# (d) truncated end followed by one extra column holding a "final value" 2.0 (the critic's
#   value after the last token): it must not be bootstrapped either.
#   advantages = [-0.51775, -0.745, -0.7, 0], returns = [-0.21775, -0.245, -0.3, 2.0]
#   Bootstrapping would give delta_2 = -0.3 + 2.0 - 0.4 = 1.3 -> caught.

LOGP_OLD = [-1.0, -2.0, -0.5]
LOGP_REF = [-1.5, -1.0, -0.5]
SCORE = 0.7
VALUES = [0.3, 0.5, 0.4]

HAND_EPISODES = {
    "a_eos": dict(
        rewards=[-0.01, 0.02, 0.7],
        values=VALUES,
        dones=[0, 0, 1],
        advantages=[0.38475, 0.205, 0.3],
        returns=[0.68475, 0.705, 0.7],
    ),
    "b_truncated": dict(
        rewards=[-0.01, 0.02, -0.3],
        values=VALUES,
        dones=[0, 0, 1],
        advantages=[-0.51775, -0.745, -0.7],
        returns=[-0.21775, -0.245, -0.3],
    ),
    "c_padding": dict(
        rewards=[-0.01, 0.02, 0.7, 0.0, 0.0],
        values=VALUES + [9.0, -4.0],
        dones=[0, 0, 1, 0, 0],
        advantages=[0.38475, 0.205, 0.3, 0.0, 0.0],
        returns=[0.68475, 0.705, 0.7, 9.0, -4.0],
    ),
    "d_truncated_final_value": dict(
        rewards=[-0.01, 0.02, -0.3, 0.0],
        values=VALUES + [2.0],
        dones=[0, 0, 1, 0],
        advantages=[-0.51775, -0.745, -0.7, 0.0],
        returns=[-0.21775, -0.245, -0.3, 2.0],
    ),
}


def check_gae_by_hand(gae_fn) -> None:
    """The analytic check: raise AssertionError unless gae_fn reproduces every hand episode,
    both one row at a time ([T]) and as one right-padded batch ([B, T])."""
    for name, ep in HAND_EPISODES.items():
        adv, ret = gae_fn(t64(ep["rewards"]), t64(ep["values"]), torch.tensor(ep["dones"]), gamma=1.0, lam=0.95)
        assert torch.allclose(adv, t64(ep["advantages"]), atol=1e-12, rtol=0), (name, adv)
        assert torch.allclose(ret, t64(ep["returns"]), atol=1e-12, rtol=0), (name, ret)
    # Batched: pad every episode to 5 columns with reward 0, value 7.0, done 0.
    width = 5
    rows = list(HAND_EPISODES.values())

    def pad(seq, fill):
        return list(seq) + [fill] * (width - len(seq))

    adv, ret = gae_fn(
        t64([pad(e["rewards"], 0.0) for e in rows]),
        t64([pad(e["values"], 7.0) for e in rows]),
        torch.tensor([pad(e["dones"], 0) for e in rows]),
        gamma=1.0,
        lam=0.95,
    )
    for i, e in enumerate(rows):
        n = len(e["rewards"])
        assert torch.allclose(adv[i, :n], t64(e["advantages"]), atol=1e-12, rtol=0), (i, adv)
        assert torch.allclose(ret[i, :n], t64(e["returns"]), atol=1e-12, rtol=0), (i, ret)


def buggy_gae_ignoring_dones(rewards, values, dones, gamma=1.0, lam=0.95):
    """SPEC §9.4's bug, on purpose: bootstraps V_{t+1} and A_{t+1} straight past the terminal."""
    single = rewards.dim() == 1
    r = rewards.unsqueeze(0) if single else rewards
    v = values.unsqueeze(0) if single else values
    adv = torch.zeros_like(r)
    next_v = torch.zeros(r.shape[0], dtype=r.dtype)
    next_a = torch.zeros(r.shape[0], dtype=r.dtype)
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_v - v[:, t]  # no (1 - done_t): the bug
        next_a = delta + gamma * lam * next_a
        adv[:, t] = next_a
        next_v = v[:, t]
    ret = adv + v
    return (adv[0], ret[0]) if single else (adv, ret)


def test_gae_matches_every_hand_episode():
    check_gae_by_hand(gae)


@pytest.mark.parametrize("name", sorted(HAND_EPISODES))
def test_gae_each_hand_episode(name):
    ep = HAND_EPISODES[name]
    adv, ret = gae(t64(ep["rewards"]), t64(ep["values"]), torch.tensor(ep["dones"], dtype=torch.bool), **GAE)
    assert_close(adv, ep["advantages"])
    assert_close(ret, ep["returns"])


def test_regression_9_4_check_rejects_gae_that_bootstraps_past_terminal():
    # The check accepts the real gae ...
    check_gae_by_hand(gae)
    # ... and fails on a GAE that ignores dones: the check can fail.
    with pytest.raises(AssertionError):
        check_gae_by_hand(buggy_gae_ignoring_dones)
    # Specifically the padding episode (c): the bug gives delta_2 = 0.7 + 9.0 - 0.4 = 9.3.
    ep = HAND_EPISODES["c_padding"]
    adv, _ = buggy_gae_ignoring_dones(t64(ep["rewards"]), t64(ep["values"]), torch.tensor(ep["dones"]))
    assert adv[2].item() != pytest.approx(0.3)


@pytest.mark.parametrize("episode,truncated", [("a_eos", False), ("b_truncated", True)])
def test_token_rewards_by_hand(episode, truncated):
    """The hand-computed rewards of an episode that ended with EOS and of one cut at the limit
    (the truncation penalty added to the score)."""
    r = rollout_rewards(
        t64([LOGP_OLD]),
        t64([LOGP_REF]),
        t64([SCORE]),
        torch.ones(1, 3, dtype=torch.bool),
        torch.tensor([truncated]),
        **REWARD,
    )
    assert_close(r, [HAND_EPISODES[episode]["rewards"]])


def test_token_rewards_padding_by_hand():
    mask = torch.tensor([[1, 1, 1, 0, 0]], dtype=torch.bool)
    r = rollout_rewards(
        t64([LOGP_OLD + [-3.0, -4.0]]),
        t64([LOGP_REF + [-7.0, 0.0]]),
        t64([SCORE]),
        mask,
        torch.tensor([False]),
        **REWARD,
    )
    assert_close(r, [HAND_EPISODES["c_padding"]["rewards"]])


def test_full_chain_rewards_to_gae_by_hand_batched():
    # (a), (b), (c) as one batch of 3 rows of width 5, through token_rewards then gae.
    pad_old, pad_ref = [-3.0, -4.0], [-7.0, 0.0]
    logp_old = t64([LOGP_OLD + pad_old] * 3)
    logp_ref = t64([LOGP_REF + pad_ref] * 3)
    mask = torch.tensor([[1, 1, 1, 0, 0]] * 3, dtype=torch.bool)
    truncated = torch.tensor([False, True, False])
    rewards = rollout_rewards(logp_old, logp_ref, t64([SCORE] * 3), mask, truncated, **REWARD)
    dones = torch.zeros(3, 5, dtype=torch.bool)
    dones[:, 2] = True
    values = t64([VALUES + [9.0, -4.0]] * 3)
    adv, ret = gae(rewards, values, dones, **GAE)
    assert_close(
        adv, [[0.38475, 0.205, 0.3, 0.0, 0.0], [-0.51775, -0.745, -0.7, 0.0, 0.0], [0.38475, 0.205, 0.3, 0.0, 0.0]]
    )
    assert_close(
        ret, [[0.68475, 0.705, 0.7, 9.0, -4.0], [-0.21775, -0.245, -0.3, 9.0, -4.0], [0.68475, 0.705, 0.7, 9.0, -4.0]]
    )


# ============================================================ rewards


def test_terminal_score_placed_exactly_once_whatever_padding_side():
    # kl part switched off (logp_old == logp_ref), so only score and penalty remain.
    mask = torch.tensor(
        [
            [1, 1, 1, 1],  # full row: last index 3
            [1, 1, 0, 0],  # right padded: 1
            [0, 0, 1, 1],  # left padded: 3 (not length-1 = 1)
            [0, 1, 0, 0],
        ],  # single token in the middle: 1
        dtype=torch.bool,
    )
    logp = torch.full((4, 4), -2.0, dtype=F64)
    score = t64([0.5, -1.5, 2.0, 3.0])
    truncated = torch.tensor([True, False, False, True])
    r = rollout_rewards(logp, logp.clone(), score, mask, truncated, **REWARD)
    expected = torch.zeros(4, 4, dtype=F64)
    expected[0, 3] = 0.5 - 1.0
    expected[1, 1] = -1.5
    expected[2, 3] = 2.0
    expected[3, 1] = 3.0 - 1.0
    assert_close(r, expected)
    assert (r != 0).sum().item() == 4  # one nonzero per row: the score is paid once


def test_token_rewards_kl_part_and_padding_zero_and_coefficients():
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    logp_old = t64([[-1.0, -3.0, -9.0]])
    logp_ref = t64([[-2.0, -1.0, 0.0]])
    # ratio = [1.0, -2.0, (inactive)]; kl_coef 0.1 -> [-0.1, 0.2]; score 0 ; penalty -5 (truncated)
    r = rollout_rewards(logp_old, logp_ref, t64([0.0]), mask, torch.tensor([1]), kl_coef=0.1, truncation_penalty=-5.0)
    assert_close(r, [[-0.1, 0.2 - 5.0, 0.0]])


def test_token_rewards_read_the_penalty_given_and_leave_it_as_it_was():
    """token_rewards adds the terminal score to the rollout's own penalty tensor (computed once, by
    log_ratio_penalty) in a new tensor: the penalty the history and the token view read is unchanged,
    and a value on an inactive position (which the penalty never holds) does not leak into the rewards."""
    penalty = t64([[-0.1, 0.2, 7.0], [0.3, 0.0, 0.0]])
    kept = penalty.clone()
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    r = token_rewards(penalty, t64([1.0, 2.0]), mask, torch.tensor([True, False]), truncation_penalty=-5.0)
    assert r.tolist() == [[-0.1, 0.2 + 1.0 - 5.0, 0.0], [0.3 + 2.0, 0.0, 0.0]]
    assert torch.equal(penalty, kept) and r.data_ptr() != penalty.data_ptr()


def test_token_rewards_are_detached():
    logp_old = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    score = torch.tensor([1.0], requires_grad=True)
    r = rollout_rewards(logp_old, torch.zeros(1, 2), score, torch.ones(1, 2), torch.tensor([False]), **REWARD)
    assert not r.requires_grad


def test_token_rewards_shape_errors():
    with pytest.raises(ValueError):
        rollout_rewards(
            torch.zeros(2, 3),
            torch.zeros(2, 3),
            torch.zeros(3),
            torch.ones(2, 3),
            torch.tensor([False, False]),
            **REWARD,
        )
    with pytest.raises(ValueError):
        rollout_rewards(
            torch.zeros(2, 3),
            torch.zeros(2, 4),
            torch.zeros(2),
            torch.ones(2, 3),
            torch.tensor([False, False]),
            **REWARD,
        )


def test_sampled_log_ratio_can_be_negative_and_is_masked():
    logp_old = t64([[-1.0, -2.0, -0.5, -8.0], [-0.1, -0.2, -0.3, -0.4]])
    logp_ref = t64([[-1.5, -1.0, -0.5, -1.0], [-0.2, -0.2, -0.1, -9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    ratio = sampled_log_ratio(logp_old, logp_ref, mask)
    assert_close(ratio, [[0.5, -1.0, 0.0, 0.0], [0.1, 0.0, 0.0, 0.0]], tol=1e-12)
    means = mean_sampled_log_ratio(logp_old, logp_ref, mask)
    # row 0: (0.5 - 1.0 + 0.0) / 3 = -1/6 (negative: not a KL) ; row 1: (0.1 + 0.0) / 2 = 0.05
    assert_close(means, [-1.0 / 6.0, 0.05], tol=1e-12)
    assert means[0] < 0


def test_mean_sampled_log_ratio_empty_row_names_row():
    with pytest.raises(ValueError, match=r"\[1\]"):
        mean_sampled_log_ratio(torch.zeros(2, 2), torch.zeros(2, 2), torch.tensor([[1, 0], [0, 0]], dtype=torch.bool))


def test_nothing_is_named_kl_except_the_coefficient():
    public = [n for n in dir(ppo_math) if not n.startswith("_")]
    assert not [n for n in public if "kl" in n.lower()]
    for name in ppo_math.__all__:
        fn = getattr(ppo_math, name)
        params = [p for p in inspect.signature(fn).parameters if "kl" in p.lower()]
        assert params in ([], ["kl_coef"]), (name, params)


# Every number the profile owns, by the ppo_math function that takes it: no defaults, so a caller
# cannot silently run on a value that repeats (or contradicts) the profile.
PROFILE_OWNED = {
    "token_rewards": ("truncation_penalty",),
    "log_ratio_penalty": ("kl_coef",),
    "gae": ("gamma", "lam"),
    "clipped_policy_loss": ("clip",),
    "clip_fraction": ("clip",),
    "value_loss": ("coef",),
    "warmup_steps": ("warmup_ratio",),
    "learning_rate": ("warmup_ratio", "min_ratio"),
}


@pytest.mark.parametrize("name", sorted(PROFILE_OWNED))
def test_profile_owned_numbers_have_no_defaults(name):
    params = inspect.signature(getattr(ppo_math, name)).parameters
    for arg in PROFILE_OWNED[name]:
        assert params[arg].default is inspect.Parameter.empty, (name, arg)


def test_the_constants_these_tests_pass_are_both_profiles_values():
    """The SPEC numbers used by hand here are the ones the profiles give the lab."""
    for name in ("embedded", "qwen2.5-0.5b"):
        p = load_profile(name)
        assert {"kl_coef": p.ppo.kl_coef, "truncation_penalty": p.ppo.truncation_penalty} == REWARD
        assert {"gamma": p.ppo.gamma, "lam": p.ppo.lam} == GAE
        assert {"clip": p.ppo.clip} == CLIP and {"coef": p.ppo.value_coef} == VALUE
        assert (p.optim.warmup_ratio, p.optim.min_lr_ratio) == (WARMUP_RATIO, MIN_LR_RATIO)


# ============================================================ GAE details


def test_gae_outputs_detached_and_inputs_untouched():
    rewards = torch.tensor([0.0, 1.0], requires_grad=True)
    values = torch.tensor([0.5, 0.25], requires_grad=True)
    adv, ret = gae(rewards, values, torch.tensor([False, True]), **GAE)
    assert not adv.requires_grad and not ret.requires_grad
    # delta_1 = 1 - 0.25 = 0.75 ; delta_0 = 0 + 0.25 - 0.5 = -0.25 ; A_0 = -0.25 + 0.95*0.75
    assert torch.allclose(adv, torch.tensor([-0.25 + 0.7125, 0.75]))
    assert torch.allclose(ret, adv + values.detach())


def test_gae_row_without_done_ends_after_last_column():
    # No done anywhere: V_T = 0 beyond the last column.
    # delta_1 = 1.0 - 0.5 = 0.5 ; delta_0 = 0 + 0.5 - 0.2 = 0.3 ; A_0 = 0.3 + 0.5*0.5 = 0.55
    adv, _ = gae(t64([0.0, 1.0]), t64([0.2, 0.5]), torch.tensor([0, 0]), gamma=1.0, lam=0.5)
    assert_close(adv, [0.55, 0.5])


def test_gae_gamma_discounts_bootstrap():
    # gamma = 0.5, lam = 1: delta_1 = 2 - 1 = 1 ; delta_0 = 0 + 0.5*1 - 0 = 0.5 ;
    # A_0 = 0.5 + 0.5*1*1 = 1.0  (= discounted reward-to-go 0.5*2 minus V_0 = 0)
    adv, ret = gae(t64([0.0, 2.0]), t64([0.0, 1.0]), torch.tensor([0, 1]), gamma=0.5, lam=1.0)
    assert_close(adv, [1.0, 1.0])
    assert_close(ret, [1.0, 2.0])


def test_gae_nan_values_in_padding_do_not_leak():
    adv, ret = gae(t64([[1.0, 0.0]]), t64([[0.25, math.nan]]), torch.tensor([[1, 0]]), **GAE)
    assert adv[0, 0].item() == 0.75 and adv[0, 1].item() == 0.0
    assert ret[0, 0].item() == 1.0


def test_gae_shape_errors():
    with pytest.raises(ValueError):
        gae(torch.zeros(3), torch.zeros(4), torch.zeros(3), **GAE)
    with pytest.raises(ValueError):
        gae(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), **GAE)


# ============================================================ actor loss and clipping

RHOS = [0.5, 0.9, 1.0, 1.1, 1.3, 2.0]  # avoids the exact boundaries 0.8 and 1.2


def _actor_grad(advantage: float):
    # One response of 6 active tokens plus one padding position (whose log-prob is -inf).
    logp_old = torch.zeros(7, dtype=F64)
    logp_old[6] = -math.inf
    logp_cur = torch.tensor([math.log(r) for r in RHOS] + [-math.inf], dtype=F64, requires_grad=True)
    adv = torch.full((7,), advantage, dtype=F64)
    mask = torch.tensor([1] * 6 + [0], dtype=torch.bool)
    loss = clipped_policy_loss(logp_cur, logp_old, adv, mask, **CLIP)
    loss.backward()
    return loss.detach(), logp_cur.grad


def test_clipping_gradient_positive_advantage():
    # A = 2 > 0: the clipped branch is the minimum where rho > 1.2 -> zero gradient there;
    # elsewhere d/dlogp [-rho*A/n] = -A*rho/n with n = 6 active tokens.
    A, n = 2.0, 6
    loss, grad = _actor_grad(A)
    expected = [0.0 if r > 1.2 else -A * r / n for r in RHOS] + [0.0]
    assert_close(grad, expected, tol=1e-12)
    # loss = -(1/6) * (0.5*2 + 0.9*2 + 1*2 + 1.1*2 + 1.2*2 + 1.2*2) = -(11.8)/6
    assert loss.item() == pytest.approx(-11.8 / 6, abs=1e-12)


def test_clipping_gradient_negative_advantage():
    # A = -2 < 0: the clipped branch is the minimum where rho < 0.8 -> zero gradient there.
    A, n = -2.0, 6
    loss, grad = _actor_grad(A)
    expected = [0.0 if r < 0.8 else -A * r / n for r in RHOS] + [0.0]
    assert_close(grad, expected, tol=1e-12)
    # loss = -(1/6) * (-2) * (0.8 + 0.9 + 1.0 + 1.1 + 1.3 + 2.0) = 2 * 7.1 / 6
    assert loss.item() == pytest.approx(14.2 / 6, abs=1e-12)


def test_clipped_policy_loss_two_tokens_by_hand_and_clip_argument():
    # rho = [0.5, 1.3], A = [2, 2]:
    #   token 0: min(0.5*2, 0.8*2) = min(1.0, 1.6) = 1.0
    #   token 1: min(1.3*2, 1.2*2) = min(2.6, 2.4) = 2.4   -> loss = -(1.0 + 2.4)/2 = -1.7
    # with clip = 0.5: token 1 unclipped: min(2.6, 1.5*2=3.0) = 2.6 -> loss = -(1.0 + 2.6)/2 = -1.8
    logp_cur = t64([math.log(0.5), math.log(1.3)])
    logp_old = t64([0.0, 0.0])
    adv = t64([2.0, 2.0])
    mask = torch.tensor([True, True])
    assert clipped_policy_loss(logp_cur, logp_old, adv, mask, **CLIP).item() == pytest.approx(-1.7, abs=1e-12)
    assert clipped_policy_loss(logp_cur, logp_old, adv, mask, clip=0.5).item() == pytest.approx(-1.8, abs=1e-12)


def test_clipped_policy_loss_does_not_train_through_old_or_advantages():
    logp_cur = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    logp_old = torch.tensor([[-1.1, -0.9]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]], requires_grad=True)
    clipped_policy_loss(logp_cur, logp_old, adv, torch.ones(1, 2), **CLIP).backward()
    assert logp_cur.grad is not None
    assert logp_old.grad is None and adv.grad is None


def test_clip_fraction_by_hand():
    logp_cur = t64([math.log(r) for r in RHOS])
    logp_old = torch.zeros(6, dtype=F64)
    mask = torch.ones(6, dtype=torch.bool)
    # A > 0: clipped where rho > 1.2 -> rho 1.3, 2.0 -> 2/6
    assert clip_fraction(logp_cur, logp_old, torch.full((6,), 2.0, dtype=F64), mask, **CLIP).item() == pytest.approx(
        2 / 6
    )
    # A < 0: clipped where rho < 0.8 -> rho 0.5 -> 1/6
    assert clip_fraction(logp_cur, logp_old, torch.full((6,), -2.0, dtype=F64), mask, **CLIP).item() == pytest.approx(
        1 / 6
    )
    # A = 0: nothing is clipped
    assert clip_fraction(logp_cur, logp_old, torch.zeros(6, dtype=F64), mask, **CLIP).item() == 0.0


def test_clip_fraction_response_weighted():
    # Row 0: 1 token, clipped (rho = e^1 > 1.2, A > 0) -> 1.0 ; Row 1: 4 tokens, none clipped -> 0
    # Response mean: (1.0 + 0.0) / 2 = 0.5  (a flat token mean would give 1/5)
    logp_cur = t64([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    out = clip_fraction(logp_cur, torch.zeros(2, 4, dtype=F64), torch.ones(2, 4, dtype=F64), mask, **CLIP)
    assert out.item() == 0.5


def test_policy_ratio():
    assert_close(policy_ratio(t64([0.0, math.log(2.0)]), t64([0.0, 0.0])), [1.0, 2.0])
    assert_close(policy_ratio(t64([-3.0]), t64([-1.0])), [math.exp(-2.0)])


# ============================================================ critic loss


def test_value_loss_and_gradient_single_response():
    # V = [1.0, 2.0, -1.0, (pad 5.0)], R = [0.0, 2.5, 1.0, (pad -3.0)], n = 3, coef = 0.5
    # errors = [1.0, -0.5, -2.0] ; loss = 0.5 * (1 + 0.25 + 4) / 3 = 0.875
    # grad = 2 * 0.5 * (V - R) / 3 = [1/3, -1/6, -2/3, 0]
    values = t64([1.0, 2.0, -1.0, 5.0]).requires_grad_(True)
    returns = t64([0.0, 2.5, 1.0, -3.0])
    mask = torch.tensor([1, 1, 1, 0], dtype=torch.bool)
    loss = value_loss(values, returns, mask, **VALUE)
    assert loss.item() == pytest.approx(0.875, abs=1e-12)
    loss.backward()
    assert_close(values.grad, [1 / 3, -1 / 6, -2 / 3, 0.0])
    # General form 2*coef*(V-R)/n on active tokens:
    assert_close(values.grad[:3], (2 * 0.5 * (values - returns) / 3)[:3].detach())


def test_value_loss_has_no_hidden_half_and_no_clipping():
    values = t64([3.0]).requires_grad_(True)
    # coef = 1: loss = (3 - 0)^2 = 9 exactly, gradient 2*1*3 = 6 (no extra 1/2 anywhere,
    # and no value clipping would shrink a large error)
    loss = value_loss(values, t64([0.0]), torch.tensor([True]), coef=1.0)
    assert loss.item() == 9.0
    loss.backward()
    assert values.grad.item() == 6.0


def test_value_loss_gradient_batched_responses():
    # B = 2 ; row 0 n = 2, row 1 n = 1 ; grad = 2*coef*(V-R)/(B*n_b), coef 0.5
    values = t64([[1.0, 1.0], [4.0, 0.0]]).requires_grad_(True)
    returns = t64([[0.0, 3.0], [2.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    value_loss(values, returns, mask, **VALUE).backward()
    # row 0: (V-R) = [1, -2] / (2*2) -> [0.25, -0.5] ; row 1: (4-2)/(2*1) = 1.0 ; pad 0
    assert_close(values.grad, [[0.25, -0.5], [1.0, 0.0]])


# ============================================================ judge loss


def test_bradley_terry_zero_margin_is_ln2_and_gradient_half_over_n():
    chosen = t64([0.0, 1.0, -2.0, 5.0]).requires_grad_(True)
    rejected = t64([0.0, 1.0, -2.0, 5.0]).requires_grad_(True)
    loss = bradley_terry_loss(chosen, rejected)
    assert loss.item() == pytest.approx(math.log(2.0), abs=1e-12)
    loss.backward()
    N = 4
    assert_close(chosen.grad, [-0.5 / N] * N)
    assert_close(rejected.grad, [0.5 / N] * N)


def test_bradley_terry_known_margin():
    # margin ln 3 -> sigmoid = 3/4 -> loss = -ln(3/4) = ln(4/3); grad chosen = -(1 - 3/4) = -1/4
    chosen = t64([math.log(3.0)]).requires_grad_(True)
    rejected = t64([0.0]).requires_grad_(True)
    loss = bradley_terry_loss(chosen, rejected)
    assert loss.item() == pytest.approx(math.log(4.0 / 3.0), abs=1e-12)
    loss.backward()
    assert chosen.grad.item() == pytest.approx(-0.25, abs=1e-12)
    assert rejected.grad.item() == pytest.approx(0.25, abs=1e-12)


def test_bradley_terry_is_stable_at_huge_margins():
    chosen = torch.tensor([-1000.0, 1000.0], requires_grad=True)
    rejected = torch.tensor([0.0, 0.0])
    loss = bradley_terry_loss(chosen, rejected)
    # pair 0: -log sigmoid(-1000) = 1000 ; pair 1: -log sigmoid(1000) = 0 ; mean = 500
    assert loss.item() == pytest.approx(500.0)
    loss.backward()
    assert torch.isfinite(chosen.grad).all()
    assert chosen.grad.tolist() == pytest.approx([-0.5, 0.0])


def test_bradley_terry_rejects_mismatch_and_empty():
    with pytest.raises(ValueError):
        bradley_terry_loss(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError):
        bradley_terry_loss(torch.zeros(0), torch.zeros(0))


# ============================================================ schedules


@pytest.mark.parametrize("total,warm", [(63, 6), (210, 21), (200, 20), (420, 42)])
def test_schedule_first_last_and_warm(total, warm):
    # SFT 63 updates, judge 210, PPO 200 (SPEC §5-§6), embedded SFT 420
    peak = 2e-5
    assert warmup_steps(total, WARMUP_RATIO) == warm
    lrs = [learning_rate(s, total, peak, WARMUP_RATIO, MIN_LR_RATIO) for s in range(total)]
    assert lrs[0] == pytest.approx(peak / warm, rel=1e-12)
    assert lrs[warm - 2] < peak
    assert lrs[warm - 1] == peak  # warm-up ends exactly at peak
    assert lrs[warm] == peak  # the seed: update `warm` still runs at the peak
    assert lrs[warm + 1] < peak
    assert lrs[-1] == pytest.approx(0.1 * peak, rel=1e-12)  # the floor is reached at the last update
    # rising during warm-up, then strictly falling from update `warm` on
    assert all(a < b for a, b in zip(lrs[: warm - 1], lrs[1:warm]))
    assert all(a > b for a, b in zip(lrs[warm:-1], lrs[warm + 1 :]))
    assert min(lrs[warm:]) == lrs[-1]
    # linear: constant steps in the decay phase, (1 - 0.1) * peak / (total - warm - 1) each
    steps = [a - b for a, b in zip(lrs[warm:-1], lrs[warm + 1 :])]
    assert max(steps) - min(steps) < 1e-12 * peak
    assert steps[0] == pytest.approx(0.9 * peak / (total - warm - 1), rel=1e-9)


def test_schedule_by_hand_63():
    # The seed's numbers for SFT: 63 updates, peak 2e-5, warm = max(1, int(6.3)) = 6.
    # step 0 -> 2e-5/6 ; step 5 (warm - 1) -> 2e-5 ; step 6 (warm) -> 2e-5 (the old code gave
    # 1.968e-5 here) ; step 7 -> 2e-5 * (1 - 1/56 * 0.9) ; step 34 -> 2e-5 * (1 - 28/56 * 0.9)
    # = 1.1e-5 ; step 62 (last) -> 2e-5 * (1 - 0.9) = 2e-6.
    peak = 2e-5
    assert learning_rate(0, 63, peak, WARMUP_RATIO, MIN_LR_RATIO) == pytest.approx(3.3333333333e-6, rel=1e-9)
    assert learning_rate(2, 63, peak, WARMUP_RATIO, MIN_LR_RATIO) == pytest.approx(1e-5, rel=1e-12)
    assert learning_rate(5, 63, peak, WARMUP_RATIO, MIN_LR_RATIO) == 2e-5
    assert learning_rate(6, 63, peak, WARMUP_RATIO, MIN_LR_RATIO) == 2e-5
    assert learning_rate(7, 63, peak, WARMUP_RATIO, MIN_LR_RATIO) == pytest.approx(1.9678571428571e-5, rel=1e-11)
    assert learning_rate(34, 63, peak, WARMUP_RATIO, MIN_LR_RATIO) == pytest.approx(1.1e-5, rel=1e-12)
    assert learning_rate(62, 63, peak, WARMUP_RATIO, MIN_LR_RATIO) == pytest.approx(2e-6, rel=1e-12)


def test_schedule_by_hand_judge_and_ppo():
    # Judge 210 updates (warm 21): step 20 and 21 at the peak, step 209 at 10%, step 115 half-way
    # down the decay: (115 - 21) / 188 = 0.5 -> peak * (1 - 0.45) = 0.55 peak.
    assert (
        learning_rate(20, 210, 1.0, WARMUP_RATIO, MIN_LR_RATIO) == 1.0
        and learning_rate(21, 210, 1.0, WARMUP_RATIO, MIN_LR_RATIO) == 1.0
    )
    assert learning_rate(115, 210, 1.0, WARMUP_RATIO, MIN_LR_RATIO) == pytest.approx(0.55, rel=1e-12)
    assert learning_rate(209, 210, 1.0, WARMUP_RATIO, MIN_LR_RATIO) == pytest.approx(0.1, rel=1e-12)
    # PPO actor 200 updates at 5e-6 (warm 20): step 19 and 20 at 5e-6, step 199 at 5e-7.
    assert (
        learning_rate(19, 200, 5e-6, WARMUP_RATIO, MIN_LR_RATIO) == 5e-6
        and learning_rate(20, 200, 5e-6, WARMUP_RATIO, MIN_LR_RATIO) == 5e-6
    )
    assert learning_rate(199, 200, 5e-6, WARMUP_RATIO, MIN_LR_RATIO) == pytest.approx(5e-7, rel=1e-12)


def test_schedule_tiny_totals():
    # total 1: warm = 1, the only update is the end of warm-up -> peak.
    assert learning_rate(0, 1, 3.0, WARMUP_RATIO, MIN_LR_RATIO) == 3.0
    # total 2: warm = 1; update 1 is update `warm` -> still the peak (max(1, 2 - 1 - 1) = 1, 0 / 1 = 0)
    assert [learning_rate(s, 2, 3.0, WARMUP_RATIO, MIN_LR_RATIO) for s in range(2)] == [3.0, 3.0]
    # total 3: warm = 1 -> [peak, peak, peak * (1 - 1/1 * 0.9)]
    lrs = [learning_rate(s, 3, 3.0, WARMUP_RATIO, MIN_LR_RATIO) for s in range(3)]
    assert lrs[:2] == [3.0, 3.0] and lrs[2] == pytest.approx(0.3, rel=1e-12)
    # total 15: warm = max(1, int(1.5)) = 1 -> step 1 at peak, step 14 at 10%
    assert warmup_steps(15, WARMUP_RATIO) == 1
    assert (
        learning_rate(0, 15, 1.0, WARMUP_RATIO, MIN_LR_RATIO) == 1.0
        and learning_rate(1, 15, 1.0, WARMUP_RATIO, MIN_LR_RATIO) == 1.0
    )
    assert learning_rate(14, 15, 1.0, WARMUP_RATIO, MIN_LR_RATIO) == pytest.approx(0.1, rel=1e-12)


def test_schedule_rejects_out_of_range():
    for step, total in [(-1, 10), (10, 10), (0, 0), (11, 10)]:
        with pytest.raises(ValueError):
            learning_rate(step, total, 1.0, WARMUP_RATIO, MIN_LR_RATIO)
    with pytest.raises(ValueError):
        learning_rate(0, 10, 1.0, warmup_ratio=1.0, min_ratio=MIN_LR_RATIO)
    with pytest.raises(ValueError):
        learning_rate(0, 10, 1.0, min_ratio=1.5, warmup_ratio=WARMUP_RATIO)


# ============================================================ no whitening anywhere


def test_no_whitening_constant_advantage_gives_minus_a():
    # logp_cur == logp_old -> rho = 1 -> loss = -mean(A) = -A exactly.
    # Whitening (A - mean)/std would turn a constant vector into 0 and the loss into 0.
    A = 0.5
    logp = t64([[-1.0, -2.0, -3.0], [-0.5, -0.25, -4.0]])
    adv = torch.full((2, 3), A, dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    loss = clipped_policy_loss(logp, logp.clone(), adv, mask, **CLIP)
    assert loss.item() == -A


def test_no_whitening_constant_score_batch_keeps_raw_advantages():
    # 3 responses of 4 tokens, score 1.0 each, logp_old == logp_ref (no kl part), V = 0.
    # rewards = [0, 0, 0, 1] ; delta = rewards ; A_t = 0.95^(3 - t):
    # A = [0.857375, 0.9025, 0.95, 1.0] in every row -> mean ~0.93 (whitened would be 0).
    logp = torch.full((3, 4), -1.0, dtype=F64)
    mask = torch.ones(3, 4, dtype=torch.bool)
    rewards = rollout_rewards(logp, logp.clone(), t64([1.0, 1.0, 1.0]), mask, torch.tensor([False] * 3), **REWARD)
    dones = torch.zeros(3, 4, dtype=torch.bool)
    dones[:, -1] = True
    adv, ret = gae(rewards, torch.zeros(3, 4, dtype=F64), dones, **GAE)
    assert_close(adv, [[0.857375, 0.9025, 0.95, 1.0]] * 3)
    assert_close(ret, adv)
    assert adv.mean().item() == pytest.approx((0.857375 + 0.9025 + 0.95 + 1.0) / 4)
    assert abs(adv.mean().item()) > 0.5


def test_kl_penalty_by_hand_and_zero_on_padding():
    # kl_coef 0.5: active tokens -0.5 * (old - ref); padding exactly +0.0 (not -0.0)
    logp_old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, 9.0, 9.0]])
    logp_ref = torch.tensor([[-1.5, -1.0, -3.0], [-1.5, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    got = log_ratio_penalty(logp_old, logp_ref, mask, 0.5)
    assert got.tolist() == [[-0.25, 0.5, 0.0], [-0.5, 0.0, 0.0]]
    assert not torch.signbit(got[~mask]).any()
    # token_rewards' KL part is this function (the terminal score only adds at the last token)
    r = rollout_rewards(
        logp_old,
        logp_ref,
        torch.zeros(2),
        mask,
        torch.zeros(2, dtype=torch.bool),
        kl_coef=0.5,
        truncation_penalty=REWARD["truncation_penalty"],
    )
    assert torch.equal(r, got)
