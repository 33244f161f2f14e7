"""The two reward designs that keep the judge in distribution, run through PPO.

* The iterated judge (rlhf.refresh), from the r001 lab's trained SFT and judge (the session's
  `lab_run`, read only), 5 PPO iterations with a refresh after every 2: a subprocess runs the
  PPO stage with the interrupt/resume protocol (boundary 3: the interrupted leg ends after one
  refresh, the resumed leg makes the next) and is killed during a refresh of its continuous
  leg; the same command continues it, and the protocol requires the continuous leg's final
  state to equal the resumed one's, tensor by tensor. So one run shows a resume across a
  refresh and a crash inside one, both bit-identical. The judge changes at refreshes and only
  there.
* A judge ensemble (worst case of 3 judges) on the small budget: its other members trained from
  their own seeds, the reward paid the minimum of the members' scores, every member frozen.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from rlhf import lab, rubric
from rlhf.checkpoint import load_state
from rlhf.config import PROFILE_DIR, load_profile, profile_text_with
from rlhf.io import read_json
from rlhf.roles import fingerprint, load_role

pytestmark = [pytest.mark.unit, pytest.mark.xdist_group("designs")]

ITERATED = {
    ("ppo", "reward_design"): "iterated-judge",
    ("ppo", "iterations"): 5,
    ("ppo", "resume_stop_iteration"): 3,
    ("ppo", "checkpoint_every"): 1,
    ("ppo", "refresh_every"): 2,
    ("ppo", "refresh_prompts"): 16,
    ("ppo", "refresh_updates"): 2,
}
# The PPO stage of a run folder that starts from another run's SFT and judge (as a frontier arm does).
PPO_FROM = """
import sys
from rlhf import lab
from rlhf.config import load_profile
from rlhf.corpus import load_corpus
src, out, profile = sys.argv[1:4]
ctx = lab.Context(out, load_profile(profile), f"{src}/base_model", load_corpus(f"{src}/corpus"), trained_in=src)
lab.check_run_record(ctx)
lab.stage_ppo(ctx)
"""


def ppo_from(src, out, profile, crash_at=None):
    env = {k: v for k, v in os.environ.items() if k != "RLHF_CRASH_AT"}
    if crash_at:
        env["RLHF_CRASH_AT"] = crash_at
    cmd = [sys.executable, "-c", PPO_FROM, str(src), str(out), str(profile)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def iterated(lab_run, tmp_path_factory):
    """The iterated-judge run, killed at the first judge update of its continuous leg's first
    refresh (the 5th refresh update of the process: 2 per refresh, after iterations 2 (interrupted
    leg) and 4 (resumed leg)), then continued by the same command."""
    folder = tmp_path_factory.mktemp("iterated")
    profile = folder / "embedded-iterated.toml"
    profile.write_text(profile_text_with((PROFILE_DIR / "embedded.toml").read_text(), "embedded-iterated", ITERATED))
    run = folder / "run"
    killed = ppo_from(lab_run.run, run, profile, crash_at="ppo.refresh_update@5")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (run / "ppo" / "resume_check.json").exists()
    assert (run / "ppo" / "state-resumed.pt.gz").is_file()  # both earlier legs were done
    again = ppo_from(lab_run.run, run, profile)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "continuous run continues from its checkpoint continuous-0001" in again.stdout
    return {"src": lab_run.run, "run": run, "profile": load_profile(str(profile)), "lab_run": lab_run}


def test_an_iterated_judge_run_resumed_across_refreshes_and_killed_in_one_equals_the_uninterrupted(iterated):
    check = read_json(iterated["run"] / "ppo" / "resume_check.json")
    assert check["identical"] is True and check["boundary"] == 3
    assert check["sha256_resumed"] == check["sha256_continuous"]
    # The states compared hold the refreshed judge and what refreshes carry.
    state = load_state(iterated["run"] / "ppo" / "state-continuous.pt.gz")
    assert {"reward", "refresh"} <= set(state) and len(state["refresh"]["pairs"]) > 0


def test_the_judge_changes_at_each_refresh_and_only_there(iterated):
    """The judge in the continuous leg's checkpoints after iterations 1..4 and in its final state:
    the trained judge until the refresh after 2, a new judge from there to the refresh after 4,
    another after it (no refresh after the last iteration, 5)."""
    run, ctx = iterated["run"], iterated["lab_run"]  # the same base model: roles to load the judge into
    trained = ctx.role("judge")
    load_role(trained, iterated["src"] / "judge" / "judge.safetensors")
    start = fingerprint(trained, frozen=False)["learned_sha256"]

    def judge_after(n):
        path = run / "ppo" / ("state-continuous.pt.gz" if n == 5 else f"checkpoints/continuous-{n:04d}.pt.gz")
        role = ctx.role("judge")
        role.load_learned_state(load_state(path)["reward"])
        return fingerprint(role, frozen=False)["learned_sha256"]

    seen = [judge_after(n) for n in range(1, 6)]
    assert seen[0] == start  # after iteration 1: no refresh yet
    assert seen[1] != seen[0]  # refreshed after 2
    assert seen[2] == seen[1]  # 3: unchanged
    assert seen[3] != seen[2]  # refreshed after 4
    assert seen[4] == seen[3]  # 5, the last: no refresh
    h = read_json(run / "ppo" / "history.json")
    assert [r["after_iteration"] for r in h["refreshes"]] == [2, 4]
    fp = read_json(run / "ppo" / "fingerprints.json")
    assert fp["before"]["judge"]["learned_sha256"] == start != fp["after"]["judge"]["learned_sha256"]
    assert fp["before"]["reference"] == fp["after"]["reference"]
    assert (run / "ppo" / "judge.safetensors").is_file()  # the judge as last refreshed


def test_each_refresh_records_the_labelled_pairs_and_the_judges_accuracy_on_them(iterated):
    h = read_json(iterated["run"] / "ppo" / "history.json")
    for r in h["refreshes"]:
        assert r["answers"] == 2 * r["prompts"] == 2 * iterated["profile"].ppo.refresh_prompts
        assert 0 <= r["new_pairs"] <= r["prompts"] and r["updates"] == 2 and len(r["losses"]) == 2
        assert set(r["finish_reasons"]) == set(rubric.FINISH_REASONS)  # each reason counted, zeros included
        assert sum(r["finish_reasons"].values()) == r["answers"] and r["finish_reasons"]["out_of_vocabulary"] == 0
        assert r["without_eos"] >= r["finish_reasons"]["length"]  # a cut answer with a token fault is named by it
        if r["new_pairs"]:
            assert 0.0 <= r["accuracy_before"] <= 1.0 and 0.0 <= r["accuracy_after"] <= 1.0
    assert h["refreshes"][1]["pairs_so_far"] == h["refreshes"][0]["new_pairs"] + h["refreshes"][1]["new_pairs"]
    # Paid is the (refreshed) judge's score, recorded as such.
    assert all(i["reward_design"] == "iterated-judge" and i["paid_scores"] == i["scores"] for i in h["iterations"])


def test_the_lab_default_is_untouched_by_the_designs(lab_run):
    """SPEC §6's path: no refresh, no ensemble, nothing added to its history (and so its state)."""
    h = read_json(lab_run.run / "ppo" / "history.json")
    assert "refreshes" not in h
    assert not any({"reward_design", "paid_scores", "member_scores"} & set(i) for i in h["iterations"])
    state = load_state(lab_run.run / "ppo" / "state-continuous.pt.gz")
    assert "refresh" not in state


