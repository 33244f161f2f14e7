"""DPO's arithmetic (Rafailov et al. 2023), one small function per equation, as the lab computes it
for its DPO arm: the policy trained directly on the judge's preference pairs, the SFT actor the
frozen reference.

Shapes: P preference pairs; a pair's answers have per-token log-probs [P, T] under the policy and
under the reference, and a response mask [P, T] marking each answer's active tokens (EOS
included). A sequence's log-prob is the sum of its active tokens' log-probs (padding never
counts): the sum, not the mean, as the published loss and TRL's default ("sigmoid") have it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlhf.masks import masked_sum

__all__ = ["sequence_logp", "dpo_margin", "dpo_loss"]


def sequence_logp(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log pi(y | x) = sum_t logp[p, t]`` over the answer's active tokens: [P, T] -> [P].
    A padding position's value (even -inf or nan) reaches neither the sum nor its gradient."""
    return masked_sum(logp, mask, dim=-1)


def dpo_margin(
    chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor
) -> torch.Tensor:
    """``m = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))`` per pair: four [P]
    sequence log-probs -> [P]. The reference's are data (detached)."""
    return (chosen - ref_chosen.detach()) - (rejected - ref_rejected.detach())


def dpo_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    *,
    beta: float,
) -> torch.Tensor:
    """DPO's loss, the mean over the P pairs of

    ``-log sigma(beta * [(log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))])``

    with sequence log-probs (`sequence_logp`). At equal margins (m = 0) it is log 2. Per pair,
    d loss / d log pi(y_w) = -beta * sigma(-beta * m) / P = -d loss / d log pi(y_l).
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, not {beta}")
    return -F.logsigmoid(beta * dpo_margin(chosen, rejected, ref_chosen, ref_rejected)).mean()
