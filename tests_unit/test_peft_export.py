"""export_peft writes PEFT's on-disk adapter format; PEFT 0.21.2 loads it and gives our logits.

Tolerance: the loaded PEFT model runs the same arithmetic as ours (FP32 A/B, FP32 branch, one
cast back to the base dtype; see tests_property/test_lora_peft_parity.py), so logits must be
bitwise equal (LOGITS_ATOL = 0). A nonzero difference would mean a key, a scaling or a dtype
was lost on the way through the files. The equality holds on every CPU, not only this one: both
models call the same kernels on the same operands in the same order, and the one step written
differently (our scale 2 folded into the add, rlhf.lora._scaled_sum) is exact in IEEE 754.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from peft import PeftModel
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlhf.embedded import SHAPE as EMBEDDED_SHAPE
from rlhf.io import ArtifactExists, sha256_file
from rlhf.lora import TARGETS, export_peft, inject_lora, lora_modules

pytestmark = pytest.mark.unit

LOGITS_ATOL = 0.0
TINY = {**EMBEDDED_SHAPE, "tie_word_embeddings": True}  # the embedded base's tiny Qwen2 shape
BASE_NAME = "Qwen/Qwen2.5-0.5B-Instruct"


def injected_tiny(dtype):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        base = Qwen2ForCausalLM(Qwen2Config(**TINY)).to(dtype).eval()
    twin = copy.deepcopy(base)
    adapters = inject_lora(base, rank=8, alpha=16, seed=49)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for a in adapters.values():
            a.lora_B.copy_(torch.randn(a.lora_B.shape, generator=g) * 0.05)
    return base, twin, adapters


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_peft_loads_our_export_and_gives_the_same_logits(tmp_path, dtype, record_result):
    model, twin, adapters = injected_tiny(dtype)
    out_dir = tmp_path / "adapter"
    paths = export_peft(model, out_dir, BASE_NAME)
    assert sorted(p.name for p in out_dir.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert paths["config"] == out_dir / "adapter_config.json"

    cfg = json.loads((out_dir / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM"
    assert (cfg["r"], cfg["lora_alpha"], cfg["lora_dropout"], cfg["bias"]) == (8, 16, 0.0, "none")
    assert cfg["target_modules"] == list(TARGETS)
    assert cfg["base_model_name_or_path"] == BASE_NAME
    assert cfg["use_rslora"] is False and cfg["use_dora"] is False

    tensors = load_file(out_dir / "adapter_model.safetensors")
    want_keys = {f"base_model.model.{n}.lora_{k}.weight" for n in adapters for k in "AB"}
    assert set(tensors) == want_keys and len(tensors) == 28
    for n, a in adapters.items():
        assert torch.equal(tensors[f"base_model.model.{n}.lora_A.weight"], a.lora_A)
        assert torch.equal(tensors[f"base_model.model.{n}.lora_B.weight"], a.lora_B)
        assert tensors[f"base_model.model.{n}.lora_A.weight"].dtype == torch.float32
    with safe_open(out_dir / "adapter_model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}

    loaded = PeftModel.from_pretrained(twin, str(out_dir)).eval()
    mods = dict(loaded.base_model.model.named_modules())
    for n, a in adapters.items():  # every adapter arrived, under the right module, unchanged
        assert torch.equal(mods[n].lora_A["default"].weight, a.lora_A), n
        assert torch.equal(mods[n].lora_B["default"].weight, a.lora_B), n
        assert mods[n].scaling["default"] == a.scaling == 2.0
    ids = torch.tensor([[1, 500, 17, 1023, 9, 64, 300, 2]])
    with torch.no_grad():
        ours, theirs = model(ids).logits, loaded(input_ids=ids).logits
    assert ours.dtype == theirs.dtype == dtype
    diff = float((ours.double() - theirs.double()).abs().max())
    record_result(f"max_abs_diff_export_logits_{'fp32' if dtype == torch.float32 else 'bf16'}", diff)
    assert diff <= LOGITS_ATOL
    with loaded.disable_adapter(), torch.no_grad():
        assert not torch.equal(loaded(input_ids=ids).logits, theirs)  # the adapter is live


def test_export_refuses_to_overwrite_and_writes_nothing_partial(tmp_path):
    model, _, adapters = injected_tiny(torch.float32)
    out_dir = tmp_path / "adapter"
    export_peft(model, out_dir, BASE_NAME)
    before = {p.name: sha256_file(p) for p in out_dir.iterdir()}
    with torch.no_grad():
        next(iter(adapters.values())).lora_B.add_(1.0)
    with pytest.raises(ArtifactExists, match="refusing to overwrite"):
        export_peft(model, out_dir, BASE_NAME)
    assert {p.name: sha256_file(p) for p in out_dir.iterdir()} == before

    # a folder holding only a config is refused too, before the weights are written
    other = tmp_path / "other"
    other.mkdir()
    (other / "adapter_config.json").write_text("{}")
    with pytest.raises(ArtifactExists, match="adapter_config.json"):
        export_peft(model, other, BASE_NAME)
    assert sorted(p.name for p in other.iterdir()) == ["adapter_config.json"]


def test_export_refuses_a_model_without_adapters(tmp_path):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        base = Qwen2ForCausalLM(Qwen2Config(**TINY))
    assert lora_modules(base) == {}
    with pytest.raises(ValueError, match="no LoRA adapters to export"):
        export_peft(base, tmp_path / "adapter", BASE_NAME)
    assert not (tmp_path / "adapter").exists()
