"""The corpus built in memory (`build_corpus`): every population's documents from the design's
formulas, each input record sealed with its content hash beside its label record."""

from __future__ import annotations

from rlhf import rubric
from rlhf.corpus.design import (
    DEFAULT_REVISION,
    DEMO_VARIANT,
    LOCATIONS,
    N_FAMILIES,
    N_PROBES,
    PAIR_VARIANTS,
    POPULATIONS,
    PROBE_CELLS,
    PROBE_SPLIT,
    ROLLOUT_VARIANTS,
    Revision,
    assign_splits,
    demo_design,
    design_record,
    family_action,
    family_id,
    get_revision,
    make_prompt,
    pair_designs,
    probe_design,
    probe_document_id,
    probe_family_id,
    probe_prompt,
    seal,
    wrong_action,
)

# (input, label) of one document, before sealing: build_corpus adds the content hashes and the
# label's link to its input.
Document = tuple[dict, dict]


def pair_documents(rev: Revision, index: int, split: str) -> list[Document]:
    """The five preference pairs of family ``index`` (variants 0-4, the SPEC §2 table)."""
    fam, a = family_id(index), family_action(index)
    out = []
    for v in PAIR_VARIANTS:
        ch, rj = pair_designs(index, v)
        doc = {"family": fam, "split": split, "document_id": f"{fam}-P{v}", "population": "pair"}
        inp = {
            **doc,
            "prompt": make_prompt(rev, index, v, "pair"),
            "chosen": rubric.render(*ch),
            "rejected": rubric.render(*rj),
        }
        lab = {
            **doc,
            "variant": v,
            "action": a,
            "wrong_action": wrong_action(index),
            "chosen_design": design_record(ch),
            "rejected_design": design_record(rj),
            "chosen_rubric": rubric.evaluate(rubric.render(*ch), "eos", a),
            "rejected_rubric": rubric.evaluate(rubric.render(*rj), "eos", a),
        }
        out.append((inp, lab))
    return out


def demonstration_document(rev: Revision, index: int) -> Document:
    """The SFT demonstration of train family ``index``: target ``response(a, 1, i % 2 == 0)``."""
    fam, a, d = family_id(index), family_action(index), demo_design(index)
    doc = {"family": fam, "split": "train", "document_id": f"{fam}-SFT", "population": "warmstart"}
    return (
        {**doc, "prompt": make_prompt(rev, index, DEMO_VARIANT, "warmstart"), "response": rubric.render(*d)},
        {
            **doc,
            "variant": DEMO_VARIANT,
            "action": a,
            "target_design": design_record(d),
            "target_rubric": rubric.evaluate(rubric.render(*d), "eos", a),
        },
    )


def rollout_documents(rev: Revision, index: int) -> list[Document]:
    """The four rollout prompts of train family ``index`` (variants 11-14): prompts only."""
    fam = family_id(index)
    out = []
    for j, v in enumerate(ROLLOUT_VARIANTS):
        doc = {"family": fam, "split": "train", "document_id": f"{fam}-RL{j}", "population": "rollout"}
        label = {**doc, "variant": v, "action": family_action(index)}
        out.append(({**doc, "prompt": make_prompt(rev, index, v, "rollout")}, label))
    return out


def probe_documents(k: int) -> list[Document]:
    """The four candidates of probe context ``k``, one per (correct, polite) cell, in SPEC order."""
    a = k % 6
    out = []
    for correct, polite in PROBE_CELLS:
        d = probe_design(k, correct, polite)
        doc = {
            "document_id": probe_document_id(k, correct, polite),
            "family": probe_family_id(k),
            "split": PROBE_SPLIT,
            "population": "probe",
        }
        lab = {
            **doc,
            "context_index": k,
            "action": a,
            "wrong_action": (a + 1) % 6,
            "correct": correct,
            "polite": polite,
            "candidate_design": design_record(d),
            "candidate_rubric": rubric.evaluate(rubric.render(*d), "eos", a),
        }
        out.append(({**doc, "prompt": probe_prompt(k), "response": rubric.render(*d)}, lab))
    return out


def build_corpus(revision: str = DEFAULT_REVISION) -> dict:
    """The corpus in memory: {"dataset", "revision", "seed", "families", "probe_families",
    "inputs": {population: {split: [records]}}, "labels": same shape}."""
    rev = get_revision(revision)
    families = assign_splits(rev.seed)
    inputs: dict[str, dict] = {pop: {} for pop in POPULATIONS}
    labels: dict[str, dict] = {pop: {} for pop in POPULATIONS}
    for pop, split in LOCATIONS:
        inputs[pop][split] = []
        labels[pop][split] = []

    def add(pop: str, split: str, documents: list[Document]) -> None:
        for inp, lab in documents:
            inp = seal(inp)
            inputs[pop][split].append(inp)
            labels[pop][split].append(seal({**lab, "input_sha256": inp["content_sha256"]}))

    for i in range(N_FAMILIES):
        split = families[family_id(i)]
        add("pair", split, pair_documents(rev, i, split))
        if split == "train":
            add("warmstart", split, [demonstration_document(rev, i)])
            add("rollout", split, rollout_documents(rev, i))
    for k in range(N_PROBES):
        add("probe", PROBE_SPLIT, probe_documents(k))
    return {
        "dataset": rev.dataset,
        "revision": rev.name,
        "seed": rev.seed,
        "families": families,
        "probe_families": [probe_family_id(k) for k in range(N_PROBES)],
        "inputs": inputs,
        "labels": labels,
    }
