"""What a frontier study's stored measurements say, recomputed from its files (nothing trained or
measured here): per seed, arm and iteration gold, proxy (raw and standardised per judge), d and
the answers' endings; their mean and spread over seeds; best-of-n; Gao's fits; the grid's best c;
the iterated judges' refreshes; each arm's best point; and the operating point chosen on
validation."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from rlhf import designs, rubric
from rlhf.config import load_profile
from rlhf.io import read_json
from rlhf.signals import RULES_FILE
from rlhf.studies.frontier.arms import Arm, Settings, grid_arms, resolved
from rlhf.studies.frontier.measure import BON_ENSEMBLE
from rlhf.studies.frontier.runs import measured_iterations
from rlhf.studies.statistics import INTERVAL, across_seeds, gao_curve, gao_fit
from rlhf.studies.validation import KL_ESTIMATOR
from rlhf.studies.warnings import score_rules
from rlhf.tokens import finish_reason_counts

POINT_STATS = (
    "gold",
    "proxy_std",
    "d",
    "kl",
    "gain",
    "truncations",
    "cut_at_limit",
    *rubric.TOKEN_FAULTS,  # out_of_vocabulary, control_token, broken_text: each counted on its own
    "repeats_polite_closing",
    "uncertified",
)
BON_KL = "KL(best-of-n || SFT) <= log n - (n - 1)/n: an upper bound (Beirami et al. 2024); d_bound is its square root"
GOLD = (
    "greedy rubric success on the validation prompts (best-of-n: the rubric success of the kept temperature-1 sample)"
)
PROXY = (
    "the judge's score of the same answers, standardised per judge: (s - mean) / SD of its scores "
    "of one temperature-1 SFT sample per validation prompt"
)
GRID_RULE = (
    "the c of the plain judge's arm (beta = c sigma) with the largest mean validation gold over seeds at any "
    "iteration >= 1; ties: the smaller c"
)
SELECTION_RULE = (
    "the largest mean validation gold over seeds among every (arm, iteration >= 1) but the oracle control; "
    "ties: smaller mean d, then the earlier arm and iteration"
)


def grid_choice(folders: list[Path], arms) -> dict | None:
    """The grid's best c (GRID_RULE) from the grid arms' stored validation measurements; None
    without a grid."""
    grid = grid_arms(arms)
    if not grid:
        return None
    iterations = measured_iterations(load_profile(str(folders[0] / "profile.toml")))
    best: tuple | None = None
    for arm in grid:
        for it in iterations:
            golds = [read_json(f / "arms" / arm.name / "validation" / f"iter-{it:04d}.json")["gold"] for f in folders]
            gold = sum(golds) / len(golds)
            if best is None or (gold, -cast(float, arm.c)) > (best[0], -cast(float, best[1].c)):
                best = (gold, arm, it)
    gold, arm, it = cast(tuple, best)
    cs = [cast(float, a.c) for a in grid]
    return {
        "rule": GRID_RULE,
        "c": arm.c,
        "arm": arm.name,
        "iteration": it,
        "mean_validation_gold": gold,
        # At the grid's largest c, gold may still rise beyond it: the grid does not show where it stops.
        "at_edge": arm.c == max(cs),
    }


def standardised(score: float, spread: dict) -> float:
    """A judge's score on the scale of its own SFT samples (mean 0, SD 1)."""
    return (score - spread["mean"]) / spread["sd"]


def _point(m: dict) -> dict:
    """One measurement's numbers, its answers' endings counted from its rows' finish reasons
    (rlhf.rubric.FINISH_REASONS): cut_at_limit (length) and each of rlhf.rubric.TOKEN_FAULTS.
    "truncations" (the measurement's, rlhf.studies.validation) is every answer without EOS as
    plain text, cut at the limit or holding a token fault (whatever its ending):
    truncations = cut_at_limit + out_of_vocabulary + control_token + broken_text."""
    rows = m["rows"]
    reasons = finish_reason_counts(r["finish_reason"] for r in rows)
    return {
        "gold": m["gold"],
        "proxy": m["proxy"],
        "truncations": m["truncations"],
        "uncertified": m["uncertified"],
        "cut_at_limit": reasons["length"],
        **{fault: reasons[fault] for fault in rubric.TOKEN_FAULTS},
        "repeats_polite_closing": sum(r["response"].count(rubric.POLITE_CLOSING) >= 2 for r in rows),
    }


