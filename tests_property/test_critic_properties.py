"""Critic values (SPEC §4): V_j is read on the prefix that produces response token j.

Properties on the embedded critic with moved adapters and a random head (the SPEC's zero-init
head would make every value 0 and every property vacuous):
  * batched values equal one-sequence values, left and right padding (BATCH_ATOL);
  * V_j depends only on the prompt and response tokens < j: changing tokens at positions >= k
    leaves V_0..V_k unchanged (PREFIX_ATOL) and changes V_{k+1};
  * V_0 depends only on the prompt; masked positions are exactly 0.

Tolerances (FP32): BATCH_ATOL = 1e-5 (padding adds masked keys only: reordering-level
differences); PREFIX_ATOL = 1e-6 (same shapes, same row ops; only later, causally masked
tokens differ). Measured maxima are recorded in results.json.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from property_budget import examples

from rlhf.roles import critic_values, new_role
from rlhf.tokens import collate

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]

BATCH_ATOL = 1e-5
PREFIX_ATOL = 1e-6
CHANGE_MIN = 1e-4


@pytest.fixture(scope="module")
def critic(embedded_profile, embedded_dir, embedded_base, move_adapters):
    role = new_role("critic", embedded_profile, embedded_dir)
    g = move_adapters(role.model, 11)
    with torch.no_grad():
        role.head.weight.copy_(torch.randn(role.head.weight.shape, generator=g) * 0.02)
        role.head.bias.fill_(-0.1)
    return role, embedded_base.eos_id, embedded_base.pad_id, len(embedded_base.tokenizer)


def random_ids(n, n_vocab, seed):
    return torch.randint(0, n_vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def values_alone(role, prompt, response, pad_id):
    with torch.no_grad():
        return critic_values(role, collate([prompt], [response], pad_id))[0]


ROWS = st.lists(st.tuples(st.integers(1, 12), st.integers(1, 8), st.integers(0, 10**6)), min_size=2, max_size=4)


def test_batched_values_equal_single_values(critic, record_result):
    role, eos_id, pad_id, n_vocab = critic
    worst = {"left": 0.0, "right": 0.0}

    @examples(50)
    @given(rows=ROWS)
    def check(rows):
        prompts = [random_ids(p, n_vocab, s) for p, _, s in rows]
        responses = [random_ids(r, n_vocab, s + 1) for _, r, s in rows]
        alone = [values_alone(role, p, r, pad_id) for p, r in zip(prompts, responses)]
        for side in ("left", "right"):
            batch = collate(prompts, responses, pad_id, padding_side=side)
            with torch.no_grad():
                values = critic_values(role, batch)
            assert values.shape == batch.response_mask.shape and values.dtype == torch.float32
            for b, v in enumerate(alone):
                n = len(responses[b])
                diff = float((values[b, :n] - v).abs().max())
                worst[side] = max(worst[side], diff)
                assert diff <= BATCH_ATOL, (side, b, diff)
                assert torch.all(values[b, n:] == 0)  # masked: exactly zero

    check()
    record_result("max_abs_diff_values_batched_vs_single_left", worst["left"])
    record_result("max_abs_diff_values_batched_vs_single_right", worst["right"])
    record_result("values_batched_vs_single_atol", BATCH_ATOL)


def test_value_depends_only_on_the_prefix_before_its_token(critic, record_result):
    role, eos_id, pad_id, n_vocab = critic
    worst = [0.0]

    @examples(50)
    @given(p_len=st.integers(1, 10), r_len=st.integers(2, 8), k=st.integers(0, 7), seed=st.integers(0, 10**6))
    def check(p_len, r_len, k, seed):
        k = k % r_len
        prompt = random_ids(p_len, n_vocab, seed)
        response = random_ids(r_len, n_vocab, seed + 1)
        changed = response[:k] + [(t + 1 + i) % n_vocab for i, t in enumerate(response[k:])]
        # batched with a row of another length, so padding is present on the side under test
        other_p, other_r = random_ids(3, n_vocab, seed + 2), random_ids(r_len + 2, n_vocab, seed + 3)
        for side in ("left", "right"):  # both sides, every example (a finite domain: looped)
            with torch.no_grad():
                a = critic_values(role, collate([prompt, other_p], [response, other_r], pad_id, side))[0]
                b = critic_values(role, collate([prompt, other_p], [changed, other_r], pad_id, side))[0]
            diff = float((a[: k + 1] - b[: k + 1]).abs().max())
            worst[0] = max(worst[0], diff)
            assert diff <= PREFIX_ATOL, (side, k, diff)  # V_0..V_k: prefixes unchanged
            if k + 1 < r_len:
                assert float((a[k + 1] - b[k + 1]).abs()) > CHANGE_MIN, side  # V_{k+1} sees token k

    check()
    record_result("max_abs_diff_values_unchanged_prefix", worst[0])
    record_result("values_unchanged_prefix_atol", PREFIX_ATOL)


def test_v0_depends_only_on_the_prompt(critic):
    role, eos_id, pad_id, n_vocab = critic
    prompt = random_ids(9, n_vocab, 1)
    v_a = values_alone(role, prompt, [300, 301, eos_id], pad_id)
    v_b = values_alone(role, prompt, [12, eos_id], pad_id)
    v_c = values_alone(role, prompt, random_ids(6, n_vocab, 5), pad_id)
    assert float((v_a[0] - v_b[0]).abs()) <= PREFIX_ATOL
    assert float((v_a[0] - v_c[0]).abs()) <= PREFIX_ATOL
    # V_0 is the value of the prompt's last position: it moves when the prompt changes
    v_d = values_alone(role, prompt[:-1] + [(prompt[-1] + 1) % n_vocab], [300, 301, eos_id], pad_id)
    assert float((v_a[0] - v_d[0]).abs()) > CHANGE_MIN
    # and V_1 is read at the first response token's column (it sees response token 0)
    assert float((v_a[1] - v_b[1]).abs()) > CHANGE_MIN


def test_values_match_a_head_on_the_previous_column(critic):
    """Explicit alignment: V_j = head(hidden[c_j - 1]) where c_j is token j's column."""
    role, eos_id, pad_id, n_vocab = critic
    prompt, response = random_ids(5, n_vocab, 3), random_ids(4, n_vocab, 4)
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        hidden = role.model.model(input_ids=ids).last_hidden_state[0]
        want = role.head(hidden[len(prompt) - 1 : len(prompt) - 1 + len(response)])[:, 0]
        got = values_alone(role, prompt, response, pad_id)
    assert torch.allclose(got, want, atol=BATCH_ATOL, rtol=0)


