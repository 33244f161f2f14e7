"""Crash-safe runs: a killed `rlhf lab` continues on rerun, bit for bit.

The lab runs in a subprocess on the small budget (conftest.SMALL_BUDGET: every stage and
every leg of the interrupt/resume protocol in about 20 seconds). One run folder is killed again
and again, each time at another place, and rerun with the same command:

  1. Ctrl-C (SIGINT) during SFT        -> exit 130, a checkpoint, a message saying how to continue
  2. SIGKILL during SFT                -> in the resumed leg (its 2nd update)
  3. SIGKILL during the judge          -> in the continuous leg's second epoch (after a checkpoint)
  4. SIGKILL during PPO                -> writing the resumed leg's first checkpoint (its
                                          iteration already in the event file), then in the
                                          continuous leg's second iteration
  5. SIGKILL in the middle of writing a state file (PPO's final continuous state: half its
     bytes in the temporary file)
  6. SIGKILL during the evaluation     -> after the SFT policy, before the PPO policy
  7. SIGKILL in the middle of writing report.md (results.json already written)
  8. a clean rerun finishes; a further rerun recomputes nothing

The training curves must be those of the uninterrupted run too: TensorBoard's reader, which
applies each resumed leg's purge step, shows every stage's series with no step twice and none
missing, each value equal.

The kills are placed with `RLHF_CRASH_AT` (rlhf.io.crash_point: the process SIGKILLs itself at
that point, like a power cut). The final states, role files and held-out numbers must equal
those of an uninterrupted run of the same lab (the session's `small_run`, shared with other modules).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import read_series, without_coverage
from rlhf.io import read_json, sha256_file

# One worker runs this module.
pytestmark = [pytest.mark.unit, pytest.mark.xdist_group("crash")]

STAGES = ("sft", "judge", "ppo")
ROLE_FILES = ("sft/actor.safetensors", "judge/judge.safetensors", "ppo/actor.safetensors", "ppo/critic.safetensors")


def lab(run, profile, crash_at=None, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "RLHF_CRASH_AT"}
    if crash_at:
        env["RLHF_CRASH_AT"] = crash_at
        # killed at the crash point: a --cov run's measurement of it would die with it, so none is made
        env = without_coverage(env)
    t = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "rlhf", "lab", "--out", str(run), "--profile", str(profile)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    done.seconds = time.perf_counter() - t
    return done


def outcome(run) -> dict:
    """What must not depend on crashes: final states of every leg, role files, held-out numbers."""
    states = {}
    for stage in STAGES:
        check = read_json(run / stage / "resume_check.json")
        states[stage] = {k: check[k] for k in ("sha256_boundary", "sha256_resumed", "sha256_continuous")}
        assert check["identical"] is True
    ev = read_json(run / "evaluation" / "results.json")
    audit = read_json(run / "shortcut_audit" / "results.json")
    return {
        "states": states,
        "roles": {f: sha256_file(run / f) for f in ROLE_FILES},
        "evaluation": {k: ev[k] for k in ("policies", "judge_test", "differences", "politeness")},
        "audit": {k: audit["counterfactuals"][k]["accuracy"] for k in audit["order"]},
        "stages_complete": sorted(read_json(run / "run.json")["stages"]),
    }


def curves(run) -> dict:
    """Every stage's TensorBoard series as the reader shows them (durations left out: they are
    the clock's); a step written twice would show twice."""
    out = {}
    for stage in (*STAGES, "evaluation"):
        series = read_series(run / "tensorboard" / stage)
        out[stage] = {t: v for t, v in series.items() if not t.startswith("timing_s/")}
        for tag, points in out[stage].items():
            steps = [step for step, _ in points]
            assert len(steps) == len(set(steps)), f"{stage} {tag}: a step twice: {steps}"
    return out


@pytest.fixture(scope="module")
def uninterrupted(small_run):
    """The reference: the session's small-budget lab (conftest `small_run`, `rlhf.lab.run_lab` as
    `rlhf lab` calls it, built once per test run), read only."""
    return {"run": small_run.run, "outcome": outcome(small_run.run), "seconds": small_run.stage_seconds["total"]}


