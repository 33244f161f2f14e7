"""Our hand-written LoRA against PEFT 0.21.2's LoRA: forward outputs and gradients.

What PEFT does (peft/tuners/lora/layer.py, Linear.forward, vanilla LoRA):

    result = base_layer(x)                      # base dtype
    x = x.to(lora_A.weight.dtype)               # _cast_input_dtype
    result = result + lora_B(lora_A(dropout(x))) * scaling
    result = result.to(base result dtype)

and `get_peft_model(..., autocast_adapter_dtype=True)` (the default) upcasts BF16/FP16 adapter
weights to FP32. So for a BF16 base PEFT's A/B are FP32, the branch runs in FP32, the sum
`bf16 + fp32` type-promotes to FP32 and is cast back to BF16 once: the same arithmetic as
rlhf.lora.LoRALinear (`(base_out.float() + branch).to(base dtype)`), operation for operation.
We therefore compare with the default autocast_adapter_dtype=True (apples to apples) and expect
bitwise-equal results; the tolerances below are the contract, the measured differences are
recorded in results.json. With autocast_adapter_dtype=False PEFT keeps BF16 adapters and adds
in BF16, which is a different computation (recorded, not a parity claim).
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from peft import LoraConfig, get_peft_model
from property_budget import examples
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlhf.embedded import SHAPE as EMBEDDED_SHAPE
from rlhf.lora import TARGETS, LoRALinear, inject_lora

pytestmark = pytest.mark.unit

# FP32: the two implementations run the same ops, so any difference is reordering-level.
FP32_RTOL = 1e-6
FP32_ATOL = 1e-6
# BF16 outputs / input gradients: one BF16 ulp relative (2**-7, 8 significant bits), i.e. one
# rounding of the final cast may land on the other side; absolute floor for values near 0.
BF16_RTOL = 2.0**-7
BF16_ATOL = 1e-5
# Gradients wrt A and B are FP32 tensors in both implementations (even for a BF16 base).
GRAD_AB_RTOL = FP32_RTOL
GRAD_AB_ATOL = FP32_ATOL
# Whole tiny Qwen2 in FP32 (attention, RMSNorm, tied head on both sides): a few FP32 ulps.
MODEL_FP32_RTOL = 1e-5
MODEL_FP32_ATOL = 1e-6


class OneLinear(nn.Module):
    def __init__(self, lin: nn.Linear):
        super().__init__()
        self.lin = lin

    def forward(self, x):
        return self.lin(x)


def peft_wrap(module: nn.Module, target_modules, **kw):
    cfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=list(target_modules))
    return get_peft_model(module, cfg, **kw)


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


def linear_case(dtype, in_f, out_f, bias, shape, seed, scale):
    """Ours and PEFT's LoRA on identical copies of one Linear, same A, same nonzero B."""
    g = torch.Generator().manual_seed(seed)
    base = nn.Linear(in_f, out_f, bias=bias)
    with torch.no_grad():
        base.weight.copy_(torch.randn(out_f, in_f, generator=g) / in_f**0.5)
        if bias:
            base.bias.copy_(torch.randn(out_f, generator=g))
    base = base.to(dtype)
    ours = LoRALinear(copy.deepcopy(base), rank=8, alpha=16, generator=g)
    theirs = peft_wrap(OneLinear(copy.deepcopy(base)), ["lin"])
    layer = theirs.base_model.model.lin
    pa, pb = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    assert pa.dtype == pb.dtype == torch.float32  # autocast_adapter_dtype=True upcasts
    assert layer.scaling["default"] == ours.scaling == 2.0
    with torch.no_grad():
        ours.lora_B.copy_(torch.randn(out_f, 8, generator=g) * 0.5)
        pa.copy_(ours.lora_A)
        pb.copy_(ours.lora_B)
    x = (torch.randn(*shape, in_f, generator=g) * scale).to(dtype)
    upstream = torch.randn(*shape, out_f, generator=g).to(dtype)
    res = {}
    for tag, fn, a, b in (("ours", ours, ours.lora_A, ours.lora_B), ("peft", theirs, pa, pb)):
        xi = x.clone().requires_grad_(True)
        y = fn(xi)
        (y * upstream).sum().backward()
        res[tag] = dict(y=y.detach(), gx=xi.grad, gA=a.grad, gB=b.grad)
    return res


