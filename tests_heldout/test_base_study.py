"""The base study as assertions: the embedded base measured through the project's own code,
beside a control base of the same size and (zero-step) budget.

The study runs once per module (SFT on r001 and the judge on r002 for both bases, about
2.5 minutes on 2 cores). The bounds below are the issue's, written out here rather than read
from rlhf.studies.base, so that a change of the module's constants cannot pass silently:

* embedded base, r001: SFT correct action >= 0.90 greedily, in-grammar (with EOS) >= 0.80 at
  temperature 1, on the 180 held-out test prompts;
* embedded base, r002: judge >= 0.90 on the 180 test pairs and >= 0.85 on variants 1, 2 and 4
  together (108 pairs); the conflict accuracy (1d) is reported, not bounded;
* control base: measured on the same numbers and recorded, never judged.
"""

from __future__ import annotations

import copy
import json

import pytest

from rlhf import cli
from rlhf.studies import base as bs

# One xdist worker runs the whole module, so the study runs once per session.
pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread"), pytest.mark.xdist_group("base_study")]


@pytest.fixture(scope="module")
def base_study(tmp_path_factory, request):
    """The study, its embedded SFT and judge taken from the session's two labs (the same bytes).
    The control base is measured first, while another worker may still be building the labs."""
    out = tmp_path_factory.mktemp("base_study") / "study"

    def labs():
        return [request.getfixturevalue("lab_run").run, request.getfixturevalue("lab_run_r002").run]

    return {"out": out, "result": bs.run_base_study(out, bases=("control", "embedded"), reuse=labs)}


def _headline(m: dict) -> dict:
    return {
        "sft_greedy_correct_action": m["sft"]["greedy"]["correct_action"],
        "sft_temperature_1_in_grammar": m["sft"]["temperature_1"]["in_grammar"],
        "judge_r002_test_accuracy": m["judge"]["test_accuracy"],
        "judge_r002_variants_1_2_4": m["judge"]["variants_1_2_4"],
        "judge_r002_conflict": m["judge"]["conflict"]["accuracy"],
        "judge_r002_conflict_by_variant": m["judge"]["conflict"]["by_variant"],
    }


def test_embedded_base_meets_the_issue_bounds(base_study, embedded_profile, record_result):
    m = base_study["result"]["bases"]["embedded"]
    headline = _headline(m)
    record_result("embedded_base", headline)
    # the budgets are the profile's, fixed before measuring: one run each, nothing picked
    assert m["sft"]["updates"] == embedded_profile.sft.expected_updates == 420
    assert m["judge"]["updates"] == embedded_profile.judge.expected_updates == 210
    assert m["sft"]["greedy"]["n"] == m["sft"]["temperature_1"]["n"] == 180
    assert m["judge"]["pairs"] == 180 and m["judge"]["variants_1_2_4_pairs"] == 108
    assert headline["sft_greedy_correct_action"] >= 0.90
    assert headline["sft_temperature_1_in_grammar"] >= 0.80
    assert headline["judge_r002_test_accuracy"] >= 0.90
    assert headline["judge_r002_variants_1_2_4"] >= 0.85
    assert 0.0 <= headline["judge_r002_conflict"] <= 1.0 and m["judge"]["conflict"]["pairs"] == 108
    assert all(c["holds"] for c in base_study["result"]["verdict"]["embedded"].values())


def test_control_base_is_measured_beside_it(base_study, record_result):
    res = base_study["result"]
    emb, ctl = res["bases"]["embedded"], res["bases"]["control"]
    record_result("control_base", _headline(ctl))
    assert (emb["build"]["text"], ctl["build"]["text"]) == ("office", "control")
    # same size, same weights (seed), same zero-step budget; only the tokenizer's text differs
    assert emb["build"]["parameters"] == ctl["build"]["parameters"]
    assert emb["build"]["pretraining_steps"] == ctl["build"]["pretraining_steps"] == 0
    assert emb["build"]["files"]["model.safetensors"] == ctl["build"]["files"]["model.safetensors"]
    assert emb["build"]["files"]["tokenizer.json"] != ctl["build"]["files"]["tokenizer.json"]
    assert ctl["sft"]["updates"] == emb["sft"]["updates"] and ctl["judge"]["updates"] == emb["judge"]["updates"]
    assert set(_headline(ctl)) == set(_headline(emb))
    assert set(res["verdict"]["control"]) == set(bs.CRITERIA)  # evaluated and published, not asserted


