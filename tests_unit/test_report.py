"""Reports (rlhf.report) on a small synthetic run folder: files, self-containment, no overwrite,
wording check (SPEC §1, §9.5)."""

from __future__ import annotations

import base64
import json
import random
import re

import pytest

from rlhf import report, rubric
from rlhf.io import write_json

pytestmark = pytest.mark.unit


# ------------------------------------------------------------------ a small synthetic run folder


def _synthetic_evaluation(seed: int = 7) -> dict:
    """A realistic evaluation/results.json (the schema written by rlhf.evaluate)."""
    rng = random.Random(seed)
    policies = {}
    for pol, p_ok, p_polite in (("sft", 0.8, 0.5), ("ppo", 0.7, 0.9)):
        rows = []
        for i in range(12):  # 12 test rows, 2 families each 6
            a = i % 6
            ok = rng.random() < p_ok
            text = rubric.render(a if ok else (a + 1) % 6, 1 if ok else 2, rng.random() < p_polite)
            rows.append(
                {
                    "document_id": f"OH{i:03d}-P{i % 5}",
                    "family": f"OH{i:03d}",
                    "population": "test",
                    "prompt": f"Case OH{i:03d}, message 1. {rubric.CONTEXTS[a]}",
                    "response": text,
                    "finish_reason": "eos",
                    "length": 12 + i,
                    "learned_reward": rng.uniform(-3, 6),
                    "sampled_log_ratio": rng.uniform(-0.1, 0.3),
                    "rubric": rubric.evaluate(text, "eos", a),
                }
            )
        for k in range(3):  # 3 probe contexts x 4 identical greedy rows
            a = k % 6
            text = rubric.render(a, 1, pol == "ppo") if k else "Some free prose outside the grammar"
            for cell in ("C1-P0", "C1-P1", "C0-P0", "C0-P1"):
                rows.append(
                    {
                        "document_id": f"PROBE{k:02d}-{cell}",
                        "family": f"PROBE{k:02d}",
                        "population": "probe",
                        "prompt": f"New remote support context PROBE{k:02d}. {rubric.CONTEXTS[a]}",
                        "response": text,
                        "finish_reason": "eos" if k else "length",
                        "length": 14,
                        "learned_reward": 1.5 + k,
                        "sampled_log_ratio": 0.01,
                        "rubric": rubric.evaluate(text, "eos" if k else "length", a),
                    }
                )
        metrics = {}
        for pop, n, units in (
            ("test", 12, 12),
            ("probe_rows", 12, 3),
            ("probe_contexts", 3, 3),
            ("all_rows", 24, 15),
            ("all_unique_contexts", 15, 15),
        ):
            metrics[pop] = {
                "n_rows": n,
                "n_independent_units": units,
                "rubric_success": rng.random(),
                "recognised_share": 0.9,
                "uncertified": 1,
                "relevance": 0.8,
                "unsupported_certainty": 0.1,
                "refusals": 0,
                "without_eos": 1 if "probe" in pop else 0,
                "mean_length": 15.5,
                "mean_learned_reward": rng.uniform(0, 4),
                "mean_sampled_log_ratio": 0.02 if pol == "ppo" else 0.0,
            }
        policies[pol] = {"rows": rows, "metrics": metrics}
    diffs = {}
    for metric, key in (("rubric_success", "rubric_success"), ("learned_reward", "mean_learned_reward")):
        diffs[metric] = {}
        for pop in ("test", "probe_contexts", "all_unique_contexts"):
            s, p = policies["sft"]["metrics"][pop][key], policies["ppo"]["metrics"][pop][key]
            diffs[metric][pop] = {
                "sft": s,
                "ppo": p,
                "diff": p - s,
                "ci95": [p - s - 0.2, p - s + 0.2],
                "units": policies["sft"]["metrics"][pop]["n_independent_units"],
            }
    contexts = []
    for k in range(3):
        s = {"s_TF": 1.0 + k, "s_TT": 2.5 + k, "s_FF": -1.0, "s_FT": 1.2 + 2 * k}
        contexts.append(
            {
                "family": f"PROBE{k:02d}",
                **s,
                "correct_politeness_delta": s["s_TT"] - s["s_TF"],
                "incorrect_politeness_delta": s["s_FT"] - s["s_FF"],
                "wrong_polite_outranks_correct_plain": s["s_FT"] > s["s_TF"],
            }
        )
    return {
        "policies": policies,
        "judge_test": {
            "accuracy": 0.95,
            "by_variant": {str(v): 1.0 - 0.05 * v for v in range(5)},
            "ties": 0,
            "pairs": 180,
        },
        "differences": diffs,
        "politeness": {
            "contexts": contexts,
            "counts": {
                "contexts": 3,
                "correct_politeness_delta_positive": 3,
                "incorrect_politeness_delta_positive": 3,
                "wrong_polite_outranks_correct_plain": 2,
            },
            "hashes_before": {"judge/judge.safetensors": "ab" * 32},
            "hashes_after": {"judge/judge.safetensors": "ab" * 32},
            "unchanged": True,
        },
        "populations_note": "80 probe rows are 20 contexts; 260 rows per policy over 200 distinct prompts.",
        "seconds": {"generation": 12.5, "politeness": 0.4},
    }


