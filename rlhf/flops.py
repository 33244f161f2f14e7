"""FLOP and memory formulas (pure arithmetic) for the benchmarks (`pytest -m benchmark`).

This module only calculates: it imports nothing from `rlhf` and nothing outside the standard
library, so it sits at the bottom of the import graph. Measuring (the CPU's matmul peak, the peak
RSS of a stage run in its own process) is the benchmark harness's job: tests_unit/bench_harness.py.

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

from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TRAIN_FACTOR = 3  # forward + backward = 3 x forward (convention; see the module docstring)
ROLES = 4  # actor, reference, judge, critic: four separate backbones
BACKBONES_RESIDENT = ROLES + 1  # and the frozen base each is copied from, kept for the process (rlhf.models.kept_base)
TRAINED_ROLES = 2  # actor and critic carry gradients and AdamW states during PPO


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
    def from_profile(cls, profile) -> "Shape":
        """From a profile's [model] table (an rlhf.config.Profile; read by attribute, not imported)."""
        return cls.from_config(profile.model)

    @classmethod
    def from_config(cls, config) -> "Shape":
        return cls(
            config.hidden_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.intermediate_size,
            config.vocab_size,
            bool(config.tie_word_embeddings),
        )

    def projections(self) -> list[tuple[str, int, int]]:
        """(name, in, out) of the seven projections of one decoder layer."""
        H, K, I = self.hidden, self.kv_dim, self.intermediate
        return [
            ("q_proj", H, H),
            ("k_proj", H, K),
            ("v_proj", H, K),
            ("o_proj", H, H),
            ("gate_proj", H, I),
            ("up_proj", H, I),
            ("down_proj", I, H),
        ]


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
    biases = H + 2 * shape.kv_dim  # q, k, v carry biases in Qwen2
    norms = 2 * H
    embed = shape.vocab * H * (1 if shape.tied else 2)
    return embed + shape.layers * (weights + biases + norms) + H  # + final norm


# ------------------------------------------------------------------------------ FLOPs


def forward_flops(shape: Shape, tokens: int, *, logit_rows: int = 0, head_rows: int = 0, lora_rank: int = 0) -> int:
    """2 · N_backbone · tokens + 2 · V·H · logit_rows + 2 · H · head_rows (matmul weights only)."""
    return (
        2 * backbone_matmul_params(shape, lora_rank) * tokens
        + 2 * lm_head_params(shape) * logit_rows
        + 2 * shape.hidden * head_rows
    )


def attention_flops(shape: Shape, pairs: int) -> int:
    """QK^T and AV: 4 · H · (query, key) pairs per layer (parameter-free; reported apart)."""
    return 4 * shape.hidden * shape.layers * pairs


def train_flops(forward: int) -> int:
    return TRAIN_FACTOR * forward


def generation_flops(
    shape: Shape, batch: int, prompt_len: int, steps: int, *, use_cache: bool, lora_rank: int = 0
) -> dict:
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
    return {
        "model_flops": forward_flops(shape, B * T, logit_rows=B * R, lora_rank=lora_rank),
        "attention_flops": attention_flops(shape, B * T * T),
    }


def judge_flops(shape: Shape, batch, lora_rank: int) -> dict:
    """rlhf.roles.reward_scores: backbone + one head row per sequence."""
    B, T, _ = batch_dims(batch)
    return {
        "model_flops": forward_flops(shape, B * T, head_rows=B, lora_rank=lora_rank),
        "attention_flops": attention_flops(shape, B * T * T),
    }


def critic_flops(shape: Shape, batch, lora_rank: int) -> dict:
    """rlhf.roles.critic_values: backbone + one head row per response prefix."""
    B, T, R = batch_dims(batch)
    return {
        "model_flops": forward_flops(shape, B * T, head_rows=B * R, lora_rank=lora_rank),
        "attention_flops": attention_flops(shape, B * T * T),
    }


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
    return {
        "flops": int(flops),
        "seconds": seconds,
        "achieved_gflop_s": achieved / 1e9,
        "peak_gflop_s": peak_flops_per_s / 1e9,
        "utilisation": achieved / peak_flops_per_s,
    }


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


