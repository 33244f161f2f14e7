"""NaN and infinity stop training.

A non-finite loss, or a finite loss whose gradient is not finite, stops SFT, the judge, the PPO
actor and the PPO critic with NonFiniteError naming the stage, the role and the update step,
before the optimizer moves anything; and the last good checkpoint on disk stays exactly what an
unpoisoned run writes there.

Each stage runs on the small budget (conftest.SMALL_BUDGET, continuous leg only) with one
loss poisoned at the first update after a checkpoint: SFT and judge at update 3 (epoch 1, after
checkpoint continuous-0001), PPO at update 4 (iteration 2, after continuous-0001 and -0002).
At the moment of the poisoned update every file of the stage folder is hashed; after the error
the folder must hash the same, file for file.
"""

from __future__ import annotations

import hashlib
import shutil

import pytest
import torch

from rlhf import io as rlhf_io
from rlhf import judge as judge_module
from rlhf import lab, ppo_math
from rlhf import sft as sft_module
from rlhf.checkpoint import load_state
from rlhf.io import read_json
from rlhf.optim import NonFiniteError, adamw, optimizer_step

pytestmark = pytest.mark.unit

# role: (stage function, folder, module, loss function, training call to poison, message head, checkpoints)
CASES = {
    "sft_actor": (
        lab.stage_sft,
        "sft",
        sft_module,
        "sft_loss",
        4,
        r"SFT stage, actor role, update 3 \(epoch 1\)",
        ["continuous-0001.pt.gz"],
    ),
    "judge": (
        lab.stage_judge,
        "judge",
        judge_module,
        "bradley_terry_loss",
        4,
        r"judge stage, judge role, update 3 \(epoch 1\)",
        ["continuous-0001.pt.gz"],
    ),
    "ppo_actor": (
        lab.stage_ppo,
        "ppo",
        ppo_math,
        "clipped_policy_loss",
        5,
        r"PPO stage, actor role, update 4 \(iteration 2\)",
        ["continuous-0001.pt.gz", "continuous-0002.pt.gz"],
    ),
    "ppo_critic": (
        lab.stage_ppo,
        "ppo",
        ppo_math,
        "value_loss",
        5,
        r"PPO stage, critic role, update 4 \(iteration 2\)",
        ["continuous-0001.pt.gz", "continuous-0002.pt.gz"],
    ),
}
WHAT = {"nan_loss": r"loss is nan", "inf_loss": r"loss is -?inf", "inf_gradient": r"gradient norm is (inf|nan)"}


class InfiniteGradient(torch.autograd.Function):
    """Identity forward (the loss stays finite), infinite gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("inf")


def folder_hashes(folder) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


class Poison:
    """Wraps a loss function: its `at_call`-th call with autograd on (a training update, not a
    validation pass) returns a NaN or infinite loss, or the finite loss with an infinite
    gradient; the stage folder is hashed just before."""

    def __init__(self, real, at_call: int, what: str, folder):
        self.real, self.at_call, self.what, self.folder = real, at_call, what, folder
        self.calls, self.snapshot = 0, None

    def __call__(self, *args, **kwargs):
        out = self.real(*args, **kwargs)
        if not torch.is_grad_enabled():
            return out
        self.calls += 1
        if self.calls != self.at_call:
            return out
        # A checkpoint saved before this update may still be in the background writer's hands:
        # it belongs to what was saved before the poison, so the snapshot waits for it.
        rlhf_io.join_background_writes()
        self.snapshot = folder_hashes(self.folder)
        loss = out[0] if isinstance(out, tuple) else out
        bad = {
            "nan_loss": lambda x: x * float("nan"),
            "inf_loss": lambda x: x * float("inf"),
            "inf_gradient": InfiniteGradient.apply,
        }[self.what](loss)
        if self.what == "inf_gradient":
            assert torch.isfinite(bad), "the poisoned loss must stay finite"
        return (bad, *out[1:]) if isinstance(out, tuple) else bad


@pytest.fixture(scope="module")
def good_run(small_run, one_thread):
    """The three learning stages, unpoisoned (the session's small-budget lab, conftest
    `small_run`, read only): the continuous leg's checkpoints a poisoned run must leave
    untouched, and the SFT and judge artifacts PPO starts from."""
    return small_run


def fresh_run(good, run):
    """A new run folder with the good run's corpus, base, SFT actor and judge (hashes travel)."""
    for part in ("corpus", "base_model"):
        shutil.copytree(good.run / part, run / part)
    for stage, name in (("sft", "actor"), ("judge", "judge")):
        (run / stage).mkdir()
        for suffix in (".safetensors", ".safetensors.json"):
            shutil.copy(good.run / stage / f"{name}{suffix}", run / stage / f"{name}{suffix}")
    return lab.open_context(run, good.profile)


