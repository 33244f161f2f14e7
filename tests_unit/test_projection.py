"""The dry run's cost model (rlhf.projection), its numbers recomputed by hand from made-up
clocks and timings: a leg's fit, the legs `rlhf lab` runs, each stage's projection and the whole.

The projection of a real miniature against the run it projects: tests_unit/test_benchmarks_lab.py
(the embedded lab, measured beside its dry run) and tests_unit/test_qwen_full_width.py (the
full-width dry run's projection.json recomputed from what it measured)."""

from __future__ import annotations

import math

import pytest

from rlhf import projection
from rlhf.config import load_profile

pytestmark = pytest.mark.unit


def test_a_leg_is_fitted_as_median_unit_after_the_first_median_validation_and_the_rest():
    # units done: 1 (first: 5 s, its warm-up), 2 (1.0), validation (2.0), 3 (1.2), 4 (0.8), validation (2.2)
    clock = [[5.0, 1], [6.0, 2], [8.0, 2], [9.2, 3], [10.0, 4], [12.2, 4]]
    fit = projection.fit_leg(clock, seconds=13.0)
    assert fit["units"] == 4 and fit["validations"] == 2
    assert fit["per_unit"] == pytest.approx(1.0)  # median of 1.0, 1.2, 0.8: the first (5.0) left out
    assert fit["per_validation"] == pytest.approx(2.1)
    assert fit["fixed"] == pytest.approx(13.0 - 4 * 1.0 - 2 * 2.1)
    with pytest.raises(ValueError, match="at least 2 updates"):
        projection.fit_leg([[1.0, 1]], seconds=2.0)


def test_a_ppo_leg_has_no_validation():
    fit = projection.fit_leg([[3.0, 1], [4.0, 2], [5.5, 3]], seconds=6.0)
    assert (fit["per_unit"], fit["per_validation"], fit["validations"]) == (1.25, None, 0)
    assert fit["fixed"] == pytest.approx(6.0 - 3 * 1.25)


def test_the_legs_of_rlhf_lab_follow_the_spec_protocol():
    """SFT and the judge stop after epoch 1, PPO at iteration 40 of 100 (SPEC §7); the lab runs
    the boundary leg, the resumed leg and the continuous leg; without the protocol one leg."""
    qwen, embedded = load_profile("qwen2.5-0.5b"), load_profile("embedded")
    assert projection.leg_plan(qwen, "sft", True) == [
        {"units": 21, "validations": 1},
        {"units": 42, "validations": 2},
        {"units": 63, "validations": 3},
    ]
    assert projection.leg_plan(qwen, "judge", True) == [
        {"units": 105, "validations": 1},
        {"units": 105, "validations": 1},
        {"units": 210, "validations": 2},
    ]
    assert projection.leg_plan(qwen, "ppo", True) == [
        {"units": 40, "validations": 0},
        {"units": 60, "validations": 0},
        {"units": 100, "validations": 0},
    ]
    assert [leg["units"] for leg in projection.leg_plan(embedded, "sft", True)] == [21, 399, 420]
    assert projection.leg_plan(embedded, "ppo", False) == [{"units": 100, "validations": 0}]
    # a long SFT schedule (6 demonstrations, 420 one-update epochs) validates on 20 epochs, not 420
    from rlhf.config import override

    long = override(embedded, {("sft", "epochs"): 420, ("sft", "demonstration_stride"): 28})
    assert [leg["validations"] for leg in projection.leg_plan(long, "sft", True)] == [0, 20, 20]


def test_a_training_stage_is_stage_fixed_plus_each_legs_fixed_units_and_validations():
    qwen = load_profile("qwen2.5-0.5b")
    fit = {"per_unit": 0.1, "per_validation_batch": 0.05, "fixed": 2.0, "stage_fixed": 3.0}
    got = projection.project_training(fit, qwen, "sft", protocol=True)
    batches = math.ceil(180 / 16)  # the 180 validation examples in batches of 16
    legs = [(21, 1), (42, 2), (63, 3)]
    want = 3.0 + sum(2.0 + units * 0.1 + epochs * 0.05 * batches for units, epochs in legs)
    assert got["projected_s"] == pytest.approx(want)
    assert got["per_validation_s"] == pytest.approx(0.05 * batches)
    ppo = projection.project_training({**fit, "per_unit": 0.5}, qwen, "ppo", protocol=True, extra_per_unit=0.25)
    assert ppo["projected_s"] == pytest.approx(3.0 + 3 * 2.0 + 200 * 0.75)


