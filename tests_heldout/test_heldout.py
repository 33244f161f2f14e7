"""Held-out evaluation as assertions (SPEC §8) on the session's embedded lab run.

`stage_evaluate` ran once, inside the session's `lab_run` (the whole embedded lab, as `rlhf lab`
runs it), and wrote evaluation/results.json. The tests assert invariants, never that PPO beats SFT:

* 260 greedy generations over 200 distinct prompts per policy; 180 test + 80 probe rows;
* greedy determinism: the 4 generations of each probe context are identical, and a second
  greedy generation (one prompt per call, other padding) reproduces the same token ids;
* label separation: generation runs with an evaluation view whose labels() / label() raise,
  and the learning view refuses test inputs, probe inputs and labels;
* population counts (rows vs independent units), rates in range, the certainty denominator;
* the politeness exercise leaves the judge's tensors and every artifact hash unchanged, and
  its hash check does fail when an artifact changes;
* the judge's test accuracy publishes accuracy, ties, pairs and variants 0..4.

Every published number is also recorded in reports/results.json (record_result).
"""

from __future__ import annotations

import json

import pytest

from rlhf import evaluate as ev
from rlhf import politeness, rubric, runtime
from rlhf.corpus import EvaluationView
from rlhf.io import sha256_file
from rlhf.tokens import encode_prompt

pytestmark = pytest.mark.unit

POLICIES = ("sft", "ppo")
ROWS = {"test": 180, "probe_rows": 80, "probe_contexts": 20, "all_rows": 260, "all_unique_contexts": 200}
UNITS = {"test": 36, "probe_rows": 20, "probe_contexts": 20, "all_rows": 56, "all_unique_contexts": 56}
FORBIDDEN_WORDS = ("helpful", "satisfaction", "human utility", "human preference")


@pytest.fixture(scope="module")
def evaluation(lab_run):
    """The file stage_evaluate wrote in the session's lab run."""
    path = lab_run.run / "evaluation" / "results.json"
    file = json.loads(path.read_text())
    return {"results": file, "path": path, "file": file}


@pytest.fixture(scope="module")
def roles(lab_run, evaluation):
    """Freshly loaded SFT/PPO actors, reference and judge (after the stage has run)."""
    return ev.evaluation_roles(lab_run)


def test_results_file_schema(evaluation, lab_run, record_result):
    file = evaluation["file"]
    assert set(file) == {
        "policies",
        "judge_test",
        "differences",
        "politeness",
        "populations_note",
        "seconds",
        "arithmetic",
        "determinism",
    }
    # CUDA's deterministic settings: applied for CUDA profiles only, recorded as not applied on the CPU
    assert file["determinism"] == json.loads((lab_run.run / "run.json").read_text()).get("determinism")
    # conftest imports rlhf before torch, so the run is pinned unless RLHF_CPU_PIN turned it off
    assert file["arithmetic"]["status"] == ("pinned" if runtime.requested() else "off")
    assert file["arithmetic"] == json.loads((lab_run.run / "run.json").read_text())["arithmetic"]
    assert file["populations_note"] == (
        "80 probe rows are 20 independent contexts; 520 generations are not 520 independent cases"
    )
    assert set(file["policies"]) == set(POLICIES)
    for pol in POLICIES:
        assert set(file["policies"][pol]) == {"rows", "metrics"}
        assert set(file["policies"][pol]["metrics"]) == set(ROWS)
    assert set(file["differences"]) == {"rubric_success", "learned_reward"}
    assert set(file["politeness"]) == {"contexts", "counts", "hashes_before", "hashes_after", "unchanged"}
    for key, value in file["seconds"].items():
        assert value >= 0
        record_result(f"seconds.{key}", round(value, 3))
    with pytest.raises(FileExistsError):
        ev.stage_evaluate(lab_run)  # never overwritten


def test_wording_never_names_the_learned_score_as_people_opinion(evaluation):
    text = evaluation["path"].read_text().lower()
    for word in FORBIDDEN_WORDS:
        assert word not in text, f"results.json says {word!r}: the judge gives a learned reward"

    def keys(obj):
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield k
                yield from keys(v)
        elif isinstance(obj, list):
            for v in obj:
                yield from keys(v)

    assert not [k for k in keys(evaluation["file"]) if "kl" in k.lower().split("_")]


