"""OfficeHelpPrefs corpus (SPEC §2): build, audit, write, load, and access control.

Revision ``r001`` (OfficeHelpPrefs-v1, seed 49) is the default; a revision is a ``Revision``
entry of ``REVISIONS`` (dataset name, seed, heading function, extra prompt seeds).

Revision ``r002`` (OfficeHelpPrefs-v2, SPEC §11) keeps every family, split (seed 49), count,
pair table, demonstration, rollout prompt and probe of r001 and changes only the heading sentence
of pair, demonstration and rollout prompts, removing r001's two give-aways:

* printed family number: family ``i`` prints ``OH{perm[i]:03d}`` where ``perm`` is
  ``list(range(240))`` shuffled by ``random.Random(R002_FAMILY_PERMUTATION_SEED)`` (4902). The
  printed number no longer predicts the action. Document ids and the ``family`` field keep the
  true id (``OH003``), so splits, audits and evaluation are unchanged; only prompt text differs.
* heading form and note number: one ``random.Random(R002_HEADING_SEED)`` (4903), used in family
  order 0..239 and, per family, for the pair variants 0-4, then the demonstration (variant 7),
  then the rollouts (variants 11-14): each group takes ``rng.sample(R002_HEADING_CHOICES, k)``
  (k = 5, 1, 4) from the 45 (form, note) choices = 3 r001 heading templates x note numbers
  ``R002_NOTE_NUMBERS`` (0..14). The draw never looks at the variant: every variant gets the same
  uniform marginal over the 45 choices. Deterministic adjustment for the 2040-distinct-prompts
  audit: drawing *without replacement inside a group* keeps the prompts of one family and
  population distinct (independent draws with replacement would collide in about one family in
  five); prompts of different populations differ by their ``Source:`` kind, and those of
  different families by the printed number (a bijection).
  The audit summary of r002 records these seeds under ``prompt_seeds``.

Public API
----------
``build_corpus(revision="r001") -> dict``   the whole corpus in memory (see "Corpus dict").
``audit(corpus) -> dict``                   every SPEC §2 invariant; raises ``AuditError``
                                            naming the offending document; returns the summary
                                            stored as ``manifest["audit"]``. It runs one
                                            ``check_*`` function per invariant, in this order,
                                            each assuming the ones before it passed:
                                            ``check_identity``, ``check_probe_isolation``,
                                            ``check_records``, ``check_split_families``,
                                            ``check_preference_pairs`` (with ``check_preference``
                                            per pair), ``check_demonstrations``,
                                            ``check_rollout_prompts``, ``check_distinct_prompts``,
                                            ``check_probe_rows``, ``check_labelled_documents``.
``prepare(out_dir, revision="r001") -> dict``  build + audit + write; returns the manifest.
                                            A non-empty ``out_dir`` raises ``CorpusExistsError``
                                            (a ``FileExistsError``) and nothing is changed.
``load_corpus(dir) -> Corpus``              re-hash every file, re-run the audit.
``Corpus.learning_view() -> LearningView``  what SFT, the judge and PPO may read.
``Corpus.evaluation_view() -> EvaluationView``  test/probe inputs and the gold labels.
``assign_splits(seed=49) -> {family: split}``  the SPEC split formula.
``content_sha256(record) -> str``           see below.

Access control (SPEC §2, enforced in code)
------------------------------------------
A ``LearningView`` is built from copies of the allowed records only (it holds no reference to
the corpus): train/validation pair inputs (``pairs``, ``preference_pairs``), train
demonstrations (``demonstrations``; r001 has no validation demonstrations, so
``demonstrations("validation")`` is empty) and the 672 rollout prompts (``rollout_prompts``).
Asking it for test inputs, probe inputs (``probes``) or any labels (``labels``) raises
``PermissionError`` naming what was refused.
An ``EvaluationView`` serves the test pairs (``test_pairs``), the probe rows (``probe_rows``),
prompt-only records for generation (``prompts("test")`` / ``prompts("probe")``) and, separately,
the gold labels for scoring (``labels(population, split)``, ``label(document_id)``).

Records
-------
Every model-input record carries ``document_id``, ``family``, ``split``, ``population``
(``pair``/``warmstart``/``rollout``/``probe``), ``prompt`` and ``content_sha256``; pair inputs
also ``chosen``/``rejected``, demonstrations ``response`` (the SFT target), probe inputs
``response`` (the candidate). Probe records have split ``"probe"``.
Labels (expected action, variant, designs ``{"action","caution","polite"}`` of
chosen/rejected/target/candidate, stored rubric results, probe (correct, polite)) live apart, one
label record per input record, linked by ``document_id`` and ``input_sha256``.

``content_sha256`` = SHA-256 (hex) of the UTF-8 bytes of ``rlhf.io.dumps_json(record without
its content_sha256 key)`` (sorted keys, indent 1, trailing newline). Labels carry one too.

Files written by ``prepare`` (JSONL: one record per line, ``json.dumps(sort_keys=True,
ensure_ascii=False, separators=(",", ":"))``)::

    manifest.json                       audit summary, families -> split, file sha256s
    inputs/pair/{train,validation,test}.jsonl
    inputs/warmstart/train.jsonl        168 demonstrations
    inputs/rollout/train.jsonl          672 rollout prompts
    inputs/probe/probe.jsonl            80 probe rows
    labels/<same paths as inputs>       gold labels
    exports/preference_pairs/{train,validation,test}.jsonl   prompt/chosen/rejected only

``exports/`` is the common preference format for outside tools; it reveals the chosen answer, so
learning code must not read the test file (the views never serve it).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlhf import rubric
from rlhf.io import (
    ArtifactExists,
    atomic_folder,
    dumps_json,
    read_json,
    sha256_bytes,
    sha256_file,
    sha256_text,
    write_bytes,
    write_json,
)

# ----------------------------------------------------------------------------- constants

SPLITS = ("train", "validation", "test")
PROBE_SPLIT = "probe"
POPULATIONS = ("pair", "warmstart", "rollout", "probe")
# (population, split) of every records file, in file order.
LOCATIONS = (
    ("pair", "train"),
    ("pair", "validation"),
    ("pair", "test"),
    ("warmstart", "train"),
    ("rollout", "train"),
    ("probe", PROBE_SPLIT),
)
LEARNING_LOCATIONS = (("pair", "train"), ("pair", "validation"), ("warmstart", "train"), ("rollout", "train"))

N_FAMILIES = 240
FAMILIES_PER_ACTION = 40
SPLIT_OF_POSITION = ("train",) * 28 + ("validation",) * 6 + ("test",) * 6
PAIR_VARIANTS = (0, 1, 2, 3, 4)
DEMO_VARIANT = 7
ROLLOUT_VARIANTS = (11, 12, 13, 14)
N_PROBES = 20
# (correct, polite) per candidate, in SPEC order.
PROBE_CELLS = ((True, False), (True, True), (False, False), (False, True))

KIND = {"pair": "preference card", "warmstart": "demonstration", "rollout": "live rollout request"}
HEADINGS_R001 = (
    "Help request {family}, note {variant}.",
    "Case {family}, message {variant}.",
    "Desk incident {family}, record {variant}.",
)
PROMPT_TAIL = " Give one relevant next step without claiming a guaranteed fix."
PROBE_PROMPT = (
    "New remote support context {family}. {context} A previous unrelated case was "
    "closed. Give one relevant next step without claiming a guaranteed fix."
)

EXPECTED = {
    "pairs": 1200,
    "pairs_by_split": {"train": 840, "validation": 180, "test": 180},
    "families_by_split": {"train": 168, "validation": 36, "test": 36},
    "warmstart_demonstrations": 168,
    "rollout_prompts": 672,
    "distinct_pair_demo_rollout_prompts": 2040,
    "probe_rows": 80,
    "unique_probe_contexts": 20,
    "labelled_documents": 1280,
}

INPUT_KEYS = {
    "pair": {"document_id", "family", "split", "population", "prompt", "chosen", "rejected", "content_sha256"},
    "warmstart": {"document_id", "family", "split", "population", "prompt", "response", "content_sha256"},
    "rollout": {"document_id", "family", "split", "population", "prompt", "content_sha256"},
    "probe": {"document_id", "family", "split", "population", "prompt", "response", "content_sha256"},
}
_LABEL_COMMON = {"document_id", "family", "split", "population", "action", "input_sha256", "content_sha256"}
LABEL_KEYS = {
    "pair": _LABEL_COMMON
    | {"variant", "wrong_action", "chosen_design", "rejected_design", "chosen_rubric", "rejected_rubric"},
    "warmstart": _LABEL_COMMON | {"variant", "target_design", "target_rubric"},
    "rollout": _LABEL_COMMON | {"variant"},
    "probe": _LABEL_COMMON
    | {"context_index", "wrong_action", "correct", "polite", "candidate_design", "candidate_rubric"},
}

CONTENT_SHA256_DEFINITION = "sha256 hex of the UTF-8 bytes of rlhf.io.dumps_json(record without its content_sha256 key)"


class AuditError(ValueError):
    """The corpus violates a SPEC §2 invariant."""


class CorpusIntegrityError(ValueError):
    """A corpus folder does not match its manifest (missing, extra or altered file)."""


class CorpusExistsError(ArtifactExists):
    """`prepare` refuses to write into a non-empty folder."""


# ----------------------------------------------------------------------------- revisions


@dataclass(frozen=True)
class Revision:
    """What varies between corpus revisions: dataset name, split seed, heading function and the
    extra seeds of that heading (recorded in the audit summary when not empty); counts, splits,
    pair table and probes stay."""

    name: str
    dataset: str
    seed: int
    heading: Callable[[int, int], str]  # (family index, variant) -> heading sentence
    prompt_seeds: tuple[tuple[str, int], ...] = ()


def render_heading(form: int, printed_index: int, note: int) -> str:
    """One of the three r001 heading templates with a printed family number and a note number."""
    return HEADINGS_R001[form].format(family=family_id(printed_index), variant=note)


_HEADING_RE = re.compile(r"(Help request|Case|Desk incident) OH(\d{3}), (note|message|record) (\d+)\.")
_HEADING_WORDS = (("Help request", "note"), ("Case", "message"), ("Desk incident", "record"))


def heading_parts(prompt: str) -> tuple[int, int, int, str]:
    """(form, printed family index, note number, rest of the prompt) of a pair/demo/rollout
    prompt; ``render_heading(form, printed, note) + rest == prompt``."""
    m = _HEADING_RE.match(prompt)
    if not m or (m.group(1), m.group(3)) not in _HEADING_WORDS:
        raise ValueError(f"prompt does not start with a corpus heading: {prompt[:60]!r}")
    form = _HEADING_WORDS.index((m.group(1), m.group(3)))
    out = (form, int(m.group(2)), int(m.group(4)), prompt[m.end() :])
    if render_heading(*out[:3]) + out[3] != prompt:
        raise ValueError(f"prompt heading is not canonical: {prompt[:60]!r}")
    return out


def _heading_r001(index: int, variant: int) -> str:
    return HEADINGS_R001[variant % 3].format(family=family_id(index), variant=variant)


# r002 (SPEC §11): see the module docstring. Changing any of these changes r002's bytes.
R002_FAMILY_PERMUTATION_SEED = 4902
R002_HEADING_SEED = 4903
R002_NOTE_NUMBERS = tuple(range(15))  # 0..14, the note numbers r001 prints (variants 0-14)
R002_HEADING_CHOICES = tuple((form, note) for form in range(len(HEADINGS_R001)) for note in R002_NOTE_NUMBERS)
_R002_TABLES: dict = {}


def r002_printed_family(index: int) -> int:
    """The family number r002 prints for family ``index`` (a seeded permutation of 0..239)."""
    if "perm" not in _R002_TABLES:
        perm = list(range(N_FAMILIES))
        random.Random(R002_FAMILY_PERMUTATION_SEED).shuffle(perm)
        _R002_TABLES["perm"] = tuple(perm)
    return _R002_TABLES["perm"][index]


def r002_heading_choice(index: int, variant: int) -> tuple[int, int]:
    """(heading form, note number) of r002 for (family index, variant), drawn without looking at
    the variant (see the module docstring for the order of the draws)."""
    if "heading" not in _R002_TABLES:
        rng = random.Random(R002_HEADING_SEED)
        table = {}
        for i in range(N_FAMILIES):
            for group in (PAIR_VARIANTS, (DEMO_VARIANT,), ROLLOUT_VARIANTS):
                for v, choice in zip(group, rng.sample(R002_HEADING_CHOICES, len(group))):
                    table[(i, v)] = choice
        _R002_TABLES["heading"] = table
    return _R002_TABLES["heading"][(index, variant)]


def _heading_r002(index: int, variant: int) -> str:
    form, note = r002_heading_choice(index, variant)
    return render_heading(form, r002_printed_family(index), note)


REVISIONS: dict[str, Revision] = {
    "r001": Revision("r001", "OfficeHelpPrefs-v1", 49, _heading_r001),
    "r002": Revision(
        "r002",
        "OfficeHelpPrefs-v2",
        49,
        _heading_r002,
        (("family_permutation", R002_FAMILY_PERMUTATION_SEED), ("heading_and_note", R002_HEADING_SEED)),
    ),
}
DEFAULT_REVISION = "r001"


def get_revision(revision: str | None) -> Revision:
    if revision not in REVISIONS:
        raise ValueError(f"unknown corpus revision {revision!r}; implemented: {sorted(REVISIONS)}")
    return REVISIONS[revision]


# ----------------------------------------------------------------------------- formulas


def family_id(index: int) -> str:
    return f"OH{index:03d}"


def probe_family_id(k: int) -> str:
    return f"PROBE{k:02d}"


_FAMILY_RE = re.compile(r"OH(\d{3})")


def family_index(family: str) -> int:
    m = _FAMILY_RE.fullmatch(family) if isinstance(family, str) else None
    if not m or int(m.group(1)) >= N_FAMILIES:
        raise AuditError(f"invalid family id {family!r} (expected OH000..OH{N_FAMILIES - 1})")
    return int(m.group(1))


def family_action(index: int) -> int:
    return index // FAMILIES_PER_ACTION


def wrong_action(index: int) -> int:
    a = family_action(index)
    return (a + 1 + index % 5) % 6


def assign_splits(seed: int = 49) -> dict[str, str]:
    """SPEC §2: one Random(seed), used in action order; shuffled positions 0-27/28-33/34-39."""
    rng = random.Random(seed)
    splits: dict[str, str] = {}
    for a in range(N_FAMILIES // FAMILIES_PER_ACTION):
        ids = list(range(FAMILIES_PER_ACTION * a, FAMILIES_PER_ACTION * (a + 1)))
        rng.shuffle(ids)
        for pos, i in enumerate(ids):
            splits[family_id(i)] = SPLIT_OF_POSITION[pos]
    return dict(sorted(splits.items()))


def make_prompt(rev: Revision, index: int, variant: int, population: str) -> str:
    a = family_action(index)
    return rev.heading(index, variant) + f" Source: {KIND[population]}. " + rubric.CONTEXTS[a] + PROMPT_TAIL


def probe_prompt(k: int) -> str:
    return PROBE_PROMPT.format(family=probe_family_id(k), context=rubric.CONTEXTS[k % 6])


def pair_designs(index: int, variant: int) -> tuple[tuple[int, int, bool], tuple[int, int, bool]]:
    """(chosen, rejected) designs (action, caution, polite) of the SPEC §2 table."""
    a, w = family_action(index), wrong_action(index)
    table = {
        0: ((a, 1, False), (w, 2, False)),
        1: ((a, 0, False), (w, 1, True)),
        2: ((a, 1, True), (w, 0, False)),
        3: ((a, 1, False), (a, 2, True)),
        4: ((a, 0, True), (w, 1, False)),
    }
    return table[variant]


def demo_design(index: int) -> tuple[int, int, bool]:
    return (family_action(index), 1, index % 2 == 0)


def probe_design(k: int, correct: bool, polite: bool) -> tuple[int, int, bool]:
    a = k % 6
    return ((a if correct else (a + 1) % 6), 1, polite)


def probe_document_id(k: int, correct: bool, polite: bool) -> str:
    return f"{probe_family_id(k)}-C{int(correct)}-P{int(polite)}"


def _design(d) -> dict:
    return {"action": d[0], "caution": d[1], "polite": d[2]}


def content_sha256(record: dict) -> str:
    """SHA-256 of the canonical JSON (rlhf.io.dumps_json) of the record minus content_sha256."""
    return sha256_text(dumps_json({k: v for k, v in record.items() if k != "content_sha256"}))


def _seal(record: dict) -> dict:
    record = dict(record)
    record.pop("content_sha256", None)
    record["content_sha256"] = content_sha256(record)
    return record


# ----------------------------------------------------------------------------- build

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
            "chosen_design": _design(ch),
            "rejected_design": _design(rj),
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
            "target_design": _design(d),
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
            "candidate_design": _design(d),
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
            inp = _seal(inp)
            inputs[pop][split].append(inp)
            labels[pop][split].append(_seal({**lab, "input_sha256": inp["content_sha256"]}))

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


# ----------------------------------------------------------------------------- audit


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
                or lab["chosen_design"] != _design(ch)
                or lab["rejected_design"] != _design(rj)
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
            or lab["target_design"] != _design(demo_design(i))
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
            or lab["candidate_design"] != _design(probe_design(k, c, p))
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


# ----------------------------------------------------------------------------- files


def _rel(part: str, pop: str, split: str) -> str:
    return f"{part}/{pop}/{split}.jsonl"


def _export_rel(split: str) -> str:
    return f"exports/preference_pairs/{split}.jsonl"


def layout(revision: str = DEFAULT_REVISION) -> list[str]:
    """Relative paths of every records file `prepare` writes (manifest.json aside)."""
    get_revision(revision)
    return [_rel(part, p, s) for part in ("inputs", "labels") for p, s in LOCATIONS] + [_export_rel(s) for s in SPLITS]


def _jsonl(records) -> bytes:
    return "".join(
        json.dumps(r, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records
    ).encode("utf-8")


def _preference_rows(pair_inputs) -> list[dict]:
    return [{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]} for r in pair_inputs]


def _files_of(corpus: dict) -> dict[str, bytes]:
    files = {}
    for part in ("inputs", "labels"):
        for pop, split in LOCATIONS:
            files[_rel(part, pop, split)] = _jsonl(corpus[part][pop][split])
    for split in SPLITS:
        files[_export_rel(split)] = _jsonl(_preference_rows(corpus["inputs"]["pair"][split]))
    return files


def prepare(out_dir, revision: str = DEFAULT_REVISION) -> dict:
    """Build, audit and write the corpus into an empty or new `out_dir`; return the manifest."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CorpusExistsError(
            f"refusing to prepare a corpus into {out}: it exists and is not an "
            f"empty folder (an existing corpus is never overwritten)"
        )
    corpus = build_corpus(revision)
    summary = audit(corpus)
    files = _files_of(corpus)
    manifest = {
        "audit": summary,
        "families": corpus["families"],
        "probe_families": corpus["probe_families"],
        "content_sha256": CONTENT_SHA256_DEFINITION,
        "files": {rel: sha256_bytes(data) for rel, data in files.items()},
    }
    with atomic_folder(out) as tmp:  # a crash never leaves a half-written corpus at `out`
        for rel, data in files.items():
            write_bytes(tmp / rel, data)
        write_json(tmp / "manifest.json", manifest)
    load_corpus(out)  # read back what was written: hashes and audit
    return manifest


