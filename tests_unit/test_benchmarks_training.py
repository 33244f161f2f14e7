"""Benchmarks of the embedded profile's training phases (tier `benchmark`, module docstring of
test_benchmarks.py): teacher-forced scoring, one SFT, judge and PPO update, one PPO iteration,
the iterated judge's refresh against a PPO iteration, and the event log against training."""

from __future__ import annotations

import math
import statistics
import time

import pytest
import torch
from bench_common import (  # noqa: F401 - fixtures are used by name
    RESPONSE,
    SUMMARY,
    _check_finite,
    _check_moved,
    _check_rollout,
    _check_seconds,
    _check_shape,
    _check_update_stats,
    _first_draws,
    _ppo_optimizers,
    _record_goal,
    _report,
    _timed,
    bench_ctx,
    fixed_rollout,
    full_batch,
    full_generation,
    one_benchmark_process,
    peak,
    previous,
    prompts,
    rank,
    roles,
    shape,
)

from rlhf import flops
from rlhf.config import override

pytestmark = pytest.mark.benchmark


def test_teacher_forced_scoring(benchmark, record_result, roles, full_batch, full_generation, peak, shape, rank):
    """Reference log-probs of 4 x (prompt + 64) tokens, one forward (no gradient)."""
    from rlhf.scoring import response_logprobs

    model = roles.reference.model
    log: list = []
    with torch.no_grad():
        benchmark.pedantic(
            _timed(lambda: response_logprobs(model, full_batch), log), rounds=20, warmup_rounds=2, iterations=1
        )
        expected = response_logprobs(model, full_batch)  # untimed: a fresh call of the unit path
    B, T, R = flops.batch_dims(full_batch)
    assert (B, R) == (4, RESPONSE), (B, R)
    _check_shape("unit path", expected, (B, R))
    _check_finite("unit path", expected)
    for i, (_, lp) in enumerate(log):
        _check_shape(f"round {i}", lp, (B, R))
        _check_finite(f"round {i}", lp)
        assert bool((lp <= 0).all()), f"round {i}: positive log-probs"
        assert torch.equal(lp, expected), f"round {i}: the timed log-probs differ from a fresh call's"
    # The reference is the SFT actor that drew full_batch (no update in between): teacher forcing
    # gives the behaviour log-probs of those draws (FP32, <= 1e-4 as in tests_unit/test_training.py).
    behaviour = torch.tensor(full_generation.logps, dtype=expected.dtype)
    tf_diff = float((expected - behaviour).abs().max())
    assert tf_diff <= 1e-4, f"teacher-forced vs behaviour log-probs differ by {tf_diff}"
    _report(
        benchmark,
        record_result,
        "teacher_forced_scoring_4x64",
        log,
        2,
        peak,
        tokens=B * T,
        flop=flops.scoring_flops(shape, full_batch, rank),
        extra={"batch": B, "sequence": T, "response": R, "tokens_per_s_means": "positions scored per second"},
    )


def test_sft_update(benchmark, record_result, bench_ctx, peak, shape, rank):
    """One SFT update: 8 demonstrations, loss, backward, clip, AdamW step."""
    from rlhf.optim import adamw, optimizer_step
    from rlhf.sft import encode_demonstrations, sft_loss
    from rlhf.tokens import collate

    prof = bench_ctx.profile
    actor = bench_ctx.role("actor")
    demos = encode_demonstrations(
        bench_ctx.corpus.learning_view().demonstrations("train"), bench_ctx.tokenizer, bench_ctx.eos_id, prof.limits
    )[: prof.sft.examples_per_update]
    params = [p for p in actor.learned_parameters() if p.requires_grad]
    opt = adamw(params, prof.sft.lr, prof.optim.weight_decay)
    start = actor.learned_state()
    expected_loss, expected_tokens = sft_loss(actor.model, demos, bench_ctx.pad_id)  # untimed unit path, no step

    def once():
        loss, n = sft_loss(actor.model, demos, bench_ctx.pad_id)
        grad_norm = optimizer_step(opt, params, loss, prof.sft.lr, prof.optim.grad_clip_norm, "bench sft")
        return loss, n, grad_norm

    log: list = []
    benchmark.pedantic(_timed(once, log), rounds=20, warmup_rounds=2, iterations=1)
    assert len(demos) == prof.sft.examples_per_update, len(demos)
    for i, (_, (loss, n, grad_norm)) in enumerate(log):
        _check_shape(f"round {i} loss", loss, ())
        _check_finite(f"round {i}", loss, grad_norm)
        assert loss.item() > 0 and grad_norm > 0 and n == expected_tokens, (i, loss.item(), grad_norm, n)
    assert torch.equal(log[0][1][0].detach(), expected_loss.detach()), (
        "the first timed SFT loss differs from the unit path's on the same parameters"
    )
    _check_moved("SFT actor", start, actor.learned_state())
    batch = collate([d[1] for d in demos], [d[2] for d in demos], bench_ctx.pad_id)
    B, T, R = flops.batch_dims(batch)
    _report(
        benchmark,
        record_result,
        "sft_update_8_examples",
        log,
        2,
        peak,
        tokens=B * T,
        flop=flops.trained(flops.scoring_flops(shape, batch, rank)),
        extra={"batch": B, "sequence": T, "response": R},
    )


