"""LoRA injection (SPEC §4): 168 projections, 4,399,104 parameters, frozen BF16 base, FP32 A/B.

The full-shape model is Qwen2.5-0.5B's architecture built from its config (no download), in
BF16 on CPU, once per module. Random init of ~494M parameters costs >10 s on 2 shared cores,
so the model is allocated with transformers' `no_init_weights`: real CPU BF16 storage, init
kernels skipped, embeddings re-tied. Counting, freezing, dtypes, the seeded draw of A and the
refusals only need shapes; the one full-shape numeric check fills a single projection. Whole-
model numerics (logits at B = 0, which parameters get gradients) run on a tiny Qwen2 in BF16
and FP32; parity with PEFT is in tests_property/test_lora_peft_parity.py.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.initialization import no_init_weights

from rlhf.config import load_profile
from rlhf.embedded import SHAPE as EMBEDDED_SHAPE
from rlhf.lora import (
    TARGETS,
    LoRALinear,
    count_lora_parameters,
    inject_lora,
    load_lora_state_dict,
    lora_modules,
    lora_parameters,
    lora_state_dict,
)
from rlhf.models import qwen2_config

pytestmark = pytest.mark.unit

FULL_CONFIG = qwen2_config(load_profile("qwen2.5-0.5b"))  # Qwen2.5-0.5B's shape (SPEC §4)
TINY_CONFIG = {**EMBEDDED_SHAPE, "tie_word_embeddings": True}  # the embedded base's tiny Qwen2 shape
SPEC_ADAPTERS = 168  # SPEC §4
SPEC_LORA_PARAMS = 4_399_104  # SPEC §4
SPEC_LORA = {"rank": 8, "alpha": 16, "seed": 49}  # SPEC §4 (the profiles hold these; inject_lora has no defaults)
RANK = 8


def build_uninitialised(config: Qwen2Config, dtype: torch.dtype) -> Qwen2ForCausalLM:
    """Qwen2ForCausalLM with real CPU storage in `dtype`, init kernels skipped, embeddings tied."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with no_init_weights():
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(old)
    model.tie_weights()  # no_init_weights also skips tying
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model.eval()


def build_tiny(dtype=torch.float32, seed: int = 0) -> Qwen2ForCausalLM:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(Qwen2Config(**TINY_CONFIG)).to(dtype)
    return model.eval()


def expected_names(n_layers: int, targets=TARGETS) -> list[str]:
    parent = {
        "q_proj": "self_attn",
        "k_proj": "self_attn",
        "v_proj": "self_attn",
        "o_proj": "self_attn",
        "gate_proj": "mlp",
        "up_proj": "mlp",
        "down_proj": "mlp",
    }
    return [f"model.layers.{i}.{parent[t]}.{t}" for i in range(n_layers) for t in targets]


def kaiming_bound(in_features: int) -> float:
    # kaiming_uniform_(a=√5): gain = √(2/(1+5)), bound = gain·√3/√fan_in = 1/√fan_in
    return math.sqrt(2.0 / (1 + 5)) * math.sqrt(3.0) / math.sqrt(in_features)


@pytest.fixture(scope="module")
def full():
    model = build_uninitialised(FULL_CONFIG, torch.bfloat16)
    base_params = {n: p for n, p in model.named_parameters()}
    adapters = inject_lora(model, rank=8, alpha=16, seed=49)  # the profiles' SPEC values
    return dict(model=model, adapters=adapters, base_params=base_params)


# --------------------------------------------------------------------------- full shape