def _read_jsonl(path: Path, rel: str) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusIntegrityError(f"{rel} line {n}: not JSON ({e})") from None
            if not isinstance(rec, dict):
                raise CorpusIntegrityError(f"{rel} line {n}: not a JSON object")
            out.append(rec)
    return out


def load_corpus(directory) -> "Corpus":
    """Verify every file against the manifest, parse, re-run the audit; return a Corpus."""
    root = Path(directory)
    mpath = root / "manifest.json"
    if not mpath.is_file():
        raise CorpusIntegrityError(f"{root} has no manifest.json (not a corpus, or incomplete)")
    manifest = read_json(mpath)
    try:
        revision = manifest["audit"]["revision"]
        listed = dict(manifest["files"])
    except (KeyError, TypeError):
        raise CorpusIntegrityError(f"{mpath}: manifest lacks audit.revision or files") from None
    expected = set(layout(revision))
    if set(listed) != expected:
        raise CorpusIntegrityError(
            f"{mpath}: manifest lists {sorted(set(listed) ^ expected)} against the {revision} layout"
        )
    present = {
        p.relative_to(root).as_posix() for p in root.rglob("*") if (p.is_file() or p.is_symlink()) and p != mpath
    }
    for rel in sorted(expected - present):
        raise CorpusIntegrityError(f"corpus file {rel} is missing from {root}")
    for rel in sorted(present - expected):
        raise CorpusIntegrityError(f"unexpected file {rel} in corpus {root}")
    for rel in sorted(expected):
        if (root / rel).is_symlink():
            raise CorpusIntegrityError(f"corpus file {rel} is a symbolic link")
        actual = sha256_file(root / rel)
        if actual != listed[rel]:
            raise CorpusIntegrityError(
                f"corpus file {rel} does not match its manifest hash (expected {listed[rel]}, found {actual})"
            )
    rev = get_revision(revision)
    data = {
        "dataset": manifest["audit"].get("dataset"),
        "revision": revision,
        "seed": manifest["audit"].get("seed"),
        "families": manifest.get("families"),
        "probe_families": manifest.get("probe_families"),
        "inputs": {p: {} for p in POPULATIONS},
        "labels": {p: {} for p in POPULATIONS},
    }
    for part in ("inputs", "labels"):
        for pop, split in LOCATIONS:
            data[part][pop][split] = _read_jsonl(root / _rel(part, pop, split), _rel(part, pop, split))
    try:
        summary = audit(data)
    except AuditError as e:
        raise AuditError(f"corpus {root} failed its audit: {e}") from e
    for split in SPLITS:
        rel = _export_rel(split)
        if _read_jsonl(root / rel, rel) != _preference_rows(data["inputs"]["pair"][split]):
            raise AuditError(f"corpus {root}: {rel} differs from the {split} pair inputs")
    if manifest["audit"] != summary:
        raise AuditError(f"corpus {root}: manifest audit {manifest['audit']} differs from the recomputed {summary}")
    assert rev.name == summary["revision"]
    return Corpus(data, root=root, manifest=manifest, _summary=summary)


