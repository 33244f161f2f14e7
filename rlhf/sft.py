"""Supervised fine-tuning of the actor's adapters on the demonstrations (SPEC §5).

An update takes 8 demonstrations and minimises

    loss = sum over their response tokens (EOS included) of -log pi(token | prefix)
           / number of active response tokens of the 8

(one token-weighted mean, not a mean of per-example means). Prompt and padding are masked by
position. AdamW with weight decay, warm-up then linear decay (rlhf.ppo_math.learning_rate),
gradient clipping at norm 1 (rlhf.optim). The budget is fixed in the profile; validation loss
is recorded every epoch and never selects anything. A schedule of more than VALIDATION_POINTS
epochs (a recipe of few demonstrations: hundreds of one-update epochs) records it every
ceil(epochs / VALIDATION_POINTS)-th epoch and after the last (`validates`): measuring it is a
forward pass over the validation answers, which would otherwise cost more than the training,
and it changes no weight (no gradient, no random draw).

r001 has no validation demonstrations, so the validation loss is the same token NLL on the
(prompt, chosen) answers of the 180 validation pairs: every chosen answer is a rubric success.

Resume: `train_sft(..., Leg(stop=k))` returns after epoch k with a complete state
(adapters, optimizer, data-order generator, system RNGs, history); `train_sft(..., Leg(state=s))`
continues from it. Both paths run the same updates bit for bit.
"""

from __future__ import annotations

import torch

from rlhf.checkpoint import Leg
from rlhf.config import Limits, Profile
from rlhf.masks import masked_sum
from rlhf.optim import train_epochs
from rlhf.scoring import response_logprobs
from rlhf.tokens import collate, encode_example


def encode_demonstrations(records: list[dict], tokenizer, eos_id: int, limits: Limits, response_key: str = "response"):
    """[(document_id, prompt_ids, response_ids)]; an over-limit example raises naming its id."""
    return [
        (r["document_id"], *encode_example(tokenizer, r["prompt"], r[response_key], eos_id, limits, r["document_id"]))
        for r in records
    ]


def sft_loss(model, examples, pad_id: int) -> tuple[torch.Tensor, int]:
    """Summed response-token NLL / active response tokens of the batch, and that token count."""
    batch = collate([e[1] for e in examples], [e[2] for e in examples], pad_id).to(next(model.parameters()).device)
    logp = response_logprobs(model, batch)  # [B, R], 0 where masked
    n_tokens = int(batch.response_mask.sum())
    return -masked_sum(logp, batch.response_mask).sum() / n_tokens, n_tokens


@torch.no_grad()
def evaluate_loss(model, examples, pad_id: int, batch_size: int = 16) -> float:
    total, count = 0.0, 0
    for i in range(0, len(examples), batch_size):
        loss, n = sft_loss(model, examples[i : i + batch_size], pad_id)
        total += float(loss) * n
        count += n
    return total / count


VALIDATION_POINTS = 20  # the most epochs whose validation loss a schedule records, the last one besides


def validates(epoch: int, epochs: int) -> bool:
    """Whether SFT records its validation loss after epoch `epoch` (0-based) of `epochs`:
    every epoch up to VALIDATION_POINTS epochs; beyond, every ceil(epochs / VALIDATION_POINTS)-th
    and the last."""
    every = -(-epochs // VALIDATION_POINTS)
    return (epoch + 1) % every == 0 or epoch + 1 == epochs


def sft_demonstrations(view, cfg) -> list[dict]:
    """The train demonstrations SFT learns from: every one, or every k-th in family order
    (`[sft] demonstration_stride`; the corpus lists them situation by situation, so each keeps
    its share)."""
    return view.demonstrations("train")[:: cfg.demonstration_stride or 1]


def train_sft(actor, view, tokenizer, eos_id: int, pad_id: int, profile: Profile, leg: Leg = Leg()) -> dict:
    """Run (or continue) the profile's SFT budget on the actor Role over one leg; returns the
    state after the last epoch run (keys: stage, epochs_done, step, actor, optimizer,
    order_generator, rng, history)."""
    cfg, limits = profile.sft, profile.limits
    train = encode_demonstrations(sft_demonstrations(view, cfg), tokenizer, eos_id, limits)
    valid = encode_demonstrations(view.pairs("validation"), tokenizer, eos_id, limits, "chosen")
    valid = valid[: cfg.max_validation_examples or len(valid)]  # a miniature budget cuts it (rlhf.miniature)

    def update_loss(examples):
        loss, n = sft_loss(actor.model, examples, pad_id)
        return loss, {"tokens": n}

    def epoch_summary(updates):
        train_loss = {"train_loss": sum(h["loss"] for h in updates) / len(updates)}
        if not validates(updates[-1]["epoch"], cfg.epochs):
            return train_loss
        return {"validation_loss": evaluate_loss(actor.model, valid, pad_id), **train_loss}

    return train_epochs(actor, "sft", train, cfg.examples_per_update, profile, update_loss, epoch_summary, leg)
