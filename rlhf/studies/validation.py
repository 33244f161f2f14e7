"""Measurements on the validation prompts only: what the SFT budget and the frontier read.

Every function here takes the corpus's *learning view* (rlhf.corpus.LearningView: train
demonstrations, train/validation pairs, rollout prompts; it refuses test inputs, probes and gold
labels), so no test prompt can inform a choice made from these numbers. The validation prompts
are the prompts of the 180 validation pairs; the action a prompt calls for is read from its
pair's chosen answer (rlhf.rubric.chosen_actions), not from a label.

    validation_prompts(view)         [{document_id, family, prompt, expected_action}] (180)
    answers(model, prompt_ids, ctx)  greedy, or temperature-1 samples from a seeded generator
    judge_scores / rubric_verdicts   the frozen judge's score and the rubric's verdict per answer
    sequence_log_ratios              sum_t (log pi(y_t) - log pi_SFT(y_t)) per sampled answer
    measure_policy                   gold, proxy, truncations, UNCERTIFIED and KL from SFT
    best_of_n                        n SFT samples per prompt, the judge's favourite kept
    score_spread                     mean and SD of the judge's scores of SFT samples

KL from the SFT policy (SPEC §12): per prompt, the mean over k temperature-1 samples y ~ pi of
``sum_t log pi(y_t | y_<t) - log pi_SFT(y_t | y_<t)``, the sampled-token estimator of the
sequence KL(pi || pi_SFT) (unbiased; one sample can be negative). Both log-probs are
teacher-forced through the one scoring path (rlhf.scoring.response_logprobs).
"""

from __future__ import annotations

import math

import torch

from rlhf import rubric
from rlhf.corpus import LearningView, first_units
from rlhf.evaluate import policy_responses
from rlhf.masks import masked_sum
from rlhf.roles import Role, reward_scores
from rlhf.scoring import response_logprobs
from rlhf.tokens import collate, decode_response, encode_prompt

BATCH_SIZE = 32
KL_ESTIMATOR = (
    "sampled-token estimator of KL(pi || pi_SFT): per prompt, the mean over k temperature-1 samples y ~ pi of "
    "sum_t [log pi(y_t | y_<t) - log pi_SFT(y_t | y_<t)], both teacher-forced; averaged over the validation "
    "prompts. Unbiased for the sequence KL; one sample (and so a small average) can be negative, and d = "
    "sqrt(max(KL, 0))"
)


def validation_prompts(view: LearningView, max_units: int | None = None) -> list[dict]:
    """[{document_id, family, prompt, expected_action}] of the validation pairs, the action read
    from the chosen answers; `max_units` keeps the first N families (miniature budgets). Takes
    the learning view only (it cannot serve a test prompt)."""
    if not isinstance(view, LearningView):
        raise TypeError(f"validation measurements read a LearningView only, not {type(view).__name__}")
    pairs = first_units(view.pairs("validation"), max_units)
    actions = rubric.chosen_actions(pairs)
    keys = ("document_id", "family", "prompt")
    return [{**{k: r[k] for k in keys}, "expected_action": actions[r["family"]]} for r in pairs]


def encode_records(records: list[dict], ctx) -> list[list[int]]:
    return [encode_prompt(ctx.tokenizer, r["prompt"], ctx.profile.limits, r["document_id"]) for r in records]


def answers(model, prompt_ids: list[list[int]], ctx, generator: torch.Generator | None = None) -> list[list[int]]:
    """Greedy answers (generator None) or one temperature-1 sample per prompt id."""
    return policy_responses(model, prompt_ids, ctx, generator)


def _batched_pairs(prompt_ids, responses, pad_id: int, device):
    for i in range(0, len(prompt_ids), BATCH_SIZE):
        yield collate(prompt_ids[i : i + BATCH_SIZE], responses[i : i + BATCH_SIZE], pad_id).to(device)


@torch.no_grad()
def judge_scores(judge: Role, prompt_ids, responses, ctx) -> list[float]:
    """The frozen judge's score of each (prompt, answer)."""
    device = next(judge.model.parameters()).device
    out: list[float] = []
    for batch in _batched_pairs(prompt_ids, responses, ctx.pad_id, device):
        out += reward_scores(judge, batch).tolist()
    return out


@torch.no_grad()
def sequence_log_ratios(model, sft_model, prompt_ids, responses, ctx) -> list[float]:
    """``sum_t log pi(y_t) - log pi_SFT(y_t)`` over each answer's tokens (EOS included)."""
    device = next(model.parameters()).device
    out: list[float] = []
    for batch in _batched_pairs(prompt_ids, responses, ctx.pad_id, device):
        diff = response_logprobs(model, batch) - response_logprobs(sft_model, batch)  # [B, R]
        out += masked_sum(diff, batch.response_mask, dim=-1).tolist()
    return out


def rubric_verdicts(records: list[dict], responses, ctx) -> list[dict]:
    """rlhf.rubric.evaluate of each answer against its prompt's expected action, with the text."""
    out = []
    for r, ids in zip(records, responses):
        text, finish = decode_response(ctx.tokenizer, ids, ctx.eos_id)
        out.append({**rubric.evaluate(text, finish, r["expected_action"]), "response": text, "finish_reason": finish})
    return out


def _mean(xs) -> float:
    return sum(xs) / len(xs)


