"""The lab's answer on test: the chosen design, the SPEC's default and the oracle control on
fresh seeds, with comparisons and a seed count declared before any test prompt is read
(`rlhf confirm-design --choice DIR/choice.json --out DIR`).

  1. Declared first (DIR/study.json, checked on every rerun), from the choice record alone
     (rlhf.studies.choice, validation prompts only) and the testbed record it names:
       points       the chosen (arm, checkpoint); the SPEC's default at its last iteration; the
                    oracle control at the testbed's oracle checkpoint
       comparisons  chosen - SFT, chosen - default (paired by seed), oracle - SFT
       seeds        the power rule (rlhf.studies.heldout.power) on each comparison's validation
                    spread: the choice's estimation seeds for the first two, the selection
                    seeds' oracle for the third; the largest count any of them asks for
       study seed   VERDICT_STUDY_SEED, fresh
     with the commit that declared it and the choice's own commit (which came first).
  2. Those seeds trained and every point evaluated on test against the seed's SFT
     (rlhf.studies.heldout.run_points; a stopped study continues when rerun).
  3. DIR/verdict.json: each comparison's per-seed differences, mean, Student-t interval, exact
     sign-flip p and seeds up; and the per-seed test success each difference is made of
     (success_table: SFT's and every point's), from which every comparison can be recomputed.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from rlhf.io import output_folder, read_json, write_json
from rlhf.studies import StudyError, heldout
from rlhf.studies.record import open_record, ran_with, workers_count
from rlhf.studies.statistics import INTERVAL
from rlhf.studies.testbed import recipe

VERDICT_STUDY_SEED = 5  # fresh: 0 seeds, 1 frontier, 2 its confirmation, 3 the room, 4 the choice's estimate
LAST_ITERATION = 100  # the SPEC's default is read where the profile's PPO ends


def declaration(choice_record: dict, choice_path: str) -> dict:
    """Step 1 from the choice record (and the testbed and selection study it names) alone."""
    from rlhf.studies.choice import per_seed_gains

    chosen, est = choice_record["chosen"], choice_record["estimate"]
    testbed = read_json(Path(choice_record["declared"]["testbed"]))
    oracle_it = recipe(testbed, choice_record["declared"]["testbed"])["oracle"]["best_iteration"]
    selection = read_json(selection_frontier(choice_record, choice_path))
    points = {
        "chosen": heldout.Point(chosen["arm"], chosen["iteration"]),
        "default": heldout.Point("spec-default", LAST_ITERATION),
        "oracle": heldout.Point("oracle", oracle_it),
    }
    if points["chosen"] == points["default"]:
        raise StudyError("the choice is the SPEC's default itself: chosen - default is zero by construction")
    spreads = {
        "chosen_minus_sft": est["chosen_minus_sft"]["sd"],
        "chosen_minus_default": est["chosen_minus_default"]["sd"],
        "oracle_minus_sft": statistics.stdev(per_seed_gains(selection, "oracle", oracle_it)),
    }
    return {
        "choice": choice_path,
        "choice_commit": choice_record["steps"][-1]["commit"],
        "sft_recipe": choice_record["declared"]["sft_recipe"],
        "revision": choice_record["declared"]["revision"],
        "profile": choice_record["declared"]["profile"],
        "points": {k: {"arm": p.arm, "iteration": p.iteration} for k, p in points.items()},
        "comparisons": {
            "chosen_minus_sft": ["chosen", "sft"],
            "chosen_minus_default": ["chosen", "default"],
            "oracle_minus_sft": ["oracle", "sft"],
        },
        "power": heldout.power(spreads),
        "study_seed": VERDICT_STUDY_SEED,
        "reads": "train prompts (training) and test prompts (step 2's evaluation, after this declaration)",
    }


def selection_frontier(choice_record: dict, choice_path: str) -> Path:
    """The choice's selection study (its frontier.json): committed beside the choice record
    (selection/frontier.json), else where the choice ran it."""
    for path in (Path(choice_path).parent / "selection" / "frontier.json",
                 Path(choice_record["steps"][0]["study"]) / "frontier.json"):  # fmt: skip
        if path.is_file():
            return path
    raise StudyError(
        f"the choice's selection study is neither beside {choice_path} nor in {choice_record['steps'][0]['study']}"
    )


def success_table(folders: list[Path], points: dict[str, heldout.Point]) -> dict[str, list[float]]:
    """Test rubric success per seed (in the folders' order): the seed's SFT ("sft") and each
    declared point's PPO policy, read from the seeds' test files (rlhf.studies.heldout.test_success)."""
    first = next(iter(points.values()))  # every point's file holds the seed's SFT too
    table: dict[str, list[float]] = {"sft": [heldout.test_success(f, first)[0] for f in folders]}
    for name, point in points.items():
        table[name] = [heldout.test_success(f, point)[1] for f in folders]
    return table


def declared_points(declared: dict) -> dict[str, heldout.Point]:
    return {k: heldout.Point(**p) for k, p in declared["points"].items()}


def confirm_design(choice_json, out, workers=None, say=print) -> dict:
    """Steps 1 to 3 (module docstring); DIR/verdict.json written last and returned."""
    choice_path = str(choice_json)
    declared = declaration(read_json(Path(choice_json)), choice_path)
    workers = workers_count(workers)
    out = output_folder(out)
    open_record(out, declared)
    done = out / "verdict.json"
    if done.is_file():
        say(f"the verdict is already read in {done}: nothing recomputed")
        return read_json(done)
    return read_on_test(out, declared, declared["power"]["seeds"], VERDICT_STUDY_SEED, workers, say, done=done)


def read_on_test(out: Path, declared: dict, n: int, study_seed: int, workers: int, say, *, done: Path,
                 arms: tuple = ()) -> dict:  # fmt: skip
    """Steps 2 and 3 of a declared confirmation (this one's, and rlhf.studies.compare_methods'):
    `n` fresh seeds of `study_seed` trained (SFT, judge, the declared points' arms: `arms` by name,
    else the frontier's) and read on test; `done` (verdict.json, confirmation.json) written with
    each declared comparison and each seed's test success, and returned."""
    from rlhf.studies.derivation import write_study_profiles

    points = declared_points(declared)
    say(f"declared: {n} fresh seeds; points " + ", ".join(p.key for p in points.values()))
    folders = write_study_profiles(out, declared["profile"], n, study_seed, declared["sft_recipe"])
    t0 = time.perf_counter()
    heldout.run_points(folders, tuple(points.values()), declared["revision"], workers, say, arms=arms)
    pairs = {name: (points[a], None if b == "sft" else points[b]) for name, (a, b) in declared["comparisons"].items()}
    comparisons = heldout.comparisons(folders, pairs)
    record: dict = {
        "declared": declared,
        "interval": INTERVAL,
        "comparisons": comparisons,
        "test_success": success_table(folders, points),
        "seconds_this_invocation": time.perf_counter() - t0,
        "evaluated_by": ran_with(),
    }
    write_json(done, record)
    for name, c in comparisons.items():
        say(
            f"{name} on test over {c['n']} seeds: {c['mean']:+.3f} [{c['t95'][0]:+.3f}, {c['t95'][1]:+.3f}], "
            f"sign-flip p {c['sign_flip_p']:.4f}, {c['seeds_up']} of {c['n']} up"
        )
    return record
