"""The gpu tier's shared code (tests_gpu/gpu_lab.py) on the CPU: the numbers file written whole
after every stage (so a run a timeout stops keeps every stage it finished), each stage's seconds
and costs as the lab's callbacks report them, and the smoke profile's budgets."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from rlhf import costs, lab
from rlhf.io import read_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests_gpu"))
import gpu_lab  # noqa: E402 - the gpu tier's helper module, beside its tests

pytestmark = pytest.mark.unit


def test_each_stage_is_written_as_it_finishes(tmp_path, monkeypatch):
    """A stand-in lab reports its stages as rlhf.lab.run_stages does (done(stage) after each);
    after each report the file on disk holds every stage so far, with its own seconds and what
    it paid; a kill after the third stage would leave three."""
    numbers = gpu_lab.Numbers(tmp_path)
    seen_on_disk = []

    def stages(ctx, *, protocol, done):
        assert protocol is True
        for i, stage in enumerate(("sft", "judge", "ppo", "evaluate", "shortcut_audit")):
            time.sleep(0.01 * (i + 1))
            costs.count("state_saves", i)
            done(stage)
            seen_on_disk.append(set(read_json(tmp_path / gpu_lab.NUMBERS_FILE)["smoke"]["stages"]))

    monkeypatch.setattr(lab, "run_stages", stages)
    monkeypatch.setattr(lab, "run_lab", lambda ctx, protocol: None)
    got = gpu_lab.run_staged(object(), numbers, "smoke")
    order = ["sft", "judge", "ppo", "evaluate", "shortcut_audit"]
    assert seen_on_disk == [set(order[: i + 1]) for i in range(5)]
    on_disk = read_json(tmp_path / gpu_lab.NUMBERS_FILE)["smoke"]
    assert list(got) == [*order, "report"] and on_disk["stages"] == got
    assert [got[s]["paid"]["state_saves"] for s in order] == [0, 1, 2, 3, 4]  # each stage its own, not a running total
    assert all(got[s]["seconds"] >= 0.01 * (i + 1) for i, s in enumerate(order))
    assert got["sft"]["peak_mib"] is None  # no CUDA here: no peak to read
    assert on_disk["lab_s"] >= sum(got[s]["seconds"] for s in order)


def test_numbers_of_several_parts_share_one_file(tmp_path):
    first = gpu_lab.Numbers(tmp_path)
    first.add("smoke", "decode_step_ms", 1.5)
    second = gpu_lab.Numbers(tmp_path)  # another part, another process: it reads what is there
    second.add("real", "lab_s", 120.0)
    assert read_json(tmp_path / gpu_lab.NUMBERS_FILE) == {"smoke": {"decode_step_ms": 1.5}, "real": {"lab_s": 120.0}}
    assert not list(tmp_path.glob(".*"))  # written atomically: no temporary file left


def test_the_smoke_profile_is_the_miniature_with_full_answers():
    from rlhf.config import load_profile
    from rlhf.tokens import max_new_tokens

    smoke = gpu_lab.smoke_profile()
    assert (smoke.sft.expected_updates, smoke.judge.expected_updates, smoke.ppo.iterations) == (4, 4, 3)
    assert max_new_tokens(smoke, "ppo") == max_new_tokens(smoke, "evaluation") == 64
    real = load_profile("qwen2.5-0.5b")
    assert smoke.model.num_hidden_layers == real.model.num_hidden_layers == 24 and smoke.device == "cuda"
