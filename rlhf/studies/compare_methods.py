"""DPO and GRPO beside PPO on the testbed the choice ran on, on validation prompts only
(`rlhf compare-methods --choice DIR/choice.json --out DIR`).

  1. Declared first (DIR/study.json, checked on every rerun), from the choice record alone: its
     testbed recipe, revision and profile; the arms ARMS: the SPEC's default, the chosen design
     at its arm, the oracle control (PPO), DPO at each beta of DPO_BETAS from the judge's train
     pairs, GRPO with G = GRPO_GROUP answers per prompt (rlhf.studies.frontier.methods); SEEDS
     seeds of the choice's selection study (the frontier's study seed), so that the PPO arms are
     the ones the choice was made on.
  2. The frontier of those arms (DIR/frontier, `rlhf frontier`'s measurements and summary): gold
     and learned reward against sqrt(KL) on the validation prompts at every measured point (PPO
     and GRPO: every 10th iteration; DPO: every epoch).
  3. DIR/methods.json: per method its best point on validation (the frontier's selection rule
     within the method's arms), that point's gain over SFT paired by seed with its interval, the
     share of the oracle's best gain it recovers; and each arm's cost: seconds per iteration
     (PPO, GRPO, with GRPO's phases beside PPO's, the critic's included) or per epoch (DPO), as
     measured on this machine while the study ran.

Nothing in steps 1 to 3 reads a test prompt. The confirmation on test is a later study
(`rlhf confirm-methods --methods DIR/methods.json --out DIR2`), declared from this record alone
before any test prompt is read, under the answer on test's protocol (rlhf.studies.verdict):

  4. DIR2/study.json: the points (DPO's and GRPO's best on validation, the SPEC's default at its
     last iteration), the comparisons (each method - SFT, each method - the SPEC's default, paired
     by seed) and the seed count of the committed answer on test (VERDICT_STUDY), on fresh seeds
     (study seed CONFIRM_STUDY_SEED).
  5. Those seeds trained (SFT, judge, the three points' arms) and read on test; DIR2/confirmation.json:
     each comparison's per-seed differences, mean, Student-t interval, exact sign-flip p, seeds up,
     and each seed's test success of SFT and of every point.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from rlhf.io import output_folder, read_json, write_json
from rlhf.studies import StudyError
from rlhf.studies.record import open_record, ran_with, workers_count
from rlhf.studies.statistics import paired
from rlhf.studies.testbed import recipe

SEEDS = 3
DPO_BETAS = (0.1, 0.5)  # TRL's default, and five times it
DPO_EPOCHS = 3
GRPO_GROUP = 4  # G: a PPO iteration's 4 answers as one group
GRPO_BETA = 0.04  # the published method's
CONFIRM_STUDY_SEED = (
    8  # fresh: 0 seeds, 1 frontier, 2 its confirmation, 3 room, 4 choice, 5 verdict, 6 nested, 7 room again
)
VERDICT_STUDY = "results/verdict-r002/study.json"  # whose seed count the confirmation runs
READS = "train prompts (SFT, judge, PPO, GRPO training; DPO's pairs) and validation prompts (every measurement)"


def arms(chosen_arm: str):
    """The declared arms (module docstring), the chosen design's by its frontier arm name."""
    from rlhf.studies.frontier.arms import SPEC_KL, Arm, default_arms

    ppo = {a.name: a for a in default_arms()}
    dpo = tuple(
        Arm(f"dpo-b{beta:g}", "judge", raw=SPEC_KL, method="dpo",
            method_settings=(("beta", beta), ("epochs", DPO_EPOCHS)))
        for beta in DPO_BETAS
    )  # fmt: skip
    grpo = Arm("grpo", "judge", raw=SPEC_KL, method="grpo",
               method_settings=(("group_size", GRPO_GROUP), ("beta", GRPO_BETA)))  # fmt: skip
    names = dict.fromkeys(("spec-default", chosen_arm, "oracle"))
    return (*(ppo[n] for n in names), *dpo, grpo)


