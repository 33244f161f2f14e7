"""Each reward design's pay in PPO (rlhf.ppo.pay), recomputed from its own formula written out
here, on one rollout of three answers: a right answer ended with EOS, a wrong one ended with
EOS, and the right text cut at the limit without EOS. Every design the profile accepts has its
formula below, so a design that pays through another design's function fails here."""

import statistics
from types import SimpleNamespace

import pytest
import torch

from rlhf import ppo, rubric
from rlhf.checkpoint import Leg
from rlhf.config import override
from rlhf.designs import NAMES
from rlhf.tokens import encode_response

pytestmark = pytest.mark.unit

JUDGE = [2.0, -1.0, 3.0]  # the judge's score of each answer
MEMBERS = [[1.0, 0.0, 5.0], [4.0, -3.0, 1.0], [0.5, -2.0, 2.0]]  # judges 1..3 of the ensemble
TRUNCATED = [False, False, True]
MEAN, SD, LAM = 1.0, 2.0, 0.5


def by_hand(design: str) -> list[float]:
    """What the last token is paid, from each design's formula (SPEC §6, §12)."""
    members = [[JUDGE[b], *(m[b] for m in MEMBERS)] for b in range(3)]  # per answer, member 0 the judge
    return {
        "judge": JUDGE,
        "iterated-judge": JUDGE,  # the judge as last refreshed
        "standardised-judge": [(s - MEAN) / SD for s in JUDGE],
        "eos-less-replaced": [0.0 if cut else s for s, cut in zip(JUDGE, TRUNCATED)],
        "oracle": [1.0, 0.0, 0.0],  # the rubric: right and ended; wrong; right text but no EOS
        "ensemble-mean": [statistics.fmean(m) for m in members],
        "ensemble-min": [min(m) for m in members],
        "ensemble-uncertainty": [statistics.fmean(m) - LAM * statistics.pstdev(m) for m in members],
    }[design]


@pytest.mark.parametrize("design", NAMES)
def test_each_design_pays_its_own_formula_also_for_an_answer_cut_without_eos(
    design, embedded_profile, embedded_base, monkeypatch
):
    tokenizer, eos_id, limits = embedded_base.tokenizer, embedded_base.eos_id, embedded_profile.limits
    right = encode_response(tokenizer, rubric.render(0, 1, False), eos_id, limits)
    wrong = encode_response(tokenizer, rubric.render(3, 1, False), eos_id, limits)
    answers = ppo.Answers(
        batch=None,
        responses=[right, wrong, right[:-1]],  # the third: the right text, cut before its EOS
        truncated=torch.tensor(TRUNCATED),
        actions=[0, 0, 0],
        tokens=embedded_base.tokens,
    )
    judges = {"judge": JUDGE, **{f"judge-{m + 1}": s for m, s in enumerate(MEMBERS)}}
    monkeypatch.setattr(ppo, "reward_scores", lambda role, batch: torch.tensor(judges[role], dtype=torch.float32))
    roles = SimpleNamespace(judge="judge", members=["judge-1", "judge-2", "judge-3"])
    changes = {("ppo", "reward_design"): design}
    if design == "ensemble-uncertainty":
        changes[("ppo", "ensemble_lambda")] = LAM
    if design == "standardised-judge":
        changes |= {("ppo", "score_mean"): MEAN, ("ppo", "score_sd"): SD}
    cfg = override(embedded_profile, changes).ppo
    paid = ppo.pay(roles, answers, cfg)
    assert paid.paid.tolist() == pytest.approx(by_hand(design), abs=1e-6)
    assert paid.score.tolist() == JUDGE  # the judge's own score is recorded under every design


@pytest.fixture(scope="module")
def r001_view():
    from rlhf.corpus import Corpus

    return Corpus.build("r001").learning_view()


