"""Held-out evaluation (SPEC §8): greedy generations, the independent rubric, the frozen judge.

Read top to bottom:

1. `generate_heldout`    greedy answers of one policy to the 180 test prompts and the 80 probe
                         rows (260 rows over 200 distinct prompts), from prompt-only records;
                         the 4 generations of each probe context must be identical (checked).
2. `score_rows`          the frozen judge's learned reward of each (prompt, answer) and the mean
                         sampled actor/reference log-ratio of the generated tokens.
3. `rubric_rows`         the only place where gold labels (expected action) are joined, by
   `rubric_metrics`      document_id; rubric.evaluate per row, then rates per population.
4. `judge_test_accuracy` the judge on the 180 held-out test pairs (ties count as misses).
5. `bootstrap_differences`  SFT -> PPO differences with 95% percentile bootstrap intervals over
                         independent units (families, probe contexts), seed 349.
6. `politeness_exercise` (rlhf.politeness) the frozen judge scores the 80 fixed probe candidates; SHA-256
                         hashes prove that no judge weight, label or artifact changed.
7. `stage_evaluate`      all of it for the SFT and PPO policies -> evaluation/results.json.

Populations (each row belongs to test or probe; units are what is independent):

    test                 180 rows, 36 families          (unit: family)
    probe_rows            80 rows, 20 contexts           (unit: context; 4 identical rows each)
    probe_contexts        20 rows, 20 contexts           (one row per context)
    all_rows             260 rows, 56 units
    all_unique_contexts  200 rows, 56 units              (180 test prompts + 20 probe contexts)

Wording (SPEC §1, §9.5): the judge's output is the *learned reward*, a predicted score of
simulated preferences, never a measure of people's opinion of an answer. The mean of
`logp_actor - logp_reference` over the generated tokens is the *sampled log-ratio*: it can be
negative and is not the full-vocabulary KL.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import torch

from rlhf import costs, events, rubric, runtime
from rlhf.corpus import first_units
from rlhf.generate import Prefill, generate, prefill
from rlhf.io import crash_point, read_json, write_json
from rlhf.judge import encode_pairs, evaluate_pairs
from rlhf.politeness import politeness_exercise
from rlhf.ppo_math import mean_sampled_log_ratio
from rlhf.roles import EvaluationRoles, Role, assert_role_isolation, load_role, reward_scores
from rlhf.scoring import response_logprobs
from rlhf.tokens import (
    batches,
    collate,
    decode_response,
    encode_prompt,
    finish_reason_counts,
    max_new_tokens,
)

POPULATIONS = ("test", "probe_rows", "probe_contexts", "all_rows", "all_unique_contexts")
EXPECTED_ROWS = {"test": 180, "probe": 80}
EXPECTED_DISTINCT_PROMPTS = 200


class ProbeIdentityError(AssertionError):
    """The repeated greedy generations of one probe context differ."""


# ------------------------------------------------------------------------------ 1. generation


def heldout_prompts(view, max_units: int | None = None) -> list[dict]:
    """The 260 prompt-only records: 180 test prompts, then 80 probe rows (inputs, never labels);
    with `max_units`, the rows of the first N test families and N probe contexts (rlhf.corpus.first_units)."""
    records = []
    for population in ("test", "probe"):
        recs = view.prompts(population)
        if len(recs) != EXPECTED_ROWS[population]:
            raise ValueError(f"expected {EXPECTED_ROWS[population]} {population} prompts, got {len(recs)}")
        records += [{**r, "population": population} for r in first_units(recs, max_units)]
    distinct = len({r["prompt"] for r in view.prompts("test") + view.prompts("probe")})
    if distinct != EXPECTED_DISTINCT_PROMPTS:
        raise ValueError(f"expected {EXPECTED_DISTINCT_PROMPTS} distinct prompts, got {distinct}")
    return records


def populations_note(rows: list[dict]) -> str:
    """What the row counts of one policy's evaluation are (independent units, not rows)."""
    probes = [r for r in rows if r["population"] == "probe"]
    contexts = len({r["family"] for r in probes})
    return (
        f"{len(probes)} probe rows are {contexts} independent contexts; "
        f"{2 * len(rows)} generations are not {2 * len(rows)} independent cases"
    )


