"""The lab's stages over one run folder, each runnable alone (`rlhf sft|judge|ppo --run DIR`)
or all in order (`rlhf lab --out DIR`).

Run folder:

    run.json                what the run is (its identity) and which stages are complete
    corpus/                 inputs/, labels/, manifest.json (rlhf.corpus)
    base_model/             the embedded base, built here unless --model-dir is given
    sft/    state-*.pt.gz   final states of the protocol's three legs (+ .json sidecars with
                            SHA-256 and identity)
            checkpoints/    <leg>-NNNN.pt.gz: each leg's state after every epoch (SFT, judge) or
                            every `ppo.checkpoint_every` iterations (PPO)
            actor.safetensors(+.json)   final SFT adapters
            history.json, timings.json, resume_check.json
    judge/  the same for the judge (judge.safetensors)
    judge-1/ .. judge-(k-1)/   a judge ensemble's other members (reward designs 'ensemble-*'),
            each trained like the judge from its own seeds (`member_profile`)
    ppo/    the same for PPO (actor.safetensors, critic.safetensors, fingerprints.json; with the
            iterated judge also judge.safetensors, the judge as last refreshed)

Interrupt/resume protocol (SPEC §7), run by the lab and by tests_reproducibility:
stop after a boundary (SFT epoch 1, judge epoch 1, PPO iteration 40), resume from that state
to the end, run the same stage continuously to the end, and require the two final states to
be identical tensor by tensor. Nothing existing is overwritten.

Crash safety: a rerun of the same command after a crash (SIGKILL, power cut) at any
moment continues where the run stopped. `run.json` is checked first (a different profile,
revision, code, base model or CPU pin is refused); what a crash left half-written is swept
away (rlhf.io.sweep_incomplete); a leg whose final state exists is loaded, not recomputed; any
other leg continues from its last checkpoint, loaded with the same hash and identity checks as
a resume. Because a resume is exact, the final states are bit-identical to an uninterrupted
run's. Ctrl-C asks for a stop: the running leg saves a checkpoint at its next boundary and the
command exits saying how to continue.
"""

from __future__ import annotations

import copy
import shutil
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Callable, NamedTuple, TypedDict

import torch
from tqdm import tqdm

from rlhf import costs, designs, events, identities, runtime, signals
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
from rlhf.config import PROFILES, Profile, load_profile, override, profile_hash
from rlhf.corpus import load_corpus, prepare
from rlhf.embedded import build_embedded
from rlhf.evaluate import stage_evaluate
from rlhf.io import (
    output_folder,
    read_json,
    read_verified,
    sha256_file,
    sweep_incomplete,
    write_json,
    write_with_sidecar,
)
from rlhf.judge import train_judge
from rlhf.models import check_tokenizer, compute_dtype, directory_identity, load_tokenizer
from rlhf.ppo import STATE_KEYS, train_ppo
from rlhf.report import write_reports
from rlhf.roles import PpoRoles, Role, assert_role_isolation, fingerprint, load_role, new_role, save_role
from rlhf.runtime import configure_determinism, configure_torch, rng_state, seed_system_rngs, set_rng_state
from rlhf.sft import train_sft
from rlhf.shortcut import run_shortcut_audit


class Context:
    """What every stage needs: profile, run folder, corpus, base model directory, tokenizer.
    `trained_in`: the run folder whose sft/ and judge/ PPO starts from (default: this one; a
    frontier arm runs PPO in its own folder from its seed's SFT and judge)."""

    def __init__(self, run, profile: Profile, model_dir, corpus, trained_in=None):
        self.run = Path(run)
        self.trained_in = self.run if trained_in is None else Path(trained_in)
        self.profile = profile
        self.device = profile_device(profile)
        self.model_dir = Path(model_dir)
        self.corpus = corpus
        self.base_identity = {"files": directory_identity(self.model_dir)}
        self.tokenizer = load_tokenizer(self.model_dir)
        self.eos_id, self.pad_id = check_tokenizer(profile, self.tokenizer)
        # Ids at or past the tokenizer's size are embedding padding: never sampled or scored
        # (rlhf.scoring.real_token_logits). Part of every identity.
        self.real_tokens = len(self.tokenizer)
        # The dtype the base computes in here and why (BF16 weights on a CPU without native BF16
        # compute in float32): part of every identity, so states of two dtypes never mix.
        self.precision = compute_dtype(profile)
        configure_torch(profile)
        # Before any role exists: cuBLAS reads its workspace setting when its handle is created.
        self.determinism = configure_determinism(profile)

    def identity(self, **extra) -> dict:
        return identities.identity_of(
            profile_hash(self.profile),
            sha256_file(self.corpus.root / "manifest.json"),
            self.base_identity,
            {
                "revision": self.corpus.revision,
                "dtype": self.precision["dtype"],
                "real_tokens": self.real_tokens,
                **extra,
            },
        )

    def role(self, kind: str):
        return new_role(
            kind,
            self.profile,
            self.model_dir,
            base_identity=self.base_identity,
            tokenizer=self.tokenizer,
            device=self.device,
        )


