"""The interrupt/resume protocol (SPEC §7) of one resumable stage, crash-safe: the interrupted,
resumed and continuous legs, each ending in a final state file; their comparison
(resume_check.json); a stage command's single leg (--stop-after, --resume); and the adoption
of another run's finished leg or evaluation (the dry run's rehearsal)."""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import NamedTuple, TypedDict

from rlhf import events
from rlhf.checkpoint import (
    Interrupted,
    Leg,
    StateError,
    StateWriter,
    assert_states_equal,
    load_state,
    save_state,
    stop_requested,
)
from rlhf.config import Profile
from rlhf.io import read_json, read_verified, sweep_incomplete, write_json, write_with_sidecar
from rlhf.lab.console import print_line
from rlhf.lab.run import RUN_FILE, Context, stage_complete


class ResumeCheck(TypedDict, total=False):
    """resume_check.json: what the interrupt/resume protocol compared (the keys after `protocol`
    only when it ran both legs)."""

    stage: str
    protocol: bool
    sha256_continuous: str
    boundary: int
    identical: bool
    tensors_compared: int
    sha256_resumed: str
    sha256_boundary: str
    interrupted_and_resumed_s: float
    continuous_s: float


class ProtocolResult(NamedTuple):
    """What run_protocol (and so a training stage) returns."""

    state: dict  # the training state at the end of the last leg run (what a stage saves and resumes)
    timings: dict  # durations of the leg that produced `state` ({} if its final state was loaded)
    seconds: float  # wall-clock seconds of the whole call
    sha256_final: str | None  # hash of the saved final state; None after --stop-after
    check: ResumeCheck | None  # resume_check.json as recorded (its JSON keys); None after --stop-after or --resume
    # {leg: {"seconds": s, "clock": [[seconds into the leg, units done], ...]}} of each leg run: one
    # mark after every update / iteration and one after every epoch's validation (the units
    # unchanged), what the dry run's projection fits (rlhf.projection); {} for a stage command's leg
    legs: dict = {}


class LegRun(NamedTuple):
    """What one leg of the protocol returns (run_leg)."""

    state: dict  # its final state
    timings: dict  # durations from run_fn ({} when its final state was loaded)
    seconds: float  # wall-clock seconds of the leg
    clock: list  # [[seconds into the leg, units done], ...] after each update / iteration and validation


def stage_length(profile: Profile, stage: str) -> tuple[int, str]:
    """How long a resumable stage runs: (epochs, "epoch") of SFT, the judge and an ensemble
    member (judge-m), (iterations, "iteration") of PPO."""
    if stage == "ppo":
        return profile.ppo.iterations, "iteration"
    return (profile.sft.epochs if stage == "sft" else profile.judge.epochs), "epoch"


def check_stop_after(profile: Profile, stage: str, stop_after: int | None) -> None:
    """--stop-after N stops a stage at a boundary inside it, 1 <= N < its length, to continue with
    --resume; anything else is refused before anything is written."""
    if stop_after is None:
        return
    total, unit = stage_length(profile, stage)
    if not 1 <= stop_after < total:
        raise ValueError(
            f"--stop-after must be between 1 and {total - 1}, not {stop_after}: the {stage} stage of profile "
            f"{profile.name} runs {total} {unit}s; stop after one of them, then continue with --resume"
        )