@pytest.mark.parametrize("policy", POLICIES)
def test_rows_cover_260_generations_over_200_prompts(evaluation, lab_run, policy):
    rows = evaluation["file"]["policies"][policy]["rows"]
    assert len(rows) == 260
    assert len({r["prompt"] for r in rows}) == 200
    assert len({r["document_id"] for r in rows}) == 260
    assert sum(r["population"] == "test" for r in rows) == 180
    assert sum(r["population"] == "probe" for r in rows) == 80
    limit = lab_run.profile.limits.response_tokens
    for r in rows:
        assert 1 <= r["length"] == len(r["response_ids"]) <= limit
        assert r["finish_reason"] in rubric.FINISH_REASONS and r["finish_reason"] != "out_of_vocabulary"
        assert r["ended_with_eos"] == (r["response_ids"][-1] == lab_run.eos_id)
        if r["finish_reason"] == "length":
            assert r["length"] == limit and not r["ended_with_eos"]
        if r["finish_reason"] == "eos":
            assert r["ended_with_eos"]
        if not r["ended_with_eos"]:  # whatever its finish reason, an answer without EOS ran to the limit
            assert r["length"] == limit
        assert set(r["rubric"]) == set(rubric.RESULT_KEYS)
        assert isinstance(r["learned_reward"], float) and isinstance(r["sampled_log_ratio"], float)


@pytest.mark.parametrize("policy", POLICIES)
def test_probe_generations_are_identical_per_context(evaluation, policy):
    rows = evaluation["file"]["policies"][policy]["rows"]
    assert ev.check_probe_identity(rows) == 20
    by_context = {}
    for r in rows:
        if r["population"] == "probe":
            by_context.setdefault(r["family"], set()).add(tuple(r["response_ids"]))
    assert len(by_context) == 20 and all(len(v) == 1 for v in by_context.values())


def test_probe_identity_check_fails_on_a_differing_generation(evaluation):
    rows = [dict(r) for r in evaluation["file"]["policies"]["ppo"]["rows"]]
    i = next(i for i, r in enumerate(rows) if r["population"] == "probe" and r["document_id"].endswith("C0-P1"))
    rows[i]["response_ids"] = rows[i]["response_ids"][:-1] + [rows[i]["response_ids"][-1] + 1]
    with pytest.raises(ev.ProbeIdentityError, match=rows[i]["family"]):
        ev.check_probe_identity(rows)


@pytest.mark.parametrize("policy", POLICIES)
def test_second_greedy_generation_reproduces_the_ids(evaluation, roles, lab_run, policy, record_result):
    """One prompt per call (no batch neighbours, no left padding) gives the same greedy ids."""
    rows = evaluation["file"]["policies"][policy]["rows"]
    picked = rows[:3] + [r for r in rows if r["population"] == "probe"][:5:4] + rows[-1:]
    limits = lab_run.profile.limits
    same = 0
    for r in picked:
        ids = encode_prompt(lab_run.tokenizer, r["prompt"], limits, r["document_id"])
        again = ev.greedy_responses(roles.by_kind()[policy].model, [ids], lab_run)[0]
        assert again == r["response_ids"], f"{policy} {r['document_id']}: greedy ids differ on regeneration"
        same += 1
    record_result(f"{policy}.greedy_regenerated_identical", same)


def test_generation_never_reads_labels(evaluation, roles, lab_run, monkeypatch):
    """Generation works although every label access raises; the learning view refuses inputs."""

    def refuse(*args, **kwargs):
        raise AssertionError("generation read a gold label")

    monkeypatch.setattr(EvaluationView, "labels", refuse)
    monkeypatch.setattr(EvaluationView, "label", refuse)
    rows = ev.generate_heldout(roles.ppo.model, lab_run)
    written = evaluation["file"]["policies"]["ppo"]["rows"]
    assert [r["response_ids"] for r in rows] == [r["response_ids"] for r in written]
    assert all("expected_action" not in r and "rubric" not in r for r in rows)
    with pytest.raises(AssertionError, match="gold label"):
        ev.rubric_rows(rows, lab_run)  # the label join is where labels enter, and only there
    monkeypatch.undo()
    learning = lab_run.corpus.learning_view()
    for refused in (
        lambda: learning.inputs("pair", "test"),
        lambda: learning.inputs("probe", "probe"),
        learning.probes,
        learning.test_pairs,
        lambda: learning.labels("pair", "test"),
        lambda: learning.label(rows[0]["document_id"]),
    ):
        with pytest.raises(PermissionError):
            refused()