def test_with_the_legs_side_by_side_a_stage_takes_the_longer_of_its_two_processes():
    """Boundary and resumed legs in one process, the continuous leg in the other: stage fixed +
    max(boundary + resumed, continuous). PPO's 40 + 60 iterations against 100: the first process
    carries one leg's fixed cost more, so it is the longer one."""
    qwen = load_profile("qwen2.5-0.5b")
    fit = {"per_unit": 0.5, "per_validation_batch": 0.05, "fixed": 2.0, "stage_fixed": 3.0}
    side = projection.project_training(fit, qwen, "ppo", protocol=True, side_by_side=True)
    assert side["projected_s"] == pytest.approx(3.0 + max((2.0 + 40 * 0.5) + (2.0 + 60 * 0.5), 2.0 + 100 * 0.5))
    alone = projection.project_training(fit, qwen, "ppo", protocol=False, side_by_side=True)
    assert alone["projected_s"] == pytest.approx(3.0 + 2.0 + 100 * 0.5)  # no protocol: one leg, nothing beside
    sft = projection.project_training(fit, qwen, "sft", protocol=True, side_by_side=True)
    batches = math.ceil(180 / 16)
    one, two, whole = (2.0 + units * 0.5 + epochs * 0.05 * batches for units, epochs in [(21, 1), (42, 2), (63, 3)])
    assert sft["projected_s"] == pytest.approx(3.0 + max(one + two, whole))


def test_the_evaluation_grows_each_part_by_its_own_count():
    seconds = {
        "load_roles": 1.0,
        "politeness": 0.5,
        "bootstrap": 0.25,
        "sft_generation": 2.0,
        "ppo_generation": 3.0,
        "sft_scoring": 0.4,
        "ppo_scoring": 0.6,
        "sft_rubric": 0.1,
        "ppo_rubric": 0.1,
        "judge_test_accuracy": 0.2,
    }
    measured = {"seconds": seconds, "rows": 18, "probe_answers": 8, "pairs": 10, "tokens": 2}
    got = projection.project_evaluation(measured, decode_step=0.01, full_tokens=64, scoring_step=0.002, judge_row=0.004)
    batches = math.ceil(260 / 32)  # 260 rows per policy in batches of 32; the miniature's 18 rows: 1 batch
    assert got["fixed_s"] == pytest.approx(1.25)  # loading and the bootstrap
    assert got["politeness_s"] == pytest.approx(0.5 + (80 - 8) * 0.004)  # 72 more probe answers at the judge's rate
    assert got["sft_generation_s"] == pytest.approx(batches * (2.0 + 62 * 0.01))
    assert got["ppo_generation_s"] == pytest.approx(batches * (3.0 + 62 * 0.01))
    # per row as measured (0.5 s for 18 rows), and 62 more tokens per answer: 260 / 32 batch-loads x 62 steps
    assert got["sft_scoring_s"] == pytest.approx(0.5 * 260 / 18 + 260 / 32 * 62 * 0.002)
    assert got["ppo_scoring_s"] == pytest.approx(0.7 * 260 / 18 + 260 / 32 * 62 * 0.002)
    assert got["judge_test_accuracy_s"] == pytest.approx(0.2 + 2 * 170 * 0.004)  # 170 more pairs, 2 answers each
    parts = ("fixed_s", "politeness_s", "sft_generation_s", "ppo_generation_s", "sft_scoring_s", "ppo_scoring_s")
    assert got["projected_s"] == pytest.approx(sum(got[k] for k in parts) + got["judge_test_accuracy_s"])


