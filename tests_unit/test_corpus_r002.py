"""OfficeHelpPrefs-v2 (r002, SPEC §11): the same corpus as r001 except the heading sentence -
printed family number a seeded permutation, heading form and note number drawn independently of
the variant - plus prepare/load with the revision recorded, and the run-folder revision guard."""

import collections
import copy
import hashlib
import random

import pytest

from rlhf import corpus as C
from rlhf import rubric
from rlhf.io import dumps_json

pytestmark = pytest.mark.unit

# sha256 of dumps_json(manifest["files"]): r001 is pinned in test_corpus.py too; r002's bytes are
# pinned here so that they change only with a new revision.
R001_FILES_DIGEST = "6e3ad763749e7f3937b0d6546eafeb156dea584f202f73aab273877202883342"
R002_FILES_DIGEST = "52247858fcf1faf596477d10e97dd9be73e5556ffd6584944f52f81948a3f721"
HEADED = ("pair", "warmstart", "rollout")


@pytest.fixture(scope="module")
def r001():
    return C.build_corpus("r001")


@pytest.fixture(scope="module")
def r002():
    return C.build_corpus("r002")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpora")
    return {rev: (root / rev, C.prepare(root / rev, revision=rev)) for rev in ("r001", "r002")}


def _labelled(corpus, pops=HEADED):
    """[(input, label)] of the headed populations, in file order."""
    out = []
    for pop, split in C.LOCATIONS:
        if pop in pops:
            out += list(zip(corpus["inputs"][pop][split], corpus["labels"][pop][split]))
    return out


def test_r002_keeps_counts_splits_and_audit_of_r001(r001, r002):
    s1, s2 = C.audit(r001), C.audit(r002)
    assert s2["dataset"] == "OfficeHelpPrefs-v2" and s2["revision"] == "r002" and s2["seed"] == 49
    assert s2["prompt_seeds"] == {"family_permutation": 4902, "heading_and_note": 4903}
    assert C.R002_FAMILY_PERMUTATION_SEED == 4902 and C.R002_HEADING_SEED == 4903
    structural = {k: v for k, v in s2.items() if k not in ("dataset", "revision", "prompt_seeds")}
    assert structural == {k: v for k, v in s1.items() if k not in ("dataset", "revision")}
    assert s2["distinct_pair_demo_rollout_prompts"] == 2040 and s2["labelled_documents"] == 1280
    assert r002["families"] == r001["families"] == C.assign_splits(49)
    assert r002["probe_families"] == r001["probe_families"]


def test_r002_changes_only_the_heading(r001, r002):
    for pop, split in C.LOCATIONS:
        ins1, ins2 = r001["inputs"][pop][split], r002["inputs"][pop][split]
        labs1, labs2 = r001["labels"][pop][split], r002["labels"][pop][split]
        assert [r["document_id"] for r in ins1] == [r["document_id"] for r in ins2]
        if pop == "probe":  # probes are unchanged in r002, byte for byte
            assert ins1 == ins2 and labs1 == labs2
            continue
        for a, b in zip(ins1, ins2):
            assert {k: v for k, v in a.items() if k not in ("prompt", "content_sha256")} == {
                k: v for k, v in b.items() if k not in ("prompt", "content_sha256")
            }
            assert C.heading_parts(a["prompt"])[3] == C.heading_parts(b["prompt"])[3]
        for a, b in zip(labs1, labs2):
            assert {k: v for k, v in a.items() if k not in ("input_sha256", "content_sha256")} == {
                k: v for k, v in b.items() if k not in ("input_sha256", "content_sha256")
            }
    prompts = [r["prompt"] for pop in HEADED for recs in r002["inputs"][pop].values() for r in recs]
    assert len(prompts) == len(set(prompts)) == 2040
    # r002 prompts are not r001's; a few coincide by chance (a printed number that happens to be
    # a family of the same action, with a heading drawn equal to r001's) - a fixed count.
    same = set(prompts) & {r["prompt"] for pop in HEADED for recs in r001["inputs"][pop].values() for r in recs}
    assert len(same) == 25


