"""The judge refresh of the 'iterated-judge' reward design: a stage the PPO loop calls.

A judge trained once, on the corpus's pairs, is asked during PPO about answers unlike any it
was trained on. Iterated online RLHF (InstructGPT; Bai et al. 2022) labels the current
policy's own answers and trains the judge on them. Here, after PPO iteration n = K, 2K, ...
(K = `ppo.refresh_every`; never after the last iteration):

  1. sample   `ppo.refresh_prompts` train (rollout) prompts, two temperature-1 answers of the
              current actor to each                                     (the refresh generator)
  2. label    the simulated labeller (`label_pair`): the rule every corpus pair obeys (its
              chosen answer is a rubric success, its rejected one is not), applied to the two
              answers on the train family's action: a success beats a non-success; a pair where
              both or neither succeed gives no label. So an answer cut without EOS, with a
              token fault (a control token, broken text, an id past the tokenizer) or with
              UNCERTIFIED prose loses to any success. The record counts each finish reason.
  3. measure  the judge's accuracy on the new labelled pairs: how wrong it had become
  4. train    `ppo.refresh_updates` Bradley-Terry updates of judge.pairs_per_update pairs each,
              half drawn from the policy pairs labelled so far (this refresh's and earlier ones'),
              half from the corpus's train pairs (so the judge keeps what it knew), at the
              constant rate judge.lr * ppo.refresh_lr_ratio, by a fresh AdamW
  5. measure  the accuracy on the same new pairs again (after training on them: in-sample)

PPO then continues against the refreshed judge. The labeller reads train prompts and train
families only (`labeller_verdict` refuses anything else). What a resume needs (the judge's
adapters and head, the generator, the labelled pairs) is part of the PPO state (rlhf.ppo), so
a run resumed across a refresh equals the uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from rlhf import designs, rubric
from rlhf.config import Profile
from rlhf.generate import sample_like_ppo
from rlhf.io import crash_point
from rlhf.judge import evaluate_pairs, pair_scores
from rlhf.optim import adamw, optimizer_step
from rlhf.ppo_math import bradley_terry_loss
from rlhf.roles import PpoRoles
from rlhf.tokens import Tokens, decode_response, finish_reason_counts


class Pool(Protocol):
    """What a refresh draws from: PPO's rollout prompts (rlhf.ppo.RolloutData is one)."""

    @property
    def prompts(self) -> list[dict]: ...  # the rollout prompt records
    @property
    def encoded(self) -> list[list[int]]: ...  # their chat-rendered ids
    @property
    def by_family(self) -> dict[str, int]: ...  # each train family's action (the labeller's)
    @property
    def corpus_pairs(self) -> list | None: ...  # the encoded train pairs the judge keeps training on


ANSWERS_PER_PROMPT = 2  # the labeller compares two answers of one prompt


def label_pair(a: dict, b: dict) -> int | None:
    """The simulated labeller on the rubric verdicts (rlhf.rubric.evaluate) of two answers to one
    train prompt: 0 when answer a is preferred, 1 when b is, None (no label) when both or neither
    are a rubric success."""
    if a["rubric_success"] == b["rubric_success"]:
        return None
    return 0 if a["rubric_success"] else 1


def labeller_verdict(record: dict, response_ids: list[int], tokenizer, eos_id: int, actions: dict[str, int]) -> dict:
    """The rubric verdict of one answer to the train prompt `record`, with its `finish_reason`
    (rlhf.tokens.decode_response), on its family's action as
    the train pairs' chosen answers give it (`actions`: rlhf.rubric.chosen_actions of the train
    pairs). A prompt outside the train split or of a family without train pairs is refused: the
    labeller never reads anything held out."""
    if record.get("split") != "train" or record.get("family") not in actions:
        raise ValueError(
            f"the refresh labeller reads train prompts of train families only; {record.get('document_id')!r} "
            f"is split {record.get('split')!r}, family {record.get('family')!r}"
        )
    text, finish = decode_response(tokenizer, response_ids, eos_id)
    return {**rubric.evaluate(text, finish, actions[record["family"]]), "finish_reason": finish}


def refresh_due(done: int, profile: Profile) -> bool:
    """Whether the judge is refreshed after `done` iterations: at multiples of K, never after the last."""
    cfg = profile.ppo
    return (
        designs.design(cfg.reward_design).refreshes_judge
        and done % cfg.refresh_every == 0
        and 0 < done < cfg.iterations
    )


