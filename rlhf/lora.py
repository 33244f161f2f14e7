"""LoRA written out by hand (SPEC §4): no PEFT at training time, only in the parity tests.

One adapted projection computes

    y = W x + b + (alpha / r) · B (A x)

    x : [..., in]            input, in the base dtype (BF16 for the real model)
    W : [out, in], b : [out] the frozen base `nn.Linear` (requires_grad False)
    A : [r, in]   FP32       kaiming-uniform(a=√5), i.e. U(-1/√in, +1/√in), from a seeded generator
    B : [out, r]  FP32       zeros, so an injected model starts exactly at the base model
    y : [..., out]           in the base dtype

The branch runs in FP32 (x is cast to float32), the sum `base_out.float() + branch` is formed
in FP32 and cast back to the base dtype once. Dropout is 0. With r = 8 and alpha = 16 the
scaling is 2.0 (a power of two, so the multiplication itself is exact).

`inject_lora` puts one adapter on q/k/v/o/gate/up/down of every decoder layer of a Qwen2-style
causal LM (168 projections and 4,399,104 parameters for Qwen2.5-0.5B), in a fixed order
(layer by layer, targets in `TARGETS` order) drawing every A from ONE seeded generator.
`export_peft` writes PEFT's on-disk adapter format so the result can be checked with PEFT.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from rlhf.io import ArtifactExists, write_bytes, write_json

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# The submodule of a Qwen2 decoder layer that holds each projection: attention, then the MLP.
_PARENT = {t: "self_attn" for t in TARGETS[:4]} | {t: "mlp" for t in TARGETS[4:]}
# The projections that read their parent's input: q/k/v the attention's, gate/up the MLP's. Their
# branches share one FP32 cast of it (SharedCast).
SHARED_INPUT = {"self_attn": ("q_proj", "k_proj", "v_proj"), "mlp": ("gate_proj", "up_proj")}


# PEFT's key naming on disk: "base_model.model.<qualified module>.lora_A.weight"
PEFT_PREFIX = "base_model.model."
PEFT_WEIGHTS_NAME = "adapter_model.safetensors"
PEFT_CONFIG_NAME = "adapter_config.json"


class LoRALinear(nn.Module):
    """A frozen `nn.Linear` plus a low-rank FP32 branch.

        y = W x + b + (alpha / r) · B (A x)

    Shapes: x [..., in] → y [..., out]; A = `lora_A` [r, in] (FP32, kaiming-uniform a=√5 drawn
    from `generator`), B = `lora_B` [out, r] (FP32, zeros). The branch is computed in FP32 on
    `x.float()`; `base_out.float() + branch` is cast back to the base weight's dtype.
    The base weight and bias get `requires_grad = False`.
    """

    def __init__(self, base: nn.Linear, *, rank: int, alpha: float, generator: torch.Generator):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise ValueError(f"LoRALinear wraps an nn.Linear, got {type(base).__name__}")
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise ValueError(f"LoRA rank must be a positive int, got {rank!r}")
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not alpha > 0:
            raise ValueError(f"LoRA alpha must be a positive number, got {alpha!r}")
        if not isinstance(generator, torch.Generator):
            raise ValueError("LoRALinear needs a seeded torch.Generator to draw A")
        if generator.device.type != "cpu":
            raise ValueError(f"A is drawn from a CPU generator, got one on {generator.device}")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.rank = rank
        self.alpha = alpha
        self.scaling = alpha / rank
        # A power of two >= 1 (2.0 for r 8, alpha 16): multiplying by it never rounds (short of
        # overflow), so the scale may be fused into the add (_scaled_sum).
        self.exact_scaling = self.scaling >= 1 and math.frexp(self.scaling)[0] == 0.5
        self.in_features = base.in_features
        self.out_features = base.out_features
        a = torch.empty(rank, base.in_features, dtype=torch.float32)
        # kaiming-uniform with a=√5 on [r, in]: bound = gain·√3/√fan_in = 1/√in (PEFT's default)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
        device = base.weight.device
        self.lora_A = nn.Parameter(a.to(device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=torch.float32, device=device))
        self.shared_cast: SharedCast | None = None  # set by inject_lora for q/k/v and gate/up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Generation runs this 14 times per drawn token on tiny shapes, where every dispatched op
        # costs more than its arithmetic: the base is called through F.linear (what nn.Linear's
        # forward does, without the module call), casts that would be no-ops are skipped, and
        # with a power-of-two scaling the scale goes into the add (see _scaled_sum). The numbers
        # are bit-identical to  (W x + b).float() + B(A x.float()) · scaling, cast back.
        base = self.base
        dtype = base.weight.dtype
        base_out = F.linear(x, base.weight, base.bias)  # [..., out]
        x32 = _fp32(x) if self.shared_cast is None else self.shared_cast.fp32(x)
        branch = F.linear(F.linear(x32, self.lora_A), self.lora_B)  # [..., out] FP32, unscaled
        y = _scaled_sum(_fp32(base_out), branch, self.scaling, self.exact_scaling)
        return y if y.dtype == dtype else y.to(dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"rank={self.rank}, alpha={self.alpha}, scaling={self.scaling}"
        )


def _fp32(t: torch.Tensor) -> torch.Tensor:
    """`t.float()` without dispatching an op when `t` is FP32 already (the embedded profile)."""
    return t if t.dtype == torch.float32 else t.float()


class SharedCast:
    """One FP32 cast of a module's input, shared by the adapters that read it (q/k/v read the
    attention's input, gate/up the MLP's): in BF16 each `x.float()` is a kernel launch and a copy
    of the activations, three times per attention and twice per MLP otherwise. The values are
    the same bits (a cast is exact and deterministic); only the number of casts changes.

    The cast is remembered for one forward of the parent module: hooks clear it as the parent's
    forward starts and ends, so a tensor of another call is never matched, and nothing outlives
    the call. An FP32 input is no cast at all (_fp32)."""

    def __init__(self, parent: nn.Module):
        self.x: torch.Tensor | None = None
        self.x32: torch.Tensor | None = None
        parent.register_forward_pre_hook(lambda _module, _args: self.clear())
        parent.register_forward_hook(lambda _module, _args, _out: self.clear())

    def fp32(self, x: torch.Tensor) -> torch.Tensor:
        if x is not self.x:
            self.x, self.x32 = x, _fp32(x)
        assert self.x32 is not None
        return self.x32

    def clear(self) -> None:
        self.x = self.x32 = None


def _scaled_sum(base_out: torch.Tensor, branch: torch.Tensor, scaling: float, exact: bool) -> torch.Tensor:
    """base_out + branch · scaling, both FP32, bit-identical to the two-op form.

    `torch.add(a, b, alpha=s)` is one op instead of two; its kernel may fuse a + s·b into one
    rounding, which equals round(a + round(s·b)) exactly when s·b needs no rounding: s a power
    of two >= 1 and s·b finite (|b| < 2^128 / s). Any other scaling takes the two-op form.
    """
    if exact:
        return torch.add(base_out, branch, alpha=scaling)
    return base_out + branch * scaling


# ---------------------------------------------------------------------------------------------
# injection


def _expected_shapes(config) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each target, from the model config."""
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    inter = int(config.intermediate_size)
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def _check_targets(targets) -> tuple[str, ...]:
    if isinstance(targets, str):
        raise ValueError(f"targets must be a sequence of names, got the string {targets!r}")
    targets = tuple(targets)
    if not targets:
        raise ValueError("targets is empty: name at least one of " + ", ".join(TARGETS))
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ValueError(f"unknown LoRA target name(s) {unknown}; known targets: {list(TARGETS)}")
    if len(set(targets)) != len(targets):
        raise ValueError(f"duplicate LoRA target names in {list(targets)}")
    return tuple(t for t in TARGETS if t in targets)  # canonical order, whatever the caller's


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """Every LoRALinear of `model`, keyed by qualified module name, in module order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def inject_lora(model: nn.Module, *, rank: int, alpha: float, seed: int, targets=TARGETS) -> dict[str, LoRALinear]:
    """Freeze every base parameter and wrap the targets of every decoder layer in LoRALinear.

    Order is fixed: layer 0..L-1, and inside a layer the targets in `TARGETS` order; every A is
    drawn from one `torch.Generator().manual_seed(seed)`. Everything is checked before anything
    is changed, so a refused model is left untouched. Returns the adapters keyed by qualified
    module name (e.g. "model.layers.0.self_attn.q_proj").
    """
    targets = _check_targets(targets)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    already = list(lora_modules(model))
    if already:
        raise ValueError(f"model already has LoRA adapters (e.g. {already[0]}); refusing to inject twice")
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if config is None or layers is None:
        raise ValueError(
            "inject_lora expects a causal LM with .config and .model.layers "
            f"(Qwen2ForCausalLM), got {type(model).__name__}"
        )
    n_layers = getattr(config, "num_hidden_layers", None)
    if n_layers is not None and len(layers) != n_layers:
        raise ValueError(f"model has {len(layers)} decoder layers but config.num_hidden_layers is {n_layers}")
    shapes = _expected_shapes(config)

    plan: list[tuple[str, nn.Module, str, nn.Linear]] = []
    for i, layer in enumerate(layers):
        for t in targets:
            qual = f"model.layers.{i}.{_PARENT[t]}.{t}"
            parent = getattr(layer, _PARENT[t], None)
            module = None if parent is None else getattr(parent, t, None)
            if parent is None or module is None:
                raise ValueError(f"decoder layer {i} has no target {qual}")
            if not isinstance(module, nn.Linear):
                raise ValueError(f"{qual} is a {type(module).__name__}, not an nn.Linear; LoRA only wraps nn.Linear")
            want_in, want_out = shapes[t]
            got = (module.in_features, module.out_features)
            wshape = tuple(module.weight.shape)
            if got != (want_in, want_out) or wshape != (want_out, want_in):
                raise ValueError(
                    f"{qual} maps {got[0]}->{got[1]} (weight {list(wshape)}) but the config says {want_in}->{want_out}"
                )
            plan.append((qual, parent, t, module))

    for p in model.parameters():
        p.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    adapters: dict[str, LoRALinear] = {}
    for qual, parent, t, module in plan:
        adapter = LoRALinear(module, rank=rank, alpha=alpha, generator=generator)
        setattr(parent, t, adapter)
        adapters[qual] = adapter
    _share_casts(layers)
    return adapters


def _share_casts(layers) -> None:
    """One SharedCast per attention and per MLP, for its adapters that read its input."""
    for layer in layers:
        for parent_name, names in SHARED_INPUT.items():
            parent = getattr(layer, parent_name)
            readers = [getattr(parent, n) for n in names if isinstance(getattr(parent, n, None), LoRALinear)]
            if len(readers) > 1:
                shared = SharedCast(parent)
                for adapter in readers:
                    adapter.shared_cast = shared


# ---------------------------------------------------------------------------------------------
# parameters and state


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """[A, B] of every adapter, in module order (what the optimizer of a role trains)."""
    params: list[nn.Parameter] = []
    for m in lora_modules(model).values():
        params += [m.lora_A, m.lora_B]
    return params


def count_lora_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in lora_parameters(model))


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """{"model.layers.0.self_attn.q_proj.lora_A": tensor, ...}: detached copies (no shared storage)."""
    sd: dict[str, torch.Tensor] = {}
    for name, m in lora_modules(model).items():
        sd[f"{name}.lora_A"] = m.lora_A.detach().clone()
        sd[f"{name}.lora_B"] = m.lora_B.detach().clone()
    return sd


def load_lora_state_dict(model: nn.Module, sd: dict[str, torch.Tensor]) -> None:
    """Copy `sd` into the adapters; strict: the same names, shapes and dtypes, or ValueError."""
    own: dict[str, nn.Parameter] = {}
    for name, m in lora_modules(model).items():
        own[f"{name}.lora_A"] = m.lora_A
        own[f"{name}.lora_B"] = m.lora_B
    if not own:
        raise ValueError("model has no LoRA adapters to load into")
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    if missing or unexpected:
        raise ValueError(
            f"LoRA state dict names do not match: missing {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''} ({len(missing)}), unexpected "
            f"{unexpected[:5]}{' ...' if len(unexpected) > 5 else ''} "
            f"({len(unexpected)})"
        )
    for name, p in own.items():
        t = sd[name]
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
        if tuple(t.shape) != tuple(p.shape):
            raise ValueError(f"{name}: shape {list(t.shape)} does not match {list(p.shape)}")
        if t.dtype != p.dtype:
            raise ValueError(f"{name}: dtype {t.dtype} does not match {p.dtype}")
    with torch.no_grad():
        for name, p in own.items():
            p.copy_(sd[name])


# ---------------------------------------------------------------------------------------------
# PEFT's on-disk format


def peft_adapter_config(model: nn.Module, base_model_name_or_path: str | None) -> dict:
    """The `adapter_config.json` PEFT 0.21 reads for these adapters."""
    mods = lora_modules(model)
    if not mods:
        raise ValueError("model has no LoRA adapters to export")
    ranks = {m.rank for m in mods.values()}
    alphas = {m.alpha for m in mods.values()}
    if len(ranks) != 1 or len(alphas) != 1:
        raise ValueError(
            f"adapters differ in rank {sorted(ranks)} or alpha {sorted(alphas)}; "
            "the PEFT export supports one rank and one alpha"
        )
    targets = [t for t in TARGETS if any(name.endswith("." + t) for name in mods)]
    return {
        "alpha_pattern": {},
        "auto_mapping": None,
        "base_model_name_or_path": base_model_name_or_path,
        "bias": "none",
        "exclude_modules": None,
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "layer_replication": None,
        "layers_pattern": None,
        "layers_to_transform": None,
        "lora_alpha": alphas.pop(),
        "lora_bias": False,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": ranks.pop(),
        "rank_pattern": {},
        "revision": None,
        "target_modules": targets,
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }


def peft_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Adapters under PEFT's key names: base_model.model.<module>.lora_{A,B}.weight (FP32, CPU)."""
    out: dict[str, torch.Tensor] = {}
    for name, m in lora_modules(model).items():
        out[f"{PEFT_PREFIX}{name}.lora_A.weight"] = m.lora_A.detach().to("cpu").contiguous().clone()
        out[f"{PEFT_PREFIX}{name}.lora_B.weight"] = m.lora_B.detach().to("cpu").contiguous().clone()
    return out


