"""The four RLHF objects of SPEC §4, each over its own backbone.

| role      | starts from                       | learns                         | head              |
|-----------|-----------------------------------|--------------------------------|-------------------|
| actor     | SFT adapter                       | PPO                            | -                 |
| reference | independent copy of SFT adapter   | nothing, fully frozen          | -                 |
| judge     | base + own adapter (seed 50)      | Bradley-Terry, then frozen     | scalar, N(0,0.02) |
| critic    | copy of SFT adapter               | value regression               | scalar, zeros     |

Every role loads its own base from the model directory: no tensor storage is shared between
roles (a backbone shared by critic and judge would silently change the rewards while the
critic learns). `assert_role_isolation` proves it, and `fingerprint` hashes learned and frozen
tensors so that the trainer can show that reference and judge never move.

Roles stay in `eval()` (dropout off) while generating and learning; `eval()` does not turn
off autograd, only explicit `torch.no_grad()` blocks do.
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from rlhf import costs
from rlhf.config import Profile
from rlhf.io import dumps_json, read_verified, sha256_bytes, write_with_sidecar
from rlhf.lora import count_lora_parameters, inject_lora, load_lora_state_dict, lora_parameters, lora_state_dict
from rlhf.models import load_base
from rlhf.scoring import backbone_hidden, last_token_hidden, prefix_hidden
from rlhf.tokens import Batch

ROLE_KINDS = ("actor", "reference", "judge", "critic")
FROZEN_KINDS = ("reference", "judge")
HEAD_KINDS = ("judge", "critic")


class RoleIsolationError(AssertionError):
    """Two roles share storage, or a frozen role can receive gradients."""


class RoleStateError(ValueError):
    """A saved role state does not match the role it is loaded into."""


@dataclass
class Role:
    kind: str
    model: nn.Module  # Qwen2ForCausalLM with LoRA adapters; base frozen
    head: nn.Linear | None  # [hidden] -> scalar, FP32, judge and critic only
    base_identity: dict = field(default_factory=dict)

    def learned_parameters(self) -> list[nn.Parameter]:
        return lora_parameters(self.model) + (list(self.head.parameters()) if self.head is not None else [])

    def learned_state(self) -> dict[str, torch.Tensor]:
        """Detached copies of the adapters (and head) keyed by name."""
        state = lora_state_dict(self.model)
        if self.head is not None:
            state["head.weight"] = self.head.weight.detach().clone()
            state["head.bias"] = self.head.bias.detach().clone()
        return state

    def load_learned_state(self, state: dict[str, torch.Tensor], *, adapters_only: bool = False) -> None:
        load_lora_state_dict(self.model, {k: v for k, v in state.items() if not k.startswith("head.")})
        if self.head is not None and not adapters_only:
            with torch.no_grad():
                self.head.weight.copy_(state["head.weight"])
                self.head.bias.copy_(state["head.bias"])

    def freeze(self) -> None:
        """No parameter of this role requires or holds a gradient from now on."""
        for p in self.all_parameters():
            p.requires_grad_(False)
            p.grad = None

    def all_parameters(self):
        yield from self.model.parameters()
        if self.head is not None:
            yield from self.head.parameters()

    def frozen_named_tensors(self):
        """The base's parameters and buffers (never learned)."""
        learned = {id(p) for p in self.learned_parameters()}
        for name, t in self.model.named_parameters():
            if id(t) not in learned:
                yield name, t
        yield from self.model.named_buffers()


class PpoRoles(NamedTuple):
    """The four roles PPO runs on (rlhf.lab.ppo_roles), in ROLE_KINDS order; with a judge
    ensemble (`ppo.reward_design` 'ensemble-*') its other members too, frozen judges of their own."""

    actor: Role
    reference: Role
    judge: Role
    critic: Role
    members: tuple[Role, ...] = ()  # judges 1 .. k-1 of an ensemble (judge 0 is `judge`)

    def by_kind(self) -> dict[str, Role]:
        """{name: role}: the four kinds, then the ensemble's members as judge-1 .. judge-(k-1)."""
        out = {"actor": self.actor, "reference": self.reference, "judge": self.judge, "critic": self.critic}
        return {**out, **{f"judge-{m}": role for m, role in enumerate(self.members, start=1)}}


class EvaluationRoles(NamedTuple):
    """The roles the evaluation reads (rlhf.evaluate.evaluation_roles): two policies (the SFT
    and the PPO actor), the frozen reference and the frozen judge."""

    sft: Role
    ppo: Role
    reference: Role
    judge: Role

    def by_kind(self) -> dict[str, Role]:
        return {"sft": self.sft, "ppo": self.ppo, "reference": self.reference, "judge": self.judge}


