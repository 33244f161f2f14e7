"""The hand-off checked with verl 0.9.1's own classes.

Runs in `.venv-verl` (`bash setup.sh --verl`), never in the lab's environment, and imports
nothing from rlhf: the lab's side of every comparison comes from the expectations file that
tests_unit/test_export_verl.py writes with rlhf (prompt ids, judge scores, token rewards, GAE,
learning rates). Environment:

    RLHF_VERL_HANDOFF   the folder `rlhf export-verl` wrote
    RLHF_VERL_EXPECT    the expectations JSON

    .venv-verl/bin/python -m pytest -c tests_verl/pytest.ini tests_verl
"""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

SPLITS = ("train", "test", "probe")


@pytest.fixture(scope="session")
def tokenizer(handoff):
    from verl.utils import hf_tokenizer

    return hf_tokenizer(str(handoff / "models" / "actor"))


def fill(line: str, handoff: Path, expect: dict) -> str:
    seeds = expect["seeds"]
    return (
        line.replace("$EXPORT_DIR", str(handoff))
        .replace("$SAMPLING_SEED", str(seeds["ppo_sampling"]))
        .replace("$DATA_SEED", str(seeds["data_order"]))
        .replace("$SEED", "0")
    )


def compose(handoff: Path, expect: dict, lines: list[str]):
    """verl's ppo_trainer defaults with the hand-off's overrides, through Hydra as main_ppo composes them."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=[fill(o, handoff, expect) for o in lines])


@pytest.fixture(scope="session")
def config(handoff, expect):
    lines = (handoff / "launch" / "overrides.txt").read_text().split("\n")
    return compose(handoff, expect, [o for o in lines if o])


# ------------------------------------------------------------------ data


@pytest.mark.parametrize("split", SPLITS)
def test_rlhf_dataset_reads_every_row_and_reproduces_lab_prompt_ids(handoff, expect, tokenizer, config, split):
    """RLHFDataset keeps every exported row (nothing over the prompt limit is filtered) and the
    prompt ids verl's rollout builds from each row (its Qwen continuous-token builder over the
    exported chat template) are the lab's, row by row."""
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    path = handoff / "data" / f"{split}.parquet"
    data_config = OmegaConf.create(
        {
            **OmegaConf.to_container(config.data, resolve=True),
            "cache_dir": str(handoff.parent / "verl-cache"),
            "filter_overlong_prompts_workers": 1,
        }
    )
    dataset = RLHFDataset(str(path), tokenizer, data_config)
    want = expect["prompt_ids"][split]
    assert len(pd.read_parquet(path)) == len(want) == len(dataset), "rows filtered or lost"
    builder = create_continuous_token_builder(tokenizer, hf_model_type="qwen2")
    got = [list(builder.build_initial_tokens(dataset[i]["raw_prompt"])) for i in range(len(dataset))]
    mismatched = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not mismatched, (
        f"{len(mismatched)} rows differ, first {mismatched[:3]}: {got[mismatched[0]]} vs {want[mismatched[0]]}"
    )


# ------------------------------------------------------------------ config

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # verl 0.9.1's fallback copy of vLLM's MaxLoRARanks


@pytest.fixture
def no_vllm(monkeypatch):
    """validate_config's last step imports verl.workers.rollout.vllm_rollout.utils (which imports
    vllm, CUDA-only) to look up vLLM's allowed LoRA ranks. That one module is replaced by a stand-in
    that checks the rank against the same list; every other check of validate_config runs as is."""
    import types

    seen = []

    def get_vllm_max_lora_rank(rank):
        seen.append(rank)
        assert rank in VLLM_LORA_RANKS, f"LoRA rank {rank} is not one vLLM serves"
        return rank

    stand_in = types.ModuleType("verl.workers.rollout.vllm_rollout.utils")
    stand_in.get_vllm_max_lora_rank = get_vllm_max_lora_rank
    monkeypatch.setitem(sys.modules, stand_in.__name__, stand_in)
    return seen


