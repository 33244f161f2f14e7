"""The over-optimisation frontier (SPEC §12): a 2-seed study on the small budget.

The study (`small_frontier`, conftest) is built with the corpus's evaluation view refusing every
call, so its existence proves that nothing on the frontier's path reads a test prompt.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from frontier_checks import FAULTS, confirmation_page_shows, frontier_page_shows, reason_counts

from rlhf.config import load_profile

# One xdist worker runs the frontier's files: the small study is built once, and no worker waits for another's.
pytestmark = [pytest.mark.unit, pytest.mark.xdist_group("frontier")]


def test_the_frontier_writes_each_fits_curve_and_the_page_computes_none(small_frontier):
    """The report reads every number from frontier.json: each fit that describes its points
    carries its curve up to the study's largest d; rlhf.report imports nothing from rlhf.studies."""

    import rlhf
    from rlhf.studies.statistics import gao_curve

    _, result = small_frontier
    bon = result["best_of_n"]
    d_max = max(
        [p["d_bound"] for p in bon["points"]] + [r["d"]["mean"] for a in result["arms"].values() for r in a["curve"]]
    )
    for fit in [a["fit"] for a in result["arms"].values()] + [bon["fit"]]:
        assert "curve" in fit
        assert fit["curve"] == gao_curve(fit, d_max)  # None exactly where it does not describe
    report = Path(rlhf.__file__).parent / "report"
    imports = re.compile(r"^\s*(from rlhf\.studies|import rlhf\.studies|from rlhf import studies)", re.M)
    assert not [p.name for p in report.rglob("*.py") if imports.search(p.read_text())]


def test_small_frontier_has_every_arm_point_and_choice(small_frontier):
    out, result = small_frontier
    assert set(result["arms"]) == {
        "spec-default",
        "c0.05",
        "standardised-judge",
        "oracle",
        "iterated-judge",
        "ensemble-min-cbest",
    }
    assert result["iterations"] == [0, 2, 4]
    for arm in result["arms"].values():
        assert [r["iteration"] for r in arm["curve"]] == [0, 2, 4]
        assert arm["curve"][0]["d"]["mean"] == 0.0 and arm["curve"][0]["gain"]["mean"] == 0.0
        assert all(r["gold"]["n"] == 2 for r in arm["curve"])
    assert [p["n"] for p in result["best_of_n"]["points"]] == [1, 2]
    sel = result["selection"]
    assert sel["arm"] != "oracle" and sel["iteration"] >= 1
    best = max(
        (r["gold"]["mean"], name, r["iteration"])
        for name, arm in result["arms"].items()
        if arm["design"] != "oracle"
        for r in arm["curve"][1:]
    )
    assert sel["mean_validation_gold"] == best[0]
    page = (out / "report.html").read_text()
    assert '<img src="data:image/png;base64,' in page and sel["arm"] in page


def test_an_arm_at_the_grids_best_c_runs_there_after_the_grid(small_frontier):
    """The grid's best c is chosen from the grid arms' validation gold (GRID_RULE), recorded, and
    written into the arm that takes it: its KL coefficient is that c times its seed's spread."""
    out, result = small_frontier
    choice = result["grid_choice"]
    grid = result["arms"]["c0.05"]["curve"][1:]
    best = max(grid, key=lambda r: r["gold"]["mean"])
    assert (choice["c"], choice["arm"]) == (0.05, "c0.05")
    assert (choice["iteration"], choice["mean_validation_gold"]) == (best["iteration"], best["gold"]["mean"])
    arm = result["arms"]["ensemble-min-cbest"]
    assert arm["c"] == 0.05 and arm["c_from_grid"] is True and arm["design"] == "ensemble-min"
    for s in result["seeds"]:
        profile = load_profile(str(out / s["folder"] / "arms" / "ensemble-min-cbest" / "profile.toml"))
        assert profile.ppo.kl_coef == 0.05 * s["sigma_validation"]
        assert (profile.ppo.reward_design, profile.ppo.ensemble_size) == ("ensemble-min", 2)
        # Its PPO started after every grid checkpoint was measured.
        ppo_started = (out / s["folder"] / "arms" / "ensemble-min-cbest" / "run.json").stat().st_mtime
        assert ppo_started > (out / s["folder"] / "arms" / "c0.05" / "validation" / "iter-0004.json").stat().st_mtime
        assert (out / s["folder"] / "judge-1" / "judge.safetensors").is_file()  # the ensemble's other member