def declaration(record: dict, path: str) -> dict:
    """Step 1 from the record naming the testbed alone: a choice record (rlhf choose-design: its
    testbed's recipe and its chosen arm) or a frontier record (rlhf frontier: its SFT budget and the
    arm its validation selection chose, on the frontier's own seeds)."""
    if "chosen" in record:
        testbed = read_json(Path(record["declared"]["testbed"]))
        found = recipe(testbed, record["declared"]["testbed"])
        return {
            "choice": path,
            "choice_commit": record["steps"][-1]["commit"],
            "sft_recipe": found["sft_recipe"],
            "revision": record["declared"]["revision"],
            "profile": record["declared"]["profile"],
            "arms": [a.name for a in arms(record["chosen"]["arm"])],
            "seeds": SEEDS,
            "reads": READS,
        }
    if "selection" in record and "study" in record:
        from rlhf.studies.frontier.study import STUDY_SEED

        study = record["study"]
        if study["study_seed"] != STUDY_SEED:
            raise StudyError(
                f"{path}: the frontier ran on study seed {study['study_seed']}, not the frontier's {STUDY_SEED}; "
                f"its PPO arms would not be the ones its selection was made on"
            )
        return {
            "frontier": path,
            "frontier_commit": read_json(Path(path).with_name("study.json"))["commit"],
            "sft_recipe": study["sft_budget"],
            "revision": study["revision"],
            "profile": study["profile"],
            "arms": [a.name for a in arms(record["selection"]["arm"])],
            "seeds": SEEDS,
            "reads": READS,
        }
    raise StudyError(
        f"{path} is neither a choice record (rlhf choose-design's choice.json) nor a frontier record "
        f"(rlhf frontier's frontier.json): it names no testbed to compare the methods on"
    )


def method_of(arm: dict) -> str:
    return arm.get("method", "ppo")


def best_points(result: dict) -> dict:
    """Per method (the oracle control apart): its best (arm, point) by mean validation gold, its
    gain over SFT paired by seed and the share of the oracle's best mean gain it recovers."""
    from rlhf.studies.choice import per_seed_gains

    def best(names):
        rows = [(r["gold"]["mean"], -r["d"]["mean"], name, r["iteration"])
                for name in names for r in result["arms"][name]["curve"] if r["iteration"] > 0]  # fmt: skip
        gold, _, name, it = max(rows)
        gains = per_seed_gains(result, name, it)
        return {"arm": name, "iteration": it, "mean_validation_gold": gold, "gain_over_sft": paired(gains)}

    oracle = best(["oracle"])
    room = oracle["gain_over_sft"]["mean"]
    out = {}
    for method in ("ppo", "dpo", "grpo"):
        names = [n for n, a in result["arms"].items() if method_of(a) == method and a["design"] != "oracle"]
        point = best(names)
        point["share_of_oracle_gain"] = point["gain_over_sft"]["mean"] / room if room > 0 else None
        out[method] = point
    return {"oracle": oracle, **out}


def costs(frontier_dir: Path, arm_names: list[str], result: dict) -> dict:
    """Seconds per iteration (PPO, GRPO: the mean over every seed's iterations, and per phase) or
    per epoch (DPO), from each arm's timings.json."""
    out = {}
    for name in arm_names:
        method = method_of(result["arms"][name])
        folder = "ppo" if method == "ppo" else method
        per = []
        for s in result["seeds"]:
            t = read_json(frontier_dir / s["folder"] / "arms" / name / folder / "timings.json")
            per += t["per_epoch"] if method == "dpo" else t["per_iteration"]
        if method == "dpo":
            out[name] = {"method": method, "seconds_per_epoch": statistics.fmean(per), "epochs": len(per)}
            continue
        phases = sorted({k for row in per for k in row})
        out[name] = {
            "method": method,
            "seconds_per_iteration": statistics.fmean(row["iteration"] for row in per),
            "phases": {k: statistics.fmean(row.get(k, 0.0) for row in per) for k in phases if k != "iteration"},
            "iterations": len(per),
        }
    return out


