"""DPO and GRPO as frontier arms (rlhf.studies.frontier.methods) on the small frontier's two
seeds: each trained from the seed's SFT (GRPO paid by the seed's judge), measured on validation at
its own points (DPO's epochs, GRPO's checkpoint iterations), and summarised beside a PPO arm, with
the corpus's evaluation view refusing every call (nothing reads a test prompt); a GRPO arm killed
mid-run continues from its checkpoint to the same actor."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.xdist_group("frontier")]

SEEDS = ("seed-0", "seed-1")


def method_arms():
    from rlhf.studies.frontier.arms import SPEC_KL, Arm

    return (
        Arm("spec-default", "judge", raw=SPEC_KL),  # measured by the small frontier, copied
        Arm("dpo-b0.1", "judge", raw=SPEC_KL, method="dpo", method_settings=(("beta", 0.1), ("epochs", 2))),
        Arm("grpo-g2", "judge", raw=SPEC_KL, method="grpo", method_settings=(("group_size", 2),)),
    )


@pytest.fixture(scope="module")
def method_study(small_frontier, tmp_path_factory):
    from conftest import small_frontier_settings
    from rlhf.corpus import Corpus, EvaluationView
    from rlhf.studies.frontier.measure import run_arm
    from rlhf.studies.frontier.selection import collect

    out, _ = small_frontier
    study = tmp_path_factory.mktemp("methods") / "study"
    for seed in SEEDS:
        shutil.copytree(out / seed, study / seed, ignore=lambda d, names: ["arms"] if d == str(out / seed) else [])
        shutil.copytree(out / seed / "arms" / "spec-default", study / seed / "arms" / "spec-default")
    settings = dataclasses.replace(small_frontier_settings(), arms=method_arms())

    def refuse(*args, **kwargs):
        raise PermissionError("a method arm read the evaluation view (test prompts)")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Corpus, "evaluation_view", refuse)
        mp.setattr(EvaluationView, "__init__", refuse)
        for seed in SEEDS:
            for arm in settings.arms[1:]:
                run_arm(study / seed, arm, "r002", settings, log=False)
        summary = collect([study / s for s in SEEDS], settings)
    return study, settings, summary


def test_each_method_is_measured_at_its_own_points_beside_ppo(method_study):
    study, _, summary = method_study
    arms = summary["arms"]
    assert [r["iteration"] for r in arms["spec-default"]["curve"]] == [0, 2, 4]
    assert [r["iteration"] for r in arms["dpo-b0.1"]["curve"]] == [0, 1, 2]  # epochs
    assert [r["iteration"] for r in arms["grpo-g2"]["curve"]] == [0, 2, 4]  # iterations
    assert arms["dpo-b0.1"]["method"] == "dpo" and arms["dpo-b0.1"]["method_settings"] == {"beta": 0.1, "epochs": 2}
    assert "method" not in arms["spec-default"]  # a PPO arm's record is as it was
    for name in ("dpo-b0.1", "grpo-g2"):
        for row in arms[name]["curve"]:
            assert row["gold"]["n"] == 2
        for seed in SEEDS:
            folder = study / seed / "arms" / name
            m = json.loads((folder / "validation" / "iter-0002.json").read_text())
            assert m["iteration"] == 2 and 0.0 <= m["gold"] <= 1.0 and m["d"] >= 0.0
    # The curve's numbers are the seeds' own measurements.
    per_seed = [json.loads((study / s / "arms" / "grpo-g2" / "validation" / "iter-0004.json").read_text())["gold"]
                for s in SEEDS]  # fmt: skip
    assert arms["grpo-g2"]["curve"][-1]["gold"]["mean"] == pytest.approx(sum(per_seed) / 2, abs=1e-12)


def test_each_method_trains_what_it_declares_from_the_seeds_sft(method_study):
    """DPO: 2 epochs of the judge's cut budget (its updates per epoch) at beta 0.1, the first update's loss
    log 2 (the policy starts as its reference, the seed's SFT); GRPO: the profile's 4 iterations
    of 2 prompts x 2 answers, paid by the seed's judge. Each keeps a checkpoint at its measured
    points and the seconds of each epoch or iteration."""
    import math

    from rlhf.config import load_profile

    study, _, _ = method_study
    for seed in SEEDS:
        dpo = study / seed / "arms" / "dpo-b0.1" / "dpo"
        history = json.loads((dpo / "history.json").read_text())
        cut = load_profile(str(study / seed / "arms" / "dpo-b0.1" / "profile.toml")).judge.max_updates_per_epoch
        assert cut and len(history["epochs"]) == 2 and len(history["updates"]) == 2 * cut
        assert history["updates"][0]["loss"] == pytest.approx(math.log(2), rel=1e-6)
        assert sorted(p.name for p in (dpo / "checkpoints").iterdir() if p.name.endswith(".gz")) == ["0001.pt.gz"]
        assert len(json.loads((dpo / "timings.json").read_text())["per_epoch"]) == 2
        grpo = study / seed / "arms" / "grpo-g2" / "grpo"
        its = json.loads((grpo / "history.json").read_text())["iterations"]
        assert [len(it["prompt_ids"]) for it in its] == [2] * 4 and all(len(it["rewards"]) == 4 for it in its)
        names = sorted(p.name for p in (grpo / "checkpoints").iterdir() if p.name.endswith(".gz"))
        assert names == ["0002.pt.gz"]  # the measured points but the last (the final state)
        assert len(json.loads((grpo / "timings.json").read_text())["per_iteration"]) == 4


def test_a_killed_grpo_arm_continues_from_its_checkpoint_to_the_same_actor(method_study, tmp_path):
    """The GRPO arm run again in a copy of seed 0, killed (SIGKILL) in its 4th iteration: a rerun
    continues from the checkpoint at iteration 2 and ends with the uninterrupted arm's actor."""
    from rlhf.roles import fingerprint
    from rlhf.studies.frontier.runs import actor_at, arm_context

    study, _, _ = method_study
    seed = tmp_path / "seed-0"
    shutil.copytree(study / "seed-0", seed, ignore=shutil.ignore_patterns("arms"))
    arm = method_arms()[2]
    code = (
        "import sys; from conftest import small_frontier_settings; import dataclasses;"
        "from tests_heldout.test_frontier_methods import method_arms;"
        "from rlhf.studies.frontier.measure import run_arm;"
        "s = dataclasses.replace(small_frontier_settings(), arms=method_arms());"
        f"run_arm({str(seed)!r}, s.arms[2], 'r002', s, measure=False, log=False)"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "RLHF_CRASH_AT": "grpo.iteration@4"}
    killed = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (seed / "arms" / arm.name / "grpo" / "state.pt.gz").exists()
    env.pop("RLHF_CRASH_AT")
    again = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    resumed = actor_at(arm_context(seed, arm, "r002"), 4, arm)
    whole = actor_at(arm_context(study / "seed-0", arm, "r002"), 4, arm)
    assert fingerprint(resumed)["learned_sha256"] == fingerprint(whole)["learned_sha256"]


def test_an_arm_declares_a_known_method_and_only_its_own_settings():
    from rlhf.studies import StudyError
    from rlhf.studies.frontier.arms import Arm, Settings, settings_of

    with pytest.raises(StudyError, match="one of ppo, dpo, grpo, not 'kto'"):
        Arm("x", "judge", raw=0.02, method="kto")
    with pytest.raises(StudyError, match="a dpo arm declares beta, epochs, not group_size"):
        Arm("x", "judge", raw=0.02, method="dpo", method_settings=(("group_size", 2),))
    with pytest.raises(StudyError, match="a ppo arm declares nothing, not beta"):
        Arm("x", "judge", raw=0.02, method_settings=(("beta", 0.1),))
    # recorded and read back as declared; a PPO arm's record keeps no method key
    settings = Settings(arms=method_arms())
    record = settings.record()
    assert "method" not in record["arms"][0] and record["arms"][1]["method"] == "dpo"
    assert settings_of({"settings": json.loads(json.dumps(record))}) == settings


def test_compare_methods_declares_its_arms_from_the_committed_choice():
    from pathlib import Path

    from rlhf.studies import compare_methods

    root = Path(__file__).resolve().parents[1]
    choice = json.loads((root / "results" / "choice-r002" / "choice.json").read_text())
    declared = compare_methods.declaration(choice, "results/choice-r002/choice.json")
    assert declared["arms"] == ["spec-default", choice["chosen"]["arm"], "oracle", "dpo-b0.1", "dpo-b0.5", "grpo"]
    assert declared["sft_recipe"] == choice["declared"]["sft_recipe"] and "test" not in declared["reads"]


def test_compare_methods_declares_its_arms_from_a_committed_frontier_and_its_confirmations_seed_count():
    from pathlib import Path

    from rlhf.studies import StudyError, compare_methods

    root = Path(__file__).resolve().parents[1]
    path = "results/frontier-r001/frontier.json"
    frontier = json.loads((root / path).read_text())
    declared = compare_methods.declaration(frontier, str(root / path))
    assert declared["arms"] == ["spec-default", frontier["selection"]["arm"], "oracle", "dpo-b0.1", "dpo-b0.5", "grpo"]
    assert declared["arms"][1] == "c2" and declared["revision"] == "r001" and declared["sft_recipe"] == "sft-e7"
    assert declared["frontier_commit"] == json.loads((root / "results/frontier-r001/study.json").read_text())["commit"]
    # the confirmation on test takes the frontier's own confirmation's seed count (5), not the r002 answer's
    methods = {"best": {"dpo": {"arm": "dpo-b0.1", "iteration": 3}, "grpo": {"arm": "grpo", "iteration": 10}},
               "declared": {**declared, "frontier": path}, "ran_with": {"commit": "c" * 40}}  # fmt: skip
    confirm = compare_methods.confirm_declaration(
        methods, "m.json", str(root / "results/frontier-r001/confirmation-study.json")
    )
    assert confirm["seeds_as"] == "results/frontier-r001/confirmation-study.json" and confirm["seeds"] == 5
    assert confirm["revision"] == "r001" and confirm["sft_recipe"] == "sft-e7"
    with pytest.raises(StudyError, match="study seed 7"):
        compare_methods.declaration({**frontier, "study": {**frontier["study"], "study_seed": 7}}, path)
    with pytest.raises(StudyError, match="neither a choice record"):
        compare_methods.declaration({"steps": []}, "x.json")


@pytest.mark.parametrize("record", ["results/choice-r002/choice.json", "results/frontier-r001/frontier.json"])
def test_compare_methods_runs_the_declared_arms_on_the_declared_testbed(record, tmp_path, monkeypatch):
    from rlhf.studies import compare_methods
    from rlhf.studies.frontier import study

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)  # the records name their sources from the repository root
    ran = {}

    def run_frontier(folder, **kw):
        ran.update(kw)
        raise RuntimeError("measured no further")

    monkeypatch.setattr(study, "run_frontier", run_frontier)
    with pytest.raises(RuntimeError, match="measured no further"):
        compare_methods.compare_methods(record, tmp_path / "out", workers=1, say=lambda _: None)
    declared = json.loads((tmp_path / "out" / "study.json").read_text())["identity"]
    assert [a.name for a in ran["settings"].arms] == declared["arms"]
    assert (ran["revision"], ran["sft_budget"], ran["n"]) == (declared["revision"], declared["sft_recipe"], 3)
    assert ran["study_seed"] == study.STUDY_SEED