def test_judge_update(benchmark, record_result, bench_ctx, peak, shape, rank):
    """One Bradley-Terry update: 8 pairs (16 sequences in one batch), backward, clip, AdamW step."""
    from rlhf.judge import encode_pairs, pair_scores
    from rlhf.optim import adamw, optimizer_step
    from rlhf.ppo_math import bradley_terry_loss
    from rlhf.tokens import collate

    prof = bench_ctx.profile
    judge = bench_ctx.role("judge")
    pairs = encode_pairs(
        bench_ctx.corpus.learning_view().pairs("train"), bench_ctx.tokenizer, bench_ctx.eos_id, prof.limits
    )[: prof.judge.pairs_per_update]
    params = [p for p in judge.learned_parameters() if p.requires_grad]
    opt = adamw(params, prof.judge.lr, prof.optim.weight_decay)
    start = judge.learned_state()
    expected_c, expected_r = pair_scores(judge, pairs, bench_ctx.pad_id)  # untimed unit path, no step
    expected_loss = bradley_terry_loss(expected_c, expected_r)

    def once():
        c, r = pair_scores(judge, pairs, bench_ctx.pad_id)
        loss = bradley_terry_loss(c, r)
        grad_norm = optimizer_step(opt, params, loss, prof.judge.lr, prof.optim.grad_clip_norm, "bench judge")
        return c, r, loss, grad_norm

    log: list = []
    benchmark.pedantic(_timed(once, log), rounds=20, warmup_rounds=2, iterations=1)
    n_pairs = prof.judge.pairs_per_update
    assert len(pairs) == n_pairs, len(pairs)
    for i, (_, (c, r, loss, grad_norm)) in enumerate(log):
        _check_shape(f"round {i} chosen", c, (n_pairs,))
        _check_shape(f"round {i} rejected", r, (n_pairs,))
        _check_shape(f"round {i} loss", loss, ())
        _check_finite(f"round {i}", c, r, loss, grad_norm)
        assert loss.item() > 0 and grad_norm > 0, (i, loss.item(), grad_norm)
    c0, r0, loss0, _ = log[0][1]
    assert torch.equal(c0.detach(), expected_c.detach()) and torch.equal(r0.detach(), expected_r.detach()), (
        "the first timed judge scores differ from the unit path's on the same parameters"
    )
    assert torch.equal(loss0.detach(), expected_loss.detach()), "the first timed judge loss differs"
    _check_moved("judge", start, judge.learned_state())
    batch = collate([p[1] for p in pairs] * 2, [p[2] for p in pairs] + [p[3] for p in pairs], bench_ctx.pad_id)
    B, T, R = flops.batch_dims(batch)
    _report(
        benchmark,
        record_result,
        "judge_update_8_pairs",
        log,
        2,
        peak,
        tokens=B * T,
        flop=flops.trained(flops.judge_flops(shape, batch, rank)),
        extra={"batch": B, "sequence": T},
    )