# ----------------------------------------------------------------------------- access


def _copies(records) -> list[dict]:
    return [dict(r) for r in records]


_PROMPT_FIELDS = ("document_id", "family", "split", "population", "prompt")


def first_units(records: list[dict], max_units: int | None) -> list[dict]:
    """`records` restricted to its first `max_units` families (test families or probe contexts,
    in file order): the miniature budgets' cut (profile key evaluation.max_units). None (every
    real profile) keeps every record."""
    if max_units is None:
        return records
    kept = set(list(dict.fromkeys(r["family"] for r in records))[:max_units])
    return [r for r in records if r["family"] in kept]


class LearningView:
    """What learning stages (SFT, judge, PPO) may read; it holds copies of nothing else."""

    def __init__(self, allowed: dict[tuple[str, str], list[dict]], revision: str):
        self._allowed = {loc: _copies(recs) for loc, recs in allowed.items() if loc in LEARNING_LOCATIONS}
        self.revision = revision

    def _refuse(self, what: str):
        raise PermissionError(
            f"learning view refuses {what}: learning stages never read test "
            f"inputs, probe inputs or gold labels (SPEC §2)"
        )

    def inputs(self, population: str, split: str) -> list[dict]:
        if population not in POPULATIONS:
            raise ValueError(f"unknown population {population!r}; one of {POPULATIONS}")
        if population == "probe" or split == PROBE_SPLIT:
            self._refuse("probe inputs")
        if split == "test":
            self._refuse(f"test {population} inputs")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; one of {SPLITS}")
        return _copies(self._allowed.get((population, split), []))

    def pairs(self, split: str) -> list[dict]:
        """Pair inputs (prompt, chosen, rejected, ...) of "train" or "validation"."""
        return self.inputs("pair", split)

    def preference_pairs(self, split: str) -> list[dict]:
        """The same pairs in the common format: prompt, chosen, rejected only."""
        return _preference_rows(self.pairs(split))

    def demonstrations(self, split: str = "train") -> list[dict]:
        """SFT demonstrations (prompt + response); r001 has train ones only."""
        return self.inputs("warmstart", split)

    def rollout_prompts(self) -> list[dict]:
        """The 672 rollout prompts (no target of any kind)."""
        return self.inputs("rollout", "train")

    def probes(self, *args, **kwargs):
        self._refuse("probe inputs")

    def test_pairs(self, *args, **kwargs):
        self._refuse("test pair inputs")

    def labels(self, *args, **kwargs):
        self._refuse("gold labels")

    def label(self, *args, **kwargs):
        self._refuse("gold labels")


