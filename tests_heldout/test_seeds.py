"""`rlhf seeds`, a multi-seed study of the whole lab, and the cut SFT budget.

One 2-seed study on the small test profile (conftest.SMALL_BUDGET) is run once per module, in
this process (workers = 1); the tests read its folder. The pool path (workers > 1) is taken by
the continuation test, which gives one unfinished run to a spawned worker.
"""

from __future__ import annotations

import math
import shutil
import statistics
import time
from pathlib import Path

import pytest

from rlhf.config import ProfileError, load_profile, profile_text_with
from rlhf.events import logdir_line
from rlhf.io import read_json, write_json
from rlhf.studies import StudyError, changed_answer, derivation, seeds
from rlhf.studies import statistics as study_statistics
from rlhf.studies.statistics import metric_bounds

pytestmark = [pytest.mark.unit, pytest.mark.xdist_group("seeds")]  # one worker builds the module's study once


@pytest.fixture(scope="module")
def small_study(tmp_path_factory, small_profile_file):
    out = tmp_path_factory.mktemp("study") / "s"
    lines: list[str] = []
    t0, c0 = time.perf_counter(), time.process_time()
    result = seeds.run_study(
        out, n=2, revision="r001", workers=1, profile_name=str(small_profile_file), say=lines.append
    )
    return {
        "out": out,
        "result": result,
        "lines": lines,
        "profile": str(small_profile_file),
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
    }


def _t975_by_integration(df: int) -> float:
    """The 0.975 quantile of Student's t by bisection on the Simpson-integrated density."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))

    def cdf(x, steps=4000):
        h = x / steps
        f = lambda u: c * (1 + u * u / df) ** (-(df + 1) / 2)  # noqa: E731
        s = f(0) + f(x) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, steps))
        return 0.5 + s * h / 3

    lo, hi = 0.0, 20.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < 0.975 else (lo, mid)
    return (lo + hi) / 2


# ------------------------------------------------------------------------------ the study


def test_across_seed_statistics_recomputed_from_rows(small_study, record_result):
    """Every across-seed number is recomputed from the per-seed rows, and the rows' rubric
    numbers from the per-row verdicts in each run's evaluation/results.json."""
    result, out = small_study["result"], small_study["out"]
    record_result("study_wall_s", round(small_study["wall_s"], 1))
    record_result("study_cpu_s", round(small_study["cpu_s"], 1))
    rows = result["seeds"]
    assert len(rows) == 2 and set(result["across"]) == set(rows[0]["metrics"])
    for key, stats in result["across"].items():
        values = [r["metrics"][key] for r in rows]
        mean, sd = statistics.fmean(values), statistics.stdev(values)
        half = 12.706 * sd / math.sqrt(2)  # t(0.975, 1)
        assert stats["mean"] == pytest.approx(mean, abs=1e-12), key
        assert stats["sd"] == pytest.approx(sd, abs=1e-12), key
        formula = [mean - half, mean + half]
        assert stats.get("t95_unclipped", stats["t95"]) == pytest.approx(formula, abs=1e-12), key
        bounds = metric_bounds(key)  # a bounded quantity's interval stays inside its bounds
        if bounds is not None:
            assert stats["t95"] == pytest.approx([max(bounds[0], formula[0]), min(bounds[1], formula[1])]), key
            assert stats["clipped"] == (stats["t95"] != formula), key
        assert stats["positive"] == sum(v > 0 for v in values), key
        assert stats["negative"] == sum(v < 0 for v in values), key
    for r in rows:
        ev = read_json(out / r["folder"] / "evaluation" / "results.json")
        for policy in ("sft", "ppo"):
            test = [x for x in ev["policies"][policy]["rows"] if x["population"] == "test"]
            assert len(test) == 180
            assert r["metrics"][f"rubric_success.test.{policy}"] == pytest.approx(
                sum(x["rubric"]["rubric_success"] for x in test) / 180, abs=1e-12
            )
        assert r["metrics"]["rubric_success.test.ppo_minus_sft"] == pytest.approx(
            r["metrics"]["rubric_success.test.ppo"] - r["metrics"]["rubric_success.test.sft"], abs=1e-12
        )
    on_disk = read_json(out / "seeds.json")
    assert on_disk["across"] == result["across"] and on_disk["seeds"] == rows
    # Every seed's per-row answers are kept, and the answer counts recompute from them.
    answers = read_json(out / "answers.json")
    assert sorted(answers) == [r["folder"] for r in rows]
    for r in rows:
        test = [a for a in answers[r["folder"]] if a["population"] == "test"]
        assert len(test) == 180 and len(answers[r["folder"]]) == 260
        for policy in ("sft", "ppo"):
            assert r["metrics"][f"answers.test.{policy}.rubric_success"] == sum(
                a[policy]["rubric_success"] for a in test
            )
            cut = sum(a[policy]["finish_reason"] == "length" for a in test)
            assert r["metrics"][f"answers.test.{policy}.cut_at_limit"] == cut
            closing = sum(a[policy]["response"].count("Have a pleasant day.") >= 2 for a in test)
            assert r["metrics"][f"answers.test.{policy}.repeats_polite_closing"] == closing


