"""The audit (`audit`): one `check_*` function per SPEC §2 invariant, run in order, each assuming
the ones before it passed; the first failure raises AuditError naming the offending document."""

from __future__ import annotations

from rlhf import rubric
from rlhf.corpus.design import (
    DEMO_VARIANT,
    EXPECTED,
    INPUT_KEYS,
    LABEL_KEYS,
    LOCATIONS,
    N_PROBES,
    PAIR_VARIANTS,
    PROBE_CELLS,
    PROBE_SPLIT,
    ROLLOUT_VARIANTS,
    SPLITS,
    AuditError,
    Revision,
    assign_splits,
    content_sha256,
    demo_design,
    design_record,
    family_action,
    family_index,
    get_revision,
    make_prompt,
    pair_designs,
    probe_design,
    probe_document_id,
    probe_family_id,
    probe_prompt,
    wrong_action,
)


def _fail(msg: str):
    raise AuditError(msg)


def _records(corpus: dict, part: str, pop: str, split: str) -> list:
    try:
        recs = corpus[part][pop][split]
    except (KeyError, TypeError):
        _fail(f"corpus has no {part}/{pop}/{split}")
    if not isinstance(recs, list) or not all(isinstance(r, dict) for r in recs):
        _fail(f"{part}/{pop}/{split} must be a list of records")
    return recs


def _labels_by_id(corpus: dict) -> dict[str, dict]:
    """Every label record by its document id (unique once check_records passed)."""
    return {r["document_id"]: r for pop, split in LOCATIONS for r in _records(corpus, "labels", pop, split)}


def _pair_families(corpus: dict, split: str) -> set[str]:
    return {r["family"] for r in _records(corpus, "inputs", "pair", split)}


def _pair_counts(corpus: dict) -> dict[str, int]:
    return {s: len(_records(corpus, "inputs", "pair", s)) for s in SPLITS}


def check_identity(corpus: dict) -> Revision:
    """Rule: the corpus names an implemented revision, with that revision's dataset and seed,
    holds inputs and labels at exactly the six LOCATIONS, and lists probe families PROBE00..PROBE19.
    Returns the revision."""
    rev = get_revision(corpus.get("revision"))
    if corpus.get("dataset") != rev.dataset or corpus.get("seed") != rev.seed:
        _fail(
            f"dataset/seed {corpus.get('dataset')!r}/{corpus.get('seed')!r} do not match "
            f"revision {rev.name} ({rev.dataset}, seed {rev.seed})"
        )
    for part in ("inputs", "labels"):
        shape = {(p, s) for p, d in (corpus.get(part) or {}).items() for s in (d or {})}
        if shape != set(LOCATIONS):
            _fail(f"{part} locations {sorted(shape)} differ from {sorted(LOCATIONS)}")
    probe_fams = [probe_family_id(k) for k in range(N_PROBES)]
    if corpus.get("probe_families") != probe_fams:
        _fail(f"probe_families must be {probe_fams[0]}..{probe_fams[-1]}")
    return rev


def check_probe_isolation(corpus: dict) -> None:
    """Rule (SPEC §2, §9.1): probe families are disjoint from all others: no input or label
    outside the probe location carries a probe's document id, family or population."""
    probe_fams = [probe_family_id(k) for k in range(N_PROBES)]
    probe_ids = {probe_document_id(k, c, p) for k in range(N_PROBES) for c, p in PROBE_CELLS}
    for part in ("inputs", "labels"):
        for pop, split in LOCATIONS:
            if pop == "probe":
                continue
            for r in _records(corpus, part, pop, split):
                if (
                    r.get("document_id") in probe_ids
                    or r.get("family") in probe_fams
                    or r.get("population") == "probe"
                    or str(r.get("document_id", "")).startswith("PROBE")
                ):
                    _fail(
                        f"probe leak: document {r.get('document_id')!r} (family "
                        f"{r.get('family')!r}) found in {part}/{pop}/{split}; probes are never "
                        f"used for learning or model selection (SPEC §9.1) - publish a new "
                        f"revision instead"
                    )


