"""Text <-> token ids (rlhf.tokens): chat format, limits (rejected, never truncated), padding
layout of a Batch, and finish reasons of decoded responses.

The tokenizer is the embedded base's (958 tokens; the embedding has 1024 rows, so ids
958..1023 exist in the model but not in the tokenizer, as in Qwen2.5).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlhf import rubric
from rlhf.config import Limits
from rlhf.tokens import (
    IM_END,
    IM_START,
    OverLimitError,
    chat_prompt,
    collate,
    control_token_ids,
    decode_response,
    encode_example,
    encode_prompt,
    encode_response,
    finish_reason_counts,
    token_texts,
)

pytestmark = pytest.mark.unit

LIMITS = Limits(prompt_tokens=256, response_tokens=64, context_tokens=320)  # SPEC §6


@pytest.fixture(scope="module")
def tok(embedded_base):
    return embedded_base.tokenizer, embedded_base.eos_id, embedded_base.pad_id


# ---------------------------------------------------------------------------------- encoding


def test_chat_prompt_is_chatml_with_one_user_turn():
    assert chat_prompt("Hi.") == "<|im_start|>user\nHi.<|im_end|>\n<|im_start|>assistant\n"
    assert IM_START == "<|im_start|>" and IM_END == "<|im_end|>"


def test_encode_example_layout(tok):
    tokenizer, eos_id, _ = tok
    p, r = encode_example(tokenizer, "Check the cable.", "Please check the cable.", eos_id, LIMITS, "OH001-P0")
    assert p == tokenizer(chat_prompt("Check the cable."), add_special_tokens=False)["input_ids"]
    assert p[0] == tokenizer.convert_tokens_to_ids(IM_START)
    assert p[-1] != eos_id and p.count(eos_id) == 1  # the one <|im_end|> closes the user turn
    assert r[-1] == eos_id and r.count(eos_id) == 1
    assert tokenizer.decode(r[:-1]) == "Please check the cable."


def words(n):
    return " ".join(["printer"] * n)


@pytest.mark.parametrize("which", ["prompt", "response", "context"])
def test_over_limit_examples_are_rejected_with_the_document_id(tok, which):
    tokenizer, eos_id, _ = tok
    doc = f"OH123-{which}"
    if which == "prompt":
        args, limits = (words(400), "ok."), LIMITS
        match = rf"{doc}: prompt has \d+ tokens, limit 256"
    elif which == "response":
        args, limits = ("ok.", words(100)), LIMITS
        match = rf"{doc}: response has \d+ tokens with EOS, limit 64"
    else:  # each part fits its own limit, the sum does not
        args, limits = (words(30), words(30)), Limits(prompt_tokens=256, response_tokens=64, context_tokens=50)
        match = rf"{doc}: \d+ tokens, context limit 50"
    with pytest.raises(OverLimitError, match=match):
        encode_example(tokenizer, *args, eos_id, limits, document_id=doc)


def test_limits_are_inclusive_and_never_truncate(tok):
    tokenizer, eos_id, _ = tok
    body = tokenizer(words(200), add_special_tokens=False)["input_ids"]
    assert len(body) >= 64
    # find a text of exactly 63 tokens (+ EOS = 64, the limit) and one of 64 (+ EOS = 65)
    fit = tokenizer.decode(body[:63])
    assert len(tokenizer(fit, add_special_tokens=False)["input_ids"]) == 63
    r = encode_response(tokenizer, fit, eos_id, LIMITS, "OH000-SFT")
    assert len(r) == 64 and r[-1] == eos_id
    over = tokenizer.decode(body[:64])
    with pytest.raises(OverLimitError, match="OH000-SFT: response has 65 tokens with EOS, limit 64"):
        encode_response(tokenizer, over, eos_id, LIMITS, "OH000-SFT")
    # the prompt limit counts the whole ChatML rendering
    p_ids = tokenizer(chat_prompt(words(10)), add_special_tokens=False)["input_ids"]
    exact = dataclasses.replace(LIMITS, prompt_tokens=len(p_ids))
    assert encode_prompt(tokenizer, words(10), exact, "OH000-RL0") == p_ids
    with pytest.raises(OverLimitError, match="OH000-RL0"):
        encode_prompt(tokenizer, words(10), dataclasses.replace(LIMITS, prompt_tokens=len(p_ids) - 1), "OH000-RL0")


# ---------------------------------------------------------------------------------- collate

PROMPTS = [[11, 12, 13], [21]]
RESPONSES = [[14, 15], [22, 23, 24, 25]]
PAD = 0


def test_collate_right_padding():
    b = collate(PROMPTS, RESPONSES, PAD, padding_side="right")
    assert b.input_ids.tolist() == [[11, 12, 13, 14, 15], [21, 22, 23, 24, 25]]
    b = collate([[11, 12, 13], [21]], [[14, 15], [22, 23]], PAD, padding_side="right")
    assert b.input_ids.tolist() == [[11, 12, 13, 14, 15], [21, 22, 23, 0, 0]]
    assert b.attention_mask.tolist() == [[True] * 5, [True, True, True, False, False]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 2, 2]]
    assert b.response_index.tolist() == [[3, 4], [1, 2]]
    assert b.response_mask.tolist() == [[True, True], [True, True]]
    assert b.last_index.tolist() == [4, 2]


def test_collate_left_padding_and_unequal_responses():
    b = collate([[11, 12, 13], [21]], [[14], [22, 23, 24]], PAD, padding_side="left")
    assert b.input_ids.shape == (2, 4) and b.response_index.shape == (2, 3)
    assert b.input_ids.tolist() == [[11, 12, 13, 14], [21, 22, 23, 24]]
    b = collate([[11, 12], [21]], [[14], [22]], PAD, padding_side="left")
    assert b.input_ids.tolist() == [[11, 12, 14], [0, 21, 22]]
    assert b.attention_mask.tolist() == [[True, True, True], [False, True, True]]
    assert b.position_ids.tolist() == [[0, 1, 2], [0, 0, 1]]
    assert b.response_index.tolist() == [[2], [2]]
    b = collate([[11], [21, 22, 23]], [[14, 15, 16], [24]], PAD, padding_side="left")
    assert b.input_ids.tolist() == [[11, 14, 15, 16], [21, 22, 23, 24]]
    b = collate([[11], [21, 22, 23, 26]], [[14, 15, 16], [24]], PAD, padding_side="left")
    assert b.input_ids.tolist() == [[0, 11, 14, 15, 16], [21, 22, 23, 26, 24]]
    assert b.position_ids.tolist() == [[0, 0, 1, 2, 3], [0, 1, 2, 3, 4]]
    assert b.response_index.tolist() == [[2, 3, 4], [4, 4, 4]]
    assert b.response_mask.tolist() == [[True, True, True], [True, False, False]]
    assert b.last_index.tolist() == [4, 4]


@pytest.mark.parametrize("side", ["left", "right"])
def test_collate_invariants(side):
    prompts = [[1, 2, 3, 4], [5], [6, 7]]
    responses = [[8], [9, 10, 11, 12, 13], [14, 15]]
    b = collate(prompts, responses, PAD, padding_side=side)
    assert b.input_ids.dtype == b.position_ids.dtype == b.response_index.dtype == torch.long
    assert b.attention_mask.dtype == b.response_mask.dtype == torch.bool
    assert b.input_ids.shape == b.attention_mask.shape == b.position_ids.shape == (3, 6)
    assert b.response_index.shape == b.response_mask.shape == (3, 5)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        assert b.input_ids[i][b.attention_mask[i]].tolist() == p + r
        assert b.position_ids[i][b.attention_mask[i]].tolist() == list(range(len(p) + len(r)))
        assert b.input_ids[i][~b.attention_mask[i]].eq(PAD).all()
        cols = b.response_index[i][b.response_mask[i]]
        assert b.input_ids[i, cols].tolist() == r
        assert b.attention_mask[i, cols].all() and b.attention_mask[i, cols - 1].all()  # prefix is real
        assert b.response_mask[i].tolist() == [j < len(r) for j in range(5)]
        assert b.input_ids[i, b.last_index[i]] == r[-1]


def test_collate_refusals():
    with pytest.raises(ValueError, match="padding_side"):
        collate(PROMPTS, RESPONSES, PAD, padding_side="middle")
    with pytest.raises(ValueError, match="as many responses as prompts"):
        collate(PROMPTS, RESPONSES[:1], PAD)
    with pytest.raises(ValueError, match="at least one"):
        collate([], [], PAD)
    with pytest.raises(ValueError, match="every response needs at least one token"):
        collate(PROMPTS, [[14], []], PAD)


def test_batch_to_keeps_every_field():
    a = collate(PROMPTS, RESPONSES, PAD)
    b = a.to("cpu")
    for field in ("input_ids", "attention_mask", "position_ids", "response_index", "response_mask"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
        assert getattr(a, field).dtype == getattr(b, field).dtype
    assert b.response_index.tolist() == [[3, 4, 4, 4], [1, 2, 3, 4]]


# ---------------------------------------------------------------------------------- decoding


def test_decode_eos_and_length(tok):
    tokenizer, eos_id, _ = tok
    body = tokenizer("Please check the cable.", add_special_tokens=False)["input_ids"]
    assert decode_response(tokenizer, body + [eos_id], eos_id) == ("Please check the cable.", "eos")
    assert decode_response(tokenizer, body, eos_id) == ("Please check the cable.", "length")
    assert decode_response(tokenizer, [eos_id], eos_id) == ("", "eos")
    assert decode_response(tokenizer, [], eos_id) == ("", "length")


def lone_byte_token(tokenizer) -> int:
    """A real byte-level token of the embedded tokenizer that decodes, alone, to U+FFFD: one byte
    of the multi-byte snowman, which is not UTF-8 by itself."""
    ids = tokenizer("☃", add_special_tokens=False)["input_ids"]
    assert len(ids) > 1 and tokenizer.decode(ids) == "☃"  # the snowman's 3 bytes, more than one token
    return next(i for i in ids if tokenizer.decode([i]) == "\ufffd")


def test_decode_ids_outside_the_tokenizer_are_out_of_vocabulary(tok, embedded_base):
    tokenizer, eos_id, _ = tok
    n = len(tokenizer)
    assert n < embedded_base.model.config.vocab_size  # the embedding has rows no token maps to
    body = tokenizer("Save the document.", add_special_tokens=False)["input_ids"]
    for bad in (n, embedded_base.model.config.vocab_size - 1, -1):
        for ids in (body[:2] + [bad] + body[2:] + [eos_id], body + [bad]):
            assert decode_response(tokenizer, ids, eos_id) == ("Save the document.", "out_of_vocabulary"), (bad, ids)
    assert decode_response(tokenizer, [n - 1, eos_id], eos_id)[1] == "eos"  # the last real id is plain text


@pytest.mark.parametrize("special", ["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
def test_decode_a_control_token_inside_the_body_is_control_token(tok, special):
    tokenizer, eos_id, _ = tok
    sid = tokenizer.convert_tokens_to_ids(special)
    assert tokenizer.convert_ids_to_tokens(sid) == special
    body = tokenizer("Save the document.", add_special_tokens=False)["input_ids"]
    cases = [body[:1] + [sid] + body[1:] + [eos_id], [sid, eos_id]]
    if sid != eos_id:
        cases.append(body + [sid])  # cut at the length limit on a control token
    for ids in cases:
        text, reason = decode_response(tokenizer, ids, eos_id)
        assert reason == "control_token" and special in text, (special, ids, text)


def test_im_start_is_a_control_token_though_not_a_named_special_token(tok):
    """The embedded tokenizer registers <|im_start|> (id 1) as an added special token only:
    all_special_ids does not list it, and the answer holding it is still named control_token."""
    tokenizer, eos_id, _ = tok
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert im_start == 1 and im_start not in tokenizer.all_special_ids
    assert im_start in control_token_ids(tokenizer, eos_id)
    body = tokenizer("Check the cable.", add_special_tokens=False)["input_ids"]
    assert decode_response(tokenizer, body + [im_start, eos_id], eos_id) == (
        "Check the cable.<|im_start|>",
        "control_token",
    )


def test_decode_bytes_that_are_not_utf8_are_broken_text(tok):
    tokenizer, eos_id, _ = tok
    ids = tokenizer("café ☃", add_special_tokens=False)["input_ids"]
    assert decode_response(tokenizer, ids + [eos_id], eos_id) == ("café ☃", "eos")  # whole characters
    lone = lone_byte_token(tokenizer)
    assert tokenizer.convert_ids_to_tokens(lone) not in tokenizer.all_special_tokens  # a real byte-level token
    assert decode_response(tokenizer, [lone, eos_id], eos_id) == ("\ufffd", "broken_text")
    assert decode_response(tokenizer, [lone], eos_id) == ("\ufffd", "broken_text")  # cut at the limit too
    text, reason = decode_response(tokenizer, ids[:-1] + [eos_id], eos_id)  # the snowman's last byte dropped
    assert reason == "broken_text" and text.startswith("café ") and "\ufffd" in text


def test_a_fault_is_named_by_the_first_of_out_of_vocabulary_control_token_broken_text(tok):
    """Precedence (rlhf.rubric.TOKEN_FAULTS): out_of_vocabulary > control_token > broken_text, with
    EOS or without; each pair of faults in either order, crafted from real ids."""
    tokenizer, eos_id, _ = tok
    assert rubric.TOKEN_FAULTS == ("out_of_vocabulary", "control_token", "broken_text")
    oov, control, broken = len(tokenizer), tokenizer.convert_tokens_to_ids("<|im_start|>"), lone_byte_token(tokenizer)
    word = tokenizer("Save", add_special_tokens=False)["input_ids"]
    for faults, name in (
        ([oov, control, broken], "out_of_vocabulary"),
        ([broken, control, oov], "out_of_vocabulary"),
        ([oov, broken], "out_of_vocabulary"),
        ([broken, control], "control_token"),
        ([control, broken], "control_token"),
        ([broken], "broken_text"),
    ):
        for end in ([eos_id], []):
            assert decode_response(tokenizer, word + faults + end, eos_id)[1] == name, (faults, end)


def test_finish_reason_counts_count_every_reason_in_order_and_refuse_an_unknown_name():
    counts = finish_reason_counts(["eos", "broken_text", "eos", "control_token", "length", "eos"])
    assert counts == {"eos": 3, "length": 1, "control_token": 1, "broken_text": 1, "out_of_vocabulary": 0}
    assert tuple(counts) == rubric.FINISH_REASONS
    assert finish_reason_counts([]) == dict.fromkeys(rubric.FINISH_REASONS, 0)
    with pytest.raises(ValueError, match="unknown finish reason 'undecodable'"):
        finish_reason_counts(["eos", "undecodable"])


def test_token_texts_name_ids_outside_the_tokenizer_by_number(embedded_base):
    """The embedded model has more vocabulary rows than its tokenizer has tokens, and a PPO policy
    can learn to sample them: every per-token view (rollouts, the study's changed answer) must
    show such an id, not None (the study page failed on one)."""
    tok = embedded_base.tokenizer
    n = len(tok)
    assert embedded_base.model.config.vocab_size > n, "the test needs rows beyond the tokenizer"
    texts = token_texts(tok, [3, n, embedded_base.model.config.vocab_size - 1])
    assert texts == [tok.convert_ids_to_tokens(3), f"<id {n}>", f"<id {embedded_base.model.config.vocab_size - 1}>"]
    from rlhf.report.study import token_table

    view = {
        "document_id": "OH001-P0",
        "seed": 0,
        "tokens": [{"token": t, "logp_ppo": -1.0, "logp_sft": -2.0, "log_ratio": 1.0} for t in texts],
    }
    assert f"&lt;id␣{n}&gt;" in token_table(view).html()  # the page shows a space as ␣
