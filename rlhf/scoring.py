"""The one scoring path: hidden states, token log-probs, per-prefix and last-token reads.

SFT, PPO (logp_old, logp_ref, logp_cur) and evaluation all call `response_logprobs`; the
critic reads `prefix_hidden`, the judge `last_token_hidden`. Positions come from the batch's
`response_index` / `response_mask` (rlhf.tokens.Batch), never from token ids or the last
column of a padded batch.

Only real tokens: a model's vocabulary projection has one row per embedding row, and the
embedding is padded past the tokenizer's last id (the embedded base: 1,024 rows for 958
tokens; Qwen2.5-0.5B: 151,936 rows for 151,665 tokens). No text maps to those rows, so
nothing may sample, pick or score them: `real_token_logits` sets their logits to -inf before
every softmax, here and in rlhf.generate, and log-probs sum to one over the real tokens. The
count comes with the model (`token_count`, set by rlhf.models when the base is loaded, from
the tokenizer) and is part of every run's identity (`vocabulary`).

Alignment: response token j sits at column c = response_index[:, j]; it is produced by the
prefix ending at column c - 1, so its log-prob and the critic's value V_j are read there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlhf.masks import as_bool_mask
from rlhf.tokens import Batch

TOKEN_COUNT = "rlhf_token_count"  # the attribute a loaded model carries: its tokenizer's size


def set_token_count(model, n_tokens: int) -> None:
    """Record on `model` how many of its vocabulary rows are real tokens (len(tokenizer))."""
    rows = model.get_output_embeddings().weight.shape[0]
    if not 0 < n_tokens <= rows:
        raise ValueError(f"the tokenizer has {n_tokens} tokens, the model {rows} vocabulary rows")
    setattr(model, TOKEN_COUNT, int(n_tokens))


def token_count(model) -> int:
    """The number of real tokens of `model`'s vocabulary (ids 0 .. n - 1); refused when unknown."""
    n = getattr(model, TOKEN_COUNT, None)
    if n is None:
        raise ValueError(
            "the model does not say how many of its vocabulary rows are real tokens: load it with "
            "rlhf.models.load_base (or call rlhf.scoring.set_token_count(model, len(tokenizer)))"
        )
    return n


def real_token_logits(logits: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """logits [..., V] with every id >= n_tokens at -inf, the real ids' logits untouched:

        logit'(v) = logit(v)  for v <  n_tokens
                  = -inf      for v >= n_tokens   (embedding rows past the tokenizer's last id)

    so that softmax, sampling and argmax see only real tokens."""
    if n_tokens >= logits.shape[-1]:
        return logits
    padding = torch.arange(logits.shape[-1], device=logits.device) >= n_tokens  # [V]
    return logits.masked_fill(padding, float("-inf"))


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

    Only the R needed rows of the vocabulary projection are computed, not all T; the softmax runs
    over the real tokens only (real_token_logits).
    """
    logits = real_token_logits(model.lm_head(h).float(), token_count(model))  # [B, R, V]
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