def check_records(corpus: dict) -> None:
    """Rule: every record has its population's fields and sits at its (population, split);
    every stored content_sha256 equals content_sha256(record); document ids are unique; inputs
    and labels are stored apart, one label per input, in the same order, linked by
    label.input_sha256 == input.content_sha256."""
    seen: dict[str, str] = {}
    for pop, split in LOCATIONS:
        ins, labs = _records(corpus, "inputs", pop, split), _records(corpus, "labels", pop, split)
        for part, recs, keys in (("inputs", ins, INPUT_KEYS[pop]), ("labels", labs, LABEL_KEYS[pop])):
            for r in recs:
                did = r.get("document_id")
                where = f"document {did!r} in {part}/{pop}/{split}"
                if set(r) != keys:
                    _fail(f"{where}: fields {sorted(set(r) ^ keys)} unexpected or missing")
                if r["population"] != pop or r["split"] != split:
                    _fail(f"{where}: carries population/split {r['population']!r}/{r['split']!r}")
                if r["content_sha256"] != content_sha256(r):
                    _fail(f"{where}: stored content_sha256 does not match its content")
        for r in ins:
            did = r["document_id"]
            if did in seen:
                _fail(f"document {did!r} appears twice ({seen[did]} and {pop}/{split})")
            seen[did] = f"{pop}/{split}"
        if [r["document_id"] for r in ins] != [r["document_id"] for r in labs]:
            extra = {r["document_id"] for r in ins} ^ {r["document_id"] for r in labs}
            _fail(f"inputs and labels of {pop}/{split} differ (documents {sorted(extra)[:5]} or their order)")
        for i_rec, l_rec in zip(ins, labs):
            if l_rec["input_sha256"] != i_rec["content_sha256"] or l_rec["family"] != i_rec["family"]:
                _fail(f"label of document {i_rec['document_id']!r} is not linked to its input")


def check_split_families(corpus: dict, rev: Revision) -> None:
    """Rule: the family -> split map is assign_splits(rev.seed); each family's pairs sit in its
    own split, so the family sets of the three splits are pairwise disjoint; 168/36/36 families;
    no probe family among them."""
    expected_families = assign_splits(rev.seed)
    if corpus.get("families") != expected_families:
        _fail(f"family -> split map differs from the SPEC assignment with seed {rev.seed}")
    fams_by_split = {s: _pair_families(corpus, s) for s in SPLITS}
    for split in SPLITS:
        for fam in fams_by_split[split]:
            if expected_families.get(fam) != split:
                _fail(f"family {fam} has pairs in {split} but belongs to {expected_families.get(fam)}")
    for s1 in SPLITS:
        for s2 in SPLITS:
            if s1 < s2 and fams_by_split[s1] & fams_by_split[s2]:
                _fail(f"families shared by {s1} and {s2}: {sorted(fams_by_split[s1] & fams_by_split[s2])[:5]}")
    n_fams = {s: len(fams_by_split[s]) for s in SPLITS}
    if n_fams != EXPECTED["families_by_split"]:
        _fail(f"families by split {n_fams} != {EXPECTED['families_by_split']}")
    if {probe_family_id(k) for k in range(N_PROBES)} & set().union(*fams_by_split.values()):
        _fail("probe families overlap pair families")


def check_preference(where: str, pair: dict, label: dict) -> None:
    """Rule: the pair's chosen response is a rubric success and its rejected one is not, and the
    label stores exactly those rubric results."""
    chosen = rubric.evaluate(pair["chosen"], "eos", label["action"])
    rejected = rubric.evaluate(pair["rejected"], "eos", label["action"])
    if not chosen["rubric_success"]:
        _fail(f"{where}: chosen response is not a rubric success ({chosen['reason']})")
    if rejected["rubric_success"]:
        _fail(f"{where}: rejected response is a rubric success")
    if label["chosen_rubric"] != chosen or label["rejected_rubric"] != rejected:
        _fail(f"{where}: stored rubric results differ from the rubric")


def check_preference_pairs(corpus: dict, rev: Revision) -> None:
    """Rule: each pair follows the SPEC §2 table (id, variant, gold designs, prompt formula,
    chosen/rejected texts), passes check_preference, each family has variants 0-4 once, and the
    splits hold 840/180/180 pairs."""
    labels = _labels_by_id(corpus)
    for split in SPLITS:
        for r in _records(corpus, "inputs", "pair", split):
            lab = labels[r["document_id"]]
            i = family_index(r["family"])
            v = lab["variant"]
            where = f"pair {r['document_id']!r}"
            if v not in PAIR_VARIANTS or r["document_id"] != f"{r['family']}-P{v}":
                _fail(f"{where}: id/variant {v!r} not in the SPEC scheme")
            ch, rj = pair_designs(i, v)
            if (
                lab["action"] != family_action(i)
                or lab["wrong_action"] != wrong_action(i)
                or lab["chosen_design"] != design_record(ch)
                or lab["rejected_design"] != design_record(rj)
            ):
                _fail(f"{where}: gold label differs from the SPEC table")
            if r["prompt"] != make_prompt(rev, i, v, "pair"):
                _fail(f"{where}: prompt differs from the SPEC formula")
            if r["chosen"] != rubric.render(*ch) or r["rejected"] != rubric.render(*rj):
                _fail(f"{where}: chosen/rejected text differs from its design")
            check_preference(where, r, lab)
        per_family: dict[str, list[int]] = {}
        for r in _records(corpus, "labels", "pair", split):
            per_family.setdefault(r["family"], []).append(r["variant"])
        for fam, vs in per_family.items():
            if sorted(vs) != list(PAIR_VARIANTS):
                _fail(f"family {fam} has pair variants {sorted(vs)}, expected {list(PAIR_VARIANTS)}")
    if _pair_counts(corpus) != EXPECTED["pairs_by_split"]:
        _fail(f"pairs by split {_pair_counts(corpus)} != {EXPECTED['pairs_by_split']}")