def test_ppo_actor_critic_update(benchmark, record_result, bench_ctx, roles, fixed_rollout, peak, shape, rank):
    """One rlhf.ppo.ppo_update: actor (clipped loss) then critic (value loss), each with its AdamW."""
    from rlhf import ppo_math
    from rlhf.ppo import ppo_update
    from rlhf.roles import critic_values
    from rlhf.scoring import response_logprobs

    prof = bench_ctx.profile
    optimizers = _ppo_optimizers(roles, prof)
    _check_rollout("fixed rollout", fixed_rollout)
    start = {k: roles.by_kind()[k].learned_state() for k in ("actor", "critic")}
    mask = fixed_rollout.batch.response_mask
    with torch.no_grad():  # untimed: the first update's losses by the unit path, on the same parameters
        expected_policy = ppo_math.clipped_policy_loss(
            response_logprobs(roles.actor.model, fixed_rollout.batch),
            fixed_rollout.logp_old,
            fixed_rollout.advantages,
            mask,
            clip=prof.ppo.clip,
        )
        expected_value = ppo_math.value_loss(
            critic_values(roles.critic, fixed_rollout.batch), fixed_rollout.returns, mask, coef=prof.ppo.value_coef
        )
    tm: dict = {}
    log: list = []
    benchmark.pedantic(
        _timed(lambda: ppo_update(roles, optimizers, fixed_rollout, prof, 20, 200, "bench", tm), log),
        rounds=10,
        warmup_rounds=1,
        iterations=1,
    )
    for i, (_, st) in enumerate(log):
        _check_update_stats(f"update {i}", st)
        assert st["actor_grad_norm"] > 0 and st["critic_grad_norm"] > 0, (i, st)
    first = log[0][1]
    assert math.isclose(first["policy_loss"], float(expected_policy), rel_tol=1e-5, abs_tol=1e-7), (
        first["policy_loss"],
        float(expected_policy),
    )
    assert math.isclose(first["value_loss"], float(expected_value), rel_tol=1e-5, abs_tol=1e-7), (
        first["value_loss"],
        float(expected_value),
    )
    for k in ("actor", "critic"):
        _check_moved(f"PPO {k}", start[k], roles.by_kind()[k].learned_state())
    _check_seconds("actor/critic update phases", [tm["actor_update"], tm["critic_update"]])
    batch = fixed_rollout.batch
    B, T, R = flops.batch_dims(batch)
    calls = len(log)
    _report(
        benchmark,
        record_result,
        "ppo_actor_critic_update",
        log,
        1,
        peak,
        tokens=B * T,
        flop=flops.ppo_update_flops(shape, batch, rank),
        extra={
            "batch": B,
            "sequence": T,
            "response": R,
            "actor_share": tm["actor_update"] / (tm["actor_update"] + tm["critic_update"]),
            "mean_actor_update_s": tm["actor_update"] / calls,
            "mean_critic_update_s": tm["critic_update"] / calls,
        },
    )


def _iteration_flops(shape, rank, ro, prompt_len: int, updates: int) -> dict:
    b = ro.batch
    B, _, R = flops.batch_dims(b)
    gen = flops.generation_flops(shape, B, prompt_len, R, use_cache=True, lora_rank=rank)
    gen = {k: v for k, v in gen.items() if k.endswith("flops")}
    parts = {
        "generation": gen,
        "reference": flops.scoring_flops(shape, b, rank),
        "judge": flops.judge_flops(shape, b, rank),
        "critic_values": flops.critic_flops(shape, b, rank),
        "updates": {k: updates * v for k, v in flops.ppo_update_flops(shape, b, rank).items()},
    }
    return {**flops.add(*parts.values()), "parts": {k: v["model_flops"] for k, v in parts.items()}}