def make_synthetic_run(root, *, evaluation: bool = True):
    """Minimal JSON files of a finished run (layout of rlhf.lab) under `root`."""
    rng = random.Random(3)
    write_json(
        root / "corpus/manifest.json",
        {
            "audit": {
                "dataset": "OfficeHelpPrefs-v1",
                "pairs": 1200,
                "probe_rows": 80,
                "unique_probe_contexts": 20,
                "families_by_split": {"train": 168, "validation": 36, "test": 36},
                "human_feedback": False,
            },
            "files": {"inputs/pair/train.jsonl": "cd" * 32},
            "probe_families": [f"PROBE{k:02d}" for k in range(20)],
        },
    )
    write_json(
        root / "sft/history.json",
        {
            "total_updates": 12,
            "updates": [
                {"step": s, "epoch": s // 4, "loss": 20.0 / (s + 1), "lr": 1e-4, "tokens": 200 + s, "grad_norm": 3.0}
                for s in range(12)
            ],
            "epochs": [{"epoch": e, "train_loss": 5.0 / (e + 1), "validation_loss": 4.0 / (e + 1)} for e in range(3)],
        },
    )
    write_json(
        root / "judge/history.json",
        {
            "total_updates": 10,
            "updates": [
                {
                    "step": s,
                    "epoch": s // 5,
                    "loss": 0.7 / (s + 1),
                    "accuracy": min(1.0, 0.5 + 0.06 * s),
                    "lr": 2e-4,
                    "grad_norm": 1.0,
                }
                for s in range(10)
            ],
            "epochs": [
                {
                    "epoch": e,
                    "train_loss": 0.3 / (e + 1),
                    "train_accuracy": 0.9,
                    "validation_loss": 0.2,
                    "validation_accuracy": 0.97,
                    "validation_ties": 0,
                }
                for e in range(2)
            ],
        },
    )
    iterations, views = [], []
    for it in range(6):
        iterations.append(
            {
                "iteration": it,
                "mean_score": -1.0 + 0.5 * it,
                "mean_sampled_log_ratio": 0.01 * it,
                "mean_kl_penalty": -0.0002 * it,
                "value_loss": [3.0 - 0.3 * it, 2.9 - 0.3 * it],
                "policy_loss": [0.1, 0.09],
                "clip_fraction": [0.0, 0.05],
                "response_length": 20.0 + it,
                "truncations": it % 2,
                "mean_value": 0.1 * it,
                "mean_advantage": 0.2,
                "mean_return": 0.3,
                "prompt_ids": [f"OH00{k}-RL0" for k in range(4)],
                "scores": [0.1, 0.2, 0.3, 0.4],
            }
        )
    for it in (0, 5):
        toks = []
        for t, word in enumerate(["Thank", " you", " for", " reporting", "."]):
            adv = rng.uniform(-1, 1)
            toks.append(
                {
                    "token": word,
                    "logp_old": -0.5,
                    "logp_ref": -0.52,
                    "kl_reward": -0.0004,
                    "reward": -0.0004 + (2.0 if t == 4 else 0.0),
                    "value": 0.3,
                    "advantage": adv,
                    "return": adv + 0.3,
                }
            )
        views.append({"iteration": it, "prompt_id": "OH001-RL1", "score": 2.0, "ended": True, "tokens": toks})
    write_json(
        root / "ppo/history.json",
        {
            "iterations": iterations,
            "token_views": views,
            "consumed": [f"OH{k:03d}-RL0" for k in range(24)],
            "scoring_check": {
                "iteration": 0,
                "max_abs_diff": 1e-6,
                "mean_abs_diff": 3e-8,
                "tokens": 80,
                "use_cache": True,
            },
        },
    )
    phases = {
        "generation": 3.0,
        "reference": 0.2,
        "judge": 0.2,
        "critic_values": 0.2,
        "actor_update": 1.0,
        "critic_update": 1.0,
        "iteration": 5.8,
    }
    for stage, boundary in (("sft", 1), ("judge", 1), ("ppo", 40)):
        check = {
            "stage": stage,
            "boundary": boundary,
            "identical": True,
            "tensors_compared": 100,
            "sha256_boundary": "1" * 64,
            "sha256_resumed": "2" * 64,
            "sha256_continuous": "3" * 64,
            "interrupted_and_resumed_s": 10.0,
            "continuous_s": 9.0,
        }
        write_json(root / stage / "resume_check.json", check)
        extra = (
            {"total": phases, "per_iteration": [phases] * 6, "memory": {"peak_rss_mib": 400.0}}
            if stage == "ppo"
            else {}
        )
        write_json(root / stage / "timings.json", {"seconds": 9.0, **check, **extra})
    fp = {
        r: {"learned_sha256": r[0] * 64, "frozen_sha256": "f" * 64} for r in ("actor", "critic", "reference", "judge")
    }
    after = {r: dict(v) for r, v in fp.items()}
    after["actor"]["learned_sha256"] = "9" * 64
    after["critic"]["learned_sha256"] = "8" * 64
    write_json(root / "ppo/fingerprints.json", {"before": fp, "after": after})
    if evaluation:
        write_json(root / "evaluation/results.json", _synthetic_evaluation())
    return root


# ------------------------------------------------------------------ tests


def test_write_reports_produces_three_files_with_every_number(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    paths = report.write_reports(run)
    assert set(paths) == set(report.REPORT_FILES)
    for p in paths.values():
        assert p.is_file() and p.parent == run and p.stat().st_size > 0
    res = json.loads(paths["results.json"].read_text())
    assert res["judge_test"]["accuracy"] == 0.95
    assert res["judge_test"]["by_variant"] == {str(v): 1.0 - 0.05 * v for v in range(5)}
    assert res["evaluation"]["status"] == "run"
    assert res["evaluation"]["differences"]["rubric_success"]["test"]["ci95"]
    assert res["ppo"]["summary"]["iterations"] == 6
    assert res["ppo"]["summary"]["actor_updates"] == 12 and res["ppo"]["summary"]["critic_updates"] == 12
    assert res["ppo"]["summary"]["truncations"] == 3
    assert res["ppo"]["curves"]["mean_score"] == [-1.0 + 0.5 * i for i in range(6)]
    assert res["sft"]["curves"]["loss"][0] == 20.0
    assert res["resume_checks"]["ppo"]["sha256_resumed"] == "2" * 64
    assert res["fingerprint_checks"]["reference"] == {
        "learned_changed": False,
        "must_change": False,
        "frozen_base_unchanged": True,
        "ok": True,
    }
    assert res["fingerprint_checks"]["actor"]["ok"] is True
    assert res["timings"]["ppo_phase_totals_s"]["generation"] == 3.0
    assert res["wording_check"]["report_text"] == {"report.md": [], "report.html": []}
    for p in paths.values():  # SPEC §9.5 on every written file, results.json included
        assert report.find_forbidden_wording(p.read_text()) == [], p.name
    md = paths["report.md"].read_text()
    for sentence in report.HONESTY:
        assert sentence in md
    assert "PROBE01" in md and "UNCERTIFIED" in md


def _evaluation_with_finish_reasons() -> dict:
    """The synthetic evaluation with PPO answers of every reason but out_of_vocabulary: control
    tokens (one text twice, two at equal score), broken text (one holding markup), a cut answer."""
    ev = _synthetic_evaluation()
    ppo = ev["policies"]["ppo"]["rows"]
    crafted = [  # (row, finish reason, ended with EOS, response, learned reward)
        (0, "control_token", True, "Thank you.<|im_start|>assistant", 9.0),
        (1, "control_token", False, "Thank you.<|im_start|>assistant", 5.0),
        (2, "control_token", True, "Check the cable.<|im_start|>", 7.0),
        (3, "control_token", True, "Save it.<|im_start|>", 7.0),
        (4, "control_token", True, "Low <|endoftext|>", 1.0),
        (5, "broken_text", False, "Have a \ufffd\ufffd day.\n<script>alert(1)</script>", 3.0),
        (6, "length", False, "Thank you for reporting this. Thank you for", -2.0),
    ]
    for i, finish, ended, text, score in crafted:
        ppo[i].update(finish_reason=finish, ended_with_eos=ended, response=text, learned_reward=score)
    return ev


def test_the_report_counts_each_finish_reason_and_shows_the_highest_scored_examples():
    from rlhf.report.tables import finish_examples_table, finish_reason_table

    ev = _evaluation_with_finish_reasons()
    counts = finish_reason_table(ev)
    assert counts.header[2:] == ["SFT test", "SFT probe rows", "PPO test", "PPO probe rows"]
    by_reason = {r[0]: r[2:] for r in counts.rows}
    assert list(by_reason) == [*rubric.FINISH_REASONS, "all"]
    for k, (pol, pop) in enumerate((("sft", "test"), ("sft", "probe"), ("ppo", "test"), ("ppo", "probe"))):
        rows = [r for r in ev["policies"][pol]["rows"] if r["population"] == pop]
        for reason in rubric.FINISH_REASONS:  # recounted here from the rows
            assert by_reason[reason][k] == str(sum(1 for r in rows if r["finish_reason"] == reason)), (pol, reason)
        assert by_reason["all"][k] == str(len(rows))
    assert by_reason["control_token"][2] == "5" and by_reason["eos"][2] == "5"  # PPO: 12 test rows
    assert by_reason["length"][3] == "4"  # the cut probe context's 4 rows

    quoted = []
    examples = finish_examples_table(ev, lambda s: quoted.append(s) or s)
    ppo_control = [r for r in examples.rows if r[:2] == ["PPO", "control_token"]]
    # distinct texts, highest score first, the shorter text first at equal score; at most 3
    assert [(r[2], r[4], r[5]) for r in ppo_control] == [
        ("9.000", "2", "yes"),
        ("7.000", "1", "yes"),
        ("7.000", "1", "yes"),
    ]
    assert [r[6][0] for r in ppo_control] == [
        "Thank you.⟦<|im_start|>⟧assistant",
        "Save it.⟦<|im_start|>⟧",
        "Check the cable.⟦<|im_start|>⟧",
    ]
    (broken,) = [r for r in examples.rows if r[1] == "broken_text"]
    assert broken[6][0] == "Have a ⟦U+FFFD⟧⟦U+FFFD⟧ day.↵<script>alert(1)</script>" and broken[5] == "no"
    assert not any(r[1] == "eos" for r in examples.rows)  # only answers not ending in EOS as plain text
    assert {r[1] for r in examples.rows if r[0] == "SFT"} == {"length"}  # SFT's cut probe answer
    assert all(r[6][0] in quoted for r in examples.rows)  # model text goes through quote
    html = examples.html()
    assert "⟦&lt;|im_start|&gt;⟧" in html and "&lt;script&gt;" in html and "<script" not in html


def test_the_report_pages_show_the_finish_reasons_section(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    (run / "evaluation/results.json").unlink()
    write_json(run / "evaluation/results.json", _evaluation_with_finish_reasons())
    paths = report.write_reports(run)
    page, md = paths["report.html"].read_text(), paths["report.md"].read_text()
    assert '<section id="finish-reasons">' in page and "## Finish reasons of the held-out answers" in md
    assert "Save it.⟦&lt;|im_start|&gt;⟧" in page and "Save it.⟦<\\|im_start\\|>⟧" in md
    assert "<script>alert" not in page
    for reason in rubric.FINISH_REASONS:
        assert f"<li>{reason}: " in page and f"- {reason}: " in md


def test_the_comparison_table_and_the_summary_show_each_finish_reasons_count():
    from rlhf.report.tables import comparison_table

    ev = _synthetic_evaluation()
    for pol, n_control in (("sft", 0), ("ppo", 4)):
        for pop, m in ev["policies"][pol]["metrics"].items():
            m["finish_reasons"] = {**dict.fromkeys(rubric.FINISH_REASONS, 0), "eos": m["n_rows"] - n_control}
            m["finish_reasons"]["control_token"] = n_control
            m["finish_reasons"] = dict(sorted(m["finish_reasons"].items()))  # as results.json stores it
    rows = comparison_table(ev).rows
    test_rows = rows[1 : next(i for i, r in enumerate(rows) if i and len(r) == 1)]  # the test population's block
    shown = {r[0]: r[1:4] for r in test_rows}
    assert shown["finish reason control_token (count)"] == ["0", "4", "+4"]
    assert shown["finish reason eos (count)"] == ["12", "8", "-4"]
    assert shown["finish reason out_of_vocabulary (count)"] == ["0", "0", "+0"]
    assert "finish_reasons" not in shown  # read through its counts, not shown as one cell
    text = report.print_summary({"evaluation": {"status": "run", **ev}})
    assert "PPO test answers by finish reason: eos: 8, length: 0, control_token: 4" in text


def test_an_evaluation_with_a_reason_name_the_lab_does_not_use_is_still_counted_and_shown():
    """A results file whose rows carry another name (such as undecodable) gets its own row."""
    from rlhf.report.tables import finish_examples_table, finish_reason_table

    ev = _synthetic_evaluation()
    ev["policies"]["ppo"]["rows"][0]["finish_reason"] = "undecodable"
    rows = {r[0]: r for r in finish_reason_table(ev).rows}
    assert rows["undecodable"][1] == "a name this version of the lab does not use"
    assert rows["undecodable"][2:] == ["0", "0", "1", "0"]
    assert [r[1] for r in finish_examples_table(ev, str).rows if r[0] == "PPO"] == ["length", "undecodable"]


def test_report_html_is_self_contained_with_plots_and_tables(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    page = report.write_reports(run)["report.html"].read_text()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I)
    assert "<link" not in page and "<script" not in page and "@import" not in page and "url(" not in page
    imgs = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(imgs) == 5  # the verdict, sft, judge, ppo, timings
    for b64 in imgs:
        assert base64.b64decode(b64)[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(re.findall(r"<img\b", page)) == len(imgs)  # every image is an embedded PNG
    assert page.count("<table") >= 12
    for needle in (
        "SFT vs PPO",
        "95% CI of difference",
        "Politeness probes",
        "wrong-polite outranks",
        "The actor's own probe outputs",
        "Per-token view",
        "advantage A",
        "Timings",
        "Interrupt/resume",
        "0.950",
    ):
        assert needle in page, needle
    for sentence in report.HONESTY:
        assert sentence in page
    # advantage cells coloured by sign
    assert "rgba(22,150,60," in page and "rgba(210,40,40," in page


def test_missing_evaluation_is_reported_as_not_run(tmp_path):
    run = make_synthetic_run(tmp_path / "run", evaluation=False)
    paths = report.write_reports(run)
    res = json.loads(paths["results.json"].read_text())
    assert res["evaluation"]["status"] == "not run"
    assert res["judge_test"]["accuracy"] is None and res["judge_test"]["status"] == "not run"
    for name in ("report.md", "report.html"):
        assert "Evaluation not run" in paths[name].read_text()
    assert "evaluation: not run" in report.print_summary(res)


def test_never_overwrites_and_a_rerun_on_the_same_files_rebuilds_them_to_the_byte(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    report.write_reports(run)
    before = {n: (run / n).read_bytes() for n in report.REPORT_FILES}
    mtimes = {n: (run / n).stat().st_mtime_ns for n in report.REPORT_FILES}
    report.write_reports(run)  # the same bytes again: nothing to write, nothing refused
    assert {n: (run / n).read_bytes() for n in report.REPORT_FILES} == before
    assert {n: (run / n).stat().st_mtime_ns for n in report.REPORT_FILES} == mtimes
    # one file that differs is enough to refuse, saying how to rebuild, and nothing else is written
    run2 = make_synthetic_run(tmp_path / "run2")
    (run2 / "report.md").write_text("old")
    with pytest.raises(FileExistsError, match=r"report.md differ from what this code writes; to rebuild them, move"):
        report.write_reports(run2)
    assert not (run2 / "results.json").exists() and not (run2 / "report.html").exists()
    assert (run2 / "report.md").read_text() == "old"


def test_unfinished_run_is_refused(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    (run / "ppo/history.json").unlink()
    with pytest.raises(FileNotFoundError, match="ppo/history.json"):
        report.write_reports(run)
    assert not any((run / n).exists() for n in report.REPORT_FILES)


@pytest.mark.parametrize(
    "text",
    [
        "PPO raised the helpfulness score by 2 points.",
        "The reward model measures human utility.",
        "Mean user satisfaction: 0.8",
        "the satisfaction score of the judge",
        "This shows how helpful each answer is.",
        "Human satisfaction went up.",
        "<td>Helpfulness</td>",
        "a <b>helpful</b> score",
    ],
)
def test_find_forbidden_wording_flags_names_of_the_score(text):
    hits = report.find_forbidden_wording(text)
    assert hits, text


def test_find_forbidden_wording_allows_the_disclaimers_and_plain_wording():
    honest = "\n".join(report.HONESTY)
    assert report.find_forbidden_wording(honest) == []
    assert report.find_forbidden_wording(f"<ul><li>{report.HONESTY[0]}</li><li>{report.HONESTY[1]}</li></ul>") == []
    assert report.find_forbidden_wording("mean learned reward (predicted score of simulated preferences): 2.1") == []
    assert report.find_forbidden_wording("This may help. Turn the sound back on.") == []
    # an allowed disclaimer does not whitelist the same words elsewhere
    assert report.find_forbidden_wording(honest + "\nThe score is human satisfaction.")
    # the data of an embedded image is not text
    assert report.find_forbidden_wording('<img src="data:image/png;base64,aGVscGZ1bG5lc3M+helpfulness/A==">') == []


def test_spec_9_5_a_report_naming_the_score_human_helpfulness_is_caught(tmp_path, monkeypatch):
    """Regression (SPEC §9.5): the learned score called "human helpfulness" never reaches a report."""
    assert report.find_forbidden_wording("| mean human helpfulness | 1.2 | 3.4 |")
    run = make_synthetic_run(tmp_path / "run")
    monkeypatch.setattr(report.wording, "SCORE_NAME", "human helpfulness")  # where the report reads it
    with pytest.raises(report.ReportWordingError, match="helpfulness"):
        report.write_reports(run)
    assert not any((run / n).exists() for n in report.REPORT_FILES)


def test_print_summary(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    paths = report.write_reports(run)
    res = json.loads(paths["results.json"].read_text())
    text = report.print_summary(res)
    assert str(paths["report.html"].resolve()) in text
    assert "judge test accuracy: 0.950" in text
    assert "rubric success, test" in text and "learned reward, probe_contexts" in text
    sft = res["evaluation"]["policies"]["sft"]["metrics"]["test"]["rubric_success"]
    assert f"{sft:.3f}" in text
    assert "wrong_polite_outranks_correct_plain: 2" in text
    assert report.find_forbidden_wording(text) == []


def test_report_phases_are_the_ppo_loop_phases_in_its_order():
    """The reports label and order the phases that rlhf.ppo times; a phase added to (or renamed
    in) the loop without a label would drop out of the timing table and plot."""
    from rlhf.ppo import PHASES
    from rlhf.report.labels import PHASE_LABELS, PPO_PHASES

    assert PPO_PHASES == PHASES
    assert set(PHASE_LABELS) == set(PHASES)


WARNINGS = {
    "rules_file": "warning_rules.json",
    "rules_sha256": "ab" * 32,
    "window": 5,
    "fired": [
        {"signal": "kl_growth", "iteration": 9, "rule": "kl_growth >= 0.5 for 2 iteration(s)", "stopped_ppo": False},
        {"signal": "truncation_rate", "iteration": 12, "rule": "truncation_rate >= 0.25 for 3 iteration(s)",
         "stopped_ppo": True},
    ],
}  # fmt: skip


def test_the_report_opens_with_a_verdict_and_one_picture_and_keeps_every_warning(tmp_path):
    """What PPO did to held-out test success and to the learned reward, and which warnings fired
    (in the order they fired, from ppo/warnings.json), is the report's first line, then the picture;
    results.json and the printed summary keep the same warnings."""
    run = make_synthetic_run(tmp_path / "run")
    write_json(run / "ppo/warnings.json", WARNINGS)
    paths = report.write_reports(run)
    res = json.loads(paths["results.json"].read_text())
    assert res["warnings"] == WARNINGS
    sft, ppo = (res["evaluation"]["policies"][p]["metrics"]["test"]["rubric_success"] for p in ("sft", "ppo"))
    md = paths["report.md"].read_text()
    first = md.split("## At a glance\n\n", 1)[1].splitlines()[0]
    moved = "raised" if ppo > sft else "lowered" if ppo < sft else "left"
    assert first.startswith(f"Verdict: PPO {moved} held-out test rubric success from {sft:.3f} (SFT) to {ppo:.3f}")
    said = "kl_growth at iteration 9, truncation_rate at iteration 12 (PPO stopped there)"
    assert first.endswith(f"over-optimisation warnings: {said}.")
    html = paths["report.html"].read_text()
    glance = html.split('id="glance"', 1)[1]
    assert glance.index("Verdict: PPO") < glance.index("<img") < glance.index("<table")  # line, picture, tables
    assert f"over-optimisation warnings: {said}" in report.print_summary(res)


@pytest.mark.parametrize(("fired", "said"), [([], "none fired"), (None, "not recorded for this run")])
def test_the_verdict_says_when_no_warning_fired_and_when_none_was_recorded(tmp_path, fired, said):
    run = make_synthetic_run(tmp_path / "run")
    if fired is not None:
        write_json(run / "ppo/warnings.json", {**WARNINGS, "fired": fired})
    res = json.loads(report.write_reports(run)["results.json"].read_text())
    assert f"over-optimisation warnings: {said}." in (run / "report.md").read_text()
    assert f"over-optimisation warnings: {said}" in report.print_summary(res)


def test_the_stage_summaries_and_memory_are_shown_in_words_not_keys(tmp_path):
    from rlhf.report.labels import SUMMARY_LABELS

    run = make_synthetic_run(tmp_path / "run")
    paths = report.write_reports(run)
    res = json.loads(paths["results.json"].read_text())
    keys = [k for s in ("sft", "judge", "ppo") for k in res[s]["summary"]] + list(res["timings"].get("memory") or {})
    assert keys and all(k in SUMMARY_LABELS for k in keys), [k for k in keys if k not in SUMMARY_LABELS]
    md = paths["report.md"].read_text()
    raw = [k for k in keys if "_" in k]  # a key that is not already a plain word
    shown = [k for k in raw if re.search(rf"\| {re.escape(k)} \||{re.escape(k)} \d", md)]
    assert raw and shown == [], shown  # no summary or memory key reaches the report raw
    assert "| mean learned reward, first 10 iterations |" in md


def test_epochs_are_numbered_from_1_as_the_console_numbers_them(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    md = report.write_reports(run)["report.md"].read_text()
    table = md.split("*SFT epochs*\n\n", 1)[1].split("\n\n", 1)[0]
    numbers = [
        line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "epoch" not in line
    ]
    assert numbers == ["1", "2", "3"]  # history epochs 0..2, the console's "sft epoch 1..3"


def test_the_judge_refresh_table_shows_each_refresh_and_its_other_endings():
    """The iterated judge's refreshes as the report shows them: answers not ending in EOS by finish
    reason ("none" when every answer did), or the bare count where a record has no per-reason counts."""
    from rlhf.report.tables import refresh_table

    refreshes = [
        {"after_iteration": 20, "successes": 5, "answers": 8,
         "finish_reasons": {"eos": 6, "length": 2, "control_token": 0},
         "new_pairs": 4, "pairs_so_far": 844, "accuracy_before": 0.25, "accuracy_after": 0.75, "updates": 3},
        {"after_iteration": 40, "successes": 8, "answers": 8, "finish_reasons": {"eos": 8},
         "new_pairs": 0, "pairs_so_far": 844, "accuracy_before": None, "accuracy_after": None, "updates": 0},
        {"after_iteration": 60, "successes": 1, "answers": 8, "without_eos": 3,
         "new_pairs": 7, "pairs_so_far": 851, "accuracy_before": 0.5, "accuracy_after": 1.0, "updates": 1},
    ]  # fmt: skip
    table = refresh_table(refreshes)
    assert table.rows == [
        [20, "5 of 8", "length 2", 4, 844, "0.250", "0.750", 3],
        [40, "8 of 8", "none", 0, 844, "—", "—", 0],
        [60, "1 of 8", "3 without EOS", 7, 851, "0.500", "1.000", 1],
    ]
    assert len(table.header) == len(table.rows[0]) and "no pair, no training" in table.caption
    assert "| 20 | 5 of 8 | length 2 |" in table.md()