def run_protocol(
    ctx: Context,
    stage: str,
    boundary: int,
    run_fn,
    identity: dict,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    protocol: bool = True,
    checkpoint_every: int = 1,
    beside=None,
) -> ProtocolResult:
    """Run `stage` with the interrupt/resume protocol (or only its continuous leg), crash-safe.

    run_fn(leg) -> (state, timings) runs one leg (rlhf.checkpoint.Leg): from `leg.state` (None:
    fresh) up to `leg.stop` (None: the end), calling leg.checkpoint(n, make_state) after every
    epoch / iteration n.
    The legs, each ending in a final state file in ctx.run/stage:
      state-boundary   the interrupted run, saved at the boundary
      state-resumed    resumed from state-boundary to the end
      state-continuous the same stage run from scratch to the end, without interruption
    `protocol=False` runs the continuous leg only (resume_check.json says so).
    `beside` (with the protocol): a callable that starts the continuous leg in a process of its
    own (rlhf.legs.Beside) while this one runs the other two; its final state is then read
    from disk and its seconds, clock and timings from what that process wrote.
    `stop_after` alone (stage command with --stop-after): write state-stopNNN and return.
    `resume` alone (stage command with --resume): continue from the last state-stopNNN.
    """
    folder = ctx.run / stage
    folder.mkdir(parents=True, exist_ok=True)
    if stop_after is not None or resume:
        return _stage_command_leg(ctx, stage, run_fn, identity, stop_after)
    if stage_complete(ctx, stage):
        raise FileExistsError(
            f"stage {stage} already ran in {ctx.run} and is complete (run.json); "
            f"nothing is overwritten (use a new --out folder for a new run)"
        )
    for sub in (folder, folder / "checkpoints"):
        removed = sweep_incomplete(sub)
        if removed:
            print_line(f"{stage}: removed what a crash left half-written in {sub}: {', '.join(removed)}")
    t = time.perf_counter()
    legs: dict[str, LegRun] = {}
    leg = partial(run_leg, ctx, stage, run_fn=run_fn, identity=identity, every=checkpoint_every)
    other = None
    if protocol and beside is not None and not (folder / "state-continuous.pt.gz").is_file():
        other = beside()  # the continuous leg, started in its own process
    try:
        if protocol:
            legs["boundary"] = leg("boundary", lambda: None, boundary)
            legs["resumed"] = leg("resumed", lambda: load_state(folder / "state-boundary.pt.gz", identity), None)
    except BaseException:
        if other is not None:  # Ctrl-C reached both; a crash here: the other's checkpoints are kept either way
            other.process.join()
        raise
    if other is not None:
        measured = other.wait()
        print_line(
            f"{stage}: continuous run from scratch, in a process of its own beside the others (compared with "
            f"the resumed one): {measured['seconds']:.1f} s"
        )
        state = load_state(folder / "state-continuous.pt.gz", identity)
        legs["continuous"] = LegRun(state, measured["timings"], measured["seconds"], measured["clock"])
    else:
        legs["continuous"] = leg("continuous", lambda: None, None, compared=protocol)
    check = _resume_check(folder, stage, boundary, legs)
    clocks = {name: {"seconds": run.seconds, "clock": run.clock} for name, run in legs.items()}
    if protocol:
        clocks["continuous"]["beside"] = other is not None  # in its own process, beside the other two
    continuous = legs["continuous"]
    return ProtocolResult(
        continuous.state, continuous.timings, time.perf_counter() - t, check["sha256_continuous"], check, clocks
    )


def _resume_check(folder: Path, stage: str, boundary: int, legs: dict[str, LegRun]) -> ResumeCheck:
    """Compare the resumed and the continuous final states (when the protocol ran); write
    resume_check.json, keeping the first complete record a rerun finds."""
    check: ResumeCheck = {
        "stage": stage,
        "protocol": "resumed" in legs,
        "sha256_continuous": read_json(folder / "state-continuous.pt.gz.json")["sha256"],
    }
    if "resumed" in legs:
        compared = assert_states_equal(legs["continuous"].state, legs["resumed"].state, stage)
        check.update(
            {
                "boundary": boundary,
                "identical": True,
                "tensors_compared": compared,
                "sha256_resumed": read_json(folder / "state-resumed.pt.gz.json")["sha256"],
                "sha256_boundary": read_json(folder / "state-boundary.pt.gz.json")["sha256"],
                "interrupted_and_resumed_s": legs["boundary"].seconds + legs["resumed"].seconds,
            }
        )
    check["continuous_s"] = legs["continuous"].seconds
    write_json(folder / "resume_check.json", check, keep_existing=True)
    return read_json(folder / "resume_check.json")


def resumable_states(run, stage: str) -> list[Path]:
    """The states a stage command's --resume may continue from (saved by --stop-after), oldest
    first; none is refused naming the command that makes one (a stage command checks this before
    anything is written)."""
    stops = sorted((Path(run) / stage).glob("state-stop*.pt.gz"))
    if not stops:
        raise StateError(
            f"nothing to resume in {Path(run) / stage}: no state saved by --stop-after; make one with "
            f"rlhf {stage} --run {run} --stop-after N, then continue it with --resume"
        )
    return stops


def _stage_command_leg(ctx: Context, stage: str, run_fn, identity: dict, stop_after: int | None) -> ProtocolResult:
    """A stage command's single leg: --stop-after N (from scratch to N, saved as state-stopNNN)
    or --resume (from the last state-stopNNN to the end, saved as state-resumed)."""
    folder = ctx.run / stage
    t = time.perf_counter()
    if stop_after is not None:
        state, tm = _logged(ctx, stage, None, run_fn, Leg(stop=stop_after))
        save_state(folder / f"state-stop{stop_after:03d}.pt.gz", state, identity)
        return ProtocolResult(state, tm, time.perf_counter() - t, sha256_final=None, check=None)
    stops = resumable_states(ctx.run, stage)
    start = load_state(stops[-1], identity)
    state, tm = _logged(ctx, stage, start, run_fn, Leg(state=start))
    manifest = save_state(folder / "state-resumed.pt.gz", state, identity)
    return ProtocolResult(state, tm, time.perf_counter() - t, sha256_final=manifest["sha256"], check=None)