def _curve(*golds_by_iteration):
    return [{"iteration": it, "gold": {"mean": g}, "d": {"mean": 0.1 * it}} for it, g in golds_by_iteration]


def test_each_methods_best_point_and_its_share_of_the_oracles_gain_by_hand():
    from rlhf.studies.compare_methods import best_points

    seeds_sft = [0.5, 0.7]

    def seeds(arm, per_iteration):  # per seed: points with gains over that seed's SFT
        return [{"arm": arm, "points": [{"iteration": it, "gain": g[k] - seeds_sft[k]} for it, g in per_iteration]}
                for k in range(2)]  # fmt: skip

    golds = {
        "spec-default": [(10, [0.4, 0.6]), (20, [0.3, 0.5])],
        "chosen": [(10, [0.6, 0.7]), (20, [0.6, 0.8])],
        "oracle": [(10, [0.7, 0.9])],
        "dpo-b0.1": [(1, [0.55, 0.75]), (2, [0.5, 0.7])],
        "grpo": [(10, [0.6, 0.6])],
    }
    arms = {
        name: {"design": "oracle" if name == "oracle" else "judge", "curve": _curve(*((it, sum(g) / 2) for it, g in v)),
               **({"method": name.split("-")[0]} if name in ("dpo-b0.1", "grpo") else {})}
        for name, v in golds.items()
    }  # fmt: skip
    per_seed = [{"arms": {}} for _ in range(2)]
    for name, v in golds.items():
        for k, s in enumerate(seeds(name, v)):
            per_seed[k]["arms"][name] = {"points": s["points"]}
    best = best_points({"arms": arms, "seeds": per_seed})
    assert (best["ppo"]["arm"], best["ppo"]["iteration"]) == ("chosen", 20)
    assert best["ppo"]["gain_over_sft"]["per_seed"] == pytest.approx([0.1, 0.1])
    assert best["oracle"]["gain_over_sft"]["mean"] == pytest.approx(0.2)
    assert best["dpo"]["arm"] == "dpo-b0.1" and best["dpo"]["iteration"] == 1
    assert best["dpo"]["gain_over_sft"]["mean"] == pytest.approx(0.05)
    assert best["dpo"]["share_of_oracle_gain"] == pytest.approx(0.25)
    assert best["grpo"]["gain_over_sft"]["per_seed"] == pytest.approx([0.1, -0.1])


