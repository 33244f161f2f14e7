"""The committed answer on test (results/verdict-r002/), read back and recomputed: its declaration
follows from the committed choice alone and was committed before any test read (study.json); the
seed count is the power rule's; every comparison's per-seed differences, interval, sign-flip p
and seeds up follow from the per-seed test success the seeds' files hold (test_success.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.studies import verdict
from rlhf.studies.statistics import paired

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "results" / "verdict-r002"
CHOICE = "results/choice-r002/choice.json"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def record():
    return load(STUDY / "verdict.json")


def test_the_declaration_follows_from_the_committed_choice_and_came_first(record):
    again = verdict.declaration(load(ROOT / CHOICE), str(ROOT / CHOICE))
    study = load(STUDY / "study.json")
    assert {**again, "choice": CHOICE} == study["identity"] == record["declared"]
    assert study["identity"]["choice_commit"] == load(ROOT / CHOICE)["steps"][-1]["commit"]
    # declared at its own commit, after the choice's, and read on test by a later run of the code
    assert len(study["commit"]) == 40 and study["commit"] != study["identity"]["choice_commit"]
    assert "test prompts (step 2's evaluation, after this declaration)" in study["identity"]["reads"]


def test_the_seed_count_is_the_power_rules_largest_ask(record):
    power = record["declared"]["power"]
    asks = {name: c["asks"] for name, c in power["per_comparison"].items()}
    assert power["seeds"] == max(asks.values()) and not power["capped"]
    for name, c in power["per_comparison"].items():
        assert c["expected_half_width"] <= 0.10, name
    table = load(STUDY / "test_success.json")["test_success"]
    assert {len(v) for v in table.values()} == {power["seeds"]}
    assert all(c["n"] == power["seeds"] for c in record["comparisons"].values())


def test_every_comparison_is_recomputed_from_the_per_seed_test_success(record, record_result):
    table = load(STUDY / "test_success.json")["test_success"]
    assert set(table) == {"sft", *record["declared"]["points"]}
    for name, (a, b) in record["declared"]["comparisons"].items():
        diffs = [x - y for x, y in zip(table[a], table[b])]
        got = record["comparisons"][name]
        assert got["per_seed"] == pytest.approx(diffs, abs=1e-15)
        again = paired(got["per_seed"])
        assert {k: got[k] for k in again} == again
        assert got["seeds_up"] == sum(d > 0 for d in diffs)
        # every success is a share of the 180 test prompts
        assert all(abs(x * 180 - round(x * 180)) < 1e-9 for x in table[a] + table[b])
        record_result(name, {k: got[k] for k in ("mean", "t95", "sign_flip_p", "seeds_up", "n")})


def test_reproduce_reads_this_study_s_rows_and_refuses_a_seed_it_did_not_run(tmp_path):
    """`rlhf reproduce results/verdict-r002 --seed N` compares seed N's row of test_success.json;
    a seed outside the study is refused before anything is written."""
    from rlhf.studies import StudyError
    from rlhf.studies.reproduce import committed_verdict_row, reproduce

    declared, row = committed_verdict_row(STUDY, 3)
    table = load(STUDY / "test_success.json")["test_success"]
    assert (
        row == {name: values[3] for name, values in table.items()}
        and declared == load(STUDY / "study.json")["identity"]
    )
    work = tmp_path / "work"
    with pytest.raises(StudyError, match="--seed must be between 0 and 14"):
        reproduce(STUDY, 15, work)
    assert not work.exists()


def test_the_committed_reproduction_names_a_seed_of_this_study_and_a_later_code():
    """reproduce-seed-0.json: `rlhf reproduce results/verdict-r002 --seed 0` run by a later commit
    than the one that evaluated the study, on the pinned arithmetic."""
    rec = load(STUDY / "reproduce-seed-0.json")
    assert rec["results"] == "results/verdict-r002" and rec["seed"] == 0 and rec["identical"] is True
    assert rec["first_difference"] is None and rec["arithmetic"].startswith("pinned:")
    assert rec["study_code"] == load(STUDY / "verdict.json")["evaluated_by"]["code"] != rec["code"]


def test_reproduce_reads_the_room_studys_rows_and_refuses_a_seed_it_did_not_run(tmp_path):
    from rlhf.studies import StudyError
    from rlhf.studies.reproduce import committed_room_row, reproduce

    room = ROOT / "results" / "room-r002"
    declared, row = committed_room_row(room, 2)
    assert row == load(room / "room.json")["per_seed"][2] and row["seed"] == 2 and declared["seeds"] == 6
    with pytest.raises(StudyError, match="--seed must be between 0 and 5"):
        reproduce(room, 6, tmp_path / "work")
    assert not (tmp_path / "work").exists()


def test_confirm_design_run_whole_on_the_committed_test_success_gives_the_committed_verdict(
    record, tmp_path, monkeypatch
):
    """`rlhf confirm-design` from the committed choice, with training and test evaluation replayed
    from the committed per-seed success (tests_heldout/replay.py): the same declaration, the same
    seeds asked for (SFT, judge and the three points' arms, read on test), the same verdict."""
    from replay import replay_reading

    monkeypatch.chdir(ROOT)  # the choice names its testbed and selection study from the root
    table = load(STUDY / "test_success.json")["test_success"]
    asked = replay_reading(monkeypatch, table, record["declared"]["points"])
    again = verdict.confirm_design(CHOICE, tmp_path / "verdict", workers=1, say=lambda _: None)
    n = record["declared"]["power"]["seeds"]
    assert asked["trained"] == [([f"seed-{i}" for i in range(n)], sorted({"spec-default", "oracle",
                                 record["declared"]["points"]["chosen"]["arm"]}), "r002", True)]  # fmt: skip
    assert len(asked["read"]) == 3 * n
    assert again["declared"] == {**record["declared"], "choice": CHOICE}
    assert again["comparisons"] == record["comparisons"] and again["test_success"] == table
    for i in (0, n - 1):  # each seed's profile carries the declared study seed's training seeds
        name = f'name = "embedded-study{record["declared"]["study_seed"]}-seed{i}-'
        assert name in (tmp_path / "verdict" / f"seed-{i}" / "profile.toml").read_text()
    # a rerun reads the record written last and recomputes nothing
    assert verdict.confirm_design(CHOICE, tmp_path / "verdict", workers=1, say=lambda _: None) == again
