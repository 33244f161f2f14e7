"""What PPO did to the held-out answers of a study: counted over rows and seeds, and one answer
token by token.

`answer_kinds(rows)` counts the kinds of a policy's greedy answers (ended with EOS, cut at the
token limit, each token fault on its own, recognised by the rubric, successful, repeating the
polite closing);
`study_answers(folders)` keeps every seed's per-row answers of both policies (DIR/answers.json),
so that a sentence about them can be checked. The changed-answer view: the first run of the study
with a test prompt whose greedy PPO answer differs from SFT's gives its answer's teacher-forced
log-probs under the PPO actor and under the SFT policy (PPO's frozen reference), kept in
seed-i/changed_answer.json and shown on the study's page.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlhf import lab, rubric
from rlhf.config import load_profile
from rlhf.evaluate import evaluation_roles
from rlhf.io import read_json, write_json
from rlhf.scoring import response_logprobs
from rlhf.tokens import collate, encode_prompt, finish_reason_counts, token_texts

ANSWER_KINDS = (
    "ended_with_eos",  # stopped by itself (a faulted answer too, when its last token is EOS)
    "cut_at_limit",  # finish reason length: no EOS by the token limit, its tokens plain text
    *rubric.TOKEN_FAULTS,  # out_of_vocabulary, control_token, broken_text: what the tokens hold, whatever the ending
    "recognised",  # one of the rubric's grammar forms (or a declared refusal)
    "rubric_success",
    "repeats_polite_closing",  # the polite closing sentence at least twice
)


def answer_kinds(rows: list[dict]) -> dict[str, int]:
    """{kind: count} over evaluated rows (rlhf.evaluate's, with `rubric`); 'rows' is their number.
    cut_at_limit and each fault are counted from the rows' finish reasons (docs/results.md)."""
    reasons = finish_reason_counts(r["finish_reason"] for r in rows)
    return {
        "rows": len(rows),
        "ended_with_eos": sum(r["ended_with_eos"] for r in rows),
        "cut_at_limit": reasons["length"],
        **{fault: reasons[fault] for fault in rubric.TOKEN_FAULTS},
        "recognised": sum(r["rubric"]["recognized"] for r in rows),
        "rubric_success": sum(r["rubric"]["rubric_success"] for r in rows),
        "repeats_polite_closing": sum(r["response"].count(rubric.POLITE_CLOSING) >= 2 for r in rows),
    }


def study_answers(folders: list[Path]) -> dict:
    """Every seed's greedy answers of both policies to every held-out row (answers.json)."""
    out = {}
    for folder in folders:
        ev = read_json(folder / "evaluation" / "results.json")
        by_id = {r["document_id"]: r for r in ev["policies"]["ppo"]["rows"]}
        out[folder.name] = [
            {
                "document_id": s["document_id"],
                "population": s["population"],
                **{
                    name: {
                        "response": r["response"],
                        "finish_reason": r["finish_reason"],
                        "rubric_success": r["rubric"]["rubric_success"],
                        "learned_reward": r["learned_reward"],
                    }
                    for name, r in (("sft", s), ("ppo", by_id[s["document_id"]]))
                },
            }
            for s in ev["policies"]["sft"]["rows"]
        ]
    return out


def pick_changed_row(sft_rows: list[dict], ppo_rows: list[dict]) -> tuple[dict, dict] | None:
    """The first test prompt whose greedy PPO answer differs from SFT's, preferring one where PPO
    turned a rubric failure into a success, then a success into a failure; None if none changed."""
    ppo_by_id = {r["document_id"]: r for r in ppo_rows}
    changed = [
        (s, ppo_by_id[s["document_id"]])
        for s in sft_rows
        if s["population"] == "test" and s["response_ids"] != ppo_by_id[s["document_id"]]["response_ids"]
    ]
    if not changed:
        return None

    def rank(pair):
        s, p = pair[0]["rubric"]["rubric_success"], pair[1]["rubric"]["rubric_success"]
        return 0 if (p and not s) else 1 if (s and not p) else 2

    return min(changed, key=rank)


def changed_answer_view(out: Path, folders: list[Path], revision: str) -> dict:
    """Per-token view (first run that has one) of a held-out answer PPO changed; computed once and
    kept in seed-i/changed_answer.json."""
    for i, folder in enumerate(folders):
        path = folder / "changed_answer.json"
        if path.is_file():
            return read_json(path)
        ev = read_json(folder / "evaluation" / "results.json")
        pair = pick_changed_row(ev["policies"]["sft"]["rows"], ev["policies"]["ppo"]["rows"])
        if pair is None:
            continue
        view = {"seed": i, "folder": folder.name, **token_view_of(folder, revision, *pair)}
        write_json(path, view, keep_existing=True)
        return read_json(path)
    return {"seed": None, "note": "PPO changed no greedy answer to a test prompt in any run"}


def token_view_of(folder: Path, revision: str, sft_row: dict, ppo_row: dict) -> dict:
    """Teacher-forced log-probs of each token of PPO's answer under the PPO actor and under the SFT
    policy (PPO's frozen reference), beside SFT's own answer and both rubric verdicts."""

    # Read-only: a finished run's files, hash-checked as they load (corpus, roles).
    ctx = lab.read_context(folder, load_profile(str(folder / "profile.toml")), revision)
    roles = evaluation_roles(ctx)
    prompt = encode_prompt(ctx.tokenizer, ppo_row["prompt"], ctx.profile.limits, ppo_row["document_id"])
    batch = collate([prompt], [ppo_row["response_ids"]], ctx.pad_id)
    with torch.no_grad():
        logp_ppo = response_logprobs(roles.ppo.model, batch)[0].tolist()  # [R]
        logp_sft = response_logprobs(roles.reference.model, batch)[0].tolist()  # [R]
    tokens = token_texts(ctx.tokenizer, ppo_row["response_ids"])
    return {
        "document_id": ppo_row["document_id"],
        "prompt": ppo_row["prompt"],
        "sft": {k: sft_row[k] for k in ("response", "finish_reason", "learned_reward")}
        | {"rubric_success": sft_row["rubric"]["rubric_success"], "reason": sft_row["rubric"]["reason"]},
        "ppo": {k: ppo_row[k] for k in ("response", "finish_reason", "learned_reward")}
        | {"rubric_success": ppo_row["rubric"]["rubric_success"], "reason": ppo_row["rubric"]["reason"]},
        "tokens": [
            {"token": t, "logp_ppo": a, "logp_sft": b, "log_ratio": a - b}
            for t, a, b in zip(tokens, logp_ppo, logp_sft)
        ],
    }