def test_each_arms_cost_is_read_from_its_timings(method_study):
    from rlhf.studies.compare_methods import costs

    study, _, summary = method_study
    got = costs(study, ["spec-default", "dpo-b0.1", "grpo-g2"], summary)
    epochs = [json.loads((study / s / "arms" / "dpo-b0.1" / "dpo" / "timings.json").read_text())["per_epoch"]
              for s in SEEDS]  # fmt: skip
    assert got["dpo-b0.1"]["seconds_per_epoch"] == pytest.approx(sum(sum(e) for e in epochs) / 4)
    files = [study / s / "arms" / "grpo-g2" / "grpo" / "timings.json" for s in SEEDS]
    its = [row for f in files for row in json.loads(f.read_text())["per_iteration"]]
    assert got["grpo-g2"]["seconds_per_iteration"] == pytest.approx(sum(r["iteration"] for r in its) / len(its))
    assert "critic_update" not in got["grpo-g2"]["phases"] and "critic_update" in got["spec-default"]["phases"]
    assert got["grpo-g2"]["iterations"] == 8 and got["spec-default"]["method"] == "ppo"


def test_reproduce_refuses_one_seed_of_a_study_with_arms_at_the_grids_best(small_frontier, tmp_path):
    """The small frontier's ensemble arm takes c from the grid's best over both seeds: one seed
    alone cannot redo it, and nothing is written."""
    from rlhf.studies import StudyError
    from rlhf.studies.reproduce import reproduce

    out, _ = small_frontier
    with pytest.raises(StudyError, match="grid's best c, which needs every seed's grid"):
        reproduce(out, 0, tmp_path / "work")
    assert not (tmp_path / "work").exists()


