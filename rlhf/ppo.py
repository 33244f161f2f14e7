"""PPO, token by token (SPEC §6), readable top to bottom.

One iteration:

  1. rollout   4 prompts from a seeded permutation of the 672 rollout prompts; the actor
               samples one response each (temperature 1, full vocabulary). For every visited
               prefix we keep, as detached data:
                 logp_old [B, R]  the sampling actor's log-prob of the sampled token
                 logp_ref [B, R]  the frozen reference's log-prob of that token
                 values   [B, R]  the critic's V before the token
                 score    [B]     the frozen judge's score at the last active token
  2. rewards   r_t = -kl_coef * (logp_old_t - logp_ref_t); + score at the last token;
               + truncation penalty there when the answer was cut at 64 tokens without EOS.
               The score is the judge's (SPEC §6) unless the profile declares another
               `ppo.reward_design` (rlhf.designs): a judge ensemble's mean, minimum or
               mean - lambda * SD, the frontier study's alternatives, or the iterated judge's
  3. GAE       gamma 1, lambda 0.95, nothing bootstraps past the terminal; returns = A + V_old
  4. updates   2 x (actor: clipped policy loss; critic: 0.5 (V - R)^2), each averaged over a
               response's active tokens then over the 4 responses, with old log-probs,
               advantages and returns fixed across both updates.

No reward or advantage whitening, no value clipping, no entropy bonus. `logp_old` is the
behaviour log-prob recorded while sampling; the teacher-forced rescoring of the same tokens
before the first update is only compared with it (and the difference recorded).

With the 'iterated-judge' design, the judge is refreshed after every K iterations
(rlhf.refresh: the current actor's answers to train prompts labelled by the rubric's rule, the
judge trained on them), and PPO continues against the refreshed judge.

State after each iteration (`ppo_state`) is complete: resuming from it replays the same run.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from rlhf import costs, designs, ppo_math, refresh, rubric
from rlhf.checkpoint import Leg
from rlhf.config import Ppo, Profile
from rlhf.generate import sample_like_ppo
from rlhf.io import crash_point
from rlhf.judge import encode_pairs
from rlhf.masks import last_active_index, masked_sum
from rlhf.optim import adamw, optimizer_step
from rlhf.roles import PpoRoles, Role, critic_values, reward_scores
from rlhf.runtime import rng_state, set_rng_state
from rlhf.scoring import response_logprobs
from rlhf.tokens import Batch, Tokens, collate, decode_response, encode_prompt, token_texts

# Where each role's learned tensors sit in a PPO state. The state format keeps the judge under
# "reward", its earlier name: renaming the key would change every PPO state's bytes, and
# with them the golden hashes (tests_reproducibility/golden_embedded.json). Insertion order is the
# state's key order.
STATE_KEYS = {"actor": "actor", "critic": "critic", "reference": "reference", "judge": "reward"}
TOKEN_VIEWS = 3  # the history keeps a token view of the first 3 iterations and of the last
QUANTILES = torch.linspace(0, 1, 11)  # the advantage distribution's deciles, min and max, logged per iteration
PHASES = ("generation", "reference", "judge", "critic_values", "actor_update", "critic_update", "iteration")


class PromptSampler:
    """A seeded permutation over the rollout prompts, reshuffled when exhausted."""

    def __init__(self, n: int, seed: int):
        self.n = n
        self.generator = torch.Generator().manual_seed(seed)
        self.permutation = torch.randperm(n, generator=self.generator)
        self.pointer = 0
        self.epoch = 0

    def draw(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.pointer == self.n:
                self.permutation = torch.randperm(self.n, generator=self.generator)
                self.pointer, self.epoch = 0, self.epoch + 1
            out.append(int(self.permutation[self.pointer]))
            self.pointer += 1
        return out

    def state(self) -> dict:
        return {
            "generator": self.generator.get_state(),
            "permutation": self.permutation.clone(),
            "pointer": self.pointer,
            "epoch": self.epoch,
        }

    def load(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.permutation = state["permutation"].clone()
        self.pointer, self.epoch = state["pointer"], state["epoch"]


def peak_memory() -> dict:
    mem = {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if torch.cuda.is_available():
        mem["cuda_peak_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        mem["cuda_peak_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
    return mem


def sync_device():
    """On a GPU, wait for the queued kernels (so a phase is charged its own work); nothing on a CPU."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@dataclass
