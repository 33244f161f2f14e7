"""DPO (Rafailov et al. 2023) for the studies' DPO arm: the SFT actor's adapter trained directly
on the preference pairs the judge learns from (the train split only), the SFT actor frozen as the
reference. It is an arm of the studies, not a stage of `rlhf lab` (the lab trains PPO).

An update takes `pairs_per_update` pairs and minimises rlhf.dpo_math.dpo_loss,

    -mean log sigma(beta * [(log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))])

with each answer's log-prob summed over its response mask. The policy and the reference read
the same padded batch (the chosen answers, then the rejected ones), so before the first update
(policy = reference) every margin is exactly 0 and the loss is log 2.

What PPO's actor has, DPO takes from it: the actor's LoRA adapter, its peak learning rate
(`ppo.actor_lr`), AdamW with the profile's weight decay, warm-up and linear decay, the gradient
clip ([optim]) and the data-order seed. What is DPO's own (rlhf.config.Dpo, declared by the arm):
beta, epochs, pairs per update. The epoch loop, its schedule, crash checkpoints and resume are
SFT's and the judge's (rlhf.optim.train_epochs): `Leg(stop=k)` returns after epoch k with a state
that `Leg(state=s)` continues bit for bit.

Each epoch records, on the validation pairs: the DPO loss, the implicit reward's accuracy (the
chosen answer's beta * log(pi / pi_ref) above the rejected one's; a tie is a miss) and the mean
implicit rewards of both answers. They never select anything.
"""

from __future__ import annotations

import dataclasses

import torch

from rlhf.checkpoint import Leg
from rlhf.config import Dpo, Profile
from rlhf.dpo_math import dpo_loss, dpo_margin, sequence_logp
from rlhf.judge import encode_pairs
from rlhf.optim import epoch_budget, train_epochs
from rlhf.scoring import response_logprobs
from rlhf.tokens import collate

BETA = 0.1  # TRL's DPOConfig default: the arm's beta when a study declares none
PAIRS_PER_UPDATE = 8  # the judge's


def budget(profile: Profile, n_pairs: int, *, beta: float = BETA, epochs: int = 1) -> Dpo:
    """A DPO arm's budget over `n_pairs` train pairs: PPO's actor learning rate, the judge's
    pairs per update, and the profile's miniature cuts of the judge (a test profile's)."""
    cut = profile.judge.max_updates_per_epoch
    draft = Dpo(epochs=epochs, lr=profile.ppo.actor_lr, expected_updates=1, beta=beta,
                pairs_per_update=PAIRS_PER_UPDATE, max_updates_per_epoch=cut,
                max_validation_examples=profile.judge.max_validation_examples)  # fmt: skip
    return dataclasses.replace(draft, expected_updates=epoch_budget(n_pairs, PAIRS_PER_UPDATE, draft)[1])


def sequence_logps(model, pairs, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(y_w | x) and log pi(y_l | x) of `pairs` under `model`, in one padded batch: ([P], [P])."""
    device = next(model.parameters()).device
    batch = collate([p[1] for p in pairs] * 2, [p[2] for p in pairs] + [p[3] for p in pairs], pad_id).to(device)
    logp = sequence_logp(response_logprobs(model, batch), batch.response_mask)  # [2P]
    return logp[: len(pairs)], logp[len(pairs) :]


def pair_loss(actor, reference, pairs, pad_id: int, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(DPO loss of `pairs`, their margins m [P]) with gradient through the actor only."""
    chosen, rejected = sequence_logps(actor.model, pairs, pad_id)
    with torch.no_grad():
        ref_chosen, ref_rejected = sequence_logps(reference.model, pairs, pad_id)
    loss = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=beta)
    return loss, dpo_margin(chosen.detach(), rejected.detach(), ref_chosen, ref_rejected)


@torch.no_grad()
def evaluate_dpo_pairs(actor, reference, pairs, pad_id: int, beta: float, batch_size: int = 16) -> dict:
    """On a pair set: the DPO loss (mean over pairs), the accuracy of the implicit reward
    beta * log(pi / pi_ref) (chosen above rejected; a tie is a miss) and both answers' mean
    implicit reward."""
    losses, margins, chosen_rewards, rejected_rewards = [], [], [], []
    for i in range(0, len(pairs), batch_size):
        part = pairs[i : i + batch_size]
        c, r = sequence_logps(actor.model, part, pad_id)
        rc, rr = sequence_logps(reference.model, part, pad_id)
        losses.append(float(dpo_loss(c, r, rc, rr, beta=beta)) * len(part))
        margins += dpo_margin(c, r, rc, rr).tolist()
        chosen_rewards += (beta * (c - rc)).tolist()
        rejected_rewards += (beta * (r - rr)).tolist()
    n = len(pairs)
    return {
        "loss": sum(losses) / n,
        "accuracy": sum(m > 0 for m in margins) / n,
        "chosen_reward": sum(chosen_rewards) / n,
        "rejected_reward": sum(rejected_rewards) / n,
    }


def train_dpo(actor, reference, view, tokenizer, eos_id: int, pad_id: int, profile: Profile, cfg: Dpo,
              leg: Leg = Leg()) -> dict:  # fmt: skip
    """Run (or continue) DPO over one leg from the SFT actor (`actor`, trainable; `reference`, the
    same weights frozen); returns the state after the last epoch run (rlhf.optim.train_epochs)."""
    limits = profile.limits
    train = encode_pairs(view.pairs("train"), tokenizer, eos_id, limits)
    valid = encode_pairs(view.pairs("validation"), tokenizer, eos_id, limits)
    valid = valid[: cfg.max_validation_examples or len(valid)]
    total = epoch_budget(len(train), cfg.pairs_per_update, cfg)[1]
    if cfg.expected_updates != total:
        raise ValueError(
            f"the DPO budget expects {cfg.expected_updates} updates, but {cfg.epochs} epoch(s) over {len(train)} "
            f"train pairs, {cfg.pairs_per_update} per update, make {total} (rlhf.dpo.budget computes it)"
        )

    def update_loss(pairs):
        loss, margins = pair_loss(actor, reference, pairs, pad_id, cfg.beta)
        return loss, {"accuracy": float((margins > 0).float().mean()), "margin": float(margins.mean())}

    def epoch_summary(updates):
        val = evaluate_dpo_pairs(actor, reference, valid, pad_id, cfg.beta)
        return {
            "validation_loss": val["loss"],
            "validation_accuracy": val["accuracy"],
            "validation_chosen_reward": val["chosen_reward"],
            "validation_rejected_reward": val["rejected_reward"],
            "train_loss": sum(h["loss"] for h in updates) / len(updates),
            "train_accuracy": sum(h["accuracy"] for h in updates) / len(updates),
        }

    return train_epochs(actor, "dpo", train, cfg.pairs_per_update, profile, update_loss, epoch_summary, leg, cfg)
