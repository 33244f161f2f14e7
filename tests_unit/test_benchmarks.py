"""Benchmarks of the embedded profile: tier `benchmark`.

Measured with `pytest --benchmark` (conftest.py: `-m benchmark`, one process, pytest-benchmark's
JSON in reports/benchmark/benchmark.json). CI runs each benchmark once, untimed, after the unit
tier: `pytest --benchmark-smoke` (pytest-benchmark's --benchmark-disable; reports in
reports/benchmark-smoke/), so that a benchmark that no longer runs fails CI; no timing is
asserted or kept there.

What is measured (each in its own test):
  * generation tokens/s with and without the KV cache, batch 1 and 4 (64 tokens, EOS disabled
    so every round draws exactly 64 tokens);
  * before/after in one run: the generation and the LoRA forward of commit PREVIOUS (read with
    `git show`) against the working tree's, rounds interleaved, batch 1 and 4 with the KV cache,
    and a few whole PPO iterations; both must give bit-identical draws, log-probs and states;
  * teacher-forced scoring (rlhf.scoring.response_logprobs), one SFT update, one judge update,
    one PPO actor+critic update (rlhf.ppo.ppo_update), one whole PPO iteration (rollout + 2 updates);
  * the CPU's dense-matmul peak (torch.mm 2048 x 2048 FP32, best of N) with 2 threads (all
    cores) and with 1 thread; every phase's model FLOPs (rlhf.flops) and its utilisation;
  * teacher-forced scoring of the full Qwen2.5-0.5B shape, random weights, FP32, 4 x 256 tokens,
    with 2 threads (all cores);
  * TRL's PPO (trl.experimental.ppo.PPOTrainer, trl==1.12.0: the `bench` extra, which
    setup.sh installs) side by side with ours on the same embedded roles: seconds per
    iteration and the ratio, with and without TRL's gc.collect() calls;
  * peak RSS per stage, each stage in its own process, and the qwen2.5-0.5b memory estimate;
  * the embedded SFT stage with its protocol's legs one after the other and side by side (the
    continuous leg in a second process, rlhf.legs): the stage's wall time over the sum of its legs.

The embedded phases run with 1 torch thread (the profile's setting; rlhf.runtime.configure_torch).
Only the matmul peak and the full-shape scoring use 2 threads.

Inputs: the SFT actor and the judge of a finished embedded run, copied to a temporary folder:
$RLHF_BENCH_RUN, else runs/lab, else runs/t1. Without one, untrained adapters are used (the
timings of the shapes stay meaningful; PPO response lengths differ) and the JSON says so.

Every benchmark also checks what it timed, after the timed rounds (nothing is added to them):
finite losses and log-probs, the [B, R] shapes, the same draws as a fresh, untimed call of the
same code path with the same generator seed, optimizer steps that moved the parameters,
positive finite timings. A wrong result fails the test; a published goal that is missed does
not (it is recorded as met or not under `goal_<name>` in results.json, benchmark_summary.json
and the table), but an invalid measurement of it (NaN, zero time) does.

Bit-for-bit checks: a timed round against a fresh call of the same code path (the same kernels
on the same operands in one process give the same bits on any CPU). Two code paths are compared
bit for bit only in the before/after benchmarks, and there the equality holds by construction
on every CPU: the tuned code feeds the same kernels the same operands (equal integer ids, masks
and positions; the prepared SDPA mask equals transformers' own, tested in test_training.py;
log_softmax makes its input contiguous either way), and its only arithmetic changes are exact
in IEEE 754 (x / 1.0 skipped, a power-of-two LoRA scale folded into the add: rlhf.lora._scaled_sum).
Whether the cached and the uncached generation agree is a property of the arithmetic, not of a
benchmark: tests_unit/test_training.py checks it, within its stated FP32 bound.

Numbers go to pytest-benchmark's JSON (extra_info: tokens/s, FLOPs, utilisation), to
results.json through `record_result`, and to benchmark_summary.json in the reports folder;
a table is printed at the end of the module.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from bench_common import (  # noqa: F401 - fixtures are used by name
    ALL_CORES,
    PREVIOUS,
    RESPONSE,
    SUMMARY,
    _check_draws,
    _check_finite,
    _check_generation,
    _check_moved,
    _check_rollout,
    _check_seconds,
    _check_update_stats,
    _first_draws,
    _ppo_optimizers,
    _report,
    _timed,
    bench_ctx,
    one_benchmark_process,
    peak,
    previous,
    prompts,
    rank,
    roles,
    shape,
)

from rlhf import flops

pytestmark = pytest.mark.benchmark


def test_cpu_matmul_peak(benchmark, record_result, peak):
    """torch.mm of two 2048 x 2048 FP32 matrices with all cores; the peak the utilisations use."""
    torch.set_num_threads(ALL_CORES)
    try:
        a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
        out = torch.empty(2048, 2048)
        log: list = []
        benchmark.pedantic(_timed(lambda: torch.mm(a, b, out=out), log), rounds=10, warmup_rounds=1, iterations=1)
        expected = torch.mm(a, b)  # untimed, same threads: what the timed product must hold
    finally:
        torch.set_num_threads(1)
    _check_finite("matmul", out)
    assert torch.equal(out, expected), "the timed torch.mm did not compute a @ b"
    for k in ("all_cores", "one_thread"):
        _check_seconds(f"matmul peak {k}", [peak[k]["best_seconds"]])
        _check_finite(f"matmul peak {k}", peak[k]["gflop_s"])
    assert peak["all_cores"]["threads"] == ALL_CORES and peak["one_thread"]["threads"] == 1, peak
    _report(
        benchmark,
        record_result,
        "cpu_matmul_2048_fp32_all_cores",
        log,
        1,
        peak,
        flop={"model_flops": 2 * 2048**3},
        threads=ALL_CORES,
        extra={"peak_all_cores": peak["all_cores"], "peak_one_thread": peak["one_thread"]},
    )
    assert peak["all_cores"]["gflop_s"] > 0 and peak["one_thread"]["gflop_s"] > 0


def _fixed_draw(generate, model, prompts, pad_id: int, **kwargs):
    """`generate` of RESPONSE new tokens with EOS off (eos_id=-1: every row runs to the end),
    sampled from the benchmarks' fixed seed 11: what every timed and checking round draws."""
    return generate(
        model,
        prompts,
        eos_id=-1,
        pad_id=pad_id,
        max_new_tokens=RESPONSE,
        generator=torch.Generator().manual_seed(11),
        **kwargs,
    )


