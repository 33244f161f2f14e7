"""The four RLHF roles of SPEC §4: own backbone each, heads, seeds, freezing, fingerprints,
and the isolation check (regression for SPEC §9.2: critic and judge over one backbone).

Every role here is built on the embedded base (hidden 64, so a head has 65 parameters); the
full-shape head (hidden 896 -> 897 parameters) is built directly with `new_head` and the
qwen2.5-0.5b profile, which needs no weights.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlhf.config import load_profile
from rlhf.lora import inject_lora, lora_modules, lora_parameters
from rlhf.models import load_base
from rlhf.roles import (
    FROZEN_KINDS,
    HEAD_KINDS,
    ROLE_KINDS,
    Role,
    RoleIsolationError,
    assert_role_isolation,
    fingerprint,
    frozen_tensor_sha256,
    new_head,
    new_role,
    tensor_sha256,
)

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]

QWEN_HIDDEN = 896  # SPEC §4
QWEN_HEAD_PARAMS = 897  # SPEC §4: hidden + 1
HEAD_STD = 0.02  # SPEC §4: reward head weight N(0, 0.02)
JUDGE_HEAD_SEED = 50  # SPEC §10
LORA_SEED, JUDGE_LORA_SEED = 49, 50  # SPEC §10


@pytest.fixture
def roles(embedded_profile, embedded_dir):
    return {k: new_role(k, embedded_profile, embedded_dir) for k in ROLE_KINDS}


def storages(role: Role) -> set[int]:
    ts = list(role.model.parameters()) + list(role.model.buffers())
    if role.head is not None:
        ts += list(role.head.parameters())
    return {t.untyped_storage().data_ptr() for t in ts if t.numel()}


# ------------------------------------------------------------------------------------ heads


def test_full_shape_heads_have_897_parameters_and_the_spec_init():
    profile = load_profile("qwen2.5-0.5b")
    reward = new_head(QWEN_HIDDEN, "judge", profile)
    critic = new_head(QWEN_HIDDEN, "critic", profile)
    for head in (reward, critic):
        assert sum(p.numel() for p in head.parameters()) == QWEN_HEAD_PARAMS
        assert tuple(head.weight.shape) == (1, QWEN_HIDDEN) and tuple(head.bias.shape) == (1,)
        assert head.weight.dtype == head.bias.dtype == torch.float32
    # independent recomputation: one CPU generator seeded 50, N(0, 1) * 0.02
    g = torch.Generator().manual_seed(JUDGE_HEAD_SEED)
    want = torch.randn((1, QWEN_HIDDEN), generator=g, dtype=torch.float32) * HEAD_STD
    assert torch.equal(reward.weight.detach(), want)
    assert torch.equal(reward.bias.detach(), torch.zeros(1))
    assert 0.015 < float(reward.weight.detach().std()) < 0.025  # it is a N(0, 0.02) draw, not zeros
    assert torch.equal(critic.weight.detach(), torch.zeros(1, QWEN_HIDDEN))
    assert torch.equal(critic.bias.detach(), torch.zeros(1))
    # the draw does not depend on torch's global RNG state
    torch.manual_seed(12345)
    assert torch.equal(new_head(QWEN_HIDDEN, "judge", profile).weight.detach(), want)


def test_embedded_role_heads(roles, embedded_profile):
    hidden = embedded_profile.model.hidden_size
    assert roles["actor"].head is None and roles["reference"].head is None
    for kind in HEAD_KINDS:
        head = roles[kind].head
        assert sum(p.numel() for p in head.parameters()) == hidden + 1 == 65
        assert head.weight.dtype == torch.float32
    g = torch.Generator().manual_seed(JUDGE_HEAD_SEED)
    want = torch.randn((1, hidden), generator=g) * HEAD_STD
    assert torch.equal(roles["judge"].head.weight.detach(), want)
    assert not roles["judge"].head.bias.any()
    assert not roles["critic"].head.weight.any() and not roles["critic"].head.bias.any()


# ------------------------------------------------------------------------ adapters, freezing


def test_adapters_seeded_49_except_the_judge_50(roles, embedded_profile, embedded_dir):
    lora = embedded_profile.lora
    expected = {}
    for seed in (LORA_SEED, JUDGE_LORA_SEED):
        fresh = load_base(embedded_profile, embedded_dir).model
        expected[seed] = {
            n: m.lora_A.detach()
            for n, m in inject_lora(fresh, rank=8, alpha=16, seed=seed, targets=lora.targets).items()
        }
    assert len(expected[LORA_SEED]) == embedded_profile.lora.expected_adapters == 14
    for kind, role in roles.items():
        mods = lora_modules(role.model)
        want = expected[JUDGE_LORA_SEED if kind == "judge" else LORA_SEED]
        assert list(mods) == list(want), kind
        for name, m in mods.items():
            assert torch.equal(m.lora_A.detach(), want[name]), (kind, name)
            assert not m.lora_B.any(), (kind, name)  # B starts at zero
            assert (m.rank, m.alpha, m.scaling) == (8, 16, 2.0)
    a_actor = lora_modules(roles["actor"].model)["model.layers.0.self_attn.q_proj"].lora_A
    a_judge = lora_modules(roles["judge"].model)["model.layers.0.self_attn.q_proj"].lora_A
    assert not torch.equal(a_actor, a_judge)


def test_base_frozen_learned_fp32_all_eval(roles):
    for kind, role in roles.items():
        learned = {id(p) for p in role.learned_parameters()}
        n_learned = sum(p.numel() for p in role.learned_parameters())
        assert n_learned == 22528 + (65 if kind in HEAD_KINDS else 0), kind
        for name, p in role.model.named_parameters():
            if id(p) not in learned:
                assert not p.requires_grad, (kind, name)
        for p in role.learned_parameters():
            assert p.dtype == torch.float32
            assert p.requires_grad == (kind != "reference"), kind
        assert not any(m.training for m in role.model.modules()), kind
        if role.head is not None:
            assert not role.head.training
    # reference fully frozen at creation; judge frozen only by freeze() (after Bradley-Terry)
    assert not any(p.requires_grad for p in roles["reference"].all_parameters())
    assert any(p.requires_grad for p in roles["judge"].all_parameters())
    roles["judge"].freeze()
    assert not any(p.requires_grad or p.grad is not None for p in roles["judge"].all_parameters())


def test_freeze_drops_existing_gradients(embedded_profile, embedded_dir):
    judge = new_role("judge", embedded_profile, embedded_dir)
    ids = torch.tensor([[3, 4, 5, 6]])
    out = judge.head(judge.model.model(input_ids=ids).last_hidden_state[:, -1]).sum()
    out.backward()
    assert judge.head.weight.grad is not None
    assert any(p.grad is not None for p in lora_parameters(judge.model))
    judge.freeze()
    assert all(p.grad is None and not p.requires_grad for p in judge.all_parameters())


def test_every_role_owns_its_backbone(roles):
    kinds = list(roles)
    for i, a in enumerate(kinds):
        for b in kinds[i + 1 :]:
            assert storages(roles[a]).isdisjoint(storages(roles[b])), (a, b)
            assert roles[a].model is not roles[b].model
    roles["judge"].freeze()
    assert_role_isolation(roles)  # passes on the four freshly built roles
    # the reference as an independent *copy* of the actor's (SFT) adapter: values equal, storage not
    roles["reference"].load_learned_state(roles["actor"].learned_state())
    assert_role_isolation(roles)


# ------------------------------------------------------------------------------ fingerprints


def test_tensor_sha256_covers_dtype_shape_and_bytes():
    t = torch.arange(6, dtype=torch.float32)
    assert tensor_sha256(t) == tensor_sha256(t.clone())
    assert tensor_sha256(t) != tensor_sha256(t.reshape(2, 3))
    assert tensor_sha256(t) != tensor_sha256(t.view(torch.int32))
    u = t.clone()
    u[3] = torch.nextafter(u[3], torch.tensor(10.0))  # one ulp
    assert tensor_sha256(t) != tensor_sha256(u)


def test_a_frozen_tensor_is_hashed_again_after_every_write_through_torch(monkeypatch):
    """frozen_tensor_sha256 remembers a hash until torch writes to the tensor: in-place ops
    (under no_grad too), copy_, a replaced storage, a changed dtype; a mere read hashes nothing."""
    from rlhf import roles

    calls = []
    real = roles.tensor_sha256
    monkeypatch.setattr(roles, "tensor_sha256", lambda t: calls.append(1) or real(t))
    p = nn.Parameter(torch.arange(6, dtype=torch.float32), requires_grad=False)
    first = frozen_tensor_sha256(p)
    assert first == real(p) and frozen_tensor_sha256(p) == first and len(calls) == 1  # remembered
    _ = p * 2, p.sum()  # reads
    assert frozen_tensor_sha256(p) == first and len(calls) == 1
    writes = [
        lambda: p.add_(1.0),
        lambda: p.copy_(torch.zeros(6)),
        lambda: p.__setitem__(0, 7.0),
        lambda: setattr(p, "data", torch.ones(6)),  # a new storage
        lambda: setattr(p, "data", p.data.double()),  # another dtype
    ]
    seen = {first}
    for i, write in enumerate(writes, start=2):
        with torch.no_grad():
            write()
        digest = frozen_tensor_sha256(p)
        assert digest == real(p) and len(calls) == i, f"write {i - 1} was not seen"
        seen.add(digest)
    assert len(seen) == len(writes) + 1
    q = p.detach().clone()  # another tensor with the same bytes: hashed for itself
    assert frozen_tensor_sha256(q) == real(p) and len(calls) == len(writes) + 2


def test_learned_change_moves_only_the_learned_fingerprint(embedded_profile, embedded_dir):
    critic = new_role("critic", embedded_profile, embedded_dir)
    before = fingerprint(critic)
    assert set(before["learned"]) == set(critic.learned_state())
    assert len(before["learned"]) == 2 * 14 + 2
    with torch.no_grad():
        lora_modules(critic.model)["model.layers.1.mlp.down_proj"].lora_B[0, 0] += 1e-3
    after = fingerprint(critic)
    assert after["learned_sha256"] != before["learned_sha256"]
    assert after["frozen_sha256"] == before["frozen_sha256"]
    changed = [k for k in before["learned"] if before["learned"][k] != after["learned"][k]]
    assert changed == ["model.layers.1.mlp.down_proj.lora_B"]
    with torch.no_grad():
        critic.head.bias += 1.0
    assert fingerprint(critic)["learned"]["head.bias"] != after["learned"]["head.bias"]


def test_frozen_change_moves_only_the_frozen_fingerprint(embedded_profile, embedded_dir):
    ref = new_role("reference", embedded_profile, embedded_dir)
    before = fingerprint(ref)
    assert "model.norm.weight" in before["frozen"]
    assert not any("lora_" in k for k in before["frozen"])
    want = {n for n, p in ref.model.named_parameters() if "lora_" not in n} | {n for n, _ in ref.model.named_buffers()}
    assert set(before["frozen"]) == want and any("rotary" in n for n in want)  # buffers too
    with torch.no_grad():
        lora_modules(ref.model)["model.layers.0.self_attn.q_proj"].base.weight[0, 0] += 1e-3
    after = fingerprint(ref)
    assert after["frozen_sha256"] != before["frozen_sha256"]
    assert after["learned_sha256"] == before["learned_sha256"]
    changed = [k for k in before["frozen"] if before["frozen"][k] != after["frozen"][k]]
    assert changed == ["model.layers.0.self_attn.q_proj.base.weight"]


def test_fingerprints_reproducible_across_loads(embedded_profile, embedded_dir):
    a = fingerprint(new_role("critic", embedded_profile, embedded_dir))
    b = fingerprint(new_role("critic", embedded_profile, embedded_dir))
    assert a == b
    c = fingerprint(new_role("judge", embedded_profile, embedded_dir))
    assert c["frozen_sha256"] == a["frozen_sha256"]  # same base
    assert c["learned_sha256"] != a["learned_sha256"]  # seed-50 adapters, N(0, 0.02) head


# ------------------------------------------------------------------------------ isolation


def test_regression_9_2_critic_and_judge_over_one_backbone_raise(roles, embedded_profile):
    """SPEC §9.2: a judge built over the critic's backbone object is refused."""
    critic = roles["critic"]
    judge = Role(
        kind="judge", model=critic.model, head=new_head(embedded_profile.model.hidden_size, "judge", embedded_profile)
    )
    judge.head.eval()
    judge.freeze()  # freezes the shared backbone's adapters too: exactly the silent hazard
    critic_learning = {k: v for k, v in roles.items() if k != "judge"}
    with pytest.raises(RoleIsolationError, match="share tensor storage"):
        assert_role_isolation({**critic_learning, "judge": judge})