def test_seeds_differ_where_they_must_and_agree_where_they_must(small_study):
    result, out = small_study["result"], small_study["out"]
    a, b = result["seeds"]
    base = load_profile(small_study["profile"])
    for t, k in derivation.TRAINING_SEEDS:  # run 0 is the profile's own run; run 1 is 1000 further
        assert a["seeds"][f"{t}.{k}"] == derivation.profile_value(base, t, k)
        assert b["seeds"][f"{t}.{k}"] == derivation.profile_value(base, t, k) + 1000
    for t, k in derivation.FIXED_SEEDS:
        assert a["seeds"][f"{t}.{k}"] == b["seeds"][f"{t}.{k}"] == derivation.profile_value(base, t, k)
    for key in (
        "sft_state_sha256",
        "judge_state_sha256",
        "ppo_state_sha256",
        "ppo_rollout_order_sha256",
        "sft_first_update_loss",
    ):
        assert a["identity"][key] != b["identity"][key], key
    for key in ("corpus_manifest_sha256", "evaluation_prompt_ids_sha256", "evaluation_prompts"):
        assert a["identity"][key] == b["identity"][key], key
    assert a["identity"]["evaluation_prompts"] == 260
    # each run is reproducible from its folder: its profile.toml is the profile it ran
    for r in (a, b):
        run = read_json(out / r["folder"] / "run.json")
        from rlhf.config import profile_hash

        assert run["identity"]["config"] == profile_hash(load_profile(str(out / r["folder"] / "profile.toml")))
    assert read_json(out / "seed-0" / "sft" / "resume_check.json")["protocol"] is True
    assert read_json(out / "seed-1" / "sft" / "resume_check.json")["protocol"] is False
    assert (out / "report.html").read_text().count("<img") == 1
    assert any("seed 1: report complete (6/6 stages)" in line for line in small_study["lines"])


def test_each_seed_writes_its_own_curves_equal_to_its_histories(small_study):
    """TensorBoard's reader finds one series per seed and stage (seed-i/tensorboard/STAGE), each
    equal to that seed's history, so two seeds never share or mix a series."""
    from conftest import assert_series_equal, epoch_stage_expected, ppo_expected, read_series

    out = small_study["out"]
    found = sorted(str(p.parent.relative_to(out)) for p in out.rglob("events.out.tfevents.*"))
    folders = [r["folder"] for r in small_study["result"]["seeds"]]
    stages = ("evaluation", "judge", "ppo", "sft")
    assert sorted(set(found)) == sorted(f"{f}/tensorboard/{s}" for f in folders for s in stages)
    series = {}
    for f in folders:
        run, cfg = out / f, load_profile(str(out / f / "profile.toml")).ppo
        for stage in ("sft", "judge"):
            series[f, stage] = read_series(run / "tensorboard" / stage)
            assert_series_equal(series[f, stage], epoch_stage_expected(read_json(run / stage / "history.json")), stage)
        got = {t: v for t, v in read_series(run / "tensorboard" / "ppo").items() if not t.startswith("timing_s/")}
        expected = ppo_expected(read_json(run / "ppo" / "history.json"), cfg.kl_coef, cfg.truncation_penalty)
        assert_series_equal(got, expected, f"{f} ppo")
    assert series[folders[0], "sft"]["train/loss"] != series[folders[1], "sft"]["train/loss"]