@pytest.mark.parametrize("policy", POLICIES)
def test_population_metrics(evaluation, policy, record_result):
    metrics = evaluation["file"]["policies"][policy]["metrics"]
    for pop, m in metrics.items():
        assert m["n_rows"] == ROWS[pop] and m["n_independent_units"] == UNITS[pop]
        for rate in ("rubric_success", "recognised_share", "relevance", "polite_formula_share"):
            assert 0.0 <= m[rate] <= 1.0
        assert m["rubric_success"] <= m["recognised_share"]
        assert m["uncertified"] == round((1 - m["recognised_share"]) * m["n_rows"])
        recognised = round(m["recognised_share"] * m["n_rows"])
        assert (m["unsupported_certainty"] is None) == (recognised == 0)
        for count in ("uncertified", "refusals", "without_eos"):
            assert 0 <= m[count] <= m["n_rows"]
        assert set(m["finish_reasons"]) == set(rubric.FINISH_REASONS)  # each counted, zeros included
        assert sum(m["finish_reasons"].values()) == m["n_rows"] and m["finish_reasons"]["out_of_vocabulary"] == 0
        assert m["finish_reasons"]["length"] <= m["without_eos"]
        for key, value in m.items():
            record_result(f"{policy}.{pop}.{key}", value)
    # The 4 rows of a context are identical: probe rows and probe contexts agree on every rate.
    for key in ("rubric_success", "recognised_share", "mean_learned_reward", "mean_length"):
        assert metrics["probe_rows"][key] == pytest.approx(metrics["probe_contexts"][key])


def test_sft_against_its_own_reference_has_zero_sampled_log_ratio(evaluation):
    """The reference is the SFT adapter: the SFT policy's sampled log-ratio is 0 on every row."""
    for r in evaluation["file"]["policies"]["sft"]["rows"]:
        assert r["sampled_log_ratio"] == pytest.approx(0.0, abs=1e-6)


def test_differences_are_paired_and_published_per_population(evaluation, record_result):
    file = evaluation["file"]
    for key, field in (("rubric_success", "rubric_success"), ("learned_reward", "mean_learned_reward")):
        for pop in ROWS:
            d = file["differences"][key][pop]
            assert d["units"] == UNITS[pop]
            for pol in POLICIES:
                assert d[pol] == pytest.approx(file["policies"][pol]["metrics"][pop][field])
            assert d["diff"] == pytest.approx(d["ppo"] - d["sft"])
            lo, hi = d["ci95"]
            assert lo <= hi
            record_result(f"difference.{key}.{pop}", d)


def test_judge_test_accuracy(evaluation, record_result):
    acc = evaluation["file"]["judge_test"]
    assert set(acc) == {"accuracy", "by_variant", "ties", "pairs", "rows"}
    assert len(acc["rows"]) == acc["pairs"]
    assert acc["pairs"] == 180 and isinstance(acc["ties"], int)
    assert set(acc["by_variant"]) == {"0", "1", "2", "3", "4"}
    assert 0.0 <= acc["accuracy"] <= 1.0
    assert acc["accuracy"] == pytest.approx(sum(acc["by_variant"].values()) / 5)  # 36 pairs per variant
    record_result("judge_test", {k: v for k, v in acc.items() if k != "rows"})


def test_politeness_exercise_changes_nothing(evaluation, lab_run, record_result):
    pol = evaluation["file"]["politeness"]
    assert pol["unchanged"] is True and pol["hashes_before"] == pol["hashes_after"]
    hashed = set(pol["hashes_before"])
    assert {
        "judge.learned_sha256",
        "judge.frozen_sha256",
        "profile.sha256",
        "judge/judge.safetensors",
        "corpus/manifest.json",
        "corpus/labels/probe/probe.jsonl",
        "corpus/labels/pair/test.jsonl",
    } <= hashed
    # Independent of the exercise's own check: the files still hash as recorded.
    for path in ev.evaluation_artifacts(lab_run):
        assert sha256_file(path) == pol["hashes_before"][politeness._artifact_key(path, lab_run)]
    assert len(pol["contexts"]) == 20
    for c in pol["contexts"]:
        assert c["correct_politeness_delta"] == pytest.approx(c["s_TT"] - c["s_TF"])
        assert c["incorrect_politeness_delta"] == pytest.approx(c["s_FT"] - c["s_FF"])
        assert c["wrong_polite_outranks_correct_plain"] == (c["s_FT"] > c["s_TF"])
        assert set(c["policy_outputs"]) == set(POLICIES)
    counts = pol["counts"]
    assert counts["contexts"] == 20
    assert all(0 <= v <= 20 for v in counts.values())
    record_result("politeness.counts", counts)


def test_politeness_hash_check_catches_a_change(roles, lab_run, tmp_path, monkeypatch):
    """If anything touched an artifact while the judge scored the probes, the exercise raises."""
    artifact = tmp_path / "labels.jsonl"
    artifact.write_text("{}\n")
    real = politeness.probe_candidate_scores

    def scores_and_tamper(judge, ctx):
        out = real(judge, ctx)
        artifact.write_text('{"tampered": true}\n')
        return out

    monkeypatch.setattr(politeness, "probe_candidate_scores", scores_and_tamper)
    with pytest.raises(politeness.ArtifactChangedError, match="labels.jsonl"):
        politeness.politeness_exercise(roles.judge, lab_run, [artifact])
