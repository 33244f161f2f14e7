"""The benchmark harness: measurements only the benchmarks (tests_unit/test_benchmarks*.py) use.

Not a test module (no tests are collected from it). The FLOP and memory *formulas* stay in
rlhf.flops, which imports nothing from rlhf; what is here measures:

* `matmul_peak`: the CPU's dense-matmul FLOP/s (torch.mm, best of N), the peak the
  utilisations are quoted against;
* `peak_rss_mib` and `measure_stage_rss`: the peak RSS of one stage of the embedded profile,
  meant to run alone in a fresh process. test_benchmarks_lab.py runs it as
  `python -c "import sys; sys.path.insert(0, HARNESS_DIR); from bench_harness import measure_stage_rss; ..."`.
  Importing this module imports `rlhf` first, so that fresh process pins its CPU arithmetic
  before torch is loaded, as the lab does (a late pin would change the run's identity).

Import it from a test module of this folder as `import bench_harness` (pytest's default
`prepend` import mode puts tests_unit/ on sys.path, since the folder is not a package).
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

import rlhf  # noqa: F401 - first: pins the CPU arithmetic (rlhf.runtime) before anything here imports torch

# isort: split


# Qwen2.5-0.5B's tokenizer size (len(tokenizer)): its 151,936 vocabulary rows past id 151,664 are
# padding, never sampled or scored (rlhf.scoring.real_token_logits).
QWEN_TOKENS = 151_665

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
    flops = 2 * n**3
    return {
        "n": n,
        "dtype": dtype,
        "threads": used,
        "repeats": repeats,
        "best_seconds": best,
        "flops_per_s": flops / best,
        "gflop_s": flops / best / 1e9,
    }


# ------------------------------------------------------------------------------ peak RSS


def peak_rss_mib() -> float:
    """Peak RSS of this process image: VmHWM from /proc/self/status (reset by exec), else ru_maxrss.

    ru_maxrss alone is wrong for a freshly started child: Linux carries the parent's high-water
    mark across fork + exec, so a child of a 3 GB parent reports 3 GB.
    """
    status = Path("/proc/self/status")  # Linux; elsewhere ru_maxrss is the only figure
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_stage_rss(stage: str, run_dir: str, updates: int = 5, iterations: int = 3) -> dict:
    """Peak RSS of one stage of the embedded profile, meant to run alone in a fresh process.

    Stages: "import" (context opened, no role: the floor of torch + transformers + corpus),
    "sft" (actor role, `updates` SFT updates, the validation pass), "judge" (judge role,
    `updates` Bradley-Terry updates, the validation pass), "ppo" (the four roles from the run's
    SFT and judge files, `iterations` PPO iterations). `run_dir` holds corpus/, base_model/ and,
    for "ppo", sft/actor.safetensors and judge/judge.safetensors.
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
        train = encode_demonstrations(view.demonstrations("train"), ctx.tokenizer, ctx.eos_id, prof.limits)
        valid = encode_demonstrations(view.pairs("validation"), ctx.tokenizer, ctx.eos_id, prof.limits, "chosen")
        params = [p for p in actor.learned_parameters() if p.requires_grad]
        opt = adamw(params, prof.sft.lr, prof.optim.weight_decay)
        k = prof.sft.examples_per_update
        for u in range(updates):
            loss, _ = sft_loss(actor.model, train[u * k : (u + 1) * k], ctx.pad_id)
            optimizer_step(opt, params, loss, prof.sft.lr, 1.0, "rss sft")
        evaluate_loss(actor.model, valid, ctx.pad_id)
    elif stage == "judge":
        from rlhf.judge import encode_pairs, evaluate_pairs, pair_scores
        from rlhf.optim import adamw, optimizer_step
        from rlhf.ppo_math import bradley_terry_loss

        judge = ctx.role("judge")
        train = encode_pairs(view.pairs("train"), ctx.tokenizer, ctx.eos_id, prof.limits)
        valid = encode_pairs(view.pairs("validation"), ctx.tokenizer, ctx.eos_id, prof.limits)
        params = [p for p in judge.learned_parameters() if p.requires_grad]
        opt = adamw(params, prof.judge.lr, prof.optim.weight_decay)
        k = prof.judge.pairs_per_update
        for u in range(updates):
            c, r = pair_scores(judge, train[u * k : (u + 1) * k], ctx.pad_id)
            optimizer_step(opt, params, bradley_terry_loss(c, r), prof.judge.lr, 1.0, "rss judge")
        evaluate_pairs(judge, valid, ctx.pad_id)
    elif stage == "ppo":
        from rlhf.config import override
        from rlhf.ppo import train_ppo

        prof = override(prof, {("ppo", "iterations"): iterations})
        roles = lab.ppo_roles(ctx)
        train_ppo(roles, view, ctx.tokens(), prof)
    elif stage != "import":
        raise ValueError(f"unknown stage {stage!r}")
    return {
        "stage": stage,
        "peak_rss_mib": peak_rss_mib(),
        "seconds": time.perf_counter() - t0,
        "torch_threads": torch.get_num_threads(),
        "updates": updates if stage in ("sft", "judge") else None,
        "iterations": iterations if stage == "ppo" else None,
    }