def test_full_shape_adapter_and_parameter_counts(full):
    model, adapters = full["model"], full["adapters"]
    assert len(adapters) == SPEC_ADAPTERS == 24 * 7
    assert list(adapters) == expected_names(24)
    assert list(lora_modules(model)) == list(adapters)
    assert count_lora_parameters(model) == SPEC_LORA_PARAMS
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert sum(p.numel() for p in trainable) == SPEC_LORA_PARAMS
    assert {id(p) for p in trainable} == {id(p) for p in lora_parameters(model)}
    assert len(lora_parameters(model)) == 2 * SPEC_ADAPTERS
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    io = {
        "q_proj": (896, 14 * head_dim),
        "k_proj": (896, 2 * head_dim),
        "v_proj": (896, 2 * head_dim),
        "o_proj": (14 * head_dim, 896),
        "gate_proj": (896, 4864),
        "up_proj": (896, 4864),
        "down_proj": (4864, 896),
    }
    for name, a in adapters.items():
        fan_in, fan_out = io[name.rsplit(".", 1)[1]]
        assert isinstance(a, LoRALinear) and isinstance(a.base, nn.Linear)
        assert tuple(a.lora_A.shape) == (RANK, fan_in)
        assert tuple(a.lora_B.shape) == (fan_out, RANK)
        assert (a.rank, a.alpha, a.scaling) == (8, 16, 2.0)


def test_full_shape_base_frozen_bf16_and_adapters_fp32(full):
    model, adapters = full["model"], full["adapters"]
    # every parameter the model had before injection is still there, frozen, BF16
    after = {id(p) for p in model.parameters()}
    for name, p in full["base_params"].items():
        assert id(p) in after, name
        assert p.requires_grad is False, name
        assert p.dtype == torch.bfloat16, name
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tying survives
    for name, a in adapters.items():
        assert isinstance(a.lora_A, nn.Parameter) and isinstance(a.lora_B, nn.Parameter)
        assert a.lora_A.dtype == torch.float32 and a.lora_B.dtype == torch.float32, name
        assert a.lora_A.requires_grad and a.lora_B.requires_grad, name
        assert a.base.weight.dtype == torch.bfloat16 and not a.base.weight.requires_grad
        assert torch.count_nonzero(a.lora_B) == 0, name


def test_full_shape_A_is_kaiming_uniform_from_one_seeded_generator(full):
    adapters = full["adapters"]
    # the exact draw: one Generator(49), adapters in order, kaiming_uniform_(a=√5) on [r, in]
    g = torch.Generator().manual_seed(49)
    for name, a in adapters.items():
        want = torch.empty(RANK, a.in_features)
        nn.init.kaiming_uniform_(want, a=math.sqrt(5), generator=g)
        assert torch.equal(a.lora_A, want), name
    # and its range / spread, pooled per fan-in: U(-1/√in, 1/√in) has variance bound²/3
    for fan_in in (896, 4864):
        vals = torch.cat([a.lora_A.detach().flatten() for a in adapters.values() if a.in_features == fan_in])
        bound = kaiming_bound(fan_in)
        assert bound == pytest.approx(1 / math.sqrt(fan_in))
        assert vals.abs().max() <= bound
        assert vals.abs().max() > 0.999 * bound
        assert float(vals.mean()) == pytest.approx(0.0, abs=0.02 * bound)
        assert float(vals.var()) == pytest.approx(bound**2 / 3, rel=0.02)


def test_full_shape_projection_forward_is_base_at_B_zero_and_live_after(full):
    a = full["adapters"]["model.layers.23.mlp.down_proj"]  # 4864 -> 896, a real model module
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        saved = a.base.weight.clone()
        a.base.weight.copy_((torch.randn(a.base.weight.shape, generator=g) * 0.02).bfloat16())
        try:
            x = torch.randn(2, 3, 4864, generator=g).bfloat16()
            y = a(x)
            assert y.dtype == torch.bfloat16 and tuple(y.shape) == (2, 3, 896)
            assert torch.isfinite(y).all()
            assert torch.equal(y, a.base(x))  # branch exactly 0; fp32 sum casts back to same bits
            a.lora_B.normal_(generator=g)
            want = (a.base(x).float() + 2.0 * ((x.float() @ a.lora_A.T) @ a.lora_B.T)).bfloat16()
            # Bit for bit on every CPU: F.linear without a bias and `@` with the transposed weight
            # run the same matmul on the same operands, and the scale 2 is exact.
            assert torch.equal(a(x), want)
        finally:
            a.lora_B.zero_()
            a.base.weight.copy_(saved)


