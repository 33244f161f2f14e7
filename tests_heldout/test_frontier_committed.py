"""The committed frontier studies (results/frontier-r001, results/frontier-r002) recomputed from
their stored points: each arm's best point, the choice, the controls, best-of-n; and the rules
that guard the choice (no control chosen, settings refused, only the confirmation reads test)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from frontier_checks import committed

from rlhf.studies.statistics import gao_fit

pytestmark = pytest.mark.unit


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
    assert set(modules) == {"__init__", "arms", "methods", "runs", "measure", "selection", "study", "confirmation"}
    assert TEST_READERS.search(modules["confirmation"])  # the check sees a reader where there is one
    for name, text in modules.items():
        if name in ("__init__", "confirmation"):
            continue
        assert not TEST_READERS.search(text), f"rlhf.studies.frontier.{name} reads test prompts"
        assert "frontier.confirmation" not in text and "frontier import confirmation" not in text, name
    body = modules["__init__"].split('"""')[2]  # the package's own code, past its docstring
    assert not body.strip(), "rlhf/studies/frontier/__init__.py holds code: each concern has its module"
