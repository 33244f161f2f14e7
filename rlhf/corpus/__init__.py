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

Modules, each importing only those above it in this list:

    design      the constants, the revisions and the formulas every document is made from
    build       the corpus built in memory from them
    invariants  the audit: one check per SPEC §2 invariant
    views       access control: the learning and evaluation views, the audited Corpus
    files       the corpus on disk: layout, prepare, load_corpus
"""

from rlhf.corpus.build import build_corpus, demonstration_document, pair_documents, rollout_documents
from rlhf.corpus.design import (
    DEFAULT_REVISION,
    DEMO_VARIANT,
    LOCATIONS,
    N_FAMILIES,
    PAIR_VARIANTS,
    POPULATIONS,
    PROBE_SPLIT,
    R002_FAMILY_PERMUTATION_SEED,
    R002_HEADING_CHOICES,
    R002_HEADING_SEED,
    R002_NOTE_NUMBERS,
    REVISIONS,
    ROLLOUT_VARIANTS,
    AuditError,
    CorpusExistsError,
    CorpusIntegrityError,
    assign_splits,
    content_sha256,
    family_action,
    family_id,
    family_index,
    get_revision,
    heading_parts,
    pair_designs,
    probe_design,
    r002_heading_choice,
    r002_printed_family,
    render_heading,
)
from rlhf.corpus.files import layout, load_corpus, prepare
from rlhf.corpus.invariants import audit, check_labelled_documents, check_preference
from rlhf.corpus.views import Corpus, EvaluationView, LearningView, first_units

__all__ = [
    "assign_splits",
    "audit",
    "AuditError",
    "build_corpus",
    "check_labelled_documents",
    "check_preference",
    "content_sha256",
    "Corpus",
    "CorpusExistsError",
    "CorpusIntegrityError",
    "DEFAULT_REVISION",
    "DEMO_VARIANT",
    "demonstration_document",
    "EvaluationView",
    "family_action",
    "family_id",
    "family_index",
    "first_units",
    "get_revision",
    "heading_parts",
    "layout",
    "LearningView",
    "load_corpus",
    "LOCATIONS",
    "N_FAMILIES",
    "pair_designs",
    "pair_documents",
    "PAIR_VARIANTS",
    "POPULATIONS",
    "prepare",
    "probe_design",
    "PROBE_SPLIT",
    "R002_FAMILY_PERMUTATION_SEED",
    "r002_heading_choice",
    "R002_HEADING_CHOICES",
    "R002_HEADING_SEED",
    "R002_NOTE_NUMBERS",
    "r002_printed_family",
    "render_heading",
    "REVISIONS",
    "rollout_documents",
    "ROLLOUT_VARIANTS",
]
