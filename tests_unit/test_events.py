"""TensorBoard event files (rlhf.events), read back by TensorBoard's own reader.

Every scalar a stage logs must equal the number its JSON keeps at the same step. The expected
series are written out from the JSON (history.json, evaluation/results.json) by hand in
conftest.py (`ppo_expected` and its siblings), not by calling rlhf.events' name functions, so
that a wrong name, a wrong step or a wrong formula in the writer is caught. The kill-and-rerun
case (one series, no step twice, none missing) is in tests_reproducibility/test_crash.py; a
study's series per seed and arm in tests_heldout/test_frontier.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (
    PPO_PHASES,
    assert_series_equal,
    epoch_stage_expected,
    evaluation_expected,
    ppo_expected,
    read_series,
    read_texts,
)
from rlhf import rubric
from rlhf.io import read_json

pytestmark = pytest.mark.unit


def check_run_events(run: Path, ppo_cfg) -> dict[str, int]:
    """Every stage's event folder of a finished run against its JSON; returns scalars compared per stage."""
    root = run / "tensorboard"
    counts = {}
    for stage in ("sft", "judge"):
        counts[stage] = assert_series_equal(
            read_series(root / stage), epoch_stage_expected(read_json(run / stage / "history.json")), stage
        )
    history = read_json(run / "ppo" / "history.json")
    got = read_series(root / "ppo")
    timing = {t: got.pop(t) for t in list(got) if t.startswith("timing_s/")}
    counts["ppo"] = assert_series_equal(got, ppo_expected(history, ppo_cfg.kl_coef, ppo_cfg.truncation_penalty), "ppo")
    # The leg's own clock: one positive duration per phase and iteration (in no JSON the run keeps).
    iterations = [r["iteration"] + 1 for r in history["iterations"]]  # iteration k (from 1) at step k
    assert sorted(timing) == sorted(f"timing_s/{p}" for p in PPO_PHASES)
    for tag, points in timing.items():
        assert [s for s, _ in points] == iterations and all(v > 0 for _, v in points), (tag, points)
    results = read_json(run / "evaluation" / "results.json")
    counts["evaluation"] = assert_series_equal(
        read_series(root / "evaluation"), evaluation_expected(results, len(iterations)), "evaluation"
    )
    texts = read_texts(root / "evaluation")["eval/answers/text_summary"]
    assert [s for s, _ in texts] == [0, len(iterations)]
    for (_, text), policy in zip(texts, ("sft", "ppo")):
        first_test = next(r for r in results["policies"][policy]["rows"] if r["population"] == "test")
        assert first_test["document_id"] in text and policy.upper() in text
    return counts


def test_every_logged_scalar_equals_its_json_at_the_same_step(small_run, record_result):
    """The small lab (interrupt/resume protocol: its series are written by the interrupted leg
    and continued by the resumed one) read back by TensorBoard's reader."""
    counts = check_run_events(small_run.run, small_run.profile.ppo)
    assert all(n > 0 for n in counts.values()), counts
    assert sorted(p.name for p in (small_run.run / "tensorboard").iterdir()) == ["evaluation", "judge", "ppo", "sft"]
    record_result("scalars_compared", counts)


def test_the_series_is_one_per_stage_though_three_legs_trained(small_run):
    """The continuous leg, which only checks the resumed one, writes nothing: each stage's steps
    appear once. A PPO leg that starts from a state opens its file at that state's step."""
    ppo = read_series(small_run.run / "tensorboard" / "ppo")
    iterations = small_run.profile.ppo.iterations
    assert [s for s, _ in ppo["objective/sampled_log_ratio"]] == list(range(1, iterations + 1))
    files = sorted((small_run.run / "tensorboard" / "ppo").glob("events.out.tfevents.*"))
    assert len(files) == 2, files  # the interrupted leg's and the resumed leg's


