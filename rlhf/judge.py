"""The reward model (the judge): Bradley-Terry on preference pairs, then frozen (SPEC §5).

For a pair (prompt, chosen, rejected) the judge reads one scalar per answer at its last active
token (rlhf.roles.reward_scores) and learns

    loss = -mean(logsigmoid(r_chosen - r_rejected))        (rlhf.ppo_math.bradley_terry_loss)

over 8 pairs per update. Scores are not probabilities of truth or helpfulness: they can be
negative, shifted, badly calibrated and style-sensitive. Validation loss and accuracy are
recorded every epoch and never select a checkpoint. Accuracy counts a tie as a miss.
"""

from __future__ import annotations

import torch

from rlhf.checkpoint import Leg
from rlhf.config import Limits, Profile
from rlhf.optim import train_epochs
from rlhf.ppo_math import bradley_terry_loss
from rlhf.roles import reward_scores
from rlhf.tokens import collate, encode_example


def encode_pairs(records: list[dict], tokenizer, eos_id: int, limits: Limits):
    """[(document_id, prompt_ids, chosen_ids, rejected_ids)]; over-limit pairs raise naming the id."""
    out = []
    for r in records:
        p, c = encode_example(tokenizer, r["prompt"], r["chosen"], eos_id, limits, r["document_id"])
        _, j = encode_example(tokenizer, r["prompt"], r["rejected"], eos_id, limits, r["document_id"])
        out.append((r["document_id"], p, c, j))
    return out


def pair_scores(judge, pairs, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of the chosen and rejected answers of `pairs`, in one batch: ([N], [N])."""
    device = next(judge.model.parameters()).device
    batch = collate([p[1] for p in pairs] * 2, [p[2] for p in pairs] + [p[3] for p in pairs], pad_id).to(device)
    scores = reward_scores(judge, batch)
    return scores[: len(pairs)], scores[len(pairs) :]


@torch.no_grad()
def evaluate_pairs(judge, pairs, pad_id: int, batch_size: int = 16) -> dict:
    """Loss, accuracy (ties count as misses), the per-pair margins and the chosen and rejected
    scores of a pair set (margins[i] = chosen_scores[i] - rejected_scores[i])."""
    margins, chosen, rejected = [], [], []
    for i in range(0, len(pairs), batch_size):
        c, r = pair_scores(judge, pairs[i : i + batch_size], pad_id)
        margins.append(c - r)
        chosen += c.tolist()
        rejected += r.tolist()
    m = torch.cat(margins)
    return {
        "loss": float(bradley_terry_loss(m, torch.zeros_like(m))),
        "accuracy": float((m > 0).float().mean()),
        "ties": int((m == 0).sum()),
        "pairs": len(pairs),
        "margins": m.tolist(),
        "chosen_scores": chosen,
        "rejected_scores": rejected,
    }


def train_judge(judge, view, tokenizer, eos_id: int, pad_id: int, profile: Profile, leg: Leg = Leg()) -> dict:
    """Run (or continue) the judge's Bradley-Terry budget over one leg; returns the state after
    the last epoch run."""
    cfg, limits = profile.judge, profile.limits
    train = encode_pairs(view.pairs("train"), tokenizer, eos_id, limits)
    valid = encode_pairs(view.pairs("validation"), tokenizer, eos_id, limits)
    valid = valid[: cfg.max_validation_examples or len(valid)]  # a miniature budget cuts it (rlhf.miniature)

    def update_loss(pairs):
        chosen, rejected = pair_scores(judge, pairs, pad_id)
        return bradley_terry_loss(chosen, rejected), {"accuracy": float((chosen > rejected).float().mean())}

    def epoch_summary(updates):
        val = evaluate_pairs(judge, valid, pad_id)
        return {
            "validation_loss": val["loss"],
            "validation_accuracy": val["accuracy"],
            "validation_ties": val["ties"],
            "train_loss": sum(h["loss"] for h in updates) / len(updates),
            "train_accuracy": sum(h["accuracy"] for h in updates) / len(updates),
        }

    return train_epochs(judge, "judge", train, cfg.pairs_per_update, profile, update_loss, epoch_summary, leg)