def profile_device(profile: Profile) -> str:
    """The profile's device, never a silent fallback: a CUDA profile on a machine without CUDA is
    an error (a qwen2.5-0.5b run on the CPU would take days, and its numbers would not be the
    GPU run's). To run a CUDA profile's code path on the CPU on purpose, use a copy of the
    profile with `device = "cpu"`."""
    device = profile.device
    if device not in ("cpu", "cuda"):
        raise ValueError(f"profile {profile.name}: device must be 'cpu' or 'cuda', not {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"profile {profile.name} runs on CUDA, and torch sees no CUDA device here "
            f"(torch {torch.__version__}); no silent fallback to the CPU. For the CPU on purpose, "
            f'use a copy of the profile with device = "cpu"'
        )
    return device


def open_context(run, profile_name: str | Profile = "embedded", model_dir=None, revision: str = "r001") -> Context:
    """Prepare (first time) or load (hash-verified) the run's corpus and base; refuse mixing.

    `profile_name` is a profile name, a TOML path, or an already loaded Profile (tests pass
    small budgets made with `config.override`).
    """
    run = output_folder(run)
    profile = profile_name if isinstance(profile_name, Profile) else load_profile(profile_name)
    profile_device(profile)  # refused before anything is prepared
    stop_rules_identity(profile)  # a stop signal without a frozen rule: refused before SFT, not at PPO
    refuse_old_layout(run)
    refuse_foreign_folder(run)
    if (run / RUN_FILE).is_file():
        read_json(run / RUN_FILE)  # a damaged run.json is refused, naming it, before anything is written
    events.check_writable(run)  # refused before anything is written
    _sweep_run_folder(run)
    corpus_dir = run / "corpus"
    if not (corpus_dir / "manifest.json").is_file():
        prepare(corpus_dir, revision=revision)
    corpus = _run_corpus(run, revision)
    if model_dir is None:
        if profile.model.kind != "embedded":
            raise ValueError(
                f"profile {profile.name} needs --model-dir DIR (get the weights with: rlhf fetch-model --out DIR)"
            )
        model_dir = run / "base_model"
        if not (model_dir / "config.json").is_file():
            build_embedded(model_dir)
    # Context applies the profile's threads and seed to this process; a refused run puts back
    # the caller's (a library caller continues after the refusal).
    threads, rngs = torch.get_num_threads(), rng_state()
    try:
        ctx = Context(run, profile, model_dir, corpus)
        check_run_record(ctx)
    except Exception:
        torch.set_num_threads(threads)
        set_rng_state(rngs)
        raise
    return ctx


def read_context(run, profile: Profile, revision: str) -> Context:
    """A finished run's context, to read it: its corpus and base model hash-checked as they load,
    nothing prepared, built or written, and run.json not compared (so that a later code version
    can still read the run's files)."""
    run = Path(run)
    return Context(run, profile, run / "base_model", _run_corpus(run, revision))


def _run_corpus(run: Path, revision: str):
    """The run's corpus (hash-checked), refused when it is not of `revision`."""
    corpus = load_corpus(run / "corpus")
    if corpus.revision != revision:
        raise ValueError(
            f"run {run} holds corpus revision {corpus.revision}, not {revision}: "
            f"one run never mixes revisions; use a new --out folder"
        )
    return corpus


# ------------------------------------------------------------------------- run.json

RUN_FILE = "run.json"


def refuse_old_layout(run: Path) -> None:
    """The one compatibility rule for run folders written before the judge had one name: their
    judge stage lives in `reward/`. Such a folder is refused with the reason,
    before anything is read or written; its states were made by older code, which the run's
    code identity would refuse anyway, so it is never continued or mixed with new stages."""
    if (run / "reward").is_dir() and not (run / "judge").exists():
        raise StateError(
            f"run folder {run} has the old layout (its judge stage is in reward/; the stage "
            f"is now judge/) and was written by an older rlhf: it cannot be continued. "
            f"Its results stay readable as files; start afresh in a new folder: "
            f"rlhf lab --out NEW_FOLDER"
        )