def test_zero_init_critic_values_are_zero(embedded_profile, embedded_dir, embedded_base):
    fresh = new_role("critic", embedded_profile, embedded_dir)
    batch = collate([[5, 6, 7], [5]], [[8, embedded_base.eos_id], [9]], embedded_base.pad_id)
    with torch.no_grad():
        assert torch.equal(critic_values(fresh, batch), torch.zeros(2, 2))


def test_masked_values_are_selected_away(critic):
    """critic_values never multiplies by the mask: a non-finite read at a masked slot stays out.

    collate points masked slots at a real column; a Batch built elsewhere may point them at PAD.
    """
    from rlhf.tokens import Batch

    role, eos_id, pad_id, _ = critic
    b = collate([[5, 6, 7], [5]], [[8, 9, eos_id], [9]], pad_id, padding_side="right")
    index = b.response_index.clone()
    index[1, 1:] = 5  # masked slots of row 1 point at PAD columns 5 (prefix 4)
    batch = Batch(b.input_ids, b.attention_mask, b.position_ids, index, b.response_mask)
    with torch.no_grad():
        hidden = role.model.model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask.long(), position_ids=batch.position_ids
        ).last_hidden_state.clone()
        hidden[1, 4] = float("nan")
        values = critic_values(role, batch, hidden=hidden)
        want = critic_values(role, b)
    assert torch.isfinite(values).all()
    assert torch.equal(values, want)
    assert torch.all(values[1, 1:] == 0) and not torch.signbit(values[1, 1:]).any()
