"""Shortcut audit (shortcut-audit-v1, SPEC §11): the counterfactual prompt builders, the hash
checks, results.json, and the audit of the session's embedded lab judge (accuracies recorded)."""

import json
import random

import pytest
import torch

from rlhf import corpus as C
from rlhf import rubric
from rlhf import shortcut as S

pytestmark = pytest.mark.unit

KEYS = ("a_family_permuted", "b_heading_independent", "c_both", "d_conflict")


def _view(revision):
    view = C.Corpus.build(revision).evaluation_view()
    return view.test_pairs(), view.labels("pair", "test")


@pytest.fixture(scope="module")
def r001_sets():
    pairs, labels = _view("r001")
    return pairs, labels, S.build_counterfactuals(pairs, labels, "r001")


def test_seed_and_derangement():
    assert S.SHORTCUT_AUDIT_SEED == 5049 and S.VERSION == "shortcut-audit-v1"
    perm = S.derangement(240, random.Random(5049))
    assert sorted(perm) == list(range(240)) and all(p != i for i, p in enumerate(perm))
    assert perm == S.derangement(240, random.Random(5049))


def test_family_number_really_changes(r001_sets):
    pairs, labels, sets = r001_sets
    assert list(sets) == ["r001", *KEYS]
    assert [r["prompt"] for r in sets["r001"]] == [r["prompt"] for r in pairs]
    printed = {}
    for orig, new in zip(sets["r001"], sets["a_family_permuted"]):
        f0, p0, n0, rest0 = C.heading_parts(orig["prompt"])
        f1, p1, n1, rest1 = C.heading_parts(new["prompt"])
        assert p1 != p0 and (f1, n1, rest1) == (f0, n0, rest0)  # only the number changed
        assert (new["chosen"], new["rejected"], new["variant"]) == (orig["chosen"], orig["rejected"], orig["variant"])
        printed.setdefault(p0, set()).add(p1)
    assert all(len(v) == 1 for v in printed.values())  # one new number per family (a permutation)
    assert len({next(iter(v)) for v in printed.values()}) == len(printed) == 36
    cues = S.cue_counts(sets["a_family_permuted"], sets["r001"], labels)
    assert cues["prompts_changed"] == 180 and cues["printed_number_in_true_action_range"] < 90


def test_heading_and_note_drawn_independently_of_the_variant(r001_sets):
    pairs, labels, sets = r001_sets
    forms = {v: set() for v in C.PAIR_VARIANTS}
    for orig, new in zip(sets["r001"], sets["b_heading_independent"]):
        f0, p0, n0, rest0 = C.heading_parts(orig["prompt"])
        f1, p1, n1, rest1 = C.heading_parts(new["prompt"])
        assert (p1, rest1) == (p0, rest0) and (f1, n1) in S.AUDIT_HEADING_CHOICES["r001"]
        forms[new["variant"]].add(f1)
    assert all(fs == {0, 1, 2} for fs in forms.values())
    cues = S.cue_counts(sets["b_heading_independent"], sets["r001"], labels)
    assert cues["heading_follows_r001_variant_rule"] < 36 and cues["prompts_changed"] > 144
    for a, b, c in zip(sets["a_family_permuted"], sets["b_heading_independent"], sets["c_both"]):
        fa, pa, na, _ = C.heading_parts(a["prompt"])
        fb, pb, nb, rest = C.heading_parts(b["prompt"])
        assert c["prompt"] == C.render_heading(fb, pa, nb) + rest  # c = a and b together


def test_conflict_carries_the_rejected_answers_situation(r001_sets):
    pairs, labels, sets = r001_sets
    by_id = {lab["document_id"]: lab for lab in labels}
    orig = {r["document_id"]: r for r in sets["r001"]}
    conflict = sets["d_conflict"]
    assert len(conflict) == 108 and {r["variant"] for r in conflict} == {1, 2, 4}
    for rec in conflict:
        lab, o = by_id[rec["document_id"]], orig[rec["document_id"]]
        shown = lab["rejected_design"]["action"]
        assert shown == lab["wrong_action"] == rec["shown_action"] != lab["action"]
        assert rubric.CONTEXTS[shown] in rec["prompt"] and rubric.CONTEXTS[lab["action"]] not in rec["prompt"]
        assert rec["prompt"] == o["prompt"].replace(rubric.CONTEXTS[lab["action"]], rubric.CONTEXTS[shown])
        assert C.heading_parts(rec["prompt"])[:3] == C.heading_parts(o["prompt"])[:3]
        # "chosen" is now the answer correct for the shown situation: the original rejected one
        assert (rec["chosen"], rec["rejected"]) == (o["rejected"], o["chosen"])
        assert rubric.evaluate(rec["chosen"], "eos", shown)["rubric_success"]
        assert not rubric.evaluate(rec["rejected"], "eos", shown)["rubric_success"]


def test_variants_0_and_3_are_excluded_from_conflict(r001_sets):
    pairs, labels, _ = r001_sets
    for rec, lab in zip(pairs, labels):
        if lab["variant"] in (0, 3):
            with pytest.raises(ValueError, match="no conflict counterfactual"):
                S.conflict_record(rec, lab)
        else:
            assert S.conflict_record(rec, lab)["chosen"] == rec["rejected"]