def adopt_continuous_leg(ctx: Context, source, stage: str) -> bool:
    """Copy `stage`'s finished continuous leg (state-continuous.pt.gz and its manifest) from the
    run folder `source` into this run, so that the protocol loads it instead of computing it
    again: the dry run measures each stage once, then rehearses the protocol around the same
    legs. The copy is hash-checked as it is read, written like any state (data, then manifest),
    and identity-checked when the protocol loads it, so a state of other inputs is refused there.
    Returns False when this run has its own already."""
    target = ctx.run / stage / "state-continuous.pt.gz"
    if target.is_file() and Path(str(target) + ".json").is_file():
        return False
    data, manifest = read_verified(Path(source) / stage / target.name, StateError, "state")
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_incomplete(target.parent)  # a copy a crash cut short
    write_with_sidecar(target, data, {k: v for k, v in manifest.items() if k not in ("sha256", "bytes")})
    return True


def adopt_evaluation(ctx: Context, source) -> bool:
    """Take the held-out evaluation (evaluation/results.json) of the run folder `source` over,
    as the dry run's rehearsal does: allowed only when this run's final PPO state is the very
    state that evaluation read (the same SHA-256 in both run.json records), so the numbers are
    the ones this run would compute. Returns False when this run has its own already."""
    target = ctx.run / "evaluation" / "results.json"
    if target.is_file():
        return False
    mine = read_json(ctx.run / RUN_FILE)["stages"].get("ppo", {}).get("sha256_final")
    theirs = read_json(Path(source) / RUN_FILE)["stages"].get("ppo", {}).get("sha256_final")
    if mine is None or mine != theirs:
        raise StateError(
            f"cannot take the evaluation of {source} over: its final PPO state ({str(theirs)[:12]}) "
            f"is not this run's ({str(mine)[:12]})"
        )
    write_json(target, read_json(Path(source) / "evaluation" / "results.json"))
    return True


def _logged(ctx: Context, stage: str, start: dict | None, run_fn, leg: Leg):
    """run_fn(leg) with the leg's event log (a stage command's --stop-after or --resume leg)."""
    log = events.EventLog(ctx.run, stage, start)
    try:
        return run_fn(replace(leg, progress=log.sync))
    finally:
        log.close()


def also_progress(leg: Leg, progress) -> Leg:
    """The leg with `progress` called after its own progress callback (the event log), if any."""
    first = leg.progress
    if first is None:
        return replace(leg, progress=progress)

    def both(*args):
        first(*args)
        progress(*args)

    return replace(leg, progress=both)


def run_leg(
    ctx: Context, stage: str, name: str, start, stop, *, run_fn, identity: dict, every: int, compared=False
) -> LegRun:
    """One leg of the protocol, crash-safe.

    Its final state on disk is loaded, not recomputed. Otherwise the leg starts from `start()`
    (None or the boundary state) or from its own last checkpoint, and saves a checkpoint every
    `every` epochs/iterations (and at the next boundary after Ctrl-C, then stops)."""
    folder = ctx.run / stage
    final = folder / f"state-{name}.pt.gz"
    t = time.perf_counter()
    if final.is_file():
        print_line(f"{stage}: {name} run already complete in {folder} (loaded, not recomputed)")
        return LegRun(load_state(final, identity), {}, 0.0, [])
    ck_dir = folder / "checkpoints"
    saved = sorted(ck_dir.glob(f"{name}-*.pt.gz"))
    if saved:
        print_line(f"{stage}: {name} run continues from its checkpoint {saved[-1].name}")
        state = load_state(saved[-1], identity)
    else:
        print_line(
            {
                "boundary": f"{stage}: interrupted run, stopping after {stop}",
                "resumed": f"{stage}: resumed from the saved boundary state, to the end",
                "continuous": f"{stage}: continuous run from scratch"
                + (" (compared with the resumed one)" if compared else ""),
            }[name]
        )
        state = start()

    writer = StateWriter()  # checkpoints are written while the leg trains on

    def checkpoint(n: int, make_state) -> None:  # called after every epoch / iteration but the last
        interrupt = stop_requested()
        path = ck_dir / f"{name}-{n:04d}.pt.gz"
        if (interrupt or n % every == 0) and not path.exists():
            writer.save(path, make_state(), identity)
        if interrupt:
            writer.wait()  # the checkpoint named below is on disk before the command stops
            raise Interrupted(
                f"{stage}: stopped on request after {n} in the {name} run; checkpoint {path}. "
                f"Run the same command again to continue from there."
            )

    # The legs that make the run write its event files; the continuous leg that checks them does not.
    log = events.EventLog(ctx.run, stage, state) if name != "continuous" or not compared else None
    clock: list = []

    def progress(step, total, history, measured) -> None:
        clock.append([round(time.perf_counter() - t, 6), step])
        if log is not None:
            log.sync(step, total, history, measured)

    try:
        state, timings = run_fn(Leg(state=state, stop=stop, checkpoint=checkpoint, progress=progress, quiet=compared))
        writer.wait()
    finally:
        if log is not None:
            log.close()
        writer.abandon()
    save_state(final, state, identity)
    if stop_requested():  # the end of a leg is a boundary too
        raise Interrupted(
            f"{stage}: stopped on request at the end of the {name} run; its state {final}. "
            f"Run the same command again to continue from there."
        )
    return LegRun(state, timings, time.perf_counter() - t, clock)
