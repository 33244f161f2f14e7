"""Over-optimisation warnings scored against gold in a frontier study (signals: rlhf.signals).

Every run of a frontier study (one arm on one seed) has its PPO history, from which each signal
is computed without gold, and its validation gold at every checkpoint. The gold says when the
run over-optimised: the first checkpoint whose gold is more than DROP_MARGIN below the seed's SFT
(a run where that never happens "held": the oracle control, or a learned reward that does not
over-optimise). A warning rule per signal (threshold and patience) is

  1. chosen on one study's runs (`choose_rules`, `rlhf frontier --out DIR --choose-warnings
     FILE`): for each signal the rule with the most early warnings among those that fire falsely
     on at most MAX_FALSE_ALARM_RATE of the held runs (rlhf.signals.choose_rule), and frozen
     into FILE with the identity of the study it was chosen on;
  2. scored on any study's runs (`score_rules`, part of every frontier summary): per run where
     gold fell, the lead (drop iteration - firing iteration; zero or negative is late) or a
     miss, and per held run a false alarm if it fired. The summary says whether the study is the
     one the rules were chosen on (in-sample) or another (out of sample).

The committed rules (RULES_FILE) were chosen on r002's validation checkpoints; on r001 and on
any other study they are scored out of sample.
"""

from __future__ import annotations

from pathlib import Path

from rlhf.io import read_json, sha256_file, write_json
from rlhf.signals import (
    DROP_MARGIN,
    MAX_FALSE_ALARM_RATE,
    PATIENCES,
    RULES_FORMAT,
    SIGNALS,
    WINDOW,
    Rule,
    choose_rule,
    gold_events,
    score_rule,
    signal_series,
)
from rlhf.studies import StudyError

FORMAT = RULES_FORMAT


def study_runs(folders: list[Path], per_seed: list[dict], window: int = WINDOW) -> list[dict]:
    """Every (seed, PPO arm) run of a study: its signals (from its PPO history) and its validation
    gold per checkpoint (iteration >= 1) beside the seed's SFT gold (frontier collect's per-seed data)."""
    runs = []
    for folder, seed in zip(folders, per_seed):
        for arm, data in seed["arms"].items():
            if data.get("method", "ppo") != "ppo":  # the signals are read from PPO's history
                continue
            history = read_json(folder / "arms" / arm / "ppo" / "history.json")
            runs.append(
                {
                    "name": f"{folder.name}/{arm}",
                    "arm": arm,
                    "design": data["reward_design"],
                    "series": signal_series(history, window),
                    "gold": [(p["iteration"], p["gold"]) for p in data["points"] if p["iteration"] > 0],
                    "sft": seed["sft"]["gold"],
                }
            )
    return runs


def _study_key(identity: dict) -> dict:
    """What makes two studies the same data: format, revision, seeds and budgets."""
    return {k: identity.get(k) for k in ("format", "revision", "n", "study_seed", "sft_budget", "profile")}


def choose_rules(out, dest, window: int = WINDOW, say=print) -> dict:
    """Choose one rule per signal on the finished study in `out` and freeze them into the new
    file `dest` (never overwritten), with the study's identity and the settings of the choice."""
    out, dest = Path(out), Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} exists: frozen warning rules are never overwritten (name a new file)")
    done = out / "frontier.json"
    if not done.is_file():
        raise StudyError(f"no {done}: the study must be finished before rules are chosen on it")
    result = read_json(done)
    folders = [out / s["folder"] for s in result["seeds"]]
    runs = study_runs(folders, result["seeds"], window)
    rules = []
    for signal in SIGNALS:
        rule = choose_rule(signal, runs)
        rules.append(
            {"signal": signal, "threshold": rule.threshold, "patience": rule.patience}
            if rule is not None
            else {"signal": signal, "threshold": None, "patience": None}
        )
    record = {
        "format": FORMAT,
        "chosen_on": {"study": _study_key(result["study"]), "frontier_json_sha256": sha256_file(done)},
        "window": window,
        "drop_margin": DROP_MARGIN,
        "max_false_alarm_rate": MAX_FALSE_ALARM_RATE,
        "patiences": list(PATIENCES),
        "runs": {"total": len(runs), "fell": sum(_fell(r) for r in runs)},
        "rules": rules,
    }
    write_json(dest, record)
    say(f"warning rules chosen on {out} ({len(runs)} runs) frozen into {dest}")
    return record


def _fell(run: dict) -> bool:
    return gold_events(run["gold"], run["sft"])["drop"] is not None


def score_rules(rules_file: Path, folders: list[Path], per_seed: list[dict], identity: dict | None) -> dict:
    """The frozen rules of `rules_file` scored on a study's runs (module docstring)."""
    if not Path(rules_file).is_file():
        return {"status": f"no frozen warning rules ({rules_file})"}
    frozen = read_json(rules_file)
    if frozen.get("format") != FORMAT:
        raise StudyError(f"{rules_file} is not a warning-rules file of format {FORMAT}")
    if frozen["drop_margin"] != DROP_MARGIN:
        raise StudyError(
            f"{rules_file} was chosen with a drop margin of {frozen['drop_margin']}, this code's is {DROP_MARGIN}"
        )
    runs = study_runs(folders, per_seed, frozen["window"])
    scores = [
        score_rule(Rule(r["signal"], r["threshold"], r["patience"]), runs)
        for r in frozen["rules"]
        if r["threshold"] is not None
    ]
    return {
        "status": "scored",
        "rules_file": Path(rules_file).name,
        "rules_sha256": sha256_file(rules_file),
        "chosen_on": frozen["chosen_on"],
        "in_sample": identity is not None and _study_key(identity) == frozen["chosen_on"]["study"],
        "window": frozen["window"],
        "drop_margin": frozen["drop_margin"],
        "never_defined": [r["signal"] for r in frozen["rules"] if r["threshold"] is None],
        "scores": scores,
    }


BEST_RULE = (
    "the rule with the most early warnings on the study it was scored on; ties: fewer false alarms, then SIGNALS' order"
)


def best_rule(scored: dict) -> str:
    """The signal of the best scored rule (BEST_RULE) in a `score_rules` record."""
    if scored.get("status") != "scored" or not scored["scores"]:
        raise StudyError("no scored warning rules to choose from")
    order = {name: k for k, name in enumerate(SIGNALS)}
    best = max(scored["scores"], key=lambda s: (s["early"], -s["false_alarms"], -order[s["signal"]]))
    return best["signal"]
