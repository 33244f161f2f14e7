"""The corpus's design (SPEC §2): its constants (splits, populations, counts, the variants of
each population), its revisions (r001, and r002's headings without the give-aways) and the formulas
every document is made from (a family's split and action, each prompt, each design)."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable

from rlhf import rubric
from rlhf.io import ArtifactExists, dumps_json, sha256_text

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


def design_record(d) -> dict:
    return {"action": d[0], "caution": d[1], "polite": d[2]}


def content_sha256(record: dict) -> str:
    """SHA-256 of the canonical JSON (rlhf.io.dumps_json) of the record minus content_sha256."""
    return sha256_text(dumps_json({k: v for k, v in record.items() if k != "content_sha256"}))


def seal(record: dict) -> dict:
    record = dict(record)
    record.pop("content_sha256", None)
    record["content_sha256"] = content_sha256(record)
    return record