class Rollout:
    """One iteration's rollout: detached data, fixed across both updates of the iteration.
    B responses, R response positions (right-padded; `batch.response_mask` marks the active ones)."""

    batch: Batch  # prompt + response ids, attention mask, positions, response mask
    responses: list[list[int]]  # the sampled ids of each response, EOS included
    ended: list[bool]  # [B] ended with EOS (else cut at the token limit)
    entropy: torch.Tensor  # [B, R] entropy of the distribution each token was drawn from (0 where masked)
    logp_old: torch.Tensor  # [B, R] the sampling actor's log-prob of each sampled token
    logp_ref: torch.Tensor  # [B, R] the frozen reference's log-prob of that token
    score: torch.Tensor  # [B]    the frozen judge's score at the last active token
    member_scores: torch.Tensor | None  # [k, B] every ensemble member's score (member 0: `score`); None without one
    paid: torch.Tensor  # [B]    the score the last token receives (rlhf.designs; = score by default)
    values: torch.Tensor  # [B, R] the critic's V before each token
    penalty: torch.Tensor  # [B, R] -kl_coef * (logp_old - logp_ref) on active tokens, 0 elsewhere
    rewards: torch.Tensor  # [B, R] penalty per token + score (and truncation) once at the end
    advantages: torch.Tensor  # [B, R] GAE, gamma 1, lambda 0.95
    returns: torch.Tensor  # [B, R] advantages + values
    truncated: torch.Tensor  # [B]    bool, cut at the token limit without EOS


# ------------------------------------------------------------------------- what a rollout pays


class Answers(NamedTuple):
    """What a reward design may read of one rollout's answers."""

    batch: Batch  # prompt + response ids, masks and positions
    responses: list[list[int]]  # the sampled ids, EOS included
    truncated: torch.Tensor  # [B] cut at the token limit without EOS
    actions: list[int] | None  # each prompt's action, from the train pairs (the oracle design only)
    tokens: Tokens


class Paid(NamedTuple):
    """A design's scores of one rollout's answers."""

    score: torch.Tensor  # [B] the frozen judge's score at the last active token (recorded under every design)
    member_scores: torch.Tensor | None  # [k, B] every ensemble member's score (member 0: `score`); None without one
    paid: torch.Tensor  # [B] what the last token receives, before the truncation penalty


class Judges(Protocol):
    """What paying reads of the roles: the judge, and an ensemble design's other judges."""

    @property
    def judge(self) -> Role: ...

    @property
    def members(self) -> tuple[Role, ...]: ...


def pay(roles: Judges, answers: Answers, cfg: Ppo) -> Paid:
    """Pay each answer its design's score (rlhf.designs): the judge's score s always (recorded
    under every design), and what else the design reads, gathered here; then the design's formula."""
    d = designs.design(cfg.reward_design)
    score = reward_scores(roles.judge, answers.batch)  # [B]
    members = None
    if d.ensemble:
        if len(roles.members) != cfg.ensemble_size - 1:
            raise ValueError(
                f"reward design {cfg.reward_design} with ensemble_size {cfg.ensemble_size} needs "
                f"{cfg.ensemble_size - 1} more judges beside the lab's, got {len(roles.members)}"
            )
        members = torch.stack([score] + [reward_scores(m, answers.batch) for m in roles.members])  # [k, B]
    success = _rubric_success(answers, score.device) if d.reads_target else None
    inputs = designs.Inputs(score, answers.truncated, success, members, cfg.score_mean, cfg.score_sd,
                            cfg.ensemble_lambda)  # fmt: skip
    return Paid(score, members, designs.paid(cfg.reward_design, inputs))


