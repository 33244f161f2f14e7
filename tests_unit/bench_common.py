"""What the benchmark modules share (tests_unit/test_benchmarks*.py, tier `benchmark`): their
inputs (a lab Context over a copy of a finished embedded run, its roles and prompts, a fixed
rollout, the CPU's matmul peak), the checks of what each benchmark timed, the rows they report,
and the one summary of the run (SUMMARY: benchmark_summary.json and the table, written once at
the session's end). The modules import the fixtures they use from here."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import bench_harness  # the measuring harness beside this file (tests_unit/ is on sys.path: prepend mode)
import pytest
import torch

from rlhf import flops

ROOT = Path(__file__).resolve().parents[1]
RESPONSE = 64  # tokens per generated answer (the SPEC's limit)
ALL_CORES = os.cpu_count() or 2
TRL_WARMUP, TRL_TIMED = 1, 10
SUMMARY: dict = {"rows": [], "notes": [], "goals": {}}
# The last commit before generation was tuned: its rlhf/generate.py and
# rlhf/lora.py are the "before" of the before/after benchmarks.
PREVIOUS = "6347c95800da731abb68816282a7932ed8619570"


def _source_run() -> Path | None:
    cands = [os.environ.get("RLHF_BENCH_RUN")] if os.environ.get("RLHF_BENCH_RUN") else []
    cands += [ROOT / "runs" / "lab", ROOT / "runs" / "t1"]
    for c in cands:
        c = Path(c)
        if all(
            (c / p).is_file()
            for p in (
                "corpus/manifest.json",
                "base_model/config.json",
                "sft/actor.safetensors.json",
                "judge/judge.safetensors.json",
            )
        ):
            return c
    return None


@pytest.fixture(scope="module")
def bench_ctx(tmp_path_factory):
    """A lab Context over a temporary copy of a finished run's corpus, base, SFT actor and judge."""
    from rlhf import lab
    from rlhf.roles import save_role

    run = tmp_path_factory.mktemp("bench") / "run"
    src = _source_run()
    if src is not None:
        shutil.copytree(src / "corpus", run / "corpus")
        shutil.copytree(src / "base_model", run / "base_model")
        for f in ("sft/actor.safetensors", "judge/judge.safetensors"):
            (run / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / f, run / f)
            shutil.copy2(src / (f + ".json"), run / (f + ".json"))
    ctx = lab.open_context(run, "embedded")
    if src is None:  # untrained adapters, so that ppo_roles() finds its files
        save_role(ctx.role("actor"), run / "sft" / "actor.safetensors", ctx.identity(stage="sft"))
        save_role(ctx.role("judge"), run / "judge" / "judge.safetensors", ctx.identity(stage="judge"))
    ctx.bench_source = str(src) if src else "untrained adapters (no finished run found)"
    SUMMARY["source_run"] = ctx.bench_source
    assert torch.get_num_threads() == 1, "the embedded profile runs with 1 torch thread"
    return ctx


@pytest.fixture(scope="module")
def peak():
    """The CPU's dense FP32 matmul peak, measured in this run: all cores (2 threads) and 1 thread."""
    p = {
        "all_cores": bench_harness.matmul_peak(2048, repeats=10, threads=ALL_CORES),
        "one_thread": bench_harness.matmul_peak(2048, repeats=10, threads=1),
    }
    SUMMARY["matmul_peak"] = p
    return p


@pytest.fixture(scope="module")
def shape(bench_ctx):
    return flops.Shape.from_profile(bench_ctx.profile)


@pytest.fixture(scope="module")
def rank(bench_ctx):
    return bench_ctx.profile.lora.rank


@pytest.fixture(scope="module")
def prompts(bench_ctx):
    from rlhf.tokens import encode_prompt

    view = bench_ctx.corpus.learning_view()
    return [
        encode_prompt(bench_ctx.tokenizer, r["prompt"], bench_ctx.profile.limits, r["document_id"])
        for r in view.rollout_prompts()
    ]


@pytest.fixture(scope="module")
def roles(bench_ctx):
    from rlhf import lab

    return lab.ppo_roles(bench_ctx)