# What a run folder may hold before its corpus: a study's run profile (rlhf.studies.derivation
# writes seed-i/profile.toml first), the run's own event folder (checked by events.check_writable)
# and what a crash left while preparing (swept below).
BEFORE_CORPUS = ("profile.toml", "tensorboard")  # and logs (*.log): a study logs a seed's lab into its folder


def refuse_foreign_folder(run: Path) -> None:
    """Refuse a non-empty folder that is not a run: the lab writes its corpus first, so a folder
    with neither run.json nor corpus/ holding anything but BEFORE_CORPUS, logs and hidden leftovers
    of an interrupted write belongs to something else, and the run's files would be mixed into it."""
    if not run.is_dir() or (run / RUN_FILE).is_file() or (run / "corpus").is_dir():
        return
    foreign = sorted(
        p.name
        for p in run.iterdir()
        if p.name not in BEFORE_CORPUS and not p.name.startswith(".") and not (p.suffix == ".log" and p.is_file())
    )
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ValueError(
            f"folder {run} is not empty and is not a run (no {RUN_FILE}, no corpus/; it holds {shown}): "
            f"a run is written into a folder of its own; give a new or empty folder"
        )


def _sweep_run_folder(run: Path) -> None:
    """Remove what a crash left at the top of a run folder: temporary files and the temporary
    folders of an interrupted corpus preparation or base build (`.corpus.*`, `.base_model.*`)."""
    if not run.is_dir():
        return
    sweep_incomplete(run, sidecar_patterns=())
    for p in list(run.glob(".corpus.*")) + list(run.glob(".base_model.*")):
        if p.is_dir():
            shutil.rmtree(p)


def run_identity(ctx: Context) -> dict:
    """What a run is: a rerun in the same folder must match every part."""
    return identities.run_identity(
        ctx.profile.name,
        profile_hash(ctx.profile),
        ctx.corpus.revision,
        sha256_file(ctx.corpus.root / "manifest.json"),
        ctx.base_identity["files"],
        ctx.precision["dtype"],
        ctx.real_tokens,
    )


def check_run_record(ctx: Context) -> dict:
    """Write run.json on first use; afterwards refuse a context whose identity differs."""
    path = ctx.run / RUN_FILE
    current = run_identity(ctx)
    if not path.is_file():
        record = {
            "format": "rlhf-run-1",
            "identity": current,
            "arithmetic": runtime.describe(),
            "device": ctx.device,
            "precision": ctx.precision,
            "determinism": ctx.determinism,
            "profile_values": ctx.profile.to_dict(),  # not compared: names the keys of a changed config
            "stages": {},
        }
        write_json(path, record)
        return record
    record = read_json(path)
    change = identities.describe_change(record["identity"], current)
    if change and "profile_values" in record and record["identity"].get("config") != current["config"]:
        keys = identities.profile_changes(record["profile_values"], ctx.profile.to_dict())
        change += "; the profile's " + (
            "changed keys: " + "; ".join(keys) if keys else "keys are equal, its file differs"
        )
    if change:
        profile = current["profile"] if current["profile"] in PROFILES else "PROFILE.toml"
        raise StateError(
            f"refusing to continue run {ctx.run}: {change}. "
            f"Nothing was written. To start afresh, use a new folder: "
            f"rlhf lab --out NEW_FOLDER --profile {profile} --revision {current['revision']}"
        )
    return record


def stage_complete(ctx: Context, stage: str) -> bool:
    path = ctx.run / RUN_FILE
    return path.is_file() and stage in read_json(path).get("stages", {})


def mark_complete(ctx: Context, stage: str, **info) -> None:
    """Record in run.json that `stage` finished (the record is the one file rewritten in place,
    atomically, since it is meant to change)."""
    path = ctx.run / RUN_FILE
    record = read_json(path)
    record["stages"][stage] = {"complete": True, **info}
    write_json(path, record, overwrite=True)


def _progress(desc: str, total: int):
    bar = tqdm(
        total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True, disable=not sys.stderr.isatty()
    )

    def update(step, _total, loss):
        bar.n = step
        bar.set_postfix_str(f"loss {loss:.4f}" if isinstance(loss, float) else "")
        bar.refresh()

    return bar, update


