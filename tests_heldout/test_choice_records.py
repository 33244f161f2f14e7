"""The committed choice of a design (results/choice-r002/), read back and recomputed: its
declaration follows from the testbed record alone; the chosen point is the rule's on the committed
selection study's curves; the honest estimate is the estimation study's paired per-seed gains; the
winner's curse is the naive gain less the honest one; and every step read train and validation
prompts only, at a recorded commit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.studies import choice
from rlhf.studies.statistics import paired

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "results" / "choice-r002"
TESTBED = "results/testbed-r002-2/testbed-r002-2.json"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def record():
    return load(STUDY / "choice.json")


def test_the_declaration_is_the_testbed_record_s_nearest_candidate_and_the_declared_constants(record):
    again = choice.declaration(load(ROOT / TESTBED), TESTBED)
    assert record["declared"] == again
    assert not record["declared"]["testbed_qualifies"] and record["declared"]["sft_recipe"] == "sft-demos6"
    assert load(STUDY / "study.json")["identity"] == again  # what study.json declared before the first run


def test_the_chosen_point_is_the_rule_on_the_committed_selection_curves(record):
    selection = load(STUDY / "selection" / "frontier.json")
    assert len(selection["seeds"]) == choice.SELECTION_SEEDS
    again = choice.choose_point(selection)
    assert record["chosen"] == again
    # the rule by hand: the largest mean gold over the declared points (ties: smaller d, then order)
    points = [
        (row["gold"]["mean"], -row["d"]["mean"], -k, -row["iteration"], name, row["iteration"])
        for k, name in enumerate(choice.CANDIDATES)
        for row in selection["arms"][name]["curve"]
        if row["iteration"] in choice.CHECKPOINTS
    ]
    assert max(points)[4:] == (again["arm"], again["iteration"])
    assert again["naive_gain"]["per_seed"] == choice.per_seed_gains(selection, again["arm"], again["iteration"])


def test_the_honest_estimate_is_the_estimation_study_s_paired_gains_and_the_curse_their_difference(record):
    estimation = load(STUDY / "estimation" / "frontier.json")
    assert len(estimation["seeds"]) == choice.ESTIMATION_SEEDS
    arm, it = record["chosen"]["arm"], record["chosen"]["iteration"]
    again = choice.estimate(estimation, arm, it)
    assert record["estimate"] == again
    gains = choice.per_seed_gains(estimation, arm, it)
    assert record["estimate"]["chosen_minus_sft"] == paired(gains)
    assert record["curse"] == pytest.approx(record["chosen"]["naive_gain"]["mean"] - paired(gains)["mean"], abs=1e-15)


def test_every_step_read_train_and_validation_prompts_only_at_a_recorded_commit(record):
    assert [s["step"] for s in record["steps"]] == ["selection", "estimation"]
    for step in record["steps"]:
        assert step["reads"] == choice.READS and "no test prompt" in step["reads"]
        assert len(step["commit"]) == 40 and step["seconds"] > 0


def test_the_verdict_declares_from_the_committed_choice_read_where_it_is_committed(record):
    """`rlhf confirm-design --choice results/choice-r002/choice.json` reads the selection study
    committed beside the record (the path recorded in it is where the study ran): the points, and
    a seed count from the power rule on the estimation's and the selection's spreads."""
    from rlhf.studies import verdict

    declared = verdict.declaration(record, str(STUDY / "choice.json"))
    assert declared["points"]["chosen"] == {"arm": record["chosen"]["arm"], "iteration": record["chosen"]["iteration"]}
    per = declared["power"]["per_comparison"]
    assert per["chosen_minus_default"]["validation_sd"] == record["estimate"]["chosen_minus_default"]["sd"]
    assert declared["power"]["seeds"] == max(c["asks"] for c in per.values())


def test_reproduce_reads_a_frontier_seeds_summary_and_refuses_a_seed_it_did_not_run(tmp_path):
    """`rlhf reproduce results/choice-r002/estimation --seed N` compares seed N's summary in
    frontier.json; a seed outside the study is refused before anything is written."""
    from rlhf.studies import StudyError
    from rlhf.studies.reproduce import committed_frontier_row, reproduce

    result = load(STUDY / "estimation" / "frontier.json")
    identity, row = committed_frontier_row(STUDY / "estimation", 5)
    assert row == result["seeds"][5] and identity == result["study"]
    with pytest.raises(StudyError, match="--seed must be between 0 and 5"):
        reproduce(STUDY / "estimation", 6, tmp_path / "work")
    assert not (tmp_path / "work").exists()


def test_the_committed_reproduction_names_an_estimation_seed_and_a_later_code():
    """estimation/reproduce-seed-0.json: `rlhf reproduce results/choice-r002/estimation --seed 0`
    (its SFT, judge, two PPO arms and their validation measurements) by a later commit."""
    rec = load(STUDY / "estimation" / "reproduce-seed-0.json")
    assert rec["results"] == "results/choice-r002/estimation" and rec["seed"] == 0 and rec["identical"] is True
    assert rec["first_difference"] is None and rec["arithmetic"].startswith("pinned:")
    assert rec["study_code"] == load(STUDY / "estimation" / "frontier.json")["study"]["code"] != rec["code"]


def test_choose_design_run_whole_on_the_committed_studies_gives_the_committed_choice(tmp_path, monkeypatch):
    """`rlhf choose-design` from the committed testbed record, each of its two frontier studies
    replayed from its committed frontier.json (nothing trained): the selection asked for on the
    declared candidates and seeds, the estimation on the chosen point's and the default's arms on
    fresh seeds, and the committed choice, estimate and curse."""
    from rlhf.studies.frontier import study

    monkeypatch.chdir(ROOT)
    committed = load(STUDY / "choice.json")
    asked = {}

    def run_frontier(folder, *, n, settings, study_seed, revision, sft_budget, **kw):
        asked[folder.name] = (n, [a.name for a in settings.arms], study_seed, revision, sft_budget)
        return load(STUDY / folder.name / "frontier.json")

    monkeypatch.setattr(study, "run_frontier", run_frontier)
    again = choice.choose_design(committed["declared"]["testbed"], tmp_path / "c", workers=1, say=lambda _: None)
    declared = committed["declared"]
    bed = (declared["revision"], declared["sft_recipe"])
    assert asked["selection"] == (choice.SELECTION_SEEDS, [*choice.CANDIDATES, "oracle"], study.STUDY_SEED, *bed)
    chosen = committed["chosen"]["arm"]
    assert asked["estimation"] == (choice.ESTIMATION_SEEDS, list(dict.fromkeys((chosen, choice.DEFAULT))),
                                   choice.ESTIMATION_STUDY_SEED, *bed)  # fmt: skip
    assert again["declared"] == declared
    for key in ("chosen", "estimate", "curse"):
        assert again[key] == committed[key], key
