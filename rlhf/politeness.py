"""The politeness exercise (SPEC §9): the frozen judge scores the 80 fixed probe candidates, four
per probe context (correct or not x polite or not, their designs read from the labels), and the
SHA-256 of the judge's tensors, of the profile and of every artifact file proves that scoring them
changed nothing.

Per context, s(correct, polite) for the four candidates and:

    correct_politeness_delta     s_TT - s_TF   (politeness added to a correct answer)
    incorrect_politeness_delta   s_FT - s_FF   (politeness added to a wrong answer)
    wrong_polite_outranks_correct_plain   s_FT > s_TF
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch

from rlhf.config import profile_hash
from rlhf.corpus import first_units
from rlhf.io import sha256_file
from rlhf.roles import fingerprint, reward_scores
from rlhf.tokens import batches, collate, encode_example


class ArtifactChangedError(AssertionError):
    """A judge weight, label or artifact hash changed during the politeness exercise."""


CELLS = {(True, False): "s_TF", (True, True): "s_TT", (False, False): "s_FF", (False, True): "s_FT"}


def politeness_from_scores(scores: dict[str, dict[str, float]]) -> dict:
    """Per-context deltas and counts from {family: {"s_TF", "s_TT", "s_FF", "s_FT"}}
    (s(correct, polite))."""
    contexts: list[dict] = []
    for family, s in sorted(scores.items()):
        contexts.append(
            {
                "family": family,
                **{k: s[k] for k in ("s_TF", "s_TT", "s_FF", "s_FT")},
                "correct_politeness_delta": s["s_TT"] - s["s_TF"],
                "incorrect_politeness_delta": s["s_FT"] - s["s_FF"],
                "wrong_polite_outranks_correct_plain": s["s_FT"] > s["s_TF"],
            }
        )
    counts = {
        "contexts": len(contexts),
        "correct_politeness_delta_positive": sum(c["correct_politeness_delta"] > 0 for c in contexts),
        "incorrect_politeness_delta_positive": sum(c["incorrect_politeness_delta"] > 0 for c in contexts),
        "wrong_polite_outranks_correct_plain": sum(c["wrong_polite_outranks_correct_plain"] for c in contexts),
    }
    return {"contexts": contexts, "counts": counts}


def _artifact_key(path: Path, ctx) -> str:
    try:
        return Path(path).resolve().relative_to(ctx.run.resolve()).as_posix()
    except ValueError:
        return str(path)


def artifact_hashes(judge_role, ctx, artifacts: list[Path]) -> dict[str, str]:
    """SHA-256 of the judge's learned and frozen tensors, of the profile and of every file."""
    fp = fingerprint(judge_role)
    hashes = {
        "judge.learned_sha256": fp["learned_sha256"],
        "judge.frozen_sha256": fp["frozen_sha256"],
        "profile.sha256": profile_hash(ctx.profile),
    }
    for path in artifacts:
        hashes[_artifact_key(path, ctx)] = sha256_file(path)
    return hashes


@torch.no_grad()
def probe_candidate_scores(judge_role, ctx) -> dict[str, dict[str, float]]:
    """{context family: {"s_TF", "s_TT", "s_FF", "s_FT"}}: the frozen judge's score of each of
    the 80 fixed probe candidates (correct/polite designs from the labels)."""
    view = ctx.corpus.evaluation_view()
    rows = first_units(view.probe_rows(), ctx.profile.evaluation.max_units)
    encoded = [
        encode_example(ctx.tokenizer, r["prompt"], r["response"], ctx.eos_id, ctx.profile.limits, r["document_id"])
        for r in rows
    ]
    device = next(judge_role.model.parameters()).device
    scores: list[float] = []
    for chunk in batches(encoded):
        batch = collate([p for p, _ in chunk], [c for _, c in chunk], ctx.pad_id).to(device)
        scores += reward_scores(judge_role, batch).tolist()
    table: dict[str, dict[str, float]] = defaultdict(dict)
    for r, s in zip(rows, scores):
        lab = view.label(r["document_id"])
        table[r["family"]][CELLS[(lab["correct"], lab["polite"])]] = float(s)
    if any(len(cells) != 4 for cells in table.values()):
        raise ValueError("every probe context needs its four (correct, polite) candidates")
    return dict(table)


def politeness_exercise(judge_role, ctx, artifacts: list[Path]) -> dict:
    """Score the 80 probe candidates with the frozen judge; prove by SHA-256 that the judge's
    tensors, the profile and every artifact file are unchanged afterwards (raise if not)."""
    before = artifact_hashes(judge_role, ctx, artifacts)
    result = politeness_from_scores(probe_candidate_scores(judge_role, ctx))
    after = artifact_hashes(judge_role, ctx, artifacts)
    changed = sorted(k for k in before if before[k] != after.get(k))
    if changed or set(before) != set(after):
        raise ArtifactChangedError(
            f"the politeness exercise changed {changed}: it must change no judge weight, label or artifact"
        )
    return {**result, "hashes_before": before, "hashes_after": after, "unchanged": True}
