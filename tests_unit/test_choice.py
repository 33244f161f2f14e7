"""The design chosen on some seeds and estimated on others (rlhf.studies.choice): the rule over
the declared points only, its tie-breaks, the naive and honest estimates recomputed by hand from
per-seed numbers, and the declaration's refusals."""

import math

import pytest

from rlhf.studies import StudyError, choice
from rlhf.studies.frontier.arms import default_arms
from rlhf.studies.statistics import t975

pytestmark = pytest.mark.unit


def frontier(per_arm: dict[str, dict[int, list[float]]], sft: list[float], d: float = 1.0) -> dict:
    """A frontier.json of per-seed validation gold: per_arm[arm][iteration] = gold per seed."""
    n = len(sft)
    seeds = [{"arms": {}} for _ in range(n)]
    arms = {}
    for name, by_it in per_arm.items():
        curve = []
        for it, golds in sorted(by_it.items()):
            curve.append({"iteration": it, "gold": {"mean": sum(golds) / n}, "d": {"mean": d * it}})
        arms[name] = {"curve": curve}
        for i in range(n):
            seeds[i]["arms"][name] = {
                "points": [{"iteration": it, "gold": g[i], "gain": g[i] - sft[i]} for it, g in sorted(by_it.items())]
            }
    return {"arms": arms, "seeds": seeds}


def flat(gold, its=(10, 30, 60, 100), n=3):
    return {it: [gold] * n for it in its}


SFT = [0.5, 0.6, 0.7]


def test_the_choice_is_the_best_declared_point_never_an_undeclared_one():
    per_arm = {name: flat(0.55) for name in choice.CANDIDATES}
    per_arm["iterated-judge"][60] = [0.8, 0.7, 0.9]  # the best declared point
    per_arm["standardised-judge"][10] = [1.0, 1.0, 1.0]  # better, but iteration 10 was not declared
    per_arm["oracle"] = flat(1.0)  # a control: never a candidate
    got = choice.choose_point(frontier(per_arm, SFT))
    assert (got["arm"], got["iteration"], got["points_compared"]) == ("iterated-judge", 60, 12)
    gains = [0.3, 0.1, 0.2]
    assert got["naive_gain"]["per_seed"] == pytest.approx(gains) and got["naive_gain"]["mean"] == pytest.approx(0.2)
    half = t975(2) * 0.1 / math.sqrt(3)
    assert got["naive_gain"]["t95"] == pytest.approx([0.2 - half, min(1.0, 0.2 + half)])


def test_ties_go_to_the_smaller_d_then_the_earlier_candidate_and_checkpoint():
    per_arm = {name: flat(0.6) for name in choice.CANDIDATES}
    got = choice.choose_point(frontier(per_arm, SFT))
    assert (got["arm"], got["iteration"]) == ("spec-default", 30)  # d grows with the iteration here
    same_d = choice.choose_point(frontier(per_arm, SFT, d=0.0))
    assert (same_d["arm"], same_d["iteration"]) == ("spec-default", 30)
    per_arm["eos-less-replaced"][100] = [0.61, 0.61, 0.61]
    assert choice.choose_point(frontier(per_arm, SFT))["arm"] == "eos-less-replaced"


def test_a_missing_declared_point_is_refused():
    per_arm = {name: flat(0.6) for name in choice.CANDIDATES}
    del per_arm["iterated-judge"][30]
    with pytest.raises(StudyError, match="lacks a declared"):
        choice.choose_point(frontier(per_arm, SFT))


def test_the_honest_estimate_pairs_each_fresh_seed_with_its_own_sft_and_default():
    sft = [100 / 180, 90 / 180, 120 / 180, 80 / 180]
    chosen = [110 / 180, 99 / 180, 120 / 180, 95 / 180]
    default = [100 / 180, 100 / 180, 110 / 180, 80 / 180]
    est = frontier({"iterated-judge": {60: chosen, 100: chosen}, "spec-default": {60: sft, 100: default}}, sft)
    got = choice.estimate(est, "iterated-judge", 60)
    c_s = [c - s for c, s in zip(chosen, sft)]  # 10, 9, 0, 15 of 180
    c_d = [c - d for c, d in zip(chosen, default)]  # 10, -1, 10, 15 of 180: the default at its last iteration
    assert got["chosen_minus_sft"]["per_seed"] == pytest.approx(c_s)
    assert got["chosen_minus_default"]["per_seed"] == pytest.approx(c_d)
    assert got["chosen_minus_sft"]["sign_flip_p"] == 4 / 16 and got["chosen_minus_sft"]["seeds_up"] == 3
    # (10, -1, 10, 15): |sum| 34 of 36 is reached by all four signs as observed or the mirror, and by
    # flipping the 1 alone: 4 patterns of 16
    assert got["chosen_minus_default"]["sign_flip_p"] == 4 / 16
    assert got["default_minus_sft"]["mean"] == pytest.approx(sum(d - s for d, s in zip(default, sft)) / 4)


