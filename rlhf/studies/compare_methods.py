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

Nothing here reads a test prompt. The confirmation on test is a later study, declared from this
record's choices.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from rlhf.io import output_folder, read_json, write_json
from rlhf.studies.record import open_record, ran_with, workers_count
from rlhf.studies.statistics import paired
from rlhf.studies.testbed import recipe

SEEDS = 3
DPO_BETAS = (0.1, 0.5)  # TRL's default, and five times it
DPO_EPOCHS = 3
GRPO_GROUP = 4  # G: a PPO iteration's 4 answers as one group
GRPO_BETA = 0.04  # the published method's
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


def declaration(choice_record: dict, choice_path: str) -> dict:
    testbed = read_json(Path(choice_record["declared"]["testbed"]))
    found = recipe(testbed, choice_record["declared"]["testbed"])
    return {
        "choice": choice_path,
        "choice_commit": choice_record["steps"][-1]["commit"],
        "sft_recipe": found["sft_recipe"],
        "revision": choice_record["declared"]["revision"],
        "profile": choice_record["declared"]["profile"],
        "arms": [a.name for a in arms(choice_record["chosen"]["arm"])],
        "seeds": SEEDS,
        "reads": READS,
    }


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


def compare_methods(choice_json, out, workers=None, say=print) -> dict:
    """Steps 1 to 3 (module docstring); DIR/methods.json written last and returned."""
    from rlhf.studies.frontier.arms import Settings
    from rlhf.studies.frontier.study import STUDY_SEED, run_frontier

    choice_path = str(choice_json)
    choice_record = read_json(Path(choice_json))
    declared = declaration(choice_record, choice_path)
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
        profile_name=declared["profile"], settings=Settings(arms=arms(choice_record["chosen"]["arm"]), bon_ns=(1,)),
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