class EvaluationView:
    """Test and probe inputs for generation/scoring, and the gold labels, kept apart."""

    _INPUTS = (("pair", "test"), ("probe", PROBE_SPLIT))

    def __init__(self, inputs: dict, labels: dict, revision: str):
        self._inputs = {loc: _copies(inputs[loc[0]][loc[1]]) for loc in self._INPUTS}
        self._labels = {loc: _copies(labels[loc[0]][loc[1]]) for loc in LOCATIONS}
        self._label_by_id = {r["document_id"]: r for recs in self._labels.values() for r in recs}
        self.revision = revision

    def inputs(self, population: str, split: str) -> list[dict]:
        if (population, split) not in self._INPUTS:
            raise PermissionError(
                f"evaluation view serves only test pair and probe inputs, not "
                f"{population}/{split} (use learning_view())"
            )
        return _copies(self._inputs[(population, split)])

    def test_pairs(self) -> list[dict]:
        """The 180 test pairs (prompt, chosen, rejected) for the judge's published accuracy."""
        return self.inputs("pair", "test")

    def probe_rows(self) -> list[dict]:
        """The 80 probe rows (prompt + candidate response) for the politeness exercise."""
        return self.inputs("probe", PROBE_SPLIT)

    def prompts(self, population: str) -> list[dict]:
        """Prompt-only records for generation: "test" (180) or "probe" (80 rows)."""
        loc = {"test": ("pair", "test"), "probe": ("probe", PROBE_SPLIT)}.get(population)
        if loc is None:
            raise ValueError(f"prompts() takes 'test' or 'probe', got {population!r}")
        return [{k: r[k] for k in _PROMPT_FIELDS} for r in self._inputs[loc]]

    def labels(self, population: str, split: str) -> list[dict]:
        if (population, split) not in self._labels:
            raise ValueError(f"no labels for {population}/{split}; locations: {LOCATIONS}")
        return _copies(self._labels[(population, split)])

    def label(self, document_id: str) -> dict:
        if document_id not in self._label_by_id:
            raise KeyError(f"no label for document {document_id!r}")
        return dict(self._label_by_id[document_id])


class Corpus:
    """An audited corpus. Hand learning stages `learning_view()`, evaluation `evaluation_view()`."""

    def __init__(self, data: dict, *, root=None, manifest=None, _summary=None):
        self.summary = _summary if _summary is not None else audit(data)
        self.__data = data
        self.revision = data["revision"]
        self.dataset = data["dataset"]
        self.root = Path(root) if root is not None else None
        self.manifest = manifest
        self.families = dict(data["families"])

    @classmethod
    def build(cls, revision: str = DEFAULT_REVISION) -> "Corpus":
        """An in-memory corpus (no files), audited."""
        return cls(build_corpus(revision))

    def learning_view(self) -> LearningView:
        d = self.__data
        return LearningView({loc: d["inputs"][loc[0]][loc[1]] for loc in LEARNING_LOCATIONS}, self.revision)

    def evaluation_view(self) -> EvaluationView:
        return EvaluationView(self.__data["inputs"], self.__data["labels"], self.revision)

    def __repr__(self) -> str:
        return f"Corpus({self.dataset} {self.revision}, root={self.root})"
