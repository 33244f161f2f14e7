"""The wiring of rlhf.ppo: what `rollout` stores and what `ppo_update` feeds the PPO arithmetic.

rlhf.ppo_math is tested number by number elsewhere (tests_unit/test_ppo_math.py); these tests
catch the bugs that live between the functions: the wrong tensor passed to a correct loss
(fresh log-probs instead of the behaviour log-probs, the actor instead of the reference), a
rollout tensor modified in place or left attached to the graph, the judge score paid at the
wrong token, the wrong sign of the update.

The roles are the embedded ones with moved adapters (each role its own seed, so actor and
reference differ) and drawn heads (so values and scores are not zero). The actor gets +6 on the
EOS logit (a forward hook on its lm_head, so sampling and teacher-forced scoring both see it):
the untrained base almost never ends by itself, and the rollout tests need both an answer that
ended with EOS and one cut at the limit. The limit is 8 tokens instead of 64 to stay fast.

The oracle design's tests (SPEC §12 (iv)) replace the actor's sampling by scripted answers, the
grammar's renderings of chosen actions, so that which answer is a rubric success for which
prompt is known by construction: a reward paid against another prompt's action shows.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from rlhf import ppo, ppo_math, rubric
from rlhf.config import override
from rlhf.corpus import Corpus
from rlhf.generate import Generation, generate
from rlhf.masks import last_active_index
from rlhf.optim import adamw
from rlhf.roles import PpoRoles, critic_values, new_role, reward_scores
from rlhf.scoring import response_logprobs
from rlhf.tokens import encode_prompt, encode_response

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]

EOS_BIAS = 6.0
RESPONSE_TOKENS = 8
SAMPLING_SEED = 1  # with EOS_BIAS 6: two answers end with EOS, two are cut (checked below)
PROMPT_LENGTHS = (5, 9, 3, 7)


@pytest.fixture(scope="module")
def profile(embedded_profile):
    return override(embedded_profile, {("limits", "response_tokens"): RESPONSE_TOKENS})


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, 958, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture
def make_roles(embedded_dir, embedded_base, move_adapters):
    """make_roles(profile) -> fresh actor, reference, critic and judge (a new set each call)."""
    eos_id = embedded_base.eos_id

    def make(profile):
        made = {kind: new_role(kind, profile, embedded_dir) for kind in ("actor", "reference", "critic", "judge")}
        for i, role in enumerate(made.values()):
            g = move_adapters(role.model, 100 + i)
            if role.head is not None:
                with torch.no_grad():
                    role.head.weight.copy_(torch.randn(role.head.weight.shape, generator=g) * 0.05)
                    role.head.bias.fill_(0.3)

        def more_eos(module, inputs, logits):
            bias = torch.zeros(logits.shape[-1], dtype=logits.dtype)
            bias[eos_id] = EOS_BIAS
            return logits + bias

        roles = PpoRoles(**made)
        roles.actor.model.lm_head.register_forward_hook(more_eos)
        return roles

    return make


def run_rollout(roles, prompts, profile, base):
    sample_gen = torch.Generator().manual_seed(SAMPLING_SEED)
    return ppo.rollout(roles, ppo.Prompts(prompts, None), base.tokens, profile, sample_gen, {})


def optimizers_of(roles, profile):
    return {
        role.kind: adamw([p for p in role.learned_parameters() if p.requires_grad], lr, profile.optim.weight_decay)
        for role, lr in ((roles.actor, profile.ppo.actor_lr), (roles.critic, profile.ppo.critic_lr))
    }


def two_updates(roles, ro, profile):
    """Both updates of one iteration (steps 0 and 1 of 2), on the same rollout."""
    optimizers = optimizers_of(roles, profile)
    return [ppo.ppo_update(roles, optimizers, ro, profile, u, 2, "test", {}) for u in range(2)]


def spy_on_policy_loss(monkeypatch):
    """Record (logp_cur, logp_old) as ppo_update hands them to the clipped policy loss."""
    calls = []
    real = ppo_math.clipped_policy_loss

    def spy(logp_cur, logp_old, advantages, mask, clip=0.2):
        calls.append({"logp_cur": logp_cur.detach().clone(), "logp_old": logp_old.detach().clone()})
        return real(logp_cur, logp_old, advantages, mask, clip=clip)

    monkeypatch.setattr(ppo.ppo_math, "clipped_policy_loss", spy)
    return calls


# ================================================================= rollout -> ppo_update


def test_behaviour_logp_old_reaches_the_policy_loss_unchanged_in_both_updates(
    make_roles, profile, prompts, embedded_base, monkeypatch
):
    """Catches an update that feeds the loss anything but the stored behaviour log-probs: a
    teacher-forced rescoring (equal only to ~1e-6), or the current actor's log-probs in the
    second update (which would make every ratio 1 and switch the clipping off)."""
    roles = make_roles(profile)
    ro = run_rollout(roles, prompts, profile, embedded_base)
    stored = ro.logp_old.clone()
    calls = spy_on_policy_loss(monkeypatch)
    two_updates(roles, ro, profile)

    assert len(calls) == 2
    for call in calls:
        assert torch.equal(call["logp_old"], stored)  # bit for bit, in update 1 and update 2
    mask = ro.batch.response_mask
    # The actor moved after update 1: its log-probs in update 2 are not the behaviour ones.
    assert not torch.equal(calls[1]["logp_cur"], stored)
    assert float((calls[1]["logp_cur"] - stored).abs()[mask].max()) > 1e-4
    # And the teacher-forced rescoring before update 1 is close to but not bit-equal with them,
    # so the bit-for-bit check above does tell the two apart.
    assert not torch.equal(calls[0]["logp_cur"], stored)
    assert float((calls[0]["logp_cur"] - stored).abs()[mask].max()) < 1e-4


def by_hand_clipped_loss(advantage, delta, lengths, clip=0.2):
    """-min(rho*A, clip(rho, 1-clip, 1+clip)*A) with rho = exp(-delta) (logp_old = logp_cur +
    delta), averaged over a response's active tokens, then over responses; and the share of
    tokens on the clipped branch, averaged the same way."""
    losses, fractions = [], []
    for b, n in enumerate(lengths):
        token_losses, clipped = [], []
        for j in range(n):
            a, rho = advantage[b][j], math.exp(-delta[b][j])
            bounded = min(max(rho, 1 - clip), 1 + clip)
            token_losses.append(-min(rho * a, bounded * a))
            clipped.append(1.0 if (a > 0 and rho > 1 + clip) or (a < 0 and rho < 1 - clip) else 0.0)
        losses.append(sum(token_losses) / n)
        fractions.append(sum(clipped) / n)
    return sum(losses) / len(lengths), sum(fractions) / len(lengths)


# token j of every response, by j % 4: (advantage, logp_old - logp_cur)
#   0: A = +1.5, rho = e   -> clipped branch  (loss -1.2 * 1.5)
#   1: A = +1.5, rho = 1/e -> unclipped       (loss -1.5 / e)
#   2: A = -2.0, rho = 1/e -> clipped branch  (loss -0.8 * -2.0)
#   3: A = -2.0, rho = e   -> unclipped       (loss  2.0 * e)
PATTERN = [(1.5, -1.0), (1.5, 1.0), (-2.0, 1.0), (-2.0, -1.0)]


def test_ratios_far_outside_the_clip_range_give_the_by_hand_loss_and_clip_fraction(
    make_roles, profile, prompts, embedded_base
):
    """Catches a wrong clipping in the update (max for min, clip range not the profile's 0.2,
    clipping only one side) and a token mean where the SPEC asks for the mean over a response's
    tokens, then over responses (the four responses have 1, 8, 2 and 8 tokens)."""
    roles = make_roles(profile)
    ro = run_rollout(roles, prompts, profile, embedded_base)
    mask = ro.batch.response_mask
    lengths = mask.sum(-1).tolist()
    with torch.no_grad():
        logp_cur = response_logprobs(roles.actor.model, ro.batch)
    advantage = [[PATTERN[j % 4][0] if j < n else 0.0 for j in range(mask.shape[1])] for n in lengths]
    delta = [[PATTERN[j % 4][1] if j < n else 0.0 for j in range(mask.shape[1])] for n in lengths]
    ro = dataclasses.replace(ro, logp_old=logp_cur + torch.tensor(delta), advantages=torch.tensor(advantage))

    stats = ppo.ppo_update(roles, optimizers_of(roles, profile), ro, profile, 0, 2, "test", {})

    want_loss, want_fraction = by_hand_clipped_loss(advantage, delta, lengths, clip=profile.ppo.clip)
    assert profile.ppo.clip == 0.2
    assert lengths == [1, 8, 2, 8]
    # (1, 8, 2, 8 tokens) -> clipped shares 1, 4/8, 1/2, 4/8
    assert want_fraction == pytest.approx((1 + 0.5 + 0.5 + 0.5) / 4)
    assert stats["clip_fraction"] == pytest.approx(want_fraction, abs=1e-7)
    assert stats["clip_fraction"] > 0
    assert stats["policy_loss"] == pytest.approx(want_loss, rel=1e-5)


def test_one_update_raises_positive_and_lowers_negative_advantage_tokens(make_roles, profile, prompts, embedded_base):
    """Catches a sign error between the advantages and the actor's step (gradient ascent on the
    loss, advantages negated, the loss minimised for the critic's parameters only)."""
    p = override(profile, {("ppo", "actor_lr"): 1e-3})
    roles = make_roles(p)
    ro = run_rollout(roles, prompts, p, embedded_base)
    mask = ro.batch.response_mask
    with torch.no_grad():
        before = response_logprobs(roles.actor.model, ro.batch)
    # Responses 0 and 2 were good, 1 and 3 bad; ratio 1 everywhere, so nothing is clipped.
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None].expand_as(mask)
    advantages = torch.where(mask, sign, torch.zeros(()))
    ro = dataclasses.replace(ro, logp_old=before.clone(), advantages=advantages)

    stats = ppo.ppo_update(roles, optimizers_of(roles, p), ro, p, 0, 2, "test", {})

    with torch.no_grad():
        after = response_logprobs(roles.actor.model, ro.batch)
    change = after - before
    assert stats["clip_fraction"] == 0.0
    assert float(change[mask].abs().min()) > 0.1  # a clear effect, not rounding noise
    assert bool((change[mask & (advantages > 0)] > 0).all()), change
    assert bool((change[mask & (advantages < 0)] < 0).all()), change