@pytest.fixture(scope="module")
def full_generation(bench_ctx, roles, prompts):
    """4 rollout prompts with 64 sampled response tokens each (EOS disabled), drawn by the actor."""
    from rlhf.generate import generate

    return generate(
        roles.actor.model,
        prompts[:4],
        eos_id=-1,
        pad_id=bench_ctx.pad_id,
        max_new_tokens=RESPONSE,
        generator=torch.Generator().manual_seed(7),
    )


@pytest.fixture(scope="module")
def full_batch(bench_ctx, prompts, full_generation):
    """The full-length batch of full_generation's draws."""
    from rlhf.tokens import collate

    return collate(prompts[:4], full_generation.responses, bench_ctx.pad_id)


@pytest.fixture(scope="module")
def fixed_rollout(bench_ctx, roles, prompts):
    """One real rollout (EOS ends answers, as in the lab) on which the update benchmarks run."""
    from rlhf.ppo import Prompts, rollout

    tm: dict = {}
    gen = torch.Generator().manual_seed(bench_ctx.profile.seeds.ppo_sampling)
    return rollout(roles, Prompts(prompts[:4], None), bench_ctx.tokens(), bench_ctx.profile, gen, tm)


def _print_table(tr):
    tr.write_line("")
    tr.write_sep("=", "rlhf benchmarks (embedded profile, 1 torch thread unless noted)")
    if SUMMARY["rows"]:
        tr.write_line(
            f"{'benchmark':48s} {'thr':>3s} {'median s':>9s} {'tokens/s':>10s} {'GFLOP/s':>8s} "
            f"{'util(all)':>9s} {'util(1t)':>8s}"
        )
    for r in SUMMARY["rows"]:
        tps = f"{r['tokens_per_s']:10.0f}" if r.get("tokens_per_s") else f"{'':>10s}"
        tr.write_line(
            f"{r['name']:48s} {r['torch_threads']:3d} {r['median_s']:9.4f} {tps} "
            f"{r['achieved_gflop_s']:8.2f} {r['utilisation_all_cores']:9.3f} "
            f"{r['utilisation_one_thread']:8.3f}"
        )
    if "matmul_peak" in SUMMARY:
        p = SUMMARY["matmul_peak"]
        tr.write_line(
            f"matmul peak (torch.mm 2048^2 FP32, best of 10): {p['all_cores']['gflop_s']:.1f} GFLOP/s with "
            f"{p['all_cores']['threads']} threads, {p['one_thread']['gflop_s']:.1f} GFLOP/s with 1 thread"
        )
    if "trl" in SUMMARY:
        t = SUMMARY["trl"]
        tr.write_line(
            f"PPO s/iteration ({t['timed_iterations']} timed): ours {t['ours']['mean_s']:.3f}, "
            f"TRL {t['trl']['mean_s']:.3f}, ratio ours/TRL {t['ratio_ours_over_trl']:.3f} (goal <= 0.5); "
            f"TRL without its gc.collect() calls {t['trl_without_gc_collect']['mean_s']:.3f}, ratio "
            f"{t['ratio_ours_over_trl_without_gc_collect']:.3f}"
        )
    if "legs_side_by_side" in SUMMARY:
        lg = SUMMARY["legs_side_by_side"]
        tr.write_line(
            f"SFT stage, legs sequential {lg['sequential']['stage_wall_s']:.1f} s, side by side "
            f"{lg['side-by-side']['stage_wall_s']:.1f} s: {lg['side_by_side_wall_over_sum_of_legs']:.2f} x the sum of "
            f"its legs, {lg['side_by_side_wall_over_sequential_wall']:.2f} x sequential"
        )
    for name, g in SUMMARY["goals"].items():
        tr.write_line(
            f"goal {name}: {g['goal']}; measured {g['measured']:.3f}, threshold {g['threshold']} -> "
            f"{'MET' if g['met'] else 'NOT MET'}"
        )
    for n in SUMMARY["notes"]:
        tr.write_line(n)


def _timed(fn, log: list):
    """Wrap fn so that each call appends (seconds, what fn returns) to log."""

    def run(*a, **k):
        t = time.perf_counter()
        out = fn(*a, **k)
        log.append((time.perf_counter() - t, out))
        return out

    return run


def _check_seconds(what: str, secs) -> None:
    """A timing is a measurement only when it is finite and positive."""
    secs = list(secs)
    assert secs, f"{what}: nothing was timed"
    bad = [s for s in secs if not (math.isfinite(s) and s > 0)]
    assert not bad, f"{what}: invalid timings {bad}"


