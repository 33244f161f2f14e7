"""The gpu tier's real budgets: the qwen2.5-0.5b lab end to end on CUDA, SPEC numbers unchanged.

    pytest -m gpu tests_gpu/test_qwen_pipeline.py --model-dir=DIR      the real model (Qwen2.5-0.5B-Instruct)
    pytest -m gpu tests_gpu/test_qwen_pipeline.py --random-weights     its full shape, random weights
    scripts/gpu_check.sh OUTDIR    the smoke part, then this, on a GPU machine without network access

First the dry run on this machine (rlhf.miniature.dry_run: the projection of `rlhf lab`), then
the whole lab at the real budgets with the interrupt/resume protocol (63 SFT updates, 210 judge
updates, 100 PPO iterations, the held-out evaluation, the shortcut audit, the reports), each
stage's seconds, peak CUDA memory and costs written to the numbers file as it finishes
(gpu_lab.Numbers, in --gpu-out), with CUDA's deterministic settings applied by the lab itself
(rlhf.runtime.configure_determinism). Then:

* the budgets ran: 63, 210 and 100 x 4 rollouts; the lab's seconds beside the projection's;
* behaviour log-probs (sampling, CUDA graphs over a static KV cache) and teacher-forced log-probs
  of the same tokens differ by at most LOGP_MAX_ABS and on average by at most LOGP_MEAN_ABS;
* the held-out metrics, the judge's test accuracy and the SFT -> PPO means recompute from the rows;
* the peak CUDA memory of every stage stays under MEMORY_LIMIT_FACTOR x the paper estimate
  (rlhf.flops.memory_estimate);
* resume is bit-identical (sha256 of resumed = continuous, tensor by tensor), under the
  deterministic settings run.json and the evaluation's results.json record.

Without CUDA, or without a model directory or --random-weights, every test here FAILS with a
message naming what is missing. The smoke part (test_gpu_smoke.py) runs the same path at tiny
budgets in minutes, with what only a GPU can show besides.
"""

from __future__ import annotations

import pytest
import torch
from gpu_lab import Numbers, qwen_model_dir, run_staged

from rlhf.checkpoint import assert_states_equal, load_state
from rlhf.config import load_profile
from rlhf.io import read_json
from rlhf.runtime import is_deterministic

pytestmark = pytest.mark.gpu

PART = "real"
# The BF16 bound between sampling and teacher forcing. Both paths compute the same function of
# the same BF16 weights, but with other kernels and shapes (one cached token per step against
# the whole sequence at once), so they differ only by rounding. BF16 keeps 8 significant bits:
# unit roundoff u = 2^-8 = 0.0039. A logit z is a 896-long dot product of BF16 values; its
# rounding differs between the paths by a few u relative to its size, and Qwen2.5-0.5B's logits
# stay within |z| <= ~16, so |dz| <= 2 u x 16 = 0.125. log-softmax is 2-Lipschitz in the max
# norm (|d log p_i| <= 2 max_j |dz_j|): |d log p| <= 0.25 nats per token. Errors of the kind this
# guards against are far larger: a log-prob read one position off, another temperature or a
# stale adapter move log-probs by whole nats. The mean bound (0.02 nats, 5 u) says that most
# tokens sit far below the worst case.
LOGP_MAX_ABS = 0.25
LOGP_MEAN_ABS = 0.02
# The estimate counts five BF16 backbones (four roles and the base they are copied from),
# adapters, heads, AdamW states and the largest update's activations; the caching allocator
# rounds blocks up and keeps short-lived buffers (log-softmax over 151,936 words) alive a while:
# 15% headroom.
MEMORY_LIMIT_FACTOR = 1.15


@pytest.fixture(scope="session")
def numbers(request) -> Numbers:
    return Numbers(request.config._rlhf_gpu_out)


@pytest.fixture(scope="session")
def qwen_ctx(request, tmp_path_factory, numbers):
    """The dry run's projection, then the lab at the real budgets: its context, with `stages`."""
    from rlhf import lab
    from rlhf.miniature import dry_run

    if not torch.cuda.is_available():
        pytest.fail("the gpu tier needs CUDA: no CUDA device is visible to torch")
    root = tmp_path_factory.mktemp("qwen")
    try:
        model_dir, profile = qwen_model_dir(request.config, root, load_profile("qwen2.5-0.5b"))
    except RuntimeError as err:
        pytest.fail(str(err))
    random_weights = profile.model.allow_random_weights
    dry = dry_run(load_profile("qwen2.5-0.5b"), model_dir, out=root / "dry-run", random_weights=random_weights)
    numbers.add(PART, "projection", dry["projection"])
    numbers.add(PART, "dry_run_s", round(dry["wall_s"], 3))
    ctx = lab.open_context(root / "run", profile, model_dir=model_dir)
    ctx.stages = run_staged(ctx, numbers, PART)
    ctx.projection = dry["projection"]
    return ctx