def test_check_invariants_catches_runs_that_share_a_state_or_differ_in_corpus(small_study):
    rows = small_study["result"]["seeds"]
    seeds.check_invariants(rows)
    same_state = [
        rows[0],
        {**rows[1], "identity": {**rows[1]["identity"], "ppo_state_sha256": rows[0]["identity"]["ppo_state_sha256"]}},
    ]
    with pytest.raises(StudyError, match="ppo_state_sha256"):
        seeds.check_invariants(same_state)
    other_prompts = [rows[0], {**rows[1], "identity": {**rows[1]["identity"], "evaluation_prompt_ids_sha256": "x"}}]
    with pytest.raises(StudyError, match="evaluation_prompt_ids_sha256"):
        seeds.check_invariants(other_prompts)


def _snapshot(folder: Path) -> dict:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*")}


def test_rerun_of_a_finished_study_recomputes_nothing(small_study, monkeypatch):
    from rlhf import lab

    out = small_study["out"]
    before = _snapshot(out)

    def refuse(*a, **k):
        raise AssertionError("a finished study reopened a run")

    monkeypatch.setattr(lab, "open_context", refuse)
    monkeypatch.setattr(lab, "run_lab", refuse)
    lines = []
    again = seeds.run_study(out, n=2, revision="r001", workers=1, profile_name=small_study["profile"], say=lines.append)
    assert again == small_study["result"]
    assert _snapshot(out) == before
    assert lines == [f"study already complete in {out} (seeds.json): nothing recomputed"]
    with pytest.raises(StudyError, match="n was 2, now 3"):
        seeds.run_study(out, n=3, revision="r001", workers=1, profile_name=small_study["profile"], say=lines.append)


def test_killed_study_continues_where_it_stopped(small_study, tmp_path):
    """A copy of the finished study with run 1 killed before its report stage and no seeds.json:
    the rerun gives run 1 alone to a spawned worker (the pool path), which finishes only the
    report, leaves run 0 untouched, and the study's numbers come out the same."""
    out = tmp_path / "s"
    shutil.copytree(small_study["out"], out)
    for name in ("seeds.json", "report.html"):
        (out / name).unlink()
    run1 = out / "seed-1"
    record = read_json(run1 / "run.json")
    del record["stages"]["report"]
    write_json(run1 / "run.json", record, overwrite=True)
    for name in ("results.json", "report.md", "report.html"):
        (run1 / name).unlink()
    run0 = _snapshot(out / "seed-0")
    lines = []
    again = seeds.run_study(out, n=2, revision="r001", workers=2, profile_name=small_study["profile"], say=lines.append)
    assert _snapshot(out / "seed-0") == run0
    assert lines[0] == logdir_line(out)  # said once the arguments are checked, before anything runs
    assert "seed 0: already complete" in lines[2] and any("seed 1: queued" in x for x in lines)
    assert any("seed 1: report complete" in x for x in lines)
    log = (run1 / "lab.log").read_text()
    assert all(f"{stage}: already complete" in log for stage in seeds.STAGES[:-1])
    assert (run1 / "report.html").is_file() and (out / "seeds.json").is_file()
    assert again["across"] == small_study["result"]["across"]
    assert [r["metrics"] for r in again["seeds"]] == [r["metrics"] for r in small_study["result"]["seeds"]]


