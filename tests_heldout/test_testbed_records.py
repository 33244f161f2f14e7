"""The committed testbed rounds (results/testbed-r002*/), read back and recomputed: each record
states the rule its round still declares, every verdict follows from its per-seed rows, every
oracle gain from its committed frontier study's per-seed curves, and the choice from both.

A round is declared before it measures and never changed after; these tests fail when the code's
round no longer says what its committed record says, or when a verdict or gain in a record (or in
docs/studies.md) is not what its rows give.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.studies import testbed

ROOT = Path(__file__).resolve().parents[1]
RECORDS = {
    1: ROOT / "results" / "testbed-r002" / "testbed-r002.json",
    2: ROOT / "results" / "testbed-r002-2" / "testbed-r002-2.json",
    3: ROOT / "results" / "testbed-r002-3" / "testbed-r002-3.json",
}


def load(n: int) -> dict:
    return json.loads(RECORDS[n].read_text())


@pytest.mark.unit
@pytest.mark.parametrize("n", sorted(RECORDS))
def test_each_committed_round_states_the_rule_its_round_still_declares(n):
    record = load(n)
    r = testbed.ROUNDS[n]
    if "round" in record:
        assert record["round"] == n and record["rule"] == testbed.rule(r) and record["declared"] == r.declared
    else:  # round 1 ran before rounds were numbered: the same rule, without its "round 1: " label
        assert n == 1 and record["rule"] == testbed.rule(r).removeprefix("round 1: ")
    assert [c["name"] for c in record["candidates"]] == list(r.candidates)
    assert record["band"] == [r.low, r.high] and record["gain_at_least"] == testbed.GAIN


@pytest.mark.unit
@pytest.mark.parametrize("n", sorted(RECORDS))
def test_every_verdict_follows_from_the_per_seed_rows(n):
    record = load(n)
    for c in record["candidates"]:
        assert len(c["sft"]["per_seed"]) == testbed.SEEDS
        assert testbed.stability(c["sft"]["per_seed"], testbed.ROUNDS[n]) == c["sft"], c["name"]
        # the oracle runs exactly where the rule says: on the stable candidates with room
        assert ("oracle" in c) == c["sft"]["stable_with_room"], c["name"]
    assert testbed.choose(record["candidates"]) == record["chosen"]


def oracle_gain_from_curves(frontier: dict) -> tuple[float, int, float]:
    """The mean curve's best checkpoint after iteration 0 over the study's seeds, and its gain over
    the seeds' mean SFT gold, recomputed from each seed's points."""
    curves = [{p["iteration"]: p["gold"] for p in s["arms"]["oracle"]["points"]} for s in frontier["seeds"]]
    iterations = sorted(set(curves[0]) - {0})
    mean = {i: sum(c[i] for c in curves) / len(curves) for i in iterations}
    best = max(iterations, key=lambda i: (mean[i], -i))  # the earlier checkpoint on a tie
    sft = sum(s["sft"]["gold"] for s in frontier["seeds"]) / len(frontier["seeds"])
    return mean[best], best, mean[best] - sft


@pytest.mark.unit
@pytest.mark.parametrize("n", [n for n in sorted(RECORDS) if any("oracle" in c for c in load(n)["candidates"])])
def test_every_oracle_gain_is_its_committed_study_s_mean_curve(n):
    record = load(n)
    for c in record["candidates"]:
        if "oracle" not in c:
            continue
        frontier = json.loads((RECORDS[n].parent / f"oracle-{c['name']}" / "frontier.json").read_text())
        assert len(frontier["seeds"]) == testbed.ORACLE_SEEDS
        gold, iteration, gain = oracle_gain_from_curves(frontier)
        o = c["oracle"]
        assert (o["best_gold"], o["best_iteration"]) == (pytest.approx(gold, abs=1e-12), iteration), c["name"]
        assert o["gain"] == pytest.approx(gain, abs=1e-12) and o["qualifies"] == (gain >= testbed.GAIN)
        # the oracle study's SFT is the rule's SFT: its first ORACLE_SEEDS seeds, retrained, give the same success
        assert o["sft_gold_per_seed"] == pytest.approx(c["sft"]["per_seed"][: testbed.ORACLE_SEEDS], abs=1e-12)


@pytest.mark.unit
@pytest.mark.parametrize("n", sorted(RECORDS))
def test_the_docs_table_states_each_committed_candidate(n):
    docs = (ROOT / "docs" / "studies.md").read_text()
    for c in load(n)["candidates"]:
        s = c["sft"]
        row = f"| {c['name']} | "
        cell = f"| {s['mean']:.3f} ({s['sd']:.3f}, {s['min']:.3f}) |"
        assert any(line.startswith(row) and cell in line for line in docs.splitlines()), (n, c["name"])
        if "oracle" in c:
            o = c["oracle"]
            assert f"{o['sft_gold']:.3f} → {o['best_gold']:.3f} at {o['best_iteration']}: {o['gain']:+.3f}" in docs


@pytest.mark.unit
@pytest.mark.parametrize("n", sorted(RECORDS))
def test_choose_testbed_run_whole_on_the_committed_rows_gives_the_committed_round(n, tmp_path, monkeypatch):
    """`rlhf choose-testbed --round N` with each (candidate, seed) SFT run and each oracle study
    replayed from the committed record (nothing trained; the corpus and base not built): every
    candidate's SFT rows asked for once, the oracle only where SFT is stable with room, and the
    committed candidates' numbers and choice."""
    from rlhf.studies import sft_budget

    committed = load(n)
    by_name = {c["name"]: c for c in committed["candidates"]}
    asked: dict = {"sft": [], "oracle": []}

    def sft_task(work, revision, profile_name, candidate, i):
        asked["sft"].append((candidate, i))
        c = by_name[candidate]
        row = {"candidate": candidate, "seed_index": i, "validation": {"rubric_success": c["sft"]["per_seed"][i]},
               "train_seconds": c["sft_train_seconds"][i]}  # fmt: skip
        testbed.write_json(Path(work) / "sft" / candidate / f"seed-{i}.json", row)
        return row

    def oracle_gain(work, name, revision, profile_name, workers, say, n, prefix):
        asked["oracle"].append((name, n, prefix))
        return by_name[name]["oracle"]

    monkeypatch.setattr(testbed, "sft_task", sft_task)
    monkeypatch.setattr(sft_budget, "oracle_gain", oracle_gain)
    monkeypatch.setattr(sft_budget, "prepare_work", lambda *a: None)
    again = testbed.choose_testbed(tmp_path / "t.json", tmp_path / "work", revision=committed["revision"],
                                   workers=1, say=lambda _: None, round_number=n)  # fmt: skip
    r = testbed.ROUNDS[n]
    assert asked["sft"] == [(c, i) for c in r.candidates for i in range(testbed.SEEDS)]
    assert asked["oracle"] == [(c["name"], testbed.ORACLE_SEEDS, "oracle") for c in committed["candidates"]
                               if c["sft"]["stable_with_room"]]  # fmt: skip
    for key in ("candidates", "chosen", "band", "seeds"):
        assert again[key] == committed[key], key
    assert again["round"] == n and again["rule"] == testbed.rule(r)  # round 1's record predates the labels
    # a second run finds every SFT row written and trains none again
    asked["sft"].clear()
    testbed.measure_sft(tmp_path / "work", committed["revision"], "embedded", 1, lambda _: None, r.candidates)
    assert asked["sft"] == []


@pytest.mark.unit
def test_a_testbed_sft_run_trains_as_the_frontiers_seed_of_that_budget_does(tmp_path):
    """Run i of a candidate (seed_profile) has the training seeds and the SFT budget that the
    frontier writes into its seed-i/profile.toml for that budget: the testbed's SFT rows are the
    frontier's SFT runs, so a testbed's stability is measured on the runs the studies then use."""
    from rlhf.config import load_profile
    from rlhf.studies.derivation import write_study_profiles
    from rlhf.studies.frontier.study import STUDY_SEED

    profile = load_profile("embedded")
    for candidate in ("sft-demos6", "sft-e7"):
        folders = write_study_profiles(tmp_path / candidate, "embedded", 3, STUDY_SEED, candidate)
        for i in (0, 2):
            ours = testbed.seed_profile(profile, candidate, i).to_dict()
            theirs = load_profile(str(folders[i] / "profile.toml")).to_dict()
            ours.pop("name"), theirs.pop("name")
            assert ours == theirs, (candidate, i)
    assert testbed.seed_profile(profile, "sft-e7", 0).to_dict() != testbed.seed_profile(profile, "sft-e7", 1).to_dict()