def no_debris(run) -> list[str]:
    """Temporary files, and lab artifacts without their manifest (the base model's own files
    have none: they are checked against base_model/manifest.json)."""
    return [
        str(p.relative_to(run))
        for p in run.rglob("*")
        if p.name.endswith(".tmp")
        or p.name.startswith(".")
        or (
            p.parts[len(run.parts)] != "base_model"
            and p.name.endswith((".pt.gz", ".safetensors"))
            and not p.with_name(p.name + ".json").exists()
        )
    ]


def test_killed_again_and_again_the_lab_finishes_bit_identical(
    uninterrupted, tmp_path, small_profile_file, record_result
):
    run = tmp_path / "crashed"
    seconds = {}

    # 1. Ctrl-C during SFT: a checkpoint at the next boundary, exit 130, how to continue.
    env = {k: v for k, v in os.environ.items() if k != "RLHF_CRASH_AT"}
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlhf", "lab", "--out", str(run), "--profile", str(small_profile_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    for line in proc.stdout:
        if line.startswith("sft: interrupted run"):
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=600)
    seconds["sigint"] = time.perf_counter() - t
    assert proc.returncode == 130, err[-3000:]
    assert "stopped on request" in err and "Run the same command again to continue" in err
    assert (run / "sft" / "state-boundary.pt.gz.json").exists()  # the boundary leg finished and was saved
    assert not (run / "sft" / "state-resumed.pt.gz").exists()

    # 2-7. SIGKILL at six places, then a clean rerun. Each run first says how it continued from
    # the kill before it (printed, flushed, before it was itself killed).
    steps = [
        (
            "sft_update",
            "sft.update@2",
            "sft",
            ("sft: boundary run already complete", "sft: resumed from the saved boundary state"),
        ),
        (
            "judge_update",
            "judge.update@11",
            "judge",
            ("sft: boundary run already complete", "sft: resumed from the saved boundary state"),
        ),
        (
            "ppo_mid_checkpoint",
            "write:resumed-0003.pt.gz",
            "ppo",
            ("sft: already complete", "judge: continuous run continues from its checkpoint continuous-0001.pt.gz"),
        ),
        (
            "ppo_iteration",
            "ppo.iteration@4",
            "ppo",
            (
                "ppo: removed what a crash left half-written",
                "ppo: resumed from the saved boundary state, to the end",
            ),
        ),
        (
            "mid_write_state",
            "write:state-continuous.pt.gz",
            "ppo",
            ("ppo: continuous run continues from its checkpoint continuous-0001.pt.gz",),
        ),
        (
            "evaluation",
            "evaluate.policy@2",
            "evaluate",
            (
                "ppo: removed what a crash left half-written",
                ".state-continuous.pt.gz.",
                "ppo: continuous run continues from its checkpoint continuous-0003.pt.gz",
            ),
        ),
        ("mid_write_report", "write:report.md", "report", ("ppo: already complete", "evaluate: ")),
        ("final_rerun", None, None, ("evaluate: already complete", "shortcut_audit: already complete")),
    ]
    for name, point, stage, says in steps:
        done = lab(run, small_profile_file, crash_at=point)
        seconds[name] = round(done.seconds, 1)
        for line in says:
            assert line in done.stdout, f"{name}: the rerun did not say {line!r}:\n{done.stdout[-3000:]}"
        if point is None:
            assert done.returncode == 0, done.stderr[-3000:]
            break
        assert done.returncode == -signal.SIGKILL, f"{point}: not killed (rc {done.returncode}) {done.stderr[-2000:]}"
        assert stage not in read_json(run / "run.json")["stages"], f"killed in {stage}, yet recorded complete"
        if point.startswith("write:"):
            target = point.split(":", 1)[1]
            folder = run if stage != "ppo" else run / "ppo" / ("checkpoints" if "-0" in target else "")
            assert not (folder / target).exists(), "a half-written file reached its final name"
            assert list(folder.glob(f".{target}.*.tmp")), "the kill did not happen mid-write"
    assert no_debris(run) == []
    got = outcome(run)
    assert got == uninterrupted["outcome"]
    assert curves(run) == curves(uninterrupted["run"])
    assert "curves, live while it runs: " in done.stdout and "tensorboard --logdir" in done.stdout

    # A rerun of a finished run recomputes nothing and changes nothing.
    before = {str(p.relative_to(run)): sha256_file(p) for p in run.rglob("*") if p.is_file()}
    done = lab(run, small_profile_file)
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(f"{s}: already complete" in done.stdout for s in (*STAGES, "evaluate", "shortcut_audit"))
    # and says at start, in one line, whether the golden numbers apply (none for a test profile)
    assert "golden numbers: none for profile embedded-small" in done.stdout, done.stdout[:2000]
    after = {str(p.relative_to(run)): sha256_file(p) for p in run.rglob("*") if p.is_file()}
    assert after == before
    record_result("crash_chain_seconds", seconds)
    record_result("uninterrupted_small_lab_seconds", round(uninterrupted["seconds"], 1))
    record_result("final_state_sha256", got["states"])


