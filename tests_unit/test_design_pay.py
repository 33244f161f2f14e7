"""Each reward design's pay in PPO (rlhf.ppo.PAY), recomputed from its own formula written out
here, on one rollout of three answers: a right answer ended with EOS, a wrong one ended with
EOS, and the right text cut at the limit without EOS. Every design the profile accepts has its
formula below, so a design that pays through another design's function fails here."""

import statistics
from types import SimpleNamespace

import pytest
import torch

from rlhf import ppo, rubric
from rlhf.config import REWARD_DESIGNS, override
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


@pytest.mark.parametrize("design", REWARD_DESIGNS)
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
        tokenizer=tokenizer,
        eos_id=eos_id,
    )
    judges = {"judge": JUDGE, **{f"judge-{m + 1}": s for m, s in enumerate(MEMBERS)}}
    monkeypatch.setattr(ppo, "reward_scores", lambda role, batch: torch.tensor(judges[role], dtype=torch.float32))
    roles = SimpleNamespace(judge="judge", members=["judge-1", "judge-2", "judge-3"])
    changes = {("ppo", "reward_design"): design, ("ppo", "ensemble_lambda"): LAM}
    if design == "standardised-judge":
        changes |= {("ppo", "score_mean"): MEAN, ("ppo", "score_sd"): SD}
    cfg = override(embedded_profile, changes).ppo
    paid = ppo.PAY[design](roles, answers, cfg)
    assert paid.paid.tolist() == pytest.approx(by_hand(design), abs=1e-6)
    assert paid.score.tolist() == JUDGE  # the judge's own score is recorded under every design
