"""FLOP and memory accounting for the benchmarks (`pytest -m benchmark`, issue #7).

Model FLOPs (the convention of the benchmark report, stated once here):

    forward           F = 2 · N_backbone · tokens + 2 · N_lm_head · logit_rows + 2 · H · head_rows
    forward+backward  3 · F

* N_backbone counts only matmul weights: q/k/v/o/gate/up/down of every decoder layer plus
  their LoRA factors A [r, in] and B [out, r]. Embedding lookups, biases, norms, RoPE and
  softmax are not matmuls and are not counted.
* `tokens` is every position the backbone computes, padding included (a rectangular batch
  B x T is B·T tokens): FLOPs *performed*, not useful FLOPs.
* N_lm_head = V · H, applied to the rows whose logits are computed: our teacher-forced scoring
  projects only the R response prefixes (rlhf.scoring.logprobs_from_hidden); the causal-LM
  forward used by generation projects every position it is given.
* The scalar heads (judge, critic) cost 2 · H per row read.
* Attention scores (QK^T and AV) are parameter-free: 4 · H · pairs per layer, where `pairs` is
  the number of (query, key) products computed. They are reported apart (`attention_flops`),
  never folded into the model FLOPs.
* The ×3 for forward+backward is the usual "6·N·D" convention. With a frozen base the backward
  computes input gradients only (no weight gradients for W, only for the small LoRA factors),
  so the FLOPs really executed by a LoRA update are closer to 2 × forward: utilisation quoted
  with ×3 is therefore an upper bound by up to 3/2.

Memory (`memory_estimate`): four separate backbones in the base dtype, four sets of FP32 LoRA
adapters, FP32 scalar heads, AdamW states and gradients of the two trained roles (actor,
critic), and the activations kept for backward by the largest update (see `activation_bytes`).
"""
from __future__ import annotations

import json
import resource
import time
from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TRAIN_FACTOR = 3          # forward + backward = 3 x forward (convention; see the module docstring)
ROLES = 4                 # actor, reference, judge, critic: four separate backbones
TRAINED_ROLES = 2         # actor and critic carry gradients and AdamW states during PPO


