"""Token-by-token generation, with a KV cache or without one (the same draws either way).

Prompts are left-padded so that every row's next token sits in the last column; positions are
counted along real tokens, so padding never shifts a row. At each step the behaviour policy's
log-prob of the drawn token is recorded: under PPO these are the `logp_old` values, used as
they were drawn (never replaced by a later teacher-forced rescoring).

Sampling is temperature 1 over the full vocabulary (no top-k / top-p) from an explicit
`torch.Generator`; greedy takes the argmax. A row stops at EOS or after `max_new_tokens`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Generation:
    responses: list[list[int]]   # token ids per row, EOS included when the row ended by itself
    logps: list[list[float]]     # behaviour log-prob of each drawn token (FP32)
    ended: list[bool]            # True when the row produced EOS


def _left_pad(prompts: list[list[int]], pad_id: int, device):
    T = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), T), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(prompts), T), dtype=torch.long, device=device)
    for b, p in enumerate(prompts):
        ids[b, T - len(p):] = torch.tensor(p, dtype=torch.long, device=device)
        mask[b, T - len(p):] = 1
    return ids, mask


def _next_token(logits: torch.Tensor, greedy: bool, temperature: float, generator):
    """logits [B, V] -> (token [B], log-prob of the token under the sampling distribution [B])."""
    logp = F.log_softmax(logits.float() / (1.0 if greedy else temperature), dim=-1)
    if greedy:
        token = logp.argmax(-1)
    else:
        token = torch.multinomial(logp.exp(), 1, generator=generator)[:, 0]
    return token, logp.gather(-1, token[:, None])[:, 0]


@torch.no_grad()
def generate(model, prompts: list[list[int]], *, eos_id: int, pad_id: int, max_new_tokens: int,
             greedy: bool = False, temperature: float = 1.0, generator: torch.Generator | None = None,
             use_cache: bool = True) -> Generation:
    if not greedy and generator is None:
        raise ValueError("sampling needs an explicit torch.Generator (seeded by the caller)")
    device = next(model.parameters()).device
    ids, mask = _left_pad(prompts, pad_id, device)
    B = ids.shape[0]
    done = torch.zeros(B, dtype=torch.bool, device=device)
    tokens, logps = [], []
    past = None
    step_ids, step_mask = ids, mask
    for _ in range(max_new_tokens):
        positions = (step_mask.cumsum(-1) - 1).clamp(min=0)
        if use_cache and past is not None:
            out = model(input_ids=step_ids[:, -1:], attention_mask=step_mask,
                        position_ids=positions[:, -1:], cache=past, use_cache=True)
        else:
            out = model(input_ids=step_ids, attention_mask=step_mask, position_ids=positions,
                        use_cache=use_cache)
        past = out.cache if use_cache else None
        token, logp = _next_token(out.logits[:, -1, :], greedy, temperature, generator)
        token = torch.where(done, torch.full_like(token, pad_id), token)
        tokens.append(token)
        logps.append(logp)
        # Finished rows keep a masked pad so that shapes stay rectangular.
        step_ids = torch.cat([step_ids, token[:, None]], dim=1)
        step_mask = torch.cat([step_mask, (~done).long()[:, None]], dim=1)
        done = done | (token == eos_id)
        if bool(done.all()):
            break
    tok = torch.stack(tokens, 1).tolist()
    lp = torch.stack(logps, 1).tolist()
    responses, logp_rows, ended = [], [], []
    for b in range(B):
        row, lrow = [], []
        for t, l in zip(tok[b], lp[b]):
            row.append(t)
            lrow.append(l)
            if t == eos_id:
                break
        responses.append(row)
        logp_rows.append(lrow)
        ended.append(bool(row) and row[-1] == eos_id)
    return Generation(responses, logp_rows, ended)
