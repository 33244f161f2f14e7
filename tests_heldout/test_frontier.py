"""The over-optimisation frontier (SPEC §12): its arithmetic, and a 2-seed study on the small budget.

The study (`small_frontier`, conftest) is built with the corpus's evaluation view refusing every
call, so its existence proves that nothing on the frontier's path reads a test prompt.
"""

from __future__ import annotations

import html.parser
import json
import math
import os
import random
import re
import shutil
from pathlib import Path

import pytest
import torch

from rlhf.config import ProfileError, load_profile, profile_text_with
from rlhf.studies.statistics import across_seeds, gao_fit
from rlhf.studies.validation import bon_kl_bound, validation_prompts

ROOT = Path(__file__).resolve().parents[1]

# One xdist worker runs the module: the small study is built once, and no worker waits for another's.
pytestmark = [pytest.mark.unit, pytest.mark.xdist_group("frontier")]


# ------------------------------------------------------------------------------ arithmetic


def _exact_bon_kl(n: int, outcomes: int) -> float:
    """KL(best-of-n || uniform) over `outcomes` equally likely, distinct-scored outcomes: the i-th
    best of N is kept with probability (i/N)^n - ((i-1)/N)^n."""
    kl = 0.0
    for i in range(1, outcomes + 1):
        p = (i / outcomes) ** n - ((i - 1) / outcomes) ** n
        if p > 0:
            kl += p * math.log(p * outcomes)
    return kl


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_best_of_n_kl_bound_is_the_no_ties_limit(n):
    bound = bon_kl_bound(n)
    assert bound == pytest.approx(math.log(n) - (n - 1) / n, abs=1e-15)
    coarse, fine = _exact_bon_kl(n, 20), _exact_bon_kl(n, 200_000)
    assert coarse <= bound + 1e-12  # ties (coarse outcomes) only lower it: an upper bound
    assert fine == pytest.approx(bound, abs=1e-3)


def test_best_of_n_refuses_n_below_one():
    with pytest.raises(ValueError, match="n >= 1"):
        bon_kl_bound(0)


@pytest.mark.parametrize("alpha,beta", [(0.3, 0.2), (1.0, 0.5), (0.05, 0.4)])
def test_rl_fit_recovers_known_alpha_beta(alpha, beta):
    rng = random.Random(7)
    ds = [0.1 * k for k in range(1, 40)]
    pts = [(d, d * (alpha - beta * math.log(d)) + rng.gauss(0, 1e-3)) for d in ds]
    fit = gao_fit(pts, "rl")
    assert fit["alpha"] == pytest.approx(alpha, abs=5e-3)
    assert fit["beta"] == pytest.approx(beta, abs=5e-3)
    assert fit["d_star"] == pytest.approx(math.exp(alpha / beta - 1), rel=0.05)
    assert fit["describes"] and fit["r2"] > 0.99
    assert len(fit["residuals"]) == len(pts)


def test_bon_fit_recovers_known_alpha_beta_and_refuses_a_poor_one():
    pts = [(d, d * (0.4 - 0.25 * d)) for d in (0.2, 0.5, 0.8, 1.1, 1.4, 1.7)]
    fit = gao_fit(pts + [(0.0, 0.0)], "bon")  # d = 0 carries nothing
    assert fit["n"] == 6
    assert (fit["alpha"], fit["beta"]) == (pytest.approx(0.4), pytest.approx(0.25))
    assert fit["d_star"] == pytest.approx(0.8)
    noise = [(d, (-1) ** k * 0.3) for k, d in enumerate((0.2, 0.5, 0.8, 1.1, 1.4, 1.7))]
    poor = gao_fit(noise, "bon")
    assert not poor["describes"] and poor["why_not"]
    falling = gao_fit([(d, -0.2 * d - 0.01 * d * math.log(d)) for d in (0.5, 1, 2, 3, 4)], "rl")
    assert falling["describes"] and falling["d_star"] is None and "no peak above SFT" in falling["peak"]
    few = gao_fit([(d, d * (0.4 - 0.25 * d)) for d in (0.5, 1, 2)], "bon")
    assert not few["describes"] and few["why_not"] == "only 3 points"


def test_a_fits_curve_is_its_formula_at_evenly_spaced_d_and_only_where_it_describes():
    """gao_curve: d_max * k / 50 for k = 1..50, gain = d (alpha - beta log d) (rl) or
    d (alpha - beta d) (bon), recomputed here; None for a fit that does not describe its points."""
    from rlhf.studies.statistics import gao_curve

    rl = gao_fit([(d, d * (0.3 - 0.2 * math.log(d))) for d in (0.3, 0.7, 1.2, 2.0, 3.1)], "rl")
    curve = gao_curve(rl, 4.0)
    assert curve["d"] == [4.0 * k / 50 for k in range(1, 51)]
    for d, g in zip(curve["d"], curve["gain"]):
        assert g == pytest.approx(d * (rl["alpha"] - rl["beta"] * math.log(d)), abs=1e-12)
    assert rl["alpha"] == pytest.approx(0.3) and rl["beta"] == pytest.approx(0.2)
    bon = gao_fit([(d, d * (0.4 - 0.25 * d)) for d in (0.2, 0.5, 0.8, 1.1, 1.4)], "bon")
    bon_curve = gao_curve(bon, 2.0, n=4)
    assert bon_curve == {
        "d": [0.5, 1.0, 1.5, 2.0],
        "gain": [pytest.approx(d * (0.4 - 0.25 * d)) for d in (0.5, 1, 1.5, 2)],
    }
    assert gao_curve(gao_fit([(0.5, 0.1), (1.0, 0.2)], "rl"), 3.0) is None  # 2 points: does not describe


def test_the_frontier_writes_each_fits_curve_and_the_page_computes_none(small_frontier):
    """The report reads every number from frontier.json: each fit that describes its points
    carries its curve up to the study's largest d; rlhf.report imports nothing from rlhf.studies."""

    import rlhf
    from rlhf.studies.statistics import gao_curve

    _, result = small_frontier
    bon = result["best_of_n"]
    d_max = max(
        [p["d_bound"] for p in bon["points"]] + [r["d"]["mean"] for a in result["arms"].values() for r in a["curve"]]
    )
    for fit in [a["fit"] for a in result["arms"].values()] + [bon["fit"]]:
        assert "curve" in fit
        assert fit["curve"] == gao_curve(fit, d_max)  # None exactly where it does not describe
    report = Path(rlhf.__file__).parent / "report"
    imports = re.compile(r"^\s*(from rlhf\.studies|import rlhf\.studies|from rlhf import studies)", re.M)
    assert not [p.name for p in report.rglob("*.py") if imports.search(p.read_text())]


def test_seed_interval_of_a_bounded_quantity_stays_inside_its_bounds():
    values = [-1.0, -0.9, -0.2, -0.95, -1.0]
    free = across_seeds(values)
    assert free["t95"][0] < -1  # the formula alone leaves the range
    cut = across_seeds(values, (-1.0, 1.0))
    assert cut["t95"][0] == -1.0 and cut["clipped"] and cut["t95_unclipped"] == free["t95"]
    assert not across_seeds([0.2, 0.3, 0.25], (-1.0, 1.0))["clipped"]


def test_profile_text_writes_floats_and_optional_tables_that_read_back(tmp_path):
    from rlhf.config import PROFILE_DIR

    changes = {("ppo", "kl_coef"): 0.1 + 0.2, ("ppo", "actor_lr"): 1e-5, ("evaluation", "max_units"): 3}
    path = tmp_path / "p.toml"
    path.write_text(profile_text_with((PROFILE_DIR / "embedded.toml").read_text(), "x", changes))
    p = load_profile(str(path))
    assert (p.ppo.kl_coef, p.ppo.actor_lr, p.evaluation.max_units) == (0.1 + 0.2, 1e-5, 3)
    with pytest.raises(ProfileError, match="finite"):
        profile_text_with(path.read_text(), "x", {("ppo", "kl_coef"): float("nan")})


FAULTS = ("out_of_vocabulary", "control_token", "broken_text")  # each a kind of its own (docs/results.md)


def reason_counts(rows: list[dict]) -> dict[str, int]:
    """Each finish reason's rows, counted here by hand."""
    return {k: sum(r["finish_reason"] == k for r in rows) for k in ("eos", "length", *FAULTS)}


def test_a_points_endings_count_each_finish_reason_of_its_rows():
    """cut_at_limit and each token fault are counted from the rows, each on its own, and the
    measurement's truncations (every answer whose finish reason is not eos) is their sum; a name
    that is no finish reason (the single `undecodable` of older measurements) is refused."""
    from rlhf.studies.frontier.selection import POINT_STATS, _point

    reasons = ["eos"] * 4 + ["length"] * 2 + ["control_token"] * 3 + ["broken_text"] * 5 + ["out_of_vocabulary"]
    rows = [{"finish_reason": r, "response": "Have a pleasant day. " * (k % 3)} for k, r in enumerate(reasons)]
    truncations = sum(r != "eos" for r in reasons)
    m = {"gold": 0.25, "proxy": 1.5, "truncations": truncations, "uncertified": 9, "rows": rows}
    point = _point(m)
    by_hand = reason_counts(rows)
    assert point["cut_at_limit"] == by_hand["length"] == 2
    assert (
        {f: point[f] for f in FAULTS}
        == {f: by_hand[f] for f in FAULTS}
        == {
            "out_of_vocabulary": 1,
            "control_token": 3,
            "broken_text": 5,
        }
    )
    assert point["cut_at_limit"] + sum(point[f] for f in FAULTS) == point["truncations"] == 11
    assert point["repeats_polite_closing"] == sum(k % 3 == 2 for k in range(len(reasons)))
    assert "undecodable" not in point and {"cut_at_limit", *FAULTS} <= set(POINT_STATS)
    with pytest.raises(ValueError, match="unknown finish reason 'undecodable'"):
        _point({**m, "rows": [*rows, {"finish_reason": "undecodable", "response": ""}]})