def test_ppo_iteration(benchmark, record_result, bench_ctx, roles, prompts, peak, shape, rank):
    """One whole iteration as rlhf.ppo.train_ppo runs it: draw 4 prompts, rollout (sample with
    the KV cache, reference, judge, critic), 2 x (actor update, critic update)."""
    from rlhf.ppo import Prompts, PromptSampler, ppo_update, rollout

    prof = bench_ctx.profile
    cfg = prof.ppo
    optimizers = _ppo_optimizers(roles, prof)
    sampler = PromptSampler(len(prompts), prof.seeds.data_order)
    gen = torch.Generator().manual_seed(prof.seeds.ppo_sampling)
    phases: list[dict] = []
    lengths: list[float] = []
    done: list = []  # (rollout, [ppo_update results]) per round, checked after timing
    start = {k: roles.by_kind()[k].learned_state() for k in ("actor", "critic")}
    first = _first_draws(bench_ctx, prompts, roles.actor)  # untimed: the unit path's draws of round 0

    def once():
        tm: dict = {}
        ps = [prompts[i] for i in sampler.draw(cfg.prompts_per_iteration)]
        ro = rollout(roles, Prompts(ps, None), bench_ctx.tokens(), prof, gen, tm)
        stats = [
            ppo_update(roles, optimizers, ro, prof, 20 + u, 200, "bench", tm) for u in range(cfg.updates_per_iteration)
        ]
        phases.append(tm)
        done.append((ro, stats))
        lengths.append(float(ro.batch.response_mask.sum(-1).float().mean()))
        return _iteration_flops(shape, rank, ro, max(len(p) for p in ps), cfg.updates_per_iteration)

    log: list = []
    benchmark.pedantic(_timed(once, log), rounds=10, warmup_rounds=1, iterations=1)
    assert len(done) == len(phases) == len(log) >= 1
    for i, (ro, stats) in enumerate(done):
        _check_rollout(f"round {i}", ro)
        assert len(stats) == cfg.updates_per_iteration, (i, len(stats))
        for u, st in enumerate(stats):
            _check_update_stats(f"round {i} update {u}", st)
        _check_seconds(
            f"round {i} phases",
            [
                phases[i][k]
                for k in ("generation", "reference", "judge", "critic_values", "actor_update", "critic_update")
            ],
        )
    ro0 = done[0][0]
    assert ro0.responses == first.responses and ro0.ended == first.ended, (
        "the first timed iteration did not draw what the unit path draws"
    )
    assert ro0.logp_old[ro0.batch.response_mask].tolist() == [x for row in first.logps for x in row], (
        "the first timed iteration's behaviour log-probs are not the unit path's"
    )
    for k in ("actor", "critic"):
        _check_moved(f"PPO {k}", start[k], roles.by_kind()[k].learned_state())
    timed_phases = phases[1:] or phases
    seconds = {
        k: statistics.fmean(p.get(k, 0.0) for p in timed_phases)
        for k in ("generation", "reference", "judge", "critic_values", "actor_update", "critic_update")
    }
    flop_parts = {
        k: statistics.fmean(out["parts"][k] for _, out in log[1:] or log)
        for k in ("generation", "reference", "judge", "critic_values", "updates")
    }
    sec_parts = dict(seconds, updates=seconds["actor_update"] + seconds["critic_update"])
    phase_util = {
        k: {
            "seconds": sec_parts[k],
            "model_flops": flop_parts[k],
            "achieved_gflop_s": flop_parts[k] / sec_parts[k] / 1e9,
            "utilisation_all_cores": flop_parts[k] / sec_parts[k] / peak["all_cores"]["flops_per_s"],
            "utilisation_one_thread": flop_parts[k] / sec_parts[k] / peak["one_thread"]["flops_per_s"],
        }
        for k in flop_parts
    }
    tokens = int(4 * statistics.fmean(lengths[1:] or lengths))
    SUMMARY["notes"].append(
        "ppo_iteration phases (s, GFLOP/s, util 1 thread): "
        + ", ".join(
            f"{k} {v['seconds']:.4f} {v['achieved_gflop_s']:.2f} {v['utilisation_one_thread']:.3f}"
            for k, v in phase_util.items()
        )
    )
    _report(
        benchmark,
        record_result,
        "ppo_iteration",
        log,
        1,
        peak,
        tokens=tokens,
        extra={
            "mean_response_length": statistics.fmean(lengths[1:] or lengths),
            "phase_seconds": seconds,
            "phase_utilisation": phase_util,
            "tokens_per_s_means": "sampled response tokens per second of whole iteration",
        },
    )