def test_a_stage_command_continues_after_a_crash(uninterrupted, tmp_path, small_profile_file):
    """`rlhf sft --run DIR` killed in its continuous leg continues on rerun, like `rlhf lab`."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlhf", "sft", "--run", str(run), "--profile", str(small_profile_file)]
    env = {k: v for k, v in os.environ.items() if k != "RLHF_CRASH_AT"}
    killed = subprocess.run(cmd, capture_output=True, text=True, env={**env, "RLHF_CRASH_AT": "sft.update@11"})
    assert killed.returncode == -signal.SIGKILL
    assert (run / "sft" / "checkpoints" / "continuous-0001.pt.gz.json").is_file()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sft: continuous run continues from its checkpoint continuous-0001.pt.gz" in done.stdout
    check = read_json(run / "sft" / "resume_check.json")
    assert check["sha256_continuous"] == uninterrupted["outcome"]["states"]["sft"]["sha256_continuous"]
    assert sha256_file(run / "sft" / "actor.safetensors") == uninterrupted["outcome"]["roles"]["sft/actor.safetensors"]
    again = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert again.returncode == 0 and "sft: already complete" in again.stdout


def test_a_folder_built_whole_leaves_nothing_when_its_build_fails(tmp_path):
    """rlhf.io.atomic_folder (corpus, embedded base): a failure inside leaves no folder and no
    temporary sibling; success puts the whole folder in place at once."""
    from rlhf.io import atomic_folder, write_text

    with pytest.raises(RuntimeError, match="power cut"):
        with atomic_folder(tmp_path / "corpus") as tmp:
            write_text(tmp / "a.txt", "a")
            raise RuntimeError("power cut")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with atomic_folder(tmp_path / "corpus") as tmp:
        write_text(tmp / "a.txt", "a")
        assert not (tmp_path / "corpus").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["corpus"] and (tmp_path / "corpus" / "a.txt").read_text() == "a"


def test_a_folder_left_by_a_killed_preparation_is_swept_and_the_run_starts(tmp_path, small_profile_file):
    """A SIGKILL during corpus preparation or the base build leaves `.corpus.XXXX` /
    `.base_model.XXXX` beside the run's files: the next open_context removes them and prepares
    afresh (a half-written corpus folder would otherwise make the run refuse to start)."""
    from rlhf import lab
    from rlhf.config import load_profile

    run = tmp_path / "run"
    (run / ".corpus.k1ll3d").mkdir(parents=True)
    (run / ".corpus.k1ll3d" / "inputs.jsonl").write_text("half")
    (run / ".base_model.k1ll3d").mkdir()
    (run / ".run.json.abc.tmp").write_text("{")
    ctx = lab.open_context(run, load_profile(str(small_profile_file)))
    assert sorted(p.name for p in run.iterdir()) == ["base_model", "corpus", "run.json"]
    assert ctx.corpus.summary["pairs"] == 1200
