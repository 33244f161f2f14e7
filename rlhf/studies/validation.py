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
    distance                         d = sqrt(KL), 0 where the estimate is negative
    measure_policy                   gold, proxy, truncations, UNCERTIFIED and KL from SFT
    best_of_n                        n SFT samples per prompt, the judge's favourite kept
    best_of_n_ensemble               the same samples, an ensemble's reward choosing
    score_spread                     mean and SD of the judge's scores of SFT samples

"truncations" counts the answers whose finish reason (rlhf.rubric.FINISH_REASONS) is not eos:
cut at the token limit, or holding a token fault (control_token, broken_text, out_of_vocabulary;
docs/results.md) whatever their ending. An answer with a fault that ended with EOS is one of them.

KL from the SFT policy (SPEC §12): per prompt, the mean over k temperature-1 samples y ~ pi of
``sum_t log pi(y_t | y_<t) - log pi_SFT(y_t | y_<t)``, the sampled-token estimator of the
sequence KL(pi || pi_SFT) (unbiased; one sample can be negative). log pi is the log-prob each
token was drawn with (recorded by rlhf.generate), log pi_SFT is teacher-forced through the one
scoring path (rlhf.scoring.response_logprobs).
"""

from __future__ import annotations

import math

import torch

from rlhf import rubric
from rlhf.corpus import LearningView, first_units
from rlhf.designs import Inputs, paid
from rlhf.evaluate import policy_draws, policy_responses, prefills
from rlhf.masks import masked_sum
from rlhf.roles import Role, reward_scores
from rlhf.scoring import response_logprobs
from rlhf.tokens import batches, collate, decode_response, encode_prompt

KL_ESTIMATOR = (
    "sampled-token estimator of KL(pi || pi_SFT): per prompt, the mean over k temperature-1 samples y ~ pi of "
    "sum_t [log pi(y_t | y_<t) - log pi_SFT(y_t | y_<t)], log pi as each token was drawn, log pi_SFT "
    "teacher-forced; averaged over the validation "
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
    for chunk in batches(list(zip(prompt_ids, responses))):  # rlhf.tokens' one batching, as the evaluation's
        yield collate([p for p, _ in chunk], [r for _, r in chunk], pad_id).to(device)


@torch.no_grad()
def judge_scores(judge: Role, prompt_ids, responses, ctx) -> list[float]:
    """The frozen judge's score of each (prompt, answer)."""
    device = next(judge.model.parameters()).device
    out: list[float] = []
    for batch in _batched_pairs(prompt_ids, responses, ctx.pad_id, device):
        out += reward_scores(judge, batch).tolist()
    return out


@torch.no_grad()
def sequence_log_ratios(logps: list[list[float]], sft_model, prompt_ids, responses, ctx) -> list[float]:
    """``sum_t log pi(y_t) - log pi_SFT(y_t)`` over each answer's tokens (EOS included).

    log pi(y_t) as the token was drawn (`logps`: rlhf.evaluate.policy_draws, recorded by
    rlhf.generate at temperature 1, as PPO's logp_old are), log pi_SFT(y_t) teacher-forced through
    the one scoring path. Reading the policy's term from the draw spares a second forward pass of
    the policy over every sample; through the KV cache it rounds differently from a full forward
    by about 1e-6 per token, far below the estimator's sampling error.
    """
    if [len(lp) for lp in logps] != [len(r) for r in responses]:
        raise ValueError("one log-prob per drawn token is needed: logps and responses differ in length")
    device = next(sft_model.parameters()).device
    sft: list[float] = []
    for batch in _batched_pairs(prompt_ids, responses, ctx.pad_id, device):
        sft += masked_sum(response_logprobs(sft_model, batch), batch.response_mask, dim=-1).tolist()
    return [sum(lp) - s for lp, s in zip(logps, sft)]


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


def distance(kl: float) -> float:
    """d = sqrt(KL) of a KL estimate, 0 where the estimate is negative: the sampled-token estimator
    is unbiased, so a policy close to SFT can average below 0, and such a policy is at distance 0
    (not at sqrt(|KL|))."""
    return math.sqrt(max(kl, 0.0))


def measure_policy(model, sft_model, judge: Role, view: LearningView, ctx, *, kl_samples: int, seed: int) -> dict:
    """One policy on the validation prompts: greedy gold (rubric success), proxy (the judge's
    score of the same greedy answers), truncations (cut at the limit or with a token fault),
    UNCERTIFIED, and the KL from SFT estimated on `kl_samples` temperature-1 samples per prompt
    drawn from a generator seeded `seed` (0: none, KL 0, for the SFT policy itself)."""
    records = validation_prompts(view, ctx.profile.evaluation.max_units)
    prompt_ids = encode_records(records, ctx)
    starts = prefills(model, prompt_ids, ctx)  # the greedy answers and every sample start from them
    greedy = policy_draws(model, prompt_ids, ctx, starts=starts)[0]
    verdicts = rubric_verdicts(records, greedy, ctx)
    scores = judge_scores(judge, prompt_ids, greedy, ctx)
    if kl_samples and ctx.profile.ppo.temperature != 1.0:
        raise ValueError(
            f"the KL estimate needs temperature-1 samples of the policy; the profile samples at "
            f"ppo.temperature = {ctx.profile.ppo.temperature}"
        )
    generator = torch.Generator().manual_seed(seed)
    per_prompt = [0.0] * len(records)
    for _ in range(kl_samples):
        sampled, logps = policy_draws(model, prompt_ids, ctx, generator, starts)
        for i, v in enumerate(sequence_log_ratios(logps, sft_model, prompt_ids, sampled, ctx)):
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
        "d": distance(kl),
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


