"""OfficeHelpPrefs-v1 (r001): counts, the SPEC formulas recomputed here, files, loading,
integrity, access control and the SPEC §9.1 probe-leak regression."""

import copy
import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest

from rlhf import corpus as C
from rlhf import rubric
from rlhf.io import ArtifactExists, dumps_json

pytestmark = pytest.mark.unit

TAIL = " Give one relevant next step without claiming a guaranteed fix."
# sha256 of dumps_json(manifest["files"]) for r001: it changes only if a byte of the corpus
# changes, which needs a new revision (SPEC §8/§11), never an edit of r001.
R001_FILES_DIGEST = "6e3ad763749e7f3937b0d6546eafeb156dea584f202f73aab273877202883342"


@pytest.fixture(scope="module")
def built():
    return C.build_corpus()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "r001"
    manifest = C.prepare(out)
    return out, manifest


@pytest.fixture
def copy_of(prepared, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(prepared[0], out)
    for p in out.rglob("*"):  # copies of read-only files must stay editable by the test
        p.chmod(0o755 if p.is_dir() else 0o644)
    return out


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def _all_inputs(corpus):
    return [r for pop in corpus["inputs"].values() for recs in pop.values() for r in recs]


# ----------------------------------------------------------------------------- formulas


def independent_splits():
    rng = random.Random(49)
    out = {}
    for a in range(6):
        ids = list(range(40 * a, 40 * a + 40))
        rng.shuffle(ids)
        for pos, i in enumerate(ids):
            out[f"OH{i:03d}"] = "train" if pos < 28 else "validation" if pos < 34 else "test"
    return out


def test_split_assignment_matches_the_spec_formula(built):
    expected = independent_splits()
    assert built["families"] == expected == C.assign_splits(49)
    counts = {s: sum(v == s for v in expected.values()) for s in ("train", "validation", "test")}
    assert counts == {"train": 168, "validation": 36, "test": 36}
    for split in ("train", "validation", "test"):
        fams = {r["family"] for r in built["inputs"]["pair"][split]}
        assert fams == {f for f, s in expected.items() if s == split}


def test_exact_counts(built):
    ins = built["inputs"]
    assert {s: len(ins["pair"][s]) for s in ("train", "validation", "test")} == {
        "train": 840,
        "validation": 180,
        "test": 180,
    }
    assert len(ins["warmstart"]["train"]) == 168
    assert len(ins["rollout"]["train"]) == 672
    assert len(ins["probe"]["probe"]) == 80
    assert sum(len(v) for v in ins["pair"].values()) + len(ins["probe"]["probe"]) == 1280
    train = {f for f, s in built["families"].items() if s == "train"}
    assert {r["family"] for r in ins["warmstart"]["train"]} == train
    assert {r["family"] for r in ins["rollout"]["train"]} == train
    probe_fams = {r["family"] for r in ins["probe"]["probe"]}
    assert probe_fams == {f"PROBE{k:02d}" for k in range(20)}
    assert not probe_fams & set(built["families"])


def test_literal_prompts_follow_the_spec_formula(built):
    by_id = {r["document_id"]: r for r in _all_inputs(built)}
    ctx = rubric.CONTEXTS
    assert by_id["OH000-P0"]["prompt"] == (
        "Help request OH000, note 0. Source: preference card. The office printer shows several "
        "jobs stuck in the queue since this morning, and no page comes out. Give one relevant "
        "next step without claiming a guaranteed fix."
    )
    assert by_id["OH000-P0"]["prompt"] == ("Help request OH000, note 0." + " Source: preference card. " + ctx[0] + TAIL)
    assert by_id["OH041-P4"]["prompt"] == "Case OH041, message 4. Source: preference card. " + ctx[1] + TAIL
    assert by_id["OH239-P2"]["prompt"] == ("Desk incident OH239, record 2. Source: preference card. " + ctx[5] + TAIL)
    train_fam = next(f for f, s in independent_splits().items() if s == "train")
    i = int(train_fam[2:])
    assert by_id[f"{train_fam}-SFT"]["prompt"] == (
        f"Case {train_fam}, message 7. Source: demonstration. " + ctx[i // 40] + TAIL
    )
    assert by_id[f"{train_fam}-RL0"]["prompt"] == (
        f"Desk incident {train_fam}, record 11. Source: live rollout request. " + ctx[i // 40] + TAIL
    )
    assert by_id[f"{train_fam}-RL1"]["prompt"].startswith(f"Help request {train_fam}, note 12. ")
    assert by_id["PROBE07-C0-P1"]["prompt"] == (
        "New remote support context PROBE07. " + ctx[1] + " A previous unrelated case was closed. "
        "Give one relevant next step without claiming a guaranteed fix."
    )


def test_pair_table_demos_and_probes_recomputed_from_the_spec(built):
    r = rubric.render
    labels = {x["document_id"]: x for pop in built["labels"].values() for recs in pop.values() for x in recs}
    for split in ("train", "validation", "test"):
        for rec in built["inputs"]["pair"][split]:
            i, v = int(rec["family"][2:]), int(rec["document_id"].rsplit("-P", 1)[1])
            a, w = i // 40, (i // 40 + 1 + i % 5) % 6
            table = {
                0: (r(a, 1, False), r(w, 2, False)),
                1: (r(a, 0, False), r(w, 1, True)),
                2: (r(a, 1, True), r(w, 0, False)),
                3: (r(a, 1, False), r(a, 2, True)),
                4: (r(a, 0, True), r(w, 1, False)),
            }
            assert (rec["chosen"], rec["rejected"]) == table[v]
            assert labels[rec["document_id"]]["action"] == a
            assert rubric.evaluate(rec["chosen"], "eos", a)["rubric_success"]
            assert not rubric.evaluate(rec["rejected"], "eos", a)["rubric_success"]
    for rec in built["inputs"]["warmstart"]["train"]:
        i = int(rec["family"][2:])
        assert rec["document_id"] == f"{rec['family']}-SFT"
        assert rec["response"] == r(i // 40, 1, i % 2 == 0)
    rows = built["inputs"]["probe"]["probe"]
    assert [x["document_id"] for x in rows[:4]] == ["PROBE00-C1-P0", "PROBE00-C1-P1", "PROBE00-C0-P0", "PROBE00-C0-P1"]
    for rec in rows:
        k = int(rec["family"][5:])
        correct, polite = rec["document_id"].endswith(("C1-P0", "C1-P1")), rec["document_id"][-1] == "1"
        a = k % 6
        assert rec["response"] == r(a if correct else (a + 1) % 6, 1, polite)
        res = rubric.evaluate(rec["response"], "eos", a)
        assert (res["relevant"], res["polite"], res["rubric_success"]) == (correct, polite, correct)
        lab = labels[rec["document_id"]]
        assert (lab["correct"], lab["polite"]) == (correct, polite)
    assert len({x["prompt"] for x in rows}) == 20


def test_2040_distinct_prompts_and_no_answer_text_in_prompts(built):
    prompts = [
        x["prompt"] for pop in ("pair", "warmstart", "rollout") for recs in built["inputs"][pop].values() for x in recs
    ]
    assert len(prompts) == len(set(prompts)) == 2040
    for p in prompts + [x["prompt"] for x in built["inputs"]["probe"]["probe"]]:
        assert not any(instr in p for instr in rubric.INSTRUCTIONS)


def test_records_carry_the_spec_fields_and_labels_stay_apart(built):
    for rec in _all_inputs(built):
        assert {"document_id", "family", "split", "population", "prompt", "content_sha256"} <= set(rec)
        assert not {"action", "variant", "chosen_design", "correct"} & set(rec)
        body = {k: v for k, v in rec.items() if k != "content_sha256"}
        text = json.dumps(body, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
        assert rec["content_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert set(built["inputs"]["rollout"]["train"][0]) == {
        "document_id",
        "family",
        "split",
        "population",
        "prompt",
        "content_sha256",
    }
    assert {r["population"] for r in _all_inputs(built)} == {"pair", "warmstart", "rollout", "probe"}


def test_audit_catches_in_memory_violations(built):
    assert C.audit(built)["pairs"] == 1200
    bad = copy.deepcopy(built)
    bad["inputs"]["pair"]["train"][0]["prompt"] += " "
    with pytest.raises(C.AuditError, match="OH.*content_sha256"):
        C.audit(bad)
    bad = copy.deepcopy(built)  # swap chosen and rejected, re-sealed: the rubric check fires
    rec = bad["inputs"]["pair"]["test"][0]
    rec["chosen"], rec["rejected"] = rec["rejected"], rec["chosen"]
    rec["content_sha256"] = C.content_sha256(rec)
    with pytest.raises(C.AuditError, match=rec["document_id"]):
        C.audit(bad)
    bad = copy.deepcopy(built)  # a test pair moved into train
    bad["inputs"]["pair"]["train"].append(bad["inputs"]["pair"]["test"].pop())
    bad["labels"]["pair"]["train"].append(bad["labels"]["pair"]["test"].pop())
    with pytest.raises(C.AuditError):
        C.audit(bad)
    with pytest.raises(ValueError, match="r003"):
        C.build_corpus("r003")  # an unknown revision is refused


# ----------------------------------------------------------------------------- files


def test_prepare_writes_manifest_and_layout(prepared):
    out, manifest = prepared
    # The SPEC's counts written out, not read from rlhf.corpus.EXPECTED (which the audit itself
    # checks against): a changed constant in the code must fail here.
    assert manifest["audit"] == {
        "dataset": "OfficeHelpPrefs-v1",
        "revision": "r001",
        "seed": 49,
        "pairs": 1200,
        "pairs_by_split": {"train": 840, "validation": 180, "test": 180},
        "families_by_split": {"train": 168, "validation": 36, "test": 36},
        "warmstart_demonstrations": 168,
        "rollout_prompts": 672,
        "distinct_pair_demo_rollout_prompts": 2040,
        "probe_rows": 80,
        "unique_probe_contexts": 20,
        "labelled_documents": 1280,
        "human_feedback": False,
    }
    assert manifest["families"] == independent_splits() and len(manifest["families"]) == 240
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert on_disk == set(manifest["files"]) | {"manifest.json"}
    assert {
        "inputs/pair/test.jsonl",
        "labels/probe/probe.jsonl",
        "inputs/warmstart/train.jsonl",
        "inputs/rollout/train.jsonl",
        "exports/preference_pairs/train.jsonl",
    } <= on_disk
    for rel, digest in manifest["files"].items():
        assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == digest
    assert json.loads((out / "manifest.json").read_text()) == manifest
    first = json.loads((out / "exports/preference_pairs/validation.jsonl").read_text().splitlines()[0])
    assert set(first) == {"prompt", "chosen", "rejected"}
    assert len((out / "inputs/pair/train.jsonl").read_text().splitlines()) == 840


def test_r001_bytes_are_pinned(prepared):
    """Byte-identical r001 across runs and machines: the file hashes are pinned."""
    digest = hashlib.sha256(dumps_json(prepared[1]["files"]).encode()).hexdigest()
    assert digest == R001_FILES_DIGEST


def test_second_prepare_into_non_empty_dir_raises_and_changes_nothing(prepared):
    out = prepared[0]
    before = _tree_digest(out)
    with pytest.raises(C.CorpusExistsError, match="never overwritten") as info:
        C.prepare(out)
    assert isinstance(info.value, FileExistsError) and isinstance(info.value, ArtifactExists)
    assert _tree_digest(out) == before
    C.load_corpus(out)


def test_prepare_into_a_file_path_raises(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(FileExistsError):
        C.prepare(target)
    assert target.read_text() == "x"


def test_load_round_trip(prepared):
    corpus = C.load_corpus(prepared[0])
    assert corpus.summary == prepared[1]["audit"] and corpus.revision == "r001"
    assert corpus.evaluation_view().labels("pair", "train") == C.build_corpus()["labels"]["pair"]["train"]


def test_load_detects_a_flipped_byte(copy_of):
    path = copy_of / "labels/pair/test.jsonl"
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(C.CorpusIntegrityError, match="labels/pair/test.jsonl"):
        C.load_corpus(copy_of)


def test_load_detects_missing_and_extra_files(copy_of):
    (copy_of / "inputs/rollout/train.jsonl").rename(copy_of / "inputs/rollout/old.jsonl")
    with pytest.raises(C.CorpusIntegrityError, match="inputs/rollout/train.jsonl"):
        C.load_corpus(copy_of)
    (copy_of / "inputs/rollout/old.jsonl").rename(copy_of / "inputs/rollout/train.jsonl")
    C.load_corpus(copy_of)
    (copy_of / "inputs/pair/extra.jsonl").write_text("{}\n")
    with pytest.raises(C.CorpusIntegrityError, match="inputs/pair/extra.jsonl"):
        C.load_corpus(copy_of)


def _patch_manifest_hash(root: Path, rel: str):
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"][rel] = hashlib.sha256((root / rel).read_bytes()).hexdigest()
    (root / "manifest.json").write_text(dumps_json(manifest))


def test_spec_9_1_probe_row_copied_into_train_is_refused(copy_of):
    """SPEC §9.1: a probe row slipped into train, manifest hash patched: only the audit sees it."""
    probe_line = (copy_of / "inputs/probe/probe.jsonl").read_text().splitlines()[1]
    assert json.loads(probe_line)["document_id"] == "PROBE00-C1-P1"
    train = copy_of / "inputs/pair/train.jsonl"
    train.write_text(train.read_text() + probe_line + "\n")
    _patch_manifest_hash(copy_of, "inputs/pair/train.jsonl")
    with pytest.raises(C.AuditError, match="probe leak: document 'PROBE00-C1-P1'"):
        C.load_corpus(copy_of)


def test_spec_9_1_disguised_probe_row_is_refused(copy_of):
    """Same leak, the row relabelled as a train pair with a recomputed content hash."""
    row = json.loads((copy_of / "inputs/probe/probe.jsonl").read_text().splitlines()[0])
    row.update(population="pair", split="train", chosen=row.pop("response"), rejected="x")
    row["content_sha256"] = C.content_sha256(row)
    train = copy_of / "inputs/rollout/train.jsonl"
    train.write_text(train.read_text() + json.dumps(row) + "\n")
    _patch_manifest_hash(copy_of, "inputs/rollout/train.jsonl")
    with pytest.raises(C.AuditError, match="probe leak: document 'PROBE00-C1-P0'"):
        C.load_corpus(copy_of)


# ----------------------------------------------------------------------------- access


def test_learning_view_serves_only_learning_data(prepared):
    view = C.load_corpus(prepared[0]).learning_view()
    assert len(view.pairs("train")) == 840 and len(view.pairs("validation")) == 180
    assert len(view.preference_pairs("train")) == 840
    assert set(view.preference_pairs("validation")[0]) == {"prompt", "chosen", "rejected"}
    assert len(view.demonstrations()) == 168 and view.demonstrations("validation") == []
    rollouts = view.rollout_prompts()
    assert len(rollouts) == 672 and all("response" not in r for r in rollouts)
    refused = [
        (lambda: view.pairs("test"), "test pair inputs"),
        (lambda: view.preference_pairs("test"), "test pair inputs"),
        (lambda: view.demonstrations("test"), "test warmstart inputs"),
        (lambda: view.inputs("rollout", "test"), "test rollout inputs"),
        (lambda: view.inputs("probe", "probe"), "probe inputs"),
        (lambda: view.probes(), "probe inputs"),
        (lambda: view.test_pairs(), "test pair inputs"),
        (lambda: view.labels("pair", "train"), "gold labels"),
        (lambda: view.label("OH000-P0"), "gold labels"),
    ]
    for call, what in refused:
        with pytest.raises(PermissionError, match=what):
            call()


def test_learning_view_holds_no_test_or_probe_record(prepared):
    corpus = C.load_corpus(prepared[0])
    forbidden = {r["document_id"] for r in corpus.evaluation_view().test_pairs()}
    forbidden |= {r["document_id"] for r in corpus.evaluation_view().probe_rows()}
    view = corpus.learning_view()
    held = {r["document_id"] for recs in vars(view)["_allowed"].values() for r in recs}
    assert len(held) == 840 + 180 + 168 + 672 and not held & forbidden
    assert not any("variant" in r or "action" in r for recs in vars(view)["_allowed"].values() for r in recs)
    view.pairs("train")[0]["prompt"] = "mutated"  # copies: the view itself is unchanged
    assert view.pairs("train")[0]["prompt"] != "mutated"


def test_evaluation_view(built):
    view = C.Corpus(built).evaluation_view()
    assert len(view.test_pairs()) == 180 and len(view.probe_rows()) == 80
    prompts = view.prompts("test")
    assert len(prompts) == 180 and set(prompts[0]) == {"document_id", "family", "split", "population", "prompt"}
    assert len(view.prompts("probe")) == 80
    assert len(view.labels("probe", "probe")) == 80
    assert view.label("PROBE03-C0-P1")["correct"] is False
    with pytest.raises(PermissionError, match="pair/train"):
        view.inputs("pair", "train")


def test_a_corpus_and_a_lora_layer_name_themselves(prepared):
    """What a user sees printing them in a session: the corpus's dataset, revision and folder (never
    its labels); a LoRA layer's shape, rank, alpha and scaling."""
    import torch
    from torch import nn

    from rlhf.lora import LoRALinear

    corpus = C.load_corpus(prepared[0])
    assert repr(corpus) == f"Corpus({corpus.dataset} r001, root={prepared[0]})"
    r002 = C.Corpus.build("r002")
    assert repr(r002) == f"Corpus({r002.dataset} r002, root=None)" and r002.dataset != corpus.dataset
    layer = LoRALinear(nn.Linear(24, 10), rank=8, alpha=16, generator=torch.Generator().manual_seed(0))
    assert "in_features=24, out_features=10, rank=8, alpha=16, scaling=2.0" in repr(layer)