def _rubric_success(answers: Answers, device) -> torch.Tensor:
    """The rubric's success on each answer against its own prompt's action (SPEC §12 (iv)). [B]"""
    if answers.actions is None:
        raise ValueError("the oracle reward design needs each prompt's action")
    verdicts = [
        rubric.evaluate(*decode_response(answers.tokens.tokenizer, ids, answers.tokens.eos_id), action)
        for ids, action in zip(answers.responses, answers.actions)
    ]
    return torch.tensor([float(v["rubric_success"]) for v in verdicts], device=device)


# ------------------------------------------------------------------------- a rollout


class Prompts(NamedTuple):
    """The prompts of one rollout."""

    ids: list[list[int]]  # [B] each prompt's chat-rendered ids
    actions: list[int] | None  # [B] each prompt's action, from the train pairs (the oracle design only)


@torch.no_grad()
def rollout(
    roles: PpoRoles, prompts: Prompts, tokens: Tokens, profile: Profile, generator: torch.Generator, timings: dict
) -> Rollout:
    """Sample, then score the visited prefixes with reference, judge and critic (all detached),
    pay each answer its design's score (`pay`), and compute the per-token penalty (once: the
    rewards, the history and the token view read it), rewards, advantages and returns."""
    cfg = profile.ppo
    with costs.phase(timings, "generation", sync_device):
        gen = sample_like_ppo(roles.actor.model, prompts.ids, tokens, profile, generator)
    if len(gen.entropies) != len(gen.logps):
        raise ValueError("a PPO rollout is sampled: every drawn token has its distribution's entropy")
    device = next(roles.actor.model.parameters()).device
    batch = collate(prompts.ids, gen.responses, tokens.pad_id).to(device)
    mask = batch.response_mask
    logp_old = _per_token(gen.logps, mask)  # [B, R]
    with costs.phase(timings, "reference", sync_device):
        logp_ref = response_logprobs(roles.reference.model, batch)  # [B, R]
    truncated = torch.tensor([not e for e in gen.ended], device=device)  # [B]
    answers = Answers(batch, gen.responses, truncated, prompts.actions, tokens)
    with costs.phase(timings, "judge", sync_device):
        scores = pay(roles, answers, cfg)
    with costs.phase(timings, "critic_values", sync_device):
        values = critic_values(roles.critic, batch)  # [B, R]
    penalty = ppo_math.log_ratio_penalty(logp_old, logp_ref, mask, cfg.kl_coef)  # [B, R]
    rewards = ppo_math.token_rewards(penalty, scores.paid, mask, truncated, truncation_penalty=cfg.truncation_penalty)
    dones = torch.zeros_like(mask)
    dones[torch.arange(mask.shape[0], device=device), last_active_index(mask)] = True  # EOS or truncation ends it
    advantages, returns = ppo_math.gae(rewards, values, dones, gamma=cfg.gamma, lam=cfg.lam)
    return Rollout(
        batch=batch,
        responses=gen.responses,
        ended=gen.ended,
        entropy=_per_token(gen.entropies, mask),
        logp_old=logp_old,
        logp_ref=logp_ref,
        score=scores.score,
        member_scores=scores.member_scores,
        paid=scores.paid,
        values=values,
        penalty=penalty,
        rewards=rewards,
        advantages=advantages,
        returns=returns,
        truncated=truncated,
    )


