"""Text <-> token ids: the chat format, the token limits, padding and decoding.

Layout used everywhere (SFT, judge, PPO, evaluation): a sequence is `prompt_ids + response_ids`,
the prompt rendered in ChatML (the format Qwen2.5-Instruct was tuned on) and the response
ending with EOS when it ended by itself. A `Batch` holds sequences padded on one side plus

    input_ids      [B, T]  long
    attention_mask [B, T]  bool   real tokens (prompt and response)
    position_ids   [B, T]  long   0.. along real tokens, so left and right padding agree
    response_index [B, R]  long   column of the j-th response token in the row
    response_mask  [B, R]  bool   j < response length of the row

Response-aligned tensors (`logp_old`, `logp_ref`, values, rewards, advantages) are [B, R]
with `response_mask`; masks are by position, never by token id (a sampled PAD id inside a
response is a token like any other).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from rlhf.config import Limits
from rlhf.masks import last_active_index
from rlhf.rubric import FINISH_REASONS

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


class Tokens(NamedTuple):
    """The token side of PPO's sampling and scoring: the tokenizer, its EOS and PAD ids, and
    whether sampling keeps a KV cache (the same tokens either way, rlhf.ppo's scoring check)."""

    tokenizer: Any
    eos_id: int
    pad_id: int
    use_cache: bool = True


BATCH_SIZE = 32  # answers generated or scored at once (evaluation, the politeness exercise)


def batches(items: list, size: int = BATCH_SIZE):
    """`items` in consecutive chunks of `size` (the last may be shorter)."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


class OverLimitError(ValueError):
    """An example longer than the profile's token limits: rejected, never truncated."""


def chat_prompt(prompt: str) -> str:
    """ChatML with a single user turn, opened for the assistant's answer."""
    return f"{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n"


def max_new_tokens(profile, stage: str) -> int:
    """New tokens a `stage` ("ppo" rollouts, "evaluation" answers) may generate: the response
    limit (64), or the smaller `<stage>.max_new_tokens` of a miniature budget (rlhf.miniature;
    absent from the lab's profiles). A cut row ends like any row at the limit: truncated."""
    limit = profile.limits.response_tokens
    cut = {"ppo": profile.ppo, "evaluation": profile.evaluation}[stage].max_new_tokens
    if cut is not None and not 1 <= cut <= limit:
        raise ValueError(f"{stage}.max_new_tokens must be between 1 and {limit}, not {cut}")
    return cut or limit


def encode_prompt(tokenizer, prompt: str, limits: Limits, document_id: str = "?") -> list[int]:
    ids = tokenizer(chat_prompt(prompt), add_special_tokens=False)["input_ids"]
    if len(ids) > limits.prompt_tokens:
        raise OverLimitError(f"{document_id}: prompt has {len(ids)} tokens, limit {limits.prompt_tokens}")
    return ids


def encode_response(tokenizer, response: str, eos_id: int, limits: Limits, document_id: str = "?") -> list[int]:
    """Response ids followed by EOS (the model must learn to stop)."""
    ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [eos_id]
    if len(ids) > limits.response_tokens:
        raise OverLimitError(f"{document_id}: response has {len(ids)} tokens with EOS, limit {limits.response_tokens}")
    return ids


def encode_example(
    tokenizer, prompt: str, response: str, eos_id: int, limits: Limits, document_id: str = "?"
) -> tuple[list[int], list[int]]:
    p = encode_prompt(tokenizer, prompt, limits, document_id)
    r = encode_response(tokenizer, response, eos_id, limits, document_id)
    if len(p) + len(r) > limits.context_tokens:
        raise OverLimitError(f"{document_id}: {len(p) + len(r)} tokens, context limit {limits.context_tokens}")
    return p, r


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T] bool
    position_ids: torch.Tensor  # [B, T]
    response_index: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R] bool

    def to(self, device):
        return Batch(
            *(
                t.to(device)
                for t in (
                    self.input_ids,
                    self.attention_mask,
                    self.position_ids,
                    self.response_index,
                    self.response_mask,
                )
            )
        )

    @property
    def last_index(self) -> torch.Tensor:
        """[B] column of the last active response token (EOS included)."""
        return self.response_index.gather(1, last_active_index(self.response_mask)[:, None])[:, 0]


