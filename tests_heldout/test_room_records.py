"""The committed room studies (results/room-r002/, results/room-r002-rep/), read back and
recomputed: each declaration follows from what it says it read (the testbed record and its
oracle study; for the replication, the first study's committed per-seed test differences), and
every number of room.json, and of the docs table, from the per-seed test successes it holds."""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

import pytest

from rlhf.studies import heldout, room
from rlhf.studies.statistics import paired

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
FIRST = ROOT / "results" / "room-r002" / "room.json"
REPLICATION = ROOT / "results" / "room-r002-rep" / "room.json"
TESTBED = "results/testbed-r002-2/testbed-r002-2.json"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_first_declaration_is_the_nearest_candidate_and_the_power_rule_on_its_validation_gains():
    declared = load(FIRST)["declared"]
    again = room.declaration(load(ROOT / TESTBED), TESTBED)
    assert declared["testbed"] == TESTBED and not declared["testbed_qualifies"]
    for key in ("sft_recipe", "oracle_iteration", "validation_gain_per_seed", "seeds", "study_seed", "power"):
        assert declared[key] == again[key], key
    assert declared["sft_recipe"] == "sft-demos6" and declared["seeds"] == 6 and declared["study_seed"] == 3


def test_the_replication_declares_its_seeds_from_the_committed_first_study_s_test_spread():
    declared = load(REPLICATION)["declared"]
    first = load(FIRST)
    rep = declared["replicates"]
    assert rep["room"] == "results/room-r002/room.json"
    assert rep["sha256"] == hashlib.sha256(FIRST.read_bytes()).hexdigest()  # the first is unchanged since
    assert rep["per_seed"] == first["oracle_minus_sft"]["per_seed"]
    assert rep["test_sd"] == pytest.approx(statistics.stdev(rep["per_seed"]))
    assert declared["seeds"] == heldout.power({room.COMPARISON: rep["test_sd"]})["seeds"] == 10
    assert declared["study_seed"] == room.REPLICATION_STUDY_SEED != first["declared"]["study_seed"]


@pytest.mark.parametrize("path", [FIRST, REPLICATION], ids=["first", "replication"])
def test_every_number_of_a_room_study_follows_from_its_per_seed_test_successes(path):
    record = load(path)
    rows = record["per_seed"]
    assert len(rows) == record["declared"]["seeds"]
    diffs = [r["oracle"] - r["sft"] for r in rows]
    assert [r["oracle_minus_sft"] for r in rows] == pytest.approx(diffs, abs=1e-12)
    want = paired(diffs)
    got = record[room.COMPARISON]
    for key in ("mean", "sd", "t95", "sign_flip_p", "seeds_up", "n"):
        assert got[key] == pytest.approx(want[key], abs=1e-12), key
    assert record["sft"]["mean"] == pytest.approx(statistics.fmean(r["sft"] for r in rows))
    assert record["room_shown"] is (got["t95"][0] > 0) is False
    if "pooled_with_first" in record:
        pooled = paired(load(FIRST)[room.COMPARISON]["per_seed"] + diffs)
        assert record["pooled_with_first"]["t95"] == pytest.approx(pooled["t95"], abs=1e-12)


def test_the_docs_table_states_each_room_study():
    text = (ROOT / "docs" / "studies.md").read_text()
    for path, name in ((FIRST, "first"), (REPLICATION, "replication")):
        d = load(path)[room.COMPARISON]
        row = next(line for line in text.splitlines() if line.startswith(f"| {name} ("))
        lo, hi = d["t95"]
        assert f"{d['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]".replace("-", "−") in row, row
        assert f"| {d['sign_flip_p']:.3f} |" in row and f"{d['seeds_up']} of {d['n']}" in row, row
    pooled = load(REPLICATION)["pooled_with_first"]
    row = next(line for line in text.splitlines() if line.startswith("| both pooled"))
    lo, hi = pooled["t95"]
    assert f"{pooled['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]".replace("-", "−") in row, row


def test_the_committed_reproduction_names_a_seed_of_the_room_study_and_a_later_code():
    """room-r002/reproduce-seed-0.json: `rlhf reproduce results/room-r002 --seed 0` (its SFT, judge,
    the oracle's PPO and their test evaluation) by a later commit, on the pinned arithmetic; the
    row it compared is the committed one's shape (room.seed_rows)."""
    folder = ROOT / "results" / "room-r002"
    rec = load(folder / "reproduce-seed-0.json")
    assert rec["results"] == "results/room-r002" and rec["seed"] == 0 and rec["identical"] is True
    assert rec["first_difference"] is None and rec["arithmetic"].startswith("pinned:")
    assert rec["study_code"] == load(folder / "room.json")["evaluated_by"]["code"] != rec["code"]
    row = load(folder / "room.json")["per_seed"][0]
    assert set(row) == {"seed", "folder", "sft", "oracle", room.COMPARISON}
    assert row[room.COMPARISON] == row["oracle"] - row["sft"]


def test_the_testbeds_oracle_study_has_a_seed_recomputed_byte_for_byte():
    """testbed-r002-2/oracle-sft-demos6/reproduce-seed-0.json: seed 0 of the nearest testbed's oracle
    study (its SFT, judge, the oracle's PPO and 10 validation measurements) recomputed by a later
    commit: its frontier.json summary byte for byte."""
    folder = ROOT / "results" / "testbed-r002-2" / "oracle-sft-demos6"
    rec = load(folder / "reproduce-seed-0.json")
    assert rec["results"] == "results/testbed-r002-2/oracle-sft-demos6" and rec["seed"] == 0
    assert rec["identical"] is True and rec["first_difference"] is None
    assert rec["study_code"] == load(folder / "frontier.json")["study"]["code"] != rec["code"]


@pytest.mark.parametrize("path", [FIRST, REPLICATION], ids=["first", "replication"])
def test_confirm_oracle_run_whole_on_the_committed_test_success_gives_the_committed_room(path, tmp_path, monkeypatch):
    """`rlhf confirm-oracle` (and with --replicate) from the committed testbed record, with training
    and test evaluation replayed from the committed per-seed success (tests_heldout/replay.py):
    the same declaration, seeds and arm asked for, and the same room on test."""
    from replay import replay_reading

    monkeypatch.chdir(ROOT)  # the records name each other from the root
    committed = load(path)
    declared = committed["declared"]
    replicate = (declared.get("replicates") or {}).get("room")
    table = {"sft": [r["sft"] for r in committed["per_seed"]], "oracle": [r["oracle"] for r in committed["per_seed"]]}
    asked = replay_reading(monkeypatch, table, {"oracle": {"arm": "oracle", "iteration": declared["oracle_iteration"]}})
    again = room.confirm_oracle(declared["testbed"], tmp_path / "room", workers=1, say=lambda _: None,
                                replicate=replicate)  # fmt: skip
    n = declared["seeds"]
    assert asked["trained"] == [([f"seed-{i}" for i in range(n)], ["oracle"], declared["revision"], True)]
    assert again["declared"] == declared
    for key in ("per_seed", "sft", "oracle", "oracle_minus_sft", "room_shown", "pooled_with_first"):
        assert again.get(key) == committed.get(key), key
    name = f'name = "embedded-study{declared["study_seed"]}-seed0-{declared["sft_recipe"]}"'
    assert name in (tmp_path / "room" / "seed-0" / "profile.toml").read_text()
