"""Token-by-token generation, with a KV cache or without one (the same draws either way).

Prompts are left-padded so that every row's next token sits in the last column; positions are
counted along real tokens, so padding never shifts a row. At each step the behaviour policy's
log-prob of the drawn token is recorded: under PPO these are the `logp_old` values, used as
they were drawn (never replaced by a later teacher-forced rescoring).

Sampling is temperature 1 over the tokenizer's whole vocabulary (no top-k / top-p; the embedding
rows past the tokenizer's last id are never drawn: rlhf.scoring.real_token_logits) from an
explicit `torch.Generator`; greedy takes the argmax. A row stops at EOS or after `max_new_tokens`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from rlhf import costs
from rlhf.config import Profile
from rlhf.scoring import real_token_logits, token_count
from rlhf.tokens import Tokens, max_new_tokens


@dataclass
class Generation:
    responses: list[list[int]]  # token ids per row, EOS included when the row ended by itself
    logps: list[list[float]]  # behaviour log-prob of each drawn token (FP32)
    ended: list[bool]  # True when the row produced EOS
    # Sampling only: the entropy (nats) of the distribution each token was drawn from, one per
    # drawn token: -sum_v p(v) log p(v) over the real tokens (an over-optimisation signal, docs/signals.md).
    entropies: list[list[float]] = field(default_factory=list)


@dataclass
class Prefill:
    """The first forward pass over a batch of left-padded prompts, kept so that several draws
    from the same prompts (a greedy answer, then temperature-1 samples) start from it instead of
    repeating it. Every draw's first step is this pass, so a draw from a Prefill equals, bit for
    bit, one that computes it (tests_unit/test_training.py)."""

    prompts: list[list[int]]
    room: int  # the max_new_tokens its columns were padded for
    use_cache: bool
    last_logits_only: bool
    ids: torch.Tensor  # [B, T + room] left-padded prompts (read-only: each draw writes into a copy)
    mask: torch.Tensor  # [B, T + room]
    logits: torch.Tensor  # [B, V] the last column's logits: the first drawn token's distribution
    cache: object  # the KV cache after the prompts (None without one); each draw extends a copy
    graphed: bool = False  # the cache is static, for decode steps replayed as a CUDA graph (GraphedDecoder)


@torch.inference_mode()
def prefill(
    model,
    prompts: list[list[int]],
    *,
    pad_id: int,
    max_new_tokens: int,
    use_cache: bool = True,
    last_logits_only: bool = False,
) -> Prefill:
    """One forward pass over the left-padded prompts (see generate's `last_logits_only`). Where
    decode steps replay a CUDA graph (`graphs_apply`), the prompts' keys and values go into a
    static cache of `static_columns` columns, the graph's layout."""
    device = next(model.parameters()).device
    ids, mask, T = _left_pad(prompts, pad_id, max_new_tokens, device)  # [B, T + N] each
    cache, graphed = None, graphs_apply(model, use_cache)
    if graphed:
        from transformers import StaticCache

        cache = StaticCache(config=model.config, max_cache_len=static_columns(ids.shape[1]))
    out = _full_forward(model, ids[:, :T], mask[:, :T], use_cache, last_logits_only, cache)
    return Prefill(
        [list(p) for p in prompts],
        max_new_tokens,
        use_cache,
        last_logits_only,
        ids,
        mask,
        out.logits[:, -1, :],
        out.cache if use_cache else None,
        graphed,
    )


def _full_forward(model, ids: torch.Tensor, mask: torch.Tensor, use_cache: bool, last_logits_only: bool, cache=None):
    """A forward pass over every column of ids [B, L] (the prefill; every step without a cache),
    into `cache` when one is given (a static one; else the model makes a dynamic one)."""
    kwargs = {} if cache is None else {"cache": cache}
    if last_logits_only:
        out = model.model(
            input_ids=ids, attention_mask=mask, position_ids=_positions(mask), use_cache=use_cache, **kwargs
        )
        # The last column, made contiguous before the vocabulary projection: torch 2.13's CPU
        # BF16 linear with a frozen weight on a strided [B, 1, H] view (what transformers'
        # logits_to_keep=1 passes) took 65 s for a 32-row batch at Qwen's vocabulary, 0.08 s
        # contiguous.
        out.logits = model.lm_head(out.last_hidden_state[:, -1:, :].contiguous())  # [B, 1, V]
        return out
    return model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask), use_cache=use_cache, **kwargs)


