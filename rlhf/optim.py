"""One optimizer step, the same for SFT, the judge, the actor and the critic.

AdamW (weight decay from the profile), the learning rate set from the schedule
(rlhf.ppo_math.learning_rate) before the step, gradient clipping at the profile's norm, and a
hard stop on a non-finite loss or gradient that names where it happened. Nothing is saved
mid-update, so the last state on disk stays the last good one.
"""
from __future__ import annotations

import torch


class NonFiniteError(FloatingPointError):
    """A loss or gradient became NaN/inf; the run stops here."""


def adamw(params, lr: float, weight_decay: float) -> torch.optim.AdamW:
    # foreach=False: the same per-parameter kernels on every run and after a resume.
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=False)


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
        raise NonFiniteError(f"{where}: gradient norm is {float(grad_norm)}; stopping "
                             f"(the last saved state is intact)")
    optimizer.step()
    return float(grad_norm)


def start_epochs(role, key: str, params, lr: float, weight_decay: float, seed: int, total: int,
                 state: dict | None):
    """The shared start of an epoch-based stage (SFT, judge): AdamW, the data-order generator,
    the history, and - when resuming - everything restored from `state` (its learned tensors
    under `key`). Returns (optimizer, order, history, first_epoch, step)."""
    from rlhf.checkpoint import set_rng_state
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


def epoch_state(stage: str, key: str, role, optimizer, order, history: dict, epochs_done: int, step: int) -> dict:
    """Everything an epoch-based stage needs to resume after `epochs_done` epochs."""
    from rlhf.checkpoint import rng_state
    return {"stage": stage, "epochs_done": epochs_done, "step": step, key: role.learned_state(),
            "optimizer": optimizer.state_dict(), "order_generator": order.get_state(), "rng": rng_state(),
            "history": history}
