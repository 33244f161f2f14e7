"""save_role / load_role (SPEC §7): safetensors + manifest, verified on reload, never overwritten.

Each mismatch has its own RoleStateError message and its own test: file hash, tensor names,
shapes, dtypes, role kind, and the base's frozen fingerprint. The name/shape/dtype tampering
writes a modified safetensors file *and* a matching manifest, so that the hash check passes and
the later check is the one that fires. Also: the actor's adapter exported with
`rlhf.lora.export_peft` loads with PEFT onto the same base and gives the same logits
(LOGITS_ATOL = 0: identical arithmetic, see tests_unit/test_peft_export.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from rlhf.embedded import build_embedded
from rlhf.io import sha256_bytes, sha256_file
from rlhf.lora import export_peft, lora_modules
from rlhf.models import load_base
from rlhf.roles import RoleStateError, fingerprint, load_role, new_role, save_role

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]

LOGITS_ATOL = 0.0


def trained(role, seed):
    """Move every learned tensor, as training would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in role.learned_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return role


@pytest.fixture
def make(embedded_profile, embedded_dir):
    return lambda kind, seed=None: (
        trained(new_role(kind, embedded_profile, embedded_dir), seed)
        if seed is not None
        else new_role(kind, embedded_profile, embedded_dir)
    )


@pytest.fixture
def saved(make, tmp_path):
    role = make("critic", seed=3)
    path = tmp_path / "critic.safetensors"
    manifest = save_role(role, path, identity={"stage": "test"})
    return role, path, manifest


def rewrite(path: Path, change):
    """Apply `change` to the saved tensors; write the file and a manifest that matches it."""
    data = path.read_bytes()
    state = dict(st_load(data))
    change(state)
    new = st_save(state, metadata={"role": "critic"})
    path.write_bytes(new)
    mpath = Path(str(path) + ".json")
    manifest = json.loads(mpath.read_text())
    manifest["sha256"] = sha256_bytes(new)
    manifest["bytes"] = len(new)
    manifest["tensors"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in sorted(state.items())}
    mpath.write_text(json.dumps(manifest))


# ------------------------------------------------------------------------------ round trip


def test_round_trip_restores_learned_tensors_exactly(saved, make):
    role, path, manifest = saved
    assert manifest["role"] == "critic" and manifest["identity"] == {"stage": "test"}
    assert manifest["sha256"] == sha256_file(path)
    assert manifest["base_frozen_sha256"] == fingerprint(role)["frozen_sha256"]
    assert len(manifest["tensors"]) == 30 and manifest["tensors"]["head.weight"]["shape"] == [1, 64]
    fresh = make("critic")
    assert fingerprint(fresh)["learned_sha256"] != fingerprint(role)["learned_sha256"]
    assert load_role(fresh, path) == manifest
    want, got = role.learned_state(), fresh.learned_state()
    assert set(want) == set(got)
    for k in want:
        assert got[k].dtype == torch.float32 and torch.equal(got[k], want[k]), k
    assert fingerprint(fresh) == fingerprint(role)


def test_round_trip_of_an_actor_and_a_judge(make, tmp_path):
    for kind in ("actor", "judge"):
        role = make(kind, seed=4)
        save_role(role, tmp_path / f"{kind}.safetensors")
        fresh = make(kind)
        load_role(fresh, tmp_path / f"{kind}.safetensors")
        assert fingerprint(fresh)["learned_sha256"] == fingerprint(role)["learned_sha256"]


def test_critic_and_reference_start_from_the_actor_adapter(make, tmp_path):
    """SPEC §4: critic = copy of the SFT adapter (its head stays zero), reference = a copy too."""
    actor = make("actor", seed=6)
    path = tmp_path / "sft.safetensors"
    save_role(actor, path)
    critic = make("critic")
    with pytest.raises(RoleStateError, match="holds a actor state, not critic"):
        load_role(critic, path)
    with pytest.raises(RoleStateError, match=r"tensor names mismatch.*missing \['head.bias', 'head.weight'\]"):
        load_role(critic, path, source_kind="actor")
    load_role(critic, path, source_kind="actor", adapters_only=True)
    reference = make("reference")
    load_role(reference, path, source_kind="actor")
    want = actor.learned_state()
    for role in (critic, reference):
        got = role.learned_state()
        for k, v in want.items():
            assert torch.equal(got[k], v), (role.kind, k)
    assert not critic.head.weight.any() and not critic.head.bias.any()
    assert not any(p.requires_grad for p in reference.all_parameters())  # still frozen


def test_save_refuses_to_overwrite(saved):
    role, path, _ = saved
    before = (sha256_file(path), sha256_file(str(path) + ".json"))
    trained(role, 9)
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        save_role(role, path)
    assert (sha256_file(path), sha256_file(str(path) + ".json")) == before
    # a weights file without its manifest is not overwritten either
    path.with_name("orphan.safetensors").write_bytes(b"x")
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        save_role(role, path.with_name("orphan.safetensors"))
    assert path.with_name("orphan.safetensors").read_bytes() == b"x"


