"""The variance split of the nested study (rlhf.studies.nested), recomputed by hand: the one-way
random-effects components, the two intervals, the prompt component from per-prompt rows."""

import dataclasses
import math
import statistics

import pytest

from rlhf.io import write_json
from rlhf.studies import StudyError, heldout, nested
from rlhf.studies.frontier.confirmation import test_file as point_file
from rlhf.studies.statistics import t975

pytestmark = pytest.mark.unit


def test_the_split_by_hand_on_a_balanced_table():
    y = [[0.10, 0.20, 0.30], [0.00, 0.05, 0.10], [0.30, 0.35, 0.25]]  # 3 pipelines x 3 PPO seeds
    got = nested.variance_split(y, [[0.001] * 3] * 3)
    means = [0.2, 0.05, 0.3]
    grand = sum(means) / 3
    ms_between = 3 * sum((m - grand) ** 2 for m in means) / 2
    ms_within = (0.02 + 0.005 + 0.005) / 6  # squared deviations per pipeline: 0.02, 0.005, 0.005
    assert got["mean"] == pytest.approx(grand) and got["ms_ppo"] == pytest.approx(ms_within)
    assert got["var_ppo"] == pytest.approx(ms_within) and got["ms_pipeline"] == pytest.approx(ms_between)
    assert got["var_pipeline"] == pytest.approx((ms_between - ms_within) / 3) and got["var_prompts"] == 0.001
    whole = got["over_the_whole_pipeline"]["t95"]
    assert whole[1] - grand == pytest.approx(t975(2) * math.sqrt(ms_between / 9))
    first = got["from_one_sft_and_judge"][0]
    assert first["t95"][1] - 0.2 == pytest.approx(t975(2) * statistics.stdev(y[0]) / math.sqrt(3))


def test_pipelines_that_agree_leave_no_pipeline_variance_and_a_ragged_table_is_refused():
    got = nested.variance_split([[0.1, 0.3], [0.3, 0.1]], [[0, 0], [0, 0]])
    assert got["var_pipeline"] == 0.0 and got["var_ppo"] == pytest.approx(0.02)  # means equal: MS_pipeline 0
    with pytest.raises(StudyError, match="at least 2 pipelines"):
        nested.variance_split([[0.1, 0.2]], [[0, 0]])
    with pytest.raises(StudyError, match="same k"):
        nested.variance_split([[0.1, 0.2], [0.1]], [[0, 0], [0]])


def test_a_run_s_difference_and_its_prompt_variance_come_from_its_own_test_rows(tmp_path):
    sft = [1, 0, 1, 0, 1]
    ppo = [1, 1, 1, 0, 0]

    def rows(xs):
        test = [
            {"document_id": f"d{i}", "population": "test", "rubric": {"rubric_success": bool(x)}}
            for i, x in enumerate(xs)
        ]
        return test + [{"document_id": "p0", "population": "probe", "rubric": {"rubric_success": True}}]

    write_json(tmp_path / "frontier" / "test-sft.json", {"rows": rows(sft)})
    write_json(point_file(tmp_path, "oracle-ppo1", 40), {"ppo_rows": rows(ppo)})
    diff, var = nested.run_difference(tmp_path, heldout.Point("oracle-ppo1", 40))
    d = [p - s for s, p in zip(sft, ppo)]  # 0, 1, 0, 0, -1: the probe row is not a test prompt
    assert diff == pytest.approx(0.0) and var == pytest.approx(statistics.variance(d) / 5)


def test_ppo_seed_0_is_the_pipeline_s_own_run_and_the_others_are_offset():
    from rlhf.studies.frontier.arms import default_arms

    arm = next(a for a in default_arms() if a.name == "spec-default")
    assert nested.nested_arm_name("spec-default", 2) == "spec-default-ppo2"
    spread = {"validation": {"sd": 1.0}, "train": {"mean": 0.0, "sd": 1.0}}
    assert ("seeds", "ppo_offset") not in dataclasses.replace(arm, ppo_offset=None).changes(spread)
    assert dataclasses.replace(arm, ppo_offset=2 * nested.OFFSET_STRIDE).changes(spread)[("seeds", "ppo_offset")] == (
        15838
    )