@pytest.mark.parametrize("use_cache", [True, False], ids=["kv_cache", "no_cache"])
@pytest.mark.parametrize("batch", [1, 4])
def test_generation_tokens_per_second(
    benchmark, record_result, bench_ctx, roles, prompts, peak, shape, rank, use_cache, batch
):
    from rlhf.generate import generate

    ps = prompts[:batch]
    model = roles.actor.model
    log: list = []

    def once():
        g = _fixed_draw(generate, model, ps, bench_ctx.pad_id, use_cache=use_cache)
        assert all(len(r) == RESPONSE for r in g.responses)
        return g

    benchmark.pedantic(_timed(once, log), rounds=5 if use_cache else 3, warmup_rounds=1, iterations=1)
    # Untimed: a fresh call of the same path (same cache setting, same seed) draws what every timed
    # round drew, bit for bit (one code path on one machine). Whether the cached and the uncached
    # paths agree is a property of the arithmetic, tested in tests_unit/test_training.py.
    expected = _fixed_draw(generate, model, ps, bench_ctx.pad_id, use_cache=use_cache)
    _check_generation("unit path", expected, batch, model.config.vocab_size, new_tokens=RESPONSE)
    for i, (_, g) in enumerate(log):
        _check_generation(f"round {i}", g, batch, model.config.vocab_size, new_tokens=RESPONSE)
        _check_draws(f"round {i}", g, expected)
    prompt_len = max(len(p) for p in ps)
    f = flops.generation_flops(shape, batch, prompt_len, RESPONSE, use_cache=use_cache, lora_rank=rank)
    _report(
        benchmark,
        record_result,
        f"generation_{'kv_cache' if use_cache else 'no_cache'}_batch{batch}",
        log,
        1,
        peak,
        tokens=batch * RESPONSE,
        flop={k: v for k, v in f.items() if k.endswith("flops")},
        extra={"batch": batch, "prompt_tokens": prompt_len, "new_tokens": RESPONSE, "use_cache": use_cache},
    )


def _draws(g) -> tuple:
    return g.responses, g.logps, g.ended


def _previous_and_current(previous, fn) -> tuple:
    """fn(generate) run with the previous code and with the current code: (previous, current)."""
    from rlhf.generate import generate

    with previous.active():
        before = fn(previous.generate)
    return before, fn(generate)


