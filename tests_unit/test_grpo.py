"""The GRPO arm's trainer (rlhf.grpo) on the embedded model and r001's rollout prompts: what an
iteration records, recomputed by hand from its own rollout; what learns and what stays frozen;
its resume; its refusals. The loss and advantage formulas are tests_unit/test_dpo_grpo_math.py's."""

import statistics

import pytest
import torch

from rlhf.checkpoint import Leg
from rlhf.config import override

pytestmark = pytest.mark.unit

# Hot sampling, so that a group's 4 answers differ (the embedded model's are otherwise often alike).
SMALL = {("ppo", "iterations"): 2, ("ppo", "prompts_per_iteration"): 8, ("ppo", "max_new_tokens"): 8,
         ("ppo", "temperature"): 4.0}  # fmt: skip


@pytest.fixture(scope="module")
def r001_view():
    from rlhf.corpus import Corpus

    return Corpus.build("r001").learning_view()


@pytest.fixture(scope="module")
def profile(embedded_profile):
    return override(embedded_profile, SMALL)


def fresh_roles(profile, embedded_dir, move_adapters):
    """Actor and reference with the same moved adapters (the SFT actor and its frozen copy), and
    a judge with its own adapters and head."""
    from rlhf.grpo import GrpoRoles
    from rlhf.roles import new_role

    actor, reference, judge = (new_role(k, profile, embedded_dir) for k in ("actor", "actor", "judge"))
    for role, seed in ((actor, 5), (reference, 5), (judge, 6)):
        g = move_adapters(role.model, seed)
        if role.head is not None:
            with torch.no_grad():
                role.head.weight.copy_(torch.randn(role.head.weight.shape, generator=g) * 0.05)
    for role in (reference, judge):
        role.freeze()
    return GrpoRoles(actor, reference, judge)


def test_an_iteration_records_what_its_formulas_give_by_hand(profile, embedded_dir, embedded_base, move_adapters,
                                                             r001_view):  # fmt: skip
    """Two iterations of G = 4 answers to 2 prompts each: each answer's reward is the judge's
    score plus the truncation penalty when cut (no KL in the reward); each group's advantages
    are its rewards standardised by hand; before the first update the policy is the reference,
    so the k3 KL is 0 exactly and the clipped part averages the advantages (0 per group). The
    actor learns; the reference and the judge do not."""
    from rlhf import grpo
    from rlhf.roles import fingerprint

    roles = fresh_roles(profile, embedded_dir, move_adapters)
    before = [fingerprint(r)["learned_sha256"] for r in roles[:3]]
    state, seconds = grpo.train_grpo(roles, r001_view, embedded_base.tokens, profile, grpo.Settings(group_size=4))
    its = state["history"]["iterations"]
    assert [it["iteration"] for it in its] == [0, 1] and len(seconds["per_iteration"]) == 2
    penalty = profile.ppo.truncation_penalty
    for it in its:
        assert len(it["prompt_ids"]) == 2 and len(it["rewards"]) == 8
        cut = it["truncations"]
        assert sum(r - s for r, s in zip(it["rewards"], it["scores"])) == pytest.approx(penalty * cut, abs=1e-5)
        assert all(r - s in (0.0, pytest.approx(penalty)) for r, s in zip(it["rewards"], it["scores"]))
        groups = [it["rewards"][i : i + 4] for i in (0, 4)]
        equal = sum(len(set(g)) == 1 for g in groups)
        assert it["zero_advantage_groups"] == equal
        assert it["mean_reward"] == pytest.approx(statistics.fmean(it["rewards"]), rel=1e-6)
    first = its[0]
    assert first["zero_advantage_groups"] < 2  # a group with something to learn
    assert first["k3_kl"][0] == 0.0 and abs(first["loss"][0]) < 1e-5
    assert first["loss"][1] != first["loss"][0]  # the second update starts from a moved actor
    after = [fingerprint(r)["learned_sha256"] for r in roles[:3]]
    assert after[0] != before[0] and after[1:] == before[1:]


def test_the_group_advantage_is_the_rewards_standardised_within_each_prompt():
    """roll_out's advantages on rewards given by hand: each group of 4 against its own mean and
    sample SD (+ 1e-4); a group of equal rewards gets 0."""
    from rlhf import grpo_math

    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0, 0.5, 0.5, 0.5, 0.5])
    got = grpo_math.group_advantages(rewards, 4).tolist()
    g = [1.0, 2.0, 3.0, 6.0]
    m, sd = statistics.fmean(g), statistics.stdev(g)
    assert got[:4] == pytest.approx([(x - m) / (sd + 1e-4) for x in g], rel=1e-6)
    assert got[4:] == [0.0] * 4