def check_demonstrations(corpus: dict, rev: Revision) -> None:
    """Rule: the demonstrations are exactly one per train family (168), each ``{family}-SFT``,
    variant 7, the SPEC prompt, target response(a, 1, i % 2 == 0) stored as a rubric success."""
    labels = _labels_by_id(corpus)
    demos = _records(corpus, "inputs", "warmstart", "train")
    for r in demos:
        lab = labels[r["document_id"]]
        i = family_index(r["family"])
        where = f"demonstration {r['document_id']!r}"
        if r["document_id"] != f"{r['family']}-SFT" or lab["variant"] != DEMO_VARIANT:
            _fail(f"{where}: id/variant not in the SPEC scheme")
        if (
            lab["action"] != family_action(i)
            or lab["target_design"] != design_record(demo_design(i))
            or r["response"] != rubric.render(*demo_design(i))
        ):
            _fail(f"{where}: target differs from response(a, 1, i % 2 == 0)")
        if r["prompt"] != make_prompt(rev, i, DEMO_VARIANT, "warmstart"):
            _fail(f"{where}: prompt differs from the SPEC formula")
        res = rubric.evaluate(r["response"], "eos", lab["action"])
        if not res["rubric_success"] or lab["target_rubric"] != res:
            _fail(f"{where}: target is not a stored rubric success")
    demo_fams = [r["family"] for r in demos]
    if (
        len(demos) != EXPECTED["warmstart_demonstrations"]
        or set(demo_fams) != _pair_families(corpus, "train")
        or len(set(demo_fams)) != len(demo_fams)
    ):
        _fail(f"demonstrations ({len(demos)}) are not exactly one per train family")


def check_rollout_prompts(corpus: dict, rev: Revision) -> None:
    """Rule: the rollout prompts are exactly variants 11-14 of each train family (672), each
    ``{family}-RL{0..3}`` with the SPEC prompt and the family's action in its label."""
    labels = _labels_by_id(corpus)
    rolls = _records(corpus, "inputs", "rollout", "train")
    roll_fams: dict[str, list[int]] = {}
    for r in rolls:
        lab = labels[r["document_id"]]
        i = family_index(r["family"])
        where = f"rollout prompt {r['document_id']!r}"
        v = lab["variant"]
        if v not in ROLLOUT_VARIANTS or r["document_id"] != f"{r['family']}-RL{ROLLOUT_VARIANTS.index(v)}":
            _fail(f"{where}: id/variant not in the SPEC scheme")
        if lab["action"] != family_action(i):
            _fail(f"{where}: gold action differs from the family's")
        if r["prompt"] != make_prompt(rev, i, v, "rollout"):
            _fail(f"{where}: prompt differs from the SPEC formula")
        roll_fams.setdefault(r["family"], []).append(v)
    if (
        len(rolls) != EXPECTED["rollout_prompts"]
        or set(roll_fams) != _pair_families(corpus, "train")
        or any(sorted(vs) != list(ROLLOUT_VARIANTS) for vs in roll_fams.values())
    ):
        _fail(f"rollout prompts ({len(rolls)}) are not exactly variants 11-14 of each train family")


def _learning_prompts(corpus: dict) -> list[str]:
    """The pair, demonstration and rollout prompts, in file order."""
    return [r["prompt"] for pop, split in LOCATIONS if pop != "probe" for r in _records(corpus, "inputs", pop, split)]