def test_budgets_63_210_and_100_iterations_and_the_projection(qwen_ctx, numbers, record_result):
    sft = read_json(qwen_ctx.run / "sft" / "history.json")
    judge = read_json(qwen_ctx.run / "judge" / "history.json")
    ppo = read_json(qwen_ctx.run / "ppo" / "history.json")
    assert len(sft["updates"]) == 63 and len(judge["updates"]) == 210
    assert len(ppo["iterations"]) == 100 and len(ppo["consumed"]) == 400
    measured = numbers.data[PART]["lab_s"]
    ratio = qwen_ctx.projection["lab_s"] / measured
    numbers.add(PART, "lab_with_protocol_s", measured)
    numbers.add(PART, "projected_over_measured", round(ratio, 3))
    record_result("qwen_stage_seconds", {k: v["seconds"] for k, v in qwen_ctx.stages.items()})
    record_result("qwen_lab_with_protocol_s", measured)
    record_result("qwen_projection_over_measured", ratio)
    assert measured > 0 and ratio > 0


def test_sampling_and_teacher_forcing_logprobs_within_the_bf16_bound(qwen_ctx, record_result):
    check = read_json(qwen_ctx.run / "ppo" / "history.json")["scoring_check"]
    record_result("qwen_scoring_check", check)
    assert check["tokens"] > 0 and check["use_cache"] is True
    assert check["max_abs_diff"] <= LOGP_MAX_ABS, check
    assert check["mean_abs_diff"] <= LOGP_MEAN_ABS, check


def test_heldout_metrics_recompute_from_the_rows(qwen_ctx, record_result):
    from rlhf.evaluate import summarise_populations

    res = read_json(qwen_ctx.run / "evaluation" / "results.json")
    for policy in ("sft", "ppo"):
        rows = res["policies"][policy]["rows"]
        assert len(rows) == 260
        assert summarise_populations(rows) == res["policies"][policy]["metrics"]
        record_result(f"qwen_{policy}_metrics", res["policies"][policy]["metrics"]["all_rows"])
    rows = res["judge_test"]["rows"]
    assert len(rows) == 180
    assert res["judge_test"]["accuracy"] == pytest.approx(
        sum(r["chosen_score"] > r["rejected_score"] for r in rows) / len(rows)
    )
    test_rows = {p: [r for r in res["policies"][p]["rows"] if r["population"] == "test"] for p in ("sft", "ppo")}
    diff = res["differences"]["learned_reward"]["test"]
    for p in ("sft", "ppo"):
        assert diff[p] == pytest.approx(sum(r["learned_reward"] for r in test_rows[p]) / 180)
    assert res["politeness"]["unchanged"] is True
    record_result("qwen_reward_test_accuracy", res["judge_test"]["accuracy"])


def test_peak_cuda_memory_of_every_stage_under_the_stated_limit(qwen_ctx, record_result):
    from rlhf.flops import memory_estimate

    estimate_mib = memory_estimate(qwen_ctx.profile)["total"] / 2**20
    peaks = {stage: s["peak_mib"] for stage, s in qwen_ctx.stages.items()}
    record_result("qwen_cuda_peak_mib", peaks)
    record_result("qwen_cuda_memory_estimate_mib", round(estimate_mib, 1))
    assert all(peak <= MEMORY_LIMIT_FACTOR * estimate_mib for peak in peaks.values()), (peaks, estimate_mib)


def test_deterministic_settings_applied_and_recorded(qwen_ctx, record_result):
    evaluation = read_json(qwen_ctx.run / "evaluation" / "results.json")
    for record in (read_json(qwen_ctx.run / "run.json")["determinism"], evaluation["determinism"]):
        assert record["applied"] is True and record["complete"] is True and is_deterministic(record)
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cuda.matmul.allow_tf32
    record_result("qwen_determinism", qwen_ctx.determinism)


@pytest.mark.parametrize("stage", ["sft", "judge", "ppo"])
def test_resume_bit_identical_under_deterministic_cuda(qwen_ctx, stage, numbers, record_result):
    folder = qwen_ctx.run / stage
    check = read_json(folder / "resume_check.json")
    assert check["identical"] is True and check["sha256_resumed"] == check["sha256_continuous"]
    a = load_state(folder / "state-resumed.pt.gz")
    b = load_state(folder / "state-continuous.pt.gz")
    numbers.add(PART, f"{stage}_resume_identical", True)
    record_result(f"qwen_{stage}_tensors_compared", assert_states_equal(b, a, stage))
    record_result(f"qwen_{stage}_sha256", check)