def test_validation_measurements_refuse_anything_but_the_learning_view(tmp_path):
    from rlhf.corpus import load_corpus, prepare

    prepare(tmp_path / "c", revision="r002")
    corpus = load_corpus(tmp_path / "c")
    with pytest.raises(TypeError, match="LearningView only"):
        validation_prompts(corpus.evaluation_view())
    rows = validation_prompts(corpus.learning_view())
    assert len(rows) == 180 and len({r["family"] for r in rows}) == 36
    with pytest.raises(PermissionError):
        corpus.learning_view().inputs("pair", "test")


# ------------------------------------------------------------------------------ the committed studies
# Selection, best-of-n and d recomputed here, by hand, from the per-seed points the committed
# frontier.json files store, and by the module's functions on the same points: both must give
# the committed numbers. On both studies several arms never beat SFT at any checkpoint.


def committed(revision: str) -> dict:
    return json.loads((ROOT / "results" / f"frontier-{revision}" / "frontier.json").read_text())


def curves_by_hand(result: dict) -> dict[str, dict[int, tuple[float, float]]]:
    """{arm: {iteration: (mean gold, mean d) over seeds}} from each seed's stored points."""
    out: dict = {}
    for name in result["arms"]:
        at: dict = {}
        for s in result["seeds"]:
            for p in s["arms"][name]["points"]:
                at.setdefault(p["iteration"], []).append((p["gold"], p["d"]))
        out[name] = {it: (sum(g for g, _ in v) / len(v), sum(d for _, d in v) / len(v)) for it, v in at.items()}
    return out


def without_best(arms: dict) -> dict:
    arms = json.loads(json.dumps(arms))
    for arm in arms.values():
        arm.pop("best")
    return arms


@pytest.mark.parametrize("revision", ["r001", "r002"])
def test_each_arms_best_point_and_the_choice_recomputed_from_the_committed_studys_points(revision):
    """Each arm's best point is its largest mean gold among iterations >= 1 (ties: smaller mean d,
    earlier iteration), never iteration 0 even where no checkpoint beats SFT; the choice is the
    largest among every non-oracle arm's (ties: smaller d, earlier arm, earlier iteration)."""
    from rlhf.studies.frontier.selection import add_best_points, select

    result = committed(revision)
    sft = sum(s["sft"]["gold"] for s in result["seeds"]) / len(result["seeds"])
    assert result["sft_level"]["mean"] == pytest.approx(sft, abs=1e-12)
    curves = curves_by_hand(result)
    below = [n for n, c in curves.items() if max(g for it, (g, _) in c.items() if it > 0) < sft]
    assert len(below) >= 2, below  # arms whose SFT point (iteration 0, gain 0) would beat every checkpoint
    arms = without_best(result["arms"])
    add_best_points(arms, result["sft_level"]["mean"])
    for name, arm in arms.items():
        for row in arm["curve"]:
            assert (row["gold"]["mean"], row["d"]["mean"]) == pytest.approx(curves[name][row["iteration"]], abs=1e-12)
        it = min((i for i in curves[name] if i > 0), key=lambda i: (-curves[name][i][0], curves[name][i][1], i))
        assert arm["best"]["iteration"] == it >= 1, name
        assert arm["best"]["gain"] == pytest.approx(curves[name][it][0] - sft, abs=1e-12)
        assert arm["best"] == result["arms"][name]["best"], name  # the committed record is this code's
    order = list(arms)
    pairs = [(n, i) for n in order if result["arms"][n]["design"] != "oracle" for i in curves[n] if i > 0]
    best = min(pairs, key=lambda p: (-curves[p[0]][p[1]][0], curves[p[0]][p[1]][1], order.index(p[0]), p[1]))
    sel = select(arms, result["sft_level"])
    assert (sel["arm"], sel["iteration"]) == best
    assert sel == result["selection"]


@pytest.mark.parametrize("revision", ["r001", "r002"])
def test_an_oracle_control_is_never_chosen_whatever_its_name(revision):
    """A second oracle-type arm under another name, above every arm at every checkpoint, and the
    oracle itself renamed: the choice is the study's, each arm's share of the oracle's gain is
    over the best oracle-type arm's gain; and where no checkpoint of any arm beats SFT the choice
    is still a trained checkpoint (iteration >= 1), marked not above SFT."""
    from rlhf.studies.frontier.selection import add_best_points, select

    result = committed(revision)
    sft = result["sft_level"]["mean"]
    arms = {("control" if n == "oracle" else n): a for n, a in without_best(result["arms"]).items()}
    top = json.loads(json.dumps(arms["control"]))
    for row in top["curve"][1:]:
        row["gold"]["mean"] = 1.0
    arms["oracle-lr1e-5"] = top
    add_best_points(arms, sft)
    sel = select(arms, result["sft_level"])
    assert (sel["arm"], sel["iteration"]) == (result["selection"]["arm"], result["selection"]["iteration"])
    for name, arm in arms.items():
        assert arm["best"]["share_of_oracle_gain"] == pytest.approx(arm["best"]["gain"] / (1.0 - sft), abs=1e-12)
    low = without_best(result["arms"])
    for arm in low.values():
        for row in arm["curve"][1:]:
            row["gold"]["mean"] -= 1.0
    add_best_points(low, sft)
    sel = select(low, result["sft_level"])
    assert sel["iteration"] >= 1 and not sel["above_sft"]
    assert all(arm["best"]["iteration"] >= 1 and arm["best"]["gain"] < 0 for arm in low.values())


@pytest.mark.parametrize("revision", ["r001", "r002"])
def test_a_study_of_controls_alone_chooses_nothing_and_says_so(revision):
    """The SFT-budget rule's study runs the oracle arm alone: nothing there may be chosen, its
    page says so, and a confirmation of it is refused."""
    from rlhf.report.frontier import frontier_intro
    from rlhf.studies import StudyError
    from rlhf.studies.frontier.confirmation import confirmation_points
    from rlhf.studies.frontier.selection import select

    result = committed(revision)
    controls = {name: arm for name, arm in result["arms"].items() if arm["design"] == "oracle"}
    assert select(controls, result["sft_level"]) is None
    alone = {**result, "arms": controls, "selection": None}
    assert "every arm of this study is a control, never chosen" in "".join(frontier_intro(alone))
    with pytest.raises(StudyError, match="nothing to confirm"):
        confirmation_points(alone)


def test_the_recorded_command_makes_the_study_or_says_that_none_does(tmp_path):
    """The page's "Reproduce" line: the default arms give the plain command (with --grid when the
    grid is another), the SFT-budget rule's oracle study (one arm no option chooses) a line saying
    no command makes it alone, and naming the command that extends it."""
    from rlhf.studies.frontier.arms import Settings, default_arms
    from rlhf.studies.frontier.study import STUDY_SEED, frontier_command, study_identity

    def command(settings):
        return frontier_command(tmp_path, study_identity("embedded", "r002", 3, "sft-e6", settings, STUDY_SEED))

    plain = f"rlhf frontier --out {tmp_path} --n 3 --revision r002 --sft-budget sft-e6"
    assert command(Settings()) == plain
    assert command(Settings(arms=default_arms((0.1, 1.0)))) == plain + " --grid 0.1,1"
    oracle = Settings(arms=tuple(a for a in default_arms() if a.name == "oracle"))
    assert (
        command(oracle)
        == f"no rlhf frontier command makes these arms alone (oracle); `{plain}` extends the study to its arms"
    )


@pytest.mark.parametrize("revision", ["r001", "r002"])
def test_a_study_without_the_spec_default_still_chooses_and_its_confirmation_names_the_missing_arm(revision):
    """Without the spec-default arm the choice is made among the other arms as before (it is not a
    study of controls alone); only the confirmation, which compares the choice with that arm, is
    refused, naming it."""
    from rlhf.studies import StudyError
    from rlhf.studies.frontier.confirmation import confirmation_points
    from rlhf.studies.frontier.selection import select

    result = committed(revision)
    others = {name: arm for name, arm in result["arms"].items() if name != "spec-default"}
    sel = select(others, result["sft_level"])
    assert (sel["arm"], sel["iteration"]) == (result["selection"]["arm"], result["selection"]["iteration"])
    assert sel["default"] is None
    with pytest.raises(StudyError, match="no spec-default arm"):
        confirmation_points({**result, "arms": others, "selection": sel})


@pytest.mark.parametrize("revision", ["r001", "r002"])
def test_best_of_n_gains_are_over_best_of_one_of_the_same_seed_in_the_committed_studies(revision):
    """Best-of-n's fit is over every seed's gains gold(n) - gold(n = 1) of that same seed, recomputed
    here from the stored per-seed points (the seeds' best-of-1 golds differ, so another seed's, or
    their mean, or SFT's greedy gold would move the points); the change of gold under the judge
    alone, from n = 1 to the largest n, likewise."""
    from rlhf.studies.frontier.selection import best_of_n_summary

    result = committed(revision)
    seeds = result["seeds"]
    assert len({next(p["gold"] for p in s["best_of_n"] if p["n"] == 1) for s in seeds}) > 1
    gains, changes = [], []
    for s in seeds:
        by_n = {p["n"]: p for p in s["best_of_n"]}
        gains += [(p["d_bound"], p["gold"] - by_n[1]["gold"]) for p in s["best_of_n"]]
        changes.append(by_n[max(by_n)]["gold"] - by_n[1]["gold"])
    want = gao_fit(gains, "bon")
    ns = tuple(p["n"] for p in result["best_of_n"]["points"])
    got = best_of_n_summary(seeds, ns)
    stored = {k: v for k, v in result["best_of_n"]["fit"].items() if k != "curve"}
    assert {k: v for k, v in got["fit"].items() if k != "curve"} == want == stored
    assert got["points"] == result["best_of_n"]["points"]
    change = result["best_of_n_ensemble"]["judge_gold_change"]["mean"]
    assert change == pytest.approx(sum(changes) / len(changes), abs=1e-12)