def test_overrides_compose_with_ppo_trainer_defaults_and_pass_validate_config(config, expect, no_vllm):
    from verl.utils.config import validate_config

    validate_config(config, use_reference_policy=True, use_critic=True)
    assert no_vllm == [8], "the LoRA rank reached validate_config's vLLM check"
    from omegaconf import OmegaConf

    wrong = {
        k: (OmegaConf.select(config, k), v)
        for k, v in expect["config_values"].items()
        if OmegaConf.select(config, k) != v
    }
    assert not wrong, f"composed config differs from the lab's numbers (got, lab): {wrong}"
    actor, critic = config.actor_rollout_ref.actor, config.critic
    # the lab has no dual clip and no value clipping: both pushed out of reach
    assert actor.clip_ratio_c >= 1e6 and critic.cliprange_value >= 1e6
    assert actor.clip_ratio_low == actor.clip_ratio_high == actor.clip_ratio
    assert config.algorithm.adv_estimator == "gae" and config.algorithm.use_kl_in_reward
    assert config.algorithm.kl_ctrl.type == "fixed" and config.actor_rollout_ref.actor.use_kl_loss is False
    assert config.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-mean"


@pytest.mark.parametrize("layout", ["2x8"])
def test_multi_gpu_overrides_pass_validate_config(handoff, expect, layout, no_vllm):
    """The same hand-off for 2 nodes x 8 GPUs (the batch becomes a multiple of 16)."""
    from verl.utils.config import validate_config

    config = compose(handoff, expect, expect["overrides"][layout])
    validate_config(config, use_reference_policy=True, use_critic=True)
    assert config.trainer.nnodes * config.trainer.n_gpus_per_node == 16
    assert config.data.train_batch_size % 16 == 0


# ------------------------------------------------------------------ reward


def _proto(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int, ground_truth: list[str]):
    """A DataProto as verl's rollout hands it to the reward loop: prompts left-padded,
    responses right-padded, one attention mask over both."""
    from verl import DataProto

    P, R = max(map(len, prompt_ids)), max(map(len, response_ids))
    B = len(prompt_ids)
    prompts = torch.full((B, P), pad_id, dtype=torch.long)
    responses = torch.full((B, R), pad_id, dtype=torch.long)
    mask = torch.zeros((B, P + R), dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        prompts[b, P - len(p) :] = torch.tensor(p)
        responses[b, : len(r)] = torch.tensor(r)
        mask[b, P - len(p) : P] = 1
        mask[b, P : P + len(r)] = 1
    non_tensor = {
        "data_source": np.array(["officehelpprefs"] * B, dtype=object),
        "reward_model": np.array([{"style": "rubric", "ground_truth": g} for g in ground_truth], dtype=object),
        "extra_info": np.array([{"index": b} for b in range(B)], dtype=object),
    }
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "attention_mask": mask,
            "input_ids": torch.cat([prompts, responses], 1),
        },
        non_tensors=non_tensor,
    )


@pytest.fixture(scope="session")
def reward_manager(config, tokenizer):
    from verl.trainer.ppo.reward import load_reward_manager

    return load_reward_manager(config, tokenizer)


def test_load_reward_manager_loads_the_exported_manager(reward_manager):
    assert type(reward_manager).__name__ == "LabJudgeRewardManager"
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

    assert isinstance(reward_manager, RewardManagerBase)


def test_reward_manager_scores_equal_lab_judge_including_truncated(reward_manager, expect):
    """Judge score + bias, -1 for a response cut without EOS, placed at the last response
    token by verl's assemble_rm_scores: the lab's terminal reward on every fixed pair; each
    response's finish reason indicator the lab's (a control token and broken text among them)."""
    cases = expect["judge_cases"]
    data = _proto(
        [c["prompt_ids"] for c in cases],
        [c["response_ids"] for c in cases],
        expect["pad_id"],
        [c["ground_truth"] for c in cases],
    )
    outs = [asyncio.run(reward_manager.run_single(data[i : i + 1])) for i in range(len(cases))]
    got = torch.tensor([o["reward_score"] for o in outs], dtype=torch.float64)
    want = torch.tensor([c["lab_terminal"] for c in cases], dtype=torch.float64)
    assert (got - want).abs().max().item() < 1e-4, f"max |verl - lab| {(got - want).abs().max().item():.3g}"
    truncated = [c["truncated"] for c in cases]
    assert any(truncated) and not all(truncated), "the fixed pairs need both endings"
    for o, c in zip(outs, cases):
        assert o["reward_extra_info"]["truncated"] == float(c["truncated"])
        assert math.isclose(o["reward_extra_info"]["judge_score"], c["lab_score"], abs_tol=1e-4)
        assert o["reward_extra_info"]["rubric_success"] == float(c["rubric_success"])
        finish = {k: v for k, v in o["reward_extra_info"].items() if k.startswith("finish_")}
        assert len(finish) == 5 and sum(finish.values()) == 1.0  # one indicator per finish reason
        assert finish[f"finish_{c['finish_reason']}"] == 1.0, (c["finish_reason"], finish)
    assert {c["finish_reason"] for c in cases} >= {"eos", "length", "control_token", "broken_text"}
    rm = type(reward_manager).assemble_rm_scores(data, got.tolist())
    lengths = torch.tensor([len(c["response_ids"]) for c in cases])
    nonzero = rm.ne(0)
    assert nonzero.sum(1).le(1).all()
    placed = rm[torch.arange(len(cases)), lengths - 1]
    assert torch.allclose(placed.double(), got, atol=1e-6), "the score must land on the last response token"