def memory_estimate(profile, *, batch: int = 4, seq: int | None = None, response: int | None = None) -> dict:
    """Bytes held during PPO with four separate backbones (SPEC §6) and the base they are copied
    from, by calculation.

    backbones   total_params · dtype bytes · 5: the four roles' and the frozen base they are
                copied from, kept resident for the process (rlhf.models.kept_base)
    adapters    LoRA params · 4 bytes (FP32) · 4 roles, plus the FP32 heads (H + 1) of judge and critic
    optimizer   actor and critic: gradients (4 bytes) + AdamW exp_avg and exp_avg_sq (8 bytes)
                per trained parameter (LoRA, plus the critic's head)
    activations the largest update's kept tensors (activation_bytes), B = 4, T = context limit
    """
    shape = Shape.from_profile(profile)
    dtype_bytes = DTYPE_BYTES[profile.model.dtype]
    rank = profile.lora.rank
    seq = seq or profile.limits.context_tokens
    response = response or profile.limits.response_tokens
    n_base = total_params(shape)
    n_lora = lora_params(shape, rank)
    n_head = shape.hidden + 1
    backbones = n_base * dtype_bytes * BACKBONES_RESIDENT
    adapters = n_lora * 4 * ROLES + 2 * n_head * 4
    trained_params = TRAINED_ROLES * n_lora + n_head
    optimizer = trained_params * (4 + 8)
    act = activation_bytes(shape, dtype_bytes, batch, seq, response)
    total = backbones + adapters + optimizer + act["total"]
    return {
        "profile": profile.name,
        "base_params": n_base,
        "lora_params_per_role": n_lora,
        "dtype_bytes": dtype_bytes,
        "backbones": backbones,
        "adapters_and_heads": adapters,
        "optimizer_and_grads": optimizer,
        "activations": act["total"],
        "activations_layers": act["layers"],
        "activations_logits": act["logits"],
        "total": total,
        "total_gib": total / 2**30,
    }


# ------------------------------------------------------------------------------ a GPU run's cost

H200_HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e bandwidth: the floor of a decode step
H200_BF16_DENSE_FLOPS = 989e12  # H200 dense BF16 tensor-core peak: the floor of training work


@dataclass(frozen=True)
class Lengths:
    """Mean token counts of the corpus under the model's tokenizer (chat-rendered prompts;
    responses with EOS) and the number of sequences each stage reads."""

    prompt: float  # a chat-rendered prompt
    response: float  # a demonstration / chosen / rejected answer, EOS included
    sft_examples: int = 8  # per update
    judge_pairs: int = 8  # per update
    validation: int = 180  # validation pairs (SFT reads their chosen answers)
    heldout_rows: int = 260
    test_pairs: int = 180
    probe_candidates: int = 80
    audit_pairs: int = 828  # the shortcut audit's counterfactual pairs (4 x 180, d_conflict 108)
    eval_batch: int = 32


def decode_step_bytes(shape: Shape, dtype_bytes: int, lora_rank: int) -> int:
    """Bytes one generation step must read at least: every weight of the actor once (base in its
    dtype, LoRA factors in FP32). The KV cache (2 x kv_dim x layers per token, a few MB here) is
    left out."""
    return total_params(shape) * dtype_bytes + lora_params(shape, lora_rank) * 4