def test_the_methods_confirmation_declares_from_the_methods_record_and_the_answers_seed_count():
    from pathlib import Path

    from rlhf.config import load_profile
    from rlhf.studies import compare_methods
    from rlhf.studies.derivation import check_study_seed

    root = Path(__file__).resolve().parents[1]
    record = {
        "best": {"dpo": {"arm": "dpo-b0.5", "iteration": 2}, "grpo": {"arm": "grpo", "iteration": 40}},
        "declared": {"sft_recipe": "sft-demos6", "revision": "r002", "profile": "embedded",
                     "arms": ["spec-default", "standardised-judge", "oracle", "dpo-b0.1", "dpo-b0.5", "grpo"]},
        "ran_with": {"commit": "c" * 40},
    }  # fmt: skip
    declared = compare_methods.confirm_declaration(record, "m.json", str(root / compare_methods.VERDICT_STUDY))
    verdict = json.loads((root / compare_methods.VERDICT_STUDY).read_text())["identity"]
    assert declared["seeds"] == verdict["power"]["seeds"] == 15
    assert declared["points"] == {"dpo": {"arm": "dpo-b0.5", "iteration": 2}, "grpo": {"arm": "grpo", "iteration": 40},
                                  "default": {"arm": "spec-default", "iteration": 100}}  # fmt: skip
    assert set(declared["comparisons"]) == {
        "dpo_minus_sft",
        "dpo_minus_default",
        "grpo_minus_sft",
        "grpo_minus_default",
    }
    assert declared["study_seed"] == compare_methods.CONFIRM_STUDY_SEED
    check_study_seed(load_profile("embedded"), declared["study_seed"])
    assert declared["methods_commit"] == "c" * 40 and "test prompts" in declared["reads"]