# ------------------------------------------------------------------------------ BF16 against float32


def dtype_scoring(layers: int = 2, rounds: int = 2) -> dict:
    """Teacher-forced scoring (rlhf.scoring.response_logprobs) of Qwen2.5-0.5B's full width with
    `layers` of its 24 layers (random weights rounded to BF16, as stored), 4 x 256 tokens (192
    prompt + 64 response), all cores, in float32 and in bfloat16: the best of `rounds` rounds
    each, the two dtypes interleaved round by round so that both see the same machine. Meant to
    run in a fresh process with the pin released, as a BF16 profile runs on the CPU (the pin
    caps oneDNN at AVX2, which has no BF16 instructions). Returns GFLOP/s of each, their ratio,
    the CPU's flags that decide, and the dtype `rlhf.runtime.choose_dtype` picks here."""
    import os

    import torch
    from transformers import Qwen2ForCausalLM

    from rlhf import flops, runtime
    from rlhf.config import load_profile, override
    from rlhf.models import qwen2_config
    from rlhf.scoring import response_logprobs, set_token_count
    from rlhf.tokens import collate

    prof = override(load_profile("qwen2.5-0.5b"), {("model", "num_hidden_layers"): layers})
    config = qwen2_config(prof)
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    bf16 = Qwen2ForCausalLM(config).to(torch.bfloat16)  # the weights as a checkpoint holds them
    fp32 = Qwen2ForCausalLM(config)
    fp32.load_state_dict({k: v.float() for k, v in bf16.state_dict().items()})  # widened exactly
    models = {"float32": fp32, "bfloat16": bf16}
    for m in models.values():
        m.eval().requires_grad_(False)
        set_token_count(m, QWEN_TOKENS)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 151000, (4, 256), generator=g).tolist()
    batch = collate([r[:192] for r in ids], [r[192:] for r in ids], pad_id=151643)
    best = {k: float("inf") for k in models}
    logp = {}
    with torch.no_grad():
        for _ in range(rounds):
            for name, model in models.items():
                t = time.perf_counter()
                logp[name] = response_logprobs(model, batch)
                best[name] = min(best[name], time.perf_counter() - t)
    shape = flops.Shape.from_config(config)
    model_flops = flops.scoring_flops(shape, batch, 0)["model_flops"]
    flags = runtime.cpu_flags() or frozenset()
    return {
        "layers": layers,
        "tokens": 4 * 256,
        "model_flops": model_flops,
        "rounds": rounds,
        "threads": torch.get_num_threads(),
        "best_seconds": best,
        "gflop_s": {k: model_flops / s / 1e9 for k, s in best.items()},
        "bf16_over_fp32": best["float32"] / best["bfloat16"],
        "max_abs_logp_difference": float((logp["float32"] - logp["bfloat16"]).abs().max()),
        "finite": all(bool(torch.isfinite(v).all()) for v in logp.values()),
        "cpu_flags": sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c"))),
        "dtype_chosen": runtime.choose_dtype("bfloat16", "cpu"),
        "arithmetic": runtime.describe()["note"],
    }


# ------------------------------------------------------------------------------ launches per step