def test_the_declaration_names_the_testbed_recipe_and_the_fresh_seeds_and_refuses_no_testbed():
    stable = {"stable_with_room": True}
    candidates = [
        {"name": "sft-demos12", "sft": stable, "oracle": {"gain": 0.04}},
        {"name": "sft-demos6", "sft": stable, "oracle": {"gain": 0.09}},
        {"name": "unstable", "sft": {"stable_with_room": False}, "oracle": {"gain": 0.5}},
    ]
    record = {"chosen": "sft-demos12", "commit": "abc", "revision": "r002", "profile": "embedded"}
    got = choice.declaration({**record, "candidates": candidates}, "t.json")
    assert got["sft_recipe"] == "sft-demos12" and got["testbed_qualifies"] and got["estimation_study_seed"] == 4
    assert got["candidates"] == list(choice.CANDIDATES) and got["checkpoints"] == [30, 60, 100]
    # none qualified: the nearest stable candidate, said not to qualify, with its gain
    got = choice.declaration({**record, "chosen": None, "candidates": candidates}, "t.json")
    assert got["sft_recipe"] == "sft-demos6" and not got["testbed_qualifies"] and "+0.090" in got["sft_recipe_rule"]
    with pytest.raises(StudyError, match="chose no testbed and has no stable candidate"):
        choice.declaration({**record, "chosen": None, "candidates": candidates[2:]}, "t.json")


def test_the_declared_candidates_are_arms_of_the_frontier_and_its_checkpoints_are_kept():
    from rlhf.config import load_profile
    from rlhf.studies.frontier.runs import measured_iterations

    names = {a.name for a in default_arms()}
    assert set(choice.CANDIDATES) <= names and choice.DEFAULT in choice.CANDIDATES
    assert set(choice.CHECKPOINTS) <= set(measured_iterations(load_profile("embedded")))


def test_the_verdict_is_declared_from_the_choice_the_testbed_and_the_selection_seeds_alone(tmp_path):
    from rlhf.io import write_json
    from rlhf.studies import verdict

    testbed = {"chosen": "sft-demos6", "candidates": [{"name": "sft-demos6", "oracle": {"best_iteration": 70}}]}
    write_json(tmp_path / "testbed.json", testbed)
    oracle_golds = {70: [0.9, 0.8, 1.0], 30: [0.5, 0.5, 0.5]}
    write_json(tmp_path / "selection" / "frontier.json", frontier({"oracle": oracle_golds}, SFT))
    record = {
        "declared": {"testbed": str(tmp_path / "testbed.json"), "sft_recipe": "sft-demos6", "revision": "r002",
                     "profile": "embedded"},
        "chosen": {"arm": "iterated-judge", "iteration": 60},
        "estimate": {"chosen_minus_sft": {"sd": 0.2}, "chosen_minus_default": {"sd": 0.05}},
        "steps": [{"study": str(tmp_path / "selection"), "commit": "c1"}, {"commit": "c2"}],
    }  # fmt: skip
    got = verdict.declaration(record, "choice.json")
    assert got["points"] == {
        "chosen": {"arm": "iterated-judge", "iteration": 60},
        "default": {"arm": "spec-default", "iteration": 100},
        "oracle": {"arm": "oracle", "iteration": 70},
    }
    oracle_sd = math.sqrt(((0.4 - 0.3) ** 2 + (0.2 - 0.3) ** 2 + (0.3 - 0.3) ** 2) / 2)  # gains 0.4, 0.2, 0.3
    per = got["power"]["per_comparison"]
    assert per["oracle_minus_sft"]["validation_sd"] == pytest.approx(0.1) == pytest.approx(oracle_sd)
    assert per["chosen_minus_sft"]["asks"] == 18 == got["power"]["seeds"] and got["study_seed"] == 5
    assert got["choice_commit"] == "c2" and verdict.declared_points(got)["oracle"].key == "oracle@70"
    with pytest.raises(StudyError, match="the SPEC's default itself"):
        verdict.declaration({**record, "chosen": {"arm": "spec-default", "iteration": 100}}, "choice.json")