@pytest.mark.parametrize("what", list(WHAT))
@pytest.mark.parametrize("role", list(CASES))
def test_non_finite_update_stops_naming_stage_role_and_step_and_keeps_the_last_checkpoint(
    good_run, tmp_path, monkeypatch, role, what
):
    """Catches: a NaN or infinite loss, or an infinite gradient of a finite loss, that trains
    on; a message that does not say where (stage, role, update); any file of the stage written
    or changed after the last good checkpoint (which must equal the unpoisoned run's, byte for byte)."""
    stage_fn, folder_name, module, loss_name, at_call, where, checkpoints = CASES[role]
    ctx = fresh_run(good_run, tmp_path / "run")
    folder = ctx.run / folder_name
    poison = Poison(getattr(module, loss_name), at_call, what, folder)
    monkeypatch.setattr(module, loss_name, poison)

    with pytest.raises(NonFiniteError, match=rf"^{where}: {WHAT[what]}; stopping \(the last saved state is intact\)$"):
        stage_fn(ctx, protocol=False)

    assert poison.snapshot is not None, "the poisoned update never ran"
    assert folder_hashes(folder) == poison.snapshot, "the stage folder changed after the non-finite update"
    saved = sorted(k for k in poison.snapshot if k.endswith(".pt.gz"))
    assert saved == [f"checkpoints/{c}" for c in checkpoints], saved
    for name in checkpoints:
        good_file = good_run.run / folder_name / "checkpoints" / name
        assert poison.snapshot[f"checkpoints/{name}"] == hashlib.sha256(good_file.read_bytes()).hexdigest(), (
            f"{name} is not the unpoisoned run's checkpoint"
        )
    last = load_state(folder / "checkpoints" / checkpoints[-1])  # its sidecar hash still verifies
    key, learned = (
        ("iterations_done", ["actor", "critic"])
        if folder_name == "ppo"
        else ("epochs_done", ["actor" if folder_name == "sft" else "judge"])
    )
    assert last[key] == len(checkpoints)
    assert all(torch.isfinite(t).all() for k in learned for t in last[k].values())
    assert folder_name not in read_json(ctx.run / "run.json")["stages"]


@pytest.mark.parametrize("what", list(WHAT))
def test_optimizer_step_refuses_before_moving_anything(what):
    """Catches a step taken (weights or AdamW moments changed) before the finiteness checks,
    for a NaN loss, an infinite loss and a finite loss with an infinite gradient."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 1)
    params = list(layer.parameters())
    optimizer = adamw(params, lr=1e-2, weight_decay=0.0)
    x = torch.randn(8, 4)
    optimizer_step(optimizer, params, layer(x).pow(2).mean(), 1e-2, 1.0, "warm-up")  # moments exist
    weights = [p.detach().clone() for p in params]
    moments = [t.clone() for s in optimizer.state.values() for t in s.values()]
    loss = layer(x).pow(2).mean()
    bad = {
        "nan_loss": loss * float("nan"),
        "inf_loss": loss * float("inf"),
        "inf_gradient": InfiniteGradient.apply(loss),
    }[what]
    with pytest.raises(NonFiniteError, match=rf"^judge stage, judge role, update 7: {WHAT[what]}; stopping"):
        optimizer_step(optimizer, params, bad, 1e-2, 1.0, "judge stage, judge role, update 7")
    assert all(torch.equal(a, b) for a, b in zip(weights, params))
    assert all(torch.equal(a, b) for a, b in zip(moments, [t for s in optimizer.state.values() for t in s.values()]))