def test_the_iterated_judges_refreshes_are_collected_per_seed_and_across(small_frontier):
    out, result = small_frontier
    arm = result["arms"]["iterated-judge"]
    per_seed = [s["arms"]["iterated-judge"]["refreshes"] for s in result["seeds"]]
    assert [[r["after_iteration"] for r in seed] for seed in per_seed] == [[2], [2]]
    (across,) = arm["refreshes"]
    assert across["new_pairs"] == sum(seed[0]["new_pairs"] for seed in per_seed) / 2
    with_pairs = [seed[0] for seed in per_seed if seed[0]["accuracy_before"] is not None]
    assert across["seeds_with_pairs"] == len(with_pairs)
    if with_pairs:
        assert across["accuracy_before"] == sum(r["accuracy_before"] for r in with_pairs) / len(with_pairs)
    for s in result["seeds"]:
        h = json.loads((out / s["folder"] / "arms" / "iterated-judge" / "ppo" / "history.json").read_text())
        assert h["refreshes"][0]["answers"] == 16  # 8 prompts, 2 answers each
    page = (out / "report.html").read_text()
    assert "Judge refreshes" in page and "judge accuracy before" in page


def test_the_study_writes_one_series_per_seed_and_arm_under_the_arms_name(small_frontier):
    """TensorBoard's reader finds, per seed, the seed's SFT and judge (and the ensemble's other
    judge), and per arm its PPO and its validation checkpoints, in folders named by the arm; each
    PPO series equals the arm's history.json (its own beta), refreshes included, and each
    validation series the arm's measurements, with the SFT policy at step 0."""
    from conftest import assert_series_equal, epoch_stage_expected, ppo_expected, read_series

    out, result = small_frontier
    found = sorted(str(p.parent.relative_to(out)) for p in out.rglob("events.out.tfevents.*"))
    want = []
    members = {s["folder"]: sorted(p.name for p in (out / s["folder"]).glob("judge-*")) for s in result["seeds"]}
    assert all(members.values())  # the worst-case ensemble's other judges
    for s in result["seeds"]:
        want += [f"{s['folder']}/tensorboard/{stage}" for stage in ("judge", *members[s["folder"]], "sft")]
        want += [f"{s['folder']}/arms/{a}/tensorboard/{k}" for a in result["arms"] for k in ("ppo", "validation")]
    assert sorted(set(found)) == sorted(want)
    refreshes = 0
    for s in result["seeds"]:
        seed = out / s["folder"]
        for stage in ("sft", "judge", *members[s["folder"]]):
            history = json.loads((seed / stage / "history.json").read_text())
            assert_series_equal(read_series(seed / "tensorboard" / stage), epoch_stage_expected(history), stage)
        sft_point = json.loads((seed / "frontier" / "sft.json").read_text())["iteration_0"]
        for arm in result["arms"]:
            arm_dir = seed / "arms" / arm
            cfg = load_profile(str(arm_dir / "profile.toml")).ppo
            history = json.loads((arm_dir / "ppo" / "history.json").read_text())
            got = read_series(arm_dir / "tensorboard" / "ppo")
            got = {t: v for t, v in got.items() if not t.startswith("timing_s/")}
            assert_series_equal(got, ppo_expected(history, cfg.kl_coef, cfg.truncation_penalty), f"{arm} ppo")
            refreshes += len(got.get("judge_refresh/pairs_so_far", []))
            points = [(0, sft_point)] + [
                (m["iteration"], m) for m in (json.loads(p.read_text()) for p in sorted(arm_dir.glob("validation/*")))
            ]
            expected: dict = {}
            for step, m in points:
                for tag, value in (
                    ("rubric_success", m["gold"]),
                    ("judge_score", m["proxy"]),
                    ("kl_from_sft", m["kl"]),
                    ("sqrt_kl_from_sft", max(m["kl"], 0.0) ** 0.5),
                    ("truncation_rate", m["truncations"] / m["n"]),
                    ("uncertified_rate", m["uncertified"] / m["n"]),
                ):
                    expected.setdefault(f"validation/{tag}", {})[step] = value
            assert_series_equal(read_series(arm_dir / "tensorboard" / "validation"), expected, f"{arm} validation")
    assert refreshes == len(result["seeds"])  # the iterated judge's one refresh per seed


