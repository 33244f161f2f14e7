"""The frontier's confirmation on test (`rlhf frontier --out DIR --confirm N`): the operating
point chosen on validation (frontier.json), the SPEC's default, and the default stopped by a
frozen warning rule, each run on N fresh training seeds (study seed 2) and evaluated on test as
SPEC §8, with the seed study's across-seed statistics.

The only module of rlhf.studies.frontier that reads test prompts: it runs once the choice is
written, and nothing it measures feeds back into a choice.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from rlhf.config import load_profile
from rlhf.evaluate import (
    POPULATIONS,
    bootstrap_differences,
    generate_heldout,
    rubric_rows,
    score_rows,
    summarise_populations,
)
from rlhf.events import logdir_line
from rlhf.identities import code_sha256
from rlhf.io import output_folder, read_json, write_json
from rlhf.signals import RULES_FILE
from rlhf.studies import StudyError, log_to
from rlhf.studies.derivation import write_study_profiles
from rlhf.studies.frontier.arms import SPEC_KL, Arm, resolved, settings_of
from rlhf.studies.frontier.runs import (
    actor_at,
    arm_context,
    final_iteration,
    measured_iterations,
    roles_for_measuring,
)
from rlhf.studies.frontier.study import run_tasks
from rlhf.studies.record import check_runs, open_record, refuse_change, workers_count
from rlhf.studies.statistics import INTERVAL, across_seeds, across_table, metric_bounds
from rlhf.studies.warnings import score_rules

CONFIRM_STUDY_SEED = 2


# The confirmation's third point: the SPEC's default stopped by one frozen warning rule
# (`rlhf lab --stop-on-warning kl_growth`), against the same default run to its fixed last
# iteration. The signal is the rule with the most early warnings on the study the rules were
# chosen on (rlhf.studies.warnings.best_rule on r002's validation runs: 11 of 32 falls warned
# early, 3 of 19 held runs warned falsely); a test recomputes that choice from the committed study.
STOP_SIGNAL = "kl_growth"
STOP_ARM = Arm(
    "spec-default-stop", "judge", raw=SPEC_KL, ppo=(("stop_on_warning", True), ("stop_signals", (STOP_SIGNAL,)))
)


def test_rows(actor_model, reference_model, judge, ctx) -> list[dict]:
    """SPEC §8's greedy rows of one policy on the 180 test prompts and 80 probe rows, scored
    by the judge and checked by the rubric (rlhf.evaluate's building blocks)."""
    rows = generate_heldout(actor_model, ctx)
    return rubric_rows(score_rows(rows, ctx, actor_model, reference_model, judge), ctx)


def test_file(seed_dir: Path, arm: Arm | str, it: int | None) -> Path:
    """Where a confirmation seed keeps one point's test rows (`arm`: the arm or its name): at a
    fixed iteration, or (None) wherever the arm's PPO ended (a warning may have stopped it)."""
    name = "test-final.json" if it is None else f"test-iter-{it:04d}.json"
    return seed_dir / "arms" / (arm if isinstance(arm, str) else arm.name) / name


def confirm_seed(seed_dir, arms: tuple[tuple[Arm, int | None], ...], revision: str, log: bool = True) -> str:
    """Test evaluation of one confirmation seed: SFT once, each (arm, iteration) against it; an
    iteration of None is the arm's final state, wherever its PPO stopped."""
    seed_dir = Path(seed_dir)
    with contextlib.ExitStack() as stack:
        if log:
            log_to(seed_dir / "frontier.log", stack)
        for arm, point in arms:
            out = test_file(seed_dir, arm, point)
            if out.is_file():
                continue
            ctx = arm_context(seed_dir, arm, revision)
            it = final_iteration(ctx) if point is None else point  # recorded: where a stopped run ended
            sft, judge = roles_for_measuring(ctx)
            sft_path = seed_dir / "frontier" / "test-sft.json"
            if not sft_path.is_file():
                write_json(sft_path, {"rows": test_rows(sft.model, sft.model, judge, ctx)})
            sft_rows = read_json(sft_path)["rows"]
            # actor_at reads the final state (state-continuous) for the profile's last iteration,
            # which is where a stopped run saved its last state too
            ppo_rows = test_rows(
                actor_at(ctx, ctx.profile.ppo.iterations if point is None else point, arm).model, sft.model, judge, ctx
            )
            write_json(
                out,
                {
                    "arm": arm.name,
                    "iteration": it,
                    "metrics": {"sft": summarise_populations(sft_rows), "ppo": summarise_populations(ppo_rows)},
                    "differences": bootstrap_differences(sft_rows, ppo_rows, ctx.profile.seeds.evaluation),
                    "ppo_rows": ppo_rows,
                },
            )
    return str(seed_dir)


def confirmation_points(result: dict) -> list[tuple[Arm, int | None]]:
    """What the confirmation runs, from frontier.json: the SPEC's default at its last iteration, the
    point chosen on validation (when it is another), and the default stopped by STOP_SIGNAL."""
    settings = settings_of(result["study"])
    by_name = {a.name: a for a in resolved(settings.arms, result.get("grid_choice"))}
    sel = result["selection"]
    if sel is None:
        raise StudyError("this study chose no point (its arms are controls alone): there is nothing to confirm")
    if sel["default"] is None:
        raise StudyError("this study has no spec-default arm: the confirmation compares its choice with that arm")
    points: list[tuple[Arm, int | None]] = [(by_name[sel["default"]["arm"]], sel["default"]["iteration"])]
    if (sel["arm"], sel["iteration"]) != (points[0][0].name, points[0][1]):
        points.append((by_name[sel["arm"]], sel["iteration"]))
    points.append((STOP_ARM, None))
    return points


def run_confirmation(out, *, n: int = 5, workers: int | None = None, say=print) -> dict:
    """The chosen operating point and the SPEC's default on `n` fresh seeds, on test (SPEC §8),
    with the seed study's across-seed statistics. Reads frontier.json's choice; writes
    confirmation.json and confirmation.html."""
    out = output_folder(out)
    check_runs(n, "--confirm", (2, " (across-seed statistics need 2)"))
    workers = workers_count(workers)
    frontier = out / "frontier.json"
    if not frontier.is_file():
        raise StudyError(
            f"no {frontier}: the operating point is chosen on validation first (rlhf frontier --out {out})"
        )
    result = read_json(frontier)
    study = result["study"]
    points = confirmation_points(result)
    identity = {
        **study,
        "n": n,
        "study_seed": CONFIRM_STUDY_SEED,
        "code": code_sha256(),
        "points": [[a.name, it] for a, it in points],
    }
    done = out / "confirmation.json"
    if done.is_file():  # a finished confirmation is returned, not redone, and only if it is this one
        finished = read_json(done)
        refuse_change(out, finished["study"], identity)
        say(f"confirmation already complete in {out} (confirmation.json): nothing recomputed")
        return finished
    root = out / "confirm"
    root.mkdir(parents=True, exist_ok=True)
    open_record(root, identity)
    say(logdir_line(out))
    profile_name = "embedded" if study["profile"] == "embedded" else str(out / "seed-0" / "profile.toml")
    folders = write_study_profiles(root, profile_name, n, CONFIRM_STUDY_SEED, study["sft_budget"])
    t0 = time.perf_counter()
    say(
        f"confirmation {root}: {n} fresh seed(s); points: "
        + ", ".join(f"{a.name} at iteration {it}" if it is not None else f"{a.name} where it stops" for a, it in points)
    )
    settings = settings_of(study)
    run_tasks(folders, tuple(a for a, _ in points), study["revision"], settings, workers, say, confirm=True)
    for i, f in enumerate(folders):
        confirm_seed(f, tuple(points), study["revision"], log=workers > 1)
        say(f"seed {i}: test evaluated at {time.perf_counter() - t0:.0f} s")
    write_json(out / "confirmation-answers.json", confirmation_answers(folders, tuple(points)), overwrite=True)
    warned = confirmation_warnings(folders, points, study["revision"])
    say(f"warning rules scored on the confirmation seeds' test gold at {time.perf_counter() - t0:.0f} s")
    record = {
        "study": identity,
        "interval": INTERVAL,
        "points": [summarise_point(folders, a, it) for a, it in points],
        "warnings": warned,
        "wall_seconds_this_invocation": time.perf_counter() - t0,
    }
    from rlhf.report.frontier import write_confirmation_report

    write_confirmation_report(out, record, result)
    write_json(done, record)
    say(f"confirmation complete: {done} and {out / 'confirmation.html'}")
    return record


def test_gold_curve(seed_dir: Path, arm: Arm, revision: str) -> list[dict]:
    """A confirmation arm's test rubric success (gold) at every checkpoint its PPO kept, each
    stored in arms/ARM/test-gold/iter-NNNN.json: what its warnings are scored against on the
    confirmation seeds (the rules are frozen; nothing here chooses anything)."""
    ctx = arm_context(seed_dir, arm, revision)
    curve = []
    for it in measured_iterations(ctx.profile, arm):
        path = seed_dir / "arms" / arm.name / "test-gold" / f"iter-{it:04d}.json"
        if not path.is_file():
            # Generated as the evaluation generates (probe rows in the same batches), so that the last
            # checkpoint's gold is the confirmation point's own to the bit; only test rows are kept.
            rows = [
                r
                for r in rubric_rows(generate_heldout(actor_at(ctx, it, arm).model, ctx), ctx)
                if r["population"] == "test"
            ]
            success = [bool(r["rubric"]["rubric_success"]) for r in rows]
            write_json(
                path, {"iteration": it, "gold": sum(success) / len(success), "n": len(success), "success": success}
            )
        rec = read_json(path)
        curve.append({"iteration": rec["iteration"], "gold": rec["gold"]})
    return curve


CONFIRM_WARNINGS_GOLD = (
    "test rubric success of the greedy answers to the 180 test prompts at every kept checkpoint of "
    "the confirmation seeds' runs that went to the last iteration (not the stopped one), SFT's as the level"
)


def confirmation_warnings(folders: list[Path], points, revision: str) -> dict:
    """The frozen warning rules scored on the confirmation seeds: fresh training seeds that set
    no rule, with gold measured on test (CONFIRM_WARNINGS_GOLD)."""
    arms = [a for a, it in points if it is not None]
    per_seed = []
    for f in folders:
        sft = [r for r in read_json(f / "frontier" / "test-sft.json")["rows"] if r["population"] == "test"]
        seed = {"sft": {"gold": sum(r["rubric"]["rubric_success"] for r in sft) / len(sft)}, "arms": {}}
        for arm in arms:
            design = load_profile(str(f / "arms" / arm.name / "profile.toml")).ppo.reward_design
            seed["arms"][arm.name] = {"reward_design": design, "points": test_gold_curve(f, arm, revision)}
        per_seed.append(seed)
    return {**score_rules(RULES_FILE, folders, per_seed, None), "gold": CONFIRM_WARNINGS_GOLD}


ANSWER_KEYS = ("response", "finish_reason", "rubric_success", "learned_reward")


def confirmation_answers(folders: list[Path], points: tuple[tuple[Arm, int | None], ...]) -> dict:
    """Every held-out answer (test prompts and probe rows) of each confirmation seed, SFT's beside
    each point's: {seed folder:
    [{document_id, population, "sft": answer, "ARM@ITERATION": answer, ...}]}, an answer being its
    text, how it ended, its rubric success and the judge's score (a stopped point's key ends
    in "@stop"; its iteration per seed is in confirmation.json)."""

    def answer(row: dict) -> dict:
        return {k: row["rubric"]["rubric_success"] if k == "rubric_success" else row[k] for k in ANSWER_KEYS}

    out = {}
    for f in folders:
        sft = read_json(f / "frontier" / "test-sft.json")["rows"]
        rows = [{"document_id": r["document_id"], "population": r["population"], "sft": answer(r)} for r in sft]
        for arm, it in points:
            ppo = read_json(test_file(f, arm, it))["ppo_rows"]
            if [r["document_id"] for r in ppo] != [r["document_id"] for r in rows]:
                raise StudyError(f"{f.name}/{arm.name}: its test rows are not SFT's prompts in SFT's order")
            for row, r in zip(rows, ppo):
                row[f"{arm.name}@{'stop' if it is None else it}"] = answer(r)
        out[f.name] = rows
    return out


def summarise_point(folders: list[Path], arm: Arm, it: int | None) -> dict:
    """Per seed PPO - SFT on test per population, and across seeds (bounded intervals); `it`
    None: each seed's final state, at the iteration where its PPO stopped."""
    rows = []
    for i, f in enumerate(folders):
        rec = read_json(test_file(f, arm, it))
        spread = read_json(f / "frontier" / "sft.json")["spread"]["validation"]
        metrics = {}
        for pop in POPULATIONS:
            s, p = rec["metrics"]["sft"][pop], rec["metrics"]["ppo"][pop]
            metrics[f"rubric_success.{pop}.sft"] = s["rubric_success"]
            metrics[f"rubric_success.{pop}.ppo"] = p["rubric_success"]
            metrics[f"rubric_success.{pop}.ppo_minus_sft"] = p["rubric_success"] - s["rubric_success"]
            metrics[f"learned_reward_std.{pop}.ppo_minus_sft"] = (
                p["mean_learned_reward"] - s["mean_learned_reward"]
            ) / spread["sd"]
            metrics[f"without_eos.{pop}.ppo"] = p["without_eos"]
        kl_coef = load_profile(str(f / "arms" / arm.name / "profile.toml")).ppo.kl_coef
        rows.append(
            {
                "seed": i,
                "folder": f.name,
                "iteration": rec["iteration"],
                "kl_coef": kl_coef,
                "sigma_validation": spread["sd"],
                "metrics": metrics,
            }
        )
    return {
        "arm": arm.name,
        "describe": arm.describe(),
        "iteration": it,
        "seeds": rows,
        "across": across_table(rows, metric_bounds),
        "positive_test": across_seeds([r["metrics"]["rubric_success.test.ppo_minus_sft"] for r in rows], (-1.0, 1.0)),
    }