def test_full_shape_double_injection_refused(full):
    model = full["model"]
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        inject_lora(model, rank=8, alpha=16, seed=49)
    assert count_lora_parameters(model) == SPEC_LORA_PARAMS
    assert len(lora_modules(model)) == SPEC_ADAPTERS


def test_full_shape_same_seed_same_A_other_seed_other_A(full):
    ref = full["adapters"]  # seed 49
    same = inject_lora(build_uninitialised(FULL_CONFIG, torch.bfloat16), rank=8, alpha=16, seed=49)
    other = inject_lora(build_uninitialised(FULL_CONFIG, torch.bfloat16), rank=8, alpha=16, seed=50)
    assert list(same) == list(ref) == list(other)
    for name in ref:
        assert torch.equal(same[name].lora_A, ref[name].lora_A), name
        assert not torch.equal(other[name].lora_A, ref[name].lora_A), name
        assert torch.equal(same[name].lora_B, other[name].lora_B)  # both zero


# --------------------------------------------------------------------------- tiny model


def test_tiny_count_is_r_times_sum_of_in_plus_out():
    model = build_tiny()
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    h, q, kv, inter = (
        cfg.hidden_size,
        cfg.num_attention_heads * head_dim,
        cfg.num_key_value_heads * head_dim,
        cfg.intermediate_size,
    )
    per_layer = [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]
    from_config = cfg.num_hidden_layers * sum(RANK * (i + o) for i, o in per_layer)
    from_modules = sum(
        RANK * (m.in_features + m.out_features)
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in TARGETS
    )
    assert from_config == from_modules == 2 * 8 * (128 + 96 + 96 + 128 + 320 + 320 + 320)
    adapters = inject_lora(model, rank=RANK, alpha=16, seed=49)
    assert len(adapters) == 14
    assert count_lora_parameters(model) == from_config
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == from_config


def test_tiny_fp32_injection_is_exact_identity_at_init_and_formula_holds():
    model = build_tiny()
    ids = torch.arange(1, 9).unsqueeze(0)
    with torch.no_grad():
        before = model(ids).logits
    adapters = inject_lora(model, **SPEC_LORA)
    with torch.no_grad():
        # Bit for bit on every CPU: at B = 0 every branch adds an exact zero to the same base output.
        assert torch.equal(model(ids).logits, before)
        a = adapters["model.layers.1.mlp.down_proj"]
        a.lora_B.normal_(generator=torch.Generator().manual_seed(3))
        x = torch.randn(2, 5, a.in_features, generator=torch.Generator().manual_seed(4))
        # y = W x + (alpha/r) B(A x), checked against a float64 evaluation of the formula
        want = x.double() @ a.base.weight.double().T + 2.0 * (x.double() @ a.lora_A.double().T) @ a.lora_B.double().T
        got = a(x)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
        assert not torch.equal(model(ids).logits, before)  # the branch is live