def test_builders_are_deterministic_and_work_on_r002(r001_sets):
    pairs, labels, sets = r001_sets
    assert S.build_counterfactuals(pairs, labels, "r001") == sets
    assert S.build_counterfactuals(pairs, labels, "r001", seed=1)["c_both"] != sets["c_both"]
    p2, l2 = _view("r002")
    s2 = S.build_counterfactuals(p2, l2, "r002")
    assert list(s2) == ["r002", *KEYS] and len(s2["d_conflict"]) == 108
    assert all(C.heading_parts(r["prompt"])[2] in C.R002_NOTE_NUMBERS for r in s2["b_heading_independent"])
    with pytest.raises(ValueError, match="same documents"):
        S.build_counterfactuals(pairs[1:], labels, "r001")


def _untrained_run(tmp_path, revision):
    """A run folder with a corpus, the embedded base and an (untrained) saved judge."""
    from rlhf.lab import open_context
    from rlhf.roles import save_role

    ctx = open_context(tmp_path / revision, "embedded", revision=revision)
    save_role(ctx.role("judge"), ctx.run / "judge" / "judge.safetensors", ctx.identity(stage="judge"))
    return ctx


def test_audit_end_to_end_on_r002_writes_once(tmp_path):
    torch.set_num_threads(1)
    ctx = _untrained_run(tmp_path, "r002")
    out = S.run_shortcut_audit(ctx)
    path = ctx.run / "shortcut_audit" / "results.json"
    assert json.loads(path.read_text()) == json.loads(json.dumps(out))
    assert tuple(out) == S.RESULT_KEYS and out["corpus"]["revision"] == "r002" and out["baseline"] == "r002"
    assert out["seeds"]["corpus_prompt_seeds"] == {"family_permutation": 4902, "heading_and_note": 4903}
    assert out["order"] == ["r002", *KEYS] and out["unchanged"] and out["hashes_before"] == out["hashes_after"]
    with pytest.raises(FileExistsError):
        S.run_shortcut_audit(ctx)


@pytest.fixture(scope="module")
def tampered_run(tmp_path_factory):
    """One untrained r001 run for the tests that change its corpus while an audit runs; each
    puts back what it changed, whatever the outcome."""
    return _untrained_run(tmp_path_factory.mktemp("tampered"), "r001")


def audit_while(ctx, change, out_dir):
    """Run the audit with `change(corpus_root)` done while it scores (the scores are stubbed)."""
    calls = []

    def tamper(judge, records, c):
        if not calls:
            change(c.corpus.root)
        calls.append(1)
        return [1.0] * len(records)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(S, "score_records", tamper)
        return S.run_shortcut_audit(ctx, out_dir=out_dir)


def test_audit_refuses_a_changed_label_file(tampered_run, tmp_path):
    path = tampered_run.corpus.root / "labels" / "pair" / "test.jsonl"
    original, mode = path.read_bytes(), path.stat().st_mode

    def change(root):  # a label file changes while the audit runs
        path.chmod(0o644)
        path.write_bytes(original + b"\n")

    try:
        with pytest.raises(S.ShortcutAuditError, match="labels/pair/test.jsonl"):
            audit_while(tampered_run, change, tmp_path / "audit")
    finally:
        path.write_bytes(original)
        path.chmod(mode)
    assert not (tmp_path / "audit" / "results.json").exists()


def test_audit_refuses_a_corpus_file_that_appeared_during_it(tampered_run, tmp_path):
    """A file added to the corpus folder while the audit runs is a change like any other: the
    audit refuses, naming it, and writes nothing."""
    added = tampered_run.corpus.root / "labels" / "pair" / "extra.jsonl"
    try:
        with pytest.raises(S.ShortcutAuditError, match=r"\['corpus/labels/pair/extra.jsonl'\] changed"):
            audit_while(tampered_run, lambda root: added.write_text("{}\n"), tmp_path / "audit")
    finally:
        added.unlink(missing_ok=True)
    assert not (tmp_path / "audit" / "results.json").exists()


def test_shortcut_audit_of_the_lab_judge(lab_run, tmp_path, record_result):
    """The embedded lab's frozen judge under every counterfactual (values recorded, not asserted:
    the issue measured ~1.000 on r001 test pairs and ~0 on conflict)."""
    torch.set_num_threads(1)
    out = S.run_shortcut_audit(lab_run, out_dir=tmp_path / "shortcut_audit")
    assert out["version"] == "shortcut-audit-v1" and out["corpus"]["revision"] == lab_run.corpus.revision
    assert out["unchanged"] is True and out["hashes_before"] == out["hashes_after"]
    assert (tmp_path / "shortcut_audit" / "results.json").is_file()
    base = out["baseline"]
    for key in out["order"]:
        res = out["counterfactuals"][key]
        variants = [1, 2, 4] if key == "d_conflict" else [0, 1, 2, 3, 4]
        assert res["variants"] == variants and res["pairs"] == 36 * len(variants)
        assert all(res["pairs_by_variant"][str(v)] == 36 for v in variants)
        assert 0.0 <= res["accuracy"] <= 1.0 and 0 <= res["ties"] <= res["pairs"]
        assert all(0.0 <= a <= 1.0 for a in res["by_variant"].values())
        assert res["meaning"] and res["description"]
        name = "baseline" if key == base else key
        record_result(f"shortcut_{name}_accuracy", res["accuracy"])
        record_result(f"shortcut_{name}_by_variant", res["by_variant"])
        record_result(f"shortcut_{name}_ties", res["ties"])
    # the baseline is the published judge test accuracy (same pairs, same scoring)
    from rlhf.evaluate import judge_test_accuracy
    from rlhf.roles import load_role

    judge = lab_run.role("judge")
    load_role(judge, lab_run.run / "judge" / "judge.safetensors")
    judge.freeze()
    published = judge_test_accuracy(judge, lab_run)
    assert out["counterfactuals"][base]["accuracy"] == pytest.approx(published["accuracy"])
