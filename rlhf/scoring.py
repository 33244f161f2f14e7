"""The one scoring path: hidden states, token log-probs, per-prefix and last-token reads.

SFT, PPO (logp_old, logp_ref, logp_cur) and evaluation all call `response_logprobs`; the
critic reads `prefix_hidden`, the judge `last_token_hidden`. Positions come from the batch's
`response_index` / `response_mask` (rlhf.tokens.Batch), never from token ids or the last
column of a padded batch.

Alignment: response token j sits at column c = response_index[:, j]; it is produced by the
prefix ending at column c - 1, so its log-prob and the critic's value V_j are read there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlhf.masks import as_bool_mask
from rlhf.tokens import Batch


def backbone_hidden(model, batch: Batch) -> torch.Tensor:
    """[B, T, H] final hidden states (after the final norm) of a causal LM's backbone."""
    out = model.model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask.long(),
        position_ids=batch.position_ids,
        use_cache=False,
    )
    return out.last_hidden_state


def gather_columns(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """hidden [B, T, H], index [B, R] -> [B, R, H]."""
    return hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))


def prefix_hidden(hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
    """[B, R, H] hidden state of the prefix that produces each response token."""
    return gather_columns(hidden, batch.response_index - 1)


def last_token_hidden(hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
    """[B, H] hidden state at the last active response token (EOS included)."""
    return gather_columns(hidden, batch.last_index[:, None])[:, 0]


def logprobs_from_hidden(model, h: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log pi(target | prefix) in FP32 from prefix hidden states h [B, R, H]; 0 where mask is False.

    Only the R needed rows of the vocabulary projection are computed, not all T.
    """
    logits = model.lm_head(h).float()  # [B, R, V]
    logp = F.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]  # [B, R]
    # Selected away, never multiplied by 0 (rlhf.masks): -inf * 0 and nan * 0 are nan.
    return torch.where(as_bool_mask(mask), logp, torch.zeros((), dtype=logp.dtype, device=logp.device))


def response_targets(batch: Batch) -> torch.Tensor:
    """[B, R] the response token ids."""
    return batch.input_ids.gather(1, batch.response_index)


def response_logprobs(model, batch: Batch, hidden: torch.Tensor | None = None) -> torch.Tensor:
    """[B, R] teacher-forced log-prob of every response token under `model` (FP32, masked)."""
    if hidden is None:
        hidden = backbone_hidden(model, batch)
    return logprobs_from_hidden(model, prefix_hidden(hidden, batch), response_targets(batch), batch.response_mask)
