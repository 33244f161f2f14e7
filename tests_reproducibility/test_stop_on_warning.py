"""`rlhf lab --stop-on-warning`: PPO stops after the iteration where a frozen warning rule fires,
and the interrupt/resume protocol still gives bit-identical states when the rule fires in the
resumed leg. Without the option a firing rule is printed and changes nothing.

The rules file is a test's own (rlhf.signals.RULES_FILE patched): window 1 and one rule,
truncation_rate >= 0 for P iterations, which fires at iteration P - 1 of any run (every
answer's truncation rate is at least 0). With P = 3 it fires after the protocol's boundary (2
iterations): the interrupted leg ends before it and the resumed leg meets it. With P = 2 it fires
in the interrupted leg's last iteration: the resumed leg starts from a history that has fired
and must not train on.
"""

from __future__ import annotations

import json

import pytest

from rlhf import lab, signals
from rlhf.checkpoint import load_state
from rlhf.config import load_profile, override
from rlhf.io import read_json, sha256_file

pytestmark = [pytest.mark.unit, pytest.mark.xdist_group("designs")]

RULES = {
    "format": signals.RULES_FORMAT,
    "window": 1,
    "drop_margin": signals.DROP_MARGIN,
    "rules": [{"signal": "truncation_rate", "threshold": 0.0, "patience": 3}],
}


@pytest.fixture(params=[3, 2], ids=["fires_in_the_resumed_leg", "fires_before_the_boundary"])
def rules_file(tmp_path, monkeypatch, request):
    path = tmp_path / "warning_rules.json"
    rules = {**RULES, "rules": [{**RULES["rules"][0], "patience": request.param}]}
    path.write_text(json.dumps(rules))
    monkeypatch.setattr(signals, "RULES_FILE", path)
    return path


def ppo_run(folder, small_profile_file, stop: bool, training_protocol: bool = False):
    profile = override(load_profile(str(small_profile_file)), {("ppo", "stop_on_warning"): stop})
    ctx = lab.open_context(folder, profile)
    for stage in (lab.stage_sft, lab.stage_judge):
        stage(ctx, protocol=training_protocol)
    lab.stage_ppo(ctx)
    return ctx


def test_a_warning_stops_ppo_there_and_the_resumed_leg_equals_the_continuous(
    rules_file, small_profile_file, tmp_path, capsys
):
    ctx = ppo_run(tmp_path / "run", small_profile_file, stop=True)
    check = read_json(ctx.run / "ppo" / "resume_check.json")
    assert check["identical"] is True and check["boundary"] == 2
    patience = json.loads(rules_file.read_text())["rules"][0]["patience"]
    state = load_state(ctx.run / "ppo" / "state-continuous.pt.gz")
    # Stopped after the iteration where it fired: iteration `patience`, counted from 1 as the console counts.
    assert state["iterations_done"] == patience and len(state["history"]["iterations"]) == patience
    fired = f"warning: over-optimisation signal truncation_rate fired at iteration {patience} "
    assert fired in capsys.readouterr().out
    kept = read_json(ctx.run / "ppo" / "warnings.json")
    assert kept["rules_sha256"] == sha256_file(rules_file)
    assert kept["fired"] == [
        {"signal": "truncation_rate", "iteration": patience, "rule": kept["fired"][0]["rule"], "stopped_ppo": True}
    ]
    identity = read_json(ctx.run / "ppo" / "state-continuous.pt.gz.json")["identity"]
    assert identity["warning_rules"] == sha256_file(rules_file)


def test_without_the_option_a_warning_is_printed_and_changes_nothing(rules_file, small_profile_file, tmp_path, capsys):
    ctx = ppo_run(tmp_path / "run", small_profile_file, stop=False, training_protocol=True)
    state = load_state(ctx.run / "ppo" / "state-continuous.pt.gz")
    assert state["iterations_done"] == ctx.profile.ppo.iterations == 4
    patience = json.loads(rules_file.read_text())["rules"][0]["patience"]
    out = capsys.readouterr().out
    # Each thing said once over the protocol's three legs: the warning where it fired (the resumed
    # leg re-reads the boundary's history, the continuous leg repeats the run), the last PPO
    # iteration, each epoch of SFT and the judge; the leg that checks the run says one line.
    assert out.count("warning: over-optimisation signal") == 1, out
    assert f"truncation_rate fired at iteration {patience} " in out
    kept = read_json(ctx.run / "ppo" / "warnings.json")["fired"]
    assert [(w["signal"], w["iteration"], w["stopped_ppo"]) for w in kept] == [("truncation_rate", patience, False)]
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("ppo iteration")] == ["ppo iteration 4"]
    for stage in ("sft", "judge"):
        said = [line.split(":")[0] for line in out.splitlines() if line.startswith(f"{stage} epoch")]
        assert said == [f"{stage} epoch 1", f"{stage} epoch 2"], out
    assert out.count("ppo: continuous run from scratch (compared with the resumed one)") == 1
    assert "warning_rules" not in read_json(ctx.run / "ppo" / "state-continuous.pt.gz.json")["identity"]


