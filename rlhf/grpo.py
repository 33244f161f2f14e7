"""GRPO (Shao et al. 2024, DeepSeekMath) for the studies' GRPO arm: no critic and no GAE. It is
an arm of the studies, not a stage of `rlhf lab` (the lab trains PPO).

One iteration (the formulas are rlhf.grpo_math's):

  1. draw P / G rollout prompts and sample G answers to each with the current actor (PPO's
     sampler, temperature and answer limit): P answers, as many as a PPO iteration's
  2. log pi_old and log pi_ref of every answer token; pay each answer as PPO pays it (the
     profile's reward design, rlhf.ppo.pay) with PPO's truncation penalty added once:
         r_i = paid_i + truncation_penalty * [cut without EOS]
     and no KL in the reward (GRPO's KL is in the loss)
  3. A_i = (r_i - mean_g r) / (sd_g r + 1e-4) within each prompt's group (group_advantages)
  4. `updates_per_iteration` actor updates on that fixed rollout, each minimising
         grpo_loss = mean_i mean_t [-min(rho A_i, clip(rho) A_i) + beta * k3_t]
     at PPO's actor learning rate schedule, clip range and gradient clip.

What PPO has, GRPO takes from it ([ppo]: iterations, prompts_per_iteration (answers),
updates_per_iteration, actor_lr, clip, temperature, truncation_penalty, checkpoint_every; the
seeds PPO draws from). What is GRPO's own (rlhf.grpo.Settings, declared by the arm): G and beta.

State (resume continues bit for bit): the actor's adapter, its optimizer, the prompt sampler, the
token sampler's generator, the system RNGs, the history. `Leg(stop=k)` returns after iteration k.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import torch

from rlhf import costs, grpo_math
from rlhf.checkpoint import Leg
from rlhf.config import Profile
from rlhf.generate import sample_like_ppo
from rlhf.io import crash_point
from rlhf.masks import response_mean
from rlhf.optim import adamw, optimizer_step
from rlhf.ppo import Answers, PromptSampler, pay, rollout_data, sync_device
from rlhf.ppo_math import clip_fraction, learning_rate, token_rewards
from rlhf.roles import Role
from rlhf.runtime import rng_state, set_rng_state
from rlhf.scoring import response_logprobs
from rlhf.tokens import Batch, Tokens, collate

GROUP_SIZE = 4  # G answers per prompt: 16 prompts of a 64-answer iteration
BETA = 0.04  # the published method's KL coefficient


@dataclass(frozen=True)
class Settings:
    """GRPO's own numbers (the rest is the profile's [ppo] table)."""

    group_size: int = GROUP_SIZE
    beta: float = BETA

    def check(self, answers_per_iteration: int) -> None:
        if self.group_size < 2:
            raise ValueError(
                f"GRPO's group size must be at least 2 (a group is its own baseline), not {self.group_size}"
            )
        if answers_per_iteration % self.group_size:
            raise ValueError(
                f"GRPO's group size {self.group_size} must divide ppo.prompts_per_iteration "
                f"({answers_per_iteration} answers per iteration)"
            )
        if not self.beta >= 0:
            raise ValueError(f"GRPO's beta must be a number >= 0, not {self.beta}")


class GrpoRoles(NamedTuple):
    """The roles GRPO runs on: no critic."""

    actor: Role
    reference: Role
    judge: Role
    members: tuple[Role, ...] = ()  # an ensemble design's other judges


class Group(NamedTuple):
    """One iteration's rollout of N = P answers in groups of G, fixed across its updates."""

    batch: Batch  # prompt + response ids, masks, positions
    logp_old: torch.Tensor  # [N, R] the sampling actor's log-prob of each sampled token
    logp_ref: torch.Tensor  # [N, R] the frozen reference's
    score: torch.Tensor  # [N] the judge's score
    rewards: torch.Tensor  # [N] paid score + truncation penalty
    advantages: torch.Tensor  # [N] group-standardised rewards
    truncated: torch.Tensor  # [N] cut at the limit without EOS


def answer_rewards(paid: torch.Tensor, mask: torch.Tensor, truncated: torch.Tensor, truncation_penalty: float):
    """``r_i = paid_i + truncation_penalty * truncated_i``: PPO's episode reward with no KL term,
    by PPO's own formula (token_rewards with a zero penalty, summed over the answer). [N]"""
    zero = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    return token_rewards(zero, paid, mask, truncated, truncation_penalty=truncation_penalty).sum(-1)


def roll_out(roles: GrpoRoles, prompt_ids, actions, tokens: Tokens, profile: Profile, settings: Settings,
             generator, timings: dict) -> Group:  # fmt: skip
    """Steps 1 to 3 of the module docstring for the drawn prompts (each repeated G times)."""
    cfg, g = profile.ppo, settings.group_size
    ids = [p for p in prompt_ids for _ in range(g)]  # [N] prompts, each G times in a row
    acts = None if actions is None else [a for a in actions for _ in range(g)]
    with costs.phase(timings, "generation", sync_device):
        gen = sample_like_ppo(roles.actor.model, ids, tokens, profile, generator)
    device = next(roles.actor.model.parameters()).device
    batch = collate(ids, gen.responses, tokens.pad_id).to(device)
    mask = batch.response_mask
    with torch.no_grad(), costs.phase(timings, "old_and_reference", sync_device):
        logp_old = response_logprobs(roles.actor.model, batch)  # [N, R]
        logp_ref = response_logprobs(roles.reference.model, batch)  # [N, R]
    truncated = torch.tensor([not e for e in gen.ended], device=device)  # [N]
    with costs.phase(timings, "judge", sync_device):
        paid = pay(roles, Answers(batch, gen.responses, truncated, acts, tokens), cfg)
    rewards = answer_rewards(paid.paid, mask, truncated, cfg.truncation_penalty)
    return Group(batch, logp_old, logp_ref, paid.score, rewards, grpo_math.group_advantages(rewards, g), truncated)