# ------------------------------------------------------------------------------ each mismatch


def test_missing_file_is_refused(make, tmp_path):
    with pytest.raises(RoleStateError, match="missing role state"):
        load_role(make("critic"), tmp_path / "nothing.safetensors")


def test_bit_flip_is_refused_by_the_file_hash(saved, make):
    _, path, _ = saved
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01  # one bit of one tensor value
    path.write_bytes(bytes(data))
    fresh = make("critic")
    before = fingerprint(fresh)["learned_sha256"]
    with pytest.raises(RoleStateError, match="hash mismatch"):
        load_role(fresh, path)
    assert fingerprint(fresh)["learned_sha256"] == before  # nothing was loaded


def test_tensor_names_mismatch(saved, make):
    _, path, _ = saved

    def rename(state):
        state["head.w"] = state.pop("head.weight")

    rewrite(path, rename)
    with pytest.raises(
        RoleStateError,
        match=r"tensor names mismatch.*missing \['head.weight'\].*"
        r"unexpected \['head.w'\]",
    ):
        load_role(make("critic"), path)


def test_shape_mismatch(saved, make):
    _, path, _ = saved
    name = "model.layers.0.self_attn.q_proj.lora_A"

    def reshape(state):
        state[name] = torch.zeros(4, 64)  # rank 4 instead of 8

    rewrite(path, reshape)
    with pytest.raises(RoleStateError, match=rf"shape mismatch for {name}: file \[4, 64\], role \[8, 64\]"):
        load_role(make("critic"), path)


def test_dtype_mismatch(saved, make):
    _, path, _ = saved

    def recast(state):
        state["head.bias"] = state["head.bias"].to(torch.bfloat16)

    rewrite(path, recast)
    with pytest.raises(RoleStateError, match="dtype mismatch for head.bias: file torch.bfloat16, role torch.float32"):
        load_role(make("critic"), path)


def test_role_kind_mismatch(saved, make):
    _, path, _ = saved
    with pytest.raises(RoleStateError, match="role kind mismatch: .* holds a critic state, not actor"):
        load_role(make("actor"), path)
    # the same tensor names (a judge also has a head): the kind alone refuses it
    with pytest.raises(RoleStateError, match="holds a critic state, not judge"):
        load_role(make("judge"), path)


def test_base_fingerprint_mismatch(saved, embedded_profile, tmp_path):
    _, path, manifest = saved
    other_dir = tmp_path / "other-base"
    build_embedded(other_dir, seed=50, audit=False)
    other = new_role("critic", embedded_profile, other_dir)
    assert fingerprint(other)["frozen_sha256"] != manifest["base_frozen_sha256"]
    before = fingerprint(other, frozen=False)["learned_sha256"]
    with pytest.raises(
        RoleStateError, match="base mismatch: .* frozen fingerprint " + manifest["base_frozen_sha256"][:12]
    ):
        load_role(other, path)
    assert fingerprint(other, frozen=False)["learned_sha256"] == before


def test_in_memory_change_of_the_base_is_refused_too(saved, make):
    _, path, _ = saved
    fresh = make("critic")
    with torch.no_grad():
        fresh.model.model.norm.weight[0] += 1.0
    with pytest.raises(RoleStateError, match="base mismatch"):
        load_role(fresh, path)


# ------------------------------------------------------------------------------ PEFT


def test_actor_adapter_loads_in_peft_with_the_same_logits(
    make, embedded_profile, embedded_dir, tmp_path, record_result
):
    actor = make("actor", seed=5)
    assert all(m.lora_B.abs().max() > 0 for m in lora_modules(actor.model).values())
    out = tmp_path / "peft"
    export_peft(actor.model, out, str(embedded_dir))
    twin = load_base(embedded_profile, embedded_dir).model
    loaded = PeftModel.from_pretrained(twin, str(out)).eval()
    ids = torch.tensor([[1, 87, 759, 201, 947, 557, 223, 49, 42, 18, 2]])
    with torch.no_grad():
        ours = actor.model(input_ids=ids).logits
        theirs = loaded(input_ids=ids).logits
        with loaded.disable_adapter():
            plain = loaded(input_ids=ids).logits
    diff = float((ours - theirs).abs().max())
    record_result("max_abs_diff_actor_peft_logits", diff)
    assert diff <= LOGITS_ATOL
    assert float((plain - ours).abs().max()) > 1e-3  # the adapter is live and it matters


def test_truncated_role_state_is_refused(saved):
    """The shared verified read also checks the recorded size (same path as resume states)."""
    role, path, _ = saved
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(RoleStateError, match="is truncated"):
        load_role(role, path)