def test_settings_refuse_two_arms_of_one_name_and_best_of_n_without_best_of_one():
    """An arm's name is its folder: two arms of one name are refused; best-of-n's n must rise from
    1, since its gains are over best-of-1."""
    from rlhf.studies import StudyError
    from rlhf.studies.frontier.arms import Arm, Settings

    with pytest.raises(StudyError, match="c0.05 used twice"):
        Settings(arms=(Arm("c0.05", "judge", c=0.05), Arm("c0.05", "judge", c=0.05)))
    for ns in ((2, 4), (1, 4, 2), (1, 1, 2), ()):
        with pytest.raises(StudyError, match="must rise from 1"):
            Settings(bon_ns=ns)
    assert Settings(bon_ns=(1, 3)).bon_ns == (1, 3)
    # An arm at the grid's best c needs a grid to take it from.
    cbest = Arm("iterated-judge-cbest", "iterated-judge", c_from_grid=True)
    with pytest.raises(StudyError, match="need grid arms"):
        Settings(arms=(cbest,))
    assert Settings(arms=(Arm("c1", "judge", c=1.0), cbest)).arms[1] == cbest


def test_d_is_the_square_root_of_the_kl_estimate_and_zero_where_it_is_negative():
    """d = sqrt(KL) where the mean KL estimate is >= 0 and 0 where it is negative (the unbiased
    sampled-token estimate of a policy near SFT can be), never sqrt(|KL|); every stored point of
    the committed studies holds it."""
    from rlhf.studies.validation import distance

    assert [distance(kl) for kl in (0.0, 0.09, 4.0)] == [0.0, 0.3, 2.0]
    assert [distance(kl) for kl in (-1e-12, -0.09, -4.0)] == [0.0, 0.0, 0.0]
    for revision in ("r001", "r002"):
        for s in committed(revision)["seeds"]:
            for arm in s["arms"].values():
                assert all(p["d"] == distance(p["kl"]) for p in arm["points"])


# What reads a test prompt, in the package: the corpus's evaluation view and rlhf.evaluate's
# held-out generation, scoring and rubric rows (each reads that view), and whatever imports them.
TEST_READERS = re.compile(r"evaluation_view|EvaluationView|\bfrom rlhf\.evaluate import|\bfrom rlhf import evaluate\b")


def _frontier_modules() -> dict[str, str]:
    import rlhf.studies.frontier as package

    return {p.stem: p.read_text() for p in sorted(Path(package.__file__).parent.glob("*.py"))}


def test_only_the_confirmation_module_can_read_test_prompts():
    """Of the frontier's modules only `confirmation` reaches the evaluation view (directly or through
    rlhf.evaluate's held-out readers), and no other module imports it: the arms, runs, validation
    measurements, selection and orchestration cannot read a test prompt. (The small study is built
    with the evaluation view refusing every call: the same, at run time.)"""
    modules = _frontier_modules()
    assert set(modules) == {"__init__", "arms", "runs", "measure", "selection", "study", "confirmation"}
    assert TEST_READERS.search(modules["confirmation"])  # the check sees a reader where there is one
    for name, text in modules.items():
        if name in ("__init__", "confirmation"):
            continue
        assert not TEST_READERS.search(text), f"rlhf.studies.frontier.{name} reads test prompts"
        assert "frontier.confirmation" not in text and "frontier import confirmation" not in text, name
    body = modules["__init__"].split('"""')[2]  # the package's own code, past its docstring
    assert not body.strip(), "rlhf/studies/frontier/__init__.py holds code: each concern has its module"


# ------------------------------------------------------------------------------ the small study


def test_small_frontier_has_every_arm_point_and_choice(small_frontier):
    out, result = small_frontier
    assert set(result["arms"]) == {
        "spec-default",
        "c0.05",
        "standardised-judge",
        "oracle",
        "iterated-judge",
        "ensemble-min-cbest",
    }
    assert result["iterations"] == [0, 2, 4]
    for arm in result["arms"].values():
        assert [r["iteration"] for r in arm["curve"]] == [0, 2, 4]
        assert arm["curve"][0]["d"]["mean"] == 0.0 and arm["curve"][0]["gain"]["mean"] == 0.0
        assert all(r["gold"]["n"] == 2 for r in arm["curve"])
    assert [p["n"] for p in result["best_of_n"]["points"]] == [1, 2]
    sel = result["selection"]
    assert sel["arm"] != "oracle" and sel["iteration"] >= 1
    best = max(
        (r["gold"]["mean"], name, r["iteration"])
        for name, arm in result["arms"].items()
        if arm["design"] != "oracle"
        for r in arm["curve"][1:]
    )
    assert sel["mean_validation_gold"] == best[0]
    page = (out / "report.html").read_text()
    assert '<img src="data:image/png;base64,' in page and sel["arm"] in page


def test_an_arm_at_the_grids_best_c_runs_there_after_the_grid(small_frontier):
    """The grid's best c is chosen from the grid arms' validation gold (GRID_RULE), recorded, and
    written into the arm that takes it: its KL coefficient is that c times its seed's spread."""
    out, result = small_frontier
    choice = result["grid_choice"]
    grid = result["arms"]["c0.05"]["curve"][1:]
    best = max(grid, key=lambda r: r["gold"]["mean"])
    assert (choice["c"], choice["arm"]) == (0.05, "c0.05")
    assert (choice["iteration"], choice["mean_validation_gold"]) == (best["iteration"], best["gold"]["mean"])
    arm = result["arms"]["ensemble-min-cbest"]
    assert arm["c"] == 0.05 and arm["c_from_grid"] is True and arm["design"] == "ensemble-min"
    for s in result["seeds"]:
        profile = load_profile(str(out / s["folder"] / "arms" / "ensemble-min-cbest" / "profile.toml"))
        assert profile.ppo.kl_coef == 0.05 * s["sigma_validation"]
        assert (profile.ppo.reward_design, profile.ppo.ensemble_size) == ("ensemble-min", 2)
        # Its PPO started after every grid checkpoint was measured.
        ppo_started = (out / s["folder"] / "arms" / "ensemble-min-cbest" / "run.json").stat().st_mtime
        assert ppo_started > (out / s["folder"] / "arms" / "c0.05" / "validation" / "iter-0004.json").stat().st_mtime
        assert (out / s["folder"] / "judge-1" / "judge.safetensors").is_file()  # the ensemble's other member


def test_the_iterated_judges_refreshes_are_collected_per_seed_and_across(small_frontier):
    out, result = small_frontier
    arm = result["arms"]["iterated-judge"]
    per_seed = [s["arms"]["iterated-judge"]["refreshes"] for s in result["seeds"]]
    assert [[r["after_iteration"] for r in seed] for seed in per_seed] == [[2], [2]]
    (across,) = arm["refreshes"]
    assert across["new_pairs"] == sum(seed[0]["new_pairs"] for seed in per_seed) / 2
    with_pairs = [seed[0] for seed in per_seed if seed[0]["accuracy_before"] is not None]
    assert across["seeds_with_pairs"] == len(with_pairs)
    if with_pairs:
        assert across["accuracy_before"] == sum(r["accuracy_before"] for r in with_pairs) / len(with_pairs)
    for s in result["seeds"]:
        h = json.loads((out / s["folder"] / "arms" / "iterated-judge" / "ppo" / "history.json").read_text())
        assert h["refreshes"][0]["answers"] == 16  # 8 prompts, 2 answers each
    page = (out / "report.html").read_text()
    assert "Judge refreshes" in page and "judge accuracy before" in page


def test_the_study_writes_one_series_per_seed_and_arm_under_the_arms_name(small_frontier):
    """TensorBoard's reader finds, per seed, the seed's SFT and judge (and the ensemble's other
    judge), and per arm its PPO and its validation checkpoints, in folders named by the arm; each
    PPO series equals the arm's history.json (its own beta), refreshes included, and each
    validation series the arm's measurements, with the SFT policy at step 0."""
    from conftest import assert_series_equal, epoch_stage_expected, ppo_expected, read_series

    out, result = small_frontier
    found = sorted(str(p.parent.relative_to(out)) for p in out.rglob("events.out.tfevents.*"))
    want = []
    members = {s["folder"]: sorted(p.name for p in (out / s["folder"]).glob("judge-*")) for s in result["seeds"]}
    assert all(members.values())  # the worst-case ensemble's other judges
    for s in result["seeds"]:
        want += [f"{s['folder']}/tensorboard/{stage}" for stage in ("judge", *members[s["folder"]], "sft")]
        want += [f"{s['folder']}/arms/{a}/tensorboard/{k}" for a in result["arms"] for k in ("ppo", "validation")]
    assert sorted(set(found)) == sorted(want)
    refreshes = 0
    for s in result["seeds"]:
        seed = out / s["folder"]
        for stage in ("sft", "judge", *members[s["folder"]]):
            history = json.loads((seed / stage / "history.json").read_text())
            assert_series_equal(read_series(seed / "tensorboard" / stage), epoch_stage_expected(history), stage)
        sft_point = json.loads((seed / "frontier" / "sft.json").read_text())["iteration_0"]
        for arm in result["arms"]:
            arm_dir = seed / "arms" / arm
            cfg = load_profile(str(arm_dir / "profile.toml")).ppo
            history = json.loads((arm_dir / "ppo" / "history.json").read_text())
            got = read_series(arm_dir / "tensorboard" / "ppo")
            got = {t: v for t, v in got.items() if not t.startswith("timing_s/")}
            assert_series_equal(got, ppo_expected(history, cfg.kl_coef, cfg.truncation_penalty), f"{arm} ppo")
            refreshes += len(got.get("judge_refresh/pairs_so_far", []))
            points = [(0, sft_point)] + [
                (m["iteration"], m) for m in (json.loads(p.read_text()) for p in sorted(arm_dir.glob("validation/*")))
            ]
            expected: dict = {}
            for step, m in points:
                for tag, value in (
                    ("rubric_success", m["gold"]),
                    ("judge_score", m["proxy"]),
                    ("kl_from_sft", m["kl"]),
                    ("sqrt_kl_from_sft", max(m["kl"], 0.0) ** 0.5),
                    ("truncation_rate", m["truncations"] / m["n"]),
                    ("uncertified_rate", m["uncertified"] / m["n"]),
                ):
                    expected.setdefault(f"validation/{tag}", {})[step] = value
            assert_series_equal(read_series(arm_dir / "tensorboard" / "validation"), expected, f"{arm} validation")
    assert refreshes == len(result["seeds"])  # the iterated judge's one refresh per seed


