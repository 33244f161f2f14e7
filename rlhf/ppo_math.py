"""The PPO arithmetic of SPEC §5–§6, one small function per equation.

Read top to bottom: rewards -> advantages -> losses -> the judge's loss -> the schedule.
What the last token is paid (the judge's score, or a declared design's) is rlhf.designs.

Shapes: B responses, T response positions (prompt excluded). ``mask`` [B, T] marks the
active response tokens (including the EOS token, if any); everything else is padding.
All per-token tensors share the mask's [B, T] shape.

What is *not* here, on purpose (SPEC §6): no reward or advantage whitening/normalisation,
no value clipping, no entropy bonus, no second implicit 1/2 in the critic loss.

Naming: ``logp_old - logp_ref`` on the *sampled* token is called the sampled log-ratio. It is
one Monte-Carlo sample whose expectation under the old policy is KL(old || ref); a single
value can be negative and is not the full-vocabulary KL, so nothing here is called ``kl``
except the coefficient ``kl_coef`` that weighs it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlhf.masks import as_bool_mask, last_active_index, masked_sum, response_mean

__all__ = [
    "sampled_log_ratio",
    "mean_sampled_log_ratio",
    "log_ratio_penalty",
    "token_rewards",
    "gae",
    "policy_ratio",
    "clipped_policy_loss",
    "clip_fraction",
    "update_shift",
    "value_loss",
    "bradley_terry_loss",
    "warmup_steps",
    "learning_rate",
]


def _check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"shapes must match: {shapes}")


def _active(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # Selecting (not multiplying) keeps a -inf/nan padding log-prob from turning into nan in
    # exp() or in its gradient: the padding never enters the arithmetic at all.
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


# --------------------------------------------------------------------------- rewards


def sampled_log_ratio(logp_old: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token sampled-token log-ratio ``logp_old_t - logp_ref_t`` on active tokens, 0 elsewhere.

    Shapes: logp_old, logp_ref, mask [B, T] -> [B, T].

    This is the log-ratio of the one token that was actually sampled. It can be negative
    (the reference may like that token more than the actor does). It is NOT the
    full-vocabulary KL divergence; only its expectation over sampled tokens is.
    """
    m = as_bool_mask(mask)
    _check_same_shape(logp_old=logp_old, logp_ref=logp_ref, mask=m)
    return _active(logp_old - logp_ref, m)


