"""`rlhf seeds`, a multi-seed study of the whole lab, and the cut SFT budget.

One 2-seed study on the small test profile (conftest.SMALL_BUDGET) is run once per module, in
this process (workers = 1); the tests read its folder. The pool path (workers > 1) is taken by
the continuation test, which gives one unfinished run to a spawned worker.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
import time
from pathlib import Path

import pytest

from conftest import SMALL_PROBE_ROWS, SMALL_TEST_PROMPTS
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
        half = (
            study_statistics.t975(1) * sd / math.sqrt(2)
        )  # t(0.975, 1): 12.7062047361747, tested against its published value below
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
            assert len(test) == SMALL_TEST_PROMPTS
            assert r["metrics"][f"rubric_success.test.{policy}"] == pytest.approx(
                sum(x["rubric"]["rubric_success"] for x in test) / SMALL_TEST_PROMPTS, abs=1e-12
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
        assert len(test) == SMALL_TEST_PROMPTS and len(answers[r["folder"]]) == SMALL_TEST_PROMPTS + SMALL_PROBE_ROWS
        for policy in ("sft", "ppo"):
            assert r["metrics"][f"answers.test.{policy}.rubric_success"] == sum(
                a[policy]["rubric_success"] for a in test
            )
            for kind, count in kinds_by_hand([a[policy] for a in test]).items():
                assert r["metrics"][f"answers.test.{policy}.{kind}"] == count, kind
            assert f"answers.test.{policy}.undecodable" not in r["metrics"]
            closing = sum(a[policy]["response"].count("Have a pleasant day.") >= 2 for a in test)
            assert r["metrics"][f"answers.test.{policy}.repeats_polite_closing"] == closing


FAULTS = ("out_of_vocabulary", "control_token", "broken_text")  # each a kind of its own (docs/results.md)


def kinds_by_hand(answers: list[dict]) -> dict[str, int]:
    """Answers cut at the limit and with each token fault, counted here from their finish reasons."""
    return {"cut_at_limit": sum(a["finish_reason"] == "length" for a in answers)} | {
        f: sum(a["finish_reason"] == f for a in answers) for f in FAULTS
    }


def test_a_seeds_answer_kinds_count_each_token_fault_of_its_rows(small_study, tmp_path):
    """A run whose test answers hold each token fault: its row in the study counts each fault
    on its own, from the evaluation rows, per policy; a name that is no finish reason (the single
    `undecodable` of older evaluations) is refused."""
    src, run = small_study["out"] / "seed-0", tmp_path / "seed-0"
    read = (
        "profile.toml",
        "run.json",
        "evaluation/results.json",
        "shortcut_audit/results.json",
        "ppo/history.json",
        "sft/resume_check.json",
        "sft/history.json",
    )
    for name in read:  # what seed_row reads, nothing more
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / name, run / name)
    ev = read_json(run / "evaluation" / "results.json")
    ppo_test = [r for r in ev["policies"]["ppo"]["rows"] if r["population"] == "test"]
    sft_test = [r for r in ev["policies"]["sft"]["rows"] if r["population"] == "test"]
    for row, fault in zip(ppo_test, [*FAULTS, "control_token", "broken_text", "broken_text"]):
        row["finish_reason"] = fault
    sft_test[-1]["finish_reason"] = "out_of_vocabulary"
    (run / "evaluation" / "results.json").unlink()
    write_json(run / "evaluation" / "results.json", ev)
    metrics = seeds.seed_row(run, 0)["metrics"]
    for policy, rows in (("ppo", ppo_test), ("sft", sft_test)):
        for kind, count in kinds_by_hand(rows).items():
            assert metrics[f"answers.test.{policy}.{kind}"] == count, (policy, kind)
    assert [metrics[f"answers.test.ppo.{f}"] for f in FAULTS] == [1, 2, 3]
    assert metrics["answers.test.sft.out_of_vocabulary"] >= 1
    with pytest.raises(ValueError, match="unknown finish reason 'undecodable'"):
        changed_answer.answer_kinds([{**ppo_test[0], "finish_reason": "undecodable"}])


def test_the_study_page_shows_each_answer_kind_under_its_name(small_study):
    """The page's other quantities show every answer kind the study counts, each token fault on
    its own; a seeds.json that counted the faults as one kind shows it as undecodable."""
    from rlhf.report.study import render_study_html

    def kinds_shown(result: dict) -> tuple[str, dict[str, float]]:
        """The page's other-quantities section, and the mean it shows of each answer kind."""
        page = render_study_html(result, None)
        section = page.split('<section id="other-quantities">')[1].split("</section>")[0]
        cells = re.findall(r"<tr><td>(answers\.test\.[^<]+)</td><td>([^<]*)</td>", section)
        return section, {key: float(mean) for key, mean in cells}

    result = small_study["result"]
    page, means = kinds_shown(result)
    kinds = ("ended_with_eos", "cut_at_limit", *FAULTS, "recognised", "rubric_success", "repeats_polite_closing")
    assert sorted(means) == sorted(f"answers.test.{p}.{k}" for p in ("sft", "ppo") for k in kinds)
    for key, mean in means.items():
        assert mean == pytest.approx(result["across"][key]["mean"], abs=5e-4), key
    assert all(f in page for f in FAULTS) and "undecodable" not in page
    older = json.loads(json.dumps(result))
    for policy in ("sft", "ppo"):
        one = [older["across"].pop(f"answers.test.{policy}.{f}") for f in FAULTS][0]
        older["across"][f"answers.test.{policy}.undecodable"] = {**one, "mean": 7.0 if policy == "ppo" else 2.0}
    page, means = kinds_shown(older)
    assert (means["answers.test.ppo.undecodable"], means["answers.test.sft.undecodable"]) == (7.0, 2.0)
    assert not any(f in page for f in FAULTS) and "undecodable: the token faults counted as one kind" in page


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
    assert a["identity"]["evaluation_prompts"] == SMALL_TEST_PROMPTS + SMALL_PROBE_ROWS
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
        assert study_statistics.t975(df) == pytest.approx(_t975_by_integration(df), abs=1e-6), df
    # Published quantiles (to 16 digits): the bisection lands on them to the last bits.
    for df, published in ((1, 12.706204736174698), (2, 4.302652729749464), (4, 2.7764451051977934),
                          (10, 2.2281388519862744), (30, 2.0422724563012378)):  # fmt: skip
        assert study_statistics.t975(df) == pytest.approx(published, rel=1e-13), df
    assert study_statistics.sign_test_p(5, 0) == pytest.approx(2 / 32)
    assert study_statistics.sign_test_p(3, 2) == 1.0
    stats = study_statistics.across_seeds([0.1, 0.2, 0.3, 0.4, 0.5])
    assert stats["mean"] == pytest.approx(0.3) and stats["sd"] == pytest.approx(
        statistics.stdev([0.1, 0.2, 0.3, 0.4, 0.5])
    )
    assert stats["t95"][0] == pytest.approx(0.3 - 2.7764451051977934 * stats["sd"] / math.sqrt(5), rel=1e-12)
    with pytest.raises(StudyError, match="finite"):
        study_statistics.across_seeds([0.1, float("nan")])