def test_the_audit_adds_the_full_sets_pairs_at_the_judges_rate_and_keeps_the_rest():
    """The miniature scored 46 pairs (10 of 180 test pairs in four sets, 6 in the fifth); the full
    audit scores 46 x 18 = 828, so 782 pairs more, 2 answers each."""
    got = projection.project_audit({"seconds": 3.0, "scoring_seconds": 2.0, "audit_pairs": 46, "pairs": 10}, 0.004)
    assert got["fixed_s"] == pytest.approx(1.0)
    assert got["scoring_s"] == pytest.approx(2.0 + 2 * 782 * 0.004)
    assert got["projected_s"] == pytest.approx(1.0 + 2.0 + 2 * 782 * 0.004)


def test_the_judges_rate_per_answer_is_its_validation_batch_over_its_32_answers():
    measured = {"stages": {"judge": {"per_validation_batch": 0.128}}}
    assert projection.judge_row_seconds(measured) == pytest.approx(0.004)  # 16 pairs, chosen and rejected


def test_the_lab_is_the_sum_of_its_stages():
    qwen = load_profile("qwen2.5-0.5b")
    fit = {"per_unit": 0.1, "per_validation_batch": 0.05, "fixed": 2.0, "stage_fixed": 3.0}
    measured = {
        "stages": {"sft": fit, "judge": fit, "ppo": fit},
        "ppo_rollout_tokens": 8,
        "decode_step": {"ppo": 0.002, "evaluation": 0.003},
        "evaluation": {
            "seconds": dict.fromkeys(
                (
                    "load_roles",
                    "politeness",
                    "bootstrap",
                    "sft_generation",
                    "ppo_generation",
                    "sft_scoring",
                    "ppo_scoring",
                    "sft_rubric",
                    "ppo_rubric",
                    "judge_test_accuracy",
                ),
                0.1,
            ),
            "rows": 18,
            "probe_answers": 8,
            "pairs": 10,
            "tokens": 2,
        },
        "scoring_step": {"evaluation": 0.001, "ppo": 0.004},
        "shortcut_audit": {"seconds": 1.0, "scoring_seconds": 0.5, "audit_pairs": 46, "pairs": 10},
        "report_s": 0.7,
        "setup_s": 4.0,
    }
    lab = projection.project_lab(measured, qwen)
    stages = lab["stages"]
    # 56 more rollout tokens, each a decode step and a step of PPO's passes
    assert stages["ppo"]["per_unit_s"] == pytest.approx(0.1 + (64 - 8) * (0.002 + 0.004))
    # the evaluation's scoring reads the evaluation's step, not PPO's
    scoring = 0.2 * 260 / 18 + 260 / 32 * (64 - 2) * 0.001
    assert stages["evaluate"]["sft_scoring_s"] == pytest.approx(scoring)
    assert lab["lab_s"] == pytest.approx(sum(s["projected_s"] for s in stages.values()))
    assert set(stages) == {"sft", "judge", "ppo", "evaluate", "shortcut_audit", "report", "setup"}
    assert stages["report"]["projected_s"] == 0.7 and stages["setup"]["projected_s"] == 4.0


def test_the_decode_step_is_the_difference_of_two_lengths_over_their_difference_in_tokens(monkeypatch):
    """A generation of n new tokens costs, on a made-up clock, a call's fixed 5 s, a prefill of 2 s
    and 0.1 s a step: the step is (7 + 2.4 - (7 + 0.8)) / (24 - 8) = 0.1, where a whole
    generation over its tokens would say (7 + 2.4) / 24 = 0.39."""
    import torch

    from rlhf import generate

    now = [0.0]
    calls = []

    def fake_generate(model, prompts, *, max_new_tokens, eos_id, **kwargs):
        assert eos_id == -1  # no EOS: every step runs
        calls.append(max_new_tokens)
        now[0] += 5.0 + 2.0 + 0.1 * max_new_tokens

    monkeypatch.setattr(generate, "generate", fake_generate)
    monkeypatch.setattr(projection.time, "perf_counter", lambda: now[0])
    step = projection.decode_step_seconds(
        torch.nn.Linear(2, 2), [[1, 2, 3]], pad_id=0, greedy=True, last_logits_only=False, repeats=2, budget_s=100.0
    )
    assert step == pytest.approx(0.1)
    assert calls == [8, 24, 24, 8, 8]  # one warm-up call of the short length, then each length twice
    # calls of 7.8 and 9.4 s: within a 3-second budget each length is called once, the same step
    calls.clear()
    step = projection.decode_step_seconds(
        torch.nn.Linear(2, 2), [[1, 2, 3]], pad_id=0, greedy=True, last_logits_only=False, repeats=3, budget_s=3.0
    )
    assert step == pytest.approx(0.1) and calls == [8, 24, 8]


