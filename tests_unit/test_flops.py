"""Arithmetic of rlhf.flops (FLOP formula, parameter counts, the qwen2.5-0.5b memory estimate)."""

import ast
import sys
from pathlib import Path

import pytest

from rlhf import flops
from rlhf.config import load_profile

pytestmark = pytest.mark.unit

QWEN = flops.Shape(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936)


def test_shapes_from_profiles():
    assert flops.Shape.from_profile(load_profile("qwen2.5-0.5b")) == QWEN
    emb = flops.Shape.from_profile(load_profile("embedded"))
    assert (emb.hidden, emb.layers, emb.kv_dim, emb.head_dim) == (64, 2, 32, 16)


def test_qwen_parameter_counts():
    # Qwen2.5-0.5B: 494,032,768 parameters with the tied embedding counted once.
    assert flops.total_params(QWEN) == 494_032_768
    per_layer = 2 * 896 * 896 + 2 * 896 * 128 + 3 * 896 * 4864
    assert per_layer == 14_909_440
    assert flops.backbone_matmul_params(QWEN) == 24 * per_layer == 357_826_560
    assert flops.lm_head_params(QWEN) == 151936 * 896 == 136_134_656
    assert flops.lora_params(QWEN, 8) == load_profile("qwen2.5-0.5b").lora.expected_parameters == 4_399_104
    assert flops.backbone_matmul_params(QWEN, lora_rank=8) == 357_826_560 + 4_399_104


def test_embedded_counts_match_a_built_model():
    from transformers import Qwen2ForCausalLM

    from rlhf.models import qwen2_config

    profile = load_profile("embedded")
    config = qwen2_config(profile)
    model = Qwen2ForCausalLM(config)
    shape = flops.Shape.from_config(config)
    assert flops.total_params(shape) == sum(p.numel() for p in model.parameters())
    linear = sum(mod.weight.numel() for name, mod in model.model.layers.named_modules() if name.endswith("_proj"))
    assert flops.backbone_matmul_params(shape) == linear
    assert flops.lora_params(shape, 8) == profile.lora.expected_parameters == 22528


def test_forward_and_train_flops_formula():
    s = flops.Shape(hidden=4, layers=1, heads=2, kv_heads=1, intermediate=8, vocab=10)
    # projections: q 4x4, k 4x2, v 4x2, o 4x4, gate/up 4x8, down 8x4 -> 16+8+8+16+32+32+32 = 144
    assert flops.backbone_matmul_params(s) == 144
    assert flops.lora_params(s, 1) == (8 + 6 + 6 + 8 + 12 + 12 + 12)
    f = flops.forward_flops(s, tokens=3, logit_rows=2, head_rows=1)
    assert f == 2 * 144 * 3 + 2 * 40 * 2 + 2 * 4 * 1
    assert flops.train_flops(f) == 3 * f
    assert flops.attention_flops(s, pairs=5) == 4 * 4 * 1 * 5


def test_the_scoring_judge_critic_and_update_flops_by_hand():
    """On the tiny shape above (144 backbone weights, no LoRA; 40 lm-head weights; hidden 4) and a
    batch of B = 3 sequences of T = 10 tokens with R = 4 response positions."""
    from types import SimpleNamespace

    import torch

    s = flops.Shape(hidden=4, layers=1, heads=2, kv_heads=1, intermediate=8, vocab=10)
    batch = SimpleNamespace(input_ids=torch.zeros(3, 10, dtype=torch.long), response_index=torch.zeros(3, 4))
    assert flops.batch_dims(batch) == (3, 10, 4)
    attention = 4 * 4 * 1 * 3 * 10 * 10  # every (query, key) pair of each sequence
    scoring = {"model_flops": 2 * 144 * 30 + 2 * 40 * 12, "attention_flops": attention}  # logits at B·R rows
    judge = {"model_flops": 2 * 144 * 30 + 2 * 4 * 3, "attention_flops": attention}  # one head row a sequence
    critic = {"model_flops": 2 * 144 * 30 + 2 * 4 * 12, "attention_flops": attention}  # one a response prefix
    assert flops.scoring_flops(s, batch, 0) == scoring
    assert flops.judge_flops(s, batch, 0) == judge
    assert flops.critic_flops(s, batch, 0) == critic
    assert flops.add(scoring, critic, {"x": 1}) == {"model_flops": 8640 + 960 + 8640 + 96,
                                                    "attention_flops": 2 * attention, "x": 1}  # fmt: skip
    assert flops.ppo_update_flops(s, batch, 0) == {"model_flops": 3 * (8640 + 960 + 8640 + 96),
                                                   "attention_flops": 3 * 2 * attention}  # fmt: skip
    rank = flops.scoring_flops(s, batch, 1)["model_flops"] - scoring["model_flops"]
    assert rank == 2 * flops.lora_params(s, 1) * 30  # LoRA's A and B at every token


