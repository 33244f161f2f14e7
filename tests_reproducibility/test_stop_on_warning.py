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


def ppo_run(folder, small_profile_file, stop: bool):
    profile = override(load_profile(str(small_profile_file)), {("ppo", "stop_on_warning"): stop})
    ctx = lab.open_context(folder, profile)
    for stage in (lab.stage_sft, lab.stage_judge):
        stage(ctx, protocol=False)
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
    # Stopped after the iteration where it fired (iteration patience - 1).
    assert state["iterations_done"] == patience and len(state["history"]["iterations"]) == patience
    fired = f"warning: over-optimisation signal truncation_rate fired at iteration {patience - 1}"
    assert fired in capsys.readouterr().out
    identity = read_json(ctx.run / "ppo" / "state-continuous.pt.gz.json")["identity"]
    assert identity["warning_rules"] == sha256_file(rules_file)


def test_without_the_option_a_warning_is_printed_and_changes_nothing(rules_file, small_profile_file, tmp_path, capsys):
    ctx = ppo_run(tmp_path / "run", small_profile_file, stop=False)
    state = load_state(ctx.run / "ppo" / "state-continuous.pt.gz")
    assert state["iterations_done"] == ctx.profile.ppo.iterations == 4
    patience = json.loads(rules_file.read_text())["rules"][0]["patience"]
    assert f"fired at iteration {patience - 1}" in capsys.readouterr().out
    assert "warning_rules" not in read_json(ctx.run / "ppo" / "state-continuous.pt.gz.json")["identity"]
