"""The validation measurements of a frontier study, each written whole and once: per seed the
SFT policy (seed-i/frontier/sft.json: iteration 0, best-of-n, the judge's spreads; best-of-n
under the ensembles), per arm every checkpoint PPO kept (seed-i/arms/ARM/validation/). Every
measurement takes the corpus's learning view only (rlhf.studies.validation)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

from rlhf import events, lab
from rlhf.checkpoint import Interrupted, stop_requested
from rlhf.config import load_profile
from rlhf.io import read_json, write_json
from rlhf.studies import StudyError, log_to
from rlhf.studies.frontier.arms import SPEC_KL, Arm, Settings
from rlhf.studies.frontier.runs import (
    actor_at,
    arm_context,
    frozen_role,
    measured_iterations,
    roles_for_measuring,
)
from rlhf.studies.validation import (
    best_of_n,
    best_of_n_ensemble,
    measure_policy,
    score_spread,
    validation_prompts,
)


def measurement_seeds(profile) -> dict[str, int]:
    """Generators of the measurements: from the profile's evaluation seed (kept across runs)."""
    e = profile.seeds.evaluation
    return {"best_of_n": e, "train_spread": e + 1, "kl": e + 2}


def prepare_seed(
    seed_dir, revision: str, settings: Settings, *, confirm: bool = False, log: bool = True, ensemble: bool = False
) -> str:
    """SFT and judge (once; with `ensemble`, the ensemble's other members too), then
    seed-i/frontier/sft.json: the SFT policy on validation prompts (iteration 0, best-of-n, the
    judge's spreads). `confirm`: spreads only."""
    seed_dir = Path(seed_dir)
    if not _seed_ready(seed_dir, ensemble):  # else nothing to do (an extended study's seeds): not even opened
        _train_and_measure_sft(seed_dir, revision, settings, confirm=confirm, log=log, ensemble=ensemble)
    if ensemble and settings.bon_ensembles and not confirm and not (seed_dir / "frontier" / BON_ENSEMBLE).is_file():
        ensemble_best_of_n(seed_dir, revision, settings, log=log)
    return str(seed_dir)


def _train_and_measure_sft(seed_dir: Path, revision: str, settings: Settings, *, confirm, log, ensemble) -> None:
    with contextlib.ExitStack() as stack:
        if log:
            log_to(seed_dir / "frontier.log", stack)
        ctx = lab.open_context(seed_dir, load_profile(str(seed_dir / "profile.toml")), revision=revision)
        for name, fn in (("sft", lab.stage_sft), ("judge", lab.stage_judge)):
            if not lab.stage_complete(ctx, name):
                fn(ctx, protocol=False)
        for name in lab.member_stages(ctx.profile, ensemble=ensemble):  # the ensemble arms' other judges
            if not lab.stage_complete(ctx, name):
                lab.stage_judge_member(ctx, name, protocol=False)
        out = seed_dir / "frontier" / "sft.json"
        if out.is_file():
            return
        sft, judge = roles_for_measuring(ctx)
        view = ctx.corpus.learning_view()
        seeds = measurement_seeds(ctx.profile)
        t0 = time.perf_counter()
        if confirm:  # the spread only: one sample per prompt (the same draw as best-of-n's first)
            val = score_spread(
                sft.model,
                judge,
                validation_prompts(view, ctx.profile.evaluation.max_units),
                ctx,
                seed=seeds["best_of_n"],
            )
            record: dict = {"spread": {"validation": val}}
        else:
            bon = best_of_n(sft.model, judge, view, ctx, ns=settings.bon_ns, seed=seeds["best_of_n"])
            # The SFT policy itself: its KL from SFT is 0 by construction, so no sample is drawn for it.
            iteration0 = measure_policy(sft.model, sft.model, judge, view, ctx, kl_samples=0, seed=seeds["kl"])
            record = {
                "best_of_n": bon,
                "iteration_0": iteration0,
                "spread": {"validation": {**bon["spread"], "seed": seeds["best_of_n"]}},
            }
        record["spread"]["train"] = score_spread(
            sft.model, judge, view.rollout_prompts(), ctx, seed=seeds["train_spread"]
        )
        record["seeds"] = seeds
        record["seconds"] = time.perf_counter() - t0
        write_json(out, record)


BON_ENSEMBLE = "best-of-n-ensemble.json"  # in seed-i/frontier/
BON_ENSEMBLE_RUN = "best-of-n-ensemble"  # seed-i/best-of-n-ensemble: the run folder that measures it