# ------------------------------------------------------------------------------ the SFT budget


def _measured(name: str, success: float, gain: float | None = None) -> dict:
    m = {"budget": name, "sft_validation_success": success}
    if gain is not None:
        m["oracle"] = {"gain": gain, "qualifies": gain >= 0.10}
    return m


def test_budget_rule_takes_the_smallest_in_the_band_where_the_oracle_gains():
    from rlhf.studies.sft_budget import choose

    order = ["a", "b", "c", "d"]
    # a below the band, b in it but the oracle gains too little, c in it and gains: c
    assert choose([_measured("a", 0.05), _measured("b", 0.3, 0.09), _measured("c", 0.5, 0.12)], order) == "c"
    assert choose([_measured("a", 0.1, 0.10)], ["a"]) == "a"  # both edges belong to the rule
    assert choose([_measured("a", 0.71, 0.5), _measured("b", 0.09, 0.5)], ["a", "b"]) is None  # outside the band
    assert choose([_measured("a", 0.7, 0.099)], ["a"]) is None
    # a budget is chosen only when every smaller one was measured in step 1
    assert choose([_measured("a", 0.0), _measured("c", 0.5, 0.2)], order) is None


def test_the_choice_measures_the_oracle_in_order_over_the_band_and_stops_at_the_first_that_gains(tmp_path, monkeypatch):
    """Step 1 for every budget, step 2 only inside the band, in increasing budget, until one
    qualifies; the record shows what each step measured."""
    from rlhf.studies import sft_budget

    sft = {f"sft-e{k}": s for k, s in enumerate([0.0, 0.0, 0.05, 0.2, 0.3, 0.45, 0.75, 0.8, 0.9, 0.95], start=1)}
    gains = {"sft-e4": 0.04, "sft-e5": 0.15, "sft-e6": 0.3}
    oracle_ran = []
    monkeypatch.setattr(sft_budget, "measure_sft", lambda *a: {"budget": a[-1], "sft_validation_success": sft[a[-1]]})

    def oracle(work, budget, *rest):
        oracle_ran.append(budget)
        return {"gain": gains[budget], "qualifies": gains[budget] >= sft_budget.GAIN}

    monkeypatch.setattr(sft_budget, "oracle_gain", oracle)
    record = sft_budget.choose_sft_budget(tmp_path / "choice.json", tmp_path / "work", say=lambda s: None, workers=1)
    assert oracle_ran == ["sft-e4", "sft-e5"]  # e1-e3 below the band; e6 never needed
    assert record["chosen"] == "sft-e5" and record["not_measured"] == []
    assert [m["budget"] for m in record["candidates"]] == [f"sft-e{k}" for k in range(1, 11)]
    assert read_json(tmp_path / "choice.json")["chosen"] == "sft-e5"
    gains.update({"sft-e5": 0.05, "sft-e6": 0.02})
    oracle_ran.clear()
    record = sft_budget.choose_sft_budget(tmp_path / "none.json", tmp_path / "work", say=lambda s: None, workers=1)
    assert oracle_ran == ["sft-e4", "sft-e5", "sft-e6"] and record["chosen"] is None  # every budget of the band shown
    # Smaller budgets left out of step 1: nothing can be chosen, so no oracle study runs at all.
    oracle_ran.clear()
    record = sft_budget.choose_sft_budget(
        tmp_path / "part.json", tmp_path / "work", budgets=["sft-e4", "sft-e5"], say=lambda s: None, workers=1
    )
    assert oracle_ran == [] and record["chosen"] is None
    assert record["not_measured"] == [f"sft-e{k}" for k in (1, 2, 3, 6, 7, 8, 9, 10)]