def test_each_arms_best_point_and_share_of_the_oracles_gain_are_the_studys(small_frontier):
    from rlhf.studies.frontier.selection import ORACLE_MIN_GAIN

    _, result = small_frontier
    sft = result["sft_level"]["mean"]
    oracle = result["arms"]["oracle"]["best"]
    for arm in result["arms"].values():
        best = arm["best"]
        top = max(r["gold"]["mean"] for r in arm["curve"][1:])
        assert best["gold"] == top and best["gain"] == top - sft
        row = next(r for r in arm["curve"] if r["iteration"] == best["iteration"])
        assert row["gold"]["mean"] == top and best["d"] == row["d"]["mean"]
        want = best["gain"] / oracle["gain"] if oracle["gain"] >= ORACLE_MIN_GAIN else None
        assert best["share_of_oracle_gain"] == want


def test_kl_coefficient_is_c_times_the_measured_spread(small_frontier):
    out, result = small_frontier
    for s in result["seeds"]:
        sigma = json.loads((out / s["folder"] / "frontier" / "sft.json").read_text())["spread"]["validation"]["sd"]
        assert sigma == s["sigma_validation"] > 0
        profile = load_profile(str(out / s["folder"] / "arms" / "c0.05" / "profile.toml"))
        assert profile.ppo.kl_coef == 0.05 * sigma
        assert load_profile(str(out / s["folder"] / "arms" / "spec-default" / "profile.toml")).ppo.kl_coef == 0.02


def test_kl_estimate_recomputed_from_stored_rows_and_from_the_models(small_frontier):
    from rlhf.studies import validation
    from rlhf.studies.frontier.arms import Arm
    from rlhf.studies.frontier.measure import measurement_seeds
    from rlhf.studies.frontier.runs import actor_at, arm_context, roles_for_measuring

    out, result = small_frontier
    seed_dir = out / "seed-0"
    m = json.loads((seed_dir / "arms" / "spec-default" / "validation" / "iter-0004.json").read_text())
    per_prompt = [r["kl"] for r in m["rows"]]
    assert m["kl"] == pytest.approx(sum(per_prompt) / len(per_prompt), abs=1e-12)
    assert m["d"] == math.sqrt(max(m["kl"], 0.0))
    assert result["seeds"][0]["arms"]["spec-default"]["points"][-1]["kl"] == m["kl"]

    # Independently: draw the same samples, then score them with a plain forward pass of each
    # model over the whole sequence (not rlhf.scoring), summing log pi - log pi_SFT per answer.
    ctx = arm_context(seed_dir, Arm("spec-default", "judge", raw=0.02), "r002")
    actor = actor_at(ctx, 4)
    sft, _ = roles_for_measuring(ctx)
    records = validation.validation_prompts(ctx.corpus.learning_view(), ctx.profile.evaluation.max_units)
    prompt_ids = validation.encode_records(records, ctx)
    gen = torch.Generator().manual_seed(measurement_seeds(ctx.profile)["kl"])
    samples = validation.answers(actor.model, prompt_ids, ctx, gen)
    got = []
    with torch.no_grad():
        for p, r in zip(prompt_ids, samples):
            ids = torch.tensor([p + r])
            total = 0.0
            for model, sign in ((actor.model, 1.0), (sft.model, -1.0)):
                logits = model(input_ids=ids).logits[0, len(p) - 1 : -1].float()
                logits = logits[:, : len(ctx.tokenizer)]  # the softmax over the tokenizer's real tokens
                total += sign * float(torch.log_softmax(logits, -1).gather(1, torch.tensor(r)[:, None]).sum())
            got.append(total)
    assert got == pytest.approx(per_prompt, abs=2e-4)


def test_standardisation_computed_once_recorded_and_applied_to_that_arm_only(small_frontier):
    out, _ = small_frontier
    for seed_dir in sorted(out.glob("seed-*")):
        train = json.loads((seed_dir / "frontier" / "sft.json").read_text())["spread"]["train"]
        assert train["n"] == 672 and train["sd"] > 0
        arm = seed_dir / "arms" / "standardised-judge"
        profile = load_profile(str(arm / "profile.toml"))
        assert (profile.ppo.reward_design, profile.ppo.score_mean, profile.ppo.score_sd) == (
            "standardised-judge",
            train["mean"],
            train["sd"],
        )
        run = json.loads((arm / "run.json").read_text())
        assert run["identity"]["profile"] == profile.name  # declared in the run's identity
        history = json.loads((arm / "ppo" / "history.json").read_text())
        for it in history["iterations"]:
            assert it["reward_design"] == "standardised-judge"
            want = [(s - train["mean"]) / train["sd"] for s in it["scores"]]
            assert it["paid_scores"] == pytest.approx(want, rel=1e-6, abs=1e-6)
        for other in ("spec-default", "c0.05"):
            h = json.loads((seed_dir / "arms" / other / "ppo" / "history.json").read_text())
            assert all("paid_scores" not in it for it in h["iterations"])  # the SPEC's reward, untouched
        oracle = json.loads((seed_dir / "arms" / "oracle" / "ppo" / "history.json").read_text())
        assert all(set(it["paid_scores"]) <= {0.0, 1.0} for it in oracle["iterations"])


def test_rerun_of_a_finished_frontier_recomputes_nothing(small_frontier, tmp_path, monkeypatch):
    from rlhf.studies.frontier import study as frontier_study
    from rlhf.studies.frontier.study import run_frontier

    out, result = small_frontier
    study = tmp_path / "study"
    shutil.copytree(out, study)
    profile = str(out.parent / "embedded-frontier-small.toml")
    before = {p: os.stat(p).st_mtime_ns for p in study.rglob("*") if p.is_file()}

    def no_work(*args, **kwargs):
        raise AssertionError("a finished frontier started work")

    monkeypatch.setattr(frontier_study, "run_tasks", no_work)
    lines = []
    from conftest import small_frontier_settings

    again = run_frontier(
        study, n=2, revision="r002", sft_budget="full", workers=1, profile_name=profile,
        settings=small_frontier_settings(), say=lines.append,
    )  # fmt: skip
    assert again == result and "nothing recomputed" in lines[-1]
    assert {p: os.stat(p).st_mtime_ns for p in study.rglob("*") if p.is_file()} == before


def test_an_interrupted_frontier_recomputes_only_what_is_missing(small_frontier, tmp_path):
    from conftest import small_frontier_settings
    from rlhf.studies.frontier.study import run_frontier

    out, result = small_frontier
    study = tmp_path / "study"
    shutil.copytree(out, study)
    lost = study / "seed-1" / "arms" / "oracle" / "validation" / "iter-0002.json"
    kept = json.loads(lost.read_text())
    for p in (lost, study / "frontier.json", study / "report.html"):
        p.unlink()
    before = {p: os.stat(p).st_mtime_ns for p in study.rglob("*") if p.is_file()}
    again = run_frontier(
        study, n=2, revision="r002", sft_budget="full", workers=1,
        profile_name=str(out.parent / "embedded-frontier-small.toml"), settings=small_frontier_settings(),
        say=lambda line: None,
    )  # fmt: skip
    remeasured = json.loads(lost.read_text())
    assert remeasured.pop("seconds") > 0 and kept.pop("seconds") > 0
    assert remeasured == kept  # the same measurement, every number equal
    changed = {p for p in before if os.stat(p).st_mtime_ns != before[p]}
    assert changed == set()  # nothing else was rewritten
    assert {k: again[k] for k in ("arms", "best_of_n", "selection")} == {
        k: result[k] for k in ("arms", "best_of_n", "selection")
    }


def test_a_changed_setting_is_refused_in_an_existing_study(small_frontier, tmp_path):
    from rlhf.studies import StudyError
    from rlhf.studies.frontier.arms import Settings
    from rlhf.studies.frontier.study import run_frontier

    out, _ = small_frontier
    study = tmp_path / "study"
    shutil.copytree(out, study)
    (study / "frontier.json").unlink()
    with pytest.raises(StudyError, match="refusing to continue"):
        run_frontier(
            study, n=2, revision="r002", sft_budget="full", workers=1,
            profile_name=str(out.parent / "embedded-frontier-small.toml"), settings=Settings(),
            say=lambda line: None,
        )  # fmt: skip


def test_confirmation_needs_the_choice_made_on_validation(tmp_path):
    from rlhf.studies import StudyError
    from rlhf.studies.frontier.confirmation import run_confirmation

    with pytest.raises(StudyError, match="chosen on validation first"):
        run_confirmation(tmp_path / "nothing", n=5)