def _left_pad(prompts: list[list[int]], pad_id: int, room: int, device):
    """Left-padded ids and mask [B, T + room]: prompts end in column T-1, drawn tokens go after.

    Writing each drawn token into its column costs one small copy per step, where growing the
    sequence by torch.cat copied all of it every step.
    """
    T = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), T + room), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(prompts), T + room), dtype=torch.long, device=device)
    for b, p in enumerate(prompts):
        ids[b, T - len(p) : T] = torch.tensor(p, dtype=torch.long, device=device)
        mask[b, T - len(p) : T] = 1
    return ids, mask, T


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """mask [B, L] -> position of every column [B, L], counted along real tokens (pads clamp to 0)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _prepares_decode_masks(config) -> bool:
    """True when _decode_mask builds exactly the mask transformers would: SDPA attention, every
    layer full attention (no sliding window). Otherwise the model gets the 2D mask as before."""
    layer_types = getattr(config, "layer_types", None) or ()
    return config._attn_implementation == "sdpa" and all(t == "full_attention" for t in layer_types)


def _decode_mask(mask: torch.Tensor) -> dict:
    """mask [B, L] -> the prepared attention masks of one cached step (1 new token, L columns).

    What transformers' create_causal_mask returns for SDPA there, without its ~0.1-0.2 ms of
    argument handling per step: None when no column is padding (SDPA runs unmasked), else
    [B, 1, 1, L] bool, True where attended (causality is no constraint for the last position).
    tests_unit/test_training.py checks it against create_causal_mask.
    """
    return {"full_attention": None if bool(mask.all()) else mask.bool()[:, None, None, :]}


def _next_token(logits: torch.Tensor, greedy: bool, temperature: float, generator, n_tokens: int):
    """logits [B, V] -> (token [B], log-prob of the token under the sampling distribution [B],
    that distribution's entropy [B] when sampling, else None), over the ids below n_tokens only
    (rlhf.scoring.real_token_logits).

    The division by a temperature of 1 (and greedy's 1) is skipped: x / 1.0 is x exactly.
    """
    if logits.dtype != torch.float32:
        logits = logits.float()
    logits = real_token_logits(logits, n_tokens)
    if not greedy and temperature != 1.0:
        logits = logits / temperature
    logp = F.log_softmax(logits, dim=-1)
    entropy = None
    if greedy:
        token = logp.argmax(-1)
    else:
        p = logp.exp()
        token = torch.multinomial(p, 1, generator=generator)[:, 0]
        entropy = torch.special.entr(p).sum(-1)  # entr(0) = 0: the masked rows add nothing
    return token, logp.gather(-1, token[:, None])[:, 0], entropy


@torch.inference_mode()
def generate(
    model,
    prompts: list[list[int]],
    *,
    eos_id: int,
    pad_id: int,
    max_new_tokens: int,
    greedy: bool = False,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    last_logits_only: bool = False,
    start: Prefill | None = None,
) -> Generation:
    """Draw up to `max_new_tokens` per prompt (see the module docstring).

    `last_logits_only` (the profile's `runtime.last_logits_only`): a full forward (the prefill,
    every step without a cache) projects only the last column onto the vocabulary. Only that
    column is used; at Qwen's 151,936 words the [B, L, V] projection of a 32-row prefill is
    ~0.6 GB BF16 and most of the prefill's time. Off for the embedded profile: a
    [B, 1] projection rounds differently from a [B, L] one (4e-6 apart), and its golden hashes
    were made with the full one.

    `start`: the prompts' prefill (rlhf.generate.prefill) made by an earlier call, so that
    several draws from the same prompts run it once; it must be of these prompts, this
    max_new_tokens, use_cache and last_logits_only.

    Inference mode rather than no_grad: nothing made here outlives the call as a tensor (the
    result is Python lists), and it spares each of the few hundred small ops of a step the
    autograd and version-counter bookkeeping. The kernels, and so every drawn bit, are the same.
    """
    if not greedy and generator is None:
        raise ValueError("sampling needs an explicit torch.Generator (seeded by the caller)")
    if start is None:
        start = prefill(
            model,
            prompts,
            pad_id=pad_id,
            max_new_tokens=max_new_tokens,
            use_cache=use_cache,
            last_logits_only=last_logits_only,
        )
    elif (start.prompts, start.room, start.use_cache, start.last_logits_only) != (
        prompts,
        max_new_tokens,
        use_cache,
        last_logits_only,
    ):
        raise ValueError("the prefill given is not of these prompts, max_new_tokens, use_cache and last_logits_only")
    n_tokens = token_count(model)
    ids, mask = start.ids.clone(), start.mask.clone()  # [B, T + N] each; drawn tokens are written in
    T = ids.shape[1] - max_new_tokens
    seen = mask.sum(-1)  # [B] real tokens in mask[:, :L]; the last one sits at seen - 1
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    tokens, logps, entropies = [], [], []
    decoder, logits = decoder_for(model, start), start.logits
    for L in range(T, T + max_new_tokens):  # L: columns the model sees this step
        if L > T:
            logits = decoder.step(ids, mask, seen, L)
            costs.count("decode_steps")
        token, logp, entropy = _next_token(logits, greedy, temperature, generator, n_tokens)
        token = token.masked_fill(done, pad_id)
        tokens.append(token)
        logps.append(logp)
        if entropy is not None:
            entropies.append(entropy)
        # Finished rows keep a masked pad so that shapes stay rectangular.
        live = ~done
        ids[:, L] = token
        mask[:, L] = live
        seen += live
        done |= token == eos_id
        if bool(done.all()):
            break
    return _rows(tokens, logps, entropies, eos_id)


def _rows(tokens: list, logps: list, entropies: list, eos_id: int) -> Generation:
    """Per-step [B] tensors -> per-row lists, each cut after its EOS."""
    tok = torch.stack(tokens, 1).tolist()
    lp = torch.stack(logps, 1).tolist()
    ent = torch.stack(entropies, 1).tolist() if entropies else None
    responses, logp_rows, ended = [], [], []
    for b in range(len(tok)):
        row, lrow = [], []
        for t, l in zip(tok[b], lp[b]):
            row.append(t)
            lrow.append(l)
            if t == eos_id:
                break
        responses.append(row)
        logp_rows.append(lrow)
        ended.append(bool(row) and row[-1] == eos_id)
    entropy_rows = [] if ent is None else [ent[b][: len(responses[b])] for b in range(len(tok))]
    return Generation(responses, logp_rows, ended, entropy_rows)


# ------------------------------------------------------------------------- decoders
#
# One decode step: the logits [B, V] of the next token, given the columns ids[:, :L] (the last
# one drawn at the step before). Three ways, the same function of the same weights:
#
#   CachedDecoder    the prefill's KV cache, extended by one column per step (the CPU path)
#   UncachedDecoder  a full forward over every column at every step (easier to read, slower)
#   GraphedDecoder   CUDA: the step captured once as a CUDA graph over a static KV cache and
#                    replayed, so the host launches one graph instead of ~2,000 kernels


def decoder_for(model, start: Prefill):
    """The decoder of a generation that starts from `start` (see above)."""
    if not start.use_cache:
        return UncachedDecoder(model, start.last_logits_only)
    if start.graphed:
        return GraphedDecoder(model, start)
    return CachedDecoder(model, start)


class UncachedDecoder:
    def __init__(self, model, last_logits_only: bool):
        self.model, self.last_logits_only = model, last_logits_only

    def step(self, ids, mask, seen, L: int) -> torch.Tensor:
        return _full_forward(self.model, ids[:, :L], mask[:, :L], False, self.last_logits_only).logits[:, -1, :]


class CachedDecoder:
    def __init__(self, model, start: Prefill):
        self.model = model
        self.past = copy.deepcopy(start.cache)  # decode steps extend a copy: the prefill serves again
        self.prepared = _prepares_decode_masks(model.config)

    def step(self, ids, mask, seen, L: int) -> torch.Tensor:
        out = self.model(
            input_ids=ids[:, L - 1 : L],
            attention_mask=_decode_mask(mask[:, :L]) if self.prepared else mask[:, :L],
            position_ids=(seen - 1).clamp(min=0)[:, None],
            cache=self.past,
            use_cache=True,
        )
        self.past = out.cache
        return out.logits[:, -1, :]


# CUDA graphs: decode steps on CUDA replay one captured graph per (model, batch rows, columns).
# `CUDA_GRAPHS = False` runs them eagerly over the dynamic cache instead (the CPU path).
CUDA_GRAPHS = True
STATIC_BLOCK = 64  # static caches are sized in blocks of columns, so that prompts of other lengths share a graph


def graphs_apply(model, use_cache: bool) -> bool:
    """True when the decode steps of `model` replay a CUDA graph: a KV cache, the model on CUDA,
    SDPA attention with every layer full (the masks GraphedDecoder prepares), CUDA_GRAPHS on."""
    return (
        use_cache
        and CUDA_GRAPHS
        and next(model.parameters()).device.type == "cuda"
        and _prepares_decode_masks(model.config)
    )


def static_columns(columns: int) -> int:
    """A static cache's columns: the generation's T + N rounded up to a whole STATIC_BLOCK."""
    return -(-columns // STATIC_BLOCK) * STATIC_BLOCK


class GraphedDecoder:
    """Decode steps replayed as a CUDA graph over a static KV cache.

    The step (embedding, 24 layers with their adapters, the vocabulary projection of one column)
    is captured once per model, batch size and static width (`_StepGraph`) and replayed for every
    drawn token: the host launches one graph instead of ~2,000 kernels. Its inputs are static
    tensors written before each replay (the last drawn token, its position, the columns
    attended), its cache a static one that each generation first loads from its prefill (so a
    prefill serves several draws, as on the CPU); sampling runs outside the graph, eagerly, with
    the caller's generator. The captured kernels are the eager step's, so the draws are the same
    function of the same weights; graphs follow the weights as the optimizer updates them in
    place (the same tensors, the same addresses)."""

    def __init__(self, model, start: Prefill):
        B, columns = start.ids.shape[0], static_columns(start.ids.shape[1])
        graphs = model.__dict__.setdefault("_rlhf_decode_graphs", {})
        if (B, columns) not in graphs:
            graphs[(B, columns)] = _StepGraph(model, B, columns)
        self.graph = graphs[(B, columns)]
        self.graph.load(start)

    def step(self, ids, mask, seen, L: int) -> torch.Tensor:
        g = self.graph
        g.ids_in.copy_(ids[:, L - 1 : L])
        g.positions_in.copy_((seen - 1).clamp(min=0)[:, None])
        g.attend[:, L - 1].copy_(mask[:, L - 1].bool())
        g.replay()
        costs.count("graph_replays")
        return g.logits_out


class _StepGraph:
    """One captured decode step and its static tensors (see GraphedDecoder)."""

    def __init__(self, model, B: int, columns: int):
        from transformers import StaticCache

        device = next(model.parameters()).device
        self.cache = StaticCache(config=model.config, max_cache_len=columns)
        self.ids_in = torch.zeros((B, 1), dtype=torch.long, device=device)  # [B, 1] the last drawn token
        self.positions_in = torch.zeros((B, 1), dtype=torch.long, device=device)  # [B, 1] its position
        self.attend = torch.zeros((B, columns), dtype=torch.bool, device=device)  # [B, C] columns attended
        self.attend[:, 0] = True  # the warm-up steps attend to something

        def step():
            out = model(
                input_ids=self.ids_in,
                attention_mask={"full_attention": self.attend[:, None, None, :]},
                position_ids=self.positions_in,
                cache=self.cache,
                use_cache=True,
            )
            return out.logits[:, -1, :]  # [B, V]

        if device.type != "cuda":  # no graphs on a CPU: the same static step, run eagerly (the CPU tests' path)
            step()  # the static cache's lazy initialisation
            self.replay = lambda: setattr(self, "logits_out", step())
            return
        # Warm-up on a side stream (lazy initialisations, the static cache's tensors), then capture.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.logits_out = step()  # [B, V] written by every replay
        self.replay = graph.replay
        costs.count("graph_captures")

    def load(self, start: Prefill) -> None:
        """The prefill's keys, values and lengths into the static cache; its mask into `attend`."""
        prefilled: Any = start.cache  # a transformers StaticCache (prefill, `graphed`)
        for mine, theirs in zip(self.cache.layers, prefilled.layers):
            mine.keys.copy_(theirs.keys)
            mine.values.copy_(theirs.values)
            mine.cumulative_length.copy_(theirs.cumulative_length)
        T = start.ids.shape[1] - start.room
        self.attend.zero_()
        self.attend[:, :T].copy_(start.mask[:, :T].bool())


def sample_like_ppo(model, prompts: list[list[int]], tokens: Tokens, profile: Profile, generator) -> Generation:
    """Answers drawn as PPO's rollouts draw them: temperature `ppo.temperature`, up to the PPO
    answer limit (rlhf.tokens.max_new_tokens), with the profile's `runtime.last_logits_only`.
    The rollout (rlhf.ppo) and the iterated judge's refresh (rlhf.refresh) both sample here."""
    return generate(
        model,
        prompts,
        eos_id=tokens.eos_id,
        pad_id=tokens.pad_id,
        max_new_tokens=max_new_tokens(profile, "ppo"),
        temperature=profile.ppo.temperature,
        generator=generator,
        use_cache=tokens.use_cache,
        last_logits_only=profile.runtime.last_logits_only,
    )