def seed_summary(index: int, folder: Path, arm_list: tuple[Arm, ...]) -> dict:
    """One seed's stored measurements: its spreads, its SFT point and best-of-n, and per arm its
    KL coefficient, reward design and points (iteration 0 is the SFT policy: d 0), each point's
    proxy standardised by the seed's judge and its gain over the seed's SFT gold."""
    sft = read_json(folder / "frontier" / "sft.json")
    spread = sft["spread"]["validation"]
    it0 = sft["iteration_0"]
    seed = {
        "seed": index,
        "folder": folder.name,
        "sigma_validation": spread["sd"],
        "mean_validation": spread["mean"],
        "train_spread": sft["spread"]["train"],
        "sft": {**_point(it0), "proxy_std": standardised(it0["proxy"], spread)},
        "best_of_n": [{**p, "proxy_std": standardised(p["proxy"], spread)} for p in sft["best_of_n"]["points"]],
        "arms": {},
    }
    for arm in arm_list:
        arm_profile = load_profile(str(folder / "arms" / arm.name / "profile.toml"))
        points = [{**_point(it0), "iteration": 0, "kl": 0.0, "kl_se": 0.0, "d": 0.0}]
        for it in measured_iterations(arm_profile, arm):
            m = read_json(folder / "arms" / arm.name / "validation" / f"iter-{it:04d}.json")
            points.append({**_point(m), **{k: m[k] for k in ("iteration", "kl", "kl_se", "d")}})
        for p in points:
            p["proxy_std"] = standardised(p["proxy"], spread)
            p["gain"] = p["gold"] - it0["gold"]
        seed["arms"][arm.name] = {
            "kl_coef": arm_profile.ppo.kl_coef,
            "reward_design": arm_profile.ppo.reward_design,
            **({} if arm.method == "ppo" else {"method": arm.method}),
            "points": points,
        }
        if designs.design(arm_profile.ppo.reward_design).refreshes_judge:
            history = read_json(folder / "arms" / arm.name / "ppo" / "history.json")
            seed["arms"][arm.name]["refreshes"] = [{k: r[k] for k in REFRESH_KEYS} for r in history["refreshes"]]
    return seed


def arm_summaries(arm_list: tuple[Arm, ...], per_seed: list[dict]) -> dict:
    """Per arm: its curve (each POINT_STATS over seeds at iteration 0 and every kept one), its Gao
    fit over the checkpoints of all seeds (iteration >= 1), its coefficients per seed, and for an
    iterated judge its refreshes over seeds."""
    arms = {}
    for arm in arm_list:
        rows = []
        for k, it in enumerate(p["iteration"] for p in per_seed[0]["arms"][arm.name]["points"]):
            pts = [s["arms"][arm.name]["points"][k] for s in per_seed]
            rows.append({"iteration": it, **{key: across_seeds([p[key] for p in pts]) for key in POINT_STATS}})
        fit_points = [
            (p["d"], p["gain"]) for s in per_seed for p in s["arms"][arm.name]["points"] if p["iteration"] > 0
        ]
        arms[arm.name] = {
            "design": arm.design,
            "c": arm.c,
            "raw": arm.raw,
            "c_from_grid": arm.c_from_grid,
            "describe": arm.describe(),
            **({} if arm.method == "ppo" else {"method": arm.method, "method_settings": dict(arm.method_settings)}),
            "kl_coef_per_seed": [s["arms"][arm.name]["kl_coef"] for s in per_seed],
            "c_per_seed": [s["arms"][arm.name]["kl_coef"] / s["sigma_validation"] for s in per_seed],
            "curve": rows,
            "fit": gao_fit(fit_points, "rl"),
        }
        if designs.design(arm.design).refreshes_judge:
            arms[arm.name]["refreshes"] = refreshes_across([s["arms"][arm.name]["refreshes"] for s in per_seed])
    return arms


def bon_gains(points: list[dict]) -> list[tuple[float, float]]:
    """(d_bound, gain) of one seed's best-of-n points, each gain over the same seed's best-of-1:
    gain(n) = gold(n) - gold(n = 1), one temperature-1 SFT sample, what best-of-n starts from."""
    (one,) = [p["gold"] for p in points if p["n"] == 1]
    return [(p["d_bound"], p["gold"] - one) for p in points]