def test_each_arms_best_point_and_share_of_the_oracles_gain_are_the_studys(small_frontier):
    from rlhf.studies.frontier.selection import ORACLE_MIN_GAIN

    _, result = small_frontier
    sft = result["sft_level"]["mean"]
    oracle = result["arms"]["oracle"]["best"]
    for arm in result["arms"].values():
        best = arm["best"]
        top = max(r["gold"]["mean"] for r in arm["curve"][1:])
        assert best["gold"] == top and best["gain"] == top - sft
        row = next(r for r in arm["curve"] if r["iteration"] == best["iteration"])
        assert row["gold"]["mean"] == top and best["d"] == row["d"]["mean"]
        want = best["gain"] / oracle["gain"] if oracle["gain"] >= ORACLE_MIN_GAIN else None
        assert best["share_of_oracle_gain"] == want


def test_kl_coefficient_is_c_times_the_measured_spread(small_frontier):
    out, result = small_frontier
    for s in result["seeds"]:
        sigma = json.loads((out / s["folder"] / "frontier" / "sft.json").read_text())["spread"]["validation"]["sd"]
        assert sigma == s["sigma_validation"] > 0
        profile = load_profile(str(out / s["folder"] / "arms" / "c0.05" / "profile.toml"))
        assert profile.ppo.kl_coef == 0.05 * sigma
        assert load_profile(str(out / s["folder"] / "arms" / "spec-default" / "profile.toml")).ppo.kl_coef == 0.02


def test_kl_estimate_recomputed_from_stored_rows_and_from_the_models(small_frontier):
    from rlhf.studies import validation
    from rlhf.studies.frontier.arms import Arm
    from rlhf.studies.frontier.measure import measurement_seeds
    from rlhf.studies.frontier.runs import actor_at, arm_context, roles_for_measuring

    out, result = small_frontier
    seed_dir = out / "seed-0"
    m = json.loads((seed_dir / "arms" / "spec-default" / "validation" / "iter-0004.json").read_text())
    per_prompt = [r["kl"] for r in m["rows"]]
    assert m["kl"] == pytest.approx(sum(per_prompt) / len(per_prompt), abs=1e-12)
    assert m["d"] == math.sqrt(max(m["kl"], 0.0))
    assert result["seeds"][0]["arms"]["spec-default"]["points"][-1]["kl"] == m["kl"]

    # Independently: draw the same samples, then score them with a plain forward pass of each
    # model over the whole sequence (not rlhf.scoring), summing log pi - log pi_SFT per answer.
    ctx = arm_context(seed_dir, Arm("spec-default", "judge", raw=0.02), "r002")
    actor = actor_at(ctx, 4)
    sft, _ = roles_for_measuring(ctx)
    records = validation.validation_prompts(ctx.corpus.learning_view(), ctx.profile.evaluation.max_units)
    prompt_ids = validation.encode_records(records, ctx)
    gen = torch.Generator().manual_seed(measurement_seeds(ctx.profile)["kl"])
    samples = validation.answers(actor.model, prompt_ids, ctx, gen)
    got = []
    with torch.no_grad():
        for p, r in zip(prompt_ids, samples):
            ids = torch.tensor([p + r])
            total = 0.0
            for model, sign in ((actor.model, 1.0), (sft.model, -1.0)):
                logits = model(input_ids=ids).logits[0, len(p) - 1 : -1].float()
                logits = logits[:, : len(ctx.tokenizer)]  # the softmax over the tokenizer's real tokens
                total += sign * float(torch.log_softmax(logits, -1).gather(1, torch.tensor(r)[:, None]).sum())
            got.append(total)
    assert got == pytest.approx(per_prompt, abs=2e-4)


