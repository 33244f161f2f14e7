"""The whole lab: every stage in order over one run folder (SFT, the judge and its ensemble's
members, PPO, the held-out evaluation, the shortcut audit, the reports), skipping those run.json
records as complete."""

from __future__ import annotations

import time
from functools import partial
from typing import Callable

from rlhf.checkpoint import Interrupted, stop_requested
from rlhf.evaluate import stage_evaluate
from rlhf.io import read_json, sweep_incomplete
from rlhf.lab.console import print_line
from rlhf.lab.protocol import ProtocolResult
from rlhf.lab.run import Context, mark_complete, stage_complete
from rlhf.lab.stages import member_stages, stage_judge, stage_judge_member, stage_ppo, stage_sft
from rlhf.report import write_reports
from rlhf.shortcut import run_shortcut_audit

STAGES = ("sft", "judge", "ppo", "evaluate", "shortcut_audit", "report")  # run_lab's order


def run_lab(ctx: Context, *, protocol: bool = True) -> dict:
    """Every stage in order, skipping those run.json records as complete; returns results.json.

    sft -> judge -> ppo (each with the interrupt/resume protocol unless `protocol=False`) ->
    evaluate -> shortcut_audit -> report. Stages without checkpoints (evaluation, audit,
    reports) write their results whole and last, so a crash inside one reruns that one."""
    run_stages(ctx, protocol=protocol)
    if not stage_complete(ctx, "report"):
        t = time.perf_counter()
        sweep_incomplete(ctx.run, sidecar_patterns=())
        write_reports(ctx.run, keep_existing=True)
        mark_complete(ctx, "report", seconds=time.perf_counter() - t)
    return read_json(ctx.run / "results.json")


def run_stages(ctx: Context, *, protocol: bool = True, until: str = "shortcut_audit", done=None) -> None:
    """run_lab's stages from SFT up to and including `until`, skipping those run.json records as
    complete; `done(stage)` is called after each stage this call ran (the dry run prints each
    stage's measurement as it comes)."""
    if until not in STAGES[:-1]:
        raise ValueError(f"until must be one of {', '.join(STAGES[:-1])}, not {until!r}")
    training: list[tuple[str, Callable[..., ProtocolResult]]] = [("sft", stage_sft), ("judge", stage_judge)]
    training += [(m, partial(stage_judge_member, stage=m)) for m in member_stages(ctx.profile)]
    for name, fn in (*training, ("ppo", stage_ppo)):
        if stage_complete(ctx, name):
            print_line(f"{name}: already complete in {ctx.run} (skipped)")
        else:
            result = fn(ctx, protocol=protocol)
            check = result.check or {}  # a full run always records its check
            if check.get("protocol"):
                print_line(
                    f"{name}: {result.seconds:.1f} s; interrupt/resume identical: {check.get('identical')} "
                    f"({check.get('tensors_compared')} tensors; state sha256 resumed "
                    f"{str(check.get('sha256_resumed'))[:12]} = continuous {str(check.get('sha256_continuous'))[:12]})"
                )
            else:
                print_line(
                    f"{name}: {result.seconds:.1f} s (one continuous run; state sha256 {str(result.sha256_final)[:12]})"
                )
            _stop_if_requested(ctx)
            if done is not None:
                done(name)
        if name == until:
            return
    for name, folder, write_results in (
        ("evaluate", "evaluation", stage_evaluate),
        ("shortcut_audit", "shortcut_audit", run_shortcut_audit),
    ):
        if stage_complete(ctx, name):
            print_line(f"{name}: already complete in {ctx.run} (skipped)")
        else:
            t = time.perf_counter()
            sweep_incomplete(ctx.run / folder)
            if not (ctx.run / folder / "results.json").exists():  # written whole and last: there means done
                write_results(ctx)
            mark_complete(ctx, name, seconds=time.perf_counter() - t)
            print_line(f"{name}: {time.perf_counter() - t:.1f} s")
            _stop_if_requested(ctx)
            if done is not None:
                done(name)
        if name == until:
            return


def _stop_if_requested(ctx: Context) -> None:
    """Ctrl-C during a stage without checkpoints: stop between stages."""
    if stop_requested():
        raise Interrupted(f"stopped on request between stages; run the same command again to continue in {ctx.run}")
