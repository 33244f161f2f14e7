"""The changed-answer view of a study: one held-out answer PPO changed, token by token.

The first run of the study with a test prompt whose greedy PPO answer differs from SFT's gives
its answer's teacher-forced log-probs under the PPO actor and under the SFT policy (PPO's frozen
reference), kept in seed-i/changed_answer.json and shown on the study's page.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlhf import lab
from rlhf.config import load_profile
from rlhf.evaluate import evaluation_roles
from rlhf.io import read_json, write_json
from rlhf.scoring import response_logprobs
from rlhf.tokens import collate, encode_prompt, token_texts


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
