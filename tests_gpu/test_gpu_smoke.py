"""The gpu tier's smoke part: the real code path at Qwen2.5-0.5B's full shape on CUDA, in minutes.

    pytest -m gpu tests_gpu/test_gpu_smoke.py --random-weights      (scripts/gpu_check.sh runs it first)

The whole lab (`rlhf.lab`, every stage with the interrupt/resume protocol) on the full shape
(24 layers, full width and vocabulary, BF16; --random-weights: random weights drawn on the GPU,
or --model-dir) at the miniature's budgets with full 64-token rollouts and answers
(gpu_lab.smoke_profile), each stage's seconds, peak memory and costs written to the numbers file
as it finishes (gpu_lab.Numbers, in --gpu-out). Then every assertion of the gpu tier on it, and
what only a GPU can show: a worst-case memory probe, two identical updates giving bit-equal
gradients, decode steps replayed as CUDA graphs (one replay per step), states compared bit for
bit across devices; and two measurements for the cost model: the decode step and the host's
microseconds per kernel launch.

Without CUDA, or without a model directory or --random-weights, every test here FAILS with a
message naming what is missing (a GPU suite that silently passes would prove nothing).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from gpu_lab import Numbers, host_launch_microseconds, qwen_model_dir, run_staged, smoke_profile

from rlhf.checkpoint import assert_states_equal, load_state
from rlhf.io import read_json
from rlhf.runtime import is_deterministic

pytestmark = pytest.mark.gpu

PART = "smoke"
# The BF16 bound between sampling and teacher forcing (tests_gpu/test_qwen_pipeline.py says why).
LOGP_MAX_ABS = 0.25
LOGP_MEAN_ABS = 0.02
MEMORY_LIMIT_FACTOR = 1.15


def need_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("the gpu tier needs CUDA: no CUDA device is visible to torch")


@pytest.fixture(scope="session")
def numbers(request) -> Numbers:
    return Numbers(request.config._rlhf_gpu_out)


@pytest.fixture(scope="session")
def smoke(request, tmp_path_factory, numbers):
    """The smoke lab, run once: its context with `stages` (per-stage numbers) attached."""
    from rlhf import lab

    need_cuda()
    numbers.add(PART, "device", device_record())
    root = tmp_path_factory.mktemp("gpu_smoke")
    try:
        model_dir, profile = qwen_model_dir(request.config, root, smoke_profile())
    except RuntimeError as err:
        pytest.fail(str(err))
    ctx = lab.open_context(root / "run", profile, model_dir=model_dir)
    ctx.stages = run_staged(ctx, numbers, PART)
    return ctx


def device_record() -> dict:
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "memory_mib": props.total_memory // 2**20,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": _driver_version(),
    }


def _driver_version() -> str | None:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        )
    except OSError:
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def test_every_stage_ran_and_its_numbers_were_written(smoke, numbers, record_result):
    stages = numbers.data[PART]["stages"]
    assert list(stages) == ["sft", "judge", "ppo", "evaluate", "shortcut_audit", "report"]
    assert all(s["seconds"] > 0 and s["peak_mib"] > 0 for s in stages.values())
    record_result("gpu_smoke_stages", stages)


def test_decode_steps_replay_cuda_graphs(smoke, numbers, record_result):
    """Every PPO decode step a graph replay; each graph captured once per model and batch size."""
    paid = smoke.stages["ppo"]["paid"]
    assert paid["decode_steps"] > 0 and paid["graph_replays"] == paid["decode_steps"], paid
    assert 0 < paid["graph_captures"] * 20 <= paid["decode_steps"]  # captured once per actor and shape, not per step
    ppo = read_json(smoke.run / "ppo" / "history.json")
    assert max(it["response_length"] for it in ppo["iterations"]) == 64  # full rollouts (random weights: no EOS)
    record_result("gpu_smoke_ppo_paid", paid)


def test_the_decode_step_and_the_host_cost_of_a_launch(smoke, numbers, record_result):
    from rlhf.projection import decode_step_seconds
    from rlhf.roles import load_role
    from rlhf.tokens import encode_prompt

    actor = smoke.role("actor")
    load_role(actor, smoke.run / "ppo" / "actor.safetensors")
    records = smoke.corpus.learning_view().rollout_prompts()[:4]
    prompts = [encode_prompt(smoke.tokenizer, r["prompt"], smoke.profile.limits) for r in records]
    step_ms = 1e3 * decode_step_seconds(
        actor.model, prompts, pad_id=smoke.pad_id, greedy=False, last_logits_only=True, lengths=(16, 48)
    )
    launch_us = host_launch_microseconds()
    numbers.add(PART, "decode_step_ms", round(step_ms, 3))
    numbers.add(PART, "host_us_per_launch", round(launch_us, 2))
    record_result("gpu_decode_step_ms", step_ms)
    record_result("gpu_host_us_per_launch", launch_us)
    assert 0 < step_ms < 1000 and 0 < launch_us < 1000


def test_every_role_and_rollout_tensor_is_on_cuda(smoke, record_result):
    from rlhf import lab, ppo
    from rlhf.tokens import encode_prompt

    assert smoke.device == "cuda" and read_json(smoke.run / "run.json")["device"] == "cuda"
    roles = lab.ppo_roles(smoke)
    off = [
        f"{kind}:{name}"
        for kind, role in roles.by_kind().items()
        for name, t in _tensors(role)
        if t.device.type != "cuda"
    ]
    assert off == []
    prompts = [
        encode_prompt(smoke.tokenizer, r["prompt"], smoke.profile.limits)
        for r in smoke.corpus.learning_view().rollout_prompts()[:4]
    ]
    gen = torch.Generator(device="cuda").manual_seed(smoke.profile.seeds.ppo_sampling)
    ro = ppo.rollout(roles, ppo.Prompts(prompts, None), smoke.tokens(), smoke.profile, gen, {})
    tensors = {f.name: getattr(ro, f.name) for f in dataclasses.fields(ro)}
    tensors.update({f"batch.{f.name}": getattr(ro.batch, f.name) for f in dataclasses.fields(ro.batch)})
    devices = {k: v.device.type for k, v in tensors.items() if isinstance(v, torch.Tensor)}
    assert len(devices) >= 10 and set(devices.values()) == {"cuda"}, devices
    record_result("gpu_rollout_tensors_on_cuda", sorted(devices))


def _tensors(role):
    yield from role.model.named_parameters()
    yield from role.model.named_buffers()
    if role.head is not None:
        yield from (("head." + n, p) for n, p in role.head.named_parameters())


def test_sampling_and_teacher_forcing_logprobs_within_the_bf16_bound(smoke, record_result):
    check = read_json(smoke.run / "ppo" / "history.json")["scoring_check"]
    record_result("gpu_smoke_scoring_check", check)
    assert check["tokens"] > 0 and check["use_cache"] is True
    assert check["max_abs_diff"] <= LOGP_MAX_ABS and check["mean_abs_diff"] <= LOGP_MEAN_ABS, check


def test_heldout_metrics_recompute_from_the_rows(smoke):
    from rlhf.evaluate import summarise_populations

    res = read_json(smoke.run / "evaluation" / "results.json")
    for policy in ("sft", "ppo"):
        rows = res["policies"][policy]["rows"]
        assert len(rows) == 18  # 2 test families (10 prompts) and 2 probe contexts (8 rows)
        assert summarise_populations(rows) == res["policies"][policy]["metrics"]
    rows = res["judge_test"]["rows"]
    assert res["judge_test"]["accuracy"] == pytest.approx(
        sum(r["chosen_score"] > r["rejected_score"] for r in rows) / len(rows)
    )
    assert res["politeness"]["unchanged"] is True


@pytest.mark.parametrize("stage", ["sft", "judge", "ppo"])
def test_resume_bit_identical_under_deterministic_cuda(smoke, stage, record_result):
    folder = smoke.run / stage
    check = read_json(folder / "resume_check.json")
    assert check["identical"] is True and check["sha256_resumed"] == check["sha256_continuous"]
    compared = assert_states_equal(
        load_state(folder / "state-continuous.pt.gz"), load_state(folder / "state-resumed.pt.gz")
    )
    record_result(f"gpu_smoke_{stage}_tensors_compared", compared)


def test_deterministic_settings_applied_and_recorded(smoke):
    record = read_json(smoke.run / "run.json")["determinism"]
    assert record["applied"] is True and record["complete"] is True and is_deterministic(record)
    assert record["fill_uninitialized_memory"] is False  # deterministic algorithms without their NaN fills
    assert torch.are_deterministic_algorithms_enabled() and not torch.backends.cuda.matmul.allow_tf32


def test_worst_case_memory_with_all_four_roles_resident(smoke, numbers, record_result):
    """Batch 4 at the 320-token context, the four roles built, one PPO update of actor and critic
    (forward, backward, AdamW): the peak under MEMORY_LIMIT_FACTOR x the paper estimate
    (rlhf.flops.memory_estimate), which counts exactly this."""
    from rlhf import lab, ppo_math
    from rlhf.flops import memory_estimate
    from rlhf.optim import adamw, optimizer_step
    from rlhf.roles import critic_values
    from rlhf.scoring import response_logprobs
    from rlhf.tokens import collate

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    roles = lab.ppo_roles(smoke)
    limits = smoke.profile.limits
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 150000, (limits.prompt_tokens,), generator=g).tolist() for _ in range(4)]
    answers = [torch.randint(0, 150000, (limits.response_tokens,), generator=g).tolist() for _ in range(4)]
    batch = collate(prompts, answers, smoke.pad_id).to("cuda")
    mask = batch.response_mask
    zeros, ones = torch.zeros(mask.shape, device="cuda"), torch.ones(mask.shape, device="cuda")
    losses = {
        "actor": lambda r: ppo_math.clipped_policy_loss(response_logprobs(r.model, batch), zeros, ones, mask, clip=0.2),
        "critic": lambda r: ppo_math.value_loss(critic_values(r, batch), zeros, mask, coef=0.5),
    }
    for role in (roles.actor, roles.critic):
        params = [p for p in role.learned_parameters() if p.requires_grad]
        optimizer_step(adamw(params, 1e-6, 0.0), params, losses[role.kind](role), 1e-6, 1.0, "memory probe")
    peak = torch.cuda.max_memory_allocated() / 2**20
    estimate = memory_estimate(smoke.profile)["total"] / 2**20
    numbers.add(PART, "worst_case_peak_mib", round(peak, 1))
    numbers.add(PART, "memory_estimate_mib", round(estimate, 1))
    record_result("gpu_worst_case_peak_mib", {"peak": peak, "estimate": estimate})
    assert peak <= MEMORY_LIMIT_FACTOR * estimate, (peak, estimate)


def test_two_identical_updates_give_bit_equal_gradients(smoke):
    """Deterministic algorithms: the same loss on the same weights, backward twice, the same bits."""
    from rlhf import lab
    from rlhf.scoring import response_logprobs
    from rlhf.tokens import collate

    actor = lab.ppo_roles(smoke).actor
    g = torch.Generator().manual_seed(1)
    batch = collate(
        [torch.randint(0, 150000, (60,), generator=g).tolist() for _ in range(4)],
        [torch.randint(0, 150000, (64,), generator=g).tolist() for _ in range(4)],
        smoke.pad_id,
    ).to("cuda")
    params = [p for p in actor.learned_parameters() if p.requires_grad]
    grads = []
    for _ in range(2):
        for p in params:
            p.grad = None
        response_logprobs(actor.model, batch)[batch.response_mask].sum().backward()
        grads.append([p.grad.clone() for p in params])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    assert any(bool(a.abs().sum() > 0) for a in grads[0])


def test_states_compare_bit_for_bit_across_devices():
    """A state read from disk (CPU) against one still in memory (CUDA): the dry run's rehearsal
    and the lab's protocol compare such pairs. Equal bits pass wherever they live; one changed
    bit fails."""
    need_cuda()
    on_cpu = {"w": torch.randn(64, 32, dtype=torch.bfloat16), "step": 3, "m": [torch.zeros(5)]}
    on_cuda = {"w": on_cpu["w"].cuda(), "step": 3, "m": [on_cpu["m"][0].cuda()]}
    assert assert_states_equal(on_cpu, on_cuda) == 2
    assert assert_states_equal(on_cuda, on_cpu) == 2
    on_cuda["w"][0, 0] += 1
    with pytest.raises(AssertionError, match=r"state\.w: tensors differ"):
        assert_states_equal(on_cpu, on_cuda)