def check_probe_identity(rows: list[dict]) -> int:
    """Raise ProbeIdentityError unless every probe context's greedy generations are identical.

    Returns the number of probe contexts checked. Greedy decoding of the same prompt is
    deterministic, so a difference means a bug (state leaking between rows, padding-dependent
    arithmetic), not chance.
    """
    by_context: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r["population"] == "probe":
            by_context[r["family"]].append(r)
    for family, group in sorted(by_context.items()):
        if len({r["prompt"] for r in group}) != 1:
            raise ProbeIdentityError(f"probe context {family}: its rows do not share one prompt")
        first = group[0]["response_ids"]
        for r in group[1:]:
            if r["response_ids"] != first:
                raise ProbeIdentityError(
                    f"probe context {family}: greedy generation of {r['document_id']} differs from "
                    f"{group[0]['document_id']} ({len(r['response_ids'])} vs {len(first)} tokens); "
                    f"the four greedy generations of one context must be identical"
                )
    return len(by_context)


def prefills(actor_model, prompt_ids: list[list[int]], ctx) -> list[Prefill]:
    """The prompts' prefill (rlhf.generate.prefill), batch by batch as policy_draws batches
    them, for several draws from the same prompts (policy_draws's `starts`)."""
    return [
        prefill(
            actor_model,
            chunk,
            pad_id=ctx.pad_id,
            max_new_tokens=max_new_tokens(ctx.profile, "evaluation"),
            last_logits_only=ctx.profile.runtime.last_logits_only,
        )
        for chunk in batches(prompt_ids)
    ]


@torch.no_grad()
def policy_draws(
    actor_model,
    prompt_ids: list[list[int]],
    ctx,
    generator: torch.Generator | None = None,
    starts: list[Prefill] | None = None,
) -> tuple[list[list[int]], list[list[float]]]:
    """(token ids, log-probs) for each prompt: the ids as policy_responses gives them, and the
    log-prob of each drawn token under the distribution it was drawn from (FP32, EOS included;
    rlhf.generate records it as it draws). `starts`: the prompts' prefills (rlhf.evaluate.prefills),
    when several draws share them; the draws are the same bits either way."""
    chunks = list(batches(prompt_ids))
    if starts is not None and len(starts) != len(chunks):
        raise ValueError(f"{len(starts)} prefills for {len(chunks)} batches of prompts")
    responses, logps = [], []
    firsts: list[Prefill | None] = list(starts) if starts is not None else [None] * len(chunks)
    for chunk, start in zip(chunks, firsts):
        gen = generate(
            actor_model,
            chunk,
            eos_id=ctx.eos_id,
            pad_id=ctx.pad_id,
            max_new_tokens=max_new_tokens(ctx.profile, "evaluation"),
            greedy=generator is None,
            temperature=ctx.profile.ppo.temperature,
            generator=generator,
            last_logits_only=ctx.profile.runtime.last_logits_only,
            start=start,
        )
        responses += gen.responses
        logps += gen.logps
    return responses, logps


def policy_responses(
    actor_model, prompt_ids: list[list[int]], ctx, generator: torch.Generator | None = None
) -> list[list[int]]:
    """Token ids for each prompt (EOS included when the row stopped by itself): greedy when
    `generator` is None, else drawn at the profile's PPO temperature from `generator`."""
    return policy_draws(actor_model, prompt_ids, ctx, generator)[0]


def greedy_responses(actor_model, prompt_ids: list[list[int]], ctx) -> list[list[int]]:
    """Greedy token ids for each prompt (EOS included when the row stopped by itself)."""
    return policy_responses(actor_model, prompt_ids, ctx)