def test_confirmation_runs_the_choice_the_default_and_the_stopped_default_on_fresh_seeds(
    small_frontier, tmp_path, monkeypatch
):
    from rlhf import signals
    from rlhf.studies.frontier import confirmation
    from rlhf.studies.frontier.arms import SPEC_KL
    from rlhf.studies.frontier.confirmation import STOP_ARM, STOP_SIGNAL, run_confirmation, test_file

    out, result = small_frontier
    study = tmp_path / "study"
    shutil.copytree(out, study)
    # The small budget's 4 iterations are too few for the committed kl_growth rule: a rules file
    # whose kl_growth rule fires at the first iteration with a growth (iteration 1) makes the stop real.
    rules = tmp_path / "warning_rules.json"
    kl_growth = {"signal": STOP_SIGNAL, "threshold": -1e30, "patience": 1}
    frozen = {"format": signals.RULES_FORMAT, "window": 1, "drop_margin": signals.DROP_MARGIN, "rules": [kl_growth]}
    frozen["chosen_on"] = {"study": {"revision": "r002"}}
    rules.write_text(json.dumps(frozen))
    monkeypatch.setattr(signals, "RULES_FILE", rules)  # what PPO stops by
    monkeypatch.setattr(confirmation, "RULES_FILE", rules)  # what the confirmation scores
    record = run_confirmation(study, n=2, workers=1, say=lambda line: None)
    sel = result["selection"]
    want = [("spec-default", 4)] + (
        [] if (sel["arm"], sel["iteration"]) == ("spec-default", 4) else [(sel["arm"], sel["iteration"])]
    )
    assert [(p["arm"], p["iteration"]) for p in record["points"]] == [*want, ("spec-default-stop", None)]
    stopped = record["points"][-1]
    for row in stopped["seeds"]:
        arm = study / "confirm" / row["folder"] / "arms" / "spec-default-stop"
        ppo = load_profile(str(arm / "profile.toml")).ppo
        assert (ppo.stop_on_warning, ppo.stop_signals, ppo.kl_coef) == (True, ("kl_growth",), SPEC_KL)
        history = json.loads((arm / "ppo" / "history.json").read_text())
        assert row["iteration"] == len(history["iterations"]) == 2 < ppo.iterations  # fired at 1: 2 done
        rec = json.loads((arm / "test-final.json").read_text())
        assert rec["iteration"] == 2
        # its test rows are those of the stopped policy, not of the default's last iteration
        default = json.loads((arm.parent / "spec-default" / "test-iter-0004.json").read_text())
        assert rec["ppo_rows"] != default["ppo_rows"]
    assert "where a warning stopped PPO (iteration per seed: 2, 2)" in (study / "confirmation.html").read_text()
    frontier_seeds = {load_profile(str(study / s["folder"] / "profile.toml")).seeds for s in result["seeds"]}
    confirm_seeds = {load_profile(str(f / "profile.toml")).seeds for f in sorted((study / "confirm").glob("seed-*"))}
    assert len(confirm_seeds) == 2 and not confirm_seeds & frontier_seeds  # fresh training seeds
    for p in record["points"]:
        for row in p["seeds"]:
            rec = json.loads(
                test_file(study / "confirm" / row["folder"], STOP_ARM, None).read_text()
                if p["iteration"] is None
                else (
                    study / "confirm" / row["folder"] / "arms" / p["arm"] / f"test-iter-{p['iteration']:04d}.json"
                ).read_text()
            )
            ppo = [r for r in rec["ppo_rows"] if r["population"] == "test"]
            success = sum(r["rubric"]["rubric_success"] for r in ppo) / len(ppo)
            assert row["metrics"]["rubric_success.test.ppo"] == pytest.approx(success, abs=1e-12)
        diffs = [row["metrics"]["rubric_success.test.ppo_minus_sft"] for row in p["seeds"]]
        assert p["across"]["rubric_success.test.ppo_minus_sft"]["mean"] == pytest.approx(sum(diffs) / 2, abs=1e-12)
        assert -1.0 <= p["across"]["rubric_success.test.ppo_minus_sft"]["t95"][0]
    confirmation_page_shows(study / "confirmation.html", json.loads((study / "confirmation.json").read_text()))
    # The frozen rules scored on these fresh seeds, against test gold at every kept checkpoint of
    # the runs that went to the last iteration; the last checkpoint's gold is the point's own.
    warned = record["warnings"]
    assert warned["status"] == "scored" and warned["in_sample"] is False and "test rubric success" in warned["gold"]
    runs = {r["name"] for sc in warned["scores"] for r in sc["runs"]}
    assert runs == {f"{row['folder']}/{p['arm']}" for p in record["points"][:-1] for row in p["seeds"]}
    for row in record["points"][0]["seeds"]:
        arm = study / "confirm" / row["folder"] / "arms" / "spec-default"
        for it in (2, 4):
            gold = json.loads((arm / "test-gold" / f"iter-{it:04d}.json").read_text())
            sft_rows = json.loads((arm.parents[1] / "frontier" / "test-sft.json").read_text())["rows"]
            assert gold["n"] == len(gold["success"]) == sum(r["population"] == "test" for r in sft_rows)
            assert gold["gold"] == sum(gold["success"]) / len(gold["success"])
        assert gold["gold"] == pytest.approx(row["metrics"]["rubric_success.test.ppo"], abs=1e-12)
    assert "Over-optimisation warnings on these seeds" in (study / "confirmation.html").read_text()
    answers = json.loads((study / "confirmation-answers.json").read_text())
    for p in record["points"]:
        key = f"{p['arm']}@{'stop' if p['iteration'] is None else p['iteration']}"
        for row in p["seeds"]:
            test = [a for a in answers[row["folder"]] if a["population"] == "test"]
            assert test and {a["sft"]["rubric_success"] for a in test} <= {True, False}
            rate = sum(a[key]["rubric_success"] for a in test) / len(test)
            assert rate == pytest.approx(row["metrics"]["rubric_success.test.ppo"], abs=1e-12)
    again = run_confirmation(study, n=2, workers=1, say=lambda line: None)
    assert again == json.loads((study / "confirmation.json").read_text())
    # A finished confirmation of 2 seeds is not returned for another seed count: refused, untouched.
    from rlhf.studies import StudyError

    before = {p: os.stat(p).st_mtime_ns for p in study.rglob("*") if p.is_file()}
    with pytest.raises(StudyError, match=r"identity changed in n \(n was 2, now 3\)"):
        run_confirmation(study, n=3, workers=1, say=lambda line: None)
    assert {p: os.stat(p).st_mtime_ns for p in study.rglob("*") if p.is_file()} == before


def test_summary_is_recomputed_from_the_stored_measurements_into_a_new_folder(small_frontier, tmp_path):
    from rlhf.studies import StudyError
    from rlhf.studies.frontier.study import summarise_to

    out, result = small_frontier
    dest = tmp_path / "summary"
    again = summarise_to(out, dest, say=lambda line: None)
    assert again["selection"] == result["selection"] and again["measured_by"]["code"] == result["study"]["code"]
    for name, arm in again["arms"].items():
        for new, old in zip(arm["curve"], result["arms"][name]["curve"]):
            assert {k: new[k] for k in ("gold", "d", "truncations")} == {
                k: old[k] for k in ("gold", "d", "truncations")
            }
    endings_by_hand(out, again)
    assert (dest / "report.html").is_file()
    with pytest.raises(FileExistsError, match="new folder"):
        summarise_to(out, dest, say=lambda line: None)
    # One stored measurement given an answer with each token fault: the summary counts each on
    # its own, in the curve and on the page.
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    path = copy / "seed-0" / "arms" / "spec-default" / "validation" / "iter-0004.json"
    m = json.loads(path.read_text())
    for row, fault in zip(m["rows"], FAULTS):
        row["finish_reason"] = fault
    m["truncations"] = sum(r["finish_reason"] != "eos" for r in m["rows"])  # as the measurement counts them
    path.write_text(json.dumps(m))
    faulted = summarise_to(copy, tmp_path / "faulted", say=lambda line: None)
    endings_by_hand(copy, faulted)
    last = faulted["arms"]["spec-default"]["curve"][-1]
    assert last["iteration"] == 4 and all(last[f]["mean"] >= 0.5 for f in FAULTS)
    frontier_page_shows(tmp_path / "faulted" / "report.html", faulted)
    path.unlink()
    with pytest.raises(StudyError, match="not finished.*seed-0/spec-default"):
        summarise_to(copy, tmp_path / "other", say=lambda line: None)


def endings_by_hand(study: Path, result: dict) -> None:
    """Every curve point's cut_at_limit and each token fault are the mean over seeds of the
    seed's stored rows of that reason, counted here, and add up to the point's truncations (every
    answer whose finish reason is not eos)."""
    folders = [study / s["folder"] for s in result["seeds"]]
    for name, arm in result["arms"].items():
        for point in arm["curve"]:
            counts = []
            for f in folders:
                it = point["iteration"]
                m = json.loads(
                    (f / "frontier" / "sft.json").read_text()
                    if it == 0
                    else (f / "arms" / name / "validation" / f"iter-{it:04d}.json").read_text()
                )
                m = m["iteration_0"] if it == 0 else m
                counts.append(reason_counts(m["rows"]))
                assert m["truncations"] == len(m["rows"]) - counts[-1]["eos"]
            for key, reason in (("cut_at_limit", "length"), *((f, f) for f in FAULTS)):
                mean = sum(c[reason] for c in counts) / len(counts)
                assert point[key]["mean"] == pytest.approx(mean, abs=1e-12), (name, it, key)
            endings = point["cut_at_limit"]["mean"] + sum(point[f]["mean"] for f in FAULTS)
            assert endings == pytest.approx(point["truncations"]["mean"], abs=1e-9)
            assert "undecodable" not in point


# ------------------------------------------------------------------------------ over-optimisation warnings


