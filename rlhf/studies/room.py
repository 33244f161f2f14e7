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
     their SD and the seed count n = seeds_needed(SD) (95% half-width at most HALF_WIDTH, at
     most CAP seeds); the fresh study seed ROOM_STUDY_SEED; the commit.
  2. n fresh seeds (runs 0..n-1 of study seed ROOM_STUDY_SEED): SFT, the judge and the oracle
     arm, as the frontier's confirmation trains them (a stopped study continues when rerun).
  3. Each seed's SFT and oracle at the declared checkpoint evaluated on test (SPEC §8's greedy
     answers); per seed oracle - SFT test rubric success; across seeds the mean, the 95%
     Student-t interval, the exact sign-flip p and the seeds up (DIR/room.json).

The room is real when the interval lies above zero. Nothing measured here chooses anything.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from rlhf.io import output_folder, read_json, write_json
from rlhf.studies import StudyError
from rlhf.studies.record import open_record, ran_with, workers_count
from rlhf.studies.statistics import INTERVAL, across_seeds, seeds_needed, sign_flip_p

ROOM_STUDY_SEED = 3  # fresh: the seed study is 0, the frontier and the testbed 1, the confirmation 2
HALF_WIDTH = 0.10  # the 95% half-width the seed count aims at
CAP = 40  # the most seeds the rule may ask for


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


def declaration(testbed: dict, testbed_path: str) -> dict:
    """Step 1 from the testbed record alone (no test prompt): what the study will run and why."""
    chosen = testbed.get("chosen")
    if not chosen:
        raise StudyError(f"{testbed_path} chose no testbed: there is no room to confirm on test")
    candidate = next(c for c in testbed["candidates"] if c["name"] == chosen)
    oracle = candidate["oracle"]
    frontier = read_json(oracle_frontier(testbed_path, chosen, oracle["study"]))
    it = oracle["best_iteration"]
    gains = []
    for seed in frontier["seeds"]:
        point = next(p for p in seed["arms"]["oracle"]["points"] if p["iteration"] == it)
        gains.append(point["gain"])
    sd = statistics.stdev(gains)
    power = seeds_needed(sd, HALF_WIDTH, CAP)
    return {
        "testbed": testbed_path,
        "testbed_commit": testbed["commit"],
        "sft_recipe": chosen,
        "revision": testbed["revision"],
        "profile": testbed["profile"],
        "oracle_iteration": it,
        "validation_gain_per_seed": gains,
        "validation_gain_sd": sd,
        "power_rule": f"the smallest n >= 2 with t(0.975, n-1) * SD / sqrt(n) <= {HALF_WIDTH}, at most {CAP}",
        "seeds": power["n"],
        "expected_half_width": power["expected_half_width"],
        "capped": power["capped"],
        "study_seed": ROOM_STUDY_SEED,
        "reads": "train prompts (training) and test prompts (the evaluation of step 3); "
        "the declaration reads the testbed record only",
    }


def summarise(folders: list[Path], arm, it: int) -> dict:
    """Step 3's numbers: per seed SFT, oracle and their difference in test rubric success."""
    from rlhf.studies.frontier.confirmation import test_file

    rows = []
    for i, f in enumerate(folders):
        rec = read_json(test_file(f, arm, it))
        sft, ppo = rec["metrics"]["sft"]["test"]["rubric_success"], rec["metrics"]["ppo"]["test"]["rubric_success"]
        rows.append({"seed": i, "folder": f.name, "sft": sft, "oracle": ppo, "oracle_minus_sft": ppo - sft})
    diffs = [r["oracle_minus_sft"] for r in rows]
    across = across_seeds(diffs, (-1.0, 1.0))
    return {
        "per_seed": rows,
        "sft": across_seeds([r["sft"] for r in rows], (0.0, 1.0)),
        "oracle": across_seeds([r["oracle"] for r in rows], (0.0, 1.0)),
        "oracle_minus_sft": {**across, "sign_flip_p": sign_flip_p(diffs), "seeds_up": across["positive"]},
        "room_shown": across["t95"][0] > 0,
    }


def confirm_oracle(testbed_json, out, workers=None, say=print) -> dict:
    """Steps 1 to 3 (module docstring); DIR/room.json written last and returned."""
    from rlhf.studies.derivation import write_study_profiles
    from rlhf.studies.frontier.arms import Settings, default_arms
    from rlhf.studies.frontier.confirmation import confirm_seed
    from rlhf.studies.frontier.study import run_tasks

    testbed_path = str(testbed_json)
    testbed = read_json(Path(testbed_json))
    workers = workers_count(workers)
    declared = declaration(testbed, testbed_path)
    out = output_folder(out)
    done = out / "room.json"
    open_record(out, declared)  # refuses a rerun whose declaration differs, before anything else is written
    if done.is_file():
        say(f"the oracle's room on test is already measured in {done}: nothing recomputed")
        return read_json(done)
    say(
        f"declared: {declared['seeds']} fresh seeds (validation gain SD {declared['validation_gain_sd']:.3f}, "
        f"expected half-width {declared['expected_half_width']:.3f}), the oracle at iteration "
        f"{declared['oracle_iteration']}, SFT recipe {declared['sft_recipe']}"
    )
    arm = next(a for a in default_arms() if a.name == "oracle")
    it = declared["oracle_iteration"]
    folders = write_study_profiles(out, declared["profile"], declared["seeds"], ROOM_STUDY_SEED, declared["sft_recipe"])
    t0 = time.perf_counter()
    run_tasks(folders, (arm,), declared["revision"], Settings(arms=(arm,)), workers, say, confirm=True)
    for i, f in enumerate(folders):
        confirm_seed(f, ((arm, it),), declared["revision"], log=workers > 1)
        say(f"seed {i}: test evaluated at {time.perf_counter() - t0:.0f} s")
    record = {
        "declared": declared,
        "interval": INTERVAL,
        **summarise(folders, arm, it),
        "seconds_this_invocation": time.perf_counter() - t0,
        "evaluated_by": ran_with(),
    }
    write_json(done, record)
    d = record["oracle_minus_sft"]
    say(
        f"oracle - SFT on test over {d['n']} seeds: {d['mean']:+.3f} [{d['t95'][0]:+.3f}, {d['t95'][1]:+.3f}], "
        f"sign-flip p {d['sign_flip_p']:.4f}, {d['seeds_up']} of {d['n']} up ({done})"
    )
    return record