def new_head(hidden: int, kind: str, profile: Profile) -> nn.Linear:
    """Scalar head (hidden + 1 parameters, FP32): judge N(0, std) from seed 50, bias 0; critic zeros."""
    head = nn.Linear(hidden, 1, dtype=torch.float32)
    with torch.no_grad():
        head.bias.zero_()
        if kind == "judge":
            g = torch.Generator().manual_seed(profile.seeds.judge_head)
            head.weight.copy_(torch.randn(head.weight.shape, generator=g) * profile.judge.head_init_std)
        else:
            head.weight.zero_()
    return head


def new_role(
    kind: str, profile: Profile, model_dir, *, base_identity: dict | None = None, tokenizer=None, device: str = "cpu"
) -> Role:
    """Load a fresh backbone from `model_dir` and give it this role's adapters and head
    (`base_identity` and `tokenizer`: see rlhf.models.load_base)."""
    if kind not in ROLE_KINDS:
        raise ValueError(f"unknown role {kind!r}; roles are {ROLE_KINDS}")
    base = load_base(profile, model_dir, device=device, identity=base_identity, tokenizer=tokenizer)
    if base.copied_from is not None:
        inherit_frozen_hashes(base.copied_from, base.model)
    costs.count("role_builds")
    seed = profile.seeds.judge_lora if kind == "judge" else profile.seeds.lora
    adapters = inject_lora(
        base.model, rank=profile.lora.rank, alpha=profile.lora.alpha, seed=seed, targets=profile.lora.targets
    )
    n_params = count_lora_parameters(base.model)
    if (len(adapters), n_params) != (profile.lora.expected_adapters, profile.lora.expected_parameters):
        raise ValueError(
            f"profile {profile.name}: the {kind} has {len(adapters)} adapters with {n_params:,} "
            f"parameters; [lora] expects {profile.lora.expected_adapters} with "
            f"{profile.lora.expected_parameters:,}"
        )
    base.model.to(device)  # type: ignore[arg-type]  # transformers' wrapped .to: its stub wants the model as argument
    head = new_head(base.model.config.hidden_size, kind, profile).to(device) if kind in HEAD_KINDS else None
    role = Role(kind=kind, model=base.model, head=head, base_identity=base.identity)
    role.model.eval()
    if head is not None:
        head.eval()
    if kind == "reference":
        role.freeze()  # the judge is frozen after its Bradley-Terry training (rlhf.judge)
    return role


# ------------------------------------------------------------------------------ role outputs


def reward_scores(role: Role, batch: Batch) -> torch.Tensor:
    """[B] judge score read at the last active response token (EOS included), never at the
    last column of a padded batch."""
    assert role.head is not None, f"the {role.kind} has no scalar head"
    hidden = backbone_hidden(role.model, batch)
    return role.head(last_token_hidden(hidden, batch).float())[:, 0]


def critic_values(role: Role, batch: Batch, hidden: torch.Tensor | None = None) -> torch.Tensor:
    """[B, R] V_j: the critic's value on the prefix that produces response token j (0 where masked)."""
    if hidden is None:
        hidden = backbone_hidden(role.model, batch)
    assert role.head is not None, f"the {role.kind} has no scalar head"
    values = role.head(prefix_hidden(hidden, batch).float())[..., 0]
    # Selected away, never multiplied by 0 (rlhf.masks): nan * 0 is nan.
    return torch.where(batch.response_mask, values, torch.zeros((), dtype=values.dtype, device=values.device))


# ------------------------------------------------------------------------------ fingerprints


