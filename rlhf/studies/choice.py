"""A design chosen on one set of seeds and estimated on another: the choice without the
winner's curse (`rlhf choose-design --testbed FILE.json --out DIR`).

The best of many (arm, checkpoint) points on a few validation seeds is, by construction, the
point whose seeds were luckiest: its own validation gain overstates what it does on fresh seeds
(the winner's curse). So the choice and its estimate use different seeds, both on validation
prompts only:

  1. Declared first (DIR/study.json, checked on every rerun): the testbed record and its SFT
     recipe (where the testbed rule chose none, the nearest candidate, rlhf.studies.testbed.recipe,
     and the record says the testbed does not qualify); the candidates CANDIDATES (reward designs
     at the SPEC's beta) and CHECKPOINTS (PPO iterations), a small set fixed before any
     measurement; SELECTION_SEEDS seeds to choose on (runs of the frontier's study seed 1) and
     ESTIMATION_SEEDS fresh seeds to estimate on (study seed ESTIMATION_STUDY_SEED).
  2. Selection (DIR/selection, a frontier study of the candidates and the oracle control on the
     selection seeds): the candidate point with the largest mean validation gold over those
     seeds (ties: the smaller mean KL distance d, then the earlier candidate and checkpoint); its
     gain over SFT there is the naive estimate, with its own interval over the selection seeds.
  3. Estimation (DIR/estimation, the chosen arm and the SPEC's default on the fresh seeds): the
     chosen point's validation gain over each seed's SFT and over the SPEC's default at its last
     iteration, paired by seed: the honest estimates, with Student-t intervals and exact
     sign-flip p-values. The curse's cost is the naive gain less the honest one.

DIR/choice.json names, for each step, the prompt sets it read (train for training, validation
for measuring; never test) and the commit it ran at. The confirmation on test (a later study)
reads the choice from it, so the choice's commit comes before the confirmation's.
"""

from __future__ import annotations

import time
from pathlib import Path

from rlhf.io import output_folder, read_json, write_json
from rlhf.studies import StudyError
from rlhf.studies.record import open_record, ran_with, workers_count
from rlhf.studies.statistics import across_seeds, paired
from rlhf.studies.testbed import recipe

CANDIDATES = ("spec-default", "standardised-judge", "eos-less-replaced", "iterated-judge")
CHECKPOINTS = (30, 60, 100)
SELECTION_SEEDS = 6
ESTIMATION_SEEDS = 6
ESTIMATION_STUDY_SEED = 4  # fresh: 0 the seed study, 1 the frontier, 2 its confirmation, 3 the room on test
DEFAULT = "spec-default"
READS = "train prompts (SFT, judge and PPO training) and validation prompts (every measurement); no test prompt"


def declaration(testbed: dict, testbed_path: str) -> dict:
    """Step 1: what the study will run, from the testbed record and the constants alone."""
    found = recipe(testbed, testbed_path)
    return {
        "testbed": testbed_path,
        "testbed_commit": testbed["commit"],
        "sft_recipe": found["sft_recipe"],
        "testbed_qualifies": found["testbed_qualifies"],
        "sft_recipe_rule": found["sft_recipe_rule"],
        "revision": testbed["revision"],
        "profile": testbed["profile"],
        "candidates": list(CANDIDATES),
        "checkpoints": list(CHECKPOINTS),
        "selection_seeds": SELECTION_SEEDS,
        "estimation_seeds": ESTIMATION_SEEDS,
        "estimation_study_seed": ESTIMATION_STUDY_SEED,
        "rule": "the candidate point (arm, checkpoint) with the largest mean validation gold over the selection "
        "seeds; ties: the smaller mean d, then the earlier candidate, then the earlier checkpoint",
    }


def per_seed_gains(result: dict, arm: str, iteration: int) -> list[float]:
    """Each seed's validation gold at (arm, iteration) less its SFT's (frontier.json's seeds)."""
    return [next(p["gain"] for p in s["arms"][arm]["points"] if p["iteration"] == iteration) for s in result["seeds"]]


def per_seed_gold(result: dict, arm: str, iteration: int) -> list[float]:
    return [next(p["gold"] for p in s["arms"][arm]["points"] if p["iteration"] == iteration) for s in result["seeds"]]


