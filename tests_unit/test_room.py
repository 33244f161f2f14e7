"""The oracle's room on test (rlhf.studies.room): the declaration made from the testbed record
alone (checkpoint, per-seed validation gains, the power rule's seed count), its refusal without
a chosen testbed, and the numbers of step 3 recomputed by hand from per-seed test files."""

import math

import pytest

from rlhf.io import write_json
from rlhf.studies import StudyError, heldout, room
from rlhf.studies.frontier import confirmation
from rlhf.studies.frontier.arms import default_arms
from rlhf.studies.statistics import t975

pytestmark = pytest.mark.unit

ORACLE = next(a for a in default_arms() if a.name == "oracle")


def make_testbed(tmp_path, gains_at_40, chosen="sft-demos6"):
    """A testbed record choosing `chosen`, its oracle study's frontier.json committed beside it:
    per seed, the oracle's validation gain at iterations 20 and 40 (the declared best)."""
    seeds = [
        {"arms": {"oracle": {"points": [{"iteration": 0, "gain": 0.0}, {"iteration": 20, "gain": g / 2},
                                         {"iteration": 40, "gain": g}]}}}
        for g in gains_at_40
    ]  # fmt: skip
    write_json(tmp_path / f"oracle-{chosen}" / "frontier.json", {"seeds": seeds})
    record = {
        "chosen": chosen,
        "commit": "abc123",
        "revision": "r002",
        "profile": "embedded",
        "candidates": [
            {"name": "sft-demos12", "sft": {"stable_with_room": False}, "oracle": {"study": "x", "best_iteration": 20}},
            {
                "name": chosen,
                "sft": {"stable_with_room": False},
                "oracle": {"study": "runs/gone", "best_iteration": 40},
            },
        ],
    }
    path = tmp_path / "testbed.json"
    write_json(path, record)
    return record, str(path)


def test_the_declaration_reads_the_chosen_oracle_s_per_seed_gains_and_applies_the_power_rule(tmp_path):
    gains = [0.20, 0.05, 0.35, 0.10, 0.15]
    record, path = make_testbed(tmp_path, gains)
    got = room.declaration(record, path)
    mean = sum(gains) / 5
    sd = math.sqrt(sum((g - mean) ** 2 for g in gains) / 4)  # 0.1173
    n = next(n for n in range(2, 41) if t975(n - 1) * sd / math.sqrt(n) <= 0.10)
    assert got["validation_gain_per_seed"] == gains and got["validation_gain_sd"] == pytest.approx(sd)
    assert got["oracle_iteration"] == 40 and got["sft_recipe"] == "sft-demos6" and got["seeds"] == n == 8
    assert got["study_seed"] == room.ROOM_STUDY_SEED == 3 and not got["power"]["capped"]
    one = got["power"]["per_comparison"]["oracle_minus_sft"]
    assert got["testbed_commit"] == "abc123" and one["expected_half_width"] <= 0.10 and one["asks"] == 8


def test_a_wide_spread_is_capped_and_says_the_half_width_it_can_promise(tmp_path):
    record, path = make_testbed(tmp_path, [0.9, -0.5, 0.8, -0.6, 0.7])
    got = room.declaration(record, path)
    one = got["power"]["per_comparison"]["oracle_minus_sft"]
    assert got["seeds"] == heldout.CAP == 40 and got["power"]["capped"] and one["expected_half_width"] > 0.10


def test_with_no_choice_the_nearest_stable_candidate_is_confirmed_and_said_not_to_qualify(tmp_path):
    record, path = make_testbed(tmp_path, [0.1, 0.2, 0.3])
    record["candidates"][0].update(
        sft={"stable_with_room": True}, oracle={"study": "x", "best_iteration": 20, "gain": 0.05}
    )
    record["candidates"][1]["oracle"]["gain"] = 0.08
    record["candidates"][1]["sft"] = {"stable_with_room": True}
    record["candidates"].append({"name": "unstable", "sft": {"stable_with_room": False}, "oracle": {"gain": 0.5}})
    assert room.declaration(record, path)["testbed_qualifies"]
    got = room.declaration({**record, "chosen": None}, path)
    assert got["sft_recipe"] == "sft-demos6" and not got["testbed_qualifies"] and "+0.080" in got["sft_recipe_rule"]
    assert got["oracle_iteration"] == 40 and got["validation_gain_per_seed"] == [0.1, 0.2, 0.3]
    record["candidates"][1]["sft"]["stable_with_room"] = False
    with pytest.raises(StudyError, match="oracle-sft-demos12/frontier.json"):  # the next nearest is read
        room.declaration({**record, "chosen": None}, path)


def test_no_stable_candidate_or_no_oracle_study_is_refused_naming_what_is_missing(tmp_path):
    record, path = make_testbed(tmp_path, [0.1, 0.2, 0.3])
    with pytest.raises(StudyError, match="chose no testbed and has no stable candidate"):
        room.declaration({**record, "chosen": None}, path)
    (tmp_path / "oracle-sft-demos6" / "frontier.json").unlink()
    with pytest.raises(StudyError, match="oracle-sft-demos6/frontier.json"):
        room.declaration(record, path)


def seed_files(root, sft, oracle):
    """Per seed the test file confirm_seed writes: SFT's and the oracle's test success (of 180)."""
    folders = []
    for i, (s, o) in enumerate(zip(sft, oracle)):
        f = root / f"seed-{i}"
        metrics = {k: {"test": {"rubric_success": v / 180}} for k, v in (("sft", s), ("ppo", o))}
        write_json(confirmation.test_file(f, ORACLE, 40), {"iteration": 40, "metrics": metrics})
        folders.append(f)
    return folders