def _check_finite(what: str, *values) -> None:
    """Every tensor or number given is finite (no NaN, no inf)."""
    for v in values:
        if isinstance(v, torch.Tensor):
            assert v.numel() > 0, f"{what}: empty tensor"
            assert bool(torch.isfinite(v).all()), f"{what}: non-finite values in {v}"
        else:
            assert math.isfinite(float(v)), f"{what}: {v} is not finite"


def _check_shape(what: str, t: torch.Tensor, shape) -> None:
    assert tuple(t.shape) == tuple(shape), f"{what}: shape {tuple(t.shape)}, expected {tuple(shape)}"


def _check_moved(what: str, before: dict, after: dict) -> None:
    """The learned state after the optimizer steps differs from the one before, and stays finite."""
    assert before.keys() == after.keys(), what
    _check_finite(what, *after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before), f"{what}: the optimizer steps changed nothing"


def _check_draws(what: str, got, expected) -> None:
    """Two generate() results of the same code path drew the same tokens, log-probs and ends."""
    assert got.responses == expected.responses, f"{what}: the drawn tokens differ from the unit path's"
    assert got.ended == expected.ended, f"{what}: the ends differ from the unit path's"
    assert got.logps == expected.logps, f"{what}: the behaviour log-probs differ from the unit path's"


def _check_generation(what: str, g, batch: int, vocab: int, *, new_tokens: int | None = None) -> None:
    """One Generation: batch rows, one finite non-positive log-prob per token, ids in the vocabulary."""
    assert len(g.responses) == len(g.logps) == len(g.ended) == batch, what
    for r, lp in zip(g.responses, g.logps):
        assert len(r) == len(lp) and 0 < len(r) <= RESPONSE, (what, len(r), len(lp))
        if new_tokens is not None:
            assert len(r) == new_tokens, (what, len(r))
        assert all(0 <= t < vocab for t in r), f"{what}: token id outside the vocabulary"
        assert all(math.isfinite(x) and x <= 0 for x in lp), f"{what}: log-probs {lp}"


def _check_rollout(what: str, ro) -> None:
    """A rollout's tensors: [B, R] per token, [B] per answer, all finite; log-probs <= 0."""
    mask = ro.batch.response_mask
    B, R = mask.shape
    assert len(ro.responses) == B and [len(r) for r in ro.responses] == mask.sum(-1).tolist(), what
    for k in ("logp_old", "logp_ref", "values", "rewards", "advantages", "returns"):
        _check_shape(f"{what} {k}", getattr(ro, k), (B, R))
        _check_finite(f"{what} {k}", getattr(ro, k))
    _check_shape(f"{what} score", ro.score, (B,))
    _check_finite(f"{what} score", ro.score)
    assert bool((ro.logp_old <= 0).all() and (ro.logp_ref <= 0).all()), f"{what}: positive log-probs"


def _check_update_stats(what: str, stats: dict) -> None:
    """What rlhf.ppo.ppo_update returns: finite losses and gradient norms, a clip fraction in [0, 1]."""
    _check_finite(
        what,
        *(
            stats[k]
            for k in ("policy_loss", "value_loss", "actor_grad_norm", "critic_grad_norm", "actor_lr", "critic_lr")
        ),
    )
    assert 0.0 <= stats["clip_fraction"] <= 1.0, (what, stats["clip_fraction"])
    assert stats["value_loss"] >= 0, (what, stats["value_loss"])


def _record_goal(benchmark, record_result, name: str, goal: str, measured: float, threshold: float, met: bool) -> dict:
    """Record a published goal as met or not. A missed goal is a result, not a failure; an invalid
    measurement (NaN, inf, zero or negative) is a failure."""
    assert math.isfinite(measured) and measured > 0, f"goal {name}: the measurement {measured} is invalid"
    g = {"goal": goal, "measured": round(float(measured), 6), "threshold": threshold, "met": bool(met)}
    record_result(f"goal_{name}", g)
    benchmark.extra_info[f"goal_{name}"] = g
    SUMMARY["goals"][name] = g
    return g


