"""Each command that hands its work to one library function (`rlhf prepare`, `rlhf report`, the
studies' commands ...) passes that function the options as given, says what it wrote in one line
and exits 0, or 1 where its answer is "no" (`rlhf reproduce` on a row that differs). The library
function is replaced by a recorder: what it computes is tested with it, here only the wiring from
the command line to it (an option passed to the wrong parameter, or not at all, fails here)."""

from __future__ import annotations

import json
import signal
from types import SimpleNamespace

import pytest

from rlhf.cli import main

pytestmark = pytest.mark.unit


@pytest.fixture
def calls(monkeypatch):
    """Replace `module.name` by a recorder that returns `value`; the calls it got, in order."""
    import importlib

    got: list = []

    def replace(module: str, name: str, value):
        def recorder(*args, **kwargs):
            got.append((name, args, kwargs))
            return value

        monkeypatch.setattr(importlib.import_module(module), name, recorder)

    old = signal.getsignal(signal.SIGINT)  # main() installs its Ctrl-C handler
    yield replace, got
    signal.signal(signal.SIGINT, old)


STAT = {"mean": -0.25, "sd": 0.1, "n": 3, "t95": [-0.5, 0.0], "positive": 0}

# argv -> (module, function, what it returns, the call it must get, rc, a line the command prints)
CASES = {
    "prepare": (
        ["prepare", "--out", "C", "--revision", "r002"],
        "rlhf.corpus", "prepare", {"audit": {"pairs": 7}},
        (("C",), {"revision": "r002"}), 0, "corpus written to C",
    ),
    "build-embedded": (
        ["build-embedded", "--out", "B", "--seed", "7", "--text", "control"],
        "rlhf.embedded", "build_embedded", {"text": "control", "parameters": 12345, "build_seconds": 0.4},
        (("B",), {"seed": 7, "text": "control"}), 0,
        "embedded base (control text): 12,345 parameters, built in 0.4 s -> B",
    ),
    "export-verl": (
        ["export-verl", "--run", "R", "--out", "V", "--nnodes", "2", "--gpus-per-node", "8", "--seeds", "3",
         "--profile", "P.toml", "--model-dir", "M"],
        "rlhf.export_verl", "export_verl", {"files": ["a", "b"]},
        (("R", "V"), {"nnodes": 2, "gpus_per_node": 8, "seeds": 3, "profile": "P.toml", "model_dir": "M"}), 0,
        "verl hand-off of R (2 files) -> V; launch with: bash V/launch/launch.sh",
    ),
    "reproduce-identical": (
        ["reproduce", "results/x", "--seed", "2", "--work", "W", "--profile", "P.toml"],
        "rlhf.studies.reproduce", "reproduce", {"identical": True, "seconds": 12.0},
        (("results/x", 2, "W"), {"profile_name": "P.toml"}), 0,
        "seed 2 of results/x: recomputed in 12 s, byte for byte the committed row",
    ),
    "reproduce-differs": (
        ["reproduce", "results/x", "--seed", "0"],
        "rlhf.studies.reproduce", "reproduce", {"identical": False, "first_difference": "row.gold: 1 != 2"},
        (("results/x", 0, None), {"profile_name": None}), 1,
        "seed 0 of results/x differs from the committed row: row.gold: 1 != 2",
    ),
    "confirm-oracle": (
        ["confirm-oracle", "--testbed", "T.json", "--out", "O", "--replicate", "O1/room.json", "--workers", "3"],
        "rlhf.studies.room", "confirm_oracle", {"room_shown": False},
        (("T.json", "O"), {"workers": 3, "replicate": "O1/room.json"}), 0,
        "room shown on test: no; written to O/room.json",
    ),
    "choose-design": (
        ["choose-design", "--testbed", "T.json", "--out", "D", "--workers", "1"],
        "rlhf.studies.choice", "choose_design", {"chosen": {"arm": "c2", "iteration": 30}},
        (("T.json", "D"), {"workers": 1}), 0, "chosen: c2 at iteration 30; written to D/choice.json",
    ),
    "confirm-design": (
        ["confirm-design", "--choice", "C.json", "--out", "V"],
        "rlhf.studies.verdict", "confirm_design", {},
        (("C.json", "V"), {"workers": None}), 0, "written to V/verdict.json",
    ),
    "compare-methods-choice": (
        ["compare-methods", "--choice", "C.json", "--out", "M", "--workers", "2"],
        "rlhf.studies.compare_methods", "compare_methods", {},
        (("C.json", "M"), {"workers": 2}), 0, "written to M/methods.json",
    ),
    "compare-methods-frontier": (
        ["compare-methods", "--frontier", "F/frontier.json", "--out", "M"],
        "rlhf.studies.compare_methods", "compare_methods", {},
        (("F/frontier.json", "M"), {"workers": None}), 0, "written to M/methods.json",
    ),
    "confirm-methods": (
        ["confirm-methods", "--methods", "M/methods.json", "--out", "MT", "--workers", "2"],
        "rlhf.studies.compare_methods", "confirm_methods", {},
        (("M/methods.json", "MT"), {"workers": 2}), 0, "written to MT/confirmation.json",
    ),
    "nested": (
        ["nested", "--choice", "C.json", "--out", "N"],
        "rlhf.studies.nested", "run_nested", {},
        (("C.json", "N"), {"workers": None}), 0, "written to N/nested.json",
    ),
    "choose-testbed": (
        ["choose-testbed", "--out", "T.json", "--work", "W", "--revision", "r001", "--round", "1", "--workers", "2"],
        "rlhf.studies.testbed", "choose_testbed", {"chosen": None},
        (("T.json", "W"), {"revision": "r001", "profile_name": "embedded", "workers": 2, "round_number": 1}), 0,
        "chosen testbed: none: no candidate qualifies",
    ),
    "seeds": (
        ["seeds", "--out", "S", "--n", "3", "--revision", "r002", "--workers", "1", "--sft-budget", "sft-e6",
         "--study-seed", "4"],
        "rlhf.studies.seeds", "run_study",
        {"across": {f"rubric_success.{key}.ppo_minus_sft": STAT for key in ("test", "all_unique_contexts")}},
        (("S",), {"n": 3, "revision": "r002", "workers": 1, "sft_budget": "sft-e6", "study_seed": 4,
                  "profile_name": "embedded"}), 0,
        "PPO - SFT rubric_success.test: mean -0.250, SD 0.100, 95% t-interval over 3 seeds [-0.500, +0.000], "
        "positive in 0 of 3",
    ),
    "frontier": (
        ["frontier", "--out", "F", "--n", "2", "--revision", "r001", "--sft-budget", "sft-e7", "--grid", "1,2"],
        "rlhf.studies.frontier.study", "run_frontier",
        {"selection": {"arm": "c2", "iteration": 30, "mean_validation_gold": 0.765, "sft_mean_validation_gold": 0.665}},
        (("F",), {"n": 2, "revision": "r001", "sft_budget": "sft-e7", "workers": None, "profile_name": "embedded",
                  "settings": "the default arms at c 1 and 2"}), 0,
        "chosen on validation: c2 at iteration 30, mean validation rubric success 0.765 (SFT 0.665)",
    ),
    "frontier-confirm": (
        ["frontier", "--out", "F", "--confirm", "5", "--workers", "2"],
        "rlhf.studies.frontier.confirmation", "run_confirmation", {"points": []},
        (("F",), {"n": 5, "workers": 2}), 0, "F/confirmation.json and F/confirmation.html",
    ),
    "frontier-summarise": (
        ["frontier", "--out", "F", "--summarise-to", "G"],
        "rlhf.studies.frontier.study", "summarise_to", None, (("F", "G"), {}), 0, "",
    ),
    "frontier-warnings": (
        ["frontier", "--out", "F", "--choose-warnings", "W.json"],
        "rlhf.studies.warnings", "choose_rules",
        {"rules": [{"signal": "kl", "threshold": 0.5, "patience": 2}, {"signal": "length", "threshold": None}]},
        (("F", "W.json"), {}), 0, "  length: never defined",
    ),
    "choose-sft-budget": (
        ["choose-sft-budget", "--out", "B.json", "--work", "W", "--budgets", "sft-e6,sft-e7", "--previous", "P.json",
         "--workers", "1"],
        "rlhf.studies.sft_budget", "choose_sft_budget", {"chosen": "sft-e6", "rule": "the rule"},
        (("B.json", "W"), {"revision": "r002", "profile_name": "embedded", "budgets": ["sft-e6", "sft-e7"],
                           "previous": ["P.json"], "workers": 1}), 0,
        "chosen SFT budget: sft-e6 (the rule); written to B.json",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_command_passes_its_options_to_its_function_and_says_what_it_wrote(case, calls, capsys):
    argv, module, name, value, (args, kwargs), rc, line = CASES[case]
    replace, got = calls
    replace(module, name, value)
    assert main(argv) == rc
    if kwargs.get("settings"):  # the frontier's Settings: its arms from the given grid
        from rlhf.studies.frontier.arms import Settings, default_arms

        kwargs = {**kwargs, "settings": Settings(arms=default_arms((1.0, 2.0)))}
    assert got == [(name, args, kwargs)]
    out = capsys.readouterr().out
    assert line in out and out.count(line) == 1
    if case == "prepare":  # the audit, as JSON, before the closing line
        assert json.loads(out[: out.index("corpus written")]) == {"pairs": 7}


def test_evaluate_and_report_run_their_stage_on_the_named_run(calls, capsys, monkeypatch, tmp_path):
    replace, got = calls
    import rlhf.cli.lab as cli_lab

    opened = []

    def run_context(args):
        opened.append(args.run)
        return SimpleNamespace(run=tmp_path / args.run)

    monkeypatch.setattr(cli_lab, "run_context", run_context)
    replace("rlhf.evaluate", "stage_evaluate", None)
    assert main(["evaluate", "--run", "R"]) == 0
    assert opened == ["R"] and got[0][0] == "stage_evaluate" and got[0][1][0].run == tmp_path / "R"
    assert f"evaluation written to {tmp_path / 'R' / 'evaluation' / 'results.json'}" in capsys.readouterr().out

    results = tmp_path / "results.json"
    results.write_text(json.dumps({"verdict": "v"}))
    replace("rlhf.report", "write_reports", {"results.json": str(results)})
    replace("rlhf.report", "print_summary", "the one-line summary")
    assert main(["report", "--run", "R2"]) == 0
    assert got[1] == ("write_reports", ("R2",), {}) and got[2] == ("print_summary", ({"verdict": "v"},), {})
    assert capsys.readouterr().out.strip() == "the one-line summary"