def test_generation_flops_with_and_without_cache():
    s = flops.Shape(hidden=4, layers=1, heads=2, kv_heads=1, intermediate=8, vocab=10)
    per_tok = 2 * 144 + 2 * 40  # every position given to the causal LM gets logits
    cached = flops.generation_flops(s, batch=2, prompt_len=3, steps=3, use_cache=True)
    assert cached["model_flops"] == per_tok * 2 * (3 + 1 + 1)
    full = flops.generation_flops(s, batch=2, prompt_len=3, steps=3, use_cache=False)
    assert full["model_flops"] == per_tok * 2 * (3 + 4 + 5)
    assert full["generated_tokens"] == cached["generated_tokens"] == 6
    assert cached["attention_flops"] == 16 * 2 * (9 + 4 + 5)
    assert full["attention_flops"] == 16 * 2 * (9 + 16 + 25)


def test_qwen_memory_estimate_arithmetic():
    est = flops.memory_estimate(load_profile("qwen2.5-0.5b"))
    n, lora, H = 494_032_768, 4_399_104, 896
    assert est["backbones"] == n * 2 * 5 == 4_940_327_680  # four roles and the base they are copied from
    assert est["adapters_and_heads"] == lora * 4 * 4 + 2 * (H + 1) * 4
    assert est["optimizer_and_grads"] == (2 * lora + H + 1) * 12
    per_tok_layer = 2 * (7 * 896 + 2 * 128 + 4 * 4864) + 4 * (6 * 896 + 4864)
    assert per_tok_layer == 92_928
    assert est["activations_layers"] == 24 * 4 * 320 * per_tok_layer
    assert est["activations_logits"] == 3 * 4 * 64 * 151936 * 4
    assert est["total"] == (
        est["backbones"] + est["adapters_and_heads"] + est["optimizer_and_grads"] + est["activations"]
    )
    assert 7.0 < est["total_gib"] < 8.5


def test_utilisation_ratio():
    u = flops.utilisation(2e9, 0.5, 8e9)
    assert u["achieved_gflop_s"] == pytest.approx(4.0) and u["utilisation"] == pytest.approx(0.5)


def test_flops_is_pure_and_at_the_bottom_of_the_import_graph():
    """rlhf.flops only calculates: every import, at any depth (function bodies included), is of
    the standard library; nothing from rlhf, torch or any other package."""
    tree = ast.parse(Path(flops.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import in rlhf/flops.py: line {node.lineno}"
            imported.add(node.module.split(".")[0])
    assert "rlhf" not in imported, imported
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported - set(sys.stdlib_module_names)


def test_the_labs_launch_work_counted_by_hand():
    """`rlhf lab` with its protocol on the qwen2.5-0.5b profile, every answer at 64 tokens."""
    work = flops.lab_launch_work(load_profile("qwen2.5-0.5b"))
    ppo_iterations = 40 + 60 + 100  # the boundary, resumed and continuous legs
    eval_batches, pair_batches = 9, 12  # 260 rows in 32s; 180 pairs in 16s
    assert work["decode_steps"] == ppo_iterations * 63 + 2 * eval_batches * 63 == 13_734
    validations = (1 + 2 + 3) + (1 + 1 + 2)  # SFT's 3 epochs and the judge's 2, over the three legs
    assert work["forwards"] == 3 * ppo_iterations + pair_batches * validations + 2 * 9 * 3 + 12 + 5 * 12 == 846
    assert work["updates"] == (21 + 42 + 63) + (105 + 105 + 210) + ppo_iterations * 2 * 2 == 1_346


def test_the_launch_models_batch_sizes_and_counts_are_the_labs():
    """rlhf.flops imports no lab module, so its copies of the lab's batch sizes and held-out counts
    are checked here against the modules that use them."""
    import inspect

    from rlhf import judge, shortcut, tokens
    from rlhf.corpus import Corpus

    view = Corpus.build("r001").evaluation_view()
    assert flops.HELD_OUT_ROWS == len(view.prompts("test")) + len(view.prompts("probe")) == 260
    assert flops.PAIRS == len(view.test_pairs())
    assert flops.ANSWER_BATCH == tokens.BATCH_SIZE
    assert (
        flops.PAIR_BATCH
        == shortcut.BATCH_SIZE
        == inspect.signature(judge.evaluate_pairs).parameters["batch_size"].default
    )


def test_launch_seconds_with_and_without_the_diet():
    work = {"decode_steps": 1000, "forwards": 10, "updates": 20}
    before = flops.launch_seconds(work, host_us=5.0, kernel_us=2.0, diet=False)
    assert before["decode_s"] == pytest.approx(1000 * (2010 + 867) * 5e-6)
    assert before["updates_s"] == pytest.approx(20 * (5131 + 2494) * 5e-6)
    after = flops.launch_seconds(work, host_us=5.0, kernel_us=2.0, diet=True)
    assert after["decode_s"] == pytest.approx(1000 * max(25 * 5.0, 1938 * 2.0) * 1e-6)  # the GPU bounds a replay
    assert after["forwards_s"] == pytest.approx(10 * 2016 * 5e-6)
    slow_host = flops.launch_seconds(work, host_us=200.0, kernel_us=2.0, diet=True)
    assert slow_host["decode_s"] == pytest.approx(1000 * 25 * 200e-6)  # the host bounds it
    assert after["total_s"] == pytest.approx(after["decode_s"] + after["forwards_s"] + after["updates_s"])