def test_standardisation_computed_once_recorded_and_applied_to_that_arm_only(small_frontier):
    out, _ = small_frontier
    for seed_dir in sorted(out.glob("seed-*")):
        train = json.loads((seed_dir / "frontier" / "sft.json").read_text())["spread"]["train"]
        assert train["n"] == 672 and train["sd"] > 0
        arm = seed_dir / "arms" / "standardised-judge"
        profile = load_profile(str(arm / "profile.toml"))
        assert (profile.ppo.reward_design, profile.ppo.score_mean, profile.ppo.score_sd) == (
            "standardised-judge",
            train["mean"],
            train["sd"],
        )
        run = json.loads((arm / "run.json").read_text())
        assert run["identity"]["profile"] == profile.name  # declared in the run's identity
        history = json.loads((arm / "ppo" / "history.json").read_text())
        for it in history["iterations"]:
            assert it["reward_design"] == "standardised-judge"
            want = [(s - train["mean"]) / train["sd"] for s in it["scores"]]
            assert it["paid_scores"] == pytest.approx(want, rel=1e-6, abs=1e-6)
        for other in ("spec-default", "c0.05"):
            h = json.loads((seed_dir / "arms" / other / "ppo" / "history.json").read_text())
            assert all("paid_scores" not in it for it in h["iterations"])  # the SPEC's reward, untouched
        oracle = json.loads((seed_dir / "arms" / "oracle" / "ppo" / "history.json").read_text())
        assert all(set(it["paid_scores"]) <= {0.0, 1.0} for it in oracle["iterations"])


def test_rerun_of_a_finished_frontier_recomputes_nothing(small_frontier, tmp_path, monkeypatch):
    from rlhf.studies.frontier import study as frontier_study
    from rlhf.studies.frontier.study import run_frontier

    out, result = small_frontier
    study = tmp_path / "study"
    shutil.copytree(out, study)
    profile = str(out.parent / "embedded-frontier-small.toml")
    before = {p: os.stat(p).st_mtime_ns for p in study.rglob("*") if p.is_file()}

    def no_work(*args, **kwargs):
        raise AssertionError("a finished frontier started work")

    monkeypatch.setattr(frontier_study, "run_tasks", no_work)
    lines = []
    from conftest import small_frontier_settings

    again = run_frontier(
        study, n=2, revision="r002", sft_budget="full", workers=1, profile_name=profile,
        settings=small_frontier_settings(), say=lines.append,
    )  # fmt: skip
    assert again == result and "nothing recomputed" in lines[-1]
    assert {p: os.stat(p).st_mtime_ns for p in study.rglob("*") if p.is_file()} == before