def test_judge_refresh_against_ppo_iteration(benchmark, record_result, bench_ctx, prompts):
    """The iterated judge's refresh (rlhf.refresh at the profile's defaults: refresh_prompts
    train prompts x 2 temperature-1 answers, labelled, refresh_updates Bradley-Terry updates)
    against one whole PPO iteration, side by side: each round runs one iteration, then one
    refresh, on roles of their own (the refresh trains its judge in place). Reported: seconds of
    each, their ratio, and what a refresh every K iterations adds to PPO (ratio / K)."""
    from rlhf import lab
    from rlhf.ppo import Prompts, PromptSampler, ppo_update, rollout, rollout_data
    from rlhf.refresh import refresh_judge
    from rlhf.refresh import start as refresh_start

    prof = override(bench_ctx.profile, {("ppo", "reward_design"): "iterated-judge"})
    cfg = prof.ppo
    own = lab.ppo_roles(bench_ctx)
    pool = rollout_data(bench_ctx.corpus.learning_view(), bench_ctx.tokens(), prof)  # prompts, actions, train pairs
    optimizers = _ppo_optimizers(own, prof)
    sampler = PromptSampler(len(prompts), prof.seeds.data_order)
    gen = torch.Generator().manual_seed(prof.seeds.ppo_sampling)
    data = refresh_start(prof, "cpu")
    judge_before = own.judge.learned_state()
    seconds: dict[str, list[float]] = {"iteration": [], "refresh": []}
    records_made: list[dict] = []

    def once():
        t = time.perf_counter()
        tm: dict = {}
        drawn = Prompts([prompts[i] for i in sampler.draw(cfg.prompts_per_iteration)], None)
        ro = rollout(own, drawn, bench_ctx.tokens(), prof, gen, tm)
        for u in range(cfg.updates_per_iteration):
            _check_update_stats(f"update {u}", ppo_update(own, optimizers, ro, prof, 20 + u, 200, "bench", tm))
        seconds["iteration"].append(time.perf_counter() - t)
        t = time.perf_counter()
        records_made.append(refresh_judge(own, data, pool, bench_ctx.tokens(), prof, 10))
        seconds["refresh"].append(time.perf_counter() - t)

    benchmark.pedantic(once, rounds=3, warmup_rounds=1, iterations=1)
    for what, secs in seconds.items():
        _check_seconds(what, secs)
    for r in records_made:
        assert r["answers"] == 2 * cfg.refresh_prompts and 0 <= r["new_pairs"] <= cfg.refresh_prompts, r
        assert r["updates"] == (cfg.refresh_updates if r["pairs_so_far"] else 0), r
        _check_finite("refresh losses", *r["losses"])
    if records_made[-1]["pairs_so_far"]:
        _check_moved("refreshed judge", judge_before, own.judge.learned_state())
    timed = {k: v[1:] or v for k, v in seconds.items()}  # the warm-up round dropped
    mean = {k: statistics.fmean(v) for k, v in timed.items()}
    ratio = mean["refresh"] / mean["iteration"]
    row = {
        "refresh_s": mean["refresh"],
        "ppo_iteration_s": mean["iteration"],
        "refresh_over_iteration": ratio,
        "added_to_ppo_every_k": {"k": cfg.refresh_every, "fraction": ratio / cfg.refresh_every},
        "refresh_settings": {k: getattr(cfg, k) for k in ("refresh_prompts", "refresh_updates", "refresh_every")},
        "pairs_labelled_per_refresh": [r["new_pairs"] for r in records_made],
    }
    benchmark.extra_info.update(row)
    record_result("judge_refresh_against_ppo_iteration", row)
    SUMMARY["notes"].append(
        f"judge refresh {mean['refresh']:.3f} s, PPO iteration {mean['iteration']:.3f} s: ratio {ratio:.2f} "
        f"(+{100 * ratio / cfg.refresh_every:.0f}% of PPO's time at a refresh every {cfg.refresh_every} iterations)"
    )