def update(roles: GrpoRoles, optimizer, group: Group, profile: Profile, settings: Settings, step: int,
           total: int) -> dict:  # fmt: skip
    """One actor update on a fixed group rollout: the GRPO loss, AdamW at PPO's actor schedule."""
    cfg, opt_cfg = profile.ppo, profile.optim
    mask = group.batch.response_mask
    logp = response_logprobs(roles.actor.model, group.batch)  # [N, R]
    loss = grpo_math.grpo_loss(logp, group.logp_old, group.logp_ref, group.advantages, mask,
                               clip=cfg.clip, beta=settings.beta)  # fmt: skip
    lr = learning_rate(step, total, cfg.actor_lr, opt_cfg.warmup_ratio, opt_cfg.min_lr_ratio)
    params = [p for p in roles.actor.learned_parameters() if p.requires_grad]
    grad_norm = optimizer_step(
        optimizer, params, loss, lr, opt_cfg.grad_clip_norm, f"GRPO stage, actor role, update {step}"
    )
    with torch.no_grad():
        per_token = group.advantages.unsqueeze(-1).expand_as(logp)
        kl = response_mean(grpo_math.k3_kl(logp, group.logp_ref), mask).mean()
        clipped = clip_fraction(logp, group.logp_old, per_token, mask, clip=cfg.clip)
    return {"loss": float(loss.detach()), "k3_kl": float(kl), "clip_fraction": float(clipped), "lr": lr,
            "grad_norm": grad_norm}  # fmt: skip


def _record(it: int, prompt_ids: list[str], group: Group, stats: list[dict]) -> dict:
    mask = group.batch.response_mask
    return {
        "iteration": it,
        "prompt_ids": prompt_ids,
        "scores": group.score.tolist(),
        "rewards": group.rewards.tolist(),
        "mean_reward": float(group.rewards.mean()),
        "zero_advantage_groups": int(
            (group.advantages.view(-1, len(group.rewards) // len(prompt_ids)) == 0).all(dim=1).sum()
        ),  # fmt: skip
        "response_length": float(mask.sum(-1).float().mean()),
        "truncations": int(group.truncated.sum()),
        **{key: [s[key] for s in stats] for key in ("loss", "k3_kl", "clip_fraction", "lr", "grad_norm")},
    }


def train_grpo(roles: GrpoRoles, view, tokens: Tokens, profile: Profile, settings: Settings,
               leg: Leg = Leg()) -> tuple[dict, dict]:  # fmt: skip
    """Run (or continue) GRPO over one leg. Returns (the state after the last iteration run, the
    seconds of each iteration's phases)."""
    cfg = profile.ppo
    settings.check(cfg.prompts_per_iteration)
    data = rollout_data(view, tokens, profile)
    decay = profile.optim.weight_decay
    optimizer = adamw([p for p in roles.actor.learned_parameters() if p.requires_grad], cfg.actor_lr, decay)
    sampler = PromptSampler(len(data.prompts), profile.seeds.ppo("data_order"))
    device = next(roles.actor.model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(profile.seeds.ppo("ppo_sampling"))
    history: dict = {"iterations": []}
    start = 0
    if leg.state is not None:
        roles.actor.load_learned_state(leg.state["actor"])
        optimizer.load_state_dict(leg.state["optimizer"])
        sampler.load(leg.state["sampler"])
        generator.set_state(leg.state["sampling_generator"])
        set_rng_state(leg.state["rng"])
        history, start = leg.state["history"], leg.state["iterations_done"]
    total = cfg.iterations * cfg.updates_per_iteration
    last = cfg.iterations if leg.stop is None else leg.stop
    seconds: list[dict] = []

    def state(done: int) -> dict:
        return {"stage": "grpo", "iterations_done": done, "actor": roles.actor.learned_state(),
                "optimizer": optimizer.state_dict(), "sampler": sampler.state(),
                "sampling_generator": generator.get_state(), "rng": rng_state(), "history": history}  # fmt: skip

    for it in range(start, last):
        crash_point("grpo.iteration")
        t, tm = time.perf_counter(), dict[str, float]()
        idx = sampler.draw(cfg.prompts_per_iteration // settings.group_size)
        actions = None if data.actions is None else [data.actions[i] for i in idx]
        group = roll_out(roles, [data.encoded[i] for i in idx], actions, tokens, profile, settings, generator, tm)
        with costs.phase(tm, "actor_update", sync_device):
            stats = [
                update(roles, optimizer, group, profile, settings, it * cfg.updates_per_iteration + u, total)
                for u in range(cfg.updates_per_iteration)
            ]
        history["iterations"].append(_record(it, [data.prompts[i]["document_id"] for i in idx], group, stats))
        tm["iteration"] = time.perf_counter() - t
        seconds.append(tm)
        if leg.progress is not None:
            leg.progress(it + 1, cfg.iterations, history, None)
        if leg.checkpoint is not None and it + 1 < last:
            leg.checkpoint(it + 1, lambda: state(it + 1))
    return state(last), {"per_iteration": seconds}