def test_warning_rules_are_chosen_on_one_study_frozen_and_scored_on_another(small_frontier, tmp_path):
    """Rules chosen on study A (window 1: the small study has 4 iterations) are frozen into a file
    with A's identity; scored on A they are in-sample, on study B out of sample, and B's data
    never enters the rules: changing B's histories changes B's scores, not the thresholds."""
    from rlhf.io import read_json, write_json
    from rlhf.studies.warnings import choose_rules, score_rules, study_runs

    out, result = small_frontier
    a = tmp_path / "a"
    shutil.copytree(out, a)
    b = tmp_path / "b"
    shutil.copytree(out, b)
    ident_b = {**read_json(b / "study.json")["identity"], "study_seed": 9}  # another study
    # B's histories cannot be read while A's rules are chosen.
    for h in b.glob("seed-*/arms/*/ppo/history.json"):
        h.rename(h.with_suffix(".hidden"))
    rules_file = tmp_path / "rules.json"
    frozen = choose_rules(a, rules_file, window=1, say=lambda line: None)
    assert frozen["chosen_on"]["study"]["revision"] == "r002" and frozen["window"] == 1
    with pytest.raises(FileExistsError):
        choose_rules(a, rules_file, window=1, say=lambda line: None)  # frozen: never overwritten
    for h in b.glob("seed-*/arms/*/ppo/history.hidden"):
        h.rename(h.with_suffix(".json"))
    folders_a = [a / s["folder"] for s in result["seeds"]]
    scored_a = score_rules(rules_file, folders_a, result["seeds"], read_json(a / "study.json")["identity"])
    assert scored_a["in_sample"] is True and scored_a["status"] == "scored"
    runs = study_runs(folders_a, result["seeds"], window=1)
    assert len(runs) == 2 * len(result["arms"])
    for sc, r in zip(scored_a["scores"], [r for r in frozen["rules"] if r["threshold"] is not None]):
        assert (sc["signal"], sc["threshold"], sc["patience"]) == (r["signal"], r["threshold"], r["patience"])
        defined = [run for run in runs if any(v is not None for v in run["series"][sc["signal"]])]
        assert sc["fell"] + sc["held"] == len(defined) and len(sc["runs"]) == len(defined)
        assert sc["early"] + sc["late"] + sc["misses"] == sc["fell"]
    # B: its histories' entropies changed; the rules are the frozen ones, its scores its own.
    for h in b.glob("seed-*/arms/*/ppo/history.json"):
        history = read_json(h)
        for it in history["iterations"]:
            it["entropy"] = 0.0
        h.unlink()
        write_json(h, history)
    folders_b = [b / s["folder"] for s in result["seeds"]]
    scored_b = score_rules(rules_file, folders_b, result["seeds"], ident_b)
    assert scored_b["in_sample"] is False
    assert [(s["threshold"], s["patience"]) for s in scored_b["scores"]] == [
        (s["threshold"], s["patience"]) for s in scored_a["scores"]
    ]
    entropy_b = next(s for s in scored_b["scores"] if s["signal"] == "entropy_drop")
    assert all(r["fired_at"] is None or r["fired_at"] >= 0 for r in entropy_b["runs"])


def test_the_summary_scores_the_committed_rules_and_the_page_shows_them(small_frontier):
    from rlhf.signals import RULES_FILE

    out, result = small_frontier
    warn = result["warnings"]
    if not RULES_FILE.is_file():
        assert warn["status"].startswith("no frozen warning rules")
        return
    assert warn["status"] == "scored" and warn["rules_file"] == RULES_FILE.name
    assert warn["in_sample"] is False  # chosen on the full r002 study, not on this small one
    page = (out / "report.html").read_text()
    assert "Over-optimisation warnings" in page


def test_a_study_extended_by_grid_arms_keeps_what_it_measured_and_runs_only_the_new(small_frontier, tmp_path):
    """Adding grid values to a finished study (rlhf frontier --grid ...): its arms' measurements
    are kept byte for byte, only the new arm runs (and the arms at the grid's best c again, moved
    aside first, if the best c moved), the old summary is moved aside, study.json records what it extended."""
    from conftest import small_frontier_settings
    from rlhf.io import read_json
    from rlhf.studies.frontier.arms import Arm, Settings
    from rlhf.studies.frontier.study import run_frontier

    out, result = small_frontier
    study = tmp_path / "study"
    shutil.copytree(out, study)
    before = {p: p.read_bytes() for p in study.glob("seed-*/arms/*/validation/*.json")}
    old = small_frontier_settings()
    arms = (*old.arms[:2], Arm("c1", "judge", c=1.0), *old.arms[2:])
    settings = Settings(arms=arms, bon_ns=old.bon_ns, kl_samples=old.kl_samples)
    said: list[str] = []
    again = run_frontier(
        study, n=2, revision="r002", sft_budget="full", workers=1,
        profile_name=str(out.parent / "embedded-frontier-small.toml"), settings=settings, say=said.append,
    )  # fmt: skip
    assert "c1" in again["arms"] and set(result["arms"]) < set(again["arms"])
    moved = again["grid_choice"]["c"] != result["grid_choice"]["c"]
    for path, data in before.items():
        if "ensemble-min-cbest" in str(path) and moved:
            continue
        assert path.read_bytes() == data, path  # measured once, kept
    record = read_json(study / "study.json")
    assert record["identity"] == again["study"] and record["extended_from"] == [result["study"]]
    assert (study / "frontier-before-extension-1.json").is_file()
    assert any("extended by the arms c1" in line for line in said)
    for s in again["seeds"]:
        stale = list((study / s["folder"] / "arms").glob("ensemble-min-cbest@c*"))
        assert len(stale) == (1 if moved else 0)
        profile = load_profile(str(study / s["folder"] / "arms" / "ensemble-min-cbest" / "profile.toml"))
        assert profile.ppo.kl_coef == again["grid_choice"]["c"] * s["sigma_validation"]
    # Changing an arm, not adding one, is still refused.
    changed = Settings(arms=(old.arms[0], Arm("c0.05", "judge", c=0.07), *old.arms[2:]))
    (study / "frontier.json").unlink()
    from rlhf.studies import StudyError

    with pytest.raises(StudyError, match="refusing to continue"):
        run_frontier(
            study, n=2, revision="r002", sft_budget="full", workers=1,
            profile_name=str(out.parent / "embedded-frontier-small.toml"), settings=changed, say=lambda line: None,
        )  # fmt: skip


def test_the_stopping_rule_is_the_best_rule_of_the_study_the_rules_were_chosen_on():
    """The confirmation's stop signal is not picked by hand: recomputed from the committed r002
    study's in-sample scores (the study the frozen rules were chosen on), by the declared
    criterion, written out here (most early warnings; ties: fewer false alarms)."""
    from rlhf import signals
    from rlhf.io import sha256_file
    from rlhf.studies.frontier.confirmation import STOP_SIGNAL
    from rlhf.studies.warnings import best_rule

    scored = json.loads((ROOT / "results" / "frontier-r002" / "frontier.json").read_text())["warnings"]
    assert scored["in_sample"] is True and scored["rules_sha256"] == sha256_file(signals.RULES_FILE)
    top = max(s["early"] for s in scored["scores"])
    (by_hand,) = [
        s["signal"]
        for s in scored["scores"]
        if s["early"] == top
        and s["false_alarms"] == min(t["false_alarms"] for t in scored["scores"] if t["early"] == top)
    ]
    assert best_rule(scored) == by_hand == STOP_SIGNAL
    # the rule the lab then applies is that signal's frozen rule
    rules, _ = signals.frozen_rules()
    assert [r.signal for r in rules].count(STOP_SIGNAL) == 1
    tied = {
        **scored,
        "scores": [{**s, "early": 5, "false_alarms": 9 if s["signal"] == "kl" else 3} for s in scored["scores"]],
    }
    assert best_rule(tied) == signals.SIGNALS[1]  # the first in SIGNALS' order among the fewest false alarms


def test_curves_and_the_choice_recomputed_from_each_seeds_stored_rows(small_frontier):
    """Every curve point is the mean over seeds of each seed's measurement, each measurement's gold
    and proxy the mean of its stored rows; the choice is the best mean validation gold by the
    written rule (oracle excluded, iteration >= 1; ties: smaller mean d, earlier arm, earlier
    iteration), all recomputed here from the files, not by the module's functions."""
    out, result = small_frontier
    folders = [out / s["folder"] for s in result["seeds"]]
    sft_gold = []
    for f in folders:
        it0 = json.loads((f / "frontier" / "sft.json").read_text())["iteration_0"]
        assert it0["gold"] == sum(r["rubric_success"] for r in it0["rows"]) / len(it0["rows"])
        sft_gold.append(it0["gold"])
    assert result["sft_level"]["mean"] == pytest.approx(sum(sft_gold) / len(sft_gold), abs=1e-12)
    candidates = []
    for k, (name, arm) in enumerate(result["arms"].items()):
        for row in arm["curve"][1:]:
            golds, ds, gains = [], [], []
            for f, g0 in zip(folders, sft_gold):
                m = json.loads((f / "arms" / name / "validation" / f"iter-{row['iteration']:04d}.json").read_text())
                rows = m["rows"]
                assert m["gold"] == sum(r["rubric_success"] for r in rows) / len(rows)
                assert m["proxy"] == pytest.approx(sum(r["learned_reward"] for r in rows) / len(rows), abs=1e-9)
                golds.append(m["gold"])
                ds.append(m["d"])
                gains.append(m["gold"] - g0)
            assert row["gold"]["mean"] == pytest.approx(sum(golds) / len(golds), abs=1e-12)
            assert row["d"]["mean"] == pytest.approx(sum(ds) / len(ds), abs=1e-12)
            assert row["gain"]["mean"] == pytest.approx(sum(gains) / len(gains), abs=1e-12)
            if arm["design"] != "oracle":
                candidates.append((-sum(golds) / len(golds), sum(ds) / len(ds), k, row["iteration"], name))
    best = sorted(candidates)[0]
    sel = result["selection"]
    assert (sel["arm"], sel["iteration"]) == (best[4], best[3])
    assert sel["mean_validation_gold"] == pytest.approx(-best[0], abs=1e-12)
    assert sel["above_sft"] == (sel["mean_validation_gold"] > result["sft_level"]["mean"])