def compare_methods(record_json, out, workers=None, say=print) -> dict:
    """Steps 1 to 3 (module docstring); DIR/methods.json written last and returned."""
    from rlhf.studies.frontier.arms import Settings
    from rlhf.studies.frontier.study import STUDY_SEED, run_frontier

    declared = declaration(read_json(Path(record_json)), str(record_json))
    workers = workers_count(workers)
    out = output_folder(out)
    open_record(out, declared)
    done = out / "methods.json"
    if done.is_file():
        say(f"the methods are already compared in {done}: nothing recomputed")
        return read_json(done)
    t0 = time.perf_counter()
    result = run_frontier(
        out / "frontier", n=SEEDS, revision=declared["revision"], sft_budget=declared["sft_recipe"], workers=workers,
        profile_name=declared["profile"], settings=Settings(arms=arms(declared["arms"][1]), bon_ns=(1,)),
        study_seed=STUDY_SEED, say=say,
    )  # fmt: skip
    best = best_points(result)
    record = {
        "declared": declared,
        "best": best,
        "costs": costs(out / "frontier", declared["arms"], result),
        "seconds": time.perf_counter() - t0,
        "ran_with": ran_with(),
    }
    write_json(done, record)
    for method, p in best.items():
        g = p["gain_over_sft"]
        say(
            f"{method}: best {p['arm']} at {p['iteration']}, gold {p['mean_validation_gold']:.3f}, over SFT "
            f"{g['mean']:+.3f} [{g['t95'][0]:+.3f}, {g['t95'][1]:+.3f}]"
        )
    return record


def seeds_as(declared: dict) -> str:
    """The study whose declared seed count the confirmation on test takes: on a choice's testbed, the
    committed answer on test (VERDICT_STUDY); on a frontier's, that frontier's confirmation on test
    (its confirmation-study.json), so that every design on a testbed is read on as many seeds."""
    if "frontier" in declared:
        return str(Path(declared["frontier"]).with_name("confirmation-study.json"))
    return VERDICT_STUDY


def declared_seed_count(study: dict) -> int:
    """The seed count a committed study declared: the answer on test's power rule, or a frontier
    confirmation's n."""
    identity = study["identity"]
    return identity["power"]["seeds"] if "power" in identity else identity["n"]


def confirm_declaration(methods_record: dict, methods_path: str, seeds_study: str | None = None) -> dict:
    """Step 4 from the methods record (and the declared seed count of the study `seeds_as` names,
    read from `seeds_study` when given) alone."""
    from rlhf.studies.verdict import LAST_ITERATION

    best, declared = methods_record["best"], methods_record["declared"]
    source = seeds_as(declared)
    return {
        "methods": methods_path,
        "methods_commit": methods_record["ran_with"]["commit"],
        "seeds": declared_seed_count(read_json(Path(seeds_study or source))),
        "seeds_as": source,
        "points": {
            "dpo": {"arm": best["dpo"]["arm"], "iteration": best["dpo"]["iteration"]},
            "grpo": {"arm": best["grpo"]["arm"], "iteration": best["grpo"]["iteration"]},
            "default": {"arm": "spec-default", "iteration": LAST_ITERATION},
        },
        "comparisons": {
            "dpo_minus_sft": ["dpo", "sft"],
            "dpo_minus_default": ["dpo", "default"],
            "grpo_minus_sft": ["grpo", "sft"],
            "grpo_minus_default": ["grpo", "default"],
        },
        "study_seed": CONFIRM_STUDY_SEED,
        "sft_recipe": declared["sft_recipe"],
        "revision": declared["revision"],
        "profile": declared["profile"],
        "arms": declared["arms"],
        "reads": "train prompts (training) and test prompts (step 5's evaluation, after this declaration)",
    }


def confirm_methods(methods_json, out, workers=None, say=print) -> dict:
    """Steps 4 and 5 (module docstring); DIR/confirmation.json written last and returned."""
    from rlhf.studies.verdict import read_on_test

    declared = confirm_declaration(read_json(Path(methods_json)), str(methods_json))
    workers = workers_count(workers)
    out = output_folder(out)
    open_record(out, declared)
    done = out / "confirmation.json"
    if done.is_file():
        say(f"the methods are already confirmed in {done}: nothing recomputed")
        return read_json(done)
    by_name = {a.name: a for a in arms(declared["arms"][1])}
    used = tuple(by_name[p["arm"]] for p in declared["points"].values())
    return read_on_test(out, declared, declared["seeds"], CONFIRM_STUDY_SEED, workers, say, done=done, arms=used)