def test_only_the_named_signals_rules_stop_ppo(small_profile_file, tmp_path, monkeypatch, capsys):
    """With [ppo] stop_signals, a firing rule of another signal is printed and changes nothing;
    the named signal's rule (here one that never fires) is the only one that could stop PPO."""
    path = tmp_path / "warning_rules.json"
    never = {"signal": "kl_growth", "threshold": 1e30, "patience": 1}
    path.write_text(json.dumps({**RULES, "rules": [{**RULES["rules"][0], "patience": 2}, never]}))
    monkeypatch.setattr(signals, "RULES_FILE", path)
    changes = {("ppo", "stop_on_warning"): True, ("ppo", "stop_signals"): ("kl_growth",)}
    ctx = lab.open_context(tmp_path / "run", override(load_profile(str(small_profile_file)), changes))
    for stage in (lab.stage_sft, lab.stage_judge, lab.stage_ppo):
        stage(ctx, protocol=False)
    state = load_state(ctx.run / "ppo" / "state-continuous.pt.gz")
    assert state["iterations_done"] == ctx.profile.ppo.iterations == 4  # truncation_rate fired, did not stop
    out = capsys.readouterr().out
    assert "signal truncation_rate fired at iteration 2 (" in out and "PPO stops here" not in out
    assert read_json(ctx.run / "ppo" / "state-continuous.pt.gz.json")["identity"]["warning_rules"] == sha256_file(path)


def test_a_stop_signal_needs_the_option_a_known_name_and_a_frozen_rule(small_profile_file, tmp_path, monkeypatch):
    from rlhf.config import ProfileError

    base = load_profile(str(small_profile_file))
    with pytest.raises(ProfileError, match="set stop_on_warning = true"):
        override(base, {("ppo", "stop_signals"): ("kl",)})
    with pytest.raises(ProfileError, match="not kl_grwth"):
        override(base, {("ppo", "stop_on_warning"): True, ("ppo", "stop_signals"): ("kl_grwth",)})
    with pytest.raises(ProfileError, match="not repeated"):
        override(base, {("ppo", "stop_on_warning"): True, ("ppo", "stop_signals"): ("kl", "kl")})
    path = tmp_path / "warning_rules.json"
    path.write_text(json.dumps(RULES))  # a rule for truncation_rate only
    monkeypatch.setattr(signals, "RULES_FILE", path)
    profile = override(base, {("ppo", "stop_on_warning"): True, ("ppo", "stop_signals"): ("kl",)})
    with pytest.raises(ValueError, match="stop_signals kl: no frozen rule"):
        lab.stop_rules_identity(profile)
    # A run opened with that profile is refused before its corpus or base is written.
    run = tmp_path / "run"
    with pytest.raises(ValueError, match="stop_signals kl: no frozen rule"):
        lab.open_context(run, profile)
    assert not run.exists() or list(run.iterdir()) == []
    named = override(base, {("ppo", "stop_on_warning"): True, ("ppo", "stop_signals"): ("truncation_rate",)})
    assert lab.stop_rules_identity(named) == {"warning_rules": sha256_file(path)}
    assert lab.stop_rules_identity(base) == {}


def test_the_command_line_names_the_stopping_signals(small_profile_file):
    from rlhf import cli

    parser = cli.build_parser()
    args = ["lab", "--out", "x", "--profile", str(small_profile_file)]
    named = cli.profile_of(parser.parse_args([*args, "--stop-on-warning", "kl_growth", "kl"]))
    assert (named.ppo.stop_on_warning, named.ppo.stop_signals) == (True, ("kl_growth", "kl"))
    anyrule = cli.profile_of(parser.parse_args([*args, "--stop-on-warning"]))
    assert (anyrule.ppo.stop_on_warning, anyrule.ppo.stop_signals) == (True, ())
    off = cli.profile_of(parser.parse_args(args))
    assert (off.ppo.stop_on_warning, off.ppo.stop_signals) == (False, ())
