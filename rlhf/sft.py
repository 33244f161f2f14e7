"""Supervised fine-tuning of the actor's adapters on the demonstrations (SPEC §5).

An update takes 8 demonstrations and minimises

    loss = sum over their response tokens (EOS included) of -log pi(token | prefix)
           / number of active response tokens of the 8

(one token-weighted mean, not a mean of per-example means). Prompt and padding are masked by
position. AdamW with weight decay, warm-up then linear decay (rlhf.ppo_math.learning_rate),
gradient clipping at norm 1 (rlhf.optim). The budget is fixed in the profile; validation loss
is recorded every epoch and never selects anything.

r001 has no validation demonstrations, so the validation loss is the same token NLL on the
(prompt, chosen) answers of the 180 validation pairs: every chosen answer is a rubric success.

Resume: `train_sft(..., stop_after_epoch=k)` returns after epoch k with a complete state
(adapters, optimizer, data-order generator, system RNGs, history); `train_sft(..., state=s)`
continues from it. Both paths run the same updates bit for bit.
"""
from __future__ import annotations

import torch

from rlhf.masks import masked_sum
from rlhf.optim import epoch_state, optimizer_step, start_epochs
from rlhf.ppo_math import learning_rate
from rlhf.scoring import response_logprobs
from rlhf.tokens import collate, encode_example


def encode_demonstrations(records: list[dict], tokenizer, eos_id: int, limits: dict, response_key: str = "response"):
    """[(document_id, prompt_ids, response_ids)]; an over-limit example raises naming its id."""
    return [(r["document_id"], *encode_example(tokenizer, r["prompt"], r[response_key], eos_id, limits,
                                               r["document_id"])) for r in records]


def sft_loss(model, examples, pad_id: int) -> tuple[torch.Tensor, int]:
    """Summed response-token NLL / active response tokens of the batch, and that token count."""
    batch = collate([e[1] for e in examples], [e[2] for e in examples], pad_id).to(next(model.parameters()).device)
    logp = response_logprobs(model, batch)                     # [B, R], 0 where masked
    n_tokens = int(batch.response_mask.sum())
    return -masked_sum(logp, batch.response_mask).sum() / n_tokens, n_tokens


@torch.no_grad()
def evaluate_loss(model, examples, pad_id: int, batch_size: int = 16) -> float:
    total, count = 0.0, 0
    for i in range(0, len(examples), batch_size):
        loss, n = sft_loss(model, examples[i:i + batch_size], pad_id)
        total += float(loss) * n
        count += n
    return total / count


def sft_budget(profile: dict, n_examples: int) -> tuple[int, int]:
    """(updates per epoch, total updates): 168 demonstrations / 8 = 21 per epoch."""
    per_epoch = -(-n_examples // profile["sft"]["examples_per_update"])
    return per_epoch, per_epoch * profile["sft"]["epochs"]


def train_sft(actor, view, tokenizer, eos_id: int, pad_id: int, profile: dict, *, state: dict | None = None,
              stop_after_epoch: int | None = None, progress=None) -> dict:
    """Run (or continue) the profile's SFT budget on the actor Role; returns the state after the
    last epoch run (keys: stage, epochs_done, step, actor, optimizer, order_generator, rng, history)."""
    cfg, opt_cfg, limits = profile["sft"], profile["optim"], profile["limits"]
    train = encode_demonstrations(view.demonstrations("train"), tokenizer, eos_id, limits)
    valid = encode_demonstrations(view.pairs("validation"), tokenizer, eos_id, limits, "chosen")
    per_update = cfg["examples_per_update"]
    per_epoch, total = sft_budget(profile, len(train))
    params = [p for p in actor.learned_parameters() if p.requires_grad]
    optimizer, order, history, first_epoch, step = start_epochs(
        actor, "actor", params, cfg["lr"], opt_cfg["weight_decay"], profile["seeds"]["data_order"], total, state)
    last_epoch = cfg["epochs"] if stop_after_epoch is None else stop_after_epoch
    for epoch in range(first_epoch, last_epoch):
        perm = torch.randperm(len(train), generator=order).tolist()
        for u in range(per_epoch):
            examples = [train[i] for i in perm[u * per_update:(u + 1) * per_update]]
            lr = learning_rate(step, total, cfg["lr"], opt_cfg["warmup_ratio"], opt_cfg["min_lr_ratio"])
            loss, n = sft_loss(actor.model, examples, pad_id)
            grad_norm = optimizer_step(optimizer, params, loss, lr, opt_cfg["grad_clip_norm"],
                                       f"SFT update {step} (epoch {epoch})")
            history["updates"].append({"step": step, "epoch": epoch, "loss": float(loss.detach()),
                                       "lr": lr, "tokens": n, "grad_norm": grad_norm})
            step += 1
            if progress is not None:
                progress(step, total, float(loss.detach()))
        val = evaluate_loss(actor.model, valid, pad_id)
        train_loss = sum(h["loss"] for h in history["updates"][-per_epoch:]) / per_epoch
        history["epochs"].append({"epoch": epoch, "validation_loss": val, "train_loss": train_loss})
    return epoch_state("sft", "actor", actor, optimizer, order, history, last_epoch, step)
