"""The training stages over a run folder: SFT and the judge (one resumable epoch stage over a
different role and loss), a judge ensemble's other members, and PPO (its roles built from SFT and
the judge, its identity, its legs, its files); each run through the protocol."""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

from rlhf import costs, designs
from rlhf.checkpoint import Leg
from rlhf.config import Profile, override
from rlhf.io import crash_point, sha256_file, write_json
from rlhf.judge import train_judge
from rlhf.lab.console import bar_line, fired_warnings, ppo_progress, print_line, progress_bar, warning_watch
from rlhf.lab.protocol import ProtocolResult, also_progress, check_stop_after, run_leg, run_protocol
from rlhf.lab.run import Context, mark_complete, read_context, stop_rules_identity
from rlhf.legs import SIDE_BY_SIDE, Beside
from rlhf.ppo import STATE_KEYS, train_ppo
from rlhf.roles import PpoRoles, Role, assert_role_isolation, fingerprint, load_role, save_role
from rlhf.runtime import seed_system_rngs
from rlhf.sft import train_sft


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
    bar, tick = progress_bar(stage, 1)
    said: set[int] = set()  # epochs whose line is printed: each once, as it ends

    def say_epochs(epochs: list[dict]) -> None:
        for e in epochs:
            if e["epoch"] not in said:
                said.add(e["epoch"])
                bar_line(bar, epoch_line(e))

    def bar_tick(step, total, loss):
        bar.total = total
        tick(step, total, loss)

    run_fn = partial(_epoch_leg, ctx, kind, train_fn, tick=bar_tick, say_epochs=say_epochs)
    beside = _beside(ctx, stage, identity, 1) if protocol else None
    result = run_protocol(
        ctx, stage, 1, run_fn, identity, resume=resume, stop_after=stop_after, protocol=protocol, beside=beside
    )
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


def _epoch_leg(ctx: Context, kind: str, train_fn, leg: Leg, *, tick=None, say_epochs=None):
    """One leg of SFT or the judge (run_protocol's run_fn): a fresh role trained over the leg; the
    bar ticked and each epoch's line said (none in a quiet leg), where given."""

    def progress(step, total, history, _measured):
        if tick is not None:
            tick(step, total, history["updates"][-1]["loss"])
        if say_epochs is not None and not leg.quiet:
            say_epochs(history["epochs"])

    return train_role(ctx, kind, train_fn, also_progress(leg, progress)), {}


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
    bar, tick = progress_bar("PPO", cfg.iterations)
    announced: set[str] = set()  # warnings printed: each once per command, whichever leg fired it first
    run_fn = partial(_ppo_leg, ctx, bar=bar, tick=tick, announced=announced, use_cache=use_cache)
    beside = _beside(ctx, "ppo", identity, cfg.checkpoint_every, use_cache) if protocol else None
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
        beside=beside,
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


def _ppo_leg(ctx: Context, leg: Leg, *, bar=None, tick=None, announced: set[str] | None = None, use_cache: bool = True):
    """One leg of PPO (run_protocol's run_fn): fresh roles, the leg trained, the roles checked.
    A quiet leg (the continuous one that checks the run) ticks the bar and prints nothing."""
    judge_learns = designs.design(ctx.profile.ppo.reward_design).refreshes_judge  # refreshed during PPO (rlhf.refresh)
    roles = ppo_roles(ctx)
    assert_role_isolation(roles)
    before = {k: fingerprint(r) for k, r in roles.by_kind().items()}
    seed_system_rngs(ctx.profile.seeds.ppo("torch"))
    watch = warning_watch(ctx.profile.ppo, announced, say=None if leg.quiet else print_line)
    progress = ppo_progress(bar, tick or (lambda *_: None), quiet=leg.quiet)
    leg = replace(also_progress(leg, progress), watch=watch)
    out, tm = train_ppo(roles, ctx.corpus.learning_view(), ctx.tokens(use_cache), ctx.profile, leg)
    assert_role_isolation(roles)
    after = {k: fingerprint(r) for k, r in roles.by_kind().items()}
    moved = out["iterations_done"] > (leg.state or {}).get("iterations_done", 0)
    check_fingerprints(before, after, moved=moved, judge_learns=judge_learns)
    return out, tm


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


# ------------------------------------------------------------------ the continuous leg beside


def _beside(ctx: Context, stage: str, identity: dict, every: int, use_cache: bool = True):
    """run_protocol's `beside` where this run asks for its legs side by side (ctx.legs), else None:
    the continuous leg of `stage` in a process of its own (rlhf.legs)."""
    if ctx.legs != SIDE_BY_SIDE:
        return None
    args = (str(ctx.run), str(ctx.trained_in), ctx.profile, str(ctx.model_dir), ctx.corpus.revision, stage,
            identity, every, use_cache)  # fmt: skip
    return lambda: Beside(ctx.run / stage, continuous_leg, args).start()


def continuous_leg(run, trained_in, profile: Profile, model_dir, revision: str, stage: str, identity: dict,
                   every: int, use_cache: bool) -> dict:  # fmt: skip
    """The continuous leg of `stage` in the other process: the run's context read (nothing
    prepared, swept or written but the leg's own files), the leg run quiet and crash-safe as in
    the protocol; returns its seconds, clock and timings."""
    ctx = read_context(run, profile, revision, model_dir=model_dir, trained_in=trained_in)
    if stage == "ppo":
        run_fn = partial(_ppo_leg, ctx, use_cache=use_cache)
    else:
        kind, train_fn = ("actor", train_sft) if stage == "sft" else ("judge", train_judge)
        run_fn = partial(_epoch_leg, ctx, kind, train_fn)

    def with_crash_point(leg: Leg):
        return run_fn(also_progress(leg, lambda *_: crash_point("beside.progress")))

    out = run_leg(ctx, stage, "continuous", lambda: None, None, run_fn=with_crash_point, identity=identity,
                  every=every, compared=True)  # fmt: skip
    return {"seconds": out.seconds, "clock": out.clock, "timings": out.timings}
