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
               + truncation penalty there when the answer was cut at 64 tokens without EOS
  3. GAE       gamma 1, lambda 0.95, nothing bootstraps past the terminal; returns = A + V_old
  4. updates   2 x (actor: clipped policy loss; critic: 0.5 (V - R)^2), each averaged over a
               response's active tokens then over the 4 responses, with old log-probs,
               advantages and returns fixed across both updates.

No reward or advantage whitening, no value clipping, no entropy bonus. `logp_old` is the
behaviour log-prob recorded while sampling; the teacher-forced rescoring of the same tokens
before the first update is only compared with it (and the difference recorded).

State after each iteration (`ppo_state`) is complete: resuming from it replays the same run.
"""
from __future__ import annotations

import resource
import time

import torch

from rlhf import ppo_math
from rlhf.checkpoint import rng_state, set_rng_state
from rlhf.generate import generate
from rlhf.io import crash_point
from rlhf.masks import last_active_index
from rlhf.optim import adamw, optimizer_step
from rlhf.roles import critic_values, reward_scores
from rlhf.scoring import response_logprobs
from rlhf.tokens import collate, encode_prompt

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
        out = []
        while len(out) < k:
            if self.pointer == self.n:
                self.permutation = torch.randperm(self.n, generator=self.generator)
                self.pointer, self.epoch = 0, self.epoch + 1
            out.append(int(self.permutation[self.pointer]))
            self.pointer += 1
        return out

    def state(self) -> dict:
        return {"generator": self.generator.get_state(), "permutation": self.permutation.clone(),
                "pointer": self.pointer, "epoch": self.epoch}

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


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@torch.no_grad()
def rollout(roles: dict, prompt_ids: list[list[int]], eos_id: int, pad_id: int, profile: dict,
            sample_gen: torch.Generator, use_cache: bool, timings: dict) -> dict:
    """Sample, then score the visited prefixes with reference, judge and critic (all detached)."""
    cfg = profile["ppo"]
    device = next(roles["actor"].model.parameters()).device
    t = time.perf_counter()
    gen = generate(roles["actor"].model, prompt_ids, eos_id=eos_id, pad_id=pad_id,
                   max_new_tokens=profile["limits"]["response_tokens"], temperature=cfg["temperature"],
                   generator=sample_gen, use_cache=use_cache)
    _sync()
    timings["generation"] = time.perf_counter() - t
    batch = collate(prompt_ids, gen.responses, pad_id).to(device)
    mask = batch.response_mask
    logp_old = torch.zeros(mask.shape, dtype=torch.float32, device=device)  # [B, R]
    for b, lp in enumerate(gen.logps):
        logp_old[b, :len(lp)] = torch.tensor(lp, dtype=torch.float32, device=device)
    t = time.perf_counter()
    logp_ref = response_logprobs(roles["reference"].model, batch)          # [B, R]
    _sync()
    timings["reference"] = time.perf_counter() - t
    t = time.perf_counter()
    score = reward_scores(roles["reward"], batch)                          # [B]
    _sync()
    timings["judge"] = time.perf_counter() - t
    t = time.perf_counter()
    values = critic_values(roles["critic"], batch)                         # [B, R]
    _sync()
    timings["critic_values"] = time.perf_counter() - t
    truncated = torch.tensor([not e for e in gen.ended], device=device)   # [B]
    rewards = ppo_math.token_rewards(logp_old, logp_ref, score, mask, truncated,
                                     kl_coef=cfg["kl_coef"], truncation_penalty=cfg["truncation_penalty"])
    dones = torch.zeros_like(mask)
    dones[torch.arange(mask.shape[0], device=device), last_active_index(mask)] = True      # EOS or truncation ends it
    advantages, returns = ppo_math.gae(rewards, values, dones, gamma=cfg["gamma"], lam=cfg["lam"])
    return {"batch": batch, "responses": gen.responses, "ended": gen.ended, "logp_old": logp_old,
            "logp_ref": logp_ref, "score": score, "values": values, "rewards": rewards,
            "advantages": advantages, "returns": returns, "truncated": truncated}


def _descend(role, optimizer, loss: torch.Tensor, kind: str, step: int, total: int, profile: dict,
             where: str) -> tuple[float, float]:
    """One optimizer step of the actor or the critic at its scheduled rate: (lr, pre-clip grad norm)."""
    opt_cfg = profile["optim"]
    lr = ppo_math.learning_rate(step, total, profile["ppo"][f"{kind}_lr"], opt_cfg["warmup_ratio"],
                                opt_cfg["min_lr_ratio"])
    params = [p for p in role.learned_parameters() if p.requires_grad]
    grad_norm = optimizer_step(optimizer, params, loss, lr, opt_cfg["grad_clip_norm"],
                               f"PPO stage, {kind} role, update {step} ({where})")
    _sync()
    return lr, grad_norm


def ppo_update(roles, optimizers, ro: dict, profile: dict, step: int, total: int, where: str, timings: dict) -> dict:
    """One update of the actor, then one of the critic, on a fixed rollout."""
    cfg = profile["ppo"]
    batch, mask = ro["batch"], ro["batch"].response_mask
    t = time.perf_counter()
    logp_cur = response_logprobs(roles["actor"].model, batch)
    policy_loss = ppo_math.clipped_policy_loss(logp_cur, ro["logp_old"], ro["advantages"], mask, clip=cfg["clip"])
    lr_a, gn_a = _descend(roles["actor"], optimizers["actor"], policy_loss, "actor", step, total, profile, where)
    timings["actor_update"] = timings.get("actor_update", 0.0) + time.perf_counter() - t
    t = time.perf_counter()
    v_cur = critic_values(roles["critic"], batch)
    v_loss = ppo_math.value_loss(v_cur, ro["returns"], mask, coef=cfg["value_coef"])
    lr_c, gn_c = _descend(roles["critic"], optimizers["critic"], v_loss, "critic", step, total, profile, where)
    timings["critic_update"] = timings.get("critic_update", 0.0) + time.perf_counter() - t
    with torch.no_grad():
        clip_frac = ppo_math.clip_fraction(logp_cur, ro["logp_old"], ro["advantages"], mask, clip=cfg["clip"])
    return {"policy_loss": float(policy_loss.detach()), "value_loss": float(v_loss.detach()),
            "clip_fraction": float(clip_frac), "actor_lr": lr_a, "critic_lr": lr_c,
            "actor_grad_norm": gn_a, "critic_grad_norm": gn_c}


def token_view(tokenizer, ro: dict, b: int, profile: dict) -> list[dict]:
    """Per-token numbers of response b, for the report: token, logp_old, logp_ref, KL reward,
    value, advantage, return."""
    mask = ro["batch"].response_mask
    n = int(mask[b].sum())
    ids = ro["responses"][b][:n]
    kl_reward = ppo_math.log_ratio_penalty(ro["logp_old"], ro["logp_ref"], mask, profile["ppo"]["kl_coef"])[b, :n]
    rows = []
    for j in range(n):
        rows.append({"token": tokenizer.convert_ids_to_tokens(ids[j]) if ids[j] < len(tokenizer) else f"<id {ids[j]}>",
                     "logp_old": float(ro["logp_old"][b, j]), "logp_ref": float(ro["logp_ref"][b, j]),
                     "kl_reward": float(kl_reward[j]), "reward": float(ro["rewards"][b, j]),
                     "value": float(ro["values"][b, j]), "advantage": float(ro["advantages"][b, j]),
                     "return": float(ro["returns"][b, j])})
    return rows


def train_ppo(roles: dict, view, tokenizer, eos_id: int, pad_id: int, profile: dict, *, state: dict | None = None,
              stop_after_iteration: int | None = None, use_cache: bool = True, progress=None,
              keep_token_views: int = 3, checkpoint=None) -> tuple[dict, dict]:
    """Run (or continue) PPO. Returns (state after the last iteration run, timings).

    The state holds the actor and critic adapters/heads, both optimizers, the prompt sampler,
    the sampling generator, the system RNGs, the history and the consumed rollout ids.
    Timings are returned apart: durations are not part of the compared state. After each
    iteration (both updates done, no rollout pending) `checkpoint(iterations_done, make_state)`,
    when given, may save the state (rlhf.lab's crash-safe legs).
    """
    cfg, seeds, limits = profile["ppo"], profile["seeds"], profile["limits"]
    prompts = view.rollout_prompts()
    encoded = [encode_prompt(tokenizer, r["prompt"], limits, r["document_id"]) for r in prompts]
    actor, critic = roles["actor"], roles["critic"]
    optimizers = {"actor": adamw([p for p in actor.learned_parameters() if p.requires_grad], cfg["actor_lr"],
                                 profile["optim"]["weight_decay"]),
                  "critic": adamw([p for p in critic.learned_parameters() if p.requires_grad], cfg["critic_lr"],
                                  profile["optim"]["weight_decay"])}
    sampler = PromptSampler(len(prompts), seeds["data_order"])
    device = next(actor.model.parameters()).device
    sample_gen = torch.Generator(device=device).manual_seed(seeds["ppo_sampling"])
    history = {"iterations": [], "consumed": [], "token_views": [], "scoring_check": None}
    start = 0
    if state is not None:
        actor.load_learned_state(state["actor"])
        critic.load_learned_state(state["critic"])
        optimizers["actor"].load_state_dict(state["optimizers"]["actor"])
        optimizers["critic"].load_state_dict(state["optimizers"]["critic"])
        sampler.load(state["sampler"])
        sample_gen.set_state(state["sampling_generator"])
        set_rng_state(state["rng"])
        history = state["history"]
        start = state["iterations_done"]
    iterations = cfg["iterations"]
    updates = cfg["updates_per_iteration"]
    total = iterations * updates
    last = iterations if stop_after_iteration is None else stop_after_iteration
    timings = {"per_iteration": [], "total": {k: 0.0 for k in PHASES}}
    def make_state(done: int) -> dict:
        return {"stage": "ppo", "iterations_done": done, "actor": actor.learned_state(),
                "critic": critic.learned_state(), "reference": roles["reference"].learned_state(),
                "reward": roles["reward"].learned_state(),
                "optimizers": {k: o.state_dict() for k, o in optimizers.items()}, "sampler": sampler.state(),
                "sampling_generator": sample_gen.get_state(), "rng": rng_state(), "history": history}

    for it in range(start, last):
        crash_point("ppo.iteration")
        t_iter = time.perf_counter()
        tm: dict = {}
        idx = sampler.draw(cfg["prompts_per_iteration"])
        ro = rollout(roles, [encoded[i] for i in idx], eos_id, pad_id, profile, sample_gen, use_cache, tm)
        if history["scoring_check"] is None:
            # Behaviour log-probs (per prefix, while sampling) vs teacher-forced scoring of the
            # same tokens, before any update: recorded, never substituted.
            with torch.no_grad():
                tf = response_logprobs(actor.model, ro["batch"])
            diff = (tf - ro["logp_old"]).abs()[ro["batch"].response_mask]
            history["scoring_check"] = {"iteration": it, "max_abs_diff": float(diff.max()),
                                        "mean_abs_diff": float(diff.mean()), "tokens": int(diff.numel()),
                                        "use_cache": use_cache}
        stats = [ppo_update(roles, optimizers, ro, profile, it * updates + u, total, f"iteration {it}", tm)
                 for u in range(updates)]
        mask = ro["batch"].response_mask
        lengths = mask.sum(-1).float()
        record = {
            "iteration": it,
            "prompt_ids": [prompts[i]["document_id"] for i in idx],
            "mean_score": float(ro["score"].mean()),
            "scores": ro["score"].tolist(),
            "mean_sampled_log_ratio": float(ppo_math.mean_sampled_log_ratio(ro["logp_old"], ro["logp_ref"], mask).mean()),
            "mean_kl_penalty": float(ppo_math.log_ratio_penalty(ro["logp_old"], ro["logp_ref"], mask, cfg["kl_coef"])
                                     .sum(-1).div(lengths).mean()),
            "mean_value": float(ro["values"].sum() / mask.sum()),
            "mean_advantage": float(ro["advantages"][mask].mean()),
            "mean_return": float(ro["returns"][mask].mean()),
            "response_length": float(lengths.mean()),
            "truncations": int(ro["truncated"].sum()),
            "policy_loss": [s["policy_loss"] for s in stats],
            "value_loss": [s["value_loss"] for s in stats],
            "clip_fraction": [s["clip_fraction"] for s in stats],
            "actor_lr": [s["actor_lr"] for s in stats],
            "critic_lr": [s["critic_lr"] for s in stats],
            "actor_grad_norm": [s["actor_grad_norm"] for s in stats],
            "critic_grad_norm": [s["critic_grad_norm"] for s in stats],
        }
        history["iterations"].append(record)
        history["consumed"].extend(record["prompt_ids"])
        if len(history["token_views"]) < keep_token_views or it == iterations - 1:
            history["token_views"].append({"iteration": it, "prompt_id": record["prompt_ids"][0],
                                           "score": float(ro["score"][0]), "ended": ro["ended"][0],
                                           "tokens": token_view(tokenizer, ro, 0, profile)})
        tm["iteration"] = time.perf_counter() - t_iter
        timings["per_iteration"].append(tm)
        for k in PHASES:
            timings["total"][k] += tm.get(k, 0.0)
        if progress is not None:
            progress(it + 1, iterations, record)
        if checkpoint is not None and it + 1 < last:  # the last state is the caller's to save
            checkpoint(it + 1, lambda: make_state(it + 1))
    timings["memory"] = peak_memory()
    return make_state(last), timings