def check_distinct_prompts(corpus: dict) -> None:
    """Rule: the pair, demonstration and rollout prompts are 2040 distinct strings."""
    prompts = _learning_prompts(corpus)
    if len(set(prompts)) != EXPECTED["distinct_pair_demo_rollout_prompts"] or len(prompts) != len(set(prompts)):
        _fail(
            f"{len(set(prompts))} distinct pair/demo/rollout prompts among {len(prompts)}, "
            f"expected {EXPECTED['distinct_pair_demo_rollout_prompts']} distinct"
        )


def check_probe_rows(corpus: dict) -> None:
    """Rule: the 80 probe rows are PROBE00-C0-P0 .. PROBE19-C1-P1 in order, each with the SPEC
    prompt and candidate, and the rubric's (relevant, polite, success) of each candidate equals
    its (correct, polite, correct) design, stored as such."""
    labels = _labels_by_id(corpus)
    probes = _records(corpus, "inputs", "probe", PROBE_SPLIT)
    expected_ids = [probe_document_id(k, c, p) for k in range(N_PROBES) for c, p in PROBE_CELLS]
    if [r["document_id"] for r in probes] != expected_ids:
        _fail(f"probe rows {len(probes)} are not {expected_ids[0]}..{expected_ids[-1]} in order")
    for r in probes:
        lab = labels[r["document_id"]]
        k = int(r["family"][5:])
        c, p = lab["correct"], lab["polite"]
        where = f"probe row {r['document_id']!r}"
        if (
            r["document_id"] != probe_document_id(k, c, p)
            or lab["context_index"] != k
            or lab["action"] != k % 6
            or lab["wrong_action"] != (k % 6 + 1) % 6
            or lab["candidate_design"] != design_record(probe_design(k, c, p))
        ):
            _fail(f"{where}: gold label differs from its (correct, polite) design")
        if r["prompt"] != probe_prompt(k) or r["response"] != rubric.render(*probe_design(k, c, p)):
            _fail(f"{where}: prompt or candidate differs from the SPEC formula")
        res = rubric.evaluate(r["response"], "eos", lab["action"])
        if (
            res["relevant"] is not c
            or res["polite"] is not p
            or res["rubric_success"] is not c
            or lab["candidate_rubric"] != res
        ):
            _fail(
                f"{where}: rubric result {res['relevant'], res['polite']} differs from its "
                f"(correct, polite) design {(c, p)}"
            )


def _labelled_documents(corpus: dict) -> int:
    return sum(_pair_counts(corpus).values()) + len(_records(corpus, "inputs", "probe", PROBE_SPLIT))


def check_labelled_documents(corpus: dict) -> None:
    """Rule: 1280 labelled documents, the 1200 pairs and the 80 probe rows."""
    labelled = _labelled_documents(corpus)
    if labelled != EXPECTED["labelled_documents"]:
        _fail(f"{labelled} labelled documents, expected {EXPECTED['labelled_documents']}")


def audit_summary(corpus: dict, rev: Revision) -> dict:
    """The counts an audited corpus records as manifest["audit"]."""
    pairs_by_split = _pair_counts(corpus)
    probes = _records(corpus, "inputs", "probe", PROBE_SPLIT)
    return {
        "dataset": rev.dataset,
        "revision": rev.name,
        "seed": rev.seed,
        "pairs": sum(pairs_by_split.values()),
        "pairs_by_split": pairs_by_split,
        "families_by_split": {s: len(_pair_families(corpus, s)) for s in SPLITS},
        "warmstart_demonstrations": len(_records(corpus, "inputs", "warmstart", "train")),
        "rollout_prompts": len(_records(corpus, "inputs", "rollout", "train")),
        "distinct_pair_demo_rollout_prompts": len(set(_learning_prompts(corpus))),
        "probe_rows": len(probes),
        "unique_probe_contexts": len({r["prompt"] for r in probes}),
        "labelled_documents": _labelled_documents(corpus),
        "human_feedback": False,
        **({"prompt_seeds": dict(rev.prompt_seeds)} if rev.prompt_seeds else {}),
    }


def audit(corpus: dict) -> dict:
    """Check every SPEC §2 invariant, one function each, in this order (each assumes the ones
    before it passed); raise AuditError naming the document; return the summary."""
    rev = check_identity(corpus)
    check_probe_isolation(corpus)
    check_records(corpus)
    check_split_families(corpus, rev)
    check_preference_pairs(corpus, rev)
    check_demonstrations(corpus, rev)
    check_rollout_prompts(corpus, rev)
    check_distinct_prompts(corpus)
    check_probe_rows(corpus)
    check_labelled_documents(corpus)
    return audit_summary(corpus, rev)