def test_answer_rewards_pay_the_score_and_the_truncation_penalty_once():
    from rlhf.grpo import answer_rewards

    paid = torch.tensor([1.5, -0.5, 2.0])
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False]])
    truncated = torch.tensor([False, True, False])
    assert answer_rewards(paid, mask, truncated, -1.0).tolist() == [1.5, -1.5, 2.0]


def test_a_stopped_grpo_continues_bit_for_bit(profile, embedded_dir, embedded_base, move_adapters, r001_view):
    from rlhf import grpo
    from rlhf.roles import fingerprint
    from rlhf.runtime import seed_system_rngs

    settings, tokens = grpo.Settings(group_size=4), embedded_base.tokens

    def run(leg):
        roles = fresh_roles(profile, embedded_dir, move_adapters)
        seed_system_rngs(profile.seeds.torch)
        state, _ = grpo.train_grpo(roles, r001_view, tokens, profile, settings, leg)
        return roles, state

    whole_roles, whole = run(Leg())
    _, half = run(Leg(stop=1))
    assert half["iterations_done"] == 1
    resumed_roles, resumed = run(Leg(state=half))
    assert resumed["history"] == whole["history"]
    assert fingerprint(resumed_roles.actor)["learned_sha256"] == fingerprint(whole_roles.actor)["learned_sha256"]


@pytest.mark.parametrize(
    "settings, message",
    [((1, 0.04), "at least 2"), ((3, 0.04), "must divide ppo.prompts_per_iteration"), ((4, -0.1), ">= 0")],
)
def test_settings_it_cannot_run_are_refused_before_anything_trains(settings, message):
    from rlhf.grpo import Settings

    with pytest.raises(ValueError, match=message):
        Settings(*settings).check(8)


def test_a_group_is_one_prompts_answers_and_its_advantages_sum_to_zero(profile, embedded_dir, embedded_base,
                                                                      move_adapters, r001_view):  # fmt: skip
    """roll_out on two different prompts: answers 0-3 continue the first prompt, 4-7 the second,
    and each group's advantages are its own rewards standardised (they sum to 0)."""
    from rlhf import grpo, grpo_math
    from rlhf.ppo import rollout_data

    roles = fresh_roles(profile, embedded_dir, move_adapters)
    data = rollout_data(r001_view, embedded_base.tokens, profile)
    prompts = [data.encoded[0], data.encoded[1]]
    assert prompts[0] != prompts[1]
    group = grpo.roll_out(roles, prompts, None, embedded_base.tokens, profile, grpo.Settings(4),
                          torch.Generator().manual_seed(0), {})  # fmt: skip
    ids = group.batch.input_ids.tolist()
    for i, row in enumerate(ids):
        prompt = prompts[i // 4]
        assert [t for t in row if t != embedded_base.pad_id][: len(prompt)] == prompt, i
    assert torch.equal(group.advantages, grpo_math.group_advantages(group.rewards, 4))
    assert group.advantages.view(2, 4).sum(dim=1).abs().max() < 1e-5


def test_the_kl_enters_the_loss_weighed_by_beta(profile, embedded_dir, embedded_base, move_adapters, r001_view):
    """The same first iteration with beta 0.5 and with beta 0, the reference's adapters moved
    apart from the actor's (k3 > 0): the same samples, and the first update's losses differ by
    beta times its recorded k3 KL."""
    from rlhf import grpo
    from rlhf.runtime import seed_system_rngs

    one = override(profile, {("ppo", "iterations"): 1})
    losses, kls = {}, {}
    for beta in (0.5, 0.0):
        roles = fresh_roles(one, embedded_dir, move_adapters)
        move_adapters(roles.reference.model, 99)
        seed_system_rngs(one.seeds.torch)
        state, _ = grpo.train_grpo(roles, r001_view, embedded_base.tokens, one, grpo.Settings(4, beta))
        it = state["history"]["iterations"][0]
        losses[beta], kls[beta] = it["loss"][0], it["k3_kl"][0]
    assert kls[0.5] == kls[0.0] > 0.01
    assert losses[0.5] - losses[0.0] == pytest.approx(0.5 * kls[0.5], rel=1e-4)