def test_rollout_data_keep_their_values_and_carry_no_graph_across_both_updates(
    make_roles, profile, prompts, embedded_base
):
    """Catches rollout data modified in place by an update (in-place whitening of the
    advantages, a critic step writing into the returns) and data left attached to the graph
    (values read without no_grad would be trained through by the critic loss)."""
    roles = make_roles(profile)
    ro = run_rollout(roles, prompts, profile, embedded_base)
    keys = ("logp_old", "logp_ref", "score", "values", "rewards", "advantages", "returns")
    before = {k: getattr(ro, k).clone() for k in keys}
    for k in keys:
        assert not getattr(ro, k).requires_grad, k
        assert getattr(ro, k).grad_fn is None, k
    two_updates(roles, ro, profile)
    for k in keys:
        assert torch.equal(getattr(ro, k), before[k]), k
        assert not getattr(ro, k).requires_grad, k


# ================================================================= rollout itself


@pytest.fixture
def rolled(make_roles, profile, prompts, embedded_base, monkeypatch):
    """A rollout, the dones that `rollout` handed to GAE, and its roles."""
    seen = {}
    real_gae = ppo_math.gae

    def spy_gae(rewards, values, dones, gamma=1.0, lam=0.95):
        seen["dones"] = dones.clone()
        return real_gae(rewards, values, dones, gamma=gamma, lam=lam)

    monkeypatch.setattr(ppo.ppo_math, "gae", spy_gae)
    roles = make_roles(profile)
    ro = run_rollout(roles, prompts, profile, embedded_base)
    return ro, seen["dones"], roles


