"""The corpus audit, one SPEC §2 invariant at a time.

Each test takes the built corpus, breaks exactly one invariant in a copy (records re-sealed and
re-linked, so no earlier check is what refuses it) or builds the corpus with a realistic bug in
one SPEC formula, and asserts the audit refuses it with the message of that invariant's check.
Where an earlier check always fires first (the invariant is implied by it), the invariant's own
check function is run alone on the same copy as well.

Already covered elsewhere, not repeated here: a stored content_sha256 that does not match
(test_corpus.py::test_audit_catches_in_memory_violations) and a probe row slipped into a
learning file (test_corpus.py::test_spec_9_1_*).
"""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest

from rlhf import corpus as C

pytestmark = pytest.mark.unit


def patch_table(monkeypatch, name: str, typo) -> None:
    """A typo in one of the design's tables, as the build that follows it and the audit that
    reads it both see it."""
    from rlhf.corpus import build, invariants

    for module in (build, invariants):
        monkeypatch.setattr(module, name, typo)


@pytest.fixture(scope="module")
def built():
    return C.build_corpus()


def _sealed(document: tuple[dict, dict]) -> tuple[dict, dict]:
    """(input, label) with their content hashes, the label linked to its input (as build_corpus does)."""
    inp, lab = document
    inp = {**inp, "content_sha256": C.content_sha256(inp)}
    lab = {**lab, "input_sha256": inp["content_sha256"]}
    return inp, {**lab, "content_sha256": C.content_sha256(lab)}


def _put(corpus: dict, pop: str, split: str, index: int, document: tuple[dict, dict]) -> None:
    inp, lab = _sealed(document)
    corpus["inputs"][pop][split][index] = inp
    corpus["labels"][pop][split][index] = lab


def _family_of_split(corpus: dict, split: str) -> int:
    return C.family_index(next(f for f, s in sorted(corpus["families"].items()) if s == split))


def test_label_not_linked_to_its_input_is_refused(built):
    """Inputs and labels are stored apart and linked by the input's hash: a label re-sealed
    with another document's input_sha256 no longer belongs to its input."""
    bad = copy.deepcopy(built)
    lab = bad["labels"]["rollout"]["train"][5]
    lab["input_sha256"] = bad["inputs"]["rollout"]["train"][6]["content_sha256"]
    lab["content_sha256"] = C.content_sha256(lab)
    with pytest.raises(C.AuditError, match=f"label of document '{lab['document_id']}' is not linked to its input"):
        C.audit(bad)


def test_a_family_in_two_splits_is_refused(built):
    """The three splits' family sets are pairwise disjoint: one pair of a train family moved to
    test, a well-formed test pair in every field, makes the family both train and test."""
    bad = copy.deepcopy(built)
    i = _family_of_split(bad, "train")
    assert bad["inputs"]["pair"]["train"][0]["document_id"] == f"{C.family_id(i)}-P0"
    del bad["inputs"]["pair"]["train"][0], bad["labels"]["pair"]["train"][0]
    inp, lab = _sealed(C.pair_documents(C.get_revision("r001"), i, "test")[0])
    bad["inputs"]["pair"]["test"].append(inp)
    bad["labels"]["pair"]["test"].append(lab)
    with pytest.raises(C.AuditError, match=f"family {C.family_id(i)} has pairs in test but belongs to train"):
        C.audit(bad)


def test_chosen_that_is_no_rubric_success_is_refused(monkeypatch):
    """Every chosen is a rubric success: a typo in the SPEC table (variant 3's chosen with
    unsupported certainty, caution 2 for 1) builds a corpus whose pairs all follow that table."""
    table = C.pair_designs

    def typo(index, variant):
        chosen, rejected = table(index, variant)
        return ((chosen[0], 2, chosen[2]), rejected) if variant == 3 else (chosen, rejected)

    patch_table(monkeypatch, "pair_designs", typo)
    with pytest.raises(C.AuditError, match=r"pair 'OH000-P3': chosen response is not a rubric success \("):
        C.audit(C.build_corpus())


def test_rejected_that_is_a_rubric_success_is_refused(monkeypatch):
    """No rejected is a rubric success: a typo in the SPEC table (variant 1's rejected with the
    family's own action, a for wrong) builds a corpus whose pairs all follow that table."""
    table = C.pair_designs

    def typo(index, variant):
        chosen, rejected = table(index, variant)
        return (chosen, (C.family_action(index), 1, True)) if variant == 1 else (chosen, rejected)

    patch_table(monkeypatch, "pair_designs", typo)
    with pytest.raises(C.AuditError, match="pair 'OH000-P1': rejected response is a rubric success"):
        C.audit(C.build_corpus())