def sft_draws(sft_model, records: list[dict], prompt_ids, ctx, *, n: int, seed: int) -> list[dict]:
    """n temperature-1 SFT samples per prompt, from one generator seeded `seed`, each checked by
    the rubric: [n] of {"responses": [P], "verdicts": [P]}. The draws best-of-n ranks, under one
    judge or under an ensemble (the same seed gives the same samples)."""
    generator = torch.Generator().manual_seed(seed)
    starts = prefills(sft_model, prompt_ids, ctx)  # every draw starts from the same prefill
    out = []
    for _ in range(n):
        resp = policy_draws(sft_model, prompt_ids, ctx, generator, starts)[0]
        out.append({"responses": resp, "verdicts": rubric_verdicts(records, resp, ctx)})
    return out


def _successes(draws: list[dict]) -> list[list[bool]]:
    """[P][n]: whether each prompt's j-th draw is a rubric success."""
    return [[bool(d["verdicts"][p]["rubric_success"]) for d in draws] for p in range(len(draws[0]["verdicts"]))]


def best_of_n_points(scores: list[list[float]], draws: list[dict], ns: tuple[int, ...]) -> list[dict]:
    """For every n: the favourite of the first n samples of each prompt by `scores` ([n_max][P],
    the ranking reward), its gold, that reward and its truncations (kept answers cut at the limit
    or with a token fault) over the prompts, with the KL bound of best-of-n."""
    n_max, prompts = len(scores), len(scores[0])
    out = []
    for n in ns:
        picked = [best_of([scores[j][p] for j in range(n_max)], n) for p in range(prompts)]
        verdicts = [draws[j]["verdicts"][p] for p, j in enumerate(picked)]
        out.append(
            {
                "n": n,
                "gold": _mean([v["rubric_success"] for v in verdicts]),
                "proxy": _mean([scores[j][p] for p, j in enumerate(picked)]),
                "truncations": sum(v["finish_reason"] != "eos" for v in verdicts),
                "kl_bound": bon_kl_bound(n),
                "d_bound": math.sqrt(bon_kl_bound(n)),
            }
        )
    return out


def best_of_n(sft_model, judge: Role, view: LearningView, ctx, *, ns: tuple[int, ...], seed: int) -> dict:
    """max(ns) temperature-1 SFT samples per validation prompt (generator seeded `seed`), each
    scored by the judge and checked by the rubric; for every n, the judge's favourite of the
    first n is kept and its gold and proxy averaged. Sample 0 of each prompt is the SFT's
    temperature-1 answer whose judge scores give the spread sigma (score_spread)."""
    records = validation_prompts(view, ctx.profile.evaluation.max_units)
    prompt_ids = encode_records(records, ctx)
    draws = sft_draws(sft_model, records, prompt_ids, ctx, n=max(ns), seed=seed)
    scores = [judge_scores(judge, prompt_ids, d["responses"], ctx) for d in draws]  # [n_max][P]
    first_scores = scores[0]
    return {
        "seed": seed,
        "samples_per_prompt": max(ns),
        "points": best_of_n_points(scores, draws, ns),
        "spread": {"mean": _mean(first_scores), "sd": _sd(first_scores), "n": len(first_scores)},
        "scores": [[s[p] for s in scores] for p in range(len(records))],
        "successes": _successes(draws),
    }


def best_of_n_ensemble(
    sft_model, members: list[Role], view: LearningView, ctx, *, ns: tuple[int, ...], seed: int, designs: tuple[str, ...]
) -> dict:
    """Best-of-n ranked by an ensemble's reward instead of one judge: the same draws as best_of_n
    (same seed), each scored by every member (member 0 the lab's judge, so its scores are
    best_of_n's), combined per ensemble design through the one scoring path
    (rlhf.designs.paid, the reward PPO pays under that design, before the truncation
    penalty), and for every n the favourite of the first n by that reward kept. The truncation
    flag passed is finish reason != eos, so it also marks an answer with a token fault that ended
    with EOS, which a PPO rollout (truncated: no EOS by the token limit) does not mark; the
    ensemble designs read no truncation flag, so no kept answer depends on the difference."""
    records = validation_prompts(view, ctx.profile.evaluation.max_units)
    prompt_ids = encode_records(records, ctx)
    draws = sft_draws(sft_model, records, prompt_ids, ctx, n=max(ns), seed=seed)
    member_scores = [[judge_scores(m, prompt_ids, d["responses"], ctx) for d in draws] for m in members]  # [k][n][P]
    out: dict = {
        "seed": seed,
        "samples_per_prompt": max(ns),
        "ensemble_size": len(members),
        "ensemble_lambda": ctx.profile.ppo.ensemble_lambda,
        "member_scores": member_scores,
        "successes": _successes(draws),
        "designs": {},
    }
    for design in designs:
        rewards = []
        for j, d in enumerate(draws):
            s = torch.tensor(
                [member_scores[k][j] for k in range(len(members))], dtype=torch.float32
            )  # [k, P], as PPO holds them
            truncated_or_faulted = torch.tensor([v["finish_reason"] != "eos" for v in d["verdicts"]])  # [P]
            cfg = ctx.profile.ppo
            r = paid(
                design,
                Inputs(
                    s[0],
                    truncated_or_faulted,
                    member_scores=s,
                    score_mean=cfg.score_mean,
                    score_sd=cfg.score_sd,
                    ensemble_lambda=cfg.ensemble_lambda,
                ),
            )
            rewards.append(r.tolist())
        out["designs"][design] = {"points": best_of_n_points(rewards, draws, ns), "rewards": rewards}
    return out


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