@pytest.mark.parametrize("batch", [1, 4])
def test_generation_before_after(
    benchmark, record_result, bench_ctx, roles, prompts, peak, shape, rank, previous, batch
):
    """Generation with the KV cache, 64 tokens, commit PREVIOUS vs the working tree in one process,
    rounds interleaved (previous, current, previous, ...); every round's draws must be identical."""
    ps = prompts[:batch]
    model = roles.actor.model
    logs: dict = {"previous": [], "current": []}

    def draw(generate):
        t = time.perf_counter()
        g = _fixed_draw(generate, model, ps, bench_ctx.pad_id)
        return time.perf_counter() - t, _draws(g)

    def both():
        before, after = _previous_and_current(previous, draw)
        assert before[1] == after[1], "the current generation no longer draws what the previous one drew"
        logs["previous"].append(before)
        logs["current"].append(after)

    benchmark.pedantic(both, rounds=7, warmup_rounds=1, iterations=1)
    # Untimed: every timed round (previous and current) drew what a fresh call of the unit path draws.
    from rlhf.generate import generate as unit_generate

    expected = _fixed_draw(unit_generate, model, ps, bench_ctx.pad_id)
    _check_generation("unit path", expected, batch, model.config.vocab_size, new_tokens=RESPONSE)
    for kind in ("previous", "current"):
        assert logs[kind], kind
        for i, (_, d) in enumerate(logs[kind]):
            assert d == _draws(expected), f"{kind} round {i}: the draws differ from the unit path's"
    # EOS on, sampled and greedy, with and without the cache: the same draws too (not timed)
    for greedy, use_cache in ((False, True), (True, True), (False, False)):
        before, after = _previous_and_current(
            previous,
            lambda generate: _draws(
                generate(
                    model,
                    ps,
                    eos_id=bench_ctx.eos_id,
                    pad_id=bench_ctx.pad_id,
                    max_new_tokens=RESPONSE,
                    greedy=greedy,
                    generator=torch.Generator().manual_seed(12),
                    use_cache=use_cache,
                )
            ),
        )
        assert before == after, (greedy, use_cache)
    f = flops.generation_flops(shape, batch, max(len(p) for p in ps), RESPONSE, use_cache=True, lora_rank=rank)
    flop = {k: v for k, v in f.items() if k.endswith("flops")}
    extra = {"batch": batch, "new_tokens": RESPONSE, "use_cache": True, "previous_commit": PREVIOUS}
    old = _report(
        benchmark,
        record_result,
        f"generation_kv_cache_batch{batch}_previous",
        logs["previous"],
        1,
        peak,
        tokens=batch * RESPONSE,
        flop=flop,
        extra=extra,
    )
    new = _report(
        benchmark,
        record_result,
        f"generation_kv_cache_batch{batch}_current",
        logs["current"],
        1,
        peak,
        tokens=batch * RESPONSE,
        flop=flop,
        extra=extra,
    )
    speedup = old["median_s"] / new["median_s"]
    benchmark.extra_info["speedup_over_previous"] = new["speedup_over_previous"] = speedup
    record_result(f"generation_kv_cache_batch{batch}_speedup_over_previous", round(speedup, 4))
    SUMMARY.setdefault("before_after", {})[f"generation_kv_cache_batch{batch}"] = {
        "previous_median_s": old["median_s"],
        "current_median_s": new["median_s"],
        "speedup": speedup,
        "previous_tokens_per_s": old["tokens_per_s"],
        "current_tokens_per_s": new["tokens_per_s"],
        "identical_draws": True,
        "previous_commit": PREVIOUS,
    }
    SUMMARY["notes"].append(
        f"before/after generation, KV cache, batch {batch}: {old['tokens_per_s']:.0f} -> "
        f"{new['tokens_per_s']:.0f} tokens/s (x{speedup:.2f}, medians of {new['rounds']} interleaved "
        f"rounds; commit {PREVIOUS[:7]} vs working tree), draws bit-identical"
    )


