"""The testbed's room, shown on test: the oracle control on fresh seeds against each seed's SFT
(`rlhf confirm-oracle --testbed FILE.json --out DIR`).

The testbed rule (rlhf.studies.testbed) shows room on validation prompts: the oracle control
(PPO paid the rubric's success on its train prompt) beats SFT there, at the best checkpoint of
its mean curve over a few seeds. That checkpoint was picked on those seeds, and validation is
not test. If the oracle cannot beat SFT on test, no learned reward can, and the question "does a
learned-reward design beat SFT on test?" is empty there. So:

  1. Declared before any test prompt is read (DIR/study.json, written first and checked on
     every rerun): the testbed record and its chosen SFT recipe; the oracle's checkpoint (the
     testbed's oracle study's best iteration); the power rule's inputs, the per-seed validation
     gain of the oracle at that checkpoint over the seed's SFT on the testbed's oracle seeds,
     their SD and the seed count of the power rule (rlhf.studies.heldout.power: 95% half-width
     at most 0.10, at most 40 seeds); the fresh study seed ROOM_STUDY_SEED; the commit.
  2. n fresh seeds (runs 0..n-1 of study seed ROOM_STUDY_SEED) trained, and each seed's SFT and
     oracle at the declared checkpoint evaluated on test (rlhf.studies.heldout.run_points; a
     stopped study continues when rerun).
  3. Per seed oracle - SFT test rubric success; across seeds the mean, the 95% Student-t
     interval, the exact sign-flip p and the seeds up (DIR/room.json).

The room is real when the interval lies above zero. Nothing measured here chooses anything.
A replication (`--replicate ROOM.json`) repeats steps 1 to 3 on fresh seeds (study seed
REPLICATION_STUDY_SEED) with the seed count the power rule asks for the first study's per-seed
TEST spread: where validation understated the spread, the first study's interval came out wider
than declared, and the replication is the declared answer at the width asked for. Its record
names the first (path and sha256) and shows both seed sets pooled beside its own interval.

Where the testbed rule found no candidate, the nearest one is confirmed (the stable candidate
whose oracle gains most on validation, rlhf.studies.testbed.closest), and study.json says the
testbed does not qualify: its interval then says how much room the nearest testbed has on test.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from rlhf.io import output_folder, read_json, sha256_file, write_json
from rlhf.studies import StudyError, heldout
from rlhf.studies.record import open_record, ran_with, workers_count
from rlhf.studies.statistics import INTERVAL, across_seeds, paired
from rlhf.studies.testbed import recipe

ROOM_STUDY_SEED = 3  # fresh: the seed study is 0, the frontier and the testbed 1, the confirmation 2
REPLICATION_STUDY_SEED = 7  # fresh: 4 the choice's estimate, 5 the verdict, 6 the nested study
COMPARISON = "oracle_minus_sft"


def oracle_frontier(testbed_path: str, chosen: str, study: str) -> Path:
    """The testbed's oracle study of `chosen` (its frontier.json): committed beside the testbed
    record (oracle-CANDIDATE/frontier.json), else where the testbed rule ran it."""
    for path in (Path(testbed_path).parent / f"oracle-{chosen}" / "frontier.json", Path(study) / "frontier.json"):
        if path.is_file():
            return path
    raise StudyError(
        f"the testbed's oracle study of {chosen} is neither beside {testbed_path} (oracle-{chosen}/frontier.json) "
        f"nor in {study}: the seed count is declared from its per-seed validation gains"
    )


def declaration(testbed: dict, testbed_path: str, replicate: str | None = None) -> dict:
    """Step 1 from the testbed record alone (no test prompt): what the study will run and why.
    Where the rule chose nothing, the nearest candidate (rlhf.studies.testbed.closest) is
    confirmed instead, and the declaration says so."""
    found = recipe(testbed, testbed_path)
    chosen, oracle = found["sft_recipe"], found["oracle"]
    frontier = read_json(oracle_frontier(testbed_path, chosen, oracle["study"]))
    it = oracle["best_iteration"]
    gains = []
    for seed in frontier["seeds"]:
        point = next(p for p in seed["arms"]["oracle"]["points"] if p["iteration"] == it)
        gains.append(point["gain"])
    sd = statistics.stdev(gains)
    power = heldout.power({COMPARISON: sd})
    first = None
    if replicate is not None:
        first = replication_of(replicate, testbed_path, chosen, it)
        power = heldout.power({COMPARISON: first["test_sd"]})
    return {
        "testbed": testbed_path,
        "testbed_commit": testbed["commit"],
        "sft_recipe": chosen,
        "testbed_qualifies": found["testbed_qualifies"],
        "sft_recipe_rule": found["sft_recipe_rule"],
        "revision": testbed["revision"],
        "profile": testbed["profile"],
        "oracle_iteration": it,
        "validation_gain_per_seed": gains,
        "validation_gain_sd": sd,
        "power": power,
        "seeds": power["seeds"],
        "study_seed": ROOM_STUDY_SEED if first is None else REPLICATION_STUDY_SEED,
        "reads": "train prompts (training) and test prompts (the evaluation of step 3); "
        + (
            "the declaration reads the testbed record only"
            if first is None
            else "the declaration reads the testbed record and the first study's per-seed test differences "
            "(for the seed count only)"
        ),
        **({} if first is None else {"replicates": first}),
    }


def replication_of(room_json: str, testbed_path: str, chosen: str, it: int) -> dict:
    """The first study a replication repeats: the same testbed, recipe and checkpoint, finished;
    its per-seed test spread sets the replication's seed count."""
    path = Path(room_json)
    if not path.is_file():
        raise StudyError(f"{room_json} is not a finished room study (its room.json): run rlhf confirm-oracle first")
    first = read_json(path)
    was = first["declared"]
    if (was["testbed"], was["sft_recipe"], was["oracle_iteration"]) != (testbed_path, chosen, it):
        raise StudyError(
            f"{room_json} confirmed {was['sft_recipe']} at iteration {was['oracle_iteration']} of {was['testbed']}, "
            f"not {chosen} at {it} of {testbed_path}: a replication repeats the same study"
        )
    if "replicates" in was:
        raise StudyError(f"{room_json} is itself a replication: replicate the first study")
    diffs = first[COMPARISON]["per_seed"]
    return {
        "room": room_json,
        "sha256": sha256_file(path),
        "seeds": len(diffs),
        "test_sd": statistics.stdev(diffs),
        "per_seed": diffs,
    }


