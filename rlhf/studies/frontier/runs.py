"""The run folders of a frontier study: each seed's SFT and judge, each arm's PPO started from
them (seed-i/arms/ARM, its own profile), and an arm's actor at a kept checkpoint."""

from __future__ import annotations

from pathlib import Path

from rlhf import lab
from rlhf.checkpoint import load_state
from rlhf.config import load_profile
from rlhf.corpus import load_corpus
from rlhf.io import read_json
from rlhf.roles import load_role
from rlhf.studies import StudyError
from rlhf.studies.derivation import write_run_profile
from rlhf.studies.frontier.arms import Arm


def roles_for_measuring(ctx: lab.Context):
    """The SFT actor and the frozen judge of the seed's folder (ctx.trained_in)."""
    return (
        frozen_role(ctx, "actor", ctx.trained_in / "sft" / "actor.safetensors"),
        frozen_role(ctx, "judge", ctx.trained_in / "judge" / "judge.safetensors"),
    )


def frozen_role(ctx: lab.Context, kind: str, path: Path):
    role = ctx.role(kind)
    load_role(role, path)
    role.freeze()
    return role


def measured_iterations(profile, arm: Arm | None = None) -> list[int]:
    """The points whose actor is kept: every checkpoint PPO saves, and the last; for an arm of
    another method, its own (rlhf.studies.frontier.methods: DPO's epochs, GRPO's iterations)."""
    if arm is not None and arm.method != "ppo":
        from rlhf.studies.frontier import methods

        return methods.measured_points(profile, arm.method, dict(arm.method_settings))
    cfg = profile.ppo
    return [*range(cfg.checkpoint_every, cfg.iterations, cfg.checkpoint_every), cfg.iterations]


def arm_context(seed_dir: Path, arm: Arm, revision: str, *, run_dir: Path | None = None) -> lab.Context:
    """The arm's run folder seed-i/arms/ARM (or `run_dir`): its profile (written on first use,
    checked after), the seed's corpus and base, and the seed's SFT and judge to start from."""
    spread = read_json(seed_dir / "frontier" / "sft.json")["spread"]
    seed_profile = load_profile(str(seed_dir / "profile.toml"))
    arm_dir = run_dir or seed_dir / "arms" / arm.name
    profile = write_run_profile(
        arm_dir / "profile.toml",
        (seed_dir / "profile.toml").read_text(),
        f"{seed_profile.name}-{arm.name}",
        arm.changes(spread),
    )
    corpus = load_corpus(seed_dir / "corpus")
    if corpus.revision != revision:
        raise StudyError(f"{seed_dir} holds corpus {corpus.revision}, not {revision}")
    ctx = lab.Context(arm_dir, profile, seed_dir / "base_model", corpus, trained_in=seed_dir)
    lab.check_run_record(ctx)
    return ctx


def final_iteration(ctx: lab.Context) -> int:
    """How many iterations PPO's final state holds (as checkpoints count them): the profile's
    last, or fewer where a warning rule stopped it (stop_on_warning; a rule that fires at
    iteration k, counted from 0, stops PPO with k + 1 done)."""
    return len(read_json(ctx.run / "ppo" / "history.json")["iterations"])


def actor_at(ctx: lab.Context, iteration: int, arm: Arm | None = None):
    """The arm's actor after `iteration` iterations (a DPO arm's: epochs), from its checkpoint or
    final state."""
    if arm is not None and arm.method != "ppo":
        from rlhf.studies.frontier import methods

        return methods.actor_at(ctx, arm.method, dict(arm.method_settings), iteration)
    folder = ctx.run / "ppo"
    last = ctx.profile.ppo.iterations
    path = (
        folder / "state-continuous.pt.gz"
        if iteration == last
        else folder / "checkpoints" / f"continuous-{iteration:04d}.pt.gz"
    )
    state = load_state(path, lab.ppo_identity(ctx, lab.ppo_fingerprints(ctx)))
    actor = ctx.role("actor")
    load_role(actor, ctx.trained_in / "sft" / "actor.safetensors")
    actor.load_learned_state(state["actor"])
    actor.freeze()
    return actor