def collate(prompts: list[list[int]], responses: list[list[int]], pad_id: int, padding_side: str = "right") -> Batch:
    """Pad `prompt + response` rows to one length; every response needs at least one token."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', not {padding_side!r}")
    if len(prompts) != len(responses) or not prompts:
        raise ValueError("collate needs as many responses as prompts, at least one")
    if any(len(r) == 0 for r in responses):
        raise ValueError("every response needs at least one token")
    B = len(prompts)
    T = max(len(p) + len(r) for p, r in zip(prompts, responses))
    R = max(len(r) for r in responses)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.bool)
    response_index = torch.zeros((B, R), dtype=torch.long)
    response_mask = torch.zeros((B, R), dtype=torch.bool)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        n = len(p) + len(r)
        start = T - n if padding_side == "left" else 0
        input_ids[b, start : start + n] = torch.tensor(p + r, dtype=torch.long)
        attention_mask[b, start : start + n] = True
        response_index[b, : len(r)] = torch.arange(start + len(p), start + n)
        response_index[b, len(r) :] = start + n - 1  # any valid column; masked out
        response_mask[b, : len(r)] = True
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return Batch(input_ids, attention_mask, position_ids, response_index, response_mask)


def token_texts(tokenizer, ids: list[int]) -> list[str]:
    """Each id's token as the tokenizer writes it; an id outside the tokenizer (the embedding
    matrix has more rows than the vocabulary, and a policy can learn to sample them) as `<id N>`."""
    n_vocab = len(tokenizer)
    return [tokenizer.convert_ids_to_tokens(int(i)) if 0 <= i < n_vocab else f"<id {int(i)}>" for i in ids]


def control_token_ids(tokenizer, eos_id: int) -> set[int]:
    """Ids of the control tokens: EOS, the named special tokens (eos, pad, unk, additional) and
    every added token flagged special. all_special_ids lists only the named ones: the embedded
    tokenizer registers <|im_start|> as an added special token only."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return set(tokenizer.all_special_ids) | {eos_id} | {i for i, t in added.items() if getattr(t, "special", False)}


def decode_response(tokenizer, ids: list[int], eos_id: int) -> tuple[str, str]:
    """Text of a generated response and its finish reason (rlhf.rubric.FINISH_REASONS).

    The answer's body is `ids` without its final EOS. The body's first token fault, in the
    precedence of rlhf.rubric.TOKEN_FAULTS, names it:

        out_of_vocabulary  an id outside 0..len(tokenizer)-1 (the text leaves it out)
        control_token      a control token (control_token_ids) inside the body
        broken_text        the decoded text holds U+FFFD: bytes that are not UTF-8
    and without a fault, "eos" when the last id is EOS, else "length" (cut at the limit).
    """
    ended = len(ids) > 0 and ids[-1] == eos_id
    body = list(ids[:-1]) if ended else list(ids)
    n_vocab = len(tokenizer)
    text = tokenizer.decode([i for i in body if 0 <= i < n_vocab])
    if any(i < 0 or i >= n_vocab for i in body):
        return text, "out_of_vocabulary"
    if not control_token_ids(tokenizer, eos_id).isdisjoint(body):
        return text, "control_token"
    if "\ufffd" in text:
        return text, "broken_text"
    return text, ("eos" if ended else "length")


def finish_reason_counts(reasons) -> dict[str, int]:
    """{reason: how many of `reasons` it is} for every reason of rlhf.rubric.FINISH_REASONS, in
    that order, zeros included: the counts add up to the answers. An unknown name is an error."""
    counts = dict.fromkeys(FINISH_REASONS, 0)
    for reason in reasons:
        if reason not in counts:
            raise ValueError(f"unknown finish reason {reason!r}; the reasons are {FINISH_REASONS}")
        counts[reason] += 1
    return counts