def test_the_sampled_answers_end_both_ways(rolled):
    """The premise of the rollout tests: one set of answers with EOS ends and cut ends."""
    ro, _, _ = rolled
    assert ro.ended == [True, False, True, False]
    assert ro.batch.response_mask.sum(-1).tolist() == [1, 8, 2, 8]
    assert ro.truncated.tolist() == [False, True, False, True]


def test_the_token_view_shows_each_active_token_with_its_numbers(rolled, profile, embedded_base):
    """The report's per-token rollout: one row per active token, the token as the tokenizer writes
    it, and the rollout's own numbers in each column."""
    ro, _, _ = rolled
    for b, n in enumerate(ro.batch.response_mask.sum(-1).tolist()):
        rows = ppo.token_view(embedded_base.tokenizer, ro, b)
        assert [r["token"] for r in rows] == embedded_base.tokenizer.convert_ids_to_tokens(ro.responses[b][:n])
        assert [r["logp_old"] for r in rows] == ro.logp_old[b, :n].tolist()
        assert [r["advantage"] for r in rows] == ro.advantages[b, :n].tolist()
        assert [r["return"] for r in rows] == ro.returns[b, :n].tolist()


def test_rollout_logp_old_are_the_generators_per_step_logprobs(rolled, prompts, profile, embedded_base):
    """Catches logp_old taken from a teacher-forced rescoring, or shifted by one position,
    instead of the behaviour log-probs the sampler drew with."""
    ro, _, roles = rolled
    gen = generate(
        roles.actor.model,
        prompts,
        eos_id=embedded_base.eos_id,
        pad_id=embedded_base.pad_id,
        max_new_tokens=RESPONSE_TOKENS,
        temperature=1.0,
        generator=torch.Generator().manual_seed(SAMPLING_SEED),
        use_cache=True,
    )
    assert gen.responses == ro.responses
    want = torch.zeros_like(ro.logp_old)
    for b, lp in enumerate(gen.logps):
        want[b, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
    assert torch.equal(ro.logp_old, want)
    with torch.no_grad():
        teacher_forced = response_logprobs(roles.actor.model, ro.batch)
    assert not torch.equal(ro.logp_old, teacher_forced)  # so the check above can tell them apart


def test_rollout_logp_ref_are_the_references_teacher_forced_logprobs(rolled):
    """Catches logp_ref scored with the actor (a zero KL penalty) or with the wrong batch."""
    ro, _, roles = rolled
    mask = ro.batch.response_mask
    with torch.no_grad():
        want = response_logprobs(roles.reference.model, ro.batch)
        actor = response_logprobs(roles.actor.model, ro.batch)
    assert torch.equal(ro.logp_ref, want)
    assert float((actor - want).abs()[mask].max()) > 0.1  # actor and reference really differ


def test_rollout_values_and_score_come_from_the_critic_and_the_judge(rolled):
    """Catches values or scores read from the wrong role (the judge and the critic swapped)."""
    ro, _, roles = rolled
    with torch.no_grad():
        assert torch.equal(ro.values, critic_values(roles.critic, ro.batch))
        assert torch.equal(ro.score, reward_scores(roles.judge, ro.batch))
    assert float(ro.values[ro.batch.response_mask].abs().min()) > 0  # a drawn head, not zeros


def test_rollout_pays_the_score_once_at_the_last_active_token_minus_1_when_cut(rolled, profile):
    """Catches the judge score paid at every token, at the last column of the padded batch
    instead of the last active token, twice, or the truncation penalty missing or on the
    answers that ended with EOS."""
    ro, _, _ = rolled
    mask = ro.batch.response_mask
    kl_coef = profile.ppo.kl_coef
    kl_part = torch.where(mask, -kl_coef * (ro.logp_old - ro.logp_ref), torch.zeros(()))
    terminal = ro.rewards - kl_part
    for b, n in enumerate(mask.sum(-1).tolist()):
        cut = -1.0 if b in (1, 3) else 0.0  # answers 1 and 3 were cut at 8 tokens
        assert float(terminal[b, n - 1]) == pytest.approx(float(ro.score[b]) + cut, abs=1e-6)
        assert torch.all(terminal[b, : n - 1].abs() < 1e-6), terminal[b]
        assert torch.all(ro.rewards[b, n:] == 0)


def test_rollout_dones_sit_at_the_last_active_token_and_gae_uses_them(rolled, profile):
    """Catches dones at the last column of the padded batch (the EOS answers 0 and 2 would then
    bootstrap from padding) and advantages that are not the GAE of the stored rewards and values."""
    ro, dones, _ = rolled
    mask = ro.batch.response_mask
    want = torch.zeros_like(mask)
    for b, n in enumerate(mask.sum(-1).tolist()):
        want[b, n - 1] = True
    assert torch.equal(dones.bool(), want)
    assert torch.equal(last_active_index(mask), torch.tensor([0, 7, 1, 7]))
    adv, ret = ppo_math.gae(ro.rewards, ro.values, want, gamma=profile.ppo.gamma, lam=profile.ppo.lam)
    assert torch.equal(ro.advantages, adv)
    assert torch.equal(ro.returns, ret)


# ================================================================= what PPO logs for warnings
# The over-optimisation signals of each iteration, recomputed independently from the stored
# rollout (plain loops over its numbers or a fresh forward pass, never the logging function).


@pytest.fixture
def logged(make_roles, profile, prompts, embedded_base):
    roles = make_roles(profile)
    ro = run_rollout(roles, prompts, profile, embedded_base)
    before = ro.logp_old.clone()
    stats = two_updates(roles, ro, profile)
    record = ppo._record(0, ["p"] * len(PROMPT_LENGTHS), ro, stats, profile.ppo)
    return roles, ro, stats, record, before


def test_each_drawn_tokens_entropy_is_its_sampling_distributions(make_roles, profile, prompts, embedded_base):
    """-sum p log p of the actor's next-token distribution at each drawn position, from one
    teacher-forced forward of the prompt + answer (the padding rows of the embedding excluded)."""
    roles = make_roles(profile)
    ro = run_rollout(roles, prompts, profile, embedded_base)
    record = ppo._record(0, ["p"] * len(PROMPT_LENGTHS), ro, two_updates(make_roles(profile), ro, profile), profile.ppo)
    n_real = len(embedded_base.tokenizer)
    actor = roles.actor.model
    total, count = 0.0, 0
    for b, (prompt, answer) in enumerate(zip(prompts, ro.responses)):
        ids = torch.tensor([prompt + answer])
        with torch.no_grad():
            logits = actor(input_ids=ids).logits[0].float()  # [L, V]; the EOS hook adds its bias here too
        for j in range(len(answer)):
            row = logits[len(prompt) - 1 + j, :n_real].double()
            p = torch.softmax(row, -1)
            h = float(-(p * torch.log(p)).sum())
            assert float(ro.entropy[b, j]) == pytest.approx(h, abs=2e-4), (b, j)
            total, count = total + float(ro.entropy[b, j]), count + 1
        assert float(ro.entropy[b, len(answer) :].abs().sum()) == 0.0  # nothing past the answer
    assert record["entropy"] == pytest.approx(total / count, rel=1e-6)


def test_the_sequence_log_ratio_and_the_advantage_quantiles(logged):
    _, ro, _, record, _ = logged
    sums = []
    advantages = []
    for b, answer in enumerate(ro.responses):
        sums.append(sum(float(ro.logp_old[b, j]) - float(ro.logp_ref[b, j]) for j in range(len(answer))))
        advantages += [float(ro.advantages[b, j]) for j in range(len(answer))]
    assert record["mean_sequence_log_ratio"] == pytest.approx(sum(sums) / len(sums), rel=1e-5, abs=1e-7)
    advantages.sort()
    n = len(advantages)
    for k, q in enumerate(record["advantage_quantiles"]):
        pos = k / 10 * (n - 1)  # linear interpolation between order statistics
        lo, hi = math.floor(pos), math.ceil(pos)
        want = advantages[lo] + (advantages[hi] - advantages[lo]) * (pos - lo)
        assert q == pytest.approx(want, abs=1e-6), k
    assert record["advantage_quantiles"][0] == advantages[0] and record["advantage_quantiles"][-1] == advantages[-1]


def test_each_updates_kl_is_the_k3_estimate_on_the_sampled_tokens(make_roles, profile, prompts, embedded_base):
    """Update u's logged KL is mean over answers of mean over their tokens of (r - 1) - log r,
    r = pi_cur / pi_old, pi_cur the actor just before update u's step (its log-probs rescored here)."""
    roles = make_roles(profile)
    ro = run_rollout(roles, prompts, profile, embedded_base)
    wanted, stats = [], []
    optimizers = optimizers_of(roles, profile)
    for u in range(2):
        with torch.no_grad():
            cur = response_logprobs(roles.actor.model, ro.batch)
        per_answer = []
        for b, answer in enumerate(ro.responses):
            ks = []
            for j in range(len(answer)):
                log_r = float(cur[b, j]) - float(ro.logp_old[b, j])
                ks.append(math.expm1(log_r) - log_r)
            per_answer.append(sum(ks) / len(ks))
        wanted.append(sum(per_answer) / len(per_answer))
        stats.append(ppo.ppo_update(roles, optimizers, ro, profile, u, 2, "test", {}))
    got = [s["update_shift"] for s in stats]
    assert got == pytest.approx(wanted, rel=1e-4, abs=1e-9)
    assert got[0] >= 0 and got[1] > 0  # the second update starts from a moved actor


# ================================================================= the oracle design (SPEC §12 (iv))


def scripted_sampling(answer_of):
    """A stand-in for the actor's sampling (rlhf.generate.sample_like_ppo): row b answers
    `answer_of(prompt_ids of row b)`, EOS included, as if drawn (log-probs -1, entropies 1)."""

    def sample(model, prompts, tokens, profile, generator):
        responses = [answer_of(p) for p in prompts]
        return Generation(
            responses,
            [[-1.0] * len(r) for r in responses],
            [r[-1] == tokens.eos_id for r in responses],
            [[1.0] * len(r) for r in responses],
        )

    return sample


def hedged_answer(action: int, tokenizer, eos_id: int, profile) -> list[int]:
    """The grammar's plain, hedged answer naming `action` (a rubric success for that action only)."""
    return encode_response(tokenizer, rubric.render(action, 1, False), eos_id, profile.limits)


def test_the_oracle_pays_each_answer_its_own_prompts_rubric_success(
    make_roles, embedded_profile, embedded_base, monkeypatch
):
    """Four prompts of four different actions; the first three answers name their own prompt's
    action, the fourth names the first prompt's. Paid: 1, 1, 1, 0 - and only that order: any
    other pairing of answers with actions pays another vector (the first three actions are
    distinct). The judge's score is not what is paid, and the paid score sits at the last token."""
    profile = override(embedded_profile, {("ppo", "reward_design"): "oracle"})
    tokenizer, eos_id = embedded_base.tokenizer, embedded_base.eos_id
    actions = [0, 3, 5, 2]  # each prompt's action, as train_ppo reads it from the train pairs
    said = [0, 3, 5, 0]  # the action each answer names
    paid_by_hand = [1.0, 1.0, 1.0, 0.0]
    answers = {b: hedged_answer(a, tokenizer, eos_id, profile) for b, a in enumerate(said)}
    prompts = [[10 + b] * (3 + b) for b in range(4)]  # distinct, so that each row finds its answer
    monkeypatch.setattr(ppo, "sample_like_ppo", scripted_sampling(lambda p: answers[prompts.index(p)]))
    roles = make_roles(profile)
    gen = torch.Generator().manual_seed(SAMPLING_SEED)
    ro = ppo.rollout(roles, ppo.Prompts(prompts, actions), embedded_base.tokens, profile, gen, {})
    assert ro.responses == [answers[b] for b in range(4)] and ro.ended == [True] * 4
    assert ro.paid.tolist() == paid_by_hand
    assert not torch.equal(ro.paid, ro.score)  # the judge's score is computed, not paid
    mask = ro.batch.response_mask
    last = last_active_index(mask)
    penalty = -profile.ppo.kl_coef * (ro.logp_old - ro.logp_ref)
    assert torch.allclose(ro.penalty, penalty.masked_fill(~mask, 0.0))  # the rollout's one penalty tensor
    for b in range(4):
        assert float(ro.rewards[b, last[b]]) == pytest.approx(float(penalty[b, last[b]]) + paid_by_hand[b], abs=1e-6)


def test_each_iterations_oracle_pays_the_rubric_success_on_its_own_prompts_family_action(
    embedded_profile, embedded_dir, embedded_base, monkeypatch
):
    """train_ppo with the oracle design over two iterations: each drawn prompt is answered, in
    turn, with its own family's action and with the next action (family i has action i // 40,
    SPEC §2, read here from the prompt's family); the paid scores the history records are 1 and
    0 in that order, prompt by prompt."""
    profile = override(embedded_profile, {("ppo", "reward_design"): "oracle", ("ppo", "iterations"): 2})
    tokenizer, eos_id = embedded_base.tokenizer, embedded_base.eos_id
    view = Corpus.build("r001").learning_view()
    family_of = {
        tuple(encode_prompt(tokenizer, r["prompt"], profile.limits)): r["family"] for r in view.rollout_prompts()
    }
    rows: list[tuple[int, bool]] = []  # (the prompt's action, whether its answer names it)

    def answer_of(prompt_ids):
        action = int(family_of[tuple(prompt_ids)][2:]) // 40
        right = len(rows) % 2 == 0
        rows.append((action, right))
        return hedged_answer(action if right else (action + 1) % 6, tokenizer, eos_id, profile)

    real_rollout_data = ppo.rollout_data

    def actions_interleaved(*args):
        """The rollout prompts reordered so that neighbours call for different actions (the corpus
        groups a family's prompts together), so an action read from another index is wrong."""
        data = real_rollout_data(*args)
        by_action: dict[int, list[int]] = {}
        for i, action in enumerate(data.actions):
            by_action.setdefault(action, []).append(i)
        order = [i for group in itertools.zip_longest(*by_action.values()) for i in group if i is not None]
        pick = lambda xs: [xs[i] for i in order]  # noqa: E731
        return data._replace(prompts=pick(data.prompts), encoded=pick(data.encoded), actions=pick(data.actions))

    monkeypatch.setattr(ppo, "rollout_data", actions_interleaved)
    monkeypatch.setattr(ppo, "sample_like_ppo", scripted_sampling(answer_of))
    roles = PpoRoles(
        **{kind: new_role(kind, profile, embedded_dir) for kind in ("actor", "reference", "critic", "judge")}
    )
    state, _ = ppo.train_ppo(roles, view, embedded_base.tokens, profile)
    iterations = state["history"]["iterations"]
    assert len(rows) == 8 and all(it["reward_design"] == "oracle" for it in iterations)
    # The premise: each iteration's prompts call for more than one action, so a mix-up would show.
    assert all(len({a for a, _ in rows[4 * i : 4 * i + 4]}) > 1 for i in range(2)), rows
    paid = [p for it in iterations for p in it["paid_scores"]]
    assert paid == [1.0 if right else 0.0 for _, right in rows]


@pytest.mark.parametrize("offset", [None, 7])
def test_ppo_draws_its_prompt_order_and_token_sampling_from_the_seeds_plus_ppo_offset(
    embedded_profile, embedded_dir, embedded_base, monkeypatch, offset
):
    """A nested study reruns PPO from one SFT and judge with other draws ([seeds] ppo_offset):
    the prompt sampler and the sampling generator start from their seeds plus the offset (absent:
    the seeds themselves, as every run before the key existed)."""
    profile = override(
        embedded_profile,
        {("ppo", "reward_design"): "oracle", ("ppo", "iterations"): 1, ("seeds", "ppo_offset"): offset},
    )
    tokenizer = embedded_base.tokenizer
    seen: dict[str, list[int]] = {"order": [], "sampling": []}
    real_sampler = ppo.PromptSampler

    def sampler(n, seed):
        seen["order"].append(seed)
        return real_sampler(n, seed)

    def sample(model, prompts, tokens, profile, generator):
        seen["sampling"].append(generator.initial_seed())
        return scripted_sampling(lambda p: hedged_answer(0, tokenizer, tokens.eos_id, profile))(
            model, prompts, tokens, profile, generator
        )

    monkeypatch.setattr(ppo, "PromptSampler", sampler)
    monkeypatch.setattr(ppo, "sample_like_ppo", sample)
    roles = PpoRoles(
        **{kind: new_role(kind, profile, embedded_dir) for kind in ("actor", "reference", "critic", "judge")}
    )
    ppo.train_ppo(roles, Corpus.build("r001").learning_view(), embedded_base.tokens, profile)
    seeds = embedded_profile.seeds
    assert seen == {"order": [seeds.data_order + (offset or 0)], "sampling": [seeds.ppo_sampling + (offset or 0)]}
    assert profile.seeds.ppo("torch") == seeds.torch + (offset or 0) and profile.seeds.ppo("judge_refresh") == (
        seeds.judge_refresh + (offset or 0)
    )


def test_ppo_offset_is_absent_from_the_identity_until_set_and_never_negative(embedded_profile):
    from rlhf.config import ProfileError, profile_hash

    assert "ppo_offset" not in embedded_profile.to_dict()["seeds"]
    assert profile_hash(embedded_profile) == "41ec2214c4e7d5d737b770809120388f5104ba22158e20ed4b354183143df4c2"
    nested = override(embedded_profile, {("seeds", "ppo_offset"): 3})
    assert profile_hash(nested) != profile_hash(embedded_profile) and nested.seeds.ppo("data_order") == (
        embedded_profile.seeds.data_order + 3
    )
    with pytest.raises(ProfileError, match="ppo_offset must be at least 0, not -1"):
        override(embedded_profile, {("seeds", "ppo_offset"): -1})