def test_regression_9_2_one_shared_layer_tensor_raises(roles):
    """Sharing a single tensor (not the whole model) is enough to be refused."""
    roles["judge"].freeze()
    assert_role_isolation(roles)
    critic_q = lora_modules(roles["critic"].model)["model.layers.1.self_attn.v_proj"].base
    judge_q = lora_modules(roles["judge"].model)["model.layers.1.self_attn.v_proj"].base
    judge_q.weight = nn.Parameter(critic_q.weight.detach(), requires_grad=False)  # same storage
    with pytest.raises(RoleIsolationError, match=r"roles (critic and judge|judge and critic) share tensor storage"):
        assert_role_isolation(roles)


def test_shared_view_of_a_storage_raises(roles):
    roles["judge"].freeze()
    emb = roles["actor"].model.model.embed_tokens.weight
    norm = roles["reference"].model.model.layers[0].input_layernorm
    norm.weight = nn.Parameter(emb.detach()[5, :].clone().view(-1), requires_grad=False)
    assert_role_isolation(roles)  # a copy is fine
    norm.weight = nn.Parameter(emb.detach()[5, :], requires_grad=False)  # a view is not
    with pytest.raises(RoleIsolationError, match="share tensor storage"):
        assert_role_isolation(roles)


def test_shared_head_raises(roles):
    roles["judge"].freeze()
    roles["judge"].head = roles["critic"].head
    with pytest.raises(RoleIsolationError, match="head.weight"):
        assert_role_isolation(roles)