def best_of_n_summary(per_seed: list[dict], ns: tuple[int, ...]) -> dict:
    """Best-of-n per n over seeds (gold, standardised proxy, truncations, with its KL bound) and
    Gao's best-of-n fit of every seed's gains over its own best-of-1 (bon_gains)."""
    points = []
    for k, n in enumerate(ns):
        pts = [s["best_of_n"][k] for s in per_seed]
        points.append(
            {
                "n": n,
                "kl_bound": pts[0]["kl_bound"],
                "d_bound": pts[0]["d_bound"],
                **{key: across_seeds([p[key] for p in pts]) for key in ("gold", "proxy_std", "truncations")},
            }
        )
    fit = gao_fit([gain for s in per_seed for gain in bon_gains(s["best_of_n"])], "bon")
    return {"points": points, "fit": fit, "gain_over": "best-of-1 (one temperature-1 SFT sample)"}


def add_fit_curves(arms: dict, bon: dict) -> None:
    """Each fit that describes its points carries its curve up to the largest d of the study (an
    arm's mean d at any iteration, best-of-n's d bound), so that the report plots what the study
    computed (rlhf.report.frontier computes nothing)."""
    ds = [float(row["d"]["mean"]) for arm in arms.values() for row in arm["curve"]]
    d_max = max(ds + [float(p["d_bound"]) for p in bon["points"]])
    for fit in [*(arm["fit"] for arm in arms.values()), bon["fit"]]:
        fit["curve"] = gao_curve(fit, d_max)


def collect(folders: list[Path], settings: Settings) -> dict:
    """Per seed, arm and iteration: gold, proxy (raw and standardised per judge), d, truncations;
    their mean and spread over seeds; best-of-n; Gao's fits; the grid's best c; the iterated
    judges' refreshes; the chosen operating point."""
    choice = grid_choice(folders, settings.arms)
    arm_list = resolved(settings.arms, choice)
    iterations = measured_iterations(load_profile(str(folders[0] / "profile.toml")))
    per_seed = [seed_summary(i, f, arm_list) for i, f in enumerate(folders)]
    arms = arm_summaries(arm_list, per_seed)
    bon = best_of_n_summary(per_seed, settings.bon_ns)
    add_fit_curves(arms, bon)
    sft_level = across_seeds([s["sft"]["gold"] for s in per_seed])
    add_best_points(arms, sft_level["mean"])
    bon_ensemble = collect_ensemble_best_of_n(folders, settings, per_seed)
    return {
        "interval": INTERVAL,
        "kl_estimator": KL_ESTIMATOR,
        "bon_kl": BON_KL,
        "gold": GOLD,
        "proxy": PROXY,
        "iterations": [0, *iterations],
        "sft_level": sft_level,
        "seeds": per_seed,
        "arms": arms,
        "best_of_n": bon,
        **({"best_of_n_ensemble": bon_ensemble} if bon_ensemble is not None else {}),
        "grid_choice": choice,
        "oracle_min_gain": ORACLE_MIN_GAIN,
        "selection": select(arms, sft_level),
        "warnings": score_rules(RULES_FILE, folders, per_seed, _identity_of(folders)),
    }


def collect_ensemble_best_of_n(folders: list[Path], settings: Settings, per_seed: list[dict]) -> dict | None:
    """Best-of-n ranked by each ensemble reward (seed-i/frontier/best-of-n-ensemble.json), per n:
    gold, the ranking reward and truncations over seeds; and per ranking (the judge alone, each
    ensemble) the change of gold from n = 1 to the largest n, per seed and over seeds. Each seed's
    points are added to its `per_seed` entry. None when the study measures none."""
    if settings.ensemble_arm() is None or not settings.bon_ensembles:
        return None
    records = [read_json(f / "frontier" / BON_ENSEMBLE) for f in folders]
    rate, count = (-1.0, 1.0), (0, len(records[0]["successes"]))  # a difference of rates; answers per seed
    designs = {}
    for design in settings.bon_ensembles:
        per = [r["designs"][design]["points"] for r in records]
        designs[design] = {
            "points": [
                {
                    "n": n,
                    "kl_bound": per[0][k]["kl_bound"],
                    "d_bound": per[0][k]["d_bound"],
                    "gold": across_seeds([p[k]["gold"] for p in per], (0.0, 1.0)),
                    "reward": across_seeds([p[k]["proxy"] for p in per]),
                    "truncations": across_seeds([p[k]["truncations"] for p in per], count),
                }
                for k, n in enumerate(settings.bon_ns)
            ],
            "gold_change": across_seeds([bon_gains(p)[-1][1] for p in per], rate),
        }
        for seed, points in zip(per_seed, per):
            seed.setdefault("best_of_n_ensemble", {})[design] = points
    return {
        "ensemble_size": records[0]["ensemble_size"],
        "ensemble_lambda": records[0]["ensemble_lambda"],
        "members": records[0]["members"],
        "ns": list(settings.bon_ns),
        "draws": "the same temperature-1 SFT samples as best-of-n under the judge (the same seed)",
        "judge_gold_change": across_seeds([bon_gains(s["best_of_n"])[-1][1] for s in per_seed], rate),
        "designs": designs,
    }