def export_peft(model: nn.Module, out_dir: str | os.PathLike, base_model_name_or_path: str | None) -> dict[str, Path]:
    """Write `adapter_model.safetensors` and `adapter_config.json` (PEFT's format) into `out_dir`.

    Both files are written atomically through rlhf.io; if either exists nothing is written.
    The weights go first and the config last, so a folder with a config is complete.
    """
    from safetensors.torch import save as safetensors_save

    out_dir = Path(out_dir)
    config = peft_adapter_config(model, base_model_name_or_path)
    tensors = peft_state_dict(model)
    weights_path = out_dir / PEFT_WEIGHTS_NAME
    config_path = out_dir / PEFT_CONFIG_NAME
    for path in (weights_path, config_path):
        if path.exists():
            raise ArtifactExists(f"refusing to overwrite existing PEFT export file {path}")
    data = safetensors_save(tensors, metadata={"format": "pt"})
    write_bytes(weights_path, data)
    write_json(config_path, config)
    return {"weights": weights_path, "config": config_path}


__all__ = [
    "TARGETS",
    "LoRALinear",
    "inject_lora",
    "lora_modules",
    "lora_parameters",
    "count_lora_parameters",
    "lora_state_dict",
    "load_lora_state_dict",
    "peft_adapter_config",
    "peft_state_dict",
    "export_peft",
]
