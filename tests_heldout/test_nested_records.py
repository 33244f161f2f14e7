"""The committed variance split (results/nested-r002/), read back and recomputed: its declaration
follows from the committed choice alone; the split is the one-way random-effects split of the
committed runs' differences, written out here by hand; each run's difference is a share of the
180 test prompts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlhf.studies import nested
from rlhf.studies.statistics import t975

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "results" / "nested-r002"
CHOICE = "results/choice-r002/choice.json"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_declaration_follows_from_the_committed_choice():
    again = nested.declaration(load(ROOT / CHOICE), CHOICE)
    assert load(STUDY / "study.json")["identity"] == again == load(STUDY / "nested.json")["declared"]
    assert again["points"] == load(ROOT / "results" / "verdict-r002" / "study.json")["identity"]["points"]


def test_the_split_is_recomputed_from_the_committed_runs_by_hand(record_result):
    record, runs = load(STUDY / "nested.json"), load(STUDY / "runs.json")["runs"]
    for label, rows in runs.items():
        y = [[r["difference"] for r in row] for row in rows]
        n, k = len(y), len(y[0])
        assert (n, k) == (nested.PIPELINES, nested.PPO_SEEDS)
        assert all(abs(v * 180 - round(v * 180)) < 1e-9 for row in y for v in row)
        means = [sum(row) / k for row in y]
        grand = sum(means) / n
        ms_pipeline = k * sum((m - grand) ** 2 for m in means) / (n - 1)
        ms_ppo = sum((v - m) ** 2 for row, m in zip(y, means) for v in row) / (n * (k - 1))
        got = record["split"][label]
        assert got["mean"] == pytest.approx(grand, abs=1e-15)
        assert got["var_ppo"] == pytest.approx(ms_ppo, rel=1e-12)
        assert got["var_pipeline"] == pytest.approx(max(0.0, (ms_pipeline - ms_ppo) / k), rel=1e-12)
        prompts = sum(r["prompt_variance"] for row in rows for r in row) / (n * k)
        assert got["var_prompts"] == pytest.approx(prompts, rel=1e-12)
        half = t975(n - 1) * math.sqrt(ms_pipeline / (n * k))
        assert got["over_the_whole_pipeline"]["t95"] == pytest.approx([grand - half, grand + half], rel=1e-12)
        for row, m, p in zip(y, means, got["from_one_sft_and_judge"]):
            sd = math.sqrt(sum((v - m) ** 2 for v in row) / (k - 1))
            h = t975(k - 1) * sd / math.sqrt(k)
            assert p["per_ppo_seed"] == row and p["t95"] == pytest.approx([m - h, m + h], rel=1e-12, abs=1e-15)
        assert got == nested.variance_split(*nested.split_inputs(rows))
        record_result(label, {key: got[key] for key in ("mean", "var_ppo", "var_pipeline", "var_prompts")})


def test_reproduce_reads_a_pipelines_runs_and_refuses_one_the_study_did_not_run(tmp_path):
    from rlhf.studies import StudyError
    from rlhf.studies.reproduce import committed_nested_row, reproduce

    declared, row = committed_nested_row(STUDY, 4)
    runs = load(STUDY / "runs.json")["runs"]
    assert row == {label: rows[4] for label, rows in runs.items()} and declared["pipelines"] == 5
    with pytest.raises(StudyError, match="--seed must be between 0 and 4"):
        reproduce(STUDY, 5, tmp_path / "work")
    assert not (tmp_path / "work").exists()


def test_the_committed_reproduction_names_a_pipeline_of_this_study_and_a_later_code():
    """reproduce-seed-0.json: `rlhf reproduce results/nested-r002 --seed 0` (pipeline 0's SFT, judge
    and 9 PPO runs, read on test) run by a later commit than the study's, on the pinned arithmetic."""
    rec = load(STUDY / "reproduce-seed-0.json")
    assert rec["results"] == "results/nested-r002" and rec["seed"] == 0 and rec["identical"] is True
    assert rec["first_difference"] is None and rec["arithmetic"].startswith("pinned:")
    assert rec["study_code"] == load(STUDY / "nested.json")["evaluated_by"]["code"] != rec["code"]


def test_run_nested_whole_on_the_committed_runs_gives_the_committed_split(tmp_path, monkeypatch):
    """`rlhf nested` from the committed choice, with training and test evaluation stood in for
    (nothing trained; each run's difference and prompt variance read from the committed runs.json):
    the same declaration, the 5 x 3 runs of each point asked for with their PPO offsets, the same
    run table and the same variance split."""
    from replay import replay_nested_runs

    monkeypatch.chdir(ROOT)
    committed = load(STUDY / "nested.json")
    runs = load(STUDY / "runs.json")["runs"]
    asked = replay_nested_runs(monkeypatch, runs, committed["declared"])
    again = nested.run_nested(CHOICE, tmp_path / "nested", workers=1, say=lambda _: None)
    assert again["declared"] == committed["declared"]
    ((folders, keys, offsets, revision),) = asked
    assert folders == [f"seed-{i}" for i in range(nested.PIPELINES)] and revision == "r002"
    assert len(keys) == len(set(keys)) == 3 * nested.PPO_SEEDS
    assert offsets == [None, nested.OFFSET_STRIDE, 2 * nested.OFFSET_STRIDE] * 3
    assert again["runs"] == runs and again["split"] == committed["split"]
