"""GRPO's arithmetic (Shao et al. 2024, DeepSeekMath), one small function per equation, as the lab
computes it for its GRPO arm: G answers per prompt paid by the judge, no critic and no GAE.

  advantage   every token of answer i carries its group-standardised reward
              ``A_i = (r_i - mean_g r) / (sd_g r + eps)``, sd the sample SD (Bessel's n - 1) of
              the prompt's G rewards, eps = 1e-4 (TRL's GRPOTrainer: the same SD and eps)
  KL          to the reference, inside the loss (not in the reward, unlike PPO), per token by
              the unbiased non-negative estimator of the published method (Schulman's k3):
              ``k3_t = exp(logp_ref_t - logp_t) - (logp_ref_t - logp_t) - 1``
  loss        ``l_t = -min(rho_t A_i, clamp(rho_t, 1 - clip, 1 + clip) A_i) + beta * k3_t``,
              rho_t = exp(logp_t - logp_old_t); averaged over each answer's active tokens, then
              over answers (the published 1/G sum_i 1/|o_i| sum_t; TRL's loss_type "grpo")

Shapes: N = groups x G answers, T response positions; ``mask`` [N, T] marks active tokens.
TRL's defaults differ from the published method in two places, which the lab does not follow:
its default loss_type "dapo" averages over all tokens of the batch (not per answer first), and
its default beta is 0 (no KL term). The lab follows the paper: per answer first, beta > 0.
"""

from __future__ import annotations

import torch

from rlhf.masks import as_bool_mask, response_mean
from rlhf.ppo_math import clipped_policy_loss

__all__ = ["group_advantages", "k3_kl", "grpo_loss"]

EPS = 1e-4  # in the advantage's denominator (TRL's value): a group of equal rewards gets 0, not nan


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``A_i = (r_i - mean_g r) / (sd_g r + EPS)`` for consecutive groups of `group_size`
    answers (one prompt each): [N] -> [N], N a multiple of group_size >= 2. A group of equal
    rewards gets advantage 0 for each of its answers."""
    if group_size < 2 or rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be [N] with N a multiple of the group size >= 2, not {tuple(rewards.shape)} in groups of "
            f"{group_size}"
        )
    groups = rewards.view(-1, group_size)
    # Centred on the group's first reward before averaging: the same mean, and for a group of equal
    # rewards every deviation is exactly 0 (a plain mean can round one ulp away from them).
    deviations = groups - groups[:, :1]
    centred = deviations - deviations.mean(dim=1, keepdim=True)
    sd = groups.std(dim=1, keepdim=True)  # sample SD (n - 1)
    return (centred / (sd + EPS)).reshape(-1)


def k3_kl(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """``k3_t = exp(logp_ref_t - logp_t) - (logp_ref_t - logp_t) - 1`` per token: >= 0, 0 exactly
    where the two log-probs are equal; its expectation under the policy is KL(pi || pi_ref).
    Gradient through ``logp`` only (the reference is data)."""
    d = logp_ref.detach() - logp
    return torch.exp(d) - d - 1.0


def grpo_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    logp_ref: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float,
    beta: float,
) -> torch.Tensor:
    """GRPO's loss (module docstring): [N, T] log-probs under the policy being trained, the policy
    that sampled and the reference; [N] advantages (every token of an answer carries its
    answer's); [N, T] mask -> scalar. The clipped part is PPO's (rlhf.ppo_math.clipped_policy_loss)
    with the answer's advantage on every token; the KL part its response mean, weighed by beta."""
    m = as_bool_mask(mask)
    per_token = advantages.detach().unsqueeze(-1).expand_as(logp)  # [N, T]
    policy = clipped_policy_loss(logp, logp_old, per_token, m, clip=clip)
    kl = k3_kl(torch.where(m, logp, torch.zeros_like(logp)), torch.where(m, logp_ref, torch.zeros_like(logp_ref)))
    return policy + beta * response_mean(kl, m)