@pytest.fixture(scope="module")
def ensemble(small_profile_file, tmp_path_factory):
    """`rlhf lab --reward-design ensemble-min` on the small budget with 3 judges, up to PPO."""
    from rlhf.config import override

    profile = override(
        load_profile(str(small_profile_file)), {("ppo", "reward_design"): "ensemble-min", ("ppo", "ensemble_size"): 3}
    )
    ctx = lab.open_context(tmp_path_factory.mktemp("ensemble") / "run", profile)
    lab.run_stages(ctx, protocol=False, until="ppo")
    return ctx


def test_an_ensemble_trains_its_other_members_from_their_own_seeds(ensemble):
    run = ensemble.run
    files = [run / s / "judge.safetensors" for s in ("judge", "judge-1", "judge-2")]
    assert len({f.read_bytes() for f in files}) == 3
    assert lab.member_stages(ensemble.profile) == ["judge-1", "judge-2"]
    seeds = [lab.member_profile(ensemble.profile, m).seeds for m in (1, 2)]
    assert [s.judge_lora for s in seeds] == [
        ensemble.profile.seeds.judge_lora + 1,
        ensemble.profile.seeds.judge_lora + 2,
    ]
    assert {"judge-1", "judge-2"} <= set(read_json(run / "run.json")["stages"])


def test_an_ensembles_worst_case_reward_is_paid_and_its_members_stay_frozen(ensemble):
    h = read_json(ensemble.run / "ppo" / "history.json")
    for it in h["iterations"]:
        members = torch.tensor(it["member_scores"])  # [3, B]
        assert members.shape == (3, len(it["scores"])) and it["reward_design"] == "ensemble-min"
        assert it["member_scores"][0] == it["scores"]  # member 0 is the lab's judge
        assert it["paid_scores"] == members.min(dim=0).values.tolist()
    fp = read_json(ensemble.run / "ppo" / "fingerprints.json")
    for kind in ("judge", "judge-1", "judge-2", "reference"):
        assert fp["before"][kind] == fp["after"][kind], kind
    identity = read_json(ensemble.run / "ppo" / "state-continuous.pt.gz.json")["identity"]
    assert len(identity["judge_members"]) == 2