def check_linear(dtype, record_result):
    worst = {"forward": 0.0, "grad_input": 0.0, "grad_A": 0.0, "grad_B": 0.0}
    out_tol = (FP32_RTOL, FP32_ATOL) if dtype == torch.float32 else (BF16_RTOL, BF16_ATOL)

    @examples(25)
    @given(
        in_f=st.integers(1, 48),
        out_f=st.integers(1, 48),
        bias=st.booleans(),
        shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
        seed=st.integers(0, 2**31 - 1),
        scale=st.sampled_from([1e-2, 1.0, 30.0]),
    )
    def prop(in_f, out_f, bias, shape, seed, scale):
        r = linear_case(dtype, in_f, out_f, bias, shape, seed, scale)
        o, p = r["ours"], r["peft"]
        assert o["y"].dtype == p["y"].dtype == dtype
        assert o["gx"].dtype == p["gx"].dtype == dtype
        assert o["gA"].dtype == p["gA"].dtype == torch.float32
        torch.testing.assert_close(o["y"], p["y"], rtol=out_tol[0], atol=out_tol[1])
        torch.testing.assert_close(o["gx"], p["gx"], rtol=out_tol[0], atol=out_tol[1])
        torch.testing.assert_close(o["gA"], p["gA"], rtol=GRAD_AB_RTOL, atol=GRAD_AB_ATOL)
        torch.testing.assert_close(o["gB"], p["gB"], rtol=GRAD_AB_RTOL, atol=GRAD_AB_ATOL)
        for key, k in (("forward", "y"), ("grad_input", "gx"), ("grad_A", "gA"), ("grad_B", "gB")):
            worst[key] = max(worst[key], max_abs(o[k], p[k]))

    prop()
    tag = "fp32" if dtype == torch.float32 else "bf16"
    for key, value in worst.items():
        record_result(f"max_abs_diff_{tag}_{key}", value)
    return worst


def test_linear_parity_with_peft_fp32(record_result):
    worst = check_linear(torch.float32, record_result)
    assert all(v <= FP32_ATOL for v in worst.values()), worst


def test_linear_parity_with_peft_bf16(record_result):
    worst = check_linear(torch.bfloat16, record_result)
    assert worst["grad_A"] <= GRAD_AB_ATOL and worst["grad_B"] <= GRAD_AB_ATOL, worst


def test_peft_adapter_dtype_semantics_for_bf16_base(record_result):
    """autocast_adapter_dtype=True (default): FP32 adapters = ours. False: BF16 adapters, differs."""
    g = torch.Generator().manual_seed(123)
    base = nn.Linear(64, 48).to(torch.bfloat16)
    ours = LoRALinear(copy.deepcopy(base), rank=8, alpha=16, generator=g)
    auto = peft_wrap(OneLinear(copy.deepcopy(base)), ["lin"])
    plain = peft_wrap(OneLinear(copy.deepcopy(base)), ["lin"], autocast_adapter_dtype=False)
    la, lp = auto.base_model.model.lin, plain.base_model.model.lin
    assert la.lora_A["default"].weight.dtype == torch.float32
    assert lp.lora_A["default"].weight.dtype == torch.bfloat16
    assert la.base_layer.weight.dtype == lp.base_layer.weight.dtype == torch.bfloat16
    with torch.no_grad():
        ours.lora_B.copy_(torch.randn(48, 8, generator=g))
        for layer in (la, lp):
            layer.lora_A["default"].weight.copy_(ours.lora_A)
            layer.lora_B["default"].weight.copy_(ours.lora_B)
        x = torch.randn(4, 7, 64, generator=g).bfloat16()
        y_ours, y_auto, y_plain = ours(x), auto(x), plain(x)
    # Bit for bit on every CPU: the same kernels on the same operands (see the module docstring);
    # our fused power-of-two scale is exact (rlhf.lora._scaled_sum), so no CPU's rounding parts them.
    assert torch.equal(y_ours, y_auto)
    diff_plain = max_abs(y_ours, y_plain)
    record_result("max_abs_diff_bf16_forward_vs_peft_bf16_adapters", diff_plain)
    assert diff_plain > 0  # a BF16 branch really is a different computation