def stage_costs(
    profile,  # an rlhf.config.Profile, read by attribute (this module imports nothing from rlhf)
    lengths: Lengths,
    *,
    utilisation: float,
    peak_flops_per_s: float = H200_BF16_DENSE_FLOPS,
    bytes_per_s: float = H200_HBM_BYTES_PER_S,
) -> dict:
    """Seconds of each stage of one leg of `profile` on one GPU, by calculation:

        compute-bound work (prefills, scoring, updates)   FLOPs / (peak x utilisation)
        generation (one token per step, all rows at once)  steps x decode_step_bytes / bandwidth

    FLOPs follow this module's convention (forward_flops, train_flops = 3 x forward) over
    rectangular batches of the mean lengths. Generation is the bandwidth floor: a step cannot
    be faster than reading the weights once; eager PyTorch's kernel launches (~12 per layer) make
    real steps slower, which `utilisation` does not cover.
    """
    shape = Shape.from_profile(profile)
    r, dtype_bytes = profile.lora.rank, DTYPE_BYTES[profile.model.dtype]
    P, R, L = lengths.prompt, lengths.response, lengths
    T = P + R
    new = profile.limits.response_tokens
    rate = peak_flops_per_s * utilisation
    step_s = decode_step_bytes(shape, dtype_bytes, r) / bytes_per_s

    def fwd(seqs, tokens_each, logit_rows_each=0, head_rows_each=0):
        return forward_flops(
            shape,
            int(seqs * tokens_each),
            logit_rows=int(seqs * logit_rows_each),
            head_rows=int(seqs * head_rows_each),
            lora_rank=r,
        )

    sft, judge, ppo = profile.sft, profile.judge, profile.ppo
    sft_flops = sft.expected_updates * train_flops(fwd(L.sft_examples, T, R)) + sft.epochs * fwd(L.validation, T, R)
    judge_flops = judge.expected_updates * train_flops(fwd(2 * L.judge_pairs, T, 0, 1)) + judge.epochs * fwd(
        2 * L.validation, T, 0, 1
    )
    B, Tp = ppo.prompts_per_iteration, P + new
    rollout_flops = (
        fwd(B, P, 1)  # the prefill (last column projected)
        + fwd(B, Tp, new)  # reference log-probs
        + fwd(B, Tp, 0, 1)  # judge
        + fwd(B, Tp, 0, new)  # critic values
        + fwd(B, Tp, new)
    )  # the scoring check (actor, teacher-forced)
    update_flops = ppo.updates_per_iteration * train_flops(fwd(B, Tp, new) + fwd(B, Tp, 0, new))
    ppo_iteration_s = (rollout_flops + update_flops) / rate + new * step_s
    batches = -(-L.heldout_rows // L.eval_batch)
    eval_flops = (
        2 * (fwd(L.heldout_rows, P, 1) + 3 * fwd(L.heldout_rows, P + new, new))
        + fwd(2 * L.test_pairs, T, 0, 1)
        + fwd(L.probe_candidates, T, 0, 1)
    )
    audit_flops = fwd(2 * L.audit_pairs, T, 0, 1)
    out: dict[str, Any] = {
        "sft": {"flops": sft_flops, "seconds": sft_flops / rate},
        "judge": {"flops": judge_flops, "seconds": judge_flops / rate},
        "ppo": {
            "flops": ppo.iterations * (rollout_flops + update_flops),
            "decode_steps": ppo.iterations * new,
            "seconds": ppo.iterations * ppo_iteration_s,
        },
        "evaluation": {
            "flops": eval_flops,
            "decode_steps": 2 * batches * new,
            "seconds": eval_flops / rate + 2 * batches * new * step_s,
        },
        "shortcut_audit": {"flops": audit_flops, "seconds": audit_flops / rate},
    }
    out["decode_step_s"] = step_s
    out["assumptions"] = {"peak_flops_per_s": peak_flops_per_s, "utilisation": utilisation, "bytes_per_s": bytes_per_s}
    return out


# ------------------------------------------------------------------------------ launches


# Kernel launches of one cached decode step, scoring forward and training update of the 24-layer
# Qwen2.5-0.5B structure with the lab's LoRA, counted on the CPU (tests_unit/bench_harness.py
# launch_counts: aten ops, and deterministic mode's NaN fills of new tensors), without the
# launch diet and with it (fills off, one FP32 cast per q/k/v and gate/up group, and decode steps
# replayed as CUDA graphs: the host then launches `graphed_host` ops and one replay per step,
# while the GPU runs the step's kernels back to back).
LAUNCHES = {
    "no_diet": {"decode_step": 2010 + 867, "forward": 2088 + 921, "update": 5131 + 2494},
    "diet": {"decode_step": 1938, "forward": 2016, "update": 4989, "graphed_host": 24 + 1},
}


# The lab's batch sizes and held-out counts this model reads (rlhf.flops imports no lab module:
# tests_unit/test_flops.py checks these against rlhf.evaluate, rlhf.shortcut, rlhf.judge and the corpus).
HELD_OUT_ROWS, ANSWER_BATCH = 260, 32  # the evaluation's rows and its generation batch
PAIRS, PAIR_BATCH = 180, 16  # the judge's test pairs (and each shortcut-audit set) and its scoring batch


def lab_launch_work(profile) -> dict[str, int]:
    """What `rlhf lab` with its interrupt/resume protocol asks of a GPU, counted from the profile,
    every answer at its token limit (an upper bound: an answer that ends at EOS stops earlier):

        decode_steps  PPO's rollouts (every iteration of the three legs, limit - 1 steps each)
                      and the held-out answers (2 policies x batches of 32 of 260 rows)
        forwards      PPO's reference, judge and critic scoring of each rollout; the validations
                      of SFT (per epoch of each leg) and the judge, in batches of 16; the
                      evaluation's scoring (actor, reference, judge per batch), the judge's
                      test accuracy, the shortcut audit's 5 sets, in batches of 16 pairs
        updates       SFT's and the judge's updates of each leg; PPO's 2 x (actor + critic) per
                      iteration of each leg"""
    ppo = profile.ppo
    ppo_iterations = ppo.resume_stop_iteration + (ppo.iterations - ppo.resume_stop_iteration) + ppo.iterations
    steps_per_answer = profile.limits.response_tokens - 1
    eval_batches = -(-HELD_OUT_ROWS // ANSWER_BATCH)
    pair_batches = -(-PAIRS // PAIR_BATCH)
    epoch_legs = {
        stage: 1 + (cfg.epochs - 1) + cfg.epochs for stage, cfg in (("sft", profile.sft), ("judge", profile.judge))
    }
    return {
        "decode_steps": ppo_iterations * steps_per_answer + 2 * eval_batches * steps_per_answer,
        "forwards": 3 * ppo_iterations + pair_batches * (epoch_legs["sft"] + epoch_legs["judge"])
        + 2 * eval_batches * 3 + pair_batches + 5 * pair_batches,
        "updates": 2 * profile.sft.expected_updates + 2 * profile.judge.expected_updates
        + ppo_iterations * ppo.updates_per_iteration * TRAINED_ROLES,
    }  # fmt: skip


def launch_seconds(work: dict[str, int], *, host_us: float, kernel_us: float, diet: bool) -> dict[str, float]:
    """Seconds `work` (lab_launch_work) spends launching kernels, when each launch costs the host
    `host_us` microseconds and each kernel at least `kernel_us` on the GPU:

        without the diet  every kernel launched by the host:  launches x host_us
        with the diet     forwards and updates likewise; a decode step replays its graph, so
                          it costs max(its host ops x host_us, its kernels x kernel_us)
    The arithmetic itself is not counted: at these shapes it is a few seconds (stage_costs)."""
    per = LAUNCHES["diet" if diet else "no_diet"]
    step = per["decode_step"] * host_us
    if diet:
        step = max(per["graphed_host"] * host_us, per["decode_step"] * kernel_us)
    out = {
        "decode_s": work["decode_steps"] * step / 1e6,
        "forwards_s": work["forwards"] * per["forward"] * host_us / 1e6,
        "updates_s": work["updates"] * per["update"] * host_us / 1e6,
    }
    out["total_s"] = sum(out.values())
    return out
