"""SPEC §7 on the embedded profile: stop, resume, and the continuous run are identical.

The session fixture `lab_run` runs PPO three ways (interrupted at the SPEC's boundary, iteration
40 of 100, resumed from the saved state to the end, continuous from scratch to the end). Here the
two final state files are read back from disk and compared tensor by tensor; their SHA-256 go
into the JSON report. SFT and the judge, whose boundary is epoch 1 on every budget, are compared
the same way on the small-budget lab (test_resume_small.py).
"""

import pytest
import torch

from rlhf.checkpoint import assert_states_equal, load_state
from rlhf.io import read_json, sha256_file

pytestmark = [pytest.mark.unit, pytest.mark.e2e]  # e2e: the lab run, SFT epochs in fresh processes

BOUNDARY = {"sft": ("epochs_done", 1), "judge": ("epochs_done", 1), "ppo": ("iterations_done", 40)}


def states(ctx, stage):
    folder = ctx.run / stage
    return {k: load_state(folder / f"state-{k}.pt.gz") for k in ("boundary", "resumed", "continuous")}


@pytest.mark.parametrize("stage", ["ppo"])
def test_resumed_equals_continuous_tensor_by_tensor(lab_run, stage, record_result):
    s = states(lab_run, stage)
    key, stop = BOUNDARY[stage]
    assert s["boundary"][key] == stop
    assert s["resumed"][key] == s["continuous"][key] > stop
    compared = assert_states_equal(s["continuous"], s["resumed"], stage)
    assert compared > 0
    folder = lab_run.run / stage
    sha = {k: sha256_file(folder / f"state-{k}.pt.gz") for k in ("resumed", "continuous", "boundary")}
    record_result(f"{stage}_state_sha256", sha)
    record_result(f"{stage}_tensors_compared", compared)
    record_result(f"{stage}_seconds", round(lab_run.stage_seconds[stage], 1))
    assert sha["resumed"] == sha["continuous"], "equal states must serialise to equal bytes"
    check = read_json(folder / "resume_check.json")
    assert check["identical"] and check["sha256_resumed"] == sha["resumed"]


def test_a_different_state_is_detected(lab_run):
    """The comparison can fail: the boundary state is not the final one."""
    s = states(lab_run, "ppo")
    with pytest.raises(AssertionError):
        assert_states_equal(s["continuous"], s["boundary"])
    tampered = load_state(lab_run.run / "ppo" / "state-resumed.pt.gz")
    name = next(iter(tampered["actor"]))
    tampered["actor"][name] = tampered["actor"][name].clone()
    tampered["actor"][name].view(-1)[0] += 1e-7
    with pytest.raises(AssertionError, match="tensors differ"):
        assert_states_equal(
            s["continuous"] if False else load_state(lab_run.run / "ppo" / "state-continuous.pt.gz"), tampered
        )


def test_ppo_state_holds_everything_a_resume_needs(lab_run):
    s = load_state(lab_run.run / "ppo" / "state-boundary.pt.gz")
    assert {
        "actor",
        "critic",
        "reference",
        "reward",
        "optimizers",
        "sampler",
        "sampling_generator",
        "rng",
        "history",
        "iterations_done",
    } <= set(s)
    assert set(s["optimizers"]) == {"actor", "critic"}
    assert s["optimizers"]["actor"]["state"], "optimizer moments are saved"
    assert s["sampler"]["pointer"] == 40 * 4 and s["sampler"]["permutation"].shape == (672,)
    assert sorted(s["sampler"]["permutation"].tolist()) == list(range(672))
    assert len(s["history"]["consumed"]) == 160 and len(s["history"]["iterations"]) == 40
    assert {"torch", "python"} <= set(s["rng"])
    final = load_state(lab_run.run / "ppo" / "state-continuous.pt.gz")
    assert len(final["history"]["consumed"]) == 400 and len(set(final["history"]["consumed"])) == 400
    assert final["history"]["consumed"][:160] == s["history"]["consumed"]


def test_sft_and_judge_states_hold_optimizer_order_and_rng(lab_run):
    for stage, learned in (("sft", "actor"), ("judge", "judge")):
        s = load_state(lab_run.run / stage / "state-continuous.pt.gz")
        assert {learned, "optimizer", "order_generator", "rng", "history", "step", "epochs_done"} <= set(s)
        assert s["step"] == len(s["history"]["updates"]) > 0


def test_states_are_gzip_level1_and_weights_only(lab_run):
    data = (lab_run.run / "ppo" / "state-boundary.pt.gz").read_bytes()
    assert data[:2] == b"\x1f\x8b" and data[8] == 4  # gzip magic; XFL=4: fastest compression (level 1)
    import gzip
    import io

    raw = gzip.decompress(data)
    torch.load(io.BytesIO(raw), weights_only=True)  # no arbitrary pickle needed


def test_a_finished_stage_is_never_overwritten(lab_run):
    from rlhf import lab

    folder = lab_run.run / "sft"
    before = {str(p): sha256_file(p) for p in folder.rglob("*") if p.is_file()}
    with pytest.raises(FileExistsError, match="already ran"):
        lab.stage_sft(lab_run)
    assert {str(p): sha256_file(p) for p in folder.rglob("*") if p.is_file()} == before


def test_two_fresh_processes_write_byte_identical_states(tmp_path, record_result):
    """One SFT epoch in two fresh processes: the saved states are the same bytes. A state holds
    python's `random` state too; before the stages seeded it, it differed between processes."""
    import subprocess
    import sys

    sha = {}
    for name in ("first", "second"):
        run = tmp_path / name
        done = subprocess.run(
            [sys.executable, "-m", "rlhf.cli", "sft", "--run", str(run), "--stop-after", "1"],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        sha[name] = sha256_file(run / "sft" / "state-stop001.pt.gz")
    record_result("sft_epoch1_state_sha256_per_process", sha)
    assert sha["first"] == sha["second"]