def test_the_scoring_step_is_the_difference_of_two_answer_lengths_over_their_difference_in_tokens(monkeypatch):
    """Scoring a batch whose answers have n tokens costs, on a made-up clock, a call's fixed 3 s,
    the prompts' 1 s and 0.05 s an answer token: the step is (4 + 2.0 - (4 + 0.4)) / (40 - 8) =
    0.05, where a whole scoring over its answer tokens would say 6 / 40 = 0.15."""
    now = [0.0]
    lengths = []

    def score(batch):
        n = int(batch.response_mask.sum(dim=1)[0])
        lengths.append(n)
        now[0] += 3.0 + 1.0 + 0.05 * n

    monkeypatch.setattr(projection.time, "perf_counter", lambda: now[0])
    step = projection.scoring_step_seconds(score, [[1, 2, 3], [4, 5]], pad_id=0, token_id=7, repeats=2, budget_s=9.0)
    assert step == pytest.approx(0.05)
    assert lengths == [8, 40, 40, 8, 8]  # one warm-up call of the short length, then each length twice
    # the budget counts each length's own calls: the long one's 6 + 6 s reach 9 s after two calls,
    # the short one's 4.4 + 4.4 s do not, so it gets its third
    lengths.clear()
    projection.scoring_step_seconds(score, [[1, 2, 3], [4, 5]], pad_id=0, token_id=7, repeats=3, budget_s=9.0)
    assert lengths == [8, 40, 40, 8, 8, 8]


def test_ppo_passes_run_each_role_a_ppo_iteration_runs_and_move_no_weight(
    embedded_profile, embedded_dir, embedded_base, monkeypatch
):
    """The PPO scoring step times `ppo_passes`: reference, judge and critic once, then actor and
    critic forward and backward once per update, as rlhf.ppo.rollout and ppo_update do; the
    gradients are dropped and no weight moves (the dry run's roles are the trained ones)."""
    import torch

    from rlhf.miniature import ppo_passes
    from rlhf.roles import PpoRoles, fingerprint, new_role
    from rlhf.tokens import collate

    roles = PpoRoles(
        **{kind: new_role(kind, embedded_profile, embedded_dir) for kind in ("actor", "reference", "critic", "judge")},
        members=(),
    )
    roles.reference.freeze()
    roles.judge.freeze()
    import rlhf.roles
    import rlhf.scoring

    kinds = {id(role.model): kind for kind, role in roles.by_kind().items()} | {
        id(role): kind for kind, role in roles.by_kind().items()
    }
    calls: dict[str, int] = {}
    for module, name in (
        (rlhf.scoring, "response_logprobs"),
        (rlhf.roles, "reward_scores"),
        (rlhf.roles, "critic_values"),
    ):

        def counted(who, *args, _fn=getattr(module, name), **kw):
            calls[kinds[id(who)]] = calls.get(kinds[id(who)], 0) + 1
            return _fn(who, *args, **kw)

        monkeypatch.setattr(module, name, counted)
    before = {k: fingerprint(r)["learned_sha256"] for k, r in roles.by_kind().items()}
    tok = embedded_base.tokens
    batch = collate([[5, 6, 7], [8, 9]], [[tok.eos_id] * 4, [tok.eos_id] * 4], tok.pad_id)
    ppo_passes(roles, batch, updates=2)
    assert calls == {"reference": 1, "judge": 1, "critic": 1 + 2, "actor": 2}
    assert {k: fingerprint(r)["learned_sha256"] for k, r in roles.by_kind().items()} == before
    learned = [p for kind in ("actor", "critic") for p in roles.by_kind()[kind].learned_parameters()]
    assert learned and all(p.grad is None for p in learned)
    assert all(p.requires_grad for p in learned)  # the backward passes were real: the roles learn
    assert torch.is_grad_enabled()
