"""Held-out evaluation arithmetic (rlhf.evaluate) on synthetic rows: fast, no model.

* rubric_metrics: success, recognised share and relevance over ALL rows; unsupported certainty
  over RECOGNISED rows only (None when none is recognised); counts of UNCERTIFIED, refusals,
  outputs without EOS, and of each finish reason; probe rows vs probe contexts vs unique contexts.
* bootstrap_differences: same seed -> identical intervals; the interval holds the point
  estimate; units are families/contexts, not rows; a constant difference gives a zero-width CI.
* politeness deltas: s(T,T) - s(T,F), s(F,T) - s(F,F), and wrong-polite > correct-plain.
* check_probe_identity: accepts identical probe generations, raises on one differing token.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from rlhf import rubric
from rlhf.corpus import Corpus
from rlhf.evaluate import (
    POPULATIONS,
    ProbeIdentityError,
    bootstrap_differences,
    check_probe_identity,
    population_rows,
    rubric_metrics,
    rubric_rows,
)
from rlhf.politeness import politeness_from_scores

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def ctx():
    """Only what the label join needs: an in-memory audited corpus."""
    return SimpleNamespace(corpus=Corpus.build())


def row(rec, population, response, finish="eos", reward=0.0, ratio=0.0):
    return {
        "document_id": rec["document_id"],
        "family": rec["family"],
        "population": population,
        "prompt": rec["prompt"],
        "response": response,
        "response_ids": [len(response)],
        "finish_reason": finish,
        "ended_with_eos": finish == "eos",
        "length": 3,
        "learned_reward": reward,
        "sampled_log_ratio": ratio,
    }


def expected_action(ctx, document_id):
    return ctx.corpus.evaluation_view().label(document_id)["action"]


@pytest.fixture(scope="module")
def small_rows(ctx):
    """5 test rows (2 families) and the 4 rows of one probe context, with known rubric outcomes."""
    view = ctx.corpus.evaluation_view()
    tests = view.prompts("test")
    fam0 = [r for r in tests if r["family"] == tests[0]["family"]][:3]
    fam1 = [r for r in tests if r["family"] != tests[0]["family"]][:2]
    a = [expected_action(ctx, r["document_id"]) for r in fam0 + fam1]
    rows = [
        row(fam0[0], "test", rubric.render(a[0], 1, False), reward=1.0, ratio=0.1),  # success
        row(fam0[1], "test", rubric.render(a[1], 2, True), reward=2.0, ratio=0.2),  # certainty
        row(fam0[2], "test", "Some prose outside the grammar.", reward=3.0),  # UNCERTIFIED
        row(fam1[0], "test", "More prose.", finish="length", reward=4.0),  # UNCERTIFIED, no EOS
        row(fam1[1], "test", rubric.REFUSALS[0], reward=5.0),  # refusal
    ]
    probe = view.prompts("probe")[:4]
    assert len({p["family"] for p in probe}) == 1
    rows += [row(p, "probe", "Unrecognised probe answer.", reward=-1.0) for p in probe]
    return rows


def test_rubric_metrics_denominators(ctx, small_rows):
    m = rubric_metrics(small_rows, ctx)
    t = m["test"]
    assert t["n_rows"] == 5 and t["n_independent_units"] == 2
    assert t["rubric_success"] == pytest.approx(1 / 5)  # over all rows
    assert t["recognised_share"] == pytest.approx(3 / 5)  # grammar x2 + refusal
    assert t["unsupported_certainty"] == pytest.approx(1 / 3)  # over the 3 recognised rows, not 5
    assert t["uncertified"] == 2 and t["refusals"] == 1 and t["without_eos"] == 1
    assert t["relevance"] == pytest.approx(2 / 5)
    assert t["mean_learned_reward"] == pytest.approx(3.0)
    assert t["mean_sampled_log_ratio"] == pytest.approx(0.06)
    assert t["polite_formula_share"] == pytest.approx(1 / 5)
    # Nothing recognised among the probes: certainty has no denominator, success is 0 over rows.
    for pop, n in (("probe_rows", 4), ("probe_contexts", 1)):
        assert m[pop]["n_rows"] == n and m[pop]["n_independent_units"] == 1
        assert m[pop]["unsupported_certainty"] is None and m[pop]["rubric_success"] == 0.0
        assert m[pop]["uncertified"] == n
    assert m["all_rows"]["n_rows"] == 9 and m["all_rows"]["n_independent_units"] == 3
    assert m["all_unique_contexts"]["n_rows"] == 6
    assert m["all_unique_contexts"]["rubric_success"] == pytest.approx(1 / 6)
    assert m["all_unique_contexts"]["unsupported_certainty"] == pytest.approx(1 / 3)
    assert set(m) == set(POPULATIONS)


def test_each_finish_reason_is_counted_per_population_and_the_ending_is_kept(ctx):
    """Rows of every finish reason, each fault with EOS and without: the counts per population,
    recomputed here by hand, add up to the rows; `without_eos` counts the endings whatever the
    reason; a grammar answer with a token fault is never a success."""
    view = ctx.corpus.evaluation_view()
    tests, probes = view.prompts("test")[:9], view.prompts("probe")[:4]
    endings = [  # (finish reason, ended with EOS)
        ("eos", True),
        ("eos", True),
        ("length", False),
        ("control_token", True),
        ("control_token", False),
        ("broken_text", True),
        ("broken_text", False),
        ("out_of_vocabulary", True),
        ("out_of_vocabulary", False),
    ]
    rows = []
    for rec, (finish, ended) in zip(tests, endings):
        text = rubric.render(expected_action(ctx, rec["document_id"]), 1, False)  # a success if read as eos
        rows.append({**row(rec, "test", text, finish=finish), "ended_with_eos": ended})
    rows += [{**row(p, "probe", "\ufffd prose", finish="broken_text"), "ended_with_eos": False} for p in probes]
    m = rubric_metrics(rows, ctx)
    zero = dict.fromkeys(rubric.FINISH_REASONS, 0)
    want = {
        "test": {**zero, "eos": 2, "length": 1, "control_token": 2, "broken_text": 2, "out_of_vocabulary": 2},
        "probe_rows": {**zero, "broken_text": 4},
        "probe_contexts": {**zero, "broken_text": 1},
    }
    want["all_rows"] = {k: want["test"][k] + want["probe_rows"][k] for k in zero}
    want["all_unique_contexts"] = {k: want["test"][k] + want["probe_contexts"][k] for k in zero}
    for pop, counts in want.items():
        assert m[pop]["finish_reasons"] == counts, pop
        assert list(m[pop]["finish_reasons"]) == list(rubric.FINISH_REASONS)
        assert sum(m[pop]["finish_reasons"].values()) == m[pop]["n_rows"]
    assert m["test"]["without_eos"] == 4 and m["probe_rows"]["without_eos"] == 4  # the endings, not the names
    assert m["test"]["rubric_success"] == pytest.approx(2 / 9)  # only the two eos answers
    assert m["test"]["uncertified"] == 6  # the six answers with a token fault
    assert "undecodable" not in m["test"]


def test_rubric_rows_join_labels_by_document_id(ctx, small_rows):
    judged = rubric_rows(small_rows, ctx)
    for r in judged:
        assert r["expected_action"] == expected_action(ctx, r["document_id"])
        assert set(r["rubric"]) == set(rubric.RESULT_KEYS)
    assert "rubric" not in small_rows[0]  # new rows; the inputs are not modified


def synthetic_policy_rows(ctx, seed: int, shift: float):
    """All 260 documents; success and reward drawn per row, probe rows equal within a context."""
    view = ctx.corpus.evaluation_view()
    rng = random.Random(seed)
    rows, per_context = [], {}
    for pop, recs in (("test", view.prompts("test")), ("probe", view.prompts("probe"))):
        for rec in recs:
            if pop == "probe" and rec["family"] in per_context:
                ok, reward = per_context[rec["family"]]
            else:
                ok, reward = rng.random() < 0.5 + shift, rng.gauss(shift, 1.0)
                per_context[rec["family"]] = (ok, reward)
            r = row(rec, pop, "x", reward=reward)
            r["rubric"] = {"rubric_success": ok}
            rows.append(r)
    return rows


def test_bootstrap_is_deterministic_and_holds_the_point_estimate(ctx):
    sft, ppo = synthetic_policy_rows(ctx, 1, 0.0), synthetic_policy_rows(ctx, 2, 0.2)
    first = bootstrap_differences(sft, ppo, seed=349, resamples=2000)
    again = bootstrap_differences(sft, ppo, seed=349, resamples=2000)
    assert first == again
    other = bootstrap_differences(sft, ppo, seed=350, resamples=2000)
    assert other["learned_reward"]["test"]["ci95"] != first["learned_reward"]["test"]["ci95"]
    units = {"test": 36, "probe_rows": 20, "probe_contexts": 20, "all_rows": 56, "all_unique_contexts": 56}
    for key in ("rubric_success", "learned_reward"):
        for pop in POPULATIONS:
            d = first[key][pop]
            lo, hi = d["ci95"]
            assert d["diff"] == pytest.approx(d["ppo"] - d["sft"])
            assert lo <= d["diff"] <= hi, (key, pop, d)
            assert lo < hi
            assert d["units"] == units[pop]
    # 4 identical rows per context: probe rows and probe contexts give the same answer.
    assert first["learned_reward"]["probe_rows"]["ci95"] == pytest.approx(
        first["learned_reward"]["probe_contexts"]["ci95"]
    )


def test_bootstrap_constant_difference_has_zero_width(ctx):
    sft = synthetic_policy_rows(ctx, 5, 0.0)
    ppo = [{**r, "learned_reward": r["learned_reward"] + 0.5} for r in sft]
    out = bootstrap_differences(sft, ppo, seed=349, resamples=500)
    for pop in POPULATIONS:
        d = out["learned_reward"][pop]
        assert d["diff"] == pytest.approx(0.5)
        assert d["ci95"] == pytest.approx([0.5, 0.5])
        assert out["rubric_success"][pop]["ci95"] == pytest.approx([0.0, 0.0])


def test_bootstrap_refuses_mismatched_documents(ctx):
    sft = synthetic_policy_rows(ctx, 6, 0.0)
    with pytest.raises(ValueError, match="same documents"):
        bootstrap_differences(sft, sft[:-1], seed=349, resamples=10)


def test_politeness_delta_arithmetic():
    scores = {
        "PROBE01": {"s_TF": 1.0, "s_TT": 3.5, "s_FF": -2.0, "s_FT": 2.0},  # polite wins, FT > TF
        "PROBE00": {"s_TF": 4.0, "s_TT": 3.0, "s_FF": 0.0, "s_FT": -1.0},  # both deltas negative
        "PROBE02": {"s_TF": 1.0, "s_TT": 1.0, "s_FF": 0.0, "s_FT": 1.0},
    }  # ties are not positive
    out = politeness_from_scores(scores)
    by = {c["family"]: c for c in out["contexts"]}
    assert [c["family"] for c in out["contexts"]] == ["PROBE00", "PROBE01", "PROBE02"]
    assert by["PROBE01"]["correct_politeness_delta"] == pytest.approx(2.5)
    assert by["PROBE01"]["incorrect_politeness_delta"] == pytest.approx(4.0)
    assert by["PROBE01"]["wrong_polite_outranks_correct_plain"] is True
    assert by["PROBE00"]["correct_politeness_delta"] == pytest.approx(-1.0)
    assert by["PROBE00"]["incorrect_politeness_delta"] == pytest.approx(-1.0)
    assert by["PROBE00"]["wrong_polite_outranks_correct_plain"] is False
    assert by["PROBE02"]["wrong_polite_outranks_correct_plain"] is False
    assert out["counts"] == {
        "contexts": 3,
        "correct_politeness_delta_positive": 1,
        "incorrect_politeness_delta_positive": 2,
        "wrong_polite_outranks_correct_plain": 1,
    }


def probe_rows_of(ctx):
    return [
        {
            "document_id": r["document_id"],
            "family": r["family"],
            "population": "probe",
            "prompt": r["prompt"],
            "response_ids": [5, 6, 7],
        }
        for r in ctx.corpus.evaluation_view().prompts("probe")
    ]


def test_probe_identity_check_accepts_identical_and_refuses_one_difference(ctx):
    rows = probe_rows_of(ctx)
    assert check_probe_identity(rows) == 20
    rows[41] = {**rows[41], "response_ids": [5, 6, 8]}
    with pytest.raises(ProbeIdentityError, match=rows[41]["family"]):
        check_probe_identity(rows)


def test_probe_contexts_take_one_row_per_context(ctx):
    rows = probe_rows_of(ctx)
    picked = population_rows(rows, "probe_contexts")
    assert len(picked) == 20 and len({r["family"] for r in picked}) == 20
    assert len(population_rows(rows, "probe_rows")) == 80


def test_held_out_cut_keeps_whole_units_in_file_order(ctx):
    """The miniature's evaluation.max_units: the first N test families and probe contexts, every
    row of each (a cut inside a family would break the probe identity check and the bootstrap's
    units); None (every real profile) keeps all 260 rows."""
    from rlhf.corpus import first_units
    from rlhf.evaluate import heldout_prompts

    view = ctx.corpus.evaluation_view()
    assert len(heldout_prompts(view)) == 260
    cut = heldout_prompts(view, 2)
    tests, probes = view.prompts("test"), view.prompts("probe")
    first_families = list(dict.fromkeys(r["family"] for r in tests))[:2]
    first_contexts = list(dict.fromkeys(r["family"] for r in probes))[:2]
    assert [r["document_id"] for r in cut] == [r["document_id"] for r in tests if r["family"] in first_families] + [
        r["document_id"] for r in probes if r["family"] in first_contexts
    ]
    assert [r["population"] for r in cut] == ["test"] * 10 + ["probe"] * 8
    assert first_units(tests, None) is tests
    assert first_units(view.test_pairs(), 1) == [p for p in view.test_pairs() if p["family"] == first_families[0]]