def test_step_one_trains_the_frontiers_seeds(tmp_path):
    """The SFT of step 1 is the SFT of the frontier's seed folders: the same profiles."""
    from rlhf.studies.derivation import write_study_profiles
    from rlhf.studies.frontier.study import STUDY_SEED
    from rlhf.studies.sft_budget import SEEDS, seed_profiles

    profile = load_profile("embedded")
    folders = write_study_profiles(tmp_path, "embedded", SEEDS, STUDY_SEED, "sft-e6")
    written = [load_profile(str(f / "profile.toml")) for f in folders]
    for ours, theirs in zip(seed_profiles(profile, "sft-e6"), written):
        assert ours.seeds == theirs.seeds and (ours.sft.epochs, ours.sft.expected_updates) == (6, 126)
    assert len({p.seeds.lora for p in written}) == SEEDS


def test_previous_candidates_of_another_revision_or_rule_are_refused(tmp_path):
    from rlhf.config import profile_hash
    from rlhf.studies.sft_budget import RULE, previous_candidates

    profile = load_profile("embedded")
    rec = {
        "revision": "r001",
        "profile_sha256": profile_hash(profile),
        "rule": RULE,
        "command": "c",
        "code": "x",
        "candidates": [{"budget": "sft-e1", "sft_validation_success": 0.0, "oracle": {"gain": 0.0}}],
    }
    write_json(tmp_path / "r001.json", rec)
    (taken,) = previous_candidates([tmp_path / "r001.json"], "r001", profile)
    assert taken["measured_by"] == "c" and "oracle" not in taken  # step 2 runs again in this --work
    with pytest.raises(ValueError, match="another revision or profile"):
        previous_candidates([tmp_path / "r001.json"], "r002", profile)
    write_json(tmp_path / "old.json", {**rec, "rule": "the smallest budget in [0.3, 0.8]"})
    with pytest.raises(ValueError, match="another rule"):
        previous_candidates([tmp_path / "old.json"], "r001", profile)


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
    assert m["budget"] == "sft-e1" and len(m["per_seed"]) == 3
    assert all(s["validation"]["n"] == 180 and 0 <= s["validation"]["rubric_success"] <= 1 for s in m["per_seed"])
    assert m["sft_validation_success"] == pytest.approx(
        sum(s["validation"]["rubric_success"] for s in m["per_seed"]) / 3
    )
    assert "oracle" not in m  # one epoch of the small budget leaves SFT below the band: no step 2
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


# ------------------------------------------------------------------------------ reproducing a seed


def test_a_seed_of_a_study_recomputed_is_its_committed_row_byte_for_byte(small_study, tmp_path):
    """`rlhf reproduce` on the small study's seed 1: the same row, byte for byte; the committed
    row altered in one number, the recomputation names exactly that number."""
    from rlhf.studies.reproduce import reproduce

    out = reproduce(small_study["out"], 1, tmp_path / "again", profile_name=small_study["profile"], say=lambda s: None)
    assert out["identical"] is True and out["first_difference"] is None
    assert read_json(tmp_path / "again" / "reproduce-seed-1.json") == out
    altered = tmp_path / "altered"
    shutil.copytree(small_study["out"], altered, ignore=shutil.ignore_patterns("seed-*"))
    table = read_json(altered / "seeds.json")
    table["seeds"][1]["metrics"]["rubric_success.test.ppo"] += 1e-12
    write_json(altered / "seeds.json", table, overwrite=True)
    again = reproduce(altered, 1, tmp_path / "again", profile_name=small_study["profile"], say=lambda s: None)
    assert again["identical"] is False
    assert again["first_difference"].startswith("row.metrics.rubric_success.test.ppo: committed ")