def test_event_log_against_training(benchmark, record_result, bench_ctx, tmp_path):
    """Writing the TensorBoard event files (rlhf.events) against the training they describe, side
    by side in one run, as the lab does it: the event log is the leg's progress callback. Per
    round, 3 PPO iterations (rlhf.ppo.train_ppo) and 4 SFT updates (rlhf.sft.train_sft, one epoch
    of a cut budget); each iteration's seconds from PPO's own timings, each SFT update's from the
    end of one callback to the start of the next (the first update, which includes the set-up, is
    left out), each sync's (scalars written and flushed) from ours. Goal: writing costs under 2%
    of the training it logs."""
    from rlhf import events, lab
    from rlhf.checkpoint import Leg
    from rlhf.ppo import train_ppo
    from rlhf.runtime import seed_system_rngs
    from rlhf.sft import train_sft

    prof = override(bench_ctx.profile, {("sft", "epochs"): 1, ("sft", "max_updates_per_epoch"): 4})
    view = bench_ctx.corpus.learning_view()
    seconds: dict[str, list[float]] = {"ppo_iteration": [], "ppo_sync": [], "sft_update": [], "sft_sync": []}
    rounds = {"n": 0}
    made: dict = {}

    def once():
        rounds["n"] += 1
        run = tmp_path / f"round-{rounds['n']}"
        ppo_log = events.EventLog(run, "ppo", None)

        def ppo_progress(it, total, history, measured):
            made["history"], made["measured"] = history, measured
            t = time.perf_counter()
            ppo_log.sync(it, total, history, measured)
            seconds["ppo_sync"].append(time.perf_counter() - t)
            seconds["ppo_iteration"].append(measured.seconds["iteration"])

        roles = lab.ppo_roles(bench_ctx)
        seed_system_rngs(prof.seeds.torch)
        train_ppo(roles, view, bench_ctx.tokens(), prof, Leg(stop=3, progress=ppo_progress))
        ppo_log.close()
        sft_log = events.EventLog(run, "sft", None)
        clock: dict = {"last": None}  # the end of the previous callback: an update lies between two

        def sft_progress(step, total, history, measured):
            t = time.perf_counter()
            sft_log.sync(step, total, history, measured)
            synced = time.perf_counter() - t
            if clock["last"] is not None and not history["epochs"]:  # not the epoch's callback after the last
                seconds["sft_update"].append(t - clock["last"])
                seconds["sft_sync"].append(synced)
            clock["last"] = time.perf_counter()

        actor = bench_ctx.role("actor")
        seed_system_rngs(prof.seeds.torch)
        train_sft(
            actor, view, bench_ctx.tokenizer, bench_ctx.eos_id, bench_ctx.pad_id, prof, Leg(progress=sft_progress)
        )
        sft_log.close()
        return run

    benchmark.pedantic(once, rounds=3, warmup_rounds=1, iterations=1)
    for what, secs in seconds.items():
        _check_seconds(what, secs)
    # What was timed was written: the last round's files hold every iteration and update.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    last = tmp_path / f"round-{rounds['n']}" / "tensorboard"
    # PPO's iterations are counted from 1 (step k is iteration k), SFT's updates from 0
    for stage, tag, steps in (("ppo", "objective/scores", range(1, 4)), ("sft", "train/loss", range(4))):
        acc = EventAccumulator(str(last / stage), size_guidance={"scalars": 0})
        acc.Reload()
        assert [e.step for e in acc.Scalars(tag)] == list(steps), (stage, tag)
    timed = {k: v[len(v) // 4 :] for k, v in seconds.items()}  # the warm-up round's quarter dropped
    # A late iteration: the 100th of a run, whose signals read full windows (the round's real
    # records repeated and renumbered: the same sizes as a run's), 99 already written.
    records = made["history"]["iterations"]
    long = [{**records[i % len(records)], "iteration": i} for i in range(100)]
    late = []
    for k in range(5):
        log = events.EventLog(
            tmp_path / f"late-{k}", "ppo", {"iterations_done": 99, "history": {"iterations": long[:99]}}
        )
        t = time.perf_counter()
        log.sync(100, 100, {"iterations": long}, made["measured"])
        late.append(time.perf_counter() - t)
        log.close()
    _check_seconds("late sync", late)
    timed["ppo_sync_at_iteration_100"] = late[1:]
    mean = {k: statistics.fmean(v) for k, v in timed.items()}
    share = {
        "ppo": mean["ppo_sync"] / mean["ppo_iteration"],
        "ppo_at_iteration_100": mean["ppo_sync_at_iteration_100"] / mean["ppo_iteration"],
        "sft": mean["sft_sync"] / mean["sft_update"],
    }
    row = {**{f"{k}_s": v for k, v in mean.items()}, **{f"share_of_{k}": v for k, v in share.items()}}
    benchmark.extra_info.update(row)
    record_result("event_log_against_training", row)
    worst = max(share.values())
    _record_goal(
        benchmark, record_result, "event_log_share", "event files cost < 2% of training", worst, 0.02, worst < 0.02
    )
    SUMMARY["notes"].append(
        f"event files: {1000 * mean['ppo_sync']:.2f} ms per PPO iteration ({100 * share['ppo']:.2f}% of "
        f"{mean['ppo_iteration']:.3f} s; {1000 * mean['ppo_sync_at_iteration_100']:.2f} ms at iteration 100, "
        f"{100 * share['ppo_at_iteration_100']:.2f}%), {1000 * mean['sft_sync']:.2f} ms per SFT update "
        f"({100 * share['sft']:.2f}% of {mean['sft_update']:.3f} s)"
    )