def test_an_interrupted_frontier_recomputes_only_what_is_missing(small_frontier, tmp_path):
    from conftest import small_frontier_settings
    from rlhf.studies.frontier.study import run_frontier

    out, result = small_frontier
    study = tmp_path / "study"
    shutil.copytree(out, study)
    lost = study / "seed-1" / "arms" / "oracle" / "validation" / "iter-0002.json"
    kept = json.loads(lost.read_text())
    for p in (lost, study / "frontier.json", study / "report.html"):
        p.unlink()
    before = {p: os.stat(p).st_mtime_ns for p in study.rglob("*") if p.is_file()}
    again = run_frontier(
        study, n=2, revision="r002", sft_budget="full", workers=1,
        profile_name=str(out.parent / "embedded-frontier-small.toml"), settings=small_frontier_settings(),
        say=lambda line: None,
    )  # fmt: skip
    remeasured = json.loads(lost.read_text())
    assert remeasured.pop("seconds") > 0 and kept.pop("seconds") > 0
    assert remeasured == kept  # the same measurement, every number equal
    changed = {p for p in before if os.stat(p).st_mtime_ns != before[p]}
    assert changed == set()  # nothing else was rewritten
    assert {k: again[k] for k in ("arms", "best_of_n", "selection")} == {
        k: result[k] for k in ("arms", "best_of_n", "selection")
    }


def test_a_changed_setting_is_refused_in_an_existing_study(small_frontier, tmp_path):
    from rlhf.studies import StudyError
    from rlhf.studies.frontier.arms import Settings
    from rlhf.studies.frontier.study import run_frontier

    out, _ = small_frontier
    study = tmp_path / "study"
    shutil.copytree(out, study)
    (study / "frontier.json").unlink()
    with pytest.raises(StudyError, match="refusing to continue"):
        run_frontier(
            study, n=2, revision="r002", sft_budget="full", workers=1,
            profile_name=str(out.parent / "embedded-frontier-small.toml"), settings=Settings(),
            say=lambda line: None,
        )  # fmt: skip


def test_confirmation_needs_the_choice_made_on_validation(tmp_path):
    from rlhf.studies import StudyError
    from rlhf.studies.frontier.confirmation import run_confirmation

    with pytest.raises(StudyError, match="chosen on validation first"):
        run_confirmation(tmp_path / "nothing", n=5)