def test_two_roles_of_the_same_kind_sharing_storage_raise(embedded_profile, embedded_dir):
    actor = new_role("actor", embedded_profile, embedded_dir)
    twin = Role(kind="actor", model=actor.model, head=None)
    with pytest.raises(RoleIsolationError, match="share tensor storage"):
        assert_role_isolation([actor, twin])


@pytest.mark.parametrize("kind", FROZEN_KINDS)
def test_frozen_role_requiring_or_holding_a_gradient_raises(roles, kind):
    roles["judge"].freeze()
    assert_role_isolation(roles)
    a = lora_modules(roles[kind].model)["model.layers.0.mlp.up_proj"].lora_A
    a.requires_grad_(True)
    with pytest.raises(RoleIsolationError, match=f"frozen role {kind}: .*lora_A requires a gradient"):
        assert_role_isolation(roles)
    a.requires_grad_(False)
    a.grad = torch.zeros_like(a)
    with pytest.raises(RoleIsolationError, match=f"frozen role {kind}: .*lora_A holds a gradient"):
        assert_role_isolation(roles)
    a.grad = None
    assert_role_isolation(roles)
    if kind == "judge":
        roles[kind].head.bias.requires_grad_(True)
        with pytest.raises(RoleIsolationError, match="head.bias can receive gradients"):
            assert_role_isolation(roles)


def test_judge_not_yet_frozen_is_refused(roles):
    with pytest.raises(RoleIsolationError, match="frozen role judge"):
        assert_role_isolation(roles)


def test_learning_roles_may_require_grad_but_not_train_mode(roles):
    roles["judge"].freeze()
    assert all(p.requires_grad for p in roles["actor"].learned_parameters())
    assert_role_isolation(roles)
    roles["critic"].model.train()
    with pytest.raises(RoleIsolationError, match="role critic is in training mode"):
        assert_role_isolation(roles)
    roles["critic"].model.eval()
    roles["critic"].head.train()
    with pytest.raises(RoleIsolationError, match="training mode"):
        assert_role_isolation(roles)