def test_changed_answer_view_recomputes_the_evaluation_log_ratio(small_study):
    """The per-token view of a PPO answer, recomputed from the run's saved roles: its mean
    log-ratio is the evaluation's sampled log-ratio of that row (the same tokens and models)."""
    out = small_study["out"]
    ev = read_json(out / "seed-1" / "evaluation" / "results.json")
    sft_row, ppo_row = ev["policies"]["sft"]["rows"][0], ev["policies"]["ppo"]["rows"][0]
    view = changed_answer.token_view_of(out / "seed-1", "r001", sft_row, ppo_row)
    tokens = view["tokens"]
    assert len(tokens) == len(ppo_row["response_ids"]) and all(t["logp_ppo"] <= 0 for t in tokens)
    mean_ratio = sum(t["log_ratio"] for t in tokens) / len(tokens)
    assert mean_ratio == pytest.approx(ppo_row["sampled_log_ratio"], abs=1e-5)
    assert mean_ratio != 0  # PPO moved the actor: the two policies differ
    recorded = small_study["result"]["changed_answer"]
    assert recorded["seed"] is not None or "no greedy answer" in recorded["note"]


def test_changed_row_prefers_a_failure_turned_into_a_success():
    from rlhf.studies.changed_answer import pick_changed_row

    def row(i, ids, ok):
        return {"document_id": f"d{i}", "population": "test", "response_ids": ids, "rubric": {"rubric_success": ok}}

    sft = [row(0, [1], True), row(1, [2], True), row(2, [3], False), row(3, [4], False)]
    ppo = [row(0, [1], True), row(1, [9], False), row(2, [8], True), row(3, [7], False)]
    assert pick_changed_row(sft, ppo)[0]["document_id"] == "d2"
    assert pick_changed_row(sft[:2], ppo[:2])[0]["document_id"] == "d1"
    assert pick_changed_row(sft[:1], ppo[:1]) is None


# ------------------------------------------------------------------------------ seeds and statistics


def test_derived_seeds_never_collide_and_run_zero_is_the_profile():
    profile = load_profile("embedded")
    drawn = {}
    for study in (0, 1):
        for i in range(derivation.MAX_RUNS):
            for (t, k), v in derivation.seed_changes(profile, study, i).items():
                drawn.setdefault((t, k), []).append(v)
    for key, values in drawn.items():
        assert len(set(values)) == len(values), key
    assert derivation.seed_changes(profile, 0, 0) == {
        (t, k): derivation.profile_value(profile, t, k) for t, k in derivation.TRAINING_SEEDS
    }
    with pytest.raises(StudyError, match="outside"):
        derivation.seed_changes(profile, 0, derivation.MAX_RUNS)


def test_run_profile_reads_back_as_intended(tmp_path):
    from rlhf.config import PROFILE_DIR

    text = (PROFILE_DIR / "embedded.toml").read_text()
    profile = load_profile("embedded")
    changes = {**derivation.seed_changes(profile, 3, 7), **derivation.budget_changes(profile, "sft-e2")}
    got = derivation.write_run_profile(tmp_path / "p.toml", text, "embedded-x", changes)
    assert got.seeds.data_order == 149 + 300000 + 7000 and got.sft.epochs == 2 and got.name == "embedded-x"
    assert got.sft.expected_updates == 42 and got.seeds.evaluation == 349 and got.lora == profile.lora
    with pytest.raises(StudyError, match="other content"):
        derivation.write_run_profile(tmp_path / "p.toml", text, "embedded-y", changes)
    with pytest.raises(ProfileError, match="no \\[nowhere\\] table"):
        profile_text_with(text, "z", {("nowhere", "seed"): 1})
    with pytest.raises(ValueError, match="unknown SFT budget"):
        derivation.budget_changes(profile, "sft-e11")