def ensemble_best_of_n(seed_dir: Path, revision: str, settings: Settings, *, log: bool = True) -> None:
    """seed-i/frontier/best-of-n-ensemble.json: best-of-n ranked by each ensemble reward of
    `settings.bon_ensembles`, on the draws of the seed's best-of-n (the same seed), scored by the
    seed's judge and members as the first ensemble arm uses them (its k, its lambda). Measured in
    a run folder of its own (seed-i/best-of-n-ensemble) that reads the seed's trained states, so
    a study whose seeds were measured before can gain it; member 0's scores must equal those of
    the seed's best-of-n, or nothing is written."""
    arm = settings.ensemble_arm()
    if arm is None:
        raise StudyError("best-of-n under an ensemble needs an ensemble arm (its members)")
    spec = dataclasses.replace(arm, name=BON_ENSEMBLE_RUN, c=None, raw=SPEC_KL, c_from_grid=False)
    with contextlib.ExitStack() as stack:
        if log:
            log_to(seed_dir / "frontier.log", stack)
        ctx = arm_context(seed_dir, spec, revision, run_dir=seed_dir / BON_ENSEMBLE_RUN)
        sft, _ = roles_for_measuring(ctx)
        paths = lab.judge_files(ctx)  # the judge, then each member
        members = [frozen_role(ctx, "judge", path) for path in paths]
        seed = measurement_seeds(ctx.profile)["best_of_n"]
        t0 = time.perf_counter()
        record = best_of_n_ensemble(
            sft.model,
            members,
            ctx.corpus.learning_view(),
            ctx,
            ns=settings.bon_ns,
            seed=seed,
            designs=settings.bon_ensembles,
        )
        stored = read_json(seed_dir / "frontier" / "sft.json")["best_of_n"]
        mine = [list(per_prompt) for per_prompt in zip(*record["member_scores"][0])]  # [P][n]
        if stored["seed"] != seed or mine != stored["scores"]:
            raise StudyError(
                f"{seed_dir}: the judge's scores of the ensemble's best-of-n draws differ from the seed's "
                "best-of-n: not the same samples. Nothing was written"
            )
        record["members"] = [p.parent.name for p in paths]
        record["seconds"] = time.perf_counter() - t0
        write_json(seed_dir / "frontier" / BON_ENSEMBLE, record)
        print(
            f"best-of-n under the ensemble ({len(members)} judges): "
            + "; ".join(
                f"{d} gold " + " ".join(f"{p['gold']:.3f}" for p in v["points"]) for d, v in record["designs"].items()
            ),
            flush=True,
        )


def _seed_ready(seed_dir: Path, ensemble: bool) -> bool:
    """The seed's SFT, judge (and, with `ensemble`, the members) complete and its SFT measured."""
    run = seed_dir / lab.RUN_FILE
    if not run.is_file() or not (seed_dir / "frontier" / "sft.json").is_file():
        return False
    stages = read_json(run)["stages"]
    profile = load_profile(str(seed_dir / "profile.toml"))
    return all(s in stages for s in ["sft", "judge", *lab.member_stages(profile, ensemble=ensemble)])


def run_arm(seed_dir, arm: Arm, revision: str, settings: Settings, *, measure: bool = True, log: bool = True) -> str:
    """The arm's training from the seed's SFT and judge (PPO, or its method's), then every kept
    checkpoint on validation."""
    seed_dir = Path(seed_dir)
    arm_dir = seed_dir / "arms" / arm.name
    arm_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if log:
            log_to(arm_dir / "lab.log", stack)
        ctx = arm_context(seed_dir, arm, revision)
        train_arm(ctx, arm)
        if not measure:
            return str(arm_dir)
        sft, judge = roles_for_measuring(ctx)
        view = ctx.corpus.learning_view()
        curves: events.ScalarLog | None = None
        seed = measurement_seeds(ctx.profile)["kl"]
        points = measured_iterations(ctx.profile, arm)
        for it in points:
            out = arm_dir / "validation" / f"iter-{it:04d}.json"
            if out.is_file():
                continue
            if stop_requested():  # each measurement is written whole: a rerun measures the rest
                raise Interrupted(f"{arm.name}: stopped on request before measuring {it}. Run again to continue")
            t0 = time.perf_counter()
            m = measure_policy(
                actor_at(ctx, it, arm).model, sft.model, judge, view, ctx, kl_samples=settings.kl_samples, seed=seed
            )
            if curves is None:
                curves = _validation_curves(seed_dir, arm_dir, it, first=it == points[0])
                stack.enter_context(contextlib.closing(curves))
            curves.write(events.validation_scalars(m), it)
            curves.flush()
            write_json(out, {"iteration": it, **m, "seconds": time.perf_counter() - t0})
            print(
                f"{arm.name} iteration {it}: gold {m['gold']:.3f}  proxy {m['proxy']:+.2f}  KL {m['kl']:.3f}",
                flush=True,
            )
    return str(arm_dir)


def _validation_curves(seed_dir: Path, arm_dir: Path, it: int, first: bool) -> events.ScalarLog:
    """The arm's validation curves (tensorboard/validation), opened at the first checkpoint not yet
    measured (a rerun's purge step); a fresh series starts with the SFT policy's point at step 0."""
    curves = events.ScalarLog(arm_dir, "validation", 0 if first else it)
    sft = read_json(seed_dir / "frontier" / "sft.json").get("iteration_0")
    if first and sft is not None:
        curves.write(events.validation_scalars(sft), 0)
    return curves


def arm_complete(seed_dir: Path, arm: Arm, profile) -> bool:
    return all(
        (seed_dir / "arms" / arm.name / "validation" / f"iter-{it:04d}.json").is_file()
        for it in measured_iterations(profile, arm)
    )


def train_arm(ctx, arm: Arm) -> None:
    """The arm's training, unless complete: PPO as the lab runs it (one leg), or the arm's method."""
    if arm.method == "ppo":
        if not lab.stage_complete(ctx, "ppo"):
            lab.stage_ppo(ctx, protocol=False)
        return
    from rlhf.studies.frontier import methods

    methods.train_method(ctx, arm.method, dict(arm.method_settings))


def arm_trained(seed_dir: Path, arm: Arm) -> bool:
    """The arm's training is complete (its run record names PPO; another method's final state)."""
    arm_dir = seed_dir / "arms" / arm.name
    if arm.method != "ppo":
        from rlhf.studies.frontier import methods

        return methods.method_done(arm_dir, arm.method)
    path = arm_dir / "run.json"
    return path.is_file() and "ppo" in read_json(path).get("stages", {})