def test_reproduce_checks_its_arguments_before_writing(small_study, tmp_path):
    from rlhf.studies.reproduce import committed_row

    with pytest.raises(StudyError, match="--seed must be between 0 and 1"):
        committed_row(small_study["out"], 2, small_study["profile"])
    with pytest.raises(StudyError, match="holds no seed study"):
        committed_row(tmp_path, 0)
    with pytest.raises(StudyError, match="is not the one the study"):
        committed_row(small_study["out"], 0, "embedded")  # another profile than the study's
    assert list(tmp_path.iterdir()) == []


def test_reproduce_refuses_records_that_are_not_a_seed_studys_naming_the_file(tmp_path):
    """Files of the wrong shape in RESULTS_DIR are refused by name, not with a traceback: a
    study.json without an identity, a seeds.json that is not JSON, a study without the row asked for."""
    from rlhf.studies.reproduce import committed_row

    committed = Path(__file__).resolve().parents[1] / "results" / "seeds-r001"
    study = tmp_path / "study"
    shutil.copytree(committed, study, ignore=shutil.ignore_patterns("answers.json", "report.html"))
    assert committed_row(study, 0)[1]["index"] == 0
    (study / "study.json").write_text('{"commit": null}')
    with pytest.raises(StudyError, match=r"study.json is not a seed study record: JSON without the key identity"):
        committed_row(study, 0)
    shutil.copy(committed / "study.json", study / "study.json")
    rows = json.loads((study / "seeds.json").read_text())
    rows["seeds"] = [r for r in rows["seeds"] if r["index"] != 3]
    (study / "seeds.json").write_text(json.dumps(rows))
    with pytest.raises(StudyError, match="holds 0 rows of seed 3, not one"):
        committed_row(study, 3)
    (study / "seeds.json").write_text("not json")
    with pytest.raises(StudyError, match=r"seeds.json is not a seed study summary: not JSON"):
        committed_row(study, 0)


def test_first_difference_names_the_first_path_where_two_rows_part():
    from rlhf.studies.reproduce import first_difference

    row = {"index": 0, "metrics": {"a": 1.0, "b": [1, 2, 3]}, "identity": {"sft": "x"}}
    assert first_difference(row, json.loads(json.dumps(row))) is None
    assert (
        first_difference(row, {**row, "metrics": {"a": 1.0, "b": [1, 2, 4]}})
        == "row.metrics.b[2]: committed 3, recomputed 4"
    )
    assert first_difference(row, {**row, "identity": {}}) == "row.identity.sft: only in the committed row"
    assert first_difference(row, {**row, "extra": 1}) == "row.extra: only in the recomputed row"
    assert first_difference({"x": 0.1 + 0.2}, {"x": 0.3}) == f"row.x: committed {0.1 + 0.2!r}, recomputed 0.3"


def test_seed_0_of_the_committed_r001_seed_study_is_the_golden_r001_lab():
    """Run 0 of study seed 0 is the profile's own run: the committed r001 seed study's seed 0
    holds the golden lab's states and numbers (no training here: the committed files only)."""
    golden = json.loads(
        (Path(__file__).resolve().parents[1] / "tests_reproducibility" / "golden_embedded.json").read_text()
    )["r001"]
    study = Path(__file__).resolve().parents[1] / "results" / "seeds-r001"
    (row,) = [r for r in read_json(study / "seeds.json")["seeds"] if r["index"] == 0]
    assert read_json(study / "study.json")["identity"]["study_seed"] == 0 and row["protocol"] is True
    states = golden["states_sha256_continuous"]
    assert [row["identity"][f"{s}_state_sha256"] for s in ("sft", "judge", "ppo")] == [
        states[s] for s in ("sft", "judge", "ppo")
    ]
    assert row["identity"]["corpus_manifest_sha256"] == golden["corpus_manifest_sha256"]
    for key in ("rubric_success", "mean_learned_reward"):
        name = "learned_reward" if key == "mean_learned_reward" else key
        for policy, pops in golden[key].items():
            for pop, value in pops.items():
                assert row["metrics"][f"{name}.{pop}.{policy}"] == value, (name, pop, policy)
    assert row["metrics"]["judge.test_accuracy"] == golden["judge_test_accuracy"]
    for name, value in golden["shortcut_audit_accuracy"].items():
        assert row["metrics"][f"shortcut_audit.{name}"] == value, name