@pytest.mark.parametrize("design", NAMES)
def test_every_registered_design_runs_a_ppo_iteration_and_pays_its_formula(
    design, embedded_profile, embedded_dir, embedded_base, move_adapters, r001_view
):
    """train_ppo itself, per registered design, on fresh embedded roles (moved adapters and
    heads, so scores differ) with answers cut at 8 new tokens: one iteration (the iterated judge: two, its
    refresh between them). What the history records is paid again through the design's formula,
    the actor and critic change, and only the iterated judge's judge can learn."""
    from rlhf import designs
    from rlhf.roles import PpoRoles, fingerprint, new_role

    d = designs.DESIGNS[design]
    changes: dict = {("ppo", "reward_design"): design, ("ppo", "iterations"): 1, ("ppo", "max_new_tokens"): 8}
    if d.refreshes_judge:
        changes |= {("ppo", "iterations"): 2, ("ppo", "refresh_every"): 1, ("ppo", "refresh_prompts"): 4,
                    ("ppo", "refresh_updates"): 1}  # fmt: skip
    if d.ensemble:
        changes[("ppo", "ensemble_size")] = 2
    if d.measured_before_ppo:
        changes |= {("ppo", "score_mean"): MEAN, ("ppo", "score_sd"): SD}
    profile = override(embedded_profile, changes)
    made = {kind: new_role(kind, profile, embedded_dir) for kind in ("actor", "reference", "critic", "judge")}
    members = tuple(new_role("judge", profile, embedded_dir) for _ in range(profile.ppo.ensemble_size - 1))
    for i, role in enumerate([*made.values(), *members] if d.ensemble else made.values()):
        g = move_adapters(role.model, 300 + i)
        if role.head is not None:
            with torch.no_grad():
                role.head.weight.copy_(torch.randn(role.head.weight.shape, generator=g) * 0.05)
    roles = PpoRoles(**made, members=members if d.ensemble else ())
    before = {k: fingerprint(r)["learned_sha256"] for k, r in roles.by_kind().items()}
    tok = embedded_base
    handed: list = []  # what each iteration hands its leg (rlhf.ppo.Measured)
    leg = Leg(progress=lambda _it, _total, _history, measured: handed.append(measured))
    state, _ = ppo.train_ppo(roles, r001_view, tok.tokens, profile, leg)
    after = {k: fingerprint(r)["learned_sha256"] for k, r in roles.by_kind().items()}
    its = state["history"]["iterations"]
    assert len(its) == profile.ppo.iterations
    for it in its:
        score = torch.tensor(it["scores"])
        paid = torch.tensor(it.get("paid_scores", it["scores"]))
        assert it.get("reward_design", designs.DEFAULT) == design
        if design == designs.DEFAULT:
            assert "paid_scores" not in it  # the default's history is SPEC §6's
        members_seen = None if "member_scores" not in it else torch.tensor(it["member_scores"])
        assert (members_seen is not None) == d.ensemble
        if d.reads_target:  # the rubric's verdicts are not in the history: a success is 1 or 0
            assert set(paid.tolist()) <= {0.0, 1.0}
        elif designs.TRUNCATION in d.reads:  # which answers were cut: from the count, where it says
            assert (paid == 0).sum() >= it["truncations"] and ((paid == score) | (paid == 0)).all()
        else:
            x = designs.Inputs(score, torch.zeros_like(score, dtype=torch.bool), member_scores=members_seen,
                               score_mean=profile.ppo.score_mean, score_sd=profile.ppo.score_sd,
                               ensemble_lambda=profile.ppo.ensemble_lambda)  # fmt: skip
            assert paid.tolist() == pytest.approx(designs.paid(design, x).tolist(), abs=1e-6)
    # TensorBoard's reward sums are the rollout's rewards: this design's pay, the cut answers'
    # penalty and the log-ratio on every token, as the history's numbers give them by hand.
    cfg = profile.ppo
    for it, measured in zip(its, handed, strict=True):
        n, paid_sum = len(it["scores"]), sum(it.get("paid_scores", it["scores"]))
        kl = it["mean_sequence_log_ratio"]
        whole = (paid_sum + cfg.truncation_penalty * it["truncations"]) / n - cfg.kl_coef * kl
        assert measured.rewards["rlhf_reward"] == pytest.approx(whole, rel=1e-5, abs=1e-6)
        assert measured.rewards["non_score_reward"] == pytest.approx(-cfg.kl_coef * kl, rel=1e-5, abs=1e-8)
    assert after["actor"] != before["actor"] and after["critic"] != before["critic"]
    assert after["reference"] == before["reference"]
    refreshes = state["history"].get("refreshes", [])
    assert [r["after_iteration"] for r in refreshes] == ([1] if d.refreshes_judge else [])
    # The judge learns at a refresh that labelled a pair (an untrained actor's 8 tokens rarely do), else never.
    assert (after["judge"] != before["judge"]) == any(r["updates"] > 0 for r in refreshes)
    assert all(after[f"judge-{m}"] == before[f"judge-{m}"] for m in range(1, len(roles.members) + 1))