def tensor_sha256(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's dtype, shape and raw bytes."""
    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    if t.numel():
        # hashed in place, no copy of its bytes (an ndarray is a buffer; numpy's stubs do not say so)
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
    return h.hexdigest()


# A frozen tensor's hash, remembered with everything that a write through torch changes: its
# version counter (every in-place op bumps it, under no_grad too: an optimizer step, copy_,
# load_state_dict), its storage address, dtype, shape and strides. A role is fingerprinted
# many times (built, loaded, saved, before and after PPO), and at full width each frozen base
# is 0.5-2 GB of float32: hashed once per tensor, not once per fingerprint. Writes that bypass
# the version counter (through `.data` or a numpy view of the storage) are not seen; nothing in
# the lab writes to a frozen tensor that way.
_FROZEN_HASHES: dict[int, tuple[weakref.ref, tuple, str]] = {}


def _forgetter(key: int):
    """The callback that drops a dead tensor's entry (its id may be reused)."""

    def forget(_ref) -> None:
        _FROZEN_HASHES.pop(key, None)

    return forget


def _write_state(t: torch.Tensor) -> tuple:
    """What a write through torch changes about a tensor (see _FROZEN_HASHES)."""
    return (t._version, t.data_ptr(), t.dtype, tuple(t.shape), t.stride(), str(t.device))


def _known_sha256(t: torch.Tensor) -> str | None:
    """The remembered hash of `t`, or None when it was never hashed or has been written to since."""
    entry = _FROZEN_HASHES.get(id(t))
    if entry is not None and entry[0]() is t and entry[1] == _write_state(t):
        return entry[2]
    return None


def _remember_sha256(t: torch.Tensor, digest: str) -> None:
    _FROZEN_HASHES[id(t)] = (weakref.ref(t, _forgetter(id(t))), _write_state(t), digest)


def frozen_tensor_sha256(t: torch.Tensor) -> str:
    """tensor_sha256 of a frozen tensor, computed again only when torch has written to it."""
    digest = _known_sha256(t)
    if digest is None:
        digest = tensor_sha256(t)
        _remember_sha256(t, digest)
    return digest


def inherit_frozen_hashes(source: nn.Module, copy: nn.Module) -> int:
    """Give each frozen tensor of `copy` (a copy of the frozen base `source`) the hash of its
    counterpart in `source`, once the two are proven equal tensor by tensor (dtype, shape and
    every bit: `same_bits`, a comparison on the device, where SHA-256 would carry 1 GB through
    the CPU). Returns the number of tensors compared.

    The base's own hashes are computed on first use (and remembered while it lives), so every
    role copied from one kept base is hashed once per process, whatever the number of roles."""
    theirs, ours = list(_frozen_tensors(source)), list(_frozen_tensors(copy))
    if len(theirs) != len(ours):
        raise RoleIsolationError(f"the copy of the base has {len(ours)} tensors, the base {len(theirs)}")
    pairs = list(zip(theirs, ours))
    for (name, a), (name_b, b) in pairs:
        if name != name_b or not same_bits(a, b):
            raise RoleIsolationError(f"the copy of the base differs from the base at {name_b}")
    if any(_known_sha256(a) is None for (_, a), _ in pairs):
        costs.count("base_hashes")  # the kept base's first (and only) pass over its bytes
    for (_, a), (_, b) in pairs:
        _remember_sha256(b, frozen_tensor_sha256(a))
    return len(pairs)


_SAME_SIZE_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when `a` and `b` have the same dtype, shape and bytes (what tensor_sha256 hashes):
    compared as integers of the element's width, so that -0.0 and 0.0 differ and NaNs of equal
    bits are equal, as they are to SHA-256."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    width = _SAME_SIZE_INTS[a.element_size()]
    return torch.equal(a.view(width), b.view(width))


def _frozen_tensors(model: nn.Module):
    """(name, tensor) of every parameter and buffer of a bare base (no adapters yet), in order."""
    yield from model.named_parameters()
    yield from model.named_buffers()


def manifest_sha256(named: dict[str, str]) -> str:
    return sha256_bytes(dumps_json(named).encode())


def fingerprint(role: Role, *, frozen: bool = True) -> dict:
    """SHA-256 manifests of the role's learned tensors and (optionally) frozen base tensors."""
    learned = {k: tensor_sha256(v) for k, v in sorted(role.learned_state().items())}
    out = {"role": role.kind, "learned": learned, "learned_sha256": manifest_sha256(learned)}
    if frozen:
        frozen_tensors = sorted(role.frozen_named_tensors(), key=lambda kv: kv[0])
        if any(_known_sha256(v) is None for _, v in frozen_tensors):
            costs.count("base_hashes")  # a pass over the base's bytes, not a look-up
        base = {k: frozen_tensor_sha256(v) for k, v in frozen_tensors}
        out.update(frozen=base, frozen_sha256=manifest_sha256(base))
    return out


def assert_role_isolation(roles) -> None:
    """Raise RoleIsolationError if two roles share any tensor storage, if a reference or judge
    parameter requires or holds a gradient, or if a role is in training mode."""
    if hasattr(roles, "by_kind"):  # PpoRoles, EvaluationRoles
        roles = roles.by_kind()
    roles = list(roles.values()) if isinstance(roles, dict) else list(roles)
    owner: dict[int, tuple[int, str, str]] = {}  # storage -> (role position, kind, tensor name)
    for i, role in enumerate(roles):
        tensors = list(role.model.named_parameters(remove_duplicate=False)) + list(role.model.named_buffers())
        if role.head is not None:
            tensors += [(f"head.{n}", p) for n, p in role.head.named_parameters()]
        for name, t in tensors:
            if t.numel() == 0:
                continue
            ptr = t.untyped_storage().data_ptr()
            # Keyed by the role's position, not its kind: two roles of one kind (two actors)
            # sharing storage are refused too. Sharing inside one role (tied embeddings) is fine.
            if ptr in owner and owner[ptr][0] != i:
                _, other, other_name = owner[ptr]
                raise RoleIsolationError(
                    f"roles {other} and {role.kind} share tensor storage "
                    f"({other_name} / {name}): each role needs its own backbone"
                )
            owner[ptr] = (i, role.kind, name)
    for role in roles:
        if any(m.training for m in role.model.modules()) or (role.head is not None and role.head.training):
            raise RoleIsolationError(f"role {role.kind} is in training mode; roles stay in eval()")
        if role.kind in FROZEN_KINDS:
            for name, p in role.model.named_parameters():
                if p.requires_grad or p.grad is not None:
                    raise RoleIsolationError(
                        f"frozen role {role.kind}: {name} {'requires' if p.requires_grad else 'holds'} a gradient"
                    )
            for name, p in role.head.named_parameters() if role.head is not None else []:
                if p.requires_grad or p.grad is not None:
                    raise RoleIsolationError(f"frozen role {role.kind}: head.{name} can receive gradients")


# ------------------------------------------------------------------------------ safetensors


def save_role(role: Role, path, identity: dict | None = None) -> dict:
    """Write the learned state to `path` (.safetensors) and `path`.json; never overwrite."""
    path = Path(path)
    state = {k: v.contiguous() for k, v in role.learned_state().items()}
    base_fp = fingerprint(role)["frozen_sha256"]
    # One metadata key: safetensors writes its metadata map in a per-process hash order, so with
    # several keys two processes saving the same role wrote different bytes.
    meta = {"rlhf": dumps_json({"role": role.kind, "identity": identity or {}, "base_frozen_sha256": base_fp})}
    data = st_save(state, metadata=meta)
    return write_with_sidecar(
        path,
        data,
        {
            "role": role.kind,
            "file": path.name,
            "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in sorted(state.items())},
            "base_frozen_sha256": base_fp,
            "base_identity": role.base_identity,
            "identity": identity or {},
        },
    )


def load_role(role: Role, path, *, source_kind: str | None = None, adapters_only: bool = False) -> dict:
    """Verify and load a state written by `save_role` into `role`; each mismatch has its own error.

    `source_kind`: the kind the file must hold when it differs from the role's (the reference
    and the critic start from the SFT actor's adapters). `adapters_only`: load the LoRA tensors
    and leave the head as initialised (the critic's zero head).
    """
    path = Path(path)
    data, manifest = read_verified(path, RoleStateError, "role state")
    want_kind = source_kind or role.kind
    if manifest["role"] != want_kind:
        raise RoleStateError(f"role kind mismatch: {path} holds a {manifest['role']} state, not {want_kind}")
    try:
        state = st_load(data)  # safetensors: a header and raw tensor bytes, never code
    except Exception as err:  # noqa: BLE001 - whatever the parser refuses is unusable
        raise RoleStateError(
            f"{path} is not a safetensors file (its hash matches its manifest, its content does not parse): {err}"
        ) from err
    own = role.learned_state()
    if adapters_only:
        own = {k: v for k, v in own.items() if not k.startswith("head.")}
    if set(state) != set(own):
        missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        raise RoleStateError(f"tensor names mismatch in {path}: missing {missing[:3]}, unexpected {extra[:3]}")
    for k, v in state.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise RoleStateError(f"shape mismatch for {k}: file {list(v.shape)}, role {list(own[k].shape)}")
        if v.dtype != own[k].dtype:
            raise RoleStateError(f"dtype mismatch for {k}: file {v.dtype}, role {own[k].dtype}")
    base_fp = fingerprint(role)["frozen_sha256"]
    if manifest["base_frozen_sha256"] != base_fp:
        raise RoleStateError(
            f"base mismatch: {path} was trained on a base with frozen fingerprint "
            f"{manifest['base_frozen_sha256'][:12]}, this role's base is {base_fp[:12]}"
        )
    role.load_learned_state(state, adapters_only=adapters_only)
    return manifest
