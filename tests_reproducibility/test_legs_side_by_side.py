"""The protocol's continuous leg in a process of its own (rlhf.legs), beside the interrupted and
resumed legs: the same bytes as the legs one after the other (the session's small lab, run
sequentially, is the reference), each leg's seconds recorded, and a crash of the other process
leaving a run that a rerun of the same stage continues."""

from __future__ import annotations

import pytest

from rlhf import lab
from rlhf.io import read_json
from rlhf.legs import RESULT_FILE, SEQUENTIAL, SIDE_BY_SIDE, default_legs

pytestmark = pytest.mark.unit

STAGES = {"sft": lab.stage_sft, "judge": lab.stage_judge, "ppo": lab.stage_ppo}


def side_by_side(run, profile_file):
    ctx = lab.open_context(run, str(profile_file))
    ctx.legs = SIDE_BY_SIDE
    return ctx


def test_the_legs_side_by_side_give_the_sequential_bytes_and_record_each_legs_seconds(
    small_run, small_profile_file, tmp_path
):
    ctx = side_by_side(tmp_path / "run", small_profile_file)
    for stage, fn in STAGES.items():
        result = fn(ctx)
        mine, reference = (read_json(c.run / stage / "resume_check.json") for c in (ctx, small_run))
        assert mine["identical"] and mine["tensors_compared"] == reference["tensors_compared"] > 0, stage
        for key in ("sha256_continuous", "sha256_resumed", "sha256_boundary"):
            assert mine[key] == reference[key], (stage, key)
        timings = read_json(ctx.run / stage / "timings.json")
        legs = timings["legs"]
        assert legs["continuous"]["beside"] is True and set(legs) == {"boundary", "resumed", "continuous"}, stage
        for name, leg in legs.items():
            assert leg["seconds"] > 0 and leg["clock"], (stage, name)  # measured in its own process, sent back
            assert leg["clock"][-1][0] <= leg["seconds"] + 1e-6, (stage, name)
        assert timings["stage_seconds"] > 0  # the stage's wall seconds beside each leg's
        assert (ctx.run / stage / RESULT_FILE).is_file() and result.sha256_final == mine["sha256_continuous"]
    # PPO's continuous timings (per iteration, per phase) came from the other process
    ppo = read_json(ctx.run / "ppo" / "timings.json")
    assert len(ppo["per_iteration"]) == len(read_json(small_run.run / "ppo" / "history.json")["iterations"])


def test_a_crash_of_the_other_process_leaves_a_run_that_a_rerun_continues(
    small_run, small_profile_file, tmp_path, monkeypatch
):
    """The continuous leg's process is killed (SIGKILL) after its second update: the stage fails
    naming what to do, keeps the legs this process finished, and the same stage run again
    continues to the bytes of the sequential run."""
    run = tmp_path / "run"
    monkeypatch.setenv("RLHF_CRASH_AT", "beside.progress@2")  # read by the other process only, as it starts
    with pytest.raises(RuntimeError, match="run the same command again to continue"):
        lab.stage_sft(side_by_side(run, small_profile_file))
    assert (run / "sft" / "state-resumed.pt.gz").is_file() and not (run / "sft" / "state-continuous.pt.gz").is_file()
    monkeypatch.delenv("RLHF_CRASH_AT")
    lab.stage_sft(side_by_side(run, small_profile_file))
    mine, reference = (read_json(r / "sft" / "resume_check.json") for r in (run, small_run.run))
    assert mine["identical"] and mine["sha256_continuous"] == reference["sha256_continuous"]


def test_legs_default_to_side_by_side_with_two_cores_unless_asked(monkeypatch):
    monkeypatch.delenv("RLHF_LEGS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert default_legs() == SIDE_BY_SIDE
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert default_legs() == SEQUENTIAL
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    monkeypatch.setenv("RLHF_LEGS", "sequential")
    assert default_legs() == SEQUENTIAL