def generate_heldout(actor_model, ctx) -> list[dict]:
    """Greedy generation of one policy for the 180 test prompts and the 80 probe rows.

    Reads only `ctx.corpus.evaluation_view().prompts(...)`: inputs, never labels.
    Each row: document_id, family, population ("test"/"probe"), prompt, response (text),
    response_ids, finish_reason (one of rlhf.rubric.FINISH_REASONS), ended_with_eos (kept
    for every reason: a token fault's name does not say how the answer ended), length (tokens)."""
    records = heldout_prompts(ctx.corpus.evaluation_view(), ctx.profile.evaluation.max_units)
    limits = ctx.profile.limits
    prompt_ids = [encode_prompt(ctx.tokenizer, r["prompt"], limits, r["document_id"]) for r in records]
    responses = greedy_responses(actor_model, prompt_ids, ctx)
    rows = []
    for rec, p_ids, ids in zip(records, prompt_ids, responses):
        if not ids:
            raise AssertionError(f"{rec['document_id']}: greedy generation produced no token")
        text, finish = decode_response(ctx.tokenizer, ids, ctx.eos_id)
        rows.append(
            {
                "document_id": rec["document_id"],
                "family": rec["family"],
                "population": rec["population"],
                "prompt": rec["prompt"],
                "response": text,
                "response_ids": list(ids),
                "finish_reason": finish,
                "ended_with_eos": ids[-1] == ctx.eos_id,
                "length": len(ids),
                "prompt_length": len(p_ids),
            }
        )
    check_probe_identity(rows)
    return rows


# ------------------------------------------------------------------------------ 2. scoring


@torch.no_grad()
def score_batch(batch, actor_model, reference_model, judge_role) -> tuple[torch.Tensor, torch.Tensor]:
    """The judge's score and the mean sampled log-ratio of each answer of a collated batch: ([B], [B]),
    three teacher-forced passes (the judge, the actor, the reference)."""
    reward = reward_scores(judge_role, batch)
    logp_actor = response_logprobs(actor_model, batch)
    logp_ref = response_logprobs(reference_model, batch)
    return reward, mean_sampled_log_ratio(logp_actor, logp_ref, batch.response_mask)


@torch.no_grad()
def score_rows(rows: list[dict], ctx, actor_model, reference_model, judge_role) -> list[dict]:
    """New rows with `learned_reward` (frozen judge, read at the last response token, EOS
    included) and `sampled_log_ratio` (mean over the generated tokens of the teacher-forced
    log pi_actor - log pi_reference, the one scoring path rlhf.scoring.response_logprobs)."""
    limits = ctx.profile.limits
    device = next(actor_model.parameters()).device
    out = []
    for chunk in batches(rows):
        prompts = [encode_prompt(ctx.tokenizer, r["prompt"], limits, r["document_id"]) for r in chunk]
        responses = [r["response_ids"] for r in chunk]
        if any(len(ids) == 0 for ids in responses):  # generation always emits >= 1 token
            raise ValueError("a generated response has no token; it cannot be scored")
        batch = collate(prompts, responses, ctx.pad_id).to(device)
        reward, ratio = score_batch(batch, actor_model, reference_model, judge_role)
        for r, s, lr in zip(chunk, reward.tolist(), ratio.tolist()):
            out.append({**r, "learned_reward": float(s), "sampled_log_ratio": float(lr)})
    return out


# ------------------------------------------------------------------------------ 3. rubric


def expected_actions(view) -> dict[str, int]:
    """document_id -> expected action, from the gold labels of the test pairs and probes."""
    labels = view.labels("pair", "test") + view.labels("probe", "probe")
    return {lab["document_id"]: lab["action"] for lab in labels}


def rubric_rows(rows: list[dict], ctx) -> list[dict]:
    """New rows with `expected_action` and `rubric` (rlhf.rubric.evaluate). The only place
    where gold labels meet the generations, joined by document_id."""
    expected = expected_actions(ctx.corpus.evaluation_view())
    out = []
    for r in rows:
        action = expected[r["document_id"]]
        out.append(
            {**r, "expected_action": action, "rubric": rubric.evaluate(r["response"], r["finish_reason"], action)}
        )
    return out


