"""The embedded lab's 100-iteration PPO run (session fixture `lab_run`): SPEC §6 counts,
frozen roles, moving roles, phase timings, and the recorded behaviour-vs-teacher-forced check."""

import pytest

from rlhf.io import read_json
from rlhf.ppo import PHASES

pytestmark = pytest.mark.unit


def test_one_hundred_iterations_400_responses_200_updates_each(lab_run, record_result):
    h = read_json(lab_run.run / "ppo" / "history.json")
    its = h["iterations"]
    assert len(its) == 100
    assert sum(len(i["scores"]) for i in its) == 400 == len(h["consumed"]) == len(set(h["consumed"]))
    assert sum(len(i["policy_loss"]) for i in its) == 200
    assert sum(len(i["value_loss"]) for i in its) == 200
    rollout_ids = {r["document_id"] for r in lab_run.corpus.learning_view().rollout_prompts()}
    assert set(h["consumed"]) <= rollout_ids
    record_result("ppo_mean_judge_score_first_10", sum(i["mean_score"] for i in its[:10]) / 10)
    record_result("ppo_mean_judge_score_last_10", sum(i["mean_score"] for i in its[-10:]) / 10)
    record_result("ppo_truncations", sum(i["truncations"] for i in its))
    record_result("ppo_mean_response_length", sum(i["response_length"] for i in its) / 100)


@pytest.mark.parametrize(
    "stage,key,peak_key",
    [
        ("sft", "lr", ("sft", "lr")),
        ("judge", "lr", ("judge", "lr")),
        ("ppo", "actor_lr", ("ppo", "actor_lr")),
        ("ppo", "critic_lr", ("ppo", "critic_lr")),
    ],
)
def test_every_stage_ran_the_seeds_schedule(lab_run, stage, key, peak_key):
    """The rates the four stages actually used (their histories), at the seed's boundaries:
    first update peak/warm, update warm-1 and update warm at the peak, the last at 10%."""
    h = read_json(lab_run.run / stage / "history.json")
    if stage == "ppo":
        lrs = [lr for i in h["iterations"] for lr in i[key]]
    else:
        lrs = [u[key] for u in h["updates"]]
    peak = getattr(getattr(lab_run.profile, peak_key[0]), peak_key[1])
    total = len(lrs)
    warm = max(1, int(0.1 * total))
    assert total == {"sft": 420, "judge": 210, "ppo": 200}[stage]
    assert lrs[0] == pytest.approx(peak / warm, rel=1e-12)
    assert lrs[warm - 1] == peak and lrs[warm] == peak and lrs[warm + 1] < peak
    assert lrs[-1] == pytest.approx(0.1 * peak, rel=1e-12)
    assert lrs[warm + 1] == pytest.approx(peak * (1 - 0.9 / (total - warm - 1)), rel=1e-12)


def test_reference_and_judge_frozen_actor_and_critic_changed(lab_run):
    fp = read_json(lab_run.run / "ppo" / "fingerprints.json")
    before, after = fp["before"], fp["after"]
    for kind in ("reference", "judge"):
        assert before[kind] == after[kind]
    for kind in ("actor", "critic"):
        assert before[kind]["learned_sha256"] != after[kind]["learned_sha256"]
        assert before[kind]["frozen_sha256"] == after[kind]["frozen_sha256"]


def test_phase_timings_and_memory_are_recorded(lab_run, record_result):
    t = read_json(lab_run.run / "ppo" / "timings.json")
    assert set(PHASES) <= set(t["total"]) and len(t["per_iteration"]) == 100
    assert all(t["total"][k] > 0 for k in PHASES)
    assert t["memory"]["peak_rss_mib"] > 0
    record_result("ppo_phase_seconds", {k: round(v, 2) for k, v in t["total"].items()})
    record_result("ppo_peak_rss_mib", round(t["memory"]["peak_rss_mib"], 1))


def test_behaviour_logprobs_kept_and_teacher_forced_difference_recorded(lab_run, record_result):
    h = read_json(lab_run.run / "ppo" / "history.json")
    check = h["scoring_check"]
    assert check["iteration"] == 0 and check["tokens"] > 0 and check["use_cache"] is True
    record_result("behaviour_vs_teacher_forced_before_first_update", check)
    assert check["max_abs_diff"] < 1e-3
    view = h["token_views"][0]["tokens"]
    assert {"token", "logp_old", "logp_ref", "kl_reward", "value", "advantage", "return"} <= set(view[0])


def test_no_whitening_between_judge_and_losses(lab_run):
    """Advantages are GAE of the raw rewards: recompute from the stored per-token view."""
    import torch

    from rlhf import ppo_math

    for tv in read_json(lab_run.run / "ppo" / "history.json")["token_views"]:
        rows = tv["tokens"]
        rewards = torch.tensor([r["reward"] for r in rows])
        values = torch.tensor([r["value"] for r in rows])
        dones = torch.zeros(len(rows), dtype=torch.bool)
        dones[-1] = True
        adv, ret = ppo_math.gae(rewards, values, dones, gamma=1.0, lam=0.95)
        assert torch.allclose(adv, torch.tensor([r["advantage"] for r in rows]), atol=1e-5)
        assert torch.allclose(ret, torch.tensor([r["return"] for r in rows]), atol=1e-5)
        assert rewards[-1] == pytest.approx(tv["score"] + rows[-1]["kl_reward"] - (0 if tv["ended"] else 1), abs=1e-5)