def _identity_of(folders: list[Path]) -> dict | None:
    """The identity of the study the seed folders belong to (its study.json), if any."""
    path = folders[0].parent / "study.json"
    return read_json(path)["identity"] if path.is_file() else None


# The share of the oracle's gain an arm recovers is shown only where the oracle gains at least this
# much over SFT (the drop margin of the warnings, about 1.5 standard errors on 180 prompts): a share
# of a gain within the noise is no number.
ORACLE_MIN_GAIN = 0.05


def is_control(arm: dict) -> bool:
    """An oracle control, whatever its name: its reward design reads the rubric's target (shown,
    never chosen, the yardstick of what a right reward reaches)."""
    return designs.design(arm["design"]).reads_target


def add_best_points(arms: dict, sft_gold: float) -> None:
    """Each arm's best checkpoint (largest mean validation gold over seeds among iterations >= 1,
    never the SFT policy itself; ties: the smaller mean d, then the earlier iteration), its gain
    over SFT, and the share of the oracle control's best gain it recovers: the largest best gain of
    the arms whose design is the oracle (None without one, or when that gain is below
    ORACLE_MIN_GAIN)."""
    for arm in arms.values():
        trained = [r for r in arm["curve"] if r["iteration"] > 0]
        best = max(trained, key=lambda r: (r["gold"]["mean"], -r["d"]["mean"], -r["iteration"]))
        arm["best"] = {
            "iteration": best["iteration"],
            "gold": best["gold"]["mean"],
            "d": best["d"]["mean"],
            "gain": best["gold"]["mean"] - sft_gold,
        }
    oracle = max((a["best"]["gain"] for a in arms.values() if is_control(a)), default=None)
    for arm in arms.values():
        share = None
        if oracle is not None and oracle >= ORACLE_MIN_GAIN:
            share = arm["best"]["gain"] / oracle
        arm["best"]["share_of_oracle_gain"] = share


REFRESH_KEYS = ("after_iteration", "successes", "answers", "new_pairs", "accuracy_before", "accuracy_after")


def refreshes_across(per_seed: list[list[dict]]) -> list[dict]:
    """Each refresh point (after iteration n) over seeds: mean labelled pairs and rubric
    successes, and the judge's accuracy on the new pairs before and after (mean over the seeds
    that had pairs; `seeds_with_pairs` says how many)."""
    out = []
    for k, first in enumerate(per_seed[0]):
        at = [seed[k] for seed in per_seed]
        with_pairs = [r for r in at if r["accuracy_before"] is not None]
        out.append(
            {
                "after_iteration": first["after_iteration"],
                "answers": first["answers"],
                "successes": sum(r["successes"] for r in at) / len(at),
                "new_pairs": sum(r["new_pairs"] for r in at) / len(at),
                "seeds_with_pairs": len(with_pairs),
                **{
                    key: (sum(r[key] for r in with_pairs) / len(with_pairs) if with_pairs else None)
                    for key in ("accuracy_before", "accuracy_after")
                },
            }
        )
    return out


def select(arms: dict, sft_level: dict) -> dict | None:
    """The best (arm, iteration) by mean validation gold over seeds (iteration >= 1; the oracle
    control excluded; on a tie the smaller mean d, then the earlier arm and iteration). None for
    a study of controls alone (the SFT-budget rule's oracle study): nothing there may be chosen.
    `default` is the SPEC's default at its last iteration (None in a study without that arm)."""
    candidates = [
        (row["gold"]["mean"], -row["d"]["mean"], name, row["iteration"])
        for name, arm in arms.items()
        if not is_control(arm)
        for row in arm["curve"]
        if row["iteration"] > 0
    ]
    if not candidates:
        return None
    order = {name: k for k, name in enumerate(arms)}
    best = max(candidates, key=lambda c: (c[0], c[1], -order[c[2]], -c[3]))
    return {
        "rule": SELECTION_RULE,
        "arm": best[2],
        "iteration": best[3],
        "mean_validation_gold": best[0],
        "sft_mean_validation_gold": sft_level["mean"],
        "above_sft": best[0] > sft_level["mean"],
        "default": (
            {"arm": "spec-default", "iteration": arms["spec-default"]["curve"][-1]["iteration"]}
            if "spec-default" in arms
            else None
        ),
    }