def choose_point(result: dict, candidates=None, checkpoints=None) -> dict:
    """Step 2's rule on a selection study's frontier.json: the chosen (arm, iteration), its mean
    gold and its naive gain (mean over the selection seeds of gold less SFT's). The candidates and
    checkpoints are the declared ones unless given."""
    candidates, checkpoints = candidates or CANDIDATES, checkpoints or CHECKPOINTS
    points = []
    for k, name in enumerate(candidates):
        for row in result["arms"][name]["curve"]:
            if row["iteration"] in checkpoints:
                points.append((row["gold"]["mean"], -row["d"]["mean"], -k, -row["iteration"], name, row["iteration"]))
    if len(points) != len(candidates) * len(checkpoints):
        raise StudyError("the selection study lacks a declared (candidate, checkpoint) point")
    gold, _, _, _, arm, it = max(points)
    gains = per_seed_gains(result, arm, it)
    return {
        "arm": arm,
        "iteration": it,
        "mean_validation_gold": gold,
        "points_compared": len(points),
        "naive_gain": {**across_seeds(gains, (-1.0, 1.0)), "per_seed": gains},
    }


def estimate(result: dict, arm: str, iteration: int) -> dict:
    """Step 3 on the estimation study's frontier.json: the chosen point against SFT and against
    the SPEC's default at its last iteration, paired by seed."""
    default_iteration = result["arms"][DEFAULT]["curve"][-1]["iteration"]
    chosen = per_seed_gold(result, arm, iteration)
    default = per_seed_gold(result, DEFAULT, default_iteration)
    return {
        "chosen_minus_sft": paired(per_seed_gains(result, arm, iteration)),
        "chosen_minus_default": paired([c - d for c, d in zip(chosen, default)]),
        "default_minus_sft": paired(per_seed_gains(result, DEFAULT, default_iteration)),
    }


def choose_design(testbed_json, out, workers=None, say=print) -> dict:
    """Steps 1 to 3 (module docstring); DIR/choice.json written last and returned."""
    from rlhf.studies.frontier.arms import Settings, default_arms
    from rlhf.studies.frontier.study import STUDY_SEED, run_frontier

    testbed_path = str(testbed_json)
    declared = declaration(read_json(Path(testbed_json)), testbed_path)
    workers = workers_count(workers)
    out = output_folder(out)
    open_record(out, declared)
    done = out / "choice.json"
    if done.is_file():
        say(f"the design is already chosen and estimated in {done}: nothing recomputed")
        return read_json(done)
    arms = {a.name: a for a in default_arms()}
    common = dict(
        revision=declared["revision"], sft_budget=declared["sft_recipe"], workers=workers,
        profile_name=declared["profile"], say=say,
    )  # fmt: skip
    t0 = time.perf_counter()
    selection = run_frontier(
        out / "selection", n=SELECTION_SEEDS, settings=Settings(arms=(*(arms[c] for c in CANDIDATES), arms["oracle"])),
        study_seed=STUDY_SEED, **common,
    )  # fmt: skip
    chosen = choose_point(selection)
    selection_step = {
        "reads": READS,
        "study": str(out / "selection"),
        "seconds": time.perf_counter() - t0,
        **ran_with(),
    }
    say(
        f"chosen on {SELECTION_SEEDS} selection seeds: {chosen['arm']} at iteration {chosen['iteration']}, naive "
        f"validation gain {chosen['naive_gain']['mean']:+.3f}"
    )
    t1 = time.perf_counter()
    estimated_arms = tuple(arms[n] for n in dict.fromkeys((chosen["arm"], DEFAULT)))
    estimation = run_frontier(
        out / "estimation", n=ESTIMATION_SEEDS, settings=Settings(arms=estimated_arms),
        study_seed=ESTIMATION_STUDY_SEED, **common,
    )  # fmt: skip
    honest = estimate(estimation, chosen["arm"], chosen["iteration"])
    record = {
        "declared": declared,
        "chosen": chosen,
        "estimate": honest,
        "curse": chosen["naive_gain"]["mean"] - honest["chosen_minus_sft"]["mean"],
        "steps": [
            {"step": "selection", **selection_step},
            {
                "step": "estimation",
                "reads": READS,
                "study": str(out / "estimation"),
                "seconds": time.perf_counter() - t1,
                **ran_with(),
            },
        ],
    }
    write_json(done, record)
    e = honest["chosen_minus_sft"]
    say(
        f"{chosen['arm']} at iteration {chosen['iteration']}: validation gain {chosen['naive_gain']['mean']:+.3f} "
        f"on the seeds that chose it, {e['mean']:+.3f} [{e['t95'][0]:+.3f}, {e['t95'][1]:+.3f}] on "
        f"{ESTIMATION_SEEDS} fresh seeds ({done})"
    )
    return record