def test_best_of_n_recomputed_from_each_seeds_stored_samples(small_frontier):
    """Best-of-n keeps, per prompt, the judge's highest-scored of the first n samples (the first on
    a tie); its gold and proxy are the means of the kept samples' success and score; the proxy on
    the judge's own scale is (proxy - mean) / SD of that seed's SFT samples; the across-seed row
    is their mean. Recomputed from the stored per-prompt samples."""
    out, result = small_frontier
    per_seed = {n: [] for n in (1, 2)}
    for s in result["seeds"]:
        sft = json.loads((out / s["folder"] / "frontier" / "sft.json").read_text())
        bon = sft["best_of_n"]
        scores, successes = bon["scores"], bon["successes"]
        for point in bon["points"]:
            n = point["n"]
            kept = []
            for prompt_scores in scores:
                top = prompt_scores[0]
                j = 0
                for i in range(1, n):
                    if prompt_scores[i] > top:
                        top, j = prompt_scores[i], i
                kept.append(j)
            gold = sum(successes[p][j] for p, j in enumerate(kept)) / len(kept)
            proxy = sum(scores[p][j] for p, j in enumerate(kept)) / len(kept)
            assert point["gold"] == pytest.approx(gold, abs=1e-12)
            assert point["proxy"] == pytest.approx(proxy, abs=1e-9)
            assert point["kl_bound"] == pytest.approx(math.log(n) - (n - 1) / n, abs=1e-15)
            spread = sft["spread"]["validation"]
            per_seed[n].append((gold, (proxy - spread["mean"]) / spread["sd"]))
        # sigma: the sample SD of the judge's scores of each prompt's first temperature-1 SFT sample
        first = [prompt_scores[0] for prompt_scores in scores]
        mean = sum(first) / len(first)
        sd = math.sqrt(sum((x - mean) ** 2 for x in first) / (len(first) - 1))
        assert bon["spread"]["mean"] == pytest.approx(mean, abs=1e-9) and bon["spread"]["sd"] == pytest.approx(
            sd, rel=1e-9
        )
        assert s["sigma_validation"] == sft["spread"]["validation"]["sd"] == pytest.approx(sd, rel=1e-9)
    for point in result["best_of_n"]["points"]:
        golds = [g for g, _ in per_seed[point["n"]]]
        stds = [p for _, p in per_seed[point["n"]]]
        assert point["gold"]["mean"] == pytest.approx(sum(golds) / len(golds), abs=1e-12)
        assert point["proxy_std"]["mean"] == pytest.approx(sum(stds) / len(stds), abs=1e-9)


def _favourite(scores: list[float], n: int) -> int:
    """The first of the highest among the first n (written out, not rlhf's best_of)."""
    top, j = scores[0], 0
    for i in range(1, n):
        if scores[i] > top:
            top, j = scores[i], i
    return j


def test_best_of_n_under_the_ensemble_recomputed_from_each_members_scores(small_frontier):
    """Best-of-n ranked by an ensemble reward: the same draws as under the judge (member 0's scores
    are the judge's best-of-n scores), the reward per sample the members' minimum, their mean, and
    mean - lambda * SD (divisor k) recomputed from each member's stored score, the favourite of the
    first n by that reward, its gold from the stored successes; across seeds the mean, and the
    change of gold from n = 1 to the largest n per seed."""
    out, result = small_frontier
    e = result["best_of_n_ensemble"]
    assert set(e["designs"]) == {"ensemble-mean", "ensemble-min", "ensemble-uncertainty"}
    assert e["ensemble_size"] == 2 and e["members"] == ["judge", "judge-1"]  # the ensemble arm's k
    changes: dict[str, list[float]] = {d: [] for d in e["designs"]}
    golds: dict[tuple[str, int], list[float]] = {}
    for s in result["seeds"]:
        bon = json.loads((out / s["folder"] / "frontier" / "sft.json").read_text())["best_of_n"]
        rec = json.loads((out / s["folder"] / "frontier" / "best-of-n-ensemble.json").read_text())
        members = rec["member_scores"]  # [k][n][P]
        assert [[members[0][j][p] for j in range(len(members[0]))] for p in range(len(bon["scores"]))] == bon["scores"]
        assert rec["successes"] == bon["successes"]
        assert members[1] != members[0]  # another judge, not a copy
        lam = rec["ensemble_lambda"]
        for design, got in rec["designs"].items():
            for j in range(len(members[0])):
                for p in range(len(bon["scores"])):
                    xs = [m[j][p] for m in members]
                    mean = sum(xs) / len(xs)
                    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
                    want = {"ensemble-min": min(xs), "ensemble-mean": mean, "ensemble-uncertainty": mean - lam * sd}
                    assert got["rewards"][j][p] == pytest.approx(want[design], abs=1e-5), (design, j, p)
            rewards = [[got["rewards"][j][p] for j in range(len(members[0]))] for p in range(len(bon["scores"]))]
            for point in got["points"]:
                kept = [_favourite(r, point["n"]) for r in rewards]
                gold = sum(bon["successes"][p][j] for p, j in enumerate(kept)) / len(kept)
                assert point["gold"] == pytest.approx(gold, abs=1e-12), (design, point["n"])
                assert point["proxy"] == pytest.approx(sum(r[j] for r, j in zip(rewards, kept)) / len(kept), abs=1e-9)
                golds.setdefault((design, point["n"]), []).append(gold)
            changes[design].append(got["points"][-1]["gold"] - got["points"][0]["gold"])
        assert s["best_of_n_ensemble"] == {d: v["points"] for d, v in rec["designs"].items()}
    for design, summary in e["designs"].items():
        for point in summary["points"]:
            values = golds[(design, point["n"])]
            assert point["gold"]["mean"] == pytest.approx(sum(values) / len(values), abs=1e-12)
        assert summary["gold_change"]["mean"] == pytest.approx(sum(changes[design]) / len(changes[design]), abs=1e-12)
    judge = [s["best_of_n"][-1]["gold"] - s["best_of_n"][0]["gold"] for s in result["seeds"]]
    assert e["judge_gold_change"]["mean"] == pytest.approx(sum(judge) / len(judge), abs=1e-12)


def test_an_ensemble_best_of_n_of_other_draws_is_refused(small_frontier, tmp_path):
    """The ensemble's best-of-n must rank the judge's best-of-n draws: when the stored judge scores
    are not those of its draws (other samples), it refuses and writes nothing."""
    from rlhf.studies import StudyError
    from rlhf.studies.frontier.arms import settings_of
    from rlhf.studies.frontier.measure import ensemble_best_of_n

    out, result = small_frontier
    seed_dir = tmp_path / "seed-0"
    shutil.copytree(out / "seed-0", seed_dir)
    (seed_dir / "frontier" / "best-of-n-ensemble.json").unlink()
    shutil.rmtree(seed_dir / "best-of-n-ensemble")
    sft = json.loads((seed_dir / "frontier" / "sft.json").read_text())
    sft["best_of_n"]["scores"][0][1] += 1.0
    (seed_dir / "frontier" / "sft.json").write_text(json.dumps(sft))
    settings = settings_of(json.loads((out / "study.json").read_text())["identity"])
    with pytest.raises(StudyError, match="not the same samples"):
        ensemble_best_of_n(seed_dir, "r002", settings, log=False)
    assert not (seed_dir / "frontier" / "best-of-n-ensemble.json").exists()


def test_a_study_made_before_the_ensembles_best_of_n_gains_it_by_extension_only():
    """An identity without `bon_ensembles` (a study made before) is extended by that measurement
    alone; with any other setting changed too it is not an extension; a study that has it gains
    nothing."""
    from rlhf.studies.frontier.arms import Settings, settings_of
    from rlhf.studies.frontier.study import added_arms

    new = {"format": 1, "code": "b", "settings": Settings().record()}
    old = {**new, "code": "a", "settings": {k: v for k, v in new["settings"].items() if k != "bon_ensembles"}}
    assert added_arms(old, new) == ["best-of-n under the ensembles"]
    assert settings_of(old).bon_ensembles == ()
    assert added_arms(new, new) == []
    other = {**new, "settings": {**new["settings"], "kl_samples_per_prompt": 3}}
    assert added_arms(old, other) is None


def test_sign_counts_positive_seeds_and_the_sign_test_by_hand():
    stats = across_seeds([0.1, -0.2, 0.0, 0.3, 0.05, 0.0])
    assert (stats["positive"], stats["negative"], stats["zero"]) == (3, 1, 2)  # zeros are neither
    # two-sided exact sign test on the 4 non-zero seeds, 3 vs 1: 2 * P(X <= 1), X ~ Binomial(4, 1/2)
    assert stats["sign_test_p"] == pytest.approx(2 * (1 + 4) / 16)
    assert across_seeds([0.2, 0.1, 0.3, 0.4, 0.5])["sign_test_p"] == pytest.approx(2 / 32)
    assert across_seeds([0.0, 0.0])["sign_test_p"] == 1.0  # no non-zero seed: no evidence either way


# ------------------------------------------------------------------- numbers read back from the pages


class _Tables(html.parser.HTMLParser):
    """Every <table> of a page as (section heading, header cells, rows of cell texts)."""

    def __init__(self):
        super().__init__()
        self.tables: list[tuple[str, list[str], list[list[str]]]] = []
        self.heading, self.in_h2 = "", False
        self.row: list[str] | None = None
        self.cell: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "h2":
            self.in_h2, self.heading = True, ""
        elif tag == "table":
            self.tables.append((self.heading, [], []))
        elif tag == "tr":
            self.row = []
        elif tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag == "h2":
            self.in_h2 = False
        elif tag in ("td", "th") and self.row is not None and self.cell is not None:
            self.row.append(self.cell.strip())
            self.cell = None
        elif tag == "tr" and self.row is not None:
            _, head, rows = self.tables[-1]
            if head:
                rows.append(self.row)
            else:
                head.extend(self.row)
            self.row = None

    def handle_data(self, data):
        if self.in_h2:
            self.heading += data
        if self.cell is not None:
            self.cell += data


def page_tables(path) -> list[tuple[str, list[str], list[list[str]]]]:
    parser = _Tables()
    parser.feed(Path(path).read_text())
    return parser.tables


NUMBER = re.compile(r"[+\-−]?\d+(?:\.\d+)?(?:e[+\-]\d+)?")


def shown(cell: str, *values) -> None:
    """The cell shows exactly these numbers, in order, each to the page's rounding: a value is
    (number, digits shown) or a number shown to 3 digits; scientific notation to 3 significant
    digits; None is shown as a dash."""
    pairs = [value if isinstance(value, tuple) else (value, 3) for value in values]
    assert cell.count("—") == sum(v is None for v, _ in pairs), f"{cell!r}: a missing value is shown as —"
    pairs = [(v, d) for v, d in pairs if v is not None]
    got = NUMBER.findall(cell)
    assert len(got) == len(pairs), f"{cell!r} shows {got}, not {values}"
    for text, (v, digits) in zip(got, pairs):
        g = float(text.replace("−", "-"))
        tolerance = 0.005 * abs(v) if "e" in text else 0.5 * 10**-digits
        assert abs(g - v) <= tolerance + 1e-12, f"{cell!r}: {text} is not {v}"


