"""The project's one masking helper: every "which tokens count" question is answered here.

A *mask* is a [B, T] tensor (bool, or integers/floats that are exactly 0 or 1) marking the
active response tokens of B sequences. Nothing here assumes the active tokens are contiguous
or sit on the left: right padding, left padding and holes all give the same answers, because
positions are read from the mask itself and never from lengths.

Inactive positions are *selected away* with ``torch.where``, never multiplied by 0: ``nan * 0``
is ``nan`` and ``inf * 0`` is ``nan``, so a multiplied mask would let a padding log-prob of
``-inf`` poison a loss (forward or backward). With ``where`` the forward value ignores them
and their gradient is exactly 0.
"""

from __future__ import annotations

import torch

__all__ = ["as_bool_mask", "last_active_index", "masked_sum", "active_count", "response_mean"]


def as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    """Return ``mask`` as a bool tensor; a non-bool mask must hold only 0s and 1s.

    A float mask of 0.5 is almost always a bug (a probability passed where a mask belongs),
    so it is refused instead of being silently read as True.
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("a non-bool mask must contain only 0 and 1")
    return mask != 0


def last_active_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last active (True/1) position of each row.

    ``out[b] = max{ t : mask[b, t] }``

    Shapes: mask [B, T] -> LongTensor [B].

    Works whatever the padding side: the answer is the largest active position, not
    ``length - 1`` (which reads PAD for left-padded rows, SPEC §9.3). A row with no active
    token has no last token: ValueError naming the row(s).
    """
    m = as_bool_mask(mask)
    if m.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(m.shape)}")
    empty = (~m.any(dim=-1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"mask row(s) {empty} have no active token: no last active index")
    positions = torch.arange(m.shape[-1], device=m.device).expand_as(m)
    # -1 at inactive positions so that max() picks the largest *active* position.
    return torch.where(m, positions, torch.full_like(positions, -1)).max(dim=-1).values


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum of ``x`` over active positions only.

    ``out = sum_t x[..., t] * [mask[..., t]]`` along ``dim`` (inactive entries selected away,
    so nan/inf there neither reach the value nor the gradient).

    Shapes: x and mask broadcastable to each other (typically both [B, T]) -> x with ``dim``
    removed (typically [B]).
    """
    m = as_bool_mask(mask)
    return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=dim)


def active_count(mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Number of active positions along ``dim``: [B, T] -> LongTensor [B]."""
    return as_bool_mask(mask).sum(dim=dim)


def response_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each response's active tokens, then mean over responses.

    ``out = (1/B) * sum_b ( sum_t mask[b,t] * x[b,t] ) / n_b``,  ``n_b = sum_t mask[b,t]``

    Shapes: x, mask [B, T] -> scalar; a [T] pair is one response (B = 1).

    Every response carries total weight 1/B whatever its length: a 60-token answer does not
    outvote a 5-token one (SPEC §6). Each active token of response b has weight 1/(B * n_b),
    so d out / d x[b, t] = 1/(B * n_b) on active tokens and exactly 0 elsewhere.
    A response with no active token has no mean: ValueError naming the row(s).
    """
    m = as_bool_mask(mask)
    if x.dim() == 1 and m.dim() == 1:
        x, m = x.unsqueeze(0), m.unsqueeze(0)
    if x.dim() != 2 or x.shape != m.shape:
        raise ValueError(f"x and mask must both be [B, T] (or both [T]); got {tuple(x.shape)} and {tuple(m.shape)}")
    counts = m.sum(dim=-1)
    empty = (counts == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"mask row(s) {empty} have no active token: response mean undefined")
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())  # a mean of integers is not an integer
    per_response = masked_sum(x, m, dim=-1) / counts.to(x.dtype)
    return per_response.mean()