def _say(line: str) -> None:
    print(line, flush=True)


def _line(bar, line: str) -> None:
    """A progress line: above the bar on a terminal, else printed."""
    if sys.stderr.isatty():
        bar.write(line)
    else:
        _say(line)


# ------------------------------------------------------------------------- a resumable stage


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
    """What one leg of the protocol returns (_run_leg)."""

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
            _say(f"{stage}: removed what a crash left half-written in {sub}: {', '.join(removed)}")
    t = time.perf_counter()
    legs: dict[str, LegRun] = {}
    leg = partial(_run_leg, ctx, stage, run_fn=run_fn, identity=identity, every=checkpoint_every)
    if protocol:
        legs["boundary"] = leg("boundary", lambda: None, boundary)
        legs["resumed"] = leg("resumed", lambda: load_state(folder / "state-boundary.pt.gz", identity), None)
    legs["continuous"] = leg("continuous", lambda: None, None, compared=protocol)
    check = _resume_check(folder, stage, boundary, legs)
    clocks = {name: {"seconds": run.seconds, "clock": run.clock} for name, run in legs.items()}
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


def _event_log(ctx: Context, stage: str, start: dict | None) -> events.EventLog:
    cfg = ctx.profile.ppo
    return events.EventLog(ctx.run, stage, start, cfg.kl_coef, cfg.truncation_penalty)


def _logged(ctx: Context, stage: str, start: dict | None, run_fn, leg: Leg):
    """run_fn(leg) with the leg's event log (a stage command's --stop-after or --resume leg)."""
    log = _event_log(ctx, stage, start)
    try:
        return run_fn(replace(leg, progress=log.sync))
    finally:
        log.close()


def _also_progress(leg: Leg, progress) -> Leg:
    """The leg with `progress` called after its own progress callback (the event log), if any."""
    first = leg.progress
    if first is None:
        return replace(leg, progress=progress)

    def both(*args):
        first(*args)
        progress(*args)

    return replace(leg, progress=both)