def _per_token(rows: list[list[float]], mask: torch.Tensor) -> torch.Tensor:
    """Per-token values of each response (a list per row) -> [B, R] FP32, 0 past each row's end."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)  # [B, R]
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.tensor(row, dtype=torch.float32, device=mask.device)
    return out


def _descend(
    role, optimizer, loss: torch.Tensor, kind: str, step: int, total: int, profile: Profile, where: str
) -> tuple[float, float]:
    """One optimizer step of the actor or the critic at its scheduled rate: (lr, pre-clip grad norm)."""
    opt_cfg = profile.optim
    lr = ppo_math.learning_rate(
        step,
        total,
        profile.ppo.actor_lr if kind == "actor" else profile.ppo.critic_lr,
        opt_cfg.warmup_ratio,
        opt_cfg.min_lr_ratio,
    )
    params = [p for p in role.learned_parameters() if p.requires_grad]
    grad_norm = optimizer_step(
        optimizer, params, loss, lr, opt_cfg.grad_clip_norm, f"PPO stage, {kind} role, update {step} ({where})"
    )
    sync_device()
    return lr, grad_norm


def ppo_update(
    roles: PpoRoles,
    optimizers: dict[str, torch.optim.Optimizer],
    ro: Rollout,
    profile: Profile,
    step: int,
    total: int,
    where: str,
    timings: dict,
) -> dict:
    """One update of the actor, then one of the critic, on a fixed rollout."""
    cfg = profile.ppo
    batch, mask = ro.batch, ro.batch.response_mask
    t = time.perf_counter()
    logp_cur = response_logprobs(roles.actor.model, batch)
    policy_loss = ppo_math.clipped_policy_loss(logp_cur, ro.logp_old, ro.advantages, mask, clip=cfg.clip)
    lr_a, gn_a = _descend(roles.actor, optimizers["actor"], policy_loss, "actor", step, total, profile, where)
    timings["actor_update"] = timings.get("actor_update", 0.0) + time.perf_counter() - t
    t = time.perf_counter()
    v_cur = critic_values(roles.critic, batch)
    v_loss = ppo_math.value_loss(v_cur, ro.returns, mask, coef=cfg.value_coef)
    lr_c, gn_c = _descend(roles.critic, optimizers["critic"], v_loss, "critic", step, total, profile, where)
    timings["critic_update"] = timings.get("critic_update", 0.0) + time.perf_counter() - t
    with torch.no_grad():
        clip_frac = ppo_math.clip_fraction(logp_cur, ro.logp_old, ro.advantages, mask, clip=cfg.clip)
        moved = ppo_math.update_shift(logp_cur, ro.logp_old, mask)
    return {
        "policy_loss": float(policy_loss.detach()),
        "value_loss": float(v_loss.detach()),
        "clip_fraction": float(clip_frac),
        "update_shift": float(moved),
        "actor_lr": lr_a,
        "critic_lr": lr_c,
        "actor_grad_norm": gn_a,
        "critic_grad_norm": gn_c,
    }


def token_view(tokenizer, ro: Rollout, b: int) -> list[dict]:
    """Per-token numbers of response b, for the report: token, logp_old, logp_ref, KL reward
    (the rollout's penalty), value, advantage, return."""
    n = int(ro.batch.response_mask[b].sum())
    ids = ro.responses[b][:n]
    kl_reward = ro.penalty[b, :n]
    texts = token_texts(tokenizer, ids)
    rows = []
    for j in range(n):
        rows.append(
            {
                "token": texts[j],
                "logp_old": float(ro.logp_old[b, j]),
                "logp_ref": float(ro.logp_ref[b, j]),
                "kl_reward": float(kl_reward[j]),
                "reward": float(ro.rewards[b, j]),
                "value": float(ro.values[b, j]),
                "advantage": float(ro.advantages[b, j]),
                "return": float(ro.returns[b, j]),
            }
        )
    return rows


# ------------------------------------------------------------------------- the PPO loop


def train_ppo(roles: PpoRoles, view, tokens: Tokens, profile: Profile, leg: Leg = Leg()) -> tuple[dict, dict]:
    """Run (or continue) PPO. Returns (state after the last iteration run, timings).

    restore -> for each iteration: rollout, 2 x ppo_update, record [-> judge refresh] -> save.
    The state holds the actor and critic adapters/heads, both optimizers, the prompt sampler,
    the sampling generator, the system RNGs, the history and the consumed rollout ids (and,
    for the iterated judge, the judge as refreshed and what refreshes carry). Timings are returned
    apart: durations are not part of the compared state. After each iteration (both updates
    done, no rollout pending) the leg (rlhf.checkpoint.Leg) is told of progress and may save the
    state (rlhf.lab's crash-safe legs); it stops after `leg.stop` iterations.
    """
    cfg = profile.ppo
    data = rollout_data(view, tokens, profile)
    run = _restore(roles, profile, len(data.prompts), leg.state)
    last = cfg.iterations if leg.stop is None else leg.stop
    timings: dict = {"per_iteration": [], "total": {k: 0.0 for k in PHASES}}
    if run.start > 0 and leg.watch is not None and leg.watch(run.history):  # stopped there before
        last = run.start
    for it in range(run.start, last):
        crash_point("ppo.iteration")
        measured = iteration(roles, run, data, it, tokens, profile)
        timings["per_iteration"].append(measured.seconds)
        for k in PHASES:
            timings["total"][k] += measured.seconds.get(k, 0.0)
        if refresh.refresh_due(it + 1, profile):
            assert run.refresh is not None  # made for this design
            run.history["refreshes"].append(refresh.refresh_judge(roles, run.refresh, data, tokens, profile, it + 1))
        if leg.progress is not None:
            leg.progress(it + 1, cfg.iterations, run.history, measured)
        if leg.watch is not None and leg.watch(run.history):  # a warning stops PPO here
            last = it + 1
            break
        if leg.checkpoint is not None and it + 1 < last:  # the last state is the caller's to save
            leg.checkpoint(it + 1, lambda: _ppo_state(roles, run, it + 1))
    timings["memory"] = peak_memory()
    return _ppo_state(roles, run, last), timings


class Measured(NamedTuple):
    """What one iteration hands its leg besides the history (neither is part of the state)."""

    seconds: dict[str, float]  # its phases (rlhf.costs.PHASES) and the whole iteration
    rewards: dict[str, float]  # reward_sums of its rollout


def reward_sums(ro: Rollout) -> dict[str, float]:
    """Each answer's summed penalty and its whole reward, averaged over the B answers, from the
    rollout's own tensors (the rewards GAE read), summed in float64:

        non_score_reward = mean_b sum_t penalty[b, t]      penalty = -beta * (logp_old - logp_ref)
        rlhf_reward      = mean_b sum_t rewards[b, t]      (paid score, truncation penalty, penalty)"""
    return {
        "non_score_reward": float(ro.penalty.double().sum(-1).mean()),
        "rlhf_reward": float(ro.rewards.double().sum(-1).mean()),
    }


def iteration(roles: PpoRoles, run: PpoRun, data: RolloutData, it: int, tokens: Tokens, profile: Profile) -> Measured:
    """PPO iteration `it` (SPEC §6): draw prompts, roll out with the old policy, then the
    updates of actor and critic on that fixed rollout, recorded in the history. Returns its
    phases' seconds and its rollout's reward sums."""
    cfg = profile.ppo
    t, tm = time.perf_counter(), dict[str, float]()
    idx = run.sampler.draw(cfg.prompts_per_iteration)
    actions = None if data.actions is None else [data.actions[i] for i in idx]
    ro = rollout(roles, Prompts([data.encoded[i] for i in idx], actions), tokens, profile, run.sample_gen, tm)
    if run.history["scoring_check"] is None:
        run.history["scoring_check"] = _scoring_check(roles.actor, ro, it, tokens.use_cache)
    updates = cfg.updates_per_iteration
    stats = [
        ppo_update(
            roles, run.optimizers, ro, profile, it * updates + u, cfg.iterations * updates, f"iteration {it}", tm
        )
        for u in range(updates)
    ]
    record = _record(it, [data.prompts[i]["document_id"] for i in idx], ro, stats, cfg)
    _append_history(run.history, record, ro, tokens.tokenizer, profile)
    tm["iteration"] = time.perf_counter() - t
    return Measured(tm, reward_sums(ro))


class RolloutData(NamedTuple):
    """What PPO's iterations draw from: the rollout prompts, and what a reward design reads."""

    prompts: list[dict]  # the 672 rollout prompt records (inputs only)
    encoded: list[list[int]]  # their chat-rendered ids
    actions: list[int] | None  # each prompt's family action (the oracle design)
    by_family: dict  # family -> action, from the train pairs (the oracle and the iterated judge's labeller)
    corpus_pairs: list | None  # the train pairs the iterated judge keeps training on


def rollout_data(view, tokens: Tokens, profile: Profile) -> RolloutData:
    cfg, limits = profile.ppo, profile.limits
    prompts = view.rollout_prompts()
    encoded = [encode_prompt(tokens.tokenizer, r["prompt"], limits, r["document_id"]) for r in prompts]
    # The train family's action, read from the train pairs (SPEC §12 (iv); the refresh's labeller).
    design = designs.design(cfg.reward_design)
    by_family = {}
    if design.needs_actions:
        by_family = rubric.chosen_actions(view.pairs("train"))
    actions = [by_family[r["family"]] for r in prompts] if design.reads_target else None
    corpus_pairs = None
    if design.refreshes_judge:  # what the judge keeps training on beside the policy's pairs
        corpus_pairs = encode_pairs(view.pairs("train"), tokens.tokenizer, tokens.eos_id, limits)
    return RolloutData(prompts, encoded, actions, by_family, corpus_pairs)


class PpoRun(NamedTuple):
    """What a PPO run carries from iteration to iteration besides the roles (saved by _ppo_state)."""

    optimizers: dict[str, torch.optim.Optimizer]  # "actor", "critic": AdamW over each one's learned tensors
    sampler: PromptSampler  # which rollout prompts each iteration draws
    sample_gen: torch.Generator  # the token sampler's generator
    history: dict  # iterations, consumed prompts, token views, scoring check (history.json)
    start: int  # the first iteration to run
    refresh: refresh.RefreshData | None = None  # the iterated judge's refreshes (None for other designs)


def _restore(roles: PpoRoles, profile: Profile, n_prompts: int, state: dict | None) -> PpoRun:
    """Optimizers, prompt sampler, sampling generator and history: fresh from the profile's
    seeds, or restored (with the roles' learned tensors and the system RNGs) from `state`."""
    cfg, seeds, decay = profile.ppo, profile.seeds, profile.optim.weight_decay
    actor, critic = roles.actor, roles.critic
    optimizers: dict[str, torch.optim.Optimizer] = {
        "actor": adamw([p for p in actor.learned_parameters() if p.requires_grad], cfg.actor_lr, decay),
        "critic": adamw([p for p in critic.learned_parameters() if p.requires_grad], cfg.critic_lr, decay),
    }
    sampler = PromptSampler(n_prompts, seeds.ppo("data_order"))
    device = next(actor.model.parameters()).device
    sample_gen = torch.Generator(device=device).manual_seed(seeds.ppo("ppo_sampling"))
    iterated = designs.design(cfg.reward_design).refreshes_judge
    if state is None:
        history: dict = {"iterations": [], "consumed": [], "token_views": [], "scoring_check": None}
        if iterated:
            history["refreshes"] = []
        return PpoRun(optimizers, sampler, sample_gen, history, 0, refresh.start(profile, device) if iterated else None)
    actor.load_learned_state(state["actor"])
    critic.load_learned_state(state["critic"])
    optimizers["actor"].load_state_dict(state["optimizers"]["actor"])
    optimizers["critic"].load_state_dict(state["optimizers"]["critic"])
    sampler.load(state["sampler"])
    sample_gen.set_state(state["sampling_generator"])
    set_rng_state(state["rng"])
    data = None
    if iterated:  # the judge as last refreshed
        roles.judge.load_learned_state(state[STATE_KEYS["judge"]])
        data = refresh.start(profile, device, state["refresh"])
    return PpoRun(optimizers, sampler, sample_gen, state["history"], state["iterations_done"], data)


@torch.no_grad()
def _scoring_check(actor, ro: Rollout, it: int, use_cache: bool) -> dict:
    """Behaviour log-probs (per prefix, while sampling) vs teacher-forced scoring of the same
    tokens, before any update: recorded, never substituted."""
    tf = response_logprobs(actor.model, ro.batch)
    diff = (tf - ro.logp_old).abs()[ro.batch.response_mask]
    return {
        "iteration": it,
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "tokens": int(diff.numel()),
        "use_cache": use_cache,
    }


def _record(it: int, prompt_ids: list[str], ro: Rollout, stats: list[dict], cfg: Ppo) -> dict:
    """The history line of one iteration: what was sampled and scored, and both updates."""
    mask = ro.batch.response_mask
    lengths = mask.sum(-1).float()
    return {
        "iteration": it,
        "prompt_ids": prompt_ids,
        "mean_score": float(ro.score.mean()),
        "scores": ro.score.tolist(),
        "mean_sampled_log_ratio": float(ppo_math.mean_sampled_log_ratio(ro.logp_old, ro.logp_ref, mask).mean()),
        "mean_kl_penalty": float(ro.penalty.sum(-1).div(lengths).mean()),
        "mean_value": float(ro.values.sum() / mask.sum()),
        "mean_advantage": float(ro.advantages[mask].mean()),
        "mean_return": float(ro.returns[mask].mean()),
        "response_length": float(lengths.mean()),
        "truncations": int(ro.truncated.sum()),
        # Over-optimisation signals a user has without gold (docs/signals.md).
        "mean_sequence_log_ratio": float(
            masked_sum(ppo_math.sampled_log_ratio(ro.logp_old, ro.logp_ref, mask), mask, dim=-1).mean()
        ),
        "entropy": float(ro.entropy[mask].mean()),
        "advantage_quantiles": torch.quantile(ro.advantages[mask], QUANTILES.to(ro.advantages.device)).tolist(),
        # Only a declared alternative design adds these (the default's history, and so its state, is SPEC §6's).
        **(
            {}
            if cfg.reward_design == designs.DEFAULT
            else {"reward_design": cfg.reward_design, "paid_scores": ro.paid.tolist()}
        ),
        **({} if ro.member_scores is None else {"member_scores": ro.member_scores.tolist()}),
        **{
            key: [s[key] for s in stats]
            for key in (
                "policy_loss",
                "value_loss",
                "clip_fraction",
                "update_shift",
                "actor_lr",
                "critic_lr",
                "actor_grad_norm",
                "critic_grad_norm",
            )
        },
    }


def _append_history(history: dict, record: dict, ro: Rollout, tokenizer, profile: Profile) -> None:
    """The iteration's record, its consumed rollout ids, and (first few and last) a token view."""
    history["iterations"].append(record)
    history["consumed"].extend(record["prompt_ids"])
    if len(history["token_views"]) < TOKEN_VIEWS or record["iteration"] == profile.ppo.iterations - 1:
        history["token_views"].append(
            {
                "iteration": record["iteration"],
                "prompt_id": record["prompt_ids"][0],
                "score": float(ro.score[0]),
                "ended": ro.ended[0],
                "tokens": token_view(tokenizer, ro, 0),
            }
        )


def _ppo_state(roles: PpoRoles, run: PpoRun, done: int) -> dict:
    """Everything a resume needs after `done` iterations (no rollout pending)."""
    by_kind = roles.by_kind()
    return {
        "stage": "ppo",
        "iterations_done": done,
        **{STATE_KEYS[kind]: by_kind[kind].learned_state() for kind in STATE_KEYS},
        "optimizers": {k: o.state_dict() for k, o in run.optimizers.items()},
        "sampler": run.sampler.state(),
        "sampling_generator": run.sample_gen.get_state(),
        "rng": rng_state(),
        "history": run.history,
        **({} if run.refresh is None else {"refresh": run.refresh.state()}),
    }