def test_bf16_lora_linear_sums_in_fp32_and_casts_back_once():
    g = torch.Generator().manual_seed(11)
    base = nn.Linear(24, 10, dtype=torch.bfloat16)
    layer = LoRALinear(base, rank=8, alpha=16, generator=g)
    assert not base.weight.requires_grad and not base.bias.requires_grad
    with torch.no_grad():
        layer.lora_B.normal_(generator=g)
        x = torch.randn(3, 24, generator=g).to(torch.bfloat16)
        y = layer(x)
        branch = (x.float() @ layer.lora_A.T) @ layer.lora_B.T * 2.0
        want = (base(x).float() + branch).to(torch.bfloat16)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, want)  # the same ops on the same operands (`@` is F.linear's matmul): any CPU


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank,alpha", [(8, 16), (4, 16), (8, 12), (16, 8)])
def test_forward_and_gradients_equal_the_two_op_formula_bit_for_bit(dtype, rank, alpha):
    """The forward fuses a power-of-two scaling into the add (rlhf.lora._scaled_sum) and calls
    the base through F.linear; outputs and gradients must equal the plain formula exactly, on
    every CPU: both sides run the same kernels on the same operands, and the fused add differs
    from the two-op form only by a rounding that a power-of-two scale makes exact."""
    g = torch.Generator().manual_seed(12)
    layer = LoRALinear(nn.Linear(40, 24, dtype=dtype), rank=rank, alpha=alpha, generator=g)
    assert layer.exact_scaling == (alpha / rank in (2.0, 4.0))
    with torch.no_grad():
        layer.lora_B.normal_(generator=g)
    x = torch.randn(3, 5, 40, generator=g).to(dtype)
    got = layer(x)
    got.float().square().sum().backward()
    grads = [layer.lora_A.grad.clone(), layer.lora_B.grad.clone()]
    layer.zero_grad()
    branch = F.linear(F.linear(x.to(torch.float32), layer.lora_A), layer.lora_B) * layer.scaling
    want = (layer.base(x).float() + branch).to(dtype)
    want.float().square().sum().backward()
    assert got.dtype == dtype and torch.equal(got, want)
    assert torch.equal(grads[0], layer.lora_A.grad) and torch.equal(grads[1], layer.lora_B.grad)


def test_tiny_bf16_model_logits_unchanged_at_init_and_only_B_gets_gradient():
    model = build_tiny(torch.bfloat16)
    base_params = dict(model.named_parameters())
    ids = torch.tensor([[5, 900, 17, 1023, 3, 64]])
    with torch.no_grad():
        before = model(ids).logits
    adapters = inject_lora(model, **SPEC_LORA)
    out = model(ids).logits
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, before)  # an exact zero added in FP32, cast back: the same bits on any CPU
    nn.functional.cross_entropy(out[0, :-1].float(), ids[0, 1:]).backward()
    for name, a in adapters.items():
        assert torch.count_nonzero(a.lora_A.grad) == 0, name  # dL/dA = B^T(...) = 0 at B = 0
        assert torch.count_nonzero(a.lora_B.grad) > 0, name
        assert a.lora_A.grad.dtype == torch.float32 == a.lora_B.grad.dtype
    for name, p in base_params.items():
        assert not p.requires_grad and p.grad is None, name