def test_printed_family_number_is_a_seeded_permutation_unrelated_to_the_action(r002):
    perm = list(range(240))
    random.Random(4902).shuffle(perm)
    printed_of: dict[str, set] = collections.defaultdict(set)
    for rec, lab in _labelled(r002):
        printed_of[rec["family"]].add(C.heading_parts(rec["prompt"])[1])
    assert len(printed_of) == 240
    assert all(len(v) == 1 for v in printed_of.values())  # one printed number per family
    printed = {fam: next(iter(v)) for fam, v in printed_of.items()}
    assert sorted(printed.values()) == list(range(240))  # a permutation of the 240 ids
    assert all(printed[C.family_id(i)] == perm[i] == C.r002_printed_family(i) for i in range(240))
    assert sum(printed[C.family_id(i)] != i for i in range(240)) > 200
    # the action is not a function of printed_number // 40: every range of 40 mixes actions
    actions_in_range = collections.defaultdict(set)
    for fam, p in printed.items():
        actions_in_range[p // 40].add(C.family_action(C.family_index(fam)))
    assert all(len(acts) >= 3 for acts in actions_in_range.values())
    # ... and the test families' printed numbers do not sit in their action's range
    test_fams = [f for f, s in r002["families"].items() if s == "test"]
    in_range = sum(printed[f] // 40 == C.family_action(C.family_index(f)) for f in test_fams)
    assert in_range < len(test_fams) / 2


def test_heading_and_note_number_are_independent_of_the_variant(r002):
    forms, notes = collections.defaultdict(collections.Counter), collections.defaultdict(collections.Counter)
    follows_r001_rule = 0
    for rec, lab in _labelled(r002):
        form, _, note, _ = C.heading_parts(rec["prompt"])
        assert (form, note) == C.r002_heading_choice(C.family_index(rec["family"]), lab["variant"])
        assert note in C.R002_NOTE_NUMBERS
        forms[lab["variant"]][form] += 1
        notes[lab["variant"]][note] += 1
        follows_r001_rule += (form, note) == (lab["variant"] % 3, lab["variant"])
    for v in (*C.PAIR_VARIANTS, C.DEMO_VARIANT, *C.ROLLOUT_VARIANTS):
        assert set(forms[v]) == {0, 1, 2}, v  # every variant shows every heading form
        assert len(notes[v]) >= 10, v  # and many note numbers
    for v in C.PAIR_VARIANTS:  # 240 draws per variant, roughly uniform over the 3 forms
        assert all(50 <= forms[v][f] <= 110 for f in range(3)), forms[v]
    assert follows_r001_rule < 0.1 * 2040
    # within one family and population the draws are distinct (the 2040-prompt adjustment)
    for i in range(240):
        for group in (C.PAIR_VARIANTS, C.ROLLOUT_VARIANTS):
            assert len({C.r002_heading_choice(i, v) for v in group}) == len(group)


def test_heading_parts_round_trip_in_both_revisions(r001, r002):
    for corpus in (r001, r002):
        for rec, lab in _labelled(corpus):
            form, printed, note, rest = C.heading_parts(rec["prompt"])
            assert C.render_heading(form, printed, note) + rest == rec["prompt"]
            assert rest.startswith(" Source: ") and rubric.CONTEXTS[lab["action"]] in rest
    form, printed, note, _ = C.heading_parts(r001["inputs"]["pair"]["test"][0]["prompt"])
    assert printed == C.family_index(r001["inputs"]["pair"]["test"][0]["family"])
    with pytest.raises(ValueError):
        C.heading_parts("New remote support context PROBE00. x")


def test_audit_refuses_r002_prompts_that_do_not_follow_r002(r001, r002):
    bad = copy.deepcopy(r002)  # an r001 prompt slipped into r002, re-sealed
    rec = bad["inputs"]["pair"]["train"][0]
    rec["prompt"] = r001["inputs"]["pair"]["train"][0]["prompt"]
    rec["content_sha256"] = C.content_sha256(rec)
    lab = bad["labels"]["pair"]["train"][0]
    lab["input_sha256"] = rec["content_sha256"]
    lab["content_sha256"] = C.content_sha256(lab)
    with pytest.raises(C.AuditError, match=rec["document_id"]):
        C.audit(bad)
    bad = copy.deepcopy(r002)
    bad["dataset"] = "OfficeHelpPrefs-v1"
    with pytest.raises(C.AuditError, match="r002"):
        C.audit(bad)


def test_r001_bytes_unchanged_and_r002_bytes_pinned(prepared):
    for rev, digest in (("r001", R001_FILES_DIGEST), ("r002", R002_FILES_DIGEST)):
        files = prepared[rev][1]["files"]
        assert hashlib.sha256(dumps_json(files).encode()).hexdigest() == digest, rev
    f1, f2 = prepared["r001"][1]["files"], prepared["r002"][1]["files"]
    assert set(f1) == set(f2) == set(C.layout("r002"))
    assert f1["inputs/probe/probe.jsonl"] == f2["inputs/probe/probe.jsonl"]
    assert f1["labels/probe/probe.jsonl"] == f2["labels/probe/probe.jsonl"]
    assert f1["inputs/pair/test.jsonl"] != f2["inputs/pair/test.jsonl"]


def test_prepare_load_round_trip_records_the_revision(prepared, r002):
    out, manifest = prepared["r002"]
    assert manifest["audit"]["revision"] == "r002"
    assert manifest["audit"]["dataset"] == "OfficeHelpPrefs-v2"
    assert manifest["audit"]["prompt_seeds"] == {"family_permutation": 4902, "heading_and_note": 4903}
    corpus = C.load_corpus(out)
    assert corpus.revision == "r002" and corpus.dataset == "OfficeHelpPrefs-v2"
    assert corpus.summary == manifest["audit"]
    assert corpus.learning_view().revision == corpus.evaluation_view().revision == "r002"
    assert corpus.evaluation_view().test_pairs() == r002["inputs"]["pair"]["test"]
    assert corpus.learning_view().rollout_prompts() == r002["inputs"]["rollout"]["train"]
    with pytest.raises(C.CorpusExistsError):
        C.prepare(out, revision="r002")
    with pytest.raises(C.CorpusExistsError):
        C.prepare(out, revision="r001")
    assert C.load_corpus(out).revision == "r002"


def test_a_run_folder_never_mixes_revisions(tmp_path):
    from rlhf.lab import open_context

    run = tmp_path / "run"
    C.prepare(run / "corpus", revision="r002")
    with pytest.raises(ValueError, match="never mixes revisions"):
        open_context(run, "embedded", revision="r001")  # the default revision is refused too
    with pytest.raises(ValueError, match="never mixes revisions"):
        open_context(run, "embedded")
    assert not (run / "base_model").exists()  # refused before anything else was written
    assert C.load_corpus(run / "corpus").revision == "r002"
    ctx = open_context(run, "embedded", revision="r002")
    assert ctx.corpus.revision == "r002" and ctx.corpus.dataset == "OfficeHelpPrefs-v2"
    other = tmp_path / "other"
    C.prepare(other / "corpus", revision="r001")
    with pytest.raises(ValueError, match="never mixes revisions"):
        open_context(other, "embedded", revision="r002")