def _run_leg(
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
        _say(f"{stage}: {name} run already complete in {folder} (loaded, not recomputed)")
        return LegRun(load_state(final, identity), {}, 0.0, [])
    ck_dir = folder / "checkpoints"
    saved = sorted(ck_dir.glob(f"{name}-*.pt.gz"))
    if saved:
        _say(f"{stage}: {name} run continues from its checkpoint {saved[-1].name}")
        state = load_state(saved[-1], identity)
    else:
        _say(
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
    log = _event_log(ctx, stage, state) if name != "continuous" or not compared else None
    clock: list = []

    def progress(step, total, history, timings) -> None:
        clock.append([round(time.perf_counter() - t, 6), step])
        if log is not None:
            log.sync(step, total, history, timings)

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


# ------------------------------------------------------------------------- stages


def train_role(ctx: Context, kind: str, train_fn, leg: Leg = Leg()) -> dict:
    """A fresh `kind` role trained by `train_fn` (train_sft or train_judge) on the learning view,
    from the profile's torch seed, over one leg; returns the training state (what a stage saves
    and resumes)."""
    role = ctx.role(kind)
    seed_system_rngs(ctx.profile.seeds.torch)
    return train_fn(role, ctx.corpus.learning_view(), ctx.tokenizer, ctx.eos_id, ctx.pad_id, ctx.profile, leg)


def _epoch_stage(
    ctx: Context, stage: str, kind: str, train_fn, epoch_line, resume, stop_after, protocol
) -> ProtocolResult:
    """SFT and the judge: the same resumable epoch stage over a different role and loss; the
    trained role is saved as `stage/kind.safetensors`, and `epoch_line(epoch record)` is printed
    per epoch."""
    check_stop_after(ctx.profile, stage, stop_after)
    paid, t = costs.snapshot(), time.perf_counter()
    # SPEC §10: the identity includes the initial fingerprints (learned and frozen) of the role.
    identity = ctx.identity(stage=stage, initial=initial_fingerprints({kind: ctx.role(kind)}))
    bar, tick = _progress(stage, 1)
    said: set[int] = set()  # epochs whose line is printed: each once, as it ends

    def say_epochs(epochs: list[dict]) -> None:
        for e in epochs:
            if e["epoch"] not in said:
                said.add(e["epoch"])
                _line(bar, epoch_line(e))

    def run_fn(leg: Leg):
        def progress(step, total, history, _timings):
            bar.total = total
            tick(step, total, history["updates"][-1]["loss"])
            if not leg.quiet:
                say_epochs(history["epochs"])

        return train_role(ctx, kind, train_fn, _also_progress(leg, progress)), {}

    result = run_protocol(ctx, stage, 1, run_fn, identity, resume=resume, stop_after=stop_after, protocol=protocol)
    bar.close()
    history = result.state["history"]
    say_epochs(history["epochs"])  # those of legs loaded from disk, not run by this command
    if stop_after is None:
        role = ctx.role(kind)
        role.load_learned_state(result.state[kind])
        if kind == "judge":
            role.freeze()  # the judge is frozen from here on
        folder = ctx.run / stage
        if not (folder / f"{kind}.safetensors.json").is_file():  # a rerun keeps a complete artifact
            save_role(role, folder / f"{kind}.safetensors", identity)
        write_json(folder / "history.json", history, keep_existing=True)
        write_json(
            folder / "timings.json",
            {
                "seconds": result.seconds,
                **(result.check or {}),
                "fixed_costs": costs.since(paid),
                "legs": result.legs,
                "stage_seconds": time.perf_counter() - t,
            },
            keep_existing=True,
        )
        mark_complete(ctx, stage, sha256_final=result.sha256_final)
    return result


def _sft_epoch_line(e: dict) -> str:
    line = f"sft epoch {e['epoch'] + 1}: train loss {e['train_loss']:.4f}"
    return line + (f"  validation loss {e['validation_loss']:.4f}" if "validation_loss" in e else "")


def _judge_epoch_line(e: dict) -> str:
    return (
        f"judge epoch {e['epoch'] + 1}: train loss {e['train_loss']:.4f}  validation loss "
        f"{e['validation_loss']:.4f}  validation accuracy {e['validation_accuracy']:.3f}"
    )


def stage_sft(ctx: Context, *, resume=False, stop_after=None, protocol=True) -> ProtocolResult:
    return _epoch_stage(ctx, "sft", "actor", train_sft, _sft_epoch_line, resume, stop_after, protocol)


def stage_judge(ctx: Context, *, resume=False, stop_after=None, protocol=True) -> ProtocolResult:
    return _epoch_stage(ctx, "judge", "judge", train_judge, _judge_epoch_line, resume, stop_after, protocol)


def member_stages(profile: Profile, *, ensemble: bool | None = None) -> list[str]:
    """The stages of a judge ensemble's other members (judge-1 .. judge-(k-1), k =
    ppo.ensemble_size): none unless the profile's reward design is an ensemble (or `ensemble`
    says so: a study's seed folder trains the members its ensemble arms start from)."""
    if not (designs.design(profile.ppo.reward_design).ensemble if ensemble is None else ensemble):
        return []
    return [f"judge-{m}" for m in range(1, profile.ppo.ensemble_size)]


def member_profile(profile: Profile, m: int) -> Profile:
    """The profile ensemble member m (1 .. k-1) is trained with: the judge's seeds (its adapters'
    and head's initialisation, its data order) each moved by m. Member 0 is the lab's judge."""
    seeds = profile.seeds
    return override(
        profile,
        {
            ("seeds", "judge_lora"): seeds.judge_lora + m,
            ("seeds", "judge_head"): seeds.judge_head + m,
            ("seeds", "data_order"): seeds.data_order + m,
        },
    )


def member_context(ctx: Context, stage: str) -> Context:
    """The context member `stage` (judge-m) trains in: this run, the member's profile."""
    member = copy.copy(ctx)
    member.profile = member_profile(ctx.profile, int(stage.split("-")[1]))
    return member


def stage_judge_member(ctx: Context, stage: str, *, resume=False, stop_after=None, protocol=True) -> ProtocolResult:
    """Train ensemble member `stage` (judge-m) exactly as the judge, from the member's seeds."""
    return _epoch_stage(
        member_context(ctx, stage), stage, "judge", train_judge, _judge_epoch_line, resume, stop_after, protocol
    )


def judge_files(ctx: Context) -> list[Path]:
    """The judge's file, then each ensemble member's (the run PPO starts from)."""
    return [ctx.trained_in / stage / "judge.safetensors" for stage in ["judge", *member_stages(ctx.profile)]]


def ppo_roles(ctx: Context) -> PpoRoles:
    """Actor, reference and critic from the SFT adapters; the judge (and an ensemble's other
    members) from their trained states."""
    judge, *members = [ctx.role("judge") for _ in judge_files(ctx)]
    roles = PpoRoles(
        actor=ctx.role("actor"),
        reference=ctx.role("reference"),
        judge=judge,
        critic=ctx.role("critic"),
        members=tuple(members),
    )
    sft_file = ctx.trained_in / "sft" / "actor.safetensors"
    load_role(roles.actor, sft_file)
    load_role(roles.reference, sft_file, source_kind="actor")
    load_role(roles.critic, sft_file, source_kind="actor", adapters_only=True)
    for role, path in zip((judge, *members), judge_files(ctx)):
        load_role(role, path)
        role.freeze()
    roles.reference.freeze()
    return roles


def ppo_fingerprints(ctx: Context) -> dict:
    """{role: rlhf.roles.fingerprint} of PPO's four roles as they start. The roles themselves are
    freed on return: four backbones (8 GB at the full Qwen width in float32) need not stay
    alive beside the ones PPO trains."""
    return {k: fingerprint(r) for k, r in ppo_roles(ctx).by_kind().items()}


def stop_rules_identity(profile: Profile) -> dict:
    """What stop_on_warning adds to a PPO identity: the hash of the frozen rules that may stop it
    ({} without the option). Refused when the rules file is missing or a named stop signal has
    no frozen rule (it could never stop PPO)."""
    if not profile.ppo.stop_on_warning:
        return {}
    if not signals.RULES_FILE.is_file():
        raise ValueError(f"[ppo] stop_on_warning needs the frozen warning rules {signals.RULES_FILE}")
    ruled = {rule.signal for rule in signals.frozen_rules()[0]}
    missing = [s for s in profile.ppo.stop_signals if s not in ruled]
    if missing:
        raise ValueError(
            f"[ppo] stop_signals {', '.join(missing)}: no frozen rule in {signals.RULES_FILE}, "
            "so it could never stop PPO"
        )
    return {"warning_rules": sha256_file(signals.RULES_FILE)}


def ppo_identity(ctx: Context, initial: dict) -> dict:
    """What a PPO state is computed from: the run's identity, the SFT and judge files it starts
    from, and the initial roles' fingerprints (`ppo_fingerprints`; what its checkpoints are
    loaded against)."""
    stops = stop_rules_identity(ctx.profile)  # the rules that may stop it are part of what it is computed from
    judge, *members = [sha256_file(path) for path in judge_files(ctx)]
    return ctx.identity(
        stage="ppo",
        sft=sha256_file(ctx.trained_in / "sft" / "actor.safetensors"),
        judge=judge,
        **({"judge_members": members} if members else {}),
        **stops,
        initial={k: [fp["learned_sha256"], fp["frozen_sha256"]] for k, fp in initial.items()},
    )


def stage_ppo(ctx: Context, *, resume=False, stop_after=None, use_cache=True, protocol=True) -> ProtocolResult:
    """PPO (SPEC §6) over the protocol's legs (run_protocol): each leg builds the four roles from
    SFT and the judge (ppo_roles), trains them (rlhf.ppo.train_ppo), and checks that no two share
    storage and that only actor and critic moved; then the final roles and records are written."""
    check_stop_after(ctx.profile, "ppo", stop_after)
    paid, t_stage = costs.snapshot(), time.perf_counter()
    initial = ppo_fingerprints(ctx)
    identity = ppo_identity(ctx, initial)
    cfg = ctx.profile.ppo
    bar, tick = _progress("PPO", cfg.iterations)
    announced: set[str] = set()  # warnings printed: each once per command, whichever leg fired it first
    run_fn = partial(_ppo_leg, ctx, bar=bar, tick=tick, announced=announced, use_cache=use_cache)
    result = run_protocol(
        ctx,
        "ppo",
        cfg.resume_stop_iteration,
        run_fn,
        identity,
        resume=resume,
        stop_after=stop_after,
        protocol=protocol,
        checkpoint_every=cfg.checkpoint_every,
    )
    bar.close()
    if stop_after is None:
        timings = {
            "fixed_costs": costs.since(paid),
            "legs": result.legs,
            "stage_seconds": time.perf_counter() - t_stage,
        }
        _write_ppo(ctx, result, initial, identity, timings)
    return result


def _ppo_leg(ctx: Context, leg: Leg, *, bar, tick, announced: set[str], use_cache: bool):
    """One leg of PPO (run_protocol's run_fn): fresh roles, the leg trained, the roles checked.
    A quiet leg (the continuous one that checks the run) ticks the bar and prints nothing."""
    judge_learns = designs.design(ctx.profile.ppo.reward_design).refreshes_judge  # refreshed during PPO (rlhf.refresh)
    roles = ppo_roles(ctx)
    assert_role_isolation(roles)
    before = {k: fingerprint(r) for k, r in roles.by_kind().items()}
    seed_system_rngs(ctx.profile.seeds.ppo("torch"))
    watch = warning_watch(ctx.profile.ppo, announced, say=None if leg.quiet else _say)
    progress = _ppo_progress(bar, tick, quiet=leg.quiet)
    out, tm = train_ppo(
        roles,
        ctx.corpus.learning_view(),
        ctx.tokenizer,
        ctx.eos_id,
        ctx.pad_id,
        ctx.profile,
        replace(_also_progress(leg, progress), watch=watch),
        use_cache=use_cache,
    )
    assert_role_isolation(roles)
    after = {k: fingerprint(r) for k, r in roles.by_kind().items()}
    moved = out["iterations_done"] > (leg.state or {}).get("iterations_done", 0)
    check_fingerprints(before, after, moved=moved, judge_learns=judge_learns)
    return out, tm


PRINT_EVERY = 10  # PPO prints every 10th iteration (and the last), on a terminal or to a file


def _ppo_progress(bar, tick, *, quiet: bool = False):
    """The progress callback of a PPO leg: the bar, and a line every PRINT_EVERY-th iteration
    (none in a quiet leg)."""

    def progress(it, total, history, _timings):
        rec = history["iterations"][-1]
        tick(it, total, rec["policy_loss"][-1])
        if quiet or not (it % PRINT_EVERY == 0 or it == total):
            return
        line = (
            f"ppo iteration {it}: learned reward {rec['mean_score']:+.3f}  sampled log-ratio per token "
            f"{rec['mean_sampled_log_ratio']:+.4f}  value loss {rec['value_loss'][-1]:.4f}  "
            f"clip fraction {rec['clip_fraction'][-1]:.3f}  length {rec['response_length']:.1f}  "
            f"truncations {rec['truncations']}"
        )
        _line(bar, line)

    return progress


def warning_watch(cfg, announced: set[str] | None = None, say=_say):
    """watch(history) for a PPO leg: says each frozen warning rule the first time it fires
    (rlhf.signals), in the order of the iterations where they fired (numbered from 1, as the
    console's iteration lines and ppo/warnings.json count), and never a signal already
    in `announced` (shared by a command's legs; `say` None: silent); True stops PPO when
    `cfg.stop_on_warning` names that signal (or any), whether or not it is said."""
    rules, window = signals.frozen_rules()
    announced = set() if announced is None else announced

    def watch(history: dict) -> bool:
        fired = signals.fired_in_order(history, rules, window)
        for index, rule in fired:
            if say is not None and rule.signal not in announced:
                announced.add(rule.signal)
                say(
                    f"warning: over-optimisation signal {rule.signal} fired at iteration {index + 1} "
                    f"({rule.describe()})" + ("; PPO stops here (stop_on_warning)" if _stops(cfg, rule) else "")
                )
        return any(_stops(cfg, rule) for _, rule in fired)

    return watch


def _stops(cfg, rule) -> bool:
    """Whether `rule`, once fired, stops PPO: stop_on_warning set, and its signal named in
    stop_signals (or none named)."""
    return bool(cfg.stop_on_warning and (not cfg.stop_signals or rule.signal in cfg.stop_signals))


def fired_warnings(history: dict, cfg) -> dict:
    """ppo/warnings.json: every frozen warning rule that fired over the run's PPO history, in the
    order of the iterations where they fired (numbered from 1: the iteration after which it fired,
    as the console counts), and whether PPO stopped there; with the rules file's hash and window."""
    rules, window = signals.frozen_rules()
    done = len(history["iterations"])
    return {
        "rules_file": signals.RULES_FILE.name,
        "rules_sha256": sha256_file(signals.RULES_FILE),
        "window": window,
        "fired": [
            {
                "signal": rule.signal,
                "iteration": index + 1,
                "rule": rule.describe(),
                # PPO stops after the iteration where a stopping rule fires, short of its budget
                "stopped_ppo": _stops(cfg, rule) and index + 1 == done < cfg.iterations,
            }
            for index, rule in signals.fired_in_order(history, rules, window)
        ],
    }


def _write_ppo(ctx: Context, result: ProtocolResult, initial: dict, identity: dict, timings: dict) -> None:
    """PPO's files: the final actor and critic (and the refreshed judge), history, timings and the
    fingerprints before and after, each kept as it is on a rerun; then run.json says complete."""
    judge_learns = designs.design(ctx.profile.ppo.reward_design).refreshes_judge
    folder = ctx.run / "ppo"
    final = ppo_roles(ctx)
    for kind, key in STATE_KEYS.items():
        final.by_kind()[kind].load_learned_state(result.state[key])
    # From the initial roles and the final state, so that a rerun after a crash writes the same.
    fingerprints = {"before": _short(initial), "after": _short({k: fingerprint(r) for k, r in final.by_kind().items()})}
    check_fingerprints(fingerprints["before"], fingerprints["after"], judge_learns=judge_learns)
    for role in (final.actor, final.critic, *((final.judge,) if judge_learns else ())):
        if not (folder / f"{role.kind}.safetensors.json").is_file():
            save_role(role, folder / f"{role.kind}.safetensors", identity)
    write_json(folder / "history.json", result.state["history"], keep_existing=True)
    write_json(folder / "warnings.json", fired_warnings(result.state["history"], ctx.profile.ppo), keep_existing=True)
    record = {"seconds": result.seconds, **result.timings, **(result.check or {}), **timings}
    write_json(folder / "timings.json", record, keep_existing=True)
    write_json(folder / "fingerprints.json", fingerprints, keep_existing=True)
    mark_complete(ctx, "ppo", sha256_final=result.sha256_final)


# ------------------------------------------------------------------------- the whole lab

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
            _say(f"{name}: already complete in {ctx.run} (skipped)")
        else:
            result = fn(ctx, protocol=protocol)
            check = result.check or {}  # a full run always records its check
            if check.get("protocol"):
                _say(
                    f"{name}: {result.seconds:.1f} s; interrupt/resume identical: {check.get('identical')} "
                    f"({check.get('tensors_compared')} tensors; state sha256 resumed "
                    f"{str(check.get('sha256_resumed'))[:12]} = continuous {str(check.get('sha256_continuous'))[:12]})"
                )
            else:
                _say(
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
            _say(f"{name}: already complete in {ctx.run} (skipped)")
        else:
            t = time.perf_counter()
            sweep_incomplete(ctx.run / folder)
            if not (ctx.run / folder / "results.json").exists():  # written whole and last: there means done
                write_results(ctx)
            mark_complete(ctx, name, seconds=time.perf_counter() - t)
            _say(f"{name}: {time.perf_counter() - t:.1f} s")
            _stop_if_requested(ctx)
            if done is not None:
                done(name)
        if name == until:
            return


def _stop_if_requested(ctx: Context) -> None:
    """Ctrl-C during a stage without checkpoints: stop between stages."""
    if stop_requested():
        raise Interrupted(f"stopped on request between stages; run the same command again to continue in {ctx.run}")


def initial_fingerprints(roles: dict[str, Role]) -> dict:
    """{role: [learned_sha256, frozen_sha256]} of freshly built roles (part of a stage's identity)."""
    return {k: [fp["learned_sha256"], fp["frozen_sha256"]] for k, fp in ((k, fingerprint(r)) for k, r in roles.items())}


def _short(fps: dict) -> dict:
    return {k: {"learned_sha256": v["learned_sha256"], "frozen_sha256": v["frozen_sha256"]} for k, v in fps.items()}


def check_fingerprints(before: dict, after: dict, moved: bool = True, judge_learns: bool = False) -> None:
    """Reference, judge and any ensemble member unchanged (the judge may move only when the
    iterated judge refreshes it); every base unchanged; actor and critic changed."""
    if set(before) != set(after):
        raise AssertionError(f"roles before PPO {sorted(before)} are not the roles after it {sorted(after)}")
    for kind in before:
        if before[kind]["frozen_sha256"] != after[kind]["frozen_sha256"]:
            raise AssertionError(f"the frozen base of role {kind} changed during PPO")
    for kind in sorted(set(before) - {"actor", "critic", *(("judge",) if judge_learns else ())}):
        if before[kind]["learned_sha256"] != after[kind]["learned_sha256"]:
            raise AssertionError(f"role {kind} changed during PPO; it must stay frozen")
    if moved:
        for kind in ("actor", "critic"):
            if before[kind]["learned_sha256"] == after[kind]["learned_sha256"]:
                raise AssertionError(f"role {kind} did not change during PPO")