def test_step_3_is_oracle_minus_sft_on_test_per_seed_with_interval_and_sign_flip_p(tmp_path):
    sft = [90, 100, 80, 120]  # test successes of 180
    oracle = [120, 118, 80, 150]
    folders = seed_files(tmp_path, sft, oracle)
    got = room.summarise(folders, 40)
    diffs = [(o - s) / 180 for s, o in zip(sft, oracle)]  # 30, 18, 0, 30 of 180
    mean = sum(diffs) / 4
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 3)
    d = got["oracle_minus_sft"]
    assert [r["oracle_minus_sft"] for r in got["per_seed"]] == pytest.approx(diffs)
    assert d["mean"] == pytest.approx(mean) and d["t95"][0] == pytest.approx(mean - t975(3) * sd / 2)
    # sign patterns of (30, 18, 0, 30) with |sum| >= 78: all four nonzero the same way, the zero either way
    assert d["sign_flip_p"] == 4 / 16 and d["seeds_up"] == 3
    assert d["t95"][0] < 0 and got["room_shown"] is False  # three of four up, yet not shown: the interval holds 0
    shown = room.summarise(seed_files(tmp_path / "b", sft, [120, 118, 100, 150]), 40)
    assert shown["oracle_minus_sft"]["t95"][0] > 0 and shown["room_shown"] is True
    assert shown["sft"]["mean"] == pytest.approx(sum(sft) / 4 / 180)


def test_the_study_runs_the_largest_seed_count_any_declared_comparison_asks_for():
    got = heldout.power({"chosen_minus_sft": 0.2, "chosen_minus_default": 0.05, "oracle_minus_sft": 0.1})
    asks = {k: v["asks"] for k, v in got["per_comparison"].items()}
    assert got["seeds"] == 18 == max(asks.values()) and asks["chosen_minus_default"] < asks["oracle_minus_sft"] < 18
    for name, sd in (("chosen_minus_default", 0.05), ("chosen_minus_sft", 0.2)):
        assert got["per_comparison"][name]["expected_half_width"] == pytest.approx(t975(17) * sd / math.sqrt(18))
    with pytest.raises(StudyError, match="at least one comparison"):
        heldout.power({})


def test_a_point_against_another_is_paired_by_seed(tmp_path):
    folders = seed_files(tmp_path, [90, 100, 80], [120, 118, 80])  # the oracle at 40
    other = heldout.Point("spec-default", 100)
    arm = next(a for a in default_arms() if a.name == "spec-default")
    for f, s, o in zip(folders, [90, 100, 80], [100, 100, 90]):
        metrics = {k: {"test": {"rubric_success": v / 180}} for k, v in (("sft", s), ("ppo", o))}
        write_json(confirmation.test_file(f, arm, 100), {"iteration": 100, "metrics": metrics})
    got = heldout.comparisons(folders, {"o_minus_d": (heldout.Point("oracle", 40), other)})["o_minus_d"]
    assert got["per_seed"] == pytest.approx([20 / 180, 18 / 180, -10 / 180])
    assert (got["a"], got["b"]) == ("oracle@40", "spec-default@100") and got["seeds_up"] == 2


def first_room(tmp_path, path, diffs, recipe="sft-demos6", it=40, **declared):
    """A finished first room study of `recipe` at `it` on the testbed at `path`: its per-seed test differences."""
    room_json = tmp_path / f"room-{len(list(tmp_path.glob('room-*')))}" / "room.json"
    write_json(
        room_json,
        {
            "declared": {"testbed": path, "sft_recipe": recipe, "oracle_iteration": it, **declared},
            "oracle_minus_sft": {"per_seed": diffs},
        },
    )
    return str(room_json)


def test_a_replication_takes_its_seed_count_from_the_first_studys_test_spread_and_fresh_seeds(tmp_path):
    record, path = make_testbed(tmp_path, [0.1, 0.12, 0.08, 0.11, 0.09])  # validation: SD 0.016, 3 seeds asked
    diffs = [-0.16, 0.13, 0.22, 0.16, 0.18, 0.14]
    got = room.declaration(record, path, first_room(tmp_path, path, diffs))
    mean = sum(diffs) / 6
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 5)
    n = next(n for n in range(2, 41) if t975(n - 1) * sd / math.sqrt(n) <= 0.10)
    assert got["seeds"] == n == 10 and got["replicates"]["test_sd"] == pytest.approx(sd)
    assert got["replicates"]["per_seed"] == diffs and len(got["replicates"]["sha256"]) == 64
    assert got["study_seed"] == room.REPLICATION_STUDY_SEED == 7 != room.ROOM_STUDY_SEED
    assert "first study's per-seed test differences" in got["reads"]
    assert room.declaration(record, path)["seeds"] == 3  # the first study's own count, from validation


def test_a_replication_repeats_the_same_study_of_a_finished_first_one(tmp_path):
    record, path = make_testbed(tmp_path, [0.1, 0.2, 0.3])
    with pytest.raises(StudyError, match="is not a finished room study"):
        room.declaration(record, path, str(tmp_path / "absent" / "room.json"))
    with pytest.raises(StudyError, match="confirmed sft-demos12 at iteration 40 .* a replication repeats the same"):
        room.declaration(record, path, first_room(tmp_path, path, [0.1, 0.2], recipe="sft-demos12"))
    with pytest.raises(StudyError, match="confirmed sft-demos6 at iteration 20"):
        room.declaration(record, path, first_room(tmp_path, path, [0.1, 0.2], it=20))
    with pytest.raises(StudyError, match="is itself a replication"):
        room.declaration(record, path, first_room(tmp_path, path, [0.1, 0.2], replicates={"room": "x"}))