def population_rows(rows: list[dict], population: str) -> list[dict]:
    """The rows of one published population (see the module docstring)."""
    test = [r for r in rows if r["population"] == "test"]
    probes = [r for r in rows if r["population"] == "probe"]
    first_of_context, seen = [], set()
    for r in probes:  # one row per context: its 4 greedy generations are identical
        if r["family"] not in seen:
            seen.add(r["family"])
            first_of_context.append(r)
    return {
        "test": test,
        "probe_rows": probes,
        "probe_contexts": first_of_context,
        "all_rows": test + probes,
        "all_unique_contexts": test + first_of_context,
    }[population]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def has_polite_formulas(text: str) -> bool:
    """Surface check, independent of grammar recognition: both polite formulas appear."""
    norm = rubric.normalize(text)
    return rubric.POLITE_OPENING in norm and rubric.POLITE_CLOSING in norm


def summarise(rows: list[dict]) -> dict:
    """Published fields of one population. Rates: success, recognised share and relevance over
    all rows; unsupported certainty over recognised rows only (None when none is recognised).
    `polite_formula_share` (all rows) shows the politeness shortcut even in UNCERTIFIED prose."""
    n = len(rows)
    judged = [r["rubric"] for r in rows]
    recognised = [j for j in judged if j["recognized"]]
    return {
        "n_rows": n,
        "n_independent_units": len({r["family"] for r in rows}),
        "rubric_success": sum(j["rubric_success"] for j in judged) / n,
        "recognised_share": len(recognised) / n,
        "uncertified": sum(j["status"] == rubric.UNCERTIFIED for j in judged),
        "relevance": sum(j["relevant"] for j in judged) / n,
        "unsupported_certainty": (
            sum(bool(j["unsupported_certainty"]) for j in recognised) / len(recognised) if recognised else None
        ),
        "refusals": sum(j["refusal"] for j in judged),
        "without_eos": sum(not r["ended_with_eos"] for r in rows),
        "finish_reasons": finish_reason_counts(r["finish_reason"] for r in rows),
        "polite_formula_share": sum(has_polite_formulas(r["response"]) for r in rows) / n,
        "mean_length": _mean([r["length"] for r in rows]),
        "mean_learned_reward": _mean([r["learned_reward"] for r in rows]),
        "mean_sampled_log_ratio": _mean([r["sampled_log_ratio"] for r in rows]),
    }


def summarise_populations(rows: list[dict]) -> dict:
    """{population: summarise(rows of that population)} for the five populations."""
    return {pop: summarise(population_rows(rows, pop)) for pop in POPULATIONS}


def rubric_metrics(rows: list[dict], ctx) -> dict:
    """Join the labels, evaluate every row with the rubric, and publish per population."""
    return summarise_populations(rubric_rows(rows, ctx))


# ------------------------------------------------------------------------------ 4. judge accuracy


@torch.no_grad()
def judge_test_accuracy(judge_role, ctx) -> dict:
    """The frozen judge on the 180 held-out test pairs; a tie counts as a miss. `rows` keeps
    each pair's chosen and rejected score, so that the accuracy can be recomputed from them."""
    view = ctx.corpus.evaluation_view()
    test_pairs = first_units(view.test_pairs(), ctx.profile.evaluation.max_units)
    pairs = encode_pairs(test_pairs, ctx.tokenizer, ctx.eos_id, ctx.profile.limits)
    result = evaluate_pairs(judge_role, pairs, ctx.pad_id)
    variant = {lab["document_id"]: lab["variant"] for lab in view.labels("pair", "test")}
    hits: dict[str, list[bool]] = defaultdict(list)
    for (doc_id, *_), margin in zip(pairs, result["margins"]):
        hits[str(variant[doc_id])].append(margin > 0)
    rows = [
        {"document_id": doc_id, "variant": variant[doc_id], "chosen_score": c, "rejected_score": r}
        for (doc_id, *_), c, r in zip(pairs, result["chosen_scores"], result["rejected_scores"])
    ]
    return {
        "accuracy": result["accuracy"],
        "by_variant": {v: sum(h) / len(h) for v, h in sorted(hits.items())},
        "ties": result["ties"],
        "pairs": result["pairs"],
        "rows": rows,
    }


# ------------------------------------------------------------------------------ 5. bootstrap