def test_confirmation_runs_the_choice_the_default_and_the_stopped_default_on_fresh_seeds(
    small_frontier, tmp_path, monkeypatch
):
    from rlhf import signals
    from rlhf.studies.frontier import confirmation
    from rlhf.studies.frontier.arms import SPEC_KL
    from rlhf.studies.frontier.confirmation import STOP_ARM, STOP_SIGNAL, run_confirmation, test_file

    out, result = small_frontier
    study = tmp_path / "study"
    shutil.copytree(out, study)
    # The small budget's 4 iterations are too few for the committed kl_growth rule: a rules file
    # whose kl_growth rule fires at the first iteration with a growth (iteration 1) makes the stop real.
    rules = tmp_path / "warning_rules.json"
    kl_growth = {"signal": STOP_SIGNAL, "threshold": -1e30, "patience": 1}
    frozen = {"format": signals.RULES_FORMAT, "window": 1, "drop_margin": signals.DROP_MARGIN, "rules": [kl_growth]}
    frozen["chosen_on"] = {"study": {"revision": "r002"}}
    rules.write_text(json.dumps(frozen))
    monkeypatch.setattr(signals, "RULES_FILE", rules)  # what PPO stops by
    monkeypatch.setattr(confirmation, "RULES_FILE", rules)  # what the confirmation scores
    record = run_confirmation(study, n=2, workers=1, say=lambda line: None)
    sel = result["selection"]
    want = [("spec-default", 4)] + (
        [] if (sel["arm"], sel["iteration"]) == ("spec-default", 4) else [(sel["arm"], sel["iteration"])]
    )
    assert [(p["arm"], p["iteration"]) for p in record["points"]] == [*want, ("spec-default-stop", None)]
    stopped = record["points"][-1]
    for row in stopped["seeds"]:
        arm = study / "confirm" / row["folder"] / "arms" / "spec-default-stop"
        ppo = load_profile(str(arm / "profile.toml")).ppo
        assert (ppo.stop_on_warning, ppo.stop_signals, ppo.kl_coef) == (True, ("kl_growth",), SPEC_KL)
        history = json.loads((arm / "ppo" / "history.json").read_text())
        assert row["iteration"] == len(history["iterations"]) == 2 < ppo.iterations  # fired at 1: 2 done
        rec = json.loads((arm / "test-final.json").read_text())
        assert rec["iteration"] == 2
        # its test rows are those of the stopped policy, not of the default's last iteration
        default = json.loads((arm.parent / "spec-default" / "test-iter-0004.json").read_text())
        assert rec["ppo_rows"] != default["ppo_rows"]
    assert "where a warning stopped PPO (iteration per seed: 2, 2)" in (study / "confirmation.html").read_text()
    frontier_seeds = {load_profile(str(study / s["folder"] / "profile.toml")).seeds for s in result["seeds"]}
    confirm_seeds = {load_profile(str(f / "profile.toml")).seeds for f in sorted((study / "confirm").glob("seed-*"))}
    assert len(confirm_seeds) == 2 and not confirm_seeds & frontier_seeds  # fresh training seeds
    for p in record["points"]:
        for row in p["seeds"]:
            rec = json.loads(
                test_file(study / "confirm" / row["folder"], STOP_ARM, None).read_text()
                if p["iteration"] is None
                else (
                    study / "confirm" / row["folder"] / "arms" / p["arm"] / f"test-iter-{p['iteration']:04d}.json"
                ).read_text()
            )
            ppo = [r for r in rec["ppo_rows"] if r["population"] == "test"]
            success = sum(r["rubric"]["rubric_success"] for r in ppo) / len(ppo)
            assert row["metrics"]["rubric_success.test.ppo"] == pytest.approx(success, abs=1e-12)
        diffs = [row["metrics"]["rubric_success.test.ppo_minus_sft"] for row in p["seeds"]]
        assert p["across"]["rubric_success.test.ppo_minus_sft"]["mean"] == pytest.approx(sum(diffs) / 2, abs=1e-12)
        assert -1.0 <= p["across"]["rubric_success.test.ppo_minus_sft"]["t95"][0]
    confirmation_page_shows(study / "confirmation.html", json.loads((study / "confirmation.json").read_text()))
    # The frozen rules scored on these fresh seeds, against test gold at every kept checkpoint of
    # the runs that went to the last iteration; the last checkpoint's gold is the point's own.
    warned = record["warnings"]
    assert warned["status"] == "scored" and warned["in_sample"] is False and "test rubric success" in warned["gold"]
    runs = {r["name"] for sc in warned["scores"] for r in sc["runs"]}
    assert runs == {f"{row['folder']}/{p['arm']}" for p in record["points"][:-1] for row in p["seeds"]}
    for row in record["points"][0]["seeds"]:
        arm = study / "confirm" / row["folder"] / "arms" / "spec-default"
        for it in (2, 4):
            gold = json.loads((arm / "test-gold" / f"iter-{it:04d}.json").read_text())
            sft_rows = json.loads((arm.parents[1] / "frontier" / "test-sft.json").read_text())["rows"]
            assert gold["n"] == len(gold["success"]) == sum(r["population"] == "test" for r in sft_rows)
            assert gold["gold"] == sum(gold["success"]) / len(gold["success"])
        assert gold["gold"] == pytest.approx(row["metrics"]["rubric_success.test.ppo"], abs=1e-12)
    assert "Over-optimisation warnings on these seeds" in (study / "confirmation.html").read_text()
    answers = json.loads((study / "confirmation-answers.json").read_text())
    for p in record["points"]:
        key = f"{p['arm']}@{'stop' if p['iteration'] is None else p['iteration']}"
        for row in p["seeds"]:
            test = [a for a in answers[row["folder"]] if a["population"] == "test"]
            assert test and {a["sft"]["rubric_success"] for a in test} <= {True, False}
            rate = sum(a[key]["rubric_success"] for a in test) / len(test)
            assert rate == pytest.approx(row["metrics"]["rubric_success.test.ppo"], abs=1e-12)
    again = run_confirmation(study, n=2, workers=1, say=lambda line: None)
    assert again == json.loads((study / "confirmation.json").read_text())
    # A finished confirmation of 2 seeds is not returned for another seed count: refused, untouched.
    from rlhf.studies import StudyError

    before = {p: os.stat(p).st_mtime_ns for p in study.rglob("*") if p.is_file()}
    with pytest.raises(StudyError, match=r"identity changed in n \(n was 2, now 3\)"):
        run_confirmation(study, n=3, workers=1, say=lambda line: None)
    assert {p: os.stat(p).st_mtime_ns for p in study.rglob("*") if p.is_file()} == before


