"""Access control (SPEC §2, enforced in code): the LearningView (what SFT, the judge and PPO may
read: copies of the allowed records only), the EvaluationView (test and probe inputs, and the gold
labels apart), and the audited Corpus that hands them out."""

from __future__ import annotations

from pathlib import Path

from rlhf.corpus.build import build_corpus
from rlhf.corpus.design import DEFAULT_REVISION, LEARNING_LOCATIONS, LOCATIONS, POPULATIONS, PROBE_SPLIT, SPLITS
from rlhf.corpus.invariants import audit


def preference_rows(pair_inputs) -> list[dict]:
    return [{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]} for r in pair_inputs]


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
        return preference_rows(self.pairs(split))

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