def mean_sampled_log_ratio(logp_old: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-response mean of the sampled-token log-ratio over its active tokens.

    ``out[b] = (1/n_b) * sum_t mask[b,t] * (logp_old[b,t] - logp_ref[b,t])``

    Shapes: [B, T] -> [B]. For logging. Can be negative; NOT the full-vocabulary KL.
    """
    m = as_bool_mask(mask)
    counts = m.sum(dim=-1)
    if bool((counts == 0).any()):
        raise ValueError(f"mask row(s) {(counts == 0).nonzero().flatten().tolist()} have no active token")
    ratio = sampled_log_ratio(logp_old, logp_ref, m)
    return masked_sum(ratio, m, dim=-1) / counts.to(ratio.dtype)


def log_ratio_penalty(
    logp_old: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> torch.Tensor:
    """The per-token penalty part of the reward: ``-kl_coef * (logp_old_t - logp_ref_t)`` on
    active tokens, 0 (not -0.0) elsewhere. Shapes: [B, T] -> [B, T].

    The sampled-token log-ratio is not the full-vocabulary KL, so the name says what it is. The
    one place the penalty is computed: once per rollout (rlhf.ppo.rollout), whose tensor the
    rewards (token_rewards), the per-token view of the report and the history's mean penalty read."""
    m = as_bool_mask(mask)
    return _active(-kl_coef * sampled_log_ratio(logp_old, logp_ref, m), m)


def token_rewards(
    penalty: torch.Tensor,
    score: torch.Tensor,
    mask: torch.Tensor,
    truncated: torch.Tensor,
    *,
    truncation_penalty: float,
) -> torch.Tensor:
    """Per-token PPO rewards (SPEC §6), from the per-token penalty (log_ratio_penalty).

    ``r[b,t] = penalty[b,t] = -kl_coef * (logp_old[b,t] - logp_ref[b,t])``   every active t
    ``r[b,L_b] += score[b] + truncation_penalty * truncated[b]``              once, L_b = last active t
    ``r[b,t] = 0``                                                            inactive t

    Shapes: penalty, mask [B, T]; score [B]; truncated [B] bool -> rewards [B, T] (a new tensor:
    the penalty the rollout keeps is not changed).

    The judge scores the whole response, so its score is paid exactly once, at the token
    that ended the episode (EOS, or the 64th token of a truncated answer), found with
    ``last_active_index`` so that left or right padding cannot move it onto PAD.
    Rewards are data, not a graph: inputs are detached and the result carries no grad.
    """
    m = as_bool_mask(mask)
    _check_same_shape(penalty=penalty, mask=m)
    if m.dim() != 2:
        raise ValueError(f"token_rewards expects [B, T] tensors, got {tuple(m.shape)}")
    batch = m.shape[0]
    if tuple(score.shape) != (batch,) or tuple(truncated.shape) != (batch,):
        raise ValueError(
            f"score and truncated must be [B]={batch}, got {tuple(score.shape)} and {tuple(truncated.shape)}"
        )
    with torch.no_grad():
        rewards = _active(penalty.detach(), m)  # torch.where: a new tensor
        last = last_active_index(m)
        terminal = score.detach().to(rewards.dtype) + truncation_penalty * as_bool_mask(truncated).to(rewards.dtype)
        rewards[torch.arange(batch, device=m.device), last] += terminal
    return rewards


# --------------------------------------------------------------------------- advantages


def gae(
    rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, *, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation, backwards over tokens (SPEC §6).

    ``delta_t = r_t + gamma * (1 - done_t) * V_{t+1} - V_t``
    ``A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}``
    ``V_T = A_T = 0`` beyond the last column;  ``returns = A + V``.

    Shapes: rewards, values, dones [T] or [B, T] (dones bool or 0/1, True at the terminal
    token: EOS or truncation) -> (advantages, returns), same shape, float32 or wider.

    The terminal ends the episode: nothing is bootstrapped past it, neither the next value
    nor the next advantage (SPEC §9.4).

    Positions after a row's first ``done`` are padding: their advantage is set to exactly 0
    (so ``returns = V`` there) and, because the terminal cuts the recursion, nothing written
    there (rewards, values, even nan/inf values) can reach an earlier position. A row with no
    ``done`` at all is treated as ending after its last column (V_T = 0). Positions *before*
    a left-padded response get advantages that mean nothing but can never influence the
    response itself (the recursion only flows backwards); the losses mask them away.

    Computed under no_grad on detached inputs; the outputs carry no gradient.
    """
    _check_same_shape(rewards=rewards, values=values, dones=dones)
    if rewards.dim() not in (1, 2):
        raise ValueError(f"gae expects [T] or [B, T] tensors, got {tuple(rewards.shape)}")
    single = rewards.dim() == 1
    with torch.no_grad():
        dtype = torch.promote_types(rewards.dtype, torch.float32)
        r = rewards.detach().to(dtype)
        v = values.detach().to(dtype)
        d = as_bool_mask(dones)
        if single:
            r, v, d = r.unsqueeze(0), v.unsqueeze(0), d.unsqueeze(0)
        # after[b, t]: some terminal strictly before t, i.e. t is padding past the episode.
        after = (d.long().cumsum(dim=-1) - d.long()) > 0
        zero = torch.zeros(r.shape[0], dtype=dtype, device=r.device)
        advantages = torch.zeros_like(r)
        next_value, next_adv = zero, zero  # V_T = A_T = 0 beyond the last column
        for t in reversed(range(r.shape[-1])):
            # where(), not (1 - done) * x: a nan/inf value in the padding must not leak in.
            boot_value = torch.where(d[:, t], zero, next_value)
            boot_adv = torch.where(d[:, t], zero, next_adv)
            delta = r[:, t] + gamma * boot_value - v[:, t]
            adv_t = torch.where(after[:, t], zero, delta + gamma * lam * boot_adv)
            advantages[:, t] = adv_t
            next_value, next_adv = v[:, t], adv_t
        returns = advantages + v
        if single:
            advantages, returns = advantages.squeeze(0), returns.squeeze(0)
    return advantages, returns


# --------------------------------------------------------------------------- losses


def policy_ratio(logp_cur: torch.Tensor, logp_old: torch.Tensor) -> torch.Tensor:
    """Importance ratio ``rho = exp(logp_cur - logp_old)`` per token; any matching shapes."""
    return torch.exp(logp_cur - logp_old)


def clipped_policy_loss(
    logp_cur: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *, clip: float
) -> torch.Tensor:
    """PPO clipped actor loss.

    ``l_t  = -min(rho_t * A_t, clamp(rho_t, 1 - clip, 1 + clip) * A_t)``
    ``loss = response_mean(l, mask)``   (mean over a response's active tokens, then over B)

    Shapes: logp_cur, logp_old, advantages, mask [B, T] (or [T]) -> scalar.

    Gradient flows through ``logp_cur`` only: the old log-probs and the advantages are
    rollout data and are detached here so a caller cannot accidentally train through them.
    Per active token the gradient wrt logp_cur is ``-A * rho / (B * n_b)`` unless the clipped
    branch is the minimum (A > 0 and rho > 1 + clip, or A < 0 and rho < 1 - clip): then 0.
    Advantages are used as given: no whitening.
    """
    m = as_bool_mask(mask)
    _check_same_shape(logp_cur=logp_cur, logp_old=logp_old, advantages=advantages, mask=m)
    logp_cur = _active(logp_cur, m)
    logp_old = _active(logp_old.detach(), m)
    adv = _active(advantages.detach(), m)
    rho = policy_ratio(logp_cur, logp_old)
    unclipped = rho * adv
    clipped = torch.clamp(rho, 1.0 - clip, 1.0 + clip) * adv
    return response_mean(-torch.min(unclipped, clipped), m)


def clip_fraction(
    logp_cur: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *, clip: float
) -> torch.Tensor:
    """Share of active tokens whose clipped branch is the active one (for logging).

    ``c_t = [A_t > 0 and rho_t > 1 + clip] or [A_t < 0 and rho_t < 1 - clip]``
    ``out = response_mean(c, mask)``  -- these are exactly the tokens with zero actor gradient.

    Shapes: [B, T] (or [T]) -> scalar in [0, 1], no grad.
    """
    m = as_bool_mask(mask)
    _check_same_shape(logp_cur=logp_cur, logp_old=logp_old, advantages=advantages, mask=m)
    with torch.no_grad():
        rho = policy_ratio(_active(logp_cur.detach(), m), _active(logp_old.detach(), m))
        adv = _active(advantages.detach(), m)
        clipped = ((adv > 0) & (rho > 1.0 + clip)) | ((adv < 0) & (rho < 1.0 - clip))
        return response_mean(clipped.to(rho.dtype), m)


def update_shift(logp_cur: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """How far an update moved the policy from the one that sampled (for logging), the
    non-negative estimator of KL(old || current) on the sampled tokens (Schulman's k3):

    ``rho_t = exp(logp_cur_t - logp_old_t)``,  ``k_t = (rho_t - 1) - log rho_t >= 0``
    ``out = response_mean(k, mask)``

    Shapes: [B, T] -> scalar, no grad.
    """
    m = as_bool_mask(mask)
    _check_same_shape(logp_cur=logp_cur, logp_old=logp_old, mask=m)
    with torch.no_grad():
        log_rho = _active(logp_cur.detach(), m) - _active(logp_old.detach(), m)
        return response_mean(torch.expm1(log_rho) - log_rho, m)


def value_loss(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *, coef: float) -> torch.Tensor:
    """Critic loss ``response_mean(coef * (V_t - R_t)^2, mask)``.

    Shapes: values, returns, mask [B, T] (or [T]) -> scalar.

    ``coef`` = 0.5 is the only 1/2 (SPEC §6): d loss / d V_t = 2 * coef * (V_t - R_t) / (B * n_b).
    No value clipping. Returns are targets (detached here).
    """
    m = as_bool_mask(mask)
    _check_same_shape(values=values, returns=returns, mask=m)
    error = _active(values, m) - _active(returns.detach(), m)
    return response_mean(coef * error.pow(2), m)


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Judge (reward model) loss over N preference pairs (SPEC §5).

    ``loss = -(1/N) * sum_i log sigmoid(chosen_i - rejected_i)``

    Shapes: chosen, rejected [N] -> scalar. ``F.logsigmoid`` keeps a large negative margin
    finite (log(sigmoid(-1000)) would be log(0) = -inf if computed naively).
    d loss / d chosen_i = -(1 - sigmoid(chosen_i - rejected_i)) / N = -d loss / d rejected_i.
    """
    _check_same_shape(chosen=chosen, rejected=rejected)
    if chosen.numel() == 0:
        raise ValueError("bradley_terry_loss needs at least one pair")
    return -F.logsigmoid(chosen - rejected).mean()


# --------------------------------------------------------------------------- schedule


def warmup_steps(total: int, warmup_ratio: float) -> int:
    """Number of warm-up updates: ``warm = max(1, int(warmup_ratio * total))`` (SPEC §5)."""
    return max(1, int(warmup_ratio * total))


def learning_rate(step: int, total: int, peak: float, warmup_ratio: float, min_ratio: float) -> float:
    """Learning rate of update ``step`` (0-based) out of ``total`` (SPEC §5, §6): the seed's formula.

    ``warm = max(1, int(warmup_ratio * total))``
    step <  warm : ``peak * (step + 1) / warm``          (step 0 gets peak/warm, step warm-1 peak)
    step >= warm : ``peak * (1 - min(1, (step - warm) / max(1, total - warm - 1)) * (1 - min_ratio))``

    So update ``warm`` still runs at the peak, and the decay reaches ``min_ratio * peak`` at update
    ``total - 1``. Tiny totals follow the same formula: total 1 -> [peak]; total 2 (warm 1) ->
    [peak, peak] (update 1 is update ``warm``); total 3 -> [peak, peak, min_ratio * peak].
    ValueError for step outside [0, total), total < 1, warmup_ratio outside [0, 1) or min_ratio
    outside [0, 1].
    """
    if total < 1:
        raise ValueError(f"total must be >= 1, got {total}")
    if not 0 <= step < total:
        raise ValueError(f"step {step} outside [0, {total})")
    if not 0.0 <= warmup_ratio < 1.0:
        raise ValueError(f"warmup_ratio must be in [0, 1), got {warmup_ratio}")
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")
    warm = warmup_steps(total, warmup_ratio)
    if step < warm:
        return peak * (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, total - warm - 1))
    return peak * (1 - progress * (1 - min_ratio))