def test_summary_is_recomputed_from_the_stored_measurements_into_a_new_folder(small_frontier, tmp_path):
    from rlhf.studies import StudyError
    from rlhf.studies.frontier.study import summarise_to

    out, result = small_frontier
    dest = tmp_path / "summary"
    again = summarise_to(out, dest, say=lambda line: None)
    assert again["selection"] == result["selection"] and again["measured_by"]["code"] == result["study"]["code"]
    for name, arm in again["arms"].items():
        for new, old in zip(arm["curve"], result["arms"][name]["curve"]):
            assert {k: new[k] for k in ("gold", "d", "truncations")} == {
                k: old[k] for k in ("gold", "d", "truncations")
            }
    endings_by_hand(out, again)
    assert (dest / "report.html").is_file()
    with pytest.raises(FileExistsError, match="new folder"):
        summarise_to(out, dest, say=lambda line: None)
    # One stored measurement given an answer with each token fault: the summary counts each on
    # its own, in the curve and on the page.
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    path = copy / "seed-0" / "arms" / "spec-default" / "validation" / "iter-0004.json"
    m = json.loads(path.read_text())
    for row, fault in zip(m["rows"], FAULTS):
        row["finish_reason"] = fault
    m["truncations"] = sum(r["finish_reason"] != "eos" for r in m["rows"])  # as the measurement counts them
    path.write_text(json.dumps(m))
    faulted = summarise_to(copy, tmp_path / "faulted", say=lambda line: None)
    endings_by_hand(copy, faulted)
    last = faulted["arms"]["spec-default"]["curve"][-1]
    assert last["iteration"] == 4 and all(last[f]["mean"] >= 0.5 for f in FAULTS)
    frontier_page_shows(tmp_path / "faulted" / "report.html", faulted)
    path.unlink()
    with pytest.raises(StudyError, match="not finished.*seed-0/spec-default"):
        summarise_to(copy, tmp_path / "other", say=lambda line: None)


def endings_by_hand(study: Path, result: dict) -> None:
    """Every curve point's cut_at_limit and each token fault are the mean over seeds of the
    seed's stored rows of that reason, counted here, and add up to the point's truncations (every
    answer whose finish reason is not eos)."""
    folders = [study / s["folder"] for s in result["seeds"]]
    for name, arm in result["arms"].items():
        for point in arm["curve"]:
            counts = []
            for f in folders:
                it = point["iteration"]
                m = json.loads(
                    (f / "frontier" / "sft.json").read_text()
                    if it == 0
                    else (f / "arms" / name / "validation" / f"iter-{it:04d}.json").read_text()
                )
                m = m["iteration_0"] if it == 0 else m
                counts.append(reason_counts(m["rows"]))
                assert m["truncations"] == len(m["rows"]) - counts[-1]["eos"]
            for key, reason in (("cut_at_limit", "length"), *((f, f) for f in FAULTS)):
                mean = sum(c[reason] for c in counts) / len(counts)
                assert point[key]["mean"] == pytest.approx(mean, abs=1e-12), (name, it, key)
            endings = point["cut_at_limit"]["mean"] + sum(point[f]["mean"] for f in FAULTS)
            assert endings == pytest.approx(point["truncations"]["mean"], abs=1e-9)
            assert "undecodable" not in point
