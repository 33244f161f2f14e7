"""`rlhf reproduce` run whole on a committed answer on test, room study and nested study, with the
seed's training and test evaluation replayed from the committed per-seed results
(tests_heldout/replay.py): the recomputed row is the committed one, and one test prompt more or
less in the replay is named as the first difference. What reproduce adds to the studies' own
code (which seed folder, which study seed, which points, the row and its comparison) is run here;
a real recomputation is an hours-long study's seed (docs/studies.md lists the committed ones)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.studies import reproduce

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def one_prompt_more(table: dict, name: str, seed: int) -> dict:
    changed = {k: list(v) for k, v in table.items()}
    changed[name][seed] += 1 / 180
    return changed


@pytest.mark.parametrize("nudge", [False, True], ids=["same", "one-prompt-more"])
def test_a_seed_of_the_answer_on_test(nudge, tmp_path, monkeypatch):
    from replay import replay_reading

    monkeypatch.chdir(ROOT)
    results = ROOT / "results" / "verdict-r002"
    table = load(results / "test_success.json")["test_success"]
    points = load(results / "study.json")["identity"]["points"]
    asked = replay_reading(monkeypatch, one_prompt_more(table, "oracle", 3) if nudge else table, points)
    out = reproduce.reproduce(results, 3, tmp_path / "work", say=lambda _: None)
    assert asked["trained"] == [(["seed-3"], sorted({p["arm"] for p in points.values()}), "r002", True)]
    assert out["identical"] is not nudge
    assert out["study_code"] == load(results / "verdict.json")["evaluated_by"]["code"]
    if nudge:
        assert out["first_difference"].startswith("row.oracle:")
    assert load(tmp_path / "work" / "reproduce-seed-3.json") == out


@pytest.mark.parametrize("nudge", [False, True], ids=["same", "one-prompt-more"])
def test_a_seed_of_the_room_study(nudge, tmp_path, monkeypatch):
    from replay import replay_reading

    monkeypatch.chdir(ROOT)
    results = ROOT / "results" / "room-r002"
    room = load(results / "room.json")
    table = {"sft": [r["sft"] for r in room["per_seed"]], "oracle": [r["oracle"] for r in room["per_seed"]]}
    point = {"oracle": {"arm": "oracle", "iteration": room["declared"]["oracle_iteration"]}}
    replay_reading(monkeypatch, one_prompt_more(table, "sft", 2) if nudge else table, point)
    out = reproduce.reproduce(results, 2, tmp_path / "work", say=lambda _: None)
    assert out["identical"] is not nudge
    if nudge:
        assert out["first_difference"].startswith("row.oracle_minus_sft:")
    name = f'name = "embedded-study{room["declared"]["study_seed"]}-seed2-'
    assert name in (tmp_path / "work" / "seed-2" / "profile.toml").read_text()


@pytest.mark.parametrize("nudge", [False, True], ids=["same", "one-prompt-more"])
def test_a_pipeline_of_the_nested_study(nudge, tmp_path, monkeypatch):
    from replay import replay_nested_runs

    monkeypatch.chdir(ROOT)
    results = ROOT / "results" / "nested-r002"
    runs = load(results / "runs.json")["runs"]
    declared = load(results / "study.json")["identity"]
    asked = replay_nested_runs(monkeypatch, runs, declared, ("default", 2) if nudge else None)
    out = reproduce.reproduce(results, 1, tmp_path / "work", say=lambda _: None)
    assert [a[0] for a in asked] == [["seed-1"]] and out["identical"] is not nudge
    if nudge:
        assert out["first_difference"].startswith("row.default[2].difference:")


@pytest.mark.parametrize("nudge", [False, True], ids=["same", "one-prompt-more"])
def test_a_seed_of_a_frontier_study(nudge, tmp_path, monkeypatch):
    """results/methods-r001/frontier (PPO, DPO and GRPO arms): the seed's folder and profile as the
    study wrote them, every declared arm asked for, and the seed's summary compared with the row."""
    from rlhf.studies.frontier import selection, study

    results = ROOT / "results" / "methods-r001" / "frontier"
    frontier = load(results / "frontier.json")
    row = frontier["seeds"][1]
    asked = []

    def summary(seed, folder, arms):
        asked.append((seed, folder.name, [a.name for a in arms]))
        if not nudge:
            return row
        return {**row, "sft": {**row["sft"], "gold": row["sft"]["gold"] + 1 / 180}}

    monkeypatch.setattr(study, "run_tasks", lambda folders, arms, *a, **k: asked.append([f.name for f in folders]))
    monkeypatch.setattr(selection, "seed_summary", summary)
    out = reproduce.reproduce(results, 1, tmp_path / "work", say=lambda _: None)
    arms = [a["name"] for a in frontier["study"]["settings"]["arms"]]
    assert asked == [["seed-1"], (1, "seed-1", arms)] and out["identical"] is not nudge
    assert out["study_code"] == frontier["study"]["code"]
    if nudge:
        assert out["first_difference"].startswith("row.sft.gold:")
    s = frontier["study"]
    name = f'name = "embedded-study{s["study_seed"]}-seed1-{s["sft_budget"]}"'
    assert name in (tmp_path / "work" / "seed-1" / "profile.toml").read_text()