def test_judge_numbers_are_the_audits_and_the_files_are_kept(base_study):
    out, res = base_study["out"], base_study["result"]
    for name in ("embedded", "control"):
        audit = json.loads((out / name / "r002" / "shortcut_audit" / "results.json").read_text())
        judge = res["bases"][name]["judge"]
        assert audit["corpus"]["revision"] == "r002" and audit["unchanged"] is True
        assert judge["conflict"]["accuracy"] == audit["counterfactuals"]["d_conflict"]["accuracy"]
        assert judge["test_accuracy"] == audit["counterfactuals"]["r002"]["accuracy"]  # two paths agree
        for part in ("r001/sft/actor.safetensors", "r002/judge/judge.safetensors"):
            assert (out / name / part).is_file(), part
    assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(res))


def test_the_embedded_base_reuses_the_labs_sft_and_judge(base_study, lab_run, lab_run_r002):
    """Taken from the labs, not trained again: the same measurements the labs' own evaluation made."""
    emb = base_study["result"]["bases"]["embedded"]
    assert emb["sft"]["trained_in"] == str(lab_run.run) and emb["judge"]["trained_in"] == str(lab_run_r002.run)
    assert base_study["result"]["bases"]["control"]["sft"]["trained_in"] == "this study"
    lab_eval = json.loads((lab_run.run / "evaluation" / "results.json").read_text())
    assert emb["sft"]["greedy"]["rubric_success"] == lab_eval["policies"]["sft"]["metrics"]["test"]["rubric_success"]
    r002_eval = json.loads((lab_run_r002.run / "evaluation" / "results.json").read_text())
    assert emb["judge"]["test_accuracy"] == r002_eval["judge_test"]["accuracy"]


def test_a_lab_state_from_other_inputs_is_refused(base_study, lab_run, tmp_path):
    from rlhf import lab
    from rlhf.corpus import load_corpus

    fake = tmp_path / "run"
    (fake / "sft").mkdir(parents=True)
    state = lab_run.run / "sft" / "state-continuous.pt.gz"
    (fake / "sft" / state.name).write_bytes(state.read_bytes())
    manifest = json.loads(state.with_name(state.name + ".json").read_text())
    manifest["identity"]["config"] = "0" * 64  # trained with another profile
    (fake / "sft" / (state.name + ".json")).write_text(json.dumps(manifest))
    run = base_study["out"] / "embedded" / "r001"
    ctx = lab.Context(run, lab_run.profile, base_study["out"] / "bases" / "embedded", load_corpus(run / "corpus"))
    with pytest.raises(bs.BaseStudyError, match="not trained from what this study trains from.*config"):
        bs.trained_in_lab(ctx, fake, "sft", "actor")
    with pytest.raises(bs.BaseStudyError, match="no finished judge stage"):
        bs.trained_in_lab(ctx, fake, "judge", "judge")


def test_the_study_never_overwrites_its_results(base_study):
    before = (base_study["out"] / "results.json").read_bytes()
    with pytest.raises(FileExistsError, match="already ran"):
        bs.run_base_study(base_study["out"])
    assert (base_study["out"] / "results.json").read_bytes() == before


def test_the_command_prints_the_table(base_study, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(bs, "run_base_study", lambda out, reuse=None: base_study["result"])
    assert cli.main(["base-study", "--out", str(tmp_path / "x")]) == 0
    out = capsys.readouterr().out
    assert "conflict (1d)" in out and "control" in out
    emb = base_study["result"]["bases"]["embedded"]
    assert f"{emb['judge']['variants_1_2_4']:.3f}" in out


def test_verdict_reports_a_failed_bound(base_study):
    broken = copy.deepcopy(base_study["result"]["bases"]["embedded"])
    broken["judge"]["variants_1_2_4"] = 0.84
    v = bs.verdict(broken)
    assert v["judge_r002_variants_1_2_4"] == {"value": 0.84, "at_least": 0.85, "holds": False}
    assert v["judge_r002_test_accuracy"]["holds"] is (broken["judge"]["test_accuracy"] >= 0.90)


def test_the_judge_is_never_measured_on_r001(tmp_path, embedded_profile, embedded_dir):
    from rlhf.lab import open_context

    ctx = open_context(tmp_path / "run", embedded_profile, model_dir=embedded_dir, revision="r001")
    with pytest.raises(bs.BaseStudyError, match="r002"):
        bs.measure_judge(ctx)
    assert not (tmp_path / "run" / "judge").exists()


def test_a_rebuilt_base_that_differs_from_the_committed_one_is_refused(tmp_path, monkeypatch):
    real = bs.read_json
    monkeypatch.setattr(bs, "read_json", lambda p: {"files": {**real(p)["files"], "tokenizer.json": "0" * 64}})
    with pytest.raises(bs.BaseStudyError, match="embedded_expected.json"):
        bs.build_base(tmp_path, "embedded")
