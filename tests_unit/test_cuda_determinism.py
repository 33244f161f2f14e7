"""CUDA's deterministic settings are applied for CUDA profiles and recorded,
testable without a GPU: the switches are process settings, not CUDA calls.

The gpu tier (tests_gpu/test_qwen_pipeline.py) then demands a bit-identical resume on CUDA
and reads these settings back from run.json and the evaluation's results.json.
"""

from __future__ import annotations

import os

import pytest
import torch
from bench_harness import deterministic_fills  # the one fill counter (tests_unit/ is on sys.path)

from rlhf.config import load_profile, override
from rlhf.runtime import CUBLAS_WORKSPACE, configure_determinism

pytestmark = pytest.mark.unit


@pytest.fixture
def restore_torch_settings():
    """The switches are process-wide: put them back as they were, whatever the test did."""
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    yield
    torch.use_deterministic_algorithms(saved[0])
    (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    ) = saved[1:5]
    torch.utils.deterministic.fill_uninitialized_memory = saved[6]
    if saved[5] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[5]


def test_cuda_profile_gets_every_deterministic_switch(restore_torch_settings, monkeypatch):
    """Catches a switch that configure_determinism forgets (each is read back from torch)."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(False)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    got = configure_determinism(load_profile("qwen2.5-0.5b"))
    assert got["applied"] is True and got["complete"] is True
    assert got["deterministic_algorithms"] is True and torch.are_deterministic_algorithms_enabled()
    assert got["cublas_workspace_config"] == os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE == ":4096:8"
    assert got["matmul_allow_tf32"] is False and got["cudnn_allow_tf32"] is False
    assert got["cudnn_deterministic"] is True and got["cudnn_benchmark"] is False
    assert got["overridden_user_settings"] == {}
    # Deterministic algorithms kept, their NaN fill of every new tensor off (a launch each) and recorded
    assert got["fill_uninitialized_memory"] is False and torch.utils.deterministic.fill_uninitialized_memory is False


def test_a_users_other_cublas_workspace_is_replaced_and_reported(restore_torch_settings, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    got = configure_determinism(load_profile("qwen2.5-0.5b"))
    assert got["cublas_workspace_config"] == ":4096:8"
    assert got["overridden_user_settings"] == {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}


def test_cpu_profile_is_left_alone(restore_torch_settings):
    """The embedded lab's golden hashes were made without these switches."""
    torch.use_deterministic_algorithms(False)
    got = configure_determinism(load_profile("embedded"))
    assert got["applied"] is False and got["complete"] is False
    assert torch.are_deterministic_algorithms_enabled() is False


def test_open_context_of_a_cuda_profile_records_the_settings_in_run_json(restore_torch_settings, monkeypatch, tmp_path):
    """The lab applies the settings itself (a caller cannot forget) and run.json records them.
    torch is made to report CUDA: open_context builds no role, so no CUDA call is made."""
    from rlhf import lab
    from rlhf.io import read_json

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(False)
    profile = override(load_profile("embedded"), {(None, "device"): "cuda"})
    ctx = lab.open_context(tmp_path / "run", profile)
    record = read_json(tmp_path / "run" / "run.json")
    assert record["device"] == "cuda"
    assert record["determinism"] == ctx.determinism
    assert record["determinism"]["complete"] is True and torch.are_deterministic_algorithms_enabled()


def test_deterministic_mode_of_a_cuda_profile_fills_no_new_tensor(restore_torch_settings):
    """Deterministic algorithms stay on; the NaN fill they add to every new tensor (a kernel
    launch each on a GPU) is off. The same fills show on the CPU, where this counts them."""
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))

    def work():
        y = torch.softmax(x @ x.T, dim=-1).to(torch.bfloat16)
        return (y.float() * 2).sum()

    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    with_fills = deterministic_fills(work)
    configure_determinism(load_profile("qwen2.5-0.5b"))
    assert torch.are_deterministic_algorithms_enabled()
    assert with_fills >= 3 and deterministic_fills(work) == 0