def launch_counts(layers: int, *, diet: bool) -> dict:
    """What the lab's hot paths ask of a GPU, counted on the CPU for a Qwen2 of the real structure
    (14 query heads, 2 KV heads, tied embeddings, a BF16 base, the lab's LoRA on the 7
    projections; widths shrunk: op counts do not depend on width) with `layers` layers:

        ops     aten ops below autograd, views and metadata left out: about one kernel launch each
        fills   the NaN fills deterministic mode adds to new tensors (the profiler's aten::fill_
                called from aten::empty / empty_strided)

    per cached decode step (generating N + 1 tokens minus generating N), per scoring forward
    (rlhf.scoring.response_logprobs, 8 rows) and per training update (forward, backward, clip,
    AdamW). `diet=False` is the path without the launch diet: fills on, each adapter casting its
    own input; `diet=True` the CUDA profiles' path: fills off (rlhf.runtime.configure_determinism),
    one FP32 cast per q/k/v and gate/up group (rlhf.lora.SharedCast). With `diet`, the decode step
    is also counted as it runs where graphs apply (rlhf.generate.GraphedDecoder, its 'replay'
    run eagerly here): `graphed_outside` ops issued by the host outside the captured step and
    `graph_replays` per step (one launch of the whole step on a GPU)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlhf import generate as gen_module
    from rlhf.lora import inject_lora, lora_modules, lora_parameters
    from rlhf.masks import masked_sum
    from rlhf.optim import adamw
    from rlhf.scoring import response_logprobs, set_token_count
    from rlhf.tokens import collate

    not_kernels = {
        "view", "_unsafe_view", "reshape", "transpose", "t", "expand", "slice", "select", "unsqueeze",
        "squeeze", "as_strided", "permute", "detach", "alias", "_reshape_alias", "unbind", "split",
        "split_with_sizes", "chunk", "narrow", "view_as", "expand_as", "lift_fresh", "resolve_conj",
        "resolve_neg", "empty", "empty_like", "empty_strided", "_local_scalar_dense", "is_same_size",
        "set_", "_has_compatible_shallow_copy_type", "item", "diagonal", "unflatten", "flatten",
        "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_nonzero", "dim", "size",
        "stride", "new_empty", "new_empty_strided",
    }  # fmt: skip

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n, self.paused = 0, False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not self.paused and func.__name__.split(".")[0] not in not_kernels:
                self.n += 1
            return func(*args, **(kwargs or {}))

    def ops(fn) -> int:
        with Ops() as mode:
            fn()
        return mode.n

    config = Qwen2Config(
        hidden_size=112, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=True, max_position_embeddings=512,
        rope_theta=1e6, rms_norm_eps=1e-6, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval().requires_grad_(False)
    set_token_count(model, 1000)
    inject_lora(model, rank=8, alpha=16, seed=49)
    if not diet:
        for adapter in lora_modules(model).values():
            adapter.shared_cast = None
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 1000, (52 - 3 * b,), generator=g).tolist() for b in range(4)]
    answers = [torch.randint(2, 1000, (10 + i,), generator=g).tolist() + [1] for i in range(8)]
    batch = collate([torch.randint(2, 1000, (52,), generator=g).tolist() for _ in range(8)], answers, 0)

    def decode(n: int):
        start = gen_module.prefill(model, prompts, pad_id=0, max_new_tokens=n, last_logits_only=True)
        return lambda: gen_module.generate(
            model, prompts, eos_id=-5, pad_id=0, max_new_tokens=n, last_logits_only=True, start=start,
            generator=torch.Generator().manual_seed(3),
        )  # fmt: skip

    def forward():
        with torch.no_grad():
            response_logprobs(model, batch)

    params = lora_parameters(model)
    optimizer = adamw(params, 1e-5, 0.01)

    def update():
        logp = response_logprobs(model, batch)
        loss = -masked_sum(logp, batch.response_mask).sum() / batch.response_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    update()  # the optimizer's state exists before counting
    deterministic, fill = (
        torch.are_deterministic_algorithms_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    out: dict = {}
    try:
        for name, counter, det in (("ops", ops, False), ("fills", deterministic_fills, True)):
            torch.use_deterministic_algorithms(det)
            torch.utils.deterministic.fill_uninitialized_memory = not diet
            out[name] = {
                "decode_step": counter(decode(10)) - counter(decode(9)),
                "forward": counter(forward),
                "update": counter(update),
            }
        torch.use_deterministic_algorithms(False)
        if diet:
            out["graphed"] = _graphed_decode_counts(model, decode, Ops, gen_module)
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.utils.deterministic.fill_uninitialized_memory = fill
    return out


def deterministic_fills(fn) -> int:
    """The NaN fills deterministic mode adds to new tensors while fn() runs: the profiler's
    aten::fill_ events called from aten::empty / aten::empty_strided (a kernel launch each on a GPU)."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(
        1
        for e in prof.events()
        if e.name == "aten::fill_"
        and e.cpu_parent is not None
        and e.cpu_parent.name in ("aten::empty", "aten::empty_strided")
    )


def _graphed_decode_counts(model, decode, Ops, gen_module) -> dict:
    """Per decode step where graphs apply: host ops outside the captured step, and replays."""
    from unittest import mock

    from rlhf import costs

    counts = {}
    with mock.patch.object(gen_module, "graphs_apply", lambda model, use_cache: use_cache):
        for n in (9, 10):
            run = decode(n)
            run()  # the step object exists (captured, on a GPU) before counting
            step_graph = next(iter(model._rlhf_decode_graphs.values()))
            inner = step_graph.replay
            mode = Ops()

            def paused_replay():
                mode.paused = True
                try:
                    inner()
                finally:
                    mode.paused = False

            step_graph.replay = paused_replay
            start = costs.snapshot()
            with mode:
                run()
            step_graph.replay = inner
            counts[n] = (mode.n, costs.since(start)["graph_replays"])
    return {"outside_ops": counts[10][0] - counts[9][0], "graph_replays": counts[10][1] - counts[9][1]}


def launches_at(layers: int, one: dict, two: dict) -> dict:
    """Counts of a `layers`-layer model from those of 1 and 2 layers: fixed + layers x per layer."""
    if isinstance(one, dict):
        return {k: launches_at(layers, one[k], two[k]) for k in one}
    return 2 * one - two + layers * (two - one)