def _lab(run: Path, profile) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlhf", "lab", "--out", str(run), "--profile", str(profile)],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("blocker", ["tensorboard", "tensorboard/ppo"])
def test_an_event_folder_that_cannot_be_written_is_refused_before_anything_is_written(
    tmp_path, small_profile_file, blocker
):
    """A run folder whose event folder (or a stage's) is a file: one line naming it and the
    problem, a non-zero exit, and the run folder exactly as it was."""
    run = tmp_path / "run"
    (run / blocker).parent.mkdir(parents=True, exist_ok=True)
    (run / blocker).write_text("not a folder\n")
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    done = _lab(run, small_profile_file)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"rlhf lab: error: cannot write TensorBoard event files in {run / blocker}: it is a file, not a folder"
    ]
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before


def test_a_copied_run_with_its_event_folder_read_only_is_refused(small_run, tmp_path):
    """A run continued where its event folder cannot take files (a read-only copy): refused by
    the check before anything is written (as root, which writes anywhere, the check is shown on a
    folder swapped for a file instead)."""
    import os

    from rlhf.events import EventFolderError, check_writable

    run = tmp_path / "run"
    shutil.copytree(small_run.run / "tensorboard", run / "tensorboard")
    check_writable(run)  # a writable one passes
    if os.geteuid() == 0:
        shutil.rmtree(run / "tensorboard" / "sft")
        (run / "tensorboard" / "sft").write_text("")
        expected = "it is a file, not a folder"
    else:
        (run / "tensorboard").chmod(0o555)
        expected = "Permission denied"
    with pytest.raises(EventFolderError, match=expected):
        check_writable(run)


def test_the_purge_step_hides_what_a_killed_leg_wrote_past_its_checkpoint(tmp_path):
    """The mechanism the resume relies on, alone: a leg killed after writing steps 0..4, whose
    last saved state was at step 3, is continued by a leg that starts from that state; the
    reader shows steps 0..5 once each, with the continued leg's values from step 3 on."""
    from rlhf.events import EventLog

    history = {"updates": [], "epochs": []}
    first = EventLog(tmp_path, "sft", None)
    for step in range(5):
        history["updates"].append({"step": step, "epoch": 0, "loss": float(step), "lr": 0.1, "grad_norm": 1.0})
        first.sync(step + 1, 6, history)
    first.close()  # killed here: steps 3 and 4 are past the last state
    state = {"step": 3, "history": {"updates": history["updates"][:3], "epochs": []}}
    resumed_history = {"updates": list(state["history"]["updates"]), "epochs": []}
    second = EventLog(tmp_path, "sft", state)
    for step in range(3, 6):
        resumed_history["updates"].append({"step": step, "epoch": 0, "loss": 10.0 + step, "lr": 0.1, "grad_norm": 1.0})
        second.sync(step + 1, 6, resumed_history)
    second.close()
    loss = read_series(tmp_path / "tensorboard" / "sft")["train/loss"]
    assert loss == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0), (5, 15.0)]