def _report(
    benchmark,
    record_result,
    name: str,
    log: list,
    warmup: int,
    peak: dict,
    *,
    tokens: int | None = None,
    flop: dict | None = None,
    threads: int = 1,
    extra: dict | None = None,
) -> dict:
    """Utilisation = sum of model FLOPs / sum of seconds over the timed rounds (warm-up dropped).

    `flop` is the model FLOPs of one round when every round has the same shape; otherwise the
    timed function returns its own {"model_flops": ..} and those are summed.
    """
    timed = log[warmup:] or log
    secs = [s for s, _ in timed]
    _check_seconds(name, secs)
    if flop is None:
        total = {}
        for _, out in timed:
            total = flops.add(total, {k: v for k, v in out.items() if k.endswith("flops")})
    else:
        total = {k: v * len(timed) for k, v in flop.items()}
    assert total["model_flops"] > 0, f"{name}: no model FLOPs"
    u_all = flops.utilisation(total["model_flops"], sum(secs), peak["all_cores"]["flops_per_s"])
    u_one = flops.utilisation(total["model_flops"], sum(secs), peak["one_thread"]["flops_per_s"])
    _check_finite(name, u_all["utilisation"], u_one["utilisation"])
    row = {
        "name": name,
        "rounds": len(secs),
        "median_s": statistics.median(secs),
        "min_s": min(secs),
        "mean_s": statistics.fmean(secs),
        "torch_threads": threads,
        "model_flops_per_round": total["model_flops"] / len(secs),
        "attention_flops_per_round": total.get("attention_flops", 0) / len(secs),
        "achieved_gflop_s": u_all["achieved_gflop_s"],
        "utilisation_all_cores": u_all["utilisation"],
        "utilisation_one_thread": u_one["utilisation"],
        "peak_gflop_s_all_cores": u_all["peak_gflop_s"],
        "peak_gflop_s_one_thread": u_one["peak_gflop_s"],
    }
    if tokens:
        row["tokens_per_round"] = tokens
        row["tokens_per_s"] = tokens / row["median_s"]
        row["tokens_per_s_best"] = tokens / row["min_s"]
    row.update(extra or {})
    benchmark.extra_info.update(row)
    record_result(name, {k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()})
    SUMMARY["rows"].append(row)
    return row


@pytest.fixture(scope="module")
def previous(tmp_path_factory):
    """rlhf/generate.py and rlhf/lora.py of commit PREVIOUS as throw-away modules.

    `previous.active()` swaps them in for a block: rlhf.generate's `generate` and LoRALinear.forward
    (every adapted projection of every role, so updates and scoring run the old forward too).
    """
    import types

    from rlhf.lora import LoRALinear

    folder = tmp_path_factory.mktemp("previous")
    mods = {}
    for name in ("generate", "lora"):
        out = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{PREVIOUS}:rlhf/{name}.py"], capture_output=True, text=True
        )
        if out.returncode != 0:
            pytest.fail(
                f"the before/after benchmarks read commit {PREVIOUS[:12]} with git and could not: "
                f"{out.stderr.strip()} (a clone with its history is needed)",
                pytrace=False,
            )
        path = folder / f"previous_{name}.py"
        path.write_text(out.stdout)
        spec = importlib.util.spec_from_file_location(f"rlhf_previous_{name}", path)
        mods[name] = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mods[name]  # dataclasses look their module up while it executes
        spec.loader.exec_module(mods[name])

    # The one change since PREVIOUS that moves draws: only real tokens are drawn
    # (rlhf.scoring.real_token_logits). The previous code gets it too, applied to the logits its
    # _next_token receives, so both sides draw alike and only their speed is compared.
    # The previous generate logs no entropies (the rollout now keeps them for the history): they
    # are computed here from the logits its _next_token receives, by the current formula, so that
    # its Generation has what a rollout reads. Draws and log-probs stay the previous code's.
    import torch.nn.functional as F

    import rlhf.generate as current_generate
    from rlhf.generate import Generation
    from rlhf.scoring import real_token_logits, token_count

    previous_next_token = mods["generate"]._next_token
    n_tokens: dict = {}
    step_entropies: list = []

    def masked_next_token(logits, greedy, temperature, *args):
        masked = real_token_logits(logits.float(), n_tokens["n"])
        if not greedy:
            tempered = masked if temperature == 1.0 else masked / temperature
            step_entropies.append(torch.special.entr(F.log_softmax(tempered, dim=-1).exp()).sum(-1))
        return previous_next_token(masked, greedy, temperature, *args)

    mods["generate"]._next_token = masked_next_token

    def previous_generate(model, *args, last_logits_only: bool = False, **kwargs):
        # The previous generate has no last_logits_only (rlhf.ppo.rollout passes the profile's
        # value); False, the embedded profile's, is what it always did: every column projected.
        if last_logits_only:
            pytest.fail("the previous generate cannot project only the last column", pytrace=False)
        n_tokens["n"] = token_count(model)
        step_entropies.clear()
        g = mods["generate"].generate(model, *args, **kwargs)
        ent = torch.stack(step_entropies, 1).tolist() if step_entropies else None
        rows = [] if ent is None else [ent[b][: len(r)] for b, r in enumerate(g.responses)]
        return Generation(g.responses, g.logps, g.ended, rows)

    @contextlib.contextmanager
    def active():
        saved = current_generate.generate, LoRALinear.forward
        current_generate.generate, LoRALinear.forward = previous_generate, mods["lora"].LoRALinear.forward
        try:
            yield
        finally:
            current_generate.generate, LoRALinear.forward = saved

    yield types.SimpleNamespace(generate=previous_generate, active=active)
    for name in mods:
        sys.modules.pop(f"rlhf_previous_{name}", None)