def seed_rows(folders: list[Path], it: int) -> list[dict]:
    """Per seed: SFT's and the oracle's test rubric success and their difference (a row of
    room.json's per_seed, what `rlhf reproduce` recomputes)."""
    point = heldout.Point("oracle", it)
    rows = []
    for i, f in enumerate(folders):
        sft, oracle = heldout.test_success(f, point)
        rows.append({"seed": i, "folder": f.name, "sft": sft, "oracle": oracle, COMPARISON: oracle - sft})
    return rows


def summarise(folders: list[Path], it: int) -> dict:
    """Step 3's numbers: per seed SFT's and the oracle's test rubric success, and the comparison."""
    point = heldout.Point("oracle", it)
    per_seed = seed_rows(folders, it)
    diff = heldout.comparisons(folders, {COMPARISON: (point, None)})[COMPARISON]
    return {
        "per_seed": per_seed,
        "sft": across_seeds([r["sft"] for r in per_seed], (0.0, 1.0)),
        "oracle": across_seeds([r["oracle"] for r in per_seed], (0.0, 1.0)),
        COMPARISON: diff,
        "room_shown": diff["t95"][0] > 0,
    }


def confirm_oracle(testbed_json, out, workers=None, say=print, replicate: str | None = None) -> dict:
    """Steps 1 to 3 (module docstring); DIR/room.json written last and returned."""
    from rlhf.studies.derivation import write_study_profiles

    testbed_path = str(testbed_json)
    testbed = read_json(Path(testbed_json))
    workers = workers_count(workers)
    declared = declaration(testbed, testbed_path, replicate)
    out = output_folder(out)
    done = out / "room.json"
    open_record(out, declared)  # refuses a rerun whose declaration differs, before anything else is written
    if done.is_file():
        say(f"the oracle's room on test is already measured in {done}: nothing recomputed")
        return read_json(done)
    half = declared["power"]["per_comparison"][COMPARISON]["expected_half_width"]
    first = declared.get("replicates")
    spread = (
        f"validation gain SD {declared['validation_gain_sd']:.3f}"
        if first is None
        else f"the first study's test SD {first['test_sd']:.3f} over its {first['seeds']} seeds"
    )
    say(
        f"declared: {declared['seeds']} fresh seeds ({spread}, "
        f"expected half-width {half:.3f}), the oracle at iteration {declared['oracle_iteration']}, "
        f"SFT recipe {declared['sft_recipe']} ({declared['sft_recipe_rule']})"
    )
    it = declared["oracle_iteration"]
    folders = write_study_profiles(
        out, declared["profile"], declared["seeds"], declared["study_seed"], declared["sft_recipe"]
    )
    t0 = time.perf_counter()
    heldout.run_points(folders, (heldout.Point("oracle", it),), declared["revision"], workers, say)
    summary = summarise(folders, it)
    if first is not None:  # shown beside the replication's own interval, which is the declared answer
        summary["pooled_with_first"] = paired(first["per_seed"] + summary[COMPARISON]["per_seed"])
    record = {
        "declared": declared,
        "interval": INTERVAL,
        **summary,
        "seconds_this_invocation": time.perf_counter() - t0,
        "evaluated_by": ran_with(),
    }
    write_json(done, record)
    d = record[COMPARISON]
    say(
        f"oracle - SFT on test over {d['n']} seeds: {d['mean']:+.3f} [{d['t95'][0]:+.3f}, {d['t95'][1]:+.3f}], "
        f"sign-flip p {d['sign_flip_p']:.4f}, {d['seeds_up']} of {d['n']} up ({done})"
    )
    return record