def test_scalar_names_follow_the_group_metric_convention_and_the_docs_table():
    """Every name the writer can log is `group/metric` and is in docs/tensorboard.md's table."""
    from rlhf import events, signals

    table = (Path(__file__).parents[1] / "docs" / "tensorboard.md").read_text()
    record = {
        "scores": [1.0, 3.0],
        "paid_scores": [1.0, 2.0],
        "mean_score": 2.0,
        "mean_sequence_log_ratio": 0.5,
        "mean_sampled_log_ratio": 0.1,
        "mean_kl_penalty": -0.01,
        "entropy": 1.0,
        "update_shift": [0.0, 0.1],
        "clip_fraction": [0.0, 0.5],
        "policy_loss": [0.1, 0.2],
        "value_loss": [1.0, 2.0],
        "mean_value": 0.0,
        "mean_advantage": 0.0,
        "mean_return": 0.0,
        "response_length": 10.0,
        "truncations": 1,
        "actor_lr": [1e-4, 1e-4],
        "critic_lr": [1e-3, 1e-3],
        "actor_grad_norm": [1.0, 1.0],
        "critic_grad_norm": [1.0, 1.0],
    }
    scalars = events.iteration_scalars(record)
    assert scalars["objective/scores"] == 2.0 and scalars["response_length/clip_ratio"] == 0.5
    names = [
        *scalars,
        *events.reward_scalars({"non_score_reward": 0.0, "rlhf_reward": 0.0}),
        *events.update_scalars({"loss": 1, "lr": 1, "grad_norm": 1, "accuracy": 1, "tokens": 1}),
        *events.epoch_scalars({"train_loss": 1, "validation_loss": 1, "train_accuracy": 1, "validation_accuracy": 1}),
        *events.refresh_scalars({"new_pairs": 1, "pairs_so_far": 1, "accuracy_before": 0.5, "accuracy_after": 0.6}),
        *(events.TIMING_GROUP + p for p in PPO_PHASES),
        *events.signal_scalars({name: [1.0] for name in signals.SIGNALS}, 0),
    ]
    for name in names:
        assert "/" in name, name
        assert f"`{name}`" in table, f"{name} is not in docs/tensorboard.md"
    reasons = dict.fromkeys(rubric.FINISH_REASONS, 0)
    pop = {"n_rows": 2, "rubric_success": 1, "uncertified": 0, "without_eos": 0, "finish_reasons": reasons}
    evaluation = events.evaluation_scalars({"test": {**pop, "mean_learned_reward": 0, "mean_length": 1}})
    for name in evaluation:
        assert f"`{name.replace('eval/test/', 'eval/POPULATION/')}`" in table, name
    validation = events.validation_scalars(
        {"n": 2, "gold": 1, "proxy": 0, "kl": 0, "d": 0, "truncations": 0, "uncertified": 0}
    )
    for name in validation:
        assert f"`{name}`" in table, name


def _synthetic_iteration(i: int) -> dict:
    """A PPO history record with every field the event log and the signals read (values vary
    with i): an ensemble-mean design's iteration, whose paid scores are its two members' mean."""
    scores = [0.5 * i + k - 1.5 + (0.3 * i if k == 3 else 0.0) for k in range(4)]
    return {
        "iteration": i,
        "scores": scores,
        "paid_scores": [s + 0.05 * i for s in scores],
        "member_scores": [[s + m for s in scores] for m in (0.0, 0.1 * i)],
        "mean_score": sum(scores) / 4,
        "mean_sequence_log_ratio": 0.02 * i * i,
        "mean_sampled_log_ratio": 0.001 * i,
        "mean_kl_penalty": -0.00002 * i,
        "entropy": 1.0 / (1 + i),
        "advantage_quantiles": [q * (1 + 0.1 * i) for q in range(-5, 6)],
        "update_shift": [1e-4 * i, 2e-4 * i],
        "clip_fraction": [0.01 * i, 0.0],
        "policy_loss": [0.1, 0.2 + i],
        "value_loss": [1.0 + i, 2.0],
        "mean_value": 0.1 * i,
        "mean_advantage": -0.1 * i,
        "mean_return": 0.2 * i,
        "response_length": 10.0 + 3 * i,
        "truncations": i % 3,
        "actor_lr": [1e-4 / (1 + i), 1e-4 / (2 + i)],
        "critic_lr": [1e-3 / (1 + i), 1e-3 / (2 + i)],
        "actor_grad_norm": [1.0, 2.0],
        "critic_grad_norm": [3.0, 4.0],
    }


REWARD_SUMS = ("objective/non_score_reward", "objective/rlhf_reward")  # the rollout's tensors', not the history's


