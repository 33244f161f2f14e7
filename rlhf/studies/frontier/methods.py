"""The frontier's arms that are not PPO, in an arm's folder beside PPO's: DPO from the seed's
judge's train pairs (rlhf.dpo) and GRPO without a critic, paid by the seed's judge (rlhf.grpo),
both from the seed's SFT actor. Each is crash-safe (a checkpoint at every measured point; a rerun
continues from the last one, bit for bit) and keeps its actor at every measured point:

  dpo   after every epoch (its `epochs`, default EPOCHS), at its `beta` (default rlhf.dpo.BETA)
  grpo  at PPO's checkpoint iterations (10, 20, ..., 100), with its `group_size` and `beta`

An arm's `method_settings` declares what is the method's own (arms.METHOD_SETTINGS); everything else is the seed's
profile (PPO's actor settings, its seeds). ARM_FOLDER/METHOD/ holds the final state, the
checkpoints, history.json and timings.json (seconds per epoch or iteration, for the cost beside
PPO's).
"""

from __future__ import annotations

import time
from pathlib import Path

from rlhf.checkpoint import Interrupted, Leg, StateWriter, load_state, save_state, stop_requested
from rlhf.identities import sha256_file
from rlhf.io import write_json
from rlhf.roles import load_role
from rlhf.runtime import seed_system_rngs
from rlhf.studies import StudyError
from rlhf.studies.frontier.arms import check_method

EPOCHS = 3  # DPO's passes over the train pairs unless declared (TRL's num_train_epochs default)
FINAL = "state.pt.gz"


def measured_points(profile, method: str, settings: dict) -> list[int]:
    """The epochs (DPO) or iterations (PPO, GRPO) whose actor is kept and measured."""
    if method == "dpo":
        return list(range(1, int(settings.get("epochs", EPOCHS)) + 1))
    cfg = profile.ppo
    return [*range(cfg.checkpoint_every, cfg.iterations, cfg.checkpoint_every), cfg.iterations]


def _identity(ctx, method: str, settings: dict) -> dict:
    sft = ctx.trained_in / "sft" / "actor.safetensors"
    judge = {"judge": sha256_file(ctx.trained_in / "judge" / "judge.safetensors")} if method == "grpo" else {}
    return ctx.identity(stage=method, sft=sha256_file(sft), **judge, settings=dict(sorted(settings.items())))


def _sft_actor(ctx, *, frozen: bool):
    role = ctx.role("actor")
    load_role(role, ctx.trained_in / "sft" / "actor.safetensors")
    if frozen:
        role.freeze()
    return role


def _trainer(ctx, method: str, settings: dict):
    """leg -> (state, seconds per epoch or iteration this leg ran): the method's training from the
    seed's SFT (a resumed leg's seconds are its own)."""
    from rlhf import dpo, grpo

    view, tokens, profile = ctx.corpus.learning_view(), ctx.tokens(), ctx.profile
    actor, reference = _sft_actor(ctx, frozen=False), _sft_actor(ctx, frozen=True)
    if method == "dpo":
        cfg = dpo.budget(profile, len(view.pairs("train")), beta=float(settings.get("beta", dpo.BETA)),
                         epochs=int(settings.get("epochs", EPOCHS)))  # fmt: skip

        def run_dpo(leg: Leg):
            seconds: list[float] = []  # per epoch this leg ran
            clock = {"t": time.perf_counter(), "epochs": (leg.state or {}).get("epochs_done", 0)}

            def progress(_step, _total, history, _measured):
                if len(history["epochs"]) > clock["epochs"]:  # an epoch ended (its validation included)
                    seconds.append(time.perf_counter() - clock["t"])
                    clock.update(t=time.perf_counter(), epochs=len(history["epochs"]))

            state = dpo.train_dpo(actor, reference, view, tokens.tokenizer, tokens.eos_id, tokens.pad_id, profile,
                                  cfg, Leg(state=leg.state, checkpoint=leg.checkpoint, progress=progress))  # fmt: skip
            return state, {"per_epoch": seconds}

        return run_dpo
    judge = ctx.role("judge")
    load_role(judge, ctx.trained_in / "judge" / "judge.safetensors")
    judge.freeze()
    roles = grpo.GrpoRoles(actor, reference, judge)
    gs = grpo.Settings(int(settings.get("group_size", grpo.GROUP_SIZE)), float(settings.get("beta", grpo.BETA)))
    gs.check(profile.ppo.prompts_per_iteration)
    return lambda leg: grpo.train_grpo(roles, view, tokens, profile, gs, leg)


def train_method(ctx, method: str, settings: dict) -> None:
    """Train the arm's method in ctx.run/METHOD (module docstring), continuing from its last
    checkpoint; nothing is done when its final state is there."""
    check_method(method, settings)
    folder = ctx.run / method
    if (folder / FINAL).is_file():
        return
    identity = _identity(ctx, method, settings)
    saved = sorted((folder / "checkpoints").glob("*.pt.gz"))
    state = load_state(saved[-1], identity) if saved else None
    seed_system_rngs(ctx.profile.seeds.ppo("torch"))  # a resumed leg restores the RNGs from its state
    writer = StateWriter()

    points = measured_points(ctx.profile, method, settings)

    def checkpoint(n: int, make_state) -> None:  # each measured point's actor is kept, and where a stop is asked
        interrupt = stop_requested()
        path = folder / "checkpoints" / f"{n:04d}.pt.gz"
        if (n in points or interrupt) and not path.exists():
            writer.save(path, make_state(), identity)
        if interrupt:
            writer.wait()
            raise Interrupted(f"{method}: stopped on request after {n}; checkpoint {path}. Run again to continue")

    run = _trainer(ctx, method, settings)
    try:
        state, seconds = run(Leg(state=state, checkpoint=checkpoint))
        writer.wait()
    finally:
        writer.abandon()
    write_json(folder / "history.json", state["history"], overwrite=True)
    write_json(folder / "timings.json", seconds, overwrite=True)
    save_state(folder / FINAL, state, identity)


def actor_at(ctx, method: str, settings: dict, point: int):
    """The method's actor after `point` epochs (DPO) or iterations (GRPO), frozen."""
    folder = ctx.run / method
    last = measured_points(ctx.profile, method, settings)[-1]
    path = folder / FINAL if point == last else folder / "checkpoints" / f"{point:04d}.pt.gz"
    if not Path(path).is_file():
        raise StudyError(f"{path} is missing: train the arm ({method}) to that point first")
    state = load_state(path, _identity(ctx, method, settings))
    actor = _sft_actor(ctx, frozen=False)
    actor.load_learned_state(state["actor"])
    actor.freeze()
    return actor


def method_done(arm_dir: Path, method: str) -> bool:
    """The method's final state is written (its training is complete)."""
    return (arm_dir / method / FINAL).is_file()