def _ppo_trainer(bench_ctx, prompts):
    """Fresh roles, optimizers, prompt sampler and sampling generator, as rlhf.ppo.train_ppo sets
    them up; returns (roles, iteration(it) -> seconds of that whole iteration (rollout + updates),
    record: one (rollout, [ppo_update results]) per iteration, for the checks after timing)."""
    from rlhf import lab
    from rlhf.ppo import Prompts, PromptSampler, ppo_update, rollout

    prof = bench_ctx.profile
    cfg = prof.ppo
    roles = lab.ppo_roles(bench_ctx)
    optimizers = _ppo_optimizers(roles, prof)
    sampler = PromptSampler(len(prompts), prof.seeds.data_order)
    gen = torch.Generator().manual_seed(prof.seeds.ppo_sampling)
    updates = cfg.updates_per_iteration
    record: list = []

    def iteration(it: int) -> float:
        t = time.perf_counter()
        ps = [prompts[i] for i in sampler.draw(cfg.prompts_per_iteration)]
        ro = rollout(roles, Prompts(ps, None), bench_ctx.tokens(), prof, gen, {})
        stats = [
            ppo_update(roles, optimizers, ro, prof, it * updates + u, cfg.iterations * updates, "bench", {})
            for u in range(updates)
        ]
        seconds = time.perf_counter() - t
        record.append((ro, stats))
        return seconds

    return roles, iteration, record


def test_ppo_iterations_before_after(benchmark, record_result, bench_ctx, prompts, previous):
    """Whole PPO iterations, commit PREVIOUS vs the working tree: two trainers from the same start
    run iteration i in turn (previous, current, previous, ...), so each pair has the same prompts
    and shapes; after 1 warm-up + 10 timed rounds their adapters and heads must be bit-identical."""
    trainers = {
        "previous": _ppo_trainer(bench_ctx, prompts),
        "current": _ppo_trainer(bench_ctx, prompts),
    }
    start = {kind: trainers["current"][0].by_kind()[kind].learned_state() for kind in ("actor", "critic")}
    first = _first_draws(bench_ctx, prompts, trainers["current"][0].actor)  # untimed, before any update
    seconds: dict = {"previous": [], "current": []}
    rounds = iter(range(10**6))

    def one_round():
        it = next(rounds)
        with previous.active():
            seconds["previous"].append(trainers["previous"][1](it))
        seconds["current"].append(trainers["current"][1](it))

    benchmark.pedantic(one_round, rounds=10, warmup_rounds=1, iterations=1)
    for kind in ("actor", "critic"):
        before, after = (trainers[k][0].by_kind()[kind].learned_state() for k in ("previous", "current"))
        assert all(torch.equal(before[n], after[n]) for n in before), f"{kind}: the PPO states parted"
        _check_moved(f"PPO {kind}", start[kind], after)
    records = {k: trainers[k][2] for k in ("previous", "current")}
    assert len(records["previous"]) == len(records["current"]) == len(seconds["current"]) >= 1
    for k in ("previous", "current"):
        _check_seconds(f"{k} PPO iterations", seconds[k])
        for it, (ro, stats) in enumerate(records[k]):
            _check_rollout(f"{k} iteration {it}", ro)
            for u, st in enumerate(stats):
                _check_update_stats(f"{k} iteration {it} update {u}", st)
    for it, (a, b) in enumerate(zip(records["previous"], records["current"])):
        assert a[0].responses == b[0].responses, f"iteration {it}: previous and current drew differently"
        assert a[1] == b[1], f"iteration {it}: previous and current updates differ"
    ro0 = records["current"][0][0]
    assert ro0.responses == first.responses and ro0.ended == first.ended, (
        "the first PPO iteration did not draw what the unit path draws"
    )
    mask0 = ro0.batch.response_mask
    assert ro0.logp_old[mask0].tolist() == [x for row in first.logps for x in row], (
        "the first PPO iteration's behaviour log-probs are not the unit path's"
    )
    med = {k: statistics.median(v[1:] or v) for k, v in seconds.items()}
    out = {
        "previous_commit": PREVIOUS,
        "timed_iterations": len(seconds["current"]) - 1,
        "previous_median_s": med["previous"],
        "current_median_s": med["current"],
        "speedup": med["previous"] / med["current"],
        "identical_state": True,
    }
    SUMMARY.setdefault("before_after", {})["ppo_iteration"] = out
    benchmark.extra_info.update(out)
    record_result(
        "ppo_iteration_before_after", {k: (round(v, 6) if isinstance(v, float) else v) for k, v in out.items()}
    )
    SUMMARY["notes"].append(
        f"before/after PPO iteration: {med['previous']:.3f} -> {med['current']:.3f} s "
        f"(x{out['speedup']:.2f}, medians of {out['timed_iterations']} paired iterations), actor "
        f"and critic states bit-identical"
    )