def test_iteration_scalars_equal_their_formulas_recomputed_by_hand():
    """Every PPO scalar of an iteration the history gives against conftest.ppo_expected, which
    writes each formula out from the history by hand (no rlhf.events, no rlhf.ppo_math), in
    float64 before TensorBoard rounds to float32: a changed formula fails here. Every term counts
    in the records: paid scores that differ from the judge's (the synthetic ensemble) and the
    judge's own (the default design, no paid_scores), answers cut and not, each update's values
    different. The two reward sums come from the rollout (test_the_reward_sums_are_the_rollouts_tensors)."""
    from rlhf import events

    records = [_synthetic_iteration(i) for i in range(14)]
    for i in (14, 15, 16):
        default = {k: v for k, v in _synthetic_iteration(i - 13).items() if k != "paid_scores"}
        records.append({**default, "iteration": i})
    expected = ppo_expected({"iterations": records}, 0.02, -1.0)
    assert {r["truncations"] for r in records} == {0, 1, 2}
    for r in records:
        got = events.iteration_scalars(r)
        want = {
            tag: by_step[r["iteration"] + 1]
            for tag, by_step in expected.items()
            if not tag.startswith("signals/") and tag not in REWARD_SUMS
        }
        assert sorted(got) == sorted(want)
        for tag, value in got.items():
            assert value == pytest.approx(want[tag], rel=1e-12, abs=1e-15), (r["iteration"], tag, value, want[tag])


def test_the_reward_sums_are_the_rollouts_tensors():
    """rlhf.ppo.reward_sums on a rollout's penalty and rewards (conftest.rollout_rewards, as a
    rollout makes them): three answers of different lengths, one cut without EOS, padding after
    the shorter ones. Against the sums written out by hand: the padding counts nothing, the paid
    score and the truncation penalty once per answer, the penalty on every active token."""
    from types import SimpleNamespace

    import torch

    from conftest import rollout_rewards
    from rlhf import ppo, ppo_math

    logp_old = torch.tensor([[-1.0, -2.0, -0.5], [-0.25, -1.5, 9.0], [-3.0, 7.0, 7.0]])  # [B=3, R=3]
    logp_ref = torch.tensor([[-1.5, -1.0, -1.0], [-0.75, -1.0, -9.0], [-2.0, -7.0, -7.0]])
    mask = torch.tensor([[True, True, True], [True, True, False], [True, False, False]])
    paid, truncated, beta = torch.tensor([2.0, -1.0, 0.5]), torch.tensor([True, False, False]), 0.1
    rewards = rollout_rewards(logp_old, logp_ref, paid, mask, truncated, kl_coef=beta, truncation_penalty=-1.0)
    penalty = ppo_math.log_ratio_penalty(logp_old, logp_ref, mask, beta)
    got = ppo.reward_sums(SimpleNamespace(penalty=penalty, rewards=rewards))
    log_ratio_sums = [(-1.0 + 1.5) + (-2.0 + 1.0) + (-0.5 + 1.0), (-0.25 + 0.75) + (-1.5 + 1.0), -3.0 + 2.0]
    assert got["non_score_reward"] == pytest.approx(-beta * sum(log_ratio_sums) / 3, rel=1e-6)
    whole = [2.0 - 1.0 - beta * log_ratio_sums[0], -1.0 - beta * log_ratio_sums[1], 0.5 - beta * log_ratio_sums[2]]
    assert got["rlhf_reward"] == pytest.approx(sum(whole) / 3, rel=1e-6)


def test_the_evaluation_logs_one_rate_per_finish_reason():
    """eval/POPULATION/finish_REASON_rate = that reason's count / the population's rows, for every
    reason (zeros included); the truncation rate stays the share without EOS, whatever the reason."""
    from rlhf import events

    counts = {"eos": 5, "length": 1, "control_token": 2, "broken_text": 3, "out_of_vocabulary": 0}
    m = {"n_rows": 11, "rubric_success": 0.4, "uncertified": 6, "without_eos": 3, "finish_reasons": counts}
    scalars = events.evaluation_scalars({"probe_rows": {**m, "mean_learned_reward": 1.0, "mean_length": 9.0}})
    rates = {k.removeprefix("eval/probe_rows/"): v for k, v in scalars.items() if "/finish_" in k}
    assert rates == {f"finish_{r}_rate": counts[r] / 11 for r in rubric.FINISH_REASONS}
    assert scalars["eval/probe_rows/truncation_rate"] == 3 / 11
    assert not any("undecodable" in k for k in scalars)


