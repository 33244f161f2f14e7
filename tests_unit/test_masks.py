"""Analytic tests of rlhf.masks: last token, masked sums, per-response means."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.masks import active_count, as_bool_mask, last_active_index, masked_sum, response_mean

pytestmark = pytest.mark.unit


# ----------------------------------------------------------------- last_active_index


def test_last_active_index_right_padding_unequal_lengths():
    # SPEC §9.3: pooling at "the last batch index" would read PAD for the shorter rows.
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    idx = last_active_index(mask)
    assert idx.dtype == torch.long
    assert idx.tolist() == [3, 1, 0]


def test_last_active_index_left_padding_and_holes():
    # Left padding: the last active index is T-1, not length-1.
    # A hole in the middle must not stop the search early.
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 0], [1, 0, 1, 0]])
    assert last_active_index(mask).tolist() == [3, 2, 2]
    # "length - 1" would be wrong for each row: lengths are 2, 2, 2 -> index 1.
    assert (last_active_index(mask) != mask.sum(-1) - 1).all()


def test_last_active_index_accepts_int_and_float_masks():
    mask_i = torch.tensor([[1, 1, 0], [0, 1, 1]], dtype=torch.int64)
    mask_f = mask_i.to(torch.float32)
    assert last_active_index(mask_i).tolist() == [1, 2]
    assert last_active_index(mask_f).tolist() == [1, 2]


def test_last_active_index_empty_row_names_row():
    mask = torch.tensor([[1, 0], [0, 0], [0, 1], [0, 0]], dtype=torch.bool)
    with pytest.raises(ValueError, match=r"\[1, 3\]"):
        last_active_index(mask)


def test_last_active_index_rejects_non_2d():
    with pytest.raises(ValueError, match="B, T"):
        last_active_index(torch.tensor([1, 1, 0], dtype=torch.bool))


def test_non_binary_mask_rejected():
    with pytest.raises(ValueError, match="0 and 1"):
        as_bool_mask(torch.tensor([[1.0, 0.5]]))
    with pytest.raises(TypeError):
        as_bool_mask([[1, 0]])


# ----------------------------------------------------------------- masked_sum / counts


def test_masked_sum_by_hand():
    x = torch.tensor([[1.0, 2.0, 4.0], [8.0, 16.0, 32.0]])
    mask = torch.tensor([[1, 0, 1], [0, 1, 1]])
    # row 0: 1 + 4 = 5 ; row 1: 16 + 32 = 48
    assert masked_sum(x, mask).tolist() == [5.0, 48.0]
    # along dim 0: col 0: 1 ; col 1: 16 ; col 2: 4 + 32 = 36
    assert masked_sum(x, mask, dim=0).tolist() == [1.0, 16.0, 36.0]
    assert active_count(mask).tolist() == [2, 2]


def test_masked_sum_ignores_inf_and_nan_in_padding_forward_and_backward():
    x = torch.tensor([[1.0, -math.inf, math.nan, 2.0]], requires_grad=True)
    mask = torch.tensor([[1, 0, 0, 1]], dtype=torch.bool)
    s = masked_sum(x, mask)
    assert s.item() == 3.0
    s.sum().backward()
    assert x.grad.tolist() == [[1.0, 0.0, 0.0, 1.0]]


# ----------------------------------------------------------------- response_mean


def test_response_mean_by_hand_long_answers_get_no_extra_weight():
    # Row 0: 4 active tokens of value 1 -> mean 1. Row 1: 1 active token of value 3 -> mean 3.
    # Response mean: (1 + 3) / 2 = 2. A flat token mean would give (4*1 + 3) / 5 = 1.4.
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [3.0, 99.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    out = response_mean(x, mask)
    assert out.dim() == 0
    assert out.item() == pytest.approx(2.0, abs=1e-7)
    flat = (x * mask).sum() / mask.sum()
    assert flat.item() == pytest.approx(1.4)  # the wrong reduction really differs


def test_response_mean_gradient_is_one_over_B_times_n():
    x = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 0]])
    response_mean(x, mask).backward()
    # B = 2: row 0 has n = 4 -> 1/8 per active token; row 1 has n = 2 -> 1/4.
    assert x.grad.tolist() == [[0.125, 0.125, 0.125, 0.125], [0.0, 0.25, 0.25, 0.0]]
    assert x.grad.sum(dim=-1).tolist() == [0.5, 0.5]


def test_response_mean_accepts_single_response():
    x = torch.tensor([2.0, 4.0, 100.0])
    mask = torch.tensor([True, True, False])
    assert response_mean(x, mask).item() == 3.0


def test_response_mean_empty_row_names_row():
    with pytest.raises(ValueError, match=r"\[0\]"):
        response_mean(torch.ones(2, 2), torch.tensor([[0, 0], [1, 0]]))


def test_response_mean_shape_mismatch_rejected():
    with pytest.raises(ValueError, match="B, T"):
        response_mean(torch.ones(2, 3), torch.ones(2, 2))


def test_response_mean_nan_padding_does_not_leak():
    x = torch.tensor([[1.0, math.nan], [math.inf, 5.0]], requires_grad=True)
    mask = torch.tensor([[1, 0], [0, 1]], dtype=torch.bool)
    out = response_mean(x, mask)
    assert out.item() == 3.0
    out.backward()
    assert x.grad.tolist() == [[0.5, 0.0], [0.0, 0.5]]