@dataclass(frozen=True)
class Shape:
    """The numbers of a Qwen2 causal LM that FLOPs and memory depend on."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @classmethod
    def from_profile(cls, profile: dict) -> "Shape":
        m = profile["model"]
        return cls(m["hidden_size"], m["num_hidden_layers"], m["num_attention_heads"], m["num_key_value_heads"],
                   m["intermediate_size"], m["vocab_size"], m.get("tie_word_embeddings", True))

    @classmethod
    def from_config(cls, config) -> "Shape":
        return cls(config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                   config.num_key_value_heads, config.intermediate_size, config.vocab_size,
                   bool(config.tie_word_embeddings))

    def projections(self) -> list[tuple[str, int, int]]:
        """(name, in, out) of the seven projections of one decoder layer."""
        H, K, I = self.hidden, self.kv_dim, self.intermediate
        return [("q_proj", H, H), ("k_proj", H, K), ("v_proj", H, K), ("o_proj", H, H),
                ("gate_proj", H, I), ("up_proj", H, I), ("down_proj", I, H)]


# ------------------------------------------------------------------------------ parameters

def lora_params(shape: Shape, rank: int) -> int:
    """r · (in + out) over the seven projections of every layer (22,528 embedded, 4,399,104 qwen)."""
    return shape.layers * sum(rank * (i + o) for _, i, o in shape.projections())


def backbone_matmul_params(shape: Shape, lora_rank: int = 0) -> int:
    """Matmul weights a token passes through in the decoder layers (LoRA factors included)."""
    per_layer = sum(i * o for _, i, o in shape.projections())
    return shape.layers * per_layer + (lora_params(shape, lora_rank) if lora_rank else 0)


def lm_head_params(shape: Shape) -> int:
    return shape.vocab * shape.hidden


def total_params(shape: Shape) -> int:
    """Every parameter of the base (tied embedding counted once): 494,032,768 for Qwen2.5-0.5B."""
    H = shape.hidden
    weights = sum(i * o for _, i, o in shape.projections())
    biases = H + 2 * shape.kv_dim                       # q, k, v carry biases in Qwen2
    norms = 2 * H
    embed = shape.vocab * H * (1 if shape.tied else 2)
    return embed + shape.layers * (weights + biases + norms) + H  # + final norm


# ------------------------------------------------------------------------------ FLOPs

def forward_flops(shape: Shape, tokens: int, *, logit_rows: int = 0, head_rows: int = 0, lora_rank: int = 0) -> int:
    """2 · N_backbone · tokens + 2 · V·H · logit_rows + 2 · H · head_rows (matmul weights only)."""
    return (2 * backbone_matmul_params(shape, lora_rank) * tokens + 2 * lm_head_params(shape) * logit_rows
            + 2 * shape.hidden * head_rows)


def attention_flops(shape: Shape, pairs: int) -> int:
    """QK^T and AV: 4 · H · (query, key) pairs per layer (parameter-free; reported apart)."""
    return 4 * shape.hidden * shape.layers * pairs


def train_flops(forward: int) -> int:
    return TRAIN_FACTOR * forward


def generation_flops(shape: Shape, batch: int, prompt_len: int, steps: int, *, use_cache: bool,
                     lora_rank: int = 0) -> dict:
    """Model and attention FLOPs of rlhf.generate.generate on B left-padded prompts of length T.

    With the cache: one forward over B·T, then B tokens per step. Without it: step k recomputes
    B·(T + k) positions. The causal-LM forward computes logits at every position it is given.
    """
    model = attn = 0
    for k in range(steps):
        if use_cache:
            n = prompt_len if k == 0 else 1
            ctx = prompt_len + k
            pairs = batch * (prompt_len * prompt_len if k == 0 else ctx)
        else:
            n = prompt_len + k
            pairs = batch * n * n
        model += forward_flops(shape, batch * n, logit_rows=batch * n, lora_rank=lora_rank)
        attn += attention_flops(shape, pairs)
    return {"model_flops": model, "attention_flops": attn, "generated_tokens": batch * steps}


def batch_dims(batch) -> tuple[int, int, int]:
    """(B, T, R) of an rlhf.tokens.Batch."""
    B, T = batch.input_ids.shape
    return B, T, batch.response_index.shape[1]


def scoring_flops(shape: Shape, batch, lora_rank: int) -> dict:
    """Teacher-forced log-probs of the responses (rlhf.scoring.response_logprobs)."""
    B, T, R = batch_dims(batch)
    return {"model_flops": forward_flops(shape, B * T, logit_rows=B * R, lora_rank=lora_rank),
            "attention_flops": attention_flops(shape, B * T * T)}


def judge_flops(shape: Shape, batch, lora_rank: int) -> dict:
    """rlhf.roles.reward_scores: backbone + one head row per sequence."""
    B, T, _ = batch_dims(batch)
    return {"model_flops": forward_flops(shape, B * T, head_rows=B, lora_rank=lora_rank),
            "attention_flops": attention_flops(shape, B * T * T)}


def critic_flops(shape: Shape, batch, lora_rank: int) -> dict:
    """rlhf.roles.critic_values: backbone + one head row per response prefix."""
    B, T, R = batch_dims(batch)
    return {"model_flops": forward_flops(shape, B * T, head_rows=B * R, lora_rank=lora_rank),
            "attention_flops": attention_flops(shape, B * T * T)}


def trained(f: dict) -> dict:
    return {k: TRAIN_FACTOR * v for k, v in f.items()}


def add(*fs: dict) -> dict:
    out: dict = {}
    for f in fs:
        for k, v in f.items():
            out[k] = out.get(k, 0) + v
    return out


def ppo_update_flops(shape: Shape, batch, lora_rank: int) -> dict:
    """One actor update + one critic update (rlhf.ppo.ppo_update): 3 x (scoring + critic forward)."""
    return trained(add(scoring_flops(shape, batch, lora_rank), critic_flops(shape, batch, lora_rank)))


def utilisation(flops: float, seconds: float, peak_flops_per_s: float) -> dict:
    achieved = flops / seconds
    return {"flops": int(flops), "seconds": seconds, "achieved_gflop_s": achieved / 1e9,
            "peak_gflop_s": peak_flops_per_s / 1e9, "utilisation": achieved / peak_flops_per_s}


# ------------------------------------------------------------------------------ the CPU peak

def matmul_peak(n: int = 2048, repeats: int = 10, threads: int | None = None, dtype: str = "float32") -> dict:
    """Best-of-`repeats` FLOP/s of torch.mm on two n x n matrices (2·n³ FLOPs), with `threads`
    torch threads (None: leave the current setting); restores the thread count afterwards."""
    import torch
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=g, dtype=getattr(torch, dtype))
        b = torch.randn(n, n, generator=g, dtype=getattr(torch, dtype))
        torch.mm(a, b)  # warm-up (thread pool, MKL dispatch)
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t)
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    flops = 2 * n ** 3
    return {"n": n, "dtype": dtype, "threads": used, "repeats": repeats, "best_seconds": best,
            "flops_per_s": flops / best, "gflop_s": flops / best / 1e9}


# ------------------------------------------------------------------------------ memory

def activation_bytes_per_token_layer(shape: Shape, base_bytes: int, lora: bool = True) -> int:
    """Tensors a Qwen2 decoder layer keeps for backward, per token (estimate).

    In the base dtype: the two norm inputs, the shared q/k/v input, q, k, v, the attention
    output (o_proj input), the MLP input, gate and up outputs, the activation and the down_proj
    input: 6·H + H + 2·kv + 4·I. With LoRA on a non-FP32 base, every adapted projection keeps its
    own FP32 copy of its input (x.float(), rlhf.lora): 6·H + I more values at 4 bytes.
    """
    H, K, I = shape.hidden, shape.kv_dim, shape.intermediate
    base = base_bytes * (7 * H + 2 * K + 4 * I)
    fp32_copies = 4 * (6 * H + I) if (lora and base_bytes != 4) else 0
    return base + fp32_copies


def activation_bytes(shape: Shape, base_bytes: int, batch: int, seq: int, response: int) -> dict:
    """The largest update of PPO: the actor's forward+backward on B x T tokens, whose FP32
    log-softmax over the R response prefixes keeps logits, log-probs and their gradient
    (3 · B·R·V · 4 bytes)."""
    layers = shape.layers * batch * seq * activation_bytes_per_token_layer(shape, base_bytes)
    logits = 3 * batch * response * shape.vocab * 4
    return {"layers": layers, "logits": logits, "total": layers + logits}


def memory_estimate(profile: dict, *, batch: int = 4, seq: int | None = None, response: int | None = None) -> dict:
    """Bytes held during PPO with four separate backbones (SPEC §6), by calculation.

    backbones   total_params · dtype bytes · 4
    adapters    LoRA params · 4 bytes (FP32) · 4 roles, plus the FP32 heads (H + 1) of judge and critic
    optimizer   actor and critic: gradients (4 bytes) + AdamW exp_avg and exp_avg_sq (8 bytes)
                per trained parameter (LoRA, plus the critic's head)
    activations the largest update's kept tensors (activation_bytes), B = 4, T = context limit
    """
    shape = Shape.from_profile(profile)
    dtype_bytes = DTYPE_BYTES[profile["model"]["dtype"]]
    rank = profile["lora"]["rank"]
    seq = seq or profile["limits"]["context_tokens"]
    response = response or profile["limits"]["response_tokens"]
    n_base = total_params(shape)
    n_lora = lora_params(shape, rank)
    n_head = shape.hidden + 1
    backbones = n_base * dtype_bytes * ROLES
    adapters = n_lora * 4 * ROLES + 2 * n_head * 4
    trained_params = TRAINED_ROLES * n_lora + n_head
    optimizer = trained_params * (4 + 8)
    act = activation_bytes(shape, dtype_bytes, batch, seq, response)
    total = backbones + adapters + optimizer + act["total"]
    return {"profile": profile["name"], "base_params": n_base, "lora_params_per_role": n_lora,
            "dtype_bytes": dtype_bytes, "backbones": backbones, "adapters_and_heads": adapters,
            "optimizer_and_grads": optimizer, "activations": act["total"],
            "activations_layers": act["layers"], "activations_logits": act["logits"], "total": total,
            "total_gib": total / 2 ** 30}


def peak_rss_mib() -> float:
    """Peak RSS of this process image: VmHWM from /proc/self/status (reset by exec), else ru_maxrss.

    ru_maxrss alone is wrong for a freshly started child: Linux carries the parent's high-water
    mark across fork + exec, so a child of a 3 GB parent reports 3 GB.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_stage_rss(stage: str, run_dir: str, updates: int = 5, iterations: int = 3) -> dict:
    """Peak RSS of one stage of the embedded profile, meant to run alone in a fresh process.

    Stages: "import" (context opened, no role: the floor of torch + transformers + corpus),
    "sft" (actor role, `updates` SFT updates, the validation pass), "reward" (judge role,
    `updates` Bradley-Terry updates, the validation pass), "ppo" (the four roles from the run's
    SFT and judge files, `iterations` PPO iterations). `run_dir` holds corpus/, base_model/ and,
    for "ppo", sft/actor.safetensors and reward/judge.safetensors.
    """
    import torch
    from rlhf import lab
    t0 = time.perf_counter()
    ctx = lab.open_context(run_dir, "embedded")
    view = ctx.corpus.learning_view()
    prof = ctx.profile
    if stage == "sft":
        from rlhf.optim import adamw, optimizer_step
        from rlhf.sft import encode_demonstrations, evaluate_loss, sft_loss
        actor = ctx.role("actor")
        train = encode_demonstrations(view.demonstrations("train"), ctx.tokenizer, ctx.eos_id, prof["limits"])
        valid = encode_demonstrations(view.pairs("validation"), ctx.tokenizer, ctx.eos_id, prof["limits"], "chosen")
        params = [p for p in actor.learned_parameters() if p.requires_grad]
        opt = adamw(params, prof["sft"]["lr"], prof["optim"]["weight_decay"])
        k = prof["sft"]["examples_per_update"]
        for u in range(updates):
            loss, _ = sft_loss(actor.model, train[u * k:(u + 1) * k], ctx.pad_id)
            optimizer_step(opt, params, loss, prof["sft"]["lr"], 1.0, "rss sft")
        evaluate_loss(actor.model, valid, ctx.pad_id)
    elif stage == "reward":
        from rlhf.judge import encode_pairs, evaluate_pairs, pair_scores
        from rlhf.optim import adamw, optimizer_step
        from rlhf.ppo_math import bradley_terry_loss
        judge = ctx.role("reward")
        train = encode_pairs(view.pairs("train"), ctx.tokenizer, ctx.eos_id, prof["limits"])
        valid = encode_pairs(view.pairs("validation"), ctx.tokenizer, ctx.eos_id, prof["limits"])
        params = [p for p in judge.learned_parameters() if p.requires_grad]
        opt = adamw(params, prof["judge"]["lr"], prof["optim"]["weight_decay"])
        k = prof["judge"]["pairs_per_update"]
        for u in range(updates):
            c, r = pair_scores(judge, train[u * k:(u + 1) * k], ctx.pad_id)
            optimizer_step(opt, params, bradley_terry_loss(c, r), prof["judge"]["lr"], 1.0, "rss judge")
        evaluate_pairs(judge, valid, ctx.pad_id)
    elif stage == "ppo":
        from rlhf.ppo import train_ppo
        prof = json.loads(json.dumps(prof))
        prof["ppo"]["iterations"] = iterations
        roles = lab.ppo_roles(ctx)
        train_ppo(roles, view, ctx.tokenizer, ctx.eos_id, ctx.pad_id, prof)
    elif stage != "import":
        raise ValueError(f"unknown stage {stage!r}")
    return {"stage": stage, "peak_rss_mib": peak_rss_mib(),
            "seconds": time.perf_counter() - t0, "torch_threads": torch.get_num_threads(),
            "updates": updates if stage in ("sft", "reward") else None,
            "iterations": iterations if stage == "ppo" else None}
