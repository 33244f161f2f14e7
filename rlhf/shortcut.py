"""Shortcut audit (SPEC §11), a versioned study of its own: ``shortcut-audit-v1``.

r001's prompts carry two give-aways: the printed family number predicts the action (family
``i`` has action ``i // 40``), and the heading form and note number follow the pair variant,
which fixes the winning style. This study measures how much the *frozen* judge relies on each,
by scoring the 180 test pairs under counterfactual prompts. It trains nothing and changes no
judge weight, label, corpus file or earlier artifact: the judge file (and its manifest), the
judge's learned/frozen fingerprints, every corpus file (labels and manifest included) are
SHA-256 hashed before and after, and any change raises ``ShortcutAuditError``.

Counterfactuals (built by ``build_counterfactuals``, pure functions of the test pair inputs and
their labels; only the prompt changes unless said otherwise):

``<revision>`` (``"r001"`` for the default corpus)   the unchanged test prompts (baseline).
``a_family_permuted``     the printed family number ``OHxxx`` of family ``i`` becomes
                          ``OH{perm[i]}``, ``perm`` a seeded derangement of 0..239 (no id maps to
                          itself, so the number really changes); heading form, note, situation
                          stay.
``b_heading_independent`` heading form (one of the three templates) and note number are drawn
                          uniformly, independently of the variant, from the revision's pair
                          choices (r001: forms 0-2 x notes 0-4, what the judge saw in training;
                          r002: forms 0-2 x notes 0-14); the printed family number stays.
``c_both``                a and b together (the same permutation and the same draws).
``d_conflict``            variants 1, 2 and 4 only (their rejected answer names another action
                          with an acceptable caution; variant 0's rejected answer claims certainty
                          and variant 3's has the same action, so they cannot flip): the situation
                          sentence ``CONTEXTS[a]`` is replaced by ``CONTEXTS[wrong]``, the rejected
                          answer's situation; heading and family number stay. The answer correct
                          for the shown situation is now the former *rejected* one, so the record
                          is stored with chosen/rejected swapped and "accuracy" is the share of
                          pairs where the judge prefers the answer correct for the shown situation
                          (checked by the rubric when building).

Seeds: one ``random.Random(SHORTCUT_AUDIT_SEED)`` (5049) drawn in a fixed order: first
``shuffle`` of ``list(range(240))``, repeated with the same generator until it has no fixed
point (the derangement of a), then for each test pair in file order one ``choice`` of the
(form, note) list (b). Nothing else is random. The corpus seeds (49; r002 also 4902/4903) are
recorded alongside.

Accuracy counts a tie as a miss (as rlhf.judge.evaluate_pairs); ties are reported.

API: ``run_shortcut_audit(ctx, out_dir=None) -> dict`` writes ``out_dir/results.json``
(default ``ctx.run / "shortcut_audit"``), atomically, never overwriting; see ``RESULT_KEYS``.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from pathlib import Path

import torch

from rlhf import corpus as C
from rlhf import rubric, runtime
from rlhf.identities import changed_parts
from rlhf.io import sha256_file, write_json
from rlhf.judge import encode_pairs, pair_scores
from rlhf.roles import fingerprint, load_role

STUDY = "shortcut-audit"
VERSION = "shortcut-audit-v1"
SHORTCUT_AUDIT_SEED = 5049
CONFLICT_VARIANTS = (1, 2, 4)
BATCH_SIZE = 16

# (form, note) choices for counterfactual b: the pair headings a judge of that revision saw.
AUDIT_HEADING_CHOICES = {
    "r001": tuple((form, note) for form in range(3) for note in C.PAIR_VARIANTS),
    "r002": C.R002_HEADING_CHOICES,
}

COUNTERFACTUALS = ("a_family_permuted", "b_heading_independent", "c_both", "d_conflict")

DESCRIPTIONS = {
    "baseline": "the unchanged test prompts of the run's corpus revision",
    "a_family_permuted": "printed family number replaced by a seeded derangement of the 240 ids",
    "b_heading_independent": "heading form and note number drawn independently of the pair variant",
    "c_both": "family number permuted and heading/note drawn independently (a and b together)",
    "d_conflict": (
        "variants 1, 2, 4: situation sentence replaced by the rejected answer's situation, "
        "so the answer correct for the shown situation is the former rejected one"
    ),
}

MEANINGS = {
    "baseline": (
        "Share of the held-out test pairs where the frozen judge scores the preferred answer "
        "higher on the unchanged prompts (its published test accuracy; a tie is a miss)."
    ),
    "a_family_permuted": (
        "Same pairs with only the printed family number changed: a drop from the "
        "baseline is the part of the judge's accuracy that came from reading the "
        "action off the family number."
    ),
    "b_heading_independent": (
        "Same pairs with only the heading form and note number redrawn "
        "independently of the variant: a drop from the baseline is the part "
        "that came from reading the winning style off the heading/note."
    ),
    "c_both": (
        "Same pairs with both give-aways removed: what the judge achieves from the situation "
        "sentence and the answers alone."
    ),
    "d_conflict": (
        "Share of variant 1, 2 and 4 pairs where, after the situation sentence is swapped "
        "to the rejected answer's situation, the judge prefers the answer correct for the "
        "shown situation: near 1 means it reads the situation, near 0 means it follows the "
        "heading, family number or answer style instead."
    ),
}

RESULT_KEYS = (
    "study",
    "version",
    "corpus",
    "profile",
    "arithmetic",
    "seeds",
    "baseline",
    "order",
    "counterfactuals",
    "judge",
    "hashes_before",
    "hashes_after",
    "unchanged",
    "seconds",
    "scoring_seconds",
)


class ShortcutAuditError(RuntimeError):
    """A judge weight, label, corpus file or judge artifact changed during the audit."""


# ------------------------------------------------------------------------------ builders


def derangement(n: int, rng: random.Random) -> list[int]:
    """A permutation of range(n) without fixed points: shuffle with `rng` until none is left."""
    perm = list(range(n))
    while True:
        rng.shuffle(perm)
        if all(p != i for i, p in enumerate(perm)):
            return perm


def with_family_number(prompt: str, printed_index: int) -> str:
    form, _, note, rest = C.heading_parts(prompt)
    return C.render_heading(form, printed_index, note) + rest


def with_heading(prompt: str, form: int, note: int) -> str:
    _, printed, _, rest = C.heading_parts(prompt)
    return C.render_heading(form, printed, note) + rest


def with_situation(prompt: str, old_action: int, new_action: int) -> str:
    old, new = rubric.CONTEXTS[old_action], rubric.CONTEXTS[new_action]
    if prompt.count(old) != 1 or (old_action != new_action and new in prompt):
        raise ValueError(f"prompt does not carry exactly one situation sentence of action {old_action}")
    return prompt.replace(old, new)


def conflict_record(rec: dict, label: dict) -> dict:
    """The conflict counterfactual of a variant 1/2/4 pair: situation of the rejected answer;
    chosen/rejected swapped so that "chosen" is the answer correct for the shown situation."""
    v, a, w = label["variant"], label["action"], label["wrong_action"]
    if v not in CONFLICT_VARIANTS:
        raise ValueError(
            f"pair {rec['document_id']}: variant {v} has no conflict counterfactual (only variants {CONFLICT_VARIANTS})"
        )
    shown = label["rejected_design"]["action"]
    assert shown == w != a
    new = {
        **rec,
        "prompt": with_situation(rec["prompt"], a, shown),
        "chosen": rec["rejected"],
        "rejected": rec["chosen"],
        "shown_action": shown,
    }
    if (
        not rubric.evaluate(new["chosen"], "eos", shown)["rubric_success"]
        or rubric.evaluate(new["rejected"], "eos", shown)["rubric_success"]
    ):
        raise AssertionError(f"pair {rec['document_id']}: the conflict does not flip the correct answer")
    return new


def build_counterfactuals(
    test_pairs: list[dict], labels: list[dict], revision: str, seed: int = SHORTCUT_AUDIT_SEED
) -> dict[str, list[dict]]:
    """{baseline revision name, a_..., b_..., c_..., d_conflict: [pair records]}; each record has
    document_id, prompt, chosen, rejected, variant (and shown_action for d)."""
    by_id = {lab["document_id"]: lab for lab in labels}
    if [r["document_id"] for r in test_pairs] != [lab["document_id"] for lab in labels]:
        raise ValueError("test pair inputs and labels must list the same documents in the same order")
    choices = AUDIT_HEADING_CHOICES.get(revision)
    if choices is None:
        raise ValueError(f"no heading choices for corpus revision {revision!r}")
    rng = random.Random(seed)
    perm = derangement(C.N_FAMILIES, rng)
    draws = [rng.choice(choices) for _ in test_pairs]
    base = [
        {
            "document_id": r["document_id"],
            "prompt": r["prompt"],
            "chosen": r["chosen"],
            "rejected": r["rejected"],
            "variant": by_id[r["document_id"]]["variant"],
        }
        for r in test_pairs
    ]
    out: dict[str, list[dict]] = {
        revision: base,
        "a_family_permuted": [],
        "b_heading_independent": [],
        "c_both": [],
        "d_conflict": [],
    }
    for rec, (form, note) in zip(base, draws):
        _, printed, _, _ = C.heading_parts(rec["prompt"])
        new_printed = perm[printed]
        a = {**rec, "prompt": with_family_number(rec["prompt"], new_printed)}
        b = {**rec, "prompt": with_heading(rec["prompt"], form, note)}
        c = {**rec, "prompt": with_heading(a["prompt"], form, note)}
        out["a_family_permuted"].append(a)
        out["b_heading_independent"].append(b)
        out["c_both"].append(c)
        if rec["variant"] in CONFLICT_VARIANTS:
            out["d_conflict"].append(conflict_record(rec, by_id[rec["document_id"]]))
    return out


def cue_counts(records: list[dict], originals: list[dict], labels: list[dict]) -> dict:
    """How many prompts changed, and how many still carry r001's cues by chance: a printed number
    in the true action's range (i // 40) and a heading following the r001 rule (form = v % 3,
    note = v)."""
    by_id = {lab["document_id"]: lab for lab in labels}
    orig = {r["document_id"]: r["prompt"] for r in originals}
    changed = number_in_range = r001_rule = 0
    for r in records:
        lab = by_id[r["document_id"]]
        form, printed, note, _ = C.heading_parts(r["prompt"])
        changed += r["prompt"] != orig[r["document_id"]]
        number_in_range += C.family_action(printed) == lab["action"]
        r001_rule += (form, note) == (lab["variant"] % 3, lab["variant"])
    return {
        "prompts_changed": changed,
        "printed_number_in_true_action_range": number_in_range,
        "heading_follows_r001_variant_rule": r001_rule,
    }


# ------------------------------------------------------------------------------ scoring


@torch.no_grad()
def score_records(judge, records: list[dict], ctx) -> list[float]:
    """Margins score(chosen) - score(rejected) of each record with the frozen judge."""
    pairs = encode_pairs(records, ctx.tokenizer, ctx.eos_id, ctx.profile.limits)
    margins: list[float] = []
    for i in range(0, len(pairs), BATCH_SIZE):
        chosen, rejected = pair_scores(judge, pairs[i : i + BATCH_SIZE], ctx.pad_id)  # FP32
        margins += (chosen - rejected).tolist()
    return margins


def summarise(records: list[dict], margins: list[float]) -> dict:
    """Accuracy overall and by variant (ties are misses), ties, pair counts, mean margin."""
    by_v: dict[int, list[float]] = defaultdict(list)
    for r, m in zip(records, margins):
        by_v[r["variant"]].append(m)
    n = len(margins)
    return {
        "accuracy": sum(m > 0 for m in margins) / n,
        "pairs": n,
        "ties": sum(m == 0 for m in margins),
        "mean_margin": sum(margins) / n,
        "variants": sorted(by_v),
        "by_variant": {str(v): sum(m > 0 for m in ms) / len(ms) for v, ms in sorted(by_v.items())},
        "pairs_by_variant": {str(v): len(ms) for v, ms in sorted(by_v.items())},
        "ties_by_variant": {str(v): sum(m == 0 for m in ms) for v, ms in sorted(by_v.items())},
    }


# ------------------------------------------------------------------------------ hashes


def audit_hashes(judge, ctx) -> dict[str, str]:
    """SHA-256 of the judge file and its manifest, the judge's learned/frozen fingerprints and
    every corpus file (labels, inputs, exports, manifest.json)."""
    fp = fingerprint(judge)
    out = {"judge.learned_sha256": fp["learned_sha256"], "judge.frozen_sha256": fp["frozen_sha256"]}
    for rel in ("judge/judge.safetensors", "judge/judge.safetensors.json"):
        out[rel] = sha256_file(ctx.run / rel)
    root = Path(ctx.corpus.root)
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out["corpus/" + p.relative_to(root).as_posix()] = sha256_file(p)
    return out


def _check_hashes(before: dict, after: dict, ctx) -> None:
    changed = changed_parts(before, after)
    if changed:
        raise ShortcutAuditError(
            f"the shortcut audit found {changed} changed: it must change no judge "
            f"weight, label, corpus file or judge artifact"
        )
    manifest = ctx.corpus.manifest or {}
    for rel, digest in (manifest.get("files") or {}).items():
        if before.get("corpus/" + rel) != digest:
            raise ShortcutAuditError(f"corpus file {rel} does not match its manifest hash")


# ------------------------------------------------------------------------------ the study


def run_shortcut_audit(ctx, out_dir=None) -> dict:
    """Score the test pairs under the counterfactual prompts with the frozen judge of ctx.run;
    write `out_dir`/results.json (default ctx.run/"shortcut_audit"); return the results."""
    t0 = time.perf_counter()
    out_path = Path(out_dir if out_dir is not None else ctx.run / "shortcut_audit") / "results.json"
    if out_path.exists():
        raise FileExistsError(f"{out_path} exists: the shortcut audit already ran (use a new folder)")
    judge_file = ctx.run / "judge" / "judge.safetensors"
    judge = ctx.role("judge")
    manifest = load_role(judge, judge_file)
    judge.freeze()
    before = audit_hashes(judge, ctx)
    if before["judge/judge.safetensors"] != manifest["sha256"]:
        raise ShortcutAuditError(f"{judge_file} does not match its manifest hash")

    revision = ctx.corpus.revision
    view = ctx.corpus.evaluation_view()
    test_pairs, labels = view.test_pairs(), view.labels("pair", "test")
    sets = build_counterfactuals(test_pairs, labels, revision)
    # A miniature budget scores the pairs of the first N test families only (after the draws,
    # so each kept pair has the counterfactual prompt it has in the full audit).
    kept = {r["document_id"] for r in C.first_units(test_pairs, ctx.profile.evaluation.max_units)}
    sets = {key: [r for r in records if r["document_id"] in kept] for key, records in sets.items()}
    results, scoring = {}, 0.0
    for key, records in sets.items():
        t = time.perf_counter()
        scores = score_records(judge, records, ctx)
        scoring += time.perf_counter() - t
        summary = summarise(records, scores)
        kind = "baseline" if key == revision else key
        summary.update(
            description=DESCRIPTIONS[kind], meaning=MEANINGS[kind], **cue_counts(records, sets[revision], labels)
        )
        if key == "d_conflict":
            summary["target"] = "the answer correct for the shown situation (the original rejected answer)"
        results[key] = summary

    after = audit_hashes(judge, ctx)
    _check_hashes(before, after, ctx)
    audit_summary = ctx.corpus.summary
    out = {
        "study": STUDY,
        "version": VERSION,
        "corpus": {
            "revision": revision,
            "dataset": ctx.corpus.dataset,
            "manifest_sha256": before["corpus/manifest.json"],
        },
        "profile": ctx.profile.name,
        "arithmetic": runtime.describe(),
        "seeds": {
            "counterfactuals": SHORTCUT_AUDIT_SEED,
            "counterfactual_draws": (
                "random.Random(5049): shuffle list(range(240)) until no fixed "
                "point (a), then one choice of (form, note) per test pair in "
                "file order (b); c reuses both"
            ),
            "heading_choices_b": [list(c) for c in AUDIT_HEADING_CHOICES[revision]],
            "corpus": audit_summary.get("seed"),
            **({"corpus_prompt_seeds": audit_summary["prompt_seeds"]} if "prompt_seeds" in audit_summary else {}),
        },
        "baseline": revision,
        "order": [revision, *COUNTERFACTUALS],
        "counterfactuals": results,
        "judge": {
            "file": "judge/judge.safetensors",
            "sha256": before["judge/judge.safetensors"],
            "learned_sha256": before["judge.learned_sha256"],
            "frozen_sha256": before["judge.frozen_sha256"],
        },
        "hashes_before": before,
        "hashes_after": after,
        "unchanged": True,
        "seconds": time.perf_counter() - t0,
        "scoring_seconds": scoring,  # of "seconds": the judge scoring the pairs (the rest: loading, hashing)
    }
    assert tuple(out) == RESULT_KEYS
    write_json(out_path, out)
    return out
