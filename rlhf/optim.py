"""One optimizer step, the same for SFT, the judge, the actor and the critic.

AdamW (weight decay from the profile), the learning rate set from the schedule
(rlhf.ppo_math.learning_rate) before the step, gradient clipping at the profile's norm, and a
hard stop on a non-finite loss or gradient that names where it happened: stage, role and update
step ("SFT stage, actor role, update 3 (epoch 1): loss is nan; ..."; PPO adds the iteration).
Nothing is saved mid-update, so the last state on disk stays the last good one.
"""

from __future__ import annotations

import torch

from rlhf.checkpoint import Leg
from rlhf.config import EpochStage, Profile
from rlhf.io import crash_point
from rlhf.ppo_math import learning_rate
from rlhf.runtime import rng_state, set_rng_state

STAGE_NAMES = {"sft": "SFT", "judge": "judge", "dpo": "DPO"}  # as a stopped update names its stage


class NonFiniteError(FloatingPointError):
    """A loss or gradient became NaN/inf; the run stops here."""


def adamw(params, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW through torch's fused kernel: the same bytes on every x86-64 CPU.

    The default (single-tensor) AdamW takes the square root of `exp_avg_sq` with torch.sqrt,
    which on the CPU is MKL's vector math (vsSqrt): not correctly rounded, and built on the
    processor's approximate reciprocal square root, whose low bits differ between Intel and AMD.
    The fused kernel uses the IEEE square-root instruction, exact on every CPU
    (docs/reproducibility.md, "Where two CPUs parted")."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=False, fused=True)


def optimizer_step(optimizer, params, loss: torch.Tensor, lr: float, clip_norm: float, where: str) -> float:
    """backward, clip, step; returns the pre-clip gradient norm. Raises NonFiniteError."""
    if not torch.isfinite(loss):
        raise NonFiniteError(f"{where}: loss is {float(loss.detach())}; stopping (the last saved state is intact)")
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, clip_norm)
    if not torch.isfinite(grad_norm):
        raise NonFiniteError(f"{where}: gradient norm is {float(grad_norm)}; stopping (the last saved state is intact)")
    optimizer.step()
    return float(grad_norm)


def epoch_budget(n_items: int, per_update: int, cfg: EpochStage) -> tuple[int, int]:
    """(updates per epoch, total updates) of cfg.epochs over `n_items`, `per_update` at a time:
    a last short update takes the remainder.

    `cfg.max_updates_per_epoch` (absent from the lab's profiles) cuts each epoch to its first k
    updates: the miniature budgets of the crash tests and of the full-width qwen check."""
    per_epoch = -(-n_items // per_update)
    if cfg.max_updates_per_epoch:
        per_epoch = min(per_epoch, cfg.max_updates_per_epoch)
    return per_epoch, per_epoch * cfg.epochs


def train_epochs(
    role,
    stage: str,
    train: list,
    per_update: int,
    profile: Profile,
    update_loss,
    epoch_summary,
    leg: Leg,
    cfg: EpochStage | None = None,
) -> dict:
    """The epoch loop of SFT and the judge (`stage` "sft" or "judge", its profile table), and of
    a DPO arm ("dpo", its budget `cfg`): the same order, schedule, step and resume state.

    Each epoch draws a permutation of `train` from the data-order generator and takes
    ceil(len(train) / per_update) updates of `per_update` items:

        loss, extra = update_loss(items)     the stage's loss, and what its update record adds
        lr = learning_rate(step, total)      warm-up then linear decay (rlhf.ppo_math)
        optimizer_step(...)                  backward, clip, AdamW

    After each epoch `epoch_summary(updates_of_the_epoch)` adds the validation numbers. The leg
    (rlhf.checkpoint.Leg) says where to start and stop, and is told of progress and checkpoints.
    Returns the state to save or resume from (keys: stage, epochs_done, step, the role's kind
    (its learned tensors), optimizer, order_generator, rng, history).
    """
    if cfg is None:
        cfg = {"sft": profile.sft, "judge": profile.judge}[stage]
    opt_cfg, key = profile.optim, role.kind
    label = f"{STAGE_NAMES[stage]} stage, {key} role"  # names where a non-finite loss arose
    per_epoch, total = epoch_budget(len(train), per_update, cfg)
    params = [p for p in role.learned_parameters() if p.requires_grad]
    optimizer, order, history, first_epoch, step = _start_epochs(
        role, key, params, cfg.lr, opt_cfg.weight_decay, profile.seeds.data_order, total, leg.state
    )
    last_epoch = cfg.epochs if leg.stop is None else leg.stop
    for epoch in range(first_epoch, last_epoch):
        perm = torch.randperm(len(train), generator=order).tolist()
        for u in range(per_epoch):
            items = [train[i] for i in perm[u * per_update : (u + 1) * per_update]]
            lr = learning_rate(step, total, cfg.lr, opt_cfg.warmup_ratio, opt_cfg.min_lr_ratio)
            crash_point(f"{stage}.update")
            loss, extra = update_loss(items)
            grad_norm = optimizer_step(
                optimizer, params, loss, lr, opt_cfg.grad_clip_norm, f"{label}, update {step} (epoch {epoch})"
            )
            history["updates"].append(
                {"step": step, "epoch": epoch, "loss": float(loss.detach()), "lr": lr, **extra, "grad_norm": grad_norm}
            )
            step += 1
            if leg.progress is not None:
                leg.progress(step, total, history, None)
        history["epochs"].append({"epoch": epoch, **epoch_summary(history["updates"][-per_epoch:])})
        if leg.progress is not None:
            leg.progress(step, total, history, None)
        if leg.checkpoint is not None and epoch + 1 < last_epoch:  # the last state is the caller's to save
            leg.checkpoint(
                epoch + 1, lambda: _epoch_state(stage, key, role, optimizer, order, history, epoch + 1, step)
            )
    return _epoch_state(stage, key, role, optimizer, order, history, last_epoch, step)


def _start_epochs(role, key: str, params, lr: float, weight_decay: float, seed: int, total: int, state: dict | None):
    """AdamW, the data-order generator, the history, and - when resuming - everything restored
    from `state` (its learned tensors under `key`). Returns (optimizer, order, history, first_epoch, step)."""
    optimizer = adamw(params, lr, weight_decay)
    order = torch.Generator().manual_seed(seed)
    history = {"updates": [], "epochs": [], "total_updates": total}
    if state is None:
        return optimizer, order, history, 0, 0
    role.load_learned_state(state[key])
    optimizer.load_state_dict(state["optimizer"])
    order.set_state(state["order_generator"])
    set_rng_state(state["rng"])
    return optimizer, order, state["history"], state["epochs_done"], state["step"]


def _epoch_state(stage: str, key: str, role, optimizer, order, history: dict, epochs_done: int, step: int) -> dict:
    """Everything an epoch-based stage needs to resume after `epochs_done` epochs."""
    return {
        "stage": stage,
        "epochs_done": epochs_done,
        "step": step,
        key: role.learned_state(),
        "optimizer": optimizer.state_dict(),
        "order_generator": order.get_state(),
        "rng": rng_state(),
        "history": history,
    }