def test_t_quantiles_and_sign_test():
    for df in (1, 2, 4, 9, 30):
        assert study_statistics.t975(df) == pytest.approx(_t975_by_integration(df), abs=2e-3), df
    assert study_statistics.sign_test_p(5, 0) == pytest.approx(2 / 32)
    assert study_statistics.sign_test_p(3, 2) == 1.0
    stats = study_statistics.across_seeds([0.1, 0.2, 0.3, 0.4, 0.5])
    assert stats["mean"] == pytest.approx(0.3) and stats["sd"] == pytest.approx(
        statistics.stdev([0.1, 0.2, 0.3, 0.4, 0.5])
    )
    assert stats["t95"][0] == pytest.approx(0.3 - 2.776 * stats["sd"] / math.sqrt(5))
    with pytest.raises(StudyError, match="finite"):
        study_statistics.across_seeds([0.1, float("nan")])


# ------------------------------------------------------------------------------ the SFT budget


def test_budget_rule_takes_the_smallest_inside_the_band():
    from rlhf.studies.sft_budget import choose

    m = lambda name, s: {"budget": name, "validation": {"rubric_success": s}}  # noqa: E731
    assert choose([m("a", 0.1), m("b", 0.3), m("c", 0.5)]) == "b"
    assert choose([m("a", 0.29), m("b", 0.81), m("c", 0.8)]) == "c"
    assert choose([m("a", 0.0), m("b", 0.9)]) is None
    # in the table's order, a budget is chosen only when every smaller one was measured
    assert choose([m("a", 0.1), m("c", 0.5)], order=["a", "b", "c"]) is None
    assert choose([m("a", 0.1), m("b", 0.2), m("c", 0.5)], order=["a", "b", "c"]) == "c"


def test_previous_candidates_of_another_revision_are_refused(tmp_path):
    from rlhf.config import profile_hash
    from rlhf.studies.sft_budget import previous_candidates

    profile = load_profile("embedded")
    rec = {
        "revision": "r001",
        "profile_sha256": profile_hash(profile),
        "command": "c",
        "code": "x",
        "candidates": [{"budget": "sft-e1", "validation": {"rubric_success": 0.0}}],
    }
    write_json(tmp_path / "r001.json", rec)
    assert previous_candidates([tmp_path / "r001.json"], "r001", profile)[0]["measured_by"] == "c"
    with pytest.raises(ValueError, match="another revision or profile"):
        previous_candidates([tmp_path / "r001.json"], "r002", profile)


def test_budget_choice_reads_no_test_prompt(tmp_path, small_profile_file, monkeypatch):
    """The choice runs with the corpus's evaluation view and every test read made to fail: only
    the learning view reaches the code that trains and measures."""
    from rlhf import corpus as corpus_mod
    from rlhf.studies.sft_budget import choose_sft_budget
    from rlhf.studies.validation import validation_prompts

    def refuse(*a, **k):
        raise AssertionError("the budget choice touched the evaluation view")

    monkeypatch.setattr(corpus_mod.Corpus, "evaluation_view", refuse)
    monkeypatch.setattr(corpus_mod.EvaluationView, "__init__", refuse)
    record = choose_sft_budget(
        tmp_path / "choice.json",
        tmp_path / "work",
        revision="r002",
        profile_name=str(small_profile_file),
        budgets=["sft-e1"],
        say=lambda s: None,
    )
    (m,) = record["candidates"]
    assert m["budget"] == "sft-e1" and m["validation"]["n"] == 180 and 0 <= m["validation"]["rubric_success"] <= 1
    assert read_json(tmp_path / "choice.json") == record
    monkeypatch.undo()
    view = corpus_mod.load_corpus(tmp_path / "work" / "corpus")
    with pytest.raises(TypeError, match="LearningView only"):
        validation_prompts(view.evaluation_view())
    with pytest.raises(PermissionError):
        view.learning_view().inputs("pair", "test")
    val = validation_prompts(view.learning_view())
    assert len(val) == 180 and not (
        {r["document_id"] for r in val} & {r["document_id"] for r in view.evaluation_view().prompts("test")}
    )
    with pytest.raises(FileExistsError):
        choose_sft_budget(tmp_path / "choice.json", tmp_path / "work", revision="r002")