def _ppo_optimizers(roles, prof) -> dict:
    """The actor's and the critic's AdamW as rlhf.ppo.train_ppo builds them (the profile's [ppo] rates)."""
    from rlhf.optim import adamw

    lr = {"actor": prof.ppo.actor_lr, "critic": prof.ppo.critic_lr}
    return {
        k: adamw(
            [p for p in roles.by_kind()[k].learned_parameters() if p.requires_grad], lr[k], prof.optim.weight_decay
        )
        for k in lr
    }


def _first_draws(bench_ctx, prompts, actor):
    """What the first PPO iteration must draw: the prompts the data-order seed picks first,
    sampled by the unit path (rlhf.generate.generate) with the ppo_sampling seed."""
    from rlhf.generate import generate
    from rlhf.ppo import PromptSampler

    prof = bench_ctx.profile
    ps = [prompts[i] for i in PromptSampler(len(prompts), prof.seeds.data_order).draw(prof.ppo.prompts_per_iteration)]
    return generate(
        actor.model,
        ps,
        eos_id=bench_ctx.eos_id,
        pad_id=bench_ctx.pad_id,
        max_new_tokens=prof.limits.response_tokens,
        temperature=prof.ppo.temperature,
        generator=torch.Generator().manual_seed(prof.seeds.ppo_sampling),
    )


@pytest.fixture(scope="module", autouse=True)
def one_benchmark_process(request):
    """Every benchmark module: one process (no xdist worker), and what the summary says of the CPU
    and of an untimed run. The summary is written and printed once, at the session's end (finish)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.fail(
            "benchmarks must run in one process (pytest-benchmark switches itself off under xdist, and two "
            "workers would share the 2 cores): pytest --benchmark (timed) or pytest --benchmark-smoke (once, untimed)",
            pytrace=False,
        )
    from conftest import cpu_and_dtype

    SUMMARY["cpu"] = cpu_and_dtype()  # the flags that decide kernels and the dtype a BF16 profile gets here
    if not _timed_run(request.config):  # each benchmark ran once: the figures below are no measurement
        SUMMARY["untimed_smoke_run"] = "each benchmark ran once (--benchmark-disable): no figure here is a measurement"


def _timed_run(config) -> bool:
    session = getattr(config, "_benchmarksession", None)  # pytest-benchmark's own verdict
    return not (session.disabled if session is not None else config.option.benchmark_disable)


def finish(config, tr) -> None:
    """At the session's end (conftest.pytest_terminal_summary, when a benchmark module ran):
    benchmark_summary.json in the reports folder, and the table on a timed run."""
    reports = Path(getattr(config, "_rlhf_reports", "reports"))
    reports.mkdir(parents=True, exist_ok=True)
    (reports / "benchmark_summary.json").write_text(json.dumps(SUMMARY, indent=1, sort_keys=True))
    if (
        not _timed_run(config)
        or tr is None
        or not (SUMMARY["rows"] or SUMMARY["notes"] or SUMMARY["goals"] or "trl" in SUMMARY)
    ):
        return
    _print_table(tr)