# ------------------------------------------------------------------ core_algos


def test_kl_in_reward_equals_lab_token_rewards(expect, config):
    """verl's apply_kl_penalty with the hand-off's algorithm settings (kl_ctrl, kl_penalty) on the
    terminal reward the manager pays: the lab's token_rewards."""
    from verl import DataProto
    from verl.trainer.ppo.core_algos import FixedKLController
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty

    case = expect["ppo_case"]
    mask = torch.tensor(case["mask"], dtype=torch.float32)
    scores = torch.zeros_like(mask)
    last = mask.sum(1).long() - 1
    scores[torch.arange(mask.shape[0]), last] = torch.tensor(case["terminal"])
    data = DataProto.from_dict(
        tensors={
            "response_mask": mask,
            "token_level_scores": scores,
            "old_log_probs": torch.tensor(case["logp_old"]),
            "ref_log_prob": torch.tensor(case["logp_ref"]),
        }
    )
    algo = config.algorithm
    assert algo.use_kl_in_reward and algo.kl_ctrl.type == "fixed"
    data, _ = apply_kl_penalty(data, FixedKLController(kl_coef=algo.kl_ctrl.kl_coef), kl_penalty=algo.kl_penalty)
    got = data.batch["token_level_rewards"] * mask
    want = torch.tensor(case["token_rewards"])
    assert (got - want).abs().max().item() < 1e-6


def test_gae_returns_equal_lab_and_advantages_are_whitened(expect, config):
    """Returns (the critic's targets) equal the lab's; verl's advantages are the lab's,
    whitened over the batch (not expressible in 0.9.1): different numbers, same order."""
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return
    from verl.utils.torch_functional import masked_whiten

    case = expect["ppo_case"]
    mask = torch.tensor(case["mask"], dtype=torch.float32)
    adv, ret = compute_gae_advantage_return(
        torch.tensor(case["token_rewards"]),
        torch.tensor(case["values"]),
        mask,
        gamma=config.algorithm.gamma,
        lam=config.algorithm.lam,
    )
    lab_adv, lab_ret = torch.tensor(case["advantages"]), torch.tensor(case["returns"])
    m = mask.bool()
    assert (ret[m] - lab_ret[m]).abs().max().item() < 1e-5
    assert (adv[m] - lab_adv[m]).abs().max().item() > 1e-2, "whitening should show up"
    assert (adv[m] - masked_whiten(lab_adv, mask)[m]).abs().max().item() < 1e-5


def test_lr_schedule_differs_where_the_mapping_says(expect, config):
    """verl's cosine, stepped once per iteration from 0, against the lab's linear decay stepped
    once per update: the documented differences (approximate rows of the mapping)."""
    from verl.utils.torch_functional import get_cosine_schedule_with_warmup

    case = expect["schedule"]
    optim = config.actor_rollout_ref.actor.optim  # the hand-off's actor optimizer settings
    assert optim.lr_scheduler_type == "cosine" and optim.lr == case["peak"]
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=optim.lr)
    steps = case["iterations"]  # the contract's 100 iterations (the small run trains 4)
    sched = get_cosine_schedule_with_warmup(
        opt,
        num_warmup_steps=int(optim.lr_warmup_steps_ratio * steps),
        num_training_steps=steps,
        min_lr_ratio=optim.min_lr_ratio,
    )
    verl_lr = []
    for _ in range(steps):
        verl_lr.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    lab = case["lab_lr_per_update"]  # two updates per iteration
    assert len(lab) == 2 * steps
    assert verl_lr[0] == 0.0 < lab[0], "verl's warm-up starts at 0, the lab's at peak/warm"
    assert max(verl_lr) <= case["peak"] * (1 + 1e-9)
    diffs = [abs(verl_lr[i] - lab[2 * i]) / case["peak"] for i in range(steps)]
    assert max(diffs) > 0.01, "cosine against linear decay should show up"
    assert lab[1] != lab[0], "the lab's rate changes between the two updates of an iteration"
