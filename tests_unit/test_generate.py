"""When sampling stops (rlhf.generate.generate): once every row has ended, no further step runs.

A step past the last row's EOS changes no answer (finished rows are padded), so the only trace it
leaves is in the sampler: every step draws from the caller's torch.Generator, and a later draw
from that generator (the next PPO rollout, the next refresh) would differ. The generator's state
after the call is therefore compared with a fresh generator of the same seed advanced by exactly
the steps the answers needed, drawn here with torch.multinomial on [B, V] as each step draws.

The actor's logits are replaced by a flat distribution with a heavy EOS (a forward hook on its
lm_head, seen by every step with or without a KV cache), so that rows end by themselves, at
different steps, well before the token limit.
"""

from __future__ import annotations

import pytest
import torch

from rlhf.generate import generate
from rlhf.roles import new_role

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]

MAX_NEW_TOKENS = 24
EOS_LOGIT = 6.0  # flat logits elsewhere: about 0.3 of the mass on EOS at each step
SEED = 0  # with these: answers of 9, 4, 3 and 2 tokens, all ended (checked below)
PROMPT_LENGTHS = (5, 9, 3, 7)


@pytest.fixture(scope="module")
def flat_actor(embedded_profile, embedded_dir, embedded_base):
    actor = new_role("actor", embedded_profile, embedded_dir)
    eos_id = embedded_base.eos_id

    def flat_with_heavy_eos(module, inputs, logits):
        out = torch.zeros_like(logits)
        out[..., eos_id] = EOS_LOGIT
        return out

    actor.model.lm_head.register_forward_hook(flat_with_heavy_eos)
    return actor.model


def advanced(seed: int, steps: int, rows: int, vocab: int) -> torch.Generator:
    """A generator of `seed` after `steps` draws of one token for each of `rows` rows over `vocab`."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        torch.multinomial(torch.ones(rows, vocab), 1, generator=g)
    return g


@pytest.mark.parametrize("use_cache", [True, False])
def test_sampling_stops_once_every_row_has_ended(flat_actor, embedded_base, use_cache):
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 958, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    sampler = torch.Generator().manual_seed(SEED)
    ids = dict(eos_id=embedded_base.eos_id, pad_id=embedded_base.pad_id)
    out = generate(flat_actor, prompts, max_new_tokens=MAX_NEW_TOKENS, generator=sampler, use_cache=use_cache, **ids)
    lengths = [len(r) for r in out.responses]
    steps = max(lengths)
    # The premise: every row ended by itself, at different steps, well before the limit.
    assert all(out.ended) and len(set(lengths)) > 1 and steps < MAX_NEW_TOKENS // 2, lengths
    assert all(r[-1] == embedded_base.eos_id for r in out.responses)
    assert [len(lp) for lp in out.logps] == lengths
    vocab = flat_actor.lm_head.weight.shape[0]  # each step draws over every row of the embedding
    rows = len(prompts)
    assert torch.equal(sampler.get_state(), advanced(SEED, steps, rows, vocab).get_state()), (
        f"the sampler was not advanced by exactly the {steps} steps the answers needed"
    )
    # Control: the comparison sees a single step more.
    assert not torch.equal(sampler.get_state(), advanced(SEED, steps + 1, rows, vocab).get_state())
