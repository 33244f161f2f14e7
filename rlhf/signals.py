"""Over-optimisation warning signals, computed from a PPO history without any gold label.

Each signal is one value per PPO iteration i, from the records PPO logs (docs/signals.md), or
None while its windows are not yet full. W = WINDOW iterations; the early window is iterations
0 .. W-1 (the policy as it left SFT), the current window i-W+1 .. i:

    kl                     mean over the current window of the sequence log-ratio to the reference
    kl_growth              kl[i] - kl[i - W]
    entropy_drop           early mean of the sampling entropy - its current-window mean
    truncation_rate        share of the current window's answers cut without EOS
    length_growth          current-window mean response length - early mean
    clip_fraction          current-window mean of the updates' clip fractions
    update_shift           current-window mean of the updates' k3 shift (ppo_math.update_shift)
    advantage_drift        W1(current, early) of the advantage distribution: the mean absolute
                           difference of their quantile functions (each window's logged
                           quantiles averaged)
    score_drift            W1 between the judge's scores of the current window and of the early
                           window (empirical distributions of equal size)
    score_spread           SD of the judge's scores in the current window
    ensemble_disagreement  current-window mean of the members' SD per answer (ensembles only)
    judge_error            1 - the iterated judge's accuracy on the policy's fresh pairs at its
                           last refresh (iterated judge only; None before the first labelled one)

A signal missing from a history (no ensemble, no refresh) is None at every iteration.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

WINDOW = 5
# The frozen warning rules (rlhf.studies.warnings chose them on r002's validation checkpoints).
RULES_FILE = Path(__file__).with_name("warning_rules.json")
RULES_FORMAT = "rlhf-warning-rules-1"
SIGNALS = (
    "kl",
    "kl_growth",
    "entropy_drop",
    "truncation_rate",
    "length_growth",
    "clip_fraction",
    "update_shift",
    "advantage_drift",
    "score_drift",
    "score_spread",
    "ensemble_disagreement",
    "judge_error",
)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def wasserstein_1(a: list[float], b: list[float]) -> float:
    """W1 between two empirical distributions of equal size: mean |a_(k) - b_(k)| over the sorted values."""
    if len(a) != len(b) or not a:
        raise ValueError(f"W1 of two samples of equal, non-zero size, got {len(a)} and {len(b)}")
    return sum(abs(x - y) for x, y in zip(sorted(a), sorted(b))) / len(a)


def quantile_distance(qa: list[float], qb: list[float]) -> float:
    """W1 between two distributions given by their quantiles at evenly spaced levels 0..1: the
    trapezoid rule over the absolute difference of the quantile functions."""
    if len(qa) != len(qb) or len(qa) < 2:
        raise ValueError(f"two quantile functions on one grid of at least 2 levels, got {len(qa)} and {len(qb)}")
    d = [abs(x - y) for x, y in zip(qa, qb)]
    return (sum(d) - (d[0] + d[-1]) / 2) / (len(d) - 1)


def _mean_quantiles(rows: list[list[float]]) -> list[float]:
    return [sum(col) / len(col) for col in zip(*rows)]


def signal_series(history: dict, w: int = WINDOW, since: int = 0) -> dict[str, list[float | None]]:
    """{signal: [value at iteration 0, 1, ...]} of one PPO history (rlhf.ppo's history.json).

    `since`: only iterations from there on are computed (None before), so that a caller following
    a run iteration by iteration pays for the new ones only; every value depends on iterations up
    to its own, so it is the same either way."""
    its = history["iterations"]
    n = len(its)
    kl = [it["mean_sequence_log_ratio"] for it in its]
    entropy = [it["entropy"] for it in its]
    length = [it["response_length"] for it in its]
    cut = [it["truncations"] / len(it["scores"]) for it in its]
    clip = [statistics.fmean(it["clip_fraction"]) for it in its]
    shift = [statistics.fmean(it["update_shift"]) for it in its]
    quantiles = [it["advantage_quantiles"] for it in its]
    scores = [it["scores"] for it in its]
    out: dict[str, list[float | None]] = {name: [None] * n for name in SIGNALS}
    for r in history.get("refreshes", []):  # held from the refresh on: known after iteration after_iteration - 1
        if r["accuracy_before"] is not None:
            for i in range(max(r["after_iteration"] - 1, since), n):
                out["judge_error"][i] = 1.0 - r["accuracy_before"]
    if n < w:  # the early window is not yet full
        return out
    # The early window's values, once.
    early_entropy, early_length = statistics.fmean(entropy[:w]), statistics.fmean(length[:w])
    early_quantiles = _mean_quantiles(quantiles[:w])
    early_scores = [s for row in scores[:w] for s in row]
    for i in range(max(w - 1, since), n):
        now = slice(i - w + 1, i + 1)  # the current window
        out["kl"][i] = _mean(kl[now])
        out["entropy_drop"][i] = early_entropy - statistics.fmean(entropy[now])
        out["truncation_rate"][i] = _mean(cut[now])
        out["length_growth"][i] = statistics.fmean(length[now]) - early_length
        out["clip_fraction"][i] = _mean(clip[now])
        out["update_shift"][i] = _mean(shift[now])
        out["advantage_drift"][i] = quantile_distance(_mean_quantiles(quantiles[now]), early_quantiles)
        current = [s for row in scores[now] for s in row]
        out["score_drift"][i] = wasserstein_1(current, early_scores)
        out["score_spread"][i] = statistics.pstdev(current)
        if i >= 2 * w - 1:
            out["kl_growth"][i] = _mean(kl[now]) - _mean(kl[i - 2 * w + 1 : i - w + 1])
    if "member_scores" in its[0]:
        first = max(w - 1, since) - w + 1  # the earliest iteration a computed window reads
        disagreement = {
            j: statistics.fmean(statistics.pstdev(col) for col in zip(*its[j]["member_scores"]))
            for j in range(first, n)
        }
        for i in range(max(w - 1, since), n):
            out["ensemble_disagreement"][i] = _mean([disagreement[j] for j in range(i - w + 1, i + 1)])
    return out


# ------------------------------------------------------------------------------ warning rules


@dataclass(frozen=True)
class Rule:
    """A warning: `signal` at or above `threshold` for `patience` consecutive iterations; it
    fires at the last of them."""

    signal: str
    threshold: float
    patience: int

    def describe(self) -> str:
        return f"{self.signal} >= {self.threshold:.4g} for {self.patience} iteration(s)"


def first_firing(series: list[float | None], rule: Rule) -> int | None:
    """The iteration where `rule` first fires on `series`, or None."""
    run = 0
    for i, value in enumerate(series):
        run = run + 1 if value is not None and value >= rule.threshold else 0
        if run >= rule.patience:
            return i
    return None


DROP_MARGIN = 0.05  # gold "falls" when it is more than this below the seed's SFT (about 1.5 SE on 180 prompts)


def gold_events(points: list[tuple[int, float]], sft_gold: float, margin: float = DROP_MARGIN) -> dict:
    """From (iteration, gold) checkpoints (iteration >= 1): the peak (largest gold, earliest on a
    tie); the first dip (the first checkpoint more than `margin` below SFT's gold); and the drop,
    the first checkpoint from which gold stays more than `margin` below SFT's at every later
    checkpoint (None when gold never fell for good: a dip it recovered from is noise, or a
    swing, not over-optimisation)."""
    peak = max(points, key=lambda p: (p[1], -p[0]))[0]
    below = [gold < sft_gold - margin for _, gold in points]
    dip = next((it for (it, _), low in zip(points, below) if low), None)
    drop = None
    for k in range(len(points) - 1, -1, -1):  # the start of the last run of checkpoints below
        if not below[k]:
            break
        drop = points[k][0]
    return {"peak": peak, "first_dip": dip, "drop": drop, "margin": margin}


def score_rule(rule: Rule, runs: list[dict]) -> dict:
    """How `rule` does on `runs` ({"name", "series": signal_series(...), "gold": [(iteration,
    gold)], "sft": SFT gold}) where its signal exists. Per run where gold fell: the lead (drop
    iteration - firing iteration: positive is early, zero or negative late) or a miss (no
    firing); per run where it did not: a false alarm when it fired."""
    rows = []
    for run in runs:
        if all(v is None for v in run["series"][rule.signal]):
            continue  # the signal does not exist for this run (an ensemble's disagreement without an ensemble)
        fire = first_firing(run["series"][rule.signal], rule)
        events = gold_events(run["gold"], run["sft"])
        dropped = events["drop"] is not None
        rows.append(
            {
                "name": run["name"],
                "fired_at": fire,
                **events,
                "lead": (events["drop"] - fire) if dropped and fire is not None else None,
                "miss": dropped and fire is None,
                "false_alarm": (not dropped) and fire is not None,
            }
        )
    fell = [r for r in rows if r["drop"] is not None]
    held = [r for r in rows if r["drop"] is None]
    leads = [r["lead"] for r in fell if r["lead"] is not None]
    return {
        "rule": rule.describe(),
        "signal": rule.signal,
        "threshold": rule.threshold,
        "patience": rule.patience,
        "runs": rows,
        "fell": len(fell),
        "held": len(held),
        "early": sum(lead > 0 for lead in leads),
        "late": sum(lead <= 0 for lead in leads),
        "misses": sum(r["miss"] for r in rows),
        "false_alarms": sum(r["false_alarm"] for r in rows),
        "median_lead": statistics.median(leads) if leads else None,
    }


PATIENCES = (1, 3, 5)
MAX_FALSE_ALARM_RATE = 0.2  # a rule may fire on at most this share of the runs where gold held


def choose_rule(signal: str, runs: list[dict], patiences=PATIENCES, max_false_alarm_rate=MAX_FALSE_ALARM_RATE):
    """The rule for `signal` chosen on `runs` (the selection data, and nothing else): thresholds
    at the signal's observed values, every patience; among rules firing falsely on at most
    `max_false_alarm_rate` of the runs where gold held, the most early warnings, then the
    largest median lead, then the fewest misses, then the higher threshold. None when the
    signal is never defined or no rule meets the false-alarm bound."""
    values = sorted({v for run in runs for v in run["series"][signal] if v is not None})
    if not values:
        return None
    held = sum(
        gold_events(r["gold"], r["sft"])["drop"] is None
        for r in runs
        if any(v is not None for v in r["series"][signal])
    )
    best, best_key = None, None
    for threshold in values:
        for patience in patiences:
            rule = Rule(signal, threshold, patience)
            s = score_rule(rule, runs)
            if held and s["false_alarms"] / held > max_false_alarm_rate:
                continue
            key = (s["early"], s["median_lead"] if s["median_lead"] is not None else -math.inf, -s["misses"], threshold)
            if best_key is None or key > best_key:
                best, best_key = rule, key
    return best


def frozen_rules(path: Path | None = None) -> tuple[list[Rule], int]:
    """(the rules of a frozen rules file that are defined, its window). A missing file is refused:
    the committed one ships with the package, and a lab without it would warn of nothing, silently."""
    path = RULES_FILE if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no warning-rules file {path}: the frozen rules ship inside the rlhf package "
            f"(rlhf/warning_rules.json); reinstall it (pip install .) or restore the file"
        )
    data = json.loads(path.read_text())
    if data.get("format") != RULES_FORMAT:
        raise ValueError(f"{path} is not a warning-rules file of format {RULES_FORMAT}")
    rules = [Rule(r["signal"], r["threshold"], r["patience"]) for r in data["rules"] if r["threshold"] is not None]
    return rules, data["window"]


def fired_in_order(history: dict, rules: list[Rule], window: int) -> list[tuple[int, Rule]]:
    """(iteration index, rule) of every rule that fired, by the iteration where it first fired
    (rules' own order on a tie): the order the lab says and records them in."""
    fired = firings(history, rules, window)
    return [
        (fired[r.signal], r)
        for _, _, r in sorted((fired[r.signal], k, r) for k, r in enumerate(rules) if r.signal in fired)
    ]


def firings(history: dict, rules: list[Rule], window: int) -> dict[str, int]:
    """{rule signal: the iteration where it first fired} over a PPO history so far."""
    if not rules or not history["iterations"]:
        return {}
    series = signal_series(history, window)
    out = {}
    for rule in rules:
        at = first_firing(series[rule.signal], rule)
        if at is not None:
            out[rule.signal] = at
    return out