@dataclass
class RefreshData:
    """What refreshes carry from one to the next (saved in the PPO state under "refresh")."""

    generator: torch.Generator  # prompts, answers and update batches of every refresh
    pairs: list  # the policy pairs labelled so far: [document_id, prompt_ids, chosen_ids, rejected_ids]

    def state(self) -> dict:
        return {"generator": self.generator.get_state(), "pairs": [list(p) for p in self.pairs]}


def start(profile: Profile, device, state: dict | None = None) -> RefreshData:
    """Fresh from seeds.judge_refresh (plus ppo_offset), or restored from a PPO state's "refresh"."""
    generator = torch.Generator(device=device).manual_seed(profile.seeds.ppo("judge_refresh"))
    if state is None:
        return RefreshData(generator, [])
    generator.set_state(state["generator"])
    return RefreshData(generator, [tuple(p) for p in state["pairs"]])


def _draw(n: int, k: int, generator: torch.Generator) -> list[int]:
    """k indices in [0, n), with replacement, from the refresh generator."""
    return torch.randint(n, (k,), generator=generator, device=generator.device).tolist()


def refresh_judge(roles: PpoRoles, data: RefreshData, pool: Pool, tokens: Tokens, profile: Profile, done: int) -> dict:
    """One refresh after `done` PPO iterations (see the module docstring): the actor answers
    prompts of PPO's pool (its rollout prompts and their ids), the labeller reads each family's
    action (`pool.by_family`), and `roles.judge` is trained in place on the labelled pairs and the
    encoded train pairs (`pool.corpus_pairs`), then frozen again. Returns its record."""
    cfg, gen = profile.ppo, data.generator
    judge, prompts, encoded, pad_id = roles.judge, pool.prompts, pool.encoded, tokens.pad_id
    assert pool.corpus_pairs is not None  # made for this design (rlhf.ppo.rollout_data)
    crash_point("ppo.refresh")
    chosen = torch.randperm(len(prompts), generator=gen, device=gen.device)[: cfg.refresh_prompts].tolist()
    asked = [i for i in chosen for _ in range(ANSWERS_PER_PROMPT)]
    out = sample_like_ppo(roles.actor.model, [encoded[i] for i in asked], tokens, profile, gen)
    verdicts = [
        labeller_verdict(prompts[i], ids, tokens.tokenizer, tokens.eos_id, pool.by_family)
        for i, ids in zip(asked, out.responses)
    ]
    new = []
    for j, i in enumerate(chosen):
        a, b = 2 * j, 2 * j + 1
        label = label_pair(verdicts[a], verdicts[b])
        if label is not None:
            win, lose = (a, b) if label == 0 else (b, a)
            new.append((prompts[i]["document_id"], encoded[i], out.responses[win], out.responses[lose]))
    data.pairs.extend(new)
    record = {
        "after_iteration": done,
        "prompts": len(chosen),
        "answers": len(asked),
        "successes": sum(v["rubric_success"] for v in verdicts),
        "without_eos": sum(not e for e in out.ended),
        "finish_reasons": finish_reason_counts(v["finish_reason"] for v in verdicts),
        "new_pairs": len(new),
        "pairs_so_far": len(data.pairs),
        "accuracy_before": evaluate_pairs(judge, new, pad_id)["accuracy"] if new else None,
    }
    if not data.pairs:  # nothing labelled yet: the judge stays as it is
        return {**record, "updates": 0, "losses": [], "lr": None, "accuracy_after": None}
    lr = profile.judge.lr * cfg.refresh_lr_ratio
    params = judge.learned_parameters()
    for p in params:
        p.requires_grad_(True)
    optimizer = adamw(params, lr, profile.optim.weight_decay)
    half = profile.judge.pairs_per_update // 2
    losses = []
    for u in range(cfg.refresh_updates):
        crash_point("ppo.refresh_update")
        batch = [data.pairs[k] for k in _draw(len(data.pairs), half, gen)]
        corpus = pool.corpus_pairs
        batch += [corpus[k] for k in _draw(len(corpus), profile.judge.pairs_per_update - half, gen)]
        loss = bradley_terry_loss(*pair_scores(judge, batch, pad_id))
        where = f"judge refresh after iteration {done}, update {u}"
        optimizer_step(optimizer, params, loss, lr, profile.optim.grad_clip_norm, where)
        losses.append(float(loss.detach()))
    judge.freeze()
    after = evaluate_pairs(judge, new, pad_id)["accuracy"] if new else None
    return {**record, "updates": cfg.refresh_updates, "losses": losses, "lr": lr, "accuracy_after": after}