class _CastCount(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts dtype casts (aten._to_copy) to FP32: a kernel launch each on a GPU."""

    def __init__(self):
        super().__init__()
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.float32:
            self.casts += 1
        return func(*args, **kwargs)


def _trained_like(model):
    """Adapters with B away from zero, so every branch carries gradient to its input."""
    adapters = inject_lora(model, **SPEC_LORA)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for a in adapters.values():
            a.lora_B.copy_(torch.randn(a.lora_B.shape, generator=g) * 0.05)
    return adapters


def test_qkv_and_gate_up_cast_their_shared_input_once_with_the_same_bits():
    """In BF16 the q/k/v branches read one FP32 cast of the attention's input and gate/up one of
    the MLP's: 3 casts fewer per layer. Forward bits equal the per-adapter casts'; gradients
    equal them to BF16's rounding (the three branches' input gradients are summed in FP32 once
    instead of being rounded to BF16 one by one). In FP32 the adapters add no cast at all."""
    ids = torch.tensor([[5, 900, 17, 1023, 3, 64, 7, 8]])
    shared, unshared = build_tiny(torch.bfloat16), build_tiny(torch.bfloat16)
    _trained_like(shared)
    for a in _trained_like(unshared).values():
        a.shared_cast = None  # each adapter casts its own input, as without SharedCast
    counts, logits, grads = {}, {}, {}
    for name, model in (("shared", shared), ("unshared", unshared)):
        with _CastCount() as mode:
            out = model(ids).logits
        counts[name], logits[name] = mode.casts, out
        nn.functional.cross_entropy(out[0, :-1].float(), ids[0, 1:]).backward()
        grads[name] = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    layers = TINY_CONFIG["num_hidden_layers"]
    assert counts["unshared"] - counts["shared"] == 3 * layers  # (3 - 1) q/k/v + (2 - 1) gate/up
    assert torch.equal(logits["shared"], logits["unshared"])
    for n, g in grads["shared"].items():  # within 4 BF16 units of rounding, relative to the gradient's size
        want = grads["unshared"][n]
        assert float((g - want).norm() / want.norm()) <= 4 * 2**-8, n
    fp32, fp32_casts = build_tiny(torch.float32), []
    for _ in range(2):  # the bare base (its rotary positions are cast once), then with adapters: none added
        with _CastCount() as mode:
            fp32(ids)
        fp32_casts.append(mode.casts)
        if len(fp32_casts) == 1:
            _trained_like(fp32)
    assert fp32_casts[0] == fp32_casts[1]
    # Nothing outlives the forward: the hooks cleared every remembered cast.
    assert all(a.shared_cast.x is None for a in lora_modules(shared).values() if a.shared_cast is not None)


def test_targets_subset_uses_canonical_order():
    model = build_tiny()
    adapters = inject_lora(model, **SPEC_LORA, targets=("v_proj", "q_proj"))
    assert list(adapters) == expected_names(2, ("q_proj", "v_proj"))
    assert isinstance(model.model.layers[0].self_attn.k_proj, nn.Linear)
    assert not isinstance(model.model.layers[0].self_attn.k_proj, LoRALinear)


def _replace(model, layer, parent, name, new):
    setattr(getattr(model.model.layers[layer], parent), name, new)


@pytest.mark.parametrize(
    "case, match",
    [
        ("unknown_target", r"unknown LoRA target name\(s\) \['lm_head'\]"),
        ("duplicate_target", r"duplicate LoRA target names"),
        ("wrong_shape", r"model\.layers\.1\.self_attn\.k_proj maps 64->64 .* config says 64->32"),
        ("wrong_mlp_shape", r"model\.layers\.0\.mlp\.down_proj maps 128->64 .* config says 256->64"),
        ("not_linear", r"model\.layers\.1\.mlp\.up_proj is a Identity, not an nn\.Linear"),
        ("missing_target", r"decoder layer 0 has no target model\.layers\.0\.mlp\.gate_proj"),
        ("not_a_causal_lm", r"expects a causal LM with \.config and \.model\.layers"),
    ],
)
def test_refusals_are_clear_and_leave_the_model_untouched(case, match):
    model = build_tiny()
    targets = TARGETS
    if case == "unknown_target":
        targets = ("q_proj", "lm_head")
    elif case == "duplicate_target":
        targets = ("q_proj", "q_proj")
    elif case == "wrong_shape":
        _replace(model, 1, "self_attn", "k_proj", nn.Linear(64, 64))
    elif case == "wrong_mlp_shape":
        _replace(model, 0, "mlp", "down_proj", nn.Linear(128, 64, bias=False))
    elif case == "not_linear":
        _replace(model, 1, "mlp", "up_proj", nn.Identity())
    elif case == "missing_target":
        delattr(model.model.layers[0].mlp, "gate_proj")
    elif case == "not_a_causal_lm":
        model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(ValueError, match=match):
        inject_lora(model, **SPEC_LORA, targets=targets)
    assert lora_modules(model) == {}
    assert all(p.requires_grad for p in model.parameters())  # nothing was frozen either


def test_tiny_double_injection_refused():
    model = build_tiny()
    inject_lora(model, **SPEC_LORA)
    with pytest.raises(ValueError, match="refusing to inject twice"):
        inject_lora(model, rank=8, alpha=16, seed=50)
    assert count_lora_parameters(model) == 22528


def test_lora_linear_refuses_bad_arguments():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="wraps an nn.Linear"):
        LoRALinear(nn.Identity(), rank=8, alpha=16, generator=g)
    with pytest.raises(ValueError, match="rank must be a positive int"):
        LoRALinear(nn.Linear(4, 4), rank=0, alpha=16, generator=g)
    with pytest.raises(ValueError, match="alpha must be a positive number"):
        LoRALinear(nn.Linear(4, 4), rank=8, alpha=0, generator=g)
    with pytest.raises(ValueError, match="seeded torch.Generator"):
        LoRALinear(nn.Linear(4, 4), rank=8, alpha=16, generator=None)


# --------------------------------------------------------------------------- state dict


def test_state_dict_round_trip_is_exact_and_shares_no_storage():
    src = build_tiny(seed=1)
    inject_lora(src, rank=8, alpha=16, seed=1)
    with torch.no_grad():
        for p in lora_parameters(src):
            p.normal_(generator=torch.Generator().manual_seed(p.numel()))
    sd = lora_state_dict(src)
    assert len(sd) == 28
    assert list(sd)[:2] == ["model.layers.0.self_attn.q_proj.lora_A", "model.layers.0.self_attn.q_proj.lora_B"]
    assert all(t.dtype == torch.float32 for t in sd.values())
    dst = copy.deepcopy(src)
    dst_fresh = build_tiny(seed=1)
    inject_lora(dst_fresh, rank=8, alpha=16, seed=2)
    load_lora_state_dict(dst_fresh, sd)
    ids = torch.arange(3, 11).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(dst_fresh(ids).logits, src(ids).logits)
        assert torch.equal(dst(ids).logits, src(ids).logits)
    own = {f"{n}.lora_{k}": getattr(m, f"lora_{k}") for n, m in lora_modules(dst_fresh).items() for k in "AB"}
    for name, t in sd.items():
        assert torch.equal(own[name], t)
        assert own[name].data_ptr() != t.data_ptr()
    assert all(p.requires_grad for p in lora_parameters(dst_fresh))


@pytest.mark.parametrize(
    "mutate, match",
    [
        ("drop", r"missing \['model\.layers\.1\.mlp\.up_proj\.lora_B'\]"),
        ("extra", r"unexpected \['model\.layers\.9\.mlp\.up_proj\.lora_A'\]"),
        ("shape", r"model\.layers\.0\.self_attn\.k_proj\.lora_A: shape \[4, 64\] does not match \[8, 64\]"),
        ("dtype", r"model\.layers\.0\.mlp\.down_proj\.lora_B: dtype torch\.bfloat16 does not match torch\.float32"),
    ],
)
def test_load_state_dict_is_strict(mutate, match):
    model = build_tiny()
    inject_lora(model, **SPEC_LORA)
    sd = lora_state_dict(model)
    if mutate == "drop":
        del sd["model.layers.1.mlp.up_proj.lora_B"]
    elif mutate == "extra":
        sd["model.layers.9.mlp.up_proj.lora_A"] = torch.zeros(8, 64)
    elif mutate == "shape":
        sd["model.layers.0.self_attn.k_proj.lora_A"] = torch.zeros(4, 64)
    elif mutate == "dtype":
        sd["model.layers.0.mlp.down_proj.lora_B"] = sd["model.layers.0.mlp.down_proj.lora_B"].bfloat16()
    before = lora_state_dict(model)
    with pytest.raises(ValueError, match=match):
        load_lora_state_dict(model, {k: (v + 1 if v.dtype == torch.float32 else v) for k, v in sd.items()})
    after = lora_state_dict(model)
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing half-loaded