def _unit_table(sft_rows: list[dict], ppo_rows: list[dict], key: str):
    """Per independent unit (family or probe context): stratum, row count, SFT sum, PPO sum."""
    value = (
        (lambda r: float(r["rubric"]["rubric_success"]))
        if key == "rubric_success"
        else (lambda r: float(r["learned_reward"]))
    )
    ppo_by_id = {r["document_id"]: r for r in ppo_rows}
    units: dict[str, list] = {}
    for r in sft_rows:
        u = units.setdefault(r["family"], [r["population"], 0, 0.0, 0.0])
        u[1] += 1
        u[2] += value(r)
        u[3] += value(ppo_by_id[r["document_id"]])
    return units


def bootstrap_interval(units: dict[str, list], seed: int, resamples: int) -> tuple[float, float]:
    """95% percentile interval of the pooled PPO - SFT difference, resampling units with
    replacement inside each stratum (test families, probe contexts); a fresh torch.Generator
    seeded `seed` per call, so each interval is reproducible on its own."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(resamples, dtype=torch.float64)
    sft = torch.zeros(resamples, dtype=torch.float64)
    ppo = torch.zeros(resamples, dtype=torch.float64)
    for stratum in sorted({u[0] for u in units.values()}):
        table = torch.tensor([u[1:] for u in units.values() if u[0] == stratum], dtype=torch.float64)
        idx = torch.randint(0, table.shape[0], (resamples, table.shape[0]), generator=g)
        drawn = table[idx].sum(dim=1)  # [resamples, 3]
        counts += drawn[:, 0]
        sft += drawn[:, 1]
        ppo += drawn[:, 2]
    diffs = ppo / counts - sft / counts
    lo, hi = torch.quantile(diffs, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return lo, hi


def bootstrap_differences(sft_rows: list[dict], ppo_rows: list[dict], seed: int, resamples: int = 2000) -> dict:
    """SFT -> PPO differences in rubric success and learned reward, per population, with 95%
    percentile bootstrap intervals over independent units (families for test, contexts for
    probes, both strata for the pooled populations). Rows must carry `rubric` and
    `learned_reward`; both policies must cover the same documents. `seed`: the profile's
    evaluation seed (349, SPEC §10) in the lab."""
    if sorted(r["document_id"] for r in sft_rows) != sorted(r["document_id"] for r in ppo_rows):
        raise ValueError("SFT and PPO rows must cover the same documents")
    out: dict = {}
    for key in ("rubric_success", "learned_reward"):
        out[key] = {}
        for pop in POPULATIONS:
            units = _unit_table(population_rows(sft_rows, pop), population_rows(ppo_rows, pop), key)
            n = sum(u[1] for u in units.values())
            sft = sum(u[2] for u in units.values()) / n
            ppo = sum(u[3] for u in units.values()) / n
            lo, hi = bootstrap_interval(units, seed, resamples)
            out[key][pop] = {"sft": sft, "ppo": ppo, "diff": ppo - sft, "ci95": [lo, hi], "units": len(units)}
    return out


# ------------------------------------------------------------------------------ 7. the stage


def evaluation_roles(ctx) -> EvaluationRoles:
    """SFT actor, PPO actor, frozen reference (SFT adapters) and frozen judge, each on its own base."""
    sft_file = ctx.run / "sft" / "actor.safetensors"
    roles = EvaluationRoles(
        sft=ctx.role("actor"), ppo=ctx.role("actor"), reference=ctx.role("reference"), judge=ctx.role("judge")
    )
    load_role(roles.sft, sft_file)
    load_role(roles.ppo, ctx.run / "ppo" / "actor.safetensors")
    load_role(roles.reference, sft_file, source_kind="actor")
    roles.reference.freeze()
    load_role(roles.judge, ctx.run / "judge" / "judge.safetensors")
    roles.judge.freeze()
    assert_role_isolation(roles)
    return roles


def evaluation_artifacts(ctx) -> list[Path]:
    """Files the evaluation must leave untouched: corpus (inputs, labels, manifest), the base
    weights, the SFT/judge/PPO adapters and heads with their manifests, the profile file."""
    files = sorted(p for p in (ctx.corpus.root or ctx.run / "corpus").rglob("*") if p.is_file())
    files += sorted(ctx.model_dir.glob("*.safetensors"))
    for rel in ("sft/actor.safetensors", "judge/judge.safetensors", "ppo/actor.safetensors", "ppo/critic.safetensors"):
        for p in (ctx.run / rel, ctx.run / (rel + ".json")):
            if p.is_file():
                files.append(p)
    if ctx.profile.source is not None and Path(ctx.profile.source).is_file():
        files.append(Path(ctx.profile.source))
    return files


def evaluate_policy(name: str, actor_role: Role, roles: EvaluationRoles, ctx, seconds: dict) -> list[dict]:
    """Greedy generations of one policy, scored and checked by the rubric."""
    with costs.phase(seconds, f"{name}_generation"):
        rows = generate_heldout(actor_role.model, ctx)
    with costs.phase(seconds, f"{name}_scoring"):
        rows = score_rows(rows, ctx, actor_role.model, roles.reference.model, roles.judge)
    with costs.phase(seconds, f"{name}_rubric"):
        rows = rubric_rows(rows, ctx)
    return rows


def attach_policy_outputs(contexts: list[dict], policies: dict) -> None:
    """Show each policy's own greedy answer next to the judge's probe scores (a score gain alone
    does not prove that a policy exploits politeness)."""
    for c in contexts:
        c["policy_outputs"] = {}
        for name, pol in policies.items():
            row = next(r for r in pol["rows"] if r["family"] == c["family"])
            c["policy_outputs"][name] = {
                "response": row["response"],
                "finish_reason": row["finish_reason"],
                "polite": row["rubric"]["polite"],
                "polite_formulas": has_polite_formulas(row["response"]),
                "relevant": row["rubric"]["relevant"],
                "rubric_success": row["rubric"]["rubric_success"],
                "learned_reward": row["learned_reward"],
            }


def stage_evaluate(ctx) -> dict:
    """Evaluate the SFT and PPO policies; write ctx.run/evaluation/results.json (never overwritten)."""
    out_path = ctx.run / "evaluation" / "results.json"
    if out_path.exists():
        raise FileExistsError(f"{out_path} exists: the evaluation already ran in {ctx.run} (use a new run folder)")
    t0 = time.perf_counter()
    seconds: dict[str, float] = {}
    with costs.phase(seconds, "load_roles"):
        roles = evaluation_roles(ctx)
    artifacts = evaluation_artifacts(ctx)
    policies: dict[str, dict] = {}
    for name, policy in (("sft", roles.sft), ("ppo", roles.ppo)):
        crash_point("evaluate.policy")
        rows = evaluate_policy(name, policy, roles, ctx, seconds)
        policies[name] = {"rows": rows, "metrics": summarise_populations(rows)}
    with costs.phase(seconds, "judge_test_accuracy"):
        judge_test = judge_test_accuracy(roles.judge, ctx)
    with costs.phase(seconds, "bootstrap"):
        differences = bootstrap_differences(
            policies["sft"]["rows"], policies["ppo"]["rows"], ctx.profile.seeds.evaluation
        )
    with costs.phase(seconds, "politeness"):
        politeness = politeness_exercise(roles.judge, ctx, artifacts)
    attach_policy_outputs(politeness["contexts"], policies)
    assert_role_isolation(roles)
    seconds["total"] = time.perf_counter() - t0
    results = {
        "policies": policies,
        "judge_test": judge_test,
        "differences": differences,
        "politeness": politeness,
        "populations_note": populations_note(policies["sft"]["rows"]),
        "seconds": seconds,
        "arithmetic": runtime.describe(),
        "determinism": getattr(ctx, "determinism", None),
    }
    # Before results.json: a rerun after a crash in between evaluates again and rewrites them whole.
    ppo_iterations = len(read_json(ctx.run / "ppo" / "history.json")["iterations"])
    events.write_evaluation(ctx.run, results, ppo_iterations)
    write_json(out_path, results)
    return results