TINY = {**EMBEDDED_SHAPE, "tie_word_embeddings": True}  # the embedded base's tiny Qwen2 shape


def test_whole_tiny_qwen2_fp32_parity_with_peft(record_result):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        base = Qwen2ForCausalLM(Qwen2Config(**TINY)).eval()
    twin = copy.deepcopy(base)
    adapters = inject_lora(base, rank=8, alpha=16, seed=49)
    peft_model = peft_wrap(twin, TARGETS).eval()
    g = torch.Generator().manual_seed(1)
    peft_mods = dict(peft_model.base_model.model.named_modules())
    pairs = []
    with torch.no_grad():
        for name, a in adapters.items():
            a.lora_B.copy_(torch.randn(a.lora_B.shape, generator=g) * 0.05)
            p = peft_mods[name]
            p.lora_A["default"].weight.copy_(a.lora_A)
            p.lora_B["default"].weight.copy_(a.lora_B)
            pairs.append((name, a, p))
    # same base weights on both sides
    ours_base = {n.replace(".base.", "."): t for n, t in base.state_dict().items() if "lora_" not in n}
    theirs_base = {
        n.replace(".base_layer.", "."): t
        for n, t in peft_model.base_model.model.state_dict().items()
        if "lora_" not in n
    }
    assert ours_base.keys() == theirs_base.keys()
    assert all(torch.equal(ours_base[k], theirs_base[k]) for k in ours_base)

    ids = torch.tensor([[1, 500, 17, 1023, 9, 64, 300, 2], [7, 7, 8, 200, 999, 12, 5, 6]])
    out_o = base(ids).logits
    out_p = peft_model(input_ids=ids).logits

    def loss(out):
        return nn.functional.cross_entropy(out[:, :-1].reshape(-1, out.shape[-1]), ids[:, 1:].reshape(-1))

    loss(out_o).backward()
    loss(out_p).backward()
    torch.testing.assert_close(out_o, out_p, rtol=MODEL_FP32_RTOL, atol=MODEL_FP32_ATOL)
    worst_a = worst_b = 0.0
    for name, a, p in pairs:
        ga, gb = p.lora_A["default"].weight.grad, p.lora_B["default"].weight.grad
        assert torch.count_nonzero(a.lora_A.grad) > 0, name  # B != 0, so A learns too
        torch.testing.assert_close(a.lora_A.grad, ga, rtol=MODEL_FP32_RTOL, atol=MODEL_FP32_ATOL)
        torch.testing.assert_close(a.lora_B.grad, gb, rtol=MODEL_FP32_RTOL, atol=MODEL_FP32_ATOL)
        worst_a, worst_b = max(worst_a, max_abs(a.lora_A.grad, ga)), max(worst_b, max_abs(a.lora_B.grad, gb))
    trainable_peft = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    trainable_ours = sum(p.numel() for p in base.parameters() if p.requires_grad)
    assert trainable_peft == trainable_ours == 22528
    record_result("max_abs_diff_tiny_qwen2_fp32_logits", max_abs(out_o, out_p))
    record_result("max_abs_diff_tiny_qwen2_fp32_grad_A", worst_a)
    record_result("max_abs_diff_tiny_qwen2_fp32_grad_B", worst_b)