def bon_ensemble_shows(ens_rows: list[list[str]], result: dict) -> None:
    """The best-of-n-under-the-ensemble table: gold per n and ranking, then the change n = 1 -> max."""
    e = result["best_of_n_ensemble"]
    assert len(ens_rows) == len(result["best_of_n"]["points"]) + 1
    designs = list(e["designs"])
    for row, p in zip(ens_rows, result["best_of_n"]["points"]):
        shown(row[0], (p["n"], 0))
        shown(row[1], p["gold"]["mean"], p["gold"]["sd"])
        for cell, d in zip(row[2:], designs, strict=True):
            g = e["designs"][d]["points"][result["best_of_n"]["points"].index(p)]["gold"]
            shown(cell, g["mean"], g["sd"])
    last = ens_rows[-1]
    shown(last[0], (e["ns"][0], 0), (e["ns"][-1], 0))
    for cell, c in zip(
        last[1:], [e["judge_gold_change"], *(e["designs"][d]["gold_change"] for d in designs)], strict=True
    ):
        interval = c["t95_unclipped"] if c.get("clipped") else []
        shown(cell, c["mean"], *c["t95"], *interval, (c["positive"], 0), (c["negative"], 0), (c["n"], 0))


# The arm table's ending columns, in the page's order, and their labels: each token fault on its
# own; a summary that counted the faults as one kind holds `undecodable` instead.
ENDING_COLUMNS = {
    "cut_at_limit": "cut at the limit",
    **{f: f for f in FAULTS},
    "undecodable": "undecodable",
    "repeats_polite_closing": "closing repeated",
}


def frontier_page_shows(page: Path, result: dict) -> dict:
    """Every number of a frontier page read back equals the study's JSON; returns its tables."""
    parsed = page_tables(page)
    tables = {head[0]: rows for _, head, rows in parsed}
    (arm_head,) = [head for _, head, _ in parsed if head[0] == "arm"]
    point = next(iter(result["arms"].values()))["curve"][-1]
    endings = [k for k in ENDING_COLUMNS if k in point]
    assert ("undecodable" in point) != all(f in point for f in FAULTS)  # one kind, or each fault its own
    assert arm_head[7] == " / ".join(ENDING_COLUMNS[k] for k in endings) + " (of the answers)"
    arm_rows = {r[0].split(" (")[0]: r for r in tables["arm"]}
    assert sorted(arm_rows) == sorted(result["arms"]) and len(tables["arm"]) == len(result["arms"])
    for name, arm in result["arms"].items():
        row = arm_rows[name]
        best, last = arm["best"], arm["curve"][-1]
        shown(row[1], *arm["kl_coef_per_seed"])
        shown(row[2], best["gold"], (best["iteration"], 0), (best["d"], 2))
        share = best["share_of_oracle_gain"]
        shown(row[3], best["gain"], *([] if share is None else [(100 * share, 0)]))
        shown(row[4], last["gold"]["mean"], last["gold"]["sd"])
        shown(row[5], (last["d"]["mean"], 2))
        shown(row[6], (last["proxy_std"]["mean"], 2))
        shown(row[7], *((last[k]["mean"], 1) for k in endings))
        shown(row[8], (last["uncertified"]["mean"], 1))
    for row, p in zip(tables["n"], result["best_of_n"]["points"], strict=True):
        shown(row[0], (p["n"], 0))
        shown(row[1], p["kl_bound"])
        shown(row[2], p["d_bound"])
        shown(row[3], p["gold"]["mean"], p["gold"]["sd"])
        shown(row[4], (p["proxy_std"]["mean"], 2))
        shown(row[5], (p["truncations"]["mean"], 1))
    bon_ensemble_shows(tables["best of n"], result)
    for row, s in zip(tables["seed"], result["seeds"], strict=True):
        shown(row[0], (s["seed"], 0))
        shown(row[1], (s["sigma_validation"], 2))
        shown(row[2], (s["mean_validation"], 2))
        shown(row[3], (s["train_spread"]["mean"], 2), (s["train_spread"]["sd"], 2))
        shown(row[4], s["sft"]["gold"])
    fits = {**{n: a["fit"] for n, a in result["arms"].items()}, "best-of-n": result["best_of_n"]["fit"]}
    assert sorted(r[0] for r in tables["curve"]) == sorted(fits)
    for row in tables["curve"]:
        fit = fits[row[0]]
        if "alpha" in fit:
            shown(row[1], fit["alpha"])
            shown(row[2], fit["beta"])
            shown(row[3], (fit["d_star"], 2))
            shown(row[4], (fit["r2"], 2))
            shown(row[5], fit["rms_residual"])
    for row, sc in zip(tables["signal"], result["warnings"]["scores"], strict=True):
        assert row[0] == sc["signal"]
        shown(row[2], (sc["fell"], 0))
        shown(row[3], (sc["early"], 0))
        if sc["median_lead"] is not None:
            shown(row[4], (sc["median_lead"], 1))
        shown(row[5], (sc["late"], 0))
        shown(row[6], (sc["misses"], 0))
        shown(row[7], (sc["false_alarms"], 0), (sc["held"], 0))
    text = page.read_text()
    sel = result["selection"]
    chosen = re.search(r"at iteration <b>(\d+)</b>, mean validation gold ([\d.]+) against SFT's ([\d.]+)", text)
    assert chosen and int(chosen[1]) == sel["iteration"]
    shown(chosen[2], sel["mean_validation_gold"])
    shown(chosen[3], sel["sft_mean_validation_gold"])
    grid = result["grid_choice"]
    best_c = re.search(r"c = ([\d.]+) \(([^,]+), mean validation gold ([\d.]+) at iteration (\d+)\)", text)
    assert best_c and (float(best_c[1]), best_c[2], int(best_c[4])) == (grid["c"], grid["arm"], grid["iteration"])
    shown(best_c[3], grid["mean_validation_gold"])
    return tables


@pytest.mark.parametrize("revision", ["r001", "r002"])
def test_every_number_of_the_committed_frontier_pages_is_their_studys(revision, tmp_path):
    """The committed page, and the page this code renders from the committed JSON, read back
    number by number."""
    from rlhf.report.frontier import render_frontier_html

    folder = ROOT / "results" / f"frontier-{revision}"
    result = json.loads((folder / "frontier.json").read_text())
    frontier_page_shows(folder / "report.html", result)
    (page := tmp_path / "report.html").write_text(render_frontier_html(result, None))
    frontier_page_shows(page, result)


def test_every_number_of_the_frontier_page_is_the_studys(small_frontier, tmp_path):
    out, result = small_frontier
    frontier_page_shows(out / "report.html", result)
    # The small study's refreshes may label no pair (accuracies None): the refresh table is also
    # read back from the page rendered with every column distinct, so a swapped column shows.
    from rlhf.report.frontier import render_frontier_html

    distinct = {"after_iteration": 5, "successes": 3.5, "answers": 64, "new_pairs": 7.5, "seeds_with_pairs": 2}
    distinct.update(accuracy_before=0.25, accuracy_after=0.875)
    variant = json.loads(json.dumps(result))
    variant["arms"]["iterated-judge"]["refreshes"] = [distinct, *result["arms"]["iterated-judge"]["refreshes"]]
    # Every ending column of the arm table distinct and not 0 (the small study's answers hold no
    # token fault), so a fault left out or two columns swapped show.
    for k, arm in enumerate(variant["arms"].values()):
        for j, key in enumerate(("cut_at_limit", *FAULTS, "repeats_polite_closing")):
            arm["curve"][-1][key] = {**arm["curve"][-1][key], "mean": 10.0 * (k + 1) + j + 0.5}
    (tmp := tmp_path / "variant-report.html").write_text(render_frontier_html(variant, None))
    frontier_page_shows(tmp, variant)
    (refresh_rows,) = [rows for _, head, rows in page_tables(tmp) if head[0] == "after iteration"]
    for row, r in zip(refresh_rows, variant["arms"]["iterated-judge"]["refreshes"], strict=True):
        shown(row[0], (r["after_iteration"], 0))
        shown(row[1], (r["successes"], 1), (r["answers"], 0))
        shown(row[2], (r["new_pairs"], 1))
        shown(row[3], (r["seeds_with_pairs"], 0))
        shown(row[4], r["accuracy_before"])
        shown(row[5], r["accuracy_after"])
    # The same for best-of-n under the ensemble (on the small study its rankings may pick alike).
    for k, design in enumerate(variant["best_of_n_ensemble"]["designs"].values()):
        for j, p in enumerate(design["points"]):
            p["gold"] = {**p["gold"], "mean": 0.1 * (k + 1) + 0.01 * j, "sd": 0.001 * (k + 1)}
        design["gold_change"] = {**design["gold_change"], "mean": -0.1 * (k + 1)}
    tmp.unlink()
    tmp.write_text(render_frontier_html(variant, None))
    (ens_rows,) = [rows for _, head, rows in page_tables(tmp) if head[0] == "best of n"]
    bon_ensemble_shows(ens_rows, variant)


def confirmation_page_shows(page, record: dict) -> None:
    """Every number of confirmation.html read back equals the confirmation's JSON: per point, PPO -
    SFT on each population, its mean, SD, interval (and the interval before the cut, where cut)
    and the count of positive seeds."""
    tables = [t for t in page_tables(page) if t[0] != "Over-optimisation warnings on these seeds"]
    assert len(tables) == len(record["points"])
    pops = ("test", "all_unique_contexts", "probe_contexts")  # the page's order
    for (heading, _, rows), point in zip(tables, record["points"], strict=True):
        assert heading.startswith(point["arm"] + " ")
        keys = [f"{q}.{pop}.ppo_minus_sft" for q in ("rubric_success", "learned_reward_std") for pop in pops]
        for row, key in zip(rows, keys, strict=True):
            st = point["across"][key]
            shown(row[1], st["mean"])
            shown(row[2], st["sd"])
            cut = list(st["t95_unclipped"]) if st.get("clipped") else []
            shown(row[3], *st["t95"], *cut)
            shown(row[4], (st["positive"], 0), (st["n"], 0))