def test_a_method_arms_point_is_read_on_test_from_its_own_actor(method_study, tmp_path):
    """confirm_seed on a copy of seed 0 for the DPO arm after epoch 1 and the GRPO arm after
    iteration 2: each test file holds that method's actor's answers (not PPO's, not SFT's), and the
    per-seed table reads them."""
    from rlhf.studies import heldout
    from rlhf.studies.frontier.confirmation import confirm_seed, test_file
    from rlhf.studies.frontier.runs import actor_at, arm_context
    from rlhf.studies.verdict import success_table

    study, settings, _ = method_study
    seed = tmp_path / "seed-0"
    shutil.copytree(study / "seed-0", seed)
    dpo, grpo = settings.arms[1], settings.arms[2]
    confirm_seed(seed, ((dpo, 1), (grpo, 2)), "r002", log=False)
    points = {"dpo": heldout.Point(dpo.name, 1), "grpo": heldout.Point(grpo.name, 2)}
    table = success_table([seed], points)
    for arm, it in ((dpo, 1), (grpo, 2)):
        rec = json.loads(test_file(seed, arm, it).read_text())
        assert rec["arm"] == arm.name and rec["iteration"] == it
        assert table[arm.name.split("-")[0]] == [rec["metrics"]["ppo"]["test"]["rubric_success"]]
    # the DPO point's answers are its own actor's: generated again from actor_at, the first test answer matches
    import torch

    from rlhf.studies.frontier.confirmation import generate_heldout

    ctx = arm_context(seed, dpo, "r002")
    with torch.no_grad():
        rows = generate_heldout(actor_at(ctx, 1, dpo).model, ctx)
    first = next(r for r in rows if r["population"] == "test")
    committed = next(
        r for r in json.loads(test_file(seed, dpo, 1).read_text())["ppo_rows"] if r["population"] == "test"
    )
    assert first["response"] == committed["response"]


def test_every_study_draws_its_seeds_from_a_study_seed_of_its_own():
    """The study seeds of docs/studies.md's table, one per study: two studies that shared one would
    train the same seeds and call them fresh."""
    from rlhf.studies import choice, compare_methods, nested, room, seeds, verdict
    from rlhf.studies.frontier import confirmation, study

    used = {
        "rlhf seeds": 0,
        "rlhf frontier": study.STUDY_SEED,
        "the frontier's confirmation": confirmation.CONFIRM_STUDY_SEED,
        "rlhf confirm-oracle": room.ROOM_STUDY_SEED,
        "rlhf choose-design's estimation": choice.ESTIMATION_STUDY_SEED,
        "rlhf confirm-design": verdict.VERDICT_STUDY_SEED,
        "rlhf nested": nested.NESTED_STUDY_SEED,
        "rlhf confirm-oracle --replicate": room.REPLICATION_STUDY_SEED,
        "rlhf confirm-methods": compare_methods.CONFIRM_STUDY_SEED,
    }
    assert len(set(used.values())) == len(used), used
    assert seeds.run_study.__kwdefaults__["study_seed"] == used["rlhf seeds"]
    table = (Path(__file__).resolve().parents[1] / "docs" / "studies.md").read_text()
    for name, seed in used.items():
        assert f"| {seed} |" in table, (name, seed)


def test_a_study_with_method_arms_names_the_command_that_runs_them():
    from rlhf.studies.frontier.arms import Settings
    from rlhf.studies.frontier.study import frontier_command, study_identity

    identity = study_identity("embedded", "r002", 3, "sft-demos6", Settings(arms=method_arms()), 1)
    assert (
        frontier_command(Path("D"), identity)
        == "no rlhf frontier command runs DPO or GRPO arms (rlhf compare-methods does)"
    )
    ppo_only = study_identity("embedded", "r002", 3, "sft-demos6", Settings(arms=method_arms()[:1]), 1)
    assert "rlhf compare-methods" not in frontier_command(Path("D"), ppo_only)


def test_a_method_arm_counts_as_trained_once_its_final_state_is_written(tmp_path):
    """A rerun of a study skips a DPO or GRPO arm whose final state is on disk, and trains one that
    stopped before it (its checkpoints alone do not count)."""
    from rlhf.studies.frontier.arms import Arm
    from rlhf.studies.frontier.measure import arm_trained
    from rlhf.studies.frontier.methods import FINAL

    for method in ("dpo", "grpo"):
        arm = Arm(f"{method}-x", "judge", raw=0.02, method=method)
        folder = tmp_path / "arms" / arm.name / method
        folder.mkdir(parents=True)
        (folder / "checkpoint-0001.pt.gz").write_bytes(b"")
        assert not arm_trained(tmp_path, arm)
        (folder / FINAL).write_bytes(b"")
        assert arm_trained(tmp_path, arm)


def test_a_stopped_study_says_what_was_saved_and_how_to_continue():
    from rlhf.checkpoint import Interrupted
    from rlhf.studies import stopped_error

    err = stopped_error("each running arm")
    assert isinstance(err, Interrupted)
    assert str(err) == (
        "stopped on request: each running arm saved a checkpoint or had not started. "
        "Run the same command again to continue"
    )