def _measured(record: dict, kl_coef: float, truncation_penalty: float):
    """What a PPO iteration hands its leg, for a synthetic record: its reward sums by hand (as a
    rollout with those scores, cuts and summed log-ratio sums them) and no phase timed."""
    from rlhf.ppo import Measured

    n, paid = len(record["scores"]), record.get("paid_scores", record["scores"])
    kl = record["mean_sequence_log_ratio"]
    rewards = {
        "non_score_reward": -kl_coef * kl,
        "rlhf_reward": (sum(paid) + truncation_penalty * record["truncations"]) / n - kl_coef * kl,
    }
    return Measured({}, rewards)


def test_every_signal_is_logged_at_its_iteration_as_the_run_goes(tmp_path):
    """A 14-iteration synthetic PPO history fed to the event log one iteration at a time, as
    PPO's progress callback does (a refresh after iteration 6, an ensemble's member scores):
    every signal defined at an iteration is logged there with the value the signals give on the
    whole history; the ones not yet defined are absent. The small lab's 4 iterations are too few
    for the 5-iteration windows, so this is where the signals' curves are checked."""
    from rlhf import signals
    from rlhf.events import EventLog

    history: dict = {"iterations": [], "refreshes": []}
    log = EventLog(tmp_path, "ppo", None)
    for i in range(14):
        history["iterations"].append(_synthetic_iteration(i))
        if i + 1 == 6:
            history["refreshes"].append(
                {
                    "after_iteration": 6,
                    "new_pairs": 4,
                    "pairs_so_far": 4,
                    "accuracy_before": 0.25,
                    "accuracy_after": 1.0,
                }
            )
        log.sync(i + 1, 14, history, _measured(history["iterations"][-1], 0.02, -1.0))
    log.close()
    got = read_series(tmp_path / "tensorboard" / "ppo")
    assert_series_equal(got, ppo_expected(history, 0.02, -1.0), "synthetic ppo")
    window = signals.frozen_rules()[1]
    # at the iteration counted from 1: the first full window ends at iteration `window`
    assert [s for s, _ in got["signals/kl"]] == list(range(window, 15))
    assert [s for s, _ in got["signals/kl_growth"]] == list(range(2 * window, 15))
    assert [s for s, _ in got["signals/judge_error"]] == list(range(6, 15))
    assert got["signals/judge_error"][0][1] == 0.75
    assert "signals/ensemble_disagreement" in got


def test_signals_computed_from_an_iteration_on_equal_the_whole_series_there():
    """The event log asks rlhf.signals only for the iterations it has not written (`since`): on
    the synthetic history, every value from there on equals the whole series', none before."""
    from rlhf import signals

    history = {
        "iterations": [_synthetic_iteration(i) for i in range(14)],
        "refreshes": [{"after_iteration": 6, "accuracy_before": 0.25}],
    }
    whole = signals.signal_series(history, 5)
    for since in (0, 3, 4, 9, 13):
        part = signals.signal_series(history, 5, since=since)
        for name, values in whole.items():
            assert part[name][since:] == values[since:], (name, since)
            assert all(v is None for v in part[name][:since]), (name, since)


def test_the_printed_tensorboard_command_runs_as_printed(tmp_path, monkeypatch):
    """The first line `rlhf lab` prints names a TensorBoard that runs without activating any
    environment: from a folder outside this one, the command as printed answers --version_tb."""
    import shlex
    import subprocess

    from rlhf.events import logdir_line

    monkeypatch.chdir(tmp_path)
    line = logdir_line(tmp_path / "tb")
    command = line.removeprefix("curves, live while it runs: ")
    assert command.endswith(f"--logdir {tmp_path / 'tb'}")
    argv = shlex.split(command.removesuffix(f" --logdir {tmp_path / 'tb'}"))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no venv on PATH
    done = subprocess.run([*argv, "--version_tb"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