def _sd(xs) -> float:
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def measure_policy(model, sft_model, judge: Role, view: LearningView, ctx, *, kl_samples: int, seed: int) -> dict:
    """One policy on the validation prompts: greedy gold (rubric success), proxy (the judge's
    score of the same greedy answers), truncations, UNCERTIFIED, and the KL from SFT estimated on
    `kl_samples` temperature-1 samples per prompt drawn from a generator seeded `seed` (0: none,
    KL 0, for the SFT policy itself)."""
    records = validation_prompts(view, ctx.profile.evaluation.max_units)
    prompt_ids = encode_records(records, ctx)
    greedy = answers(model, prompt_ids, ctx)
    verdicts = rubric_verdicts(records, greedy, ctx)
    scores = judge_scores(judge, prompt_ids, greedy, ctx)
    generator = torch.Generator().manual_seed(seed)
    per_prompt = [0.0] * len(records)
    for _ in range(kl_samples):
        sampled = answers(model, prompt_ids, ctx, generator)
        for i, v in enumerate(sequence_log_ratios(model, sft_model, prompt_ids, sampled, ctx)):
            per_prompt[i] += v / kl_samples
    n = len(records)
    kl = _mean(per_prompt)
    return {
        "n": n,
        "gold": sum(v["rubric_success"] for v in verdicts) / n,
        "proxy": _mean(scores),
        "truncations": sum(v["finish_reason"] != "eos" for v in verdicts),
        "uncertified": sum(v["status"] == rubric.UNCERTIFIED for v in verdicts),
        "recognised_share": sum(v["recognized"] for v in verdicts) / n,
        "kl": kl,
        "kl_se": _sd(per_prompt) / math.sqrt(n),
        "d": math.sqrt(max(kl, 0.0)),
        "kl_samples_per_prompt": kl_samples,
        "kl_seed": seed,
        "rows": [
            {
                "document_id": r["document_id"],
                "response": v["response"],
                "finish_reason": v["finish_reason"],
                "rubric_success": v["rubric_success"],
                "status": v["status"],
                "learned_reward": s,
                "kl": k,
            }
            for r, v, s, k in zip(records, verdicts, scores, per_prompt)
        ],
    }


def bon_kl_bound(n: int) -> float:
    """Upper bound of KL(best-of-n || pi_SFT): ``log n - (n - 1) / n`` (exact only without ties)."""
    if n < 1:
        raise ValueError(f"best-of-n needs n >= 1, not {n}")
    return math.log(n) - (n - 1) / n


def best_of(scores: list[float], n: int) -> int:
    """Index of the judge's favourite among the first n samples (the first one on a tie)."""
    first = scores[:n]
    return first.index(max(first))


def best_of_n(sft_model, judge: Role, view: LearningView, ctx, *, ns: tuple[int, ...], seed: int) -> dict:
    """max(ns) temperature-1 SFT samples per validation prompt (generator seeded `seed`), each
    scored by the judge and checked by the rubric; for every n, the judge's favourite of the
    first n is kept and its gold and proxy averaged. Sample 0 of each prompt is the SFT's
    temperature-1 answer whose judge scores give the spread sigma (score_spread)."""
    records = validation_prompts(view, ctx.profile.evaluation.max_units)
    prompt_ids = encode_records(records, ctx)
    generator = torch.Generator().manual_seed(seed)
    samples: list[dict] = []  # [n_max] of {"verdicts": [P], "scores": [P]}
    for _ in range(max(ns)):
        resp = answers(sft_model, prompt_ids, ctx, generator)
        samples.append(
            {"verdicts": rubric_verdicts(records, resp, ctx), "scores": judge_scores(judge, prompt_ids, resp, ctx)}
        )
    out = []
    for n in ns:
        picked = [best_of([samples[j]["scores"][p] for j in range(max(ns))], n) for p in range(len(records))]
        out.append(
            {
                "n": n,
                "gold": _mean([samples[j]["verdicts"][p]["rubric_success"] for p, j in enumerate(picked)]),
                "proxy": _mean([samples[j]["scores"][p] for p, j in enumerate(picked)]),
                "truncations": sum(samples[j]["verdicts"][p]["finish_reason"] != "eos" for p, j in enumerate(picked)),
                "kl_bound": bon_kl_bound(n),
                "d_bound": math.sqrt(bon_kl_bound(n)),
            }
        )
    first_scores = samples[0]["scores"]
    return {
        "seed": seed,
        "samples_per_prompt": max(ns),
        "points": out,
        "spread": {"mean": _mean(first_scores), "sd": _sd(first_scores), "n": len(first_scores)},
        "scores": [[s["scores"][p] for s in samples] for p in range(len(records))],
        "successes": [[bool(s["verdicts"][p]["rubric_success"]) for s in samples] for p in range(len(records))],
    }


def score_spread(sft_model, judge: Role, prompts: list[dict], ctx, *, seed: int) -> dict:
    """Mean and SD of the judge's scores of one temperature-1 SFT sample per prompt."""
    prompt_ids = encode_records(prompts, ctx)
    resp = answers(sft_model, prompt_ids, ctx, torch.Generator().manual_seed(seed))
    scores = judge_scores(judge, prompt_ids, resp, ctx)
    return {"mean": _mean(scores), "sd": _sd(scores), "n": len(scores), "seed": seed}


@torch.no_grad()
def validation_rubric_success(actor_model, view: LearningView, ctx) -> dict:
    """Greedy answers of `actor_model` to the validation prompts, checked by the rubric."""
    records = validation_prompts(view)
    verdicts = rubric_verdicts(records, answers(actor_model, encode_records(records, ctx), ctx), ctx)
    n = len(verdicts)
    return {
        "n": n,
        "rubric_success": sum(v["rubric_success"] for v in verdicts) / n,
        "recognised_share": sum(v["recognized"] for v in verdicts) / n,
        "relevant_share": sum(v["relevant"] for v in verdicts) / n,
    }