def test_check_preference_alone_refuses_a_swapped_pair(built):
    """The same rule run alone on one pair: chosen and rejected swapped."""
    pair, label = built["inputs"]["pair"]["train"][0], built["labels"]["pair"]["train"][0]
    C.check_preference("pair", pair, label)
    swapped = {**pair, "chosen": pair["rejected"], "rejected": pair["chosen"]}
    with pytest.raises(C.AuditError, match="pair: chosen response is not a rubric success"):
        C.check_preference("pair", swapped, label)
    stored = {**label, "rejected_rubric": label["chosen_rubric"]}
    with pytest.raises(C.AuditError, match="pair: stored rubric results differ from the rubric"):
        C.check_preference("pair", pair, stored)


def test_demonstration_of_a_validation_family_is_refused(built):
    """Demonstrations are exactly the train families: one replaced by a well-formed
    demonstration of a validation family."""
    bad = copy.deepcopy(built)
    _put(
        bad,
        "warmstart",
        "train",
        0,
        C.demonstration_document(C.get_revision("r001"), _family_of_split(bad, "validation")),
    )
    with pytest.raises(C.AuditError, match=r"demonstrations \(168\) are not exactly one per train family"):
        C.audit(bad)


def test_rollout_prompts_of_a_validation_family_are_refused(built):
    """Rollout prompts are exactly the train families': one train family's four replaced by
    the four well-formed rollout prompts of a validation family."""
    bad = copy.deepcopy(built)
    documents = C.rollout_documents(C.get_revision("r001"), _family_of_split(bad, "validation"))
    for j, document in enumerate(documents):
        _put(bad, "rollout", "train", j, document)
    with pytest.raises(C.AuditError, match=r"rollout prompts \(672\) are not exactly variants 11-14 of each train"):
        C.audit(bad)


def test_prompts_that_collide_are_refused(monkeypatch):
    """2040 distinct prompts: r002 with its heading and note drawn independently for each
    document, with replacement, instead of without replacement inside a group (the collision
    the r002 design avoids). Every prompt still follows its revision's formula."""
    rng = random.Random(C.R002_HEADING_SEED)
    variants = (*C.PAIR_VARIANTS, C.DEMO_VARIANT, *C.ROLLOUT_VARIANTS)
    draws = {(i, v): rng.choice(C.R002_HEADING_CHOICES) for i in range(C.N_FAMILIES) for v in variants}

    def with_replacement(index, variant):
        form, note = draws[(index, variant)]
        return C.render_heading(form, C.r002_printed_family(index), note)

    monkeypatch.setitem(C.REVISIONS, "r002", dataclasses.replace(C.REVISIONS["r002"], heading=with_replacement))
    corpus = C.build_corpus("r002")
    prompts = [
        r["prompt"] for pop in ("pair", "warmstart", "rollout") for rs in corpus["inputs"][pop].values() for r in rs
    ]
    n = len(set(prompts))
    assert n < 2040 and len(prompts) == 2040
    with pytest.raises(C.AuditError, match=f"{n} distinct pair/demo/rollout prompts among 2040, expected 2040"):
        C.audit(corpus)


def test_probe_candidate_whose_rubric_result_differs_from_its_design_is_refused(monkeypatch):
    """Every probe's rubric result equals its (correct, polite) design: a typo in the probe
    design (the wrong candidate given the correct action) builds probe rows that follow it."""

    def typo(k, correct, polite):
        return (k % 6, 1, polite)

    patch_table(monkeypatch, "probe_design", typo)
    with pytest.raises(
        C.AuditError,
        match=r"probe row 'PROBE00-C0-P0': rubric result \(True, False\) differs from its \(correct, polite\) "
        r"design \(False, False\)",
    ):
        C.audit(C.build_corpus())


def test_1280_labelled_documents(built):
    """1280 labelled documents (1200 pairs + 80 probe rows): the last probe context's four rows
    removed. The probe-row check refuses it first; the count's own check, run alone, too."""
    bad = copy.deepcopy(built)
    for part in ("inputs", "labels"):
        del bad[part]["probe"]["probe"][-4:]
    with pytest.raises(C.AuditError, match="probe rows 76 are not PROBE00-C1-P0..PROBE19-C0-P1 in order"):
        C.audit(bad)
    C.check_labelled_documents(built)
    with pytest.raises(C.AuditError, match="1276 labelled documents, expected 1280"):
        C.check_labelled_documents(bad)
