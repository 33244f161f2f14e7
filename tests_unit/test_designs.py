"""The registry of reward designs (rlhf.designs): each formula by hand, what each design reads,
the profile check made from the table (unknown names, keys of other designs, an ensemble too
small: refused at load, before anything is written), and every layer that lists or branches on
designs reading the same table."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from rlhf import designs
from rlhf.config import ProfileError, load_profile, override
from rlhf.designs import DESIGNS, Inputs, paid

pytestmark = pytest.mark.unit

SCORE = torch.tensor([3.0, -2.0, 5.0])
TRUNCATED = torch.tensor([False, True, True])


def test_the_judge_designs_pay_the_score_itself_and_the_alternatives_their_formula():
    x = Inputs(SCORE, TRUNCATED, score_mean=1.0, score_sd=2.0)
    assert paid("judge", x) is SCORE  # SPEC §6: untouched
    assert paid("iterated-judge", x) is SCORE  # the judge as last refreshed
    assert paid("standardised-judge", x).tolist() == [1.0, -1.5, 2.0]  # (s - 1) / 2
    assert paid("eos-less-replaced", x).tolist() == [3.0, 0.0, 0.0]  # token_rewards then adds the penalty alone
    oracle = Inputs(SCORE, TRUNCATED, success=torch.tensor([1.0, 0.0, 1.0]))
    assert paid("oracle", oracle).tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="oracle design needs one rubric success per response, got None"):
        paid("oracle", x)
    with pytest.raises(ValueError, match="unknown reward design 'whitened': the registered designs are judge, "):
        paid("whitened", x)


def test_an_ensembles_worst_case_is_the_minimum_of_its_members():
    g = torch.Generator().manual_seed(3)
    members = torch.randn(4, 6, generator=g) * 5  # [k, B]
    expected = [min(float(members[m, b]) for m in range(4)) for b in range(6)]
    assert designs.ensemble_min(members).tolist() == expected
    got = paid("ensemble-min", Inputs(members[0], torch.zeros(6, dtype=torch.bool), member_scores=members))
    assert got.tolist() == expected


def test_an_ensembles_mean_and_uncertainty_weighted_scores():
    members = torch.tensor([[1.0, 4.0], [3.0, 4.0], [5.0, 4.0], [7.0, 4.0]])  # [4, 2]
    sd = math.sqrt(((1 - 4) ** 2 + (3 - 4) ** 2 + (5 - 4) ** 2 + (7 - 4) ** 2) / 4)  # divisor k
    assert designs.ensemble_mean(members).tolist() == [4.0, 4.0]
    assert designs.ensemble_uncertainty(members, 0.5).tolist() == pytest.approx([4.0 - 0.5 * sd, 4.0], abs=1e-6)
    x = Inputs(members[0], torch.zeros(2, dtype=torch.bool), member_scores=members, ensemble_lambda=2.0)
    for name, want in (("ensemble-mean", [4.0, 4.0]), ("ensemble-uncertainty", [4.0 - 2 * sd, 4.0])):
        assert paid(name, x).tolist() == pytest.approx(want, abs=1e-6)


def test_an_ensemble_design_refuses_scores_that_are_not_its_members():
    score, no = torch.tensor([1.0, 2.0]), torch.zeros(2, dtype=torch.bool)
    for members, match in (
        (None, "needs every member's score"),
        (torch.ones(3, 5), "needs every member's score"),
        (torch.ones(3, 2), "member 0 is the lab's judge"),
    ):
        with pytest.raises(ValueError, match=match):
            paid("ensemble-min", Inputs(score, no, member_scores=members))


def test_a_truncation_flag_that_is_not_a_mask_is_refused():
    with pytest.raises(ValueError, match="only 0 and 1"):
        paid("eos-less-replaced", Inputs(SCORE, torch.tensor([0.0, 0.5, 1.0])))


def test_what_each_design_reads_decides_what_the_lab_and_ppo_gather():
    assert set(designs.NAMES) == set(DESIGNS) and designs.DEFAULT == designs.NAMES[0] == "judge"
    for d in DESIGNS.values():
        assert d.reads and set(d.reads) <= set(designs.READS), d.name
    assert designs.ENSEMBLES == ("ensemble-mean", "ensemble-min", "ensemble-uncertainty")
    assert [n for n, d in DESIGNS.items() if d.refreshes_judge] == ["iterated-judge"]
    assert [n for n, d in DESIGNS.items() if d.reads_target] == ["oracle"]
    assert [n for n, d in DESIGNS.items() if d.needs_actions] == ["oracle", "iterated-judge"]
    # The lab offers every design it can run without a measurement made first.
    assert set(designs.NAMES) - set(designs.LAB_OPTIONS) == {"standardised-judge"}


def test_an_unknown_design_is_refused_at_profile_load_naming_the_registered_ones():
    p = load_profile("embedded")
    for bad in ("whitened", "ensemble-max", "Judge"):
        with pytest.raises(
            ProfileError, match=rf"table \[ppo\]: reward_design must be one of judge, standardised-judge, .*not '{bad}'"
        ):
            override(p, {("ppo", "reward_design"): bad})


def test_a_key_of_another_design_is_refused_so_no_setting_is_ignored_silently():
    p = load_profile("embedded")
    assert (p.ppo.reward_design, p.ppo.score_mean, p.ppo.score_sd) == ("judge", 0.0, 1.0)
    for key, value, owner in (
        ("score_sd", 15.0, "'standardised-judge'"),
        ("refresh_every", 7, "'iterated-judge'"),
        ("ensemble_size", 3, "'ensemble-mean' and 'ensemble-min' and 'ensemble-uncertainty'"),
        ("ensemble_lambda", 2.0, "'ensemble-uncertainty'"),
    ):
        with pytest.raises(ProfileError, match=f"{key} applies to reward_design {owner} only, not 'judge'"):
            override(p, {("ppo", key): value})
    with pytest.raises(ProfileError, match="ensemble_lambda applies to reward_design 'ensemble-uncertainty' only"):
        override(p, {("ppo", "reward_design"): "ensemble-min", ("ppo", "ensemble_lambda"): 2.0})
    # Its own keys are the design's to set.
    q = override(p, {("ppo", "reward_design"): "standardised-judge", ("ppo", "score_sd"): 15.5})
    assert q.ppo.score_sd == 15.5
    assert override(p, {("ppo", "reward_design"): "ensemble-uncertainty", ("ppo", "ensemble_lambda"): 2.0})
    with pytest.raises(ProfileError, match="score_sd must be greater than 0, not 0.0"):
        override(p, {("ppo", "reward_design"): "standardised-judge", ("ppo", "score_sd"): 0.0})


def test_an_ensemble_of_one_judge_is_refused_at_load():
    p = load_profile("embedded")
    with pytest.raises(ProfileError, match="ensemble_size"):
        override(p, {("ppo", "reward_design"): "ensemble-min", ("ppo", "ensemble_size"): 1})
    assert override(p, {("ppo", "reward_design"): "ensemble-min", ("ppo", "ensemble_size"): 2}).ppo.ensemble_size == 2


def test_the_new_designs_keys_are_range_checked():
    p = load_profile("embedded")
    for design, key, bad in (
        ("iterated-judge", "refresh_every", 0),
        ("iterated-judge", "refresh_prompts", 0),
        ("iterated-judge", "refresh_updates", 0),
        ("ensemble-uncertainty", "ensemble_lambda", -0.5),
    ):
        with pytest.raises(ProfileError, match=key):
            override(p, {("ppo", "reward_design"): design, ("ppo", key): bad})


def test_the_command_line_the_profile_doc_and_the_report_read_the_table():
    from rlhf import cli
    from rlhf.config import Ppo

    parser = cli.build_parser()
    lab = parser._subparsers._group_actions[0].choices["lab"]  # type: ignore[union-attr]
    (option,) = [a for a in lab._actions if "--reward-design" in a.option_strings]
    assert tuple(option.choices) == designs.LAB_OPTIONS
    for name in designs.LAB_OPTIONS:
        assert f"'{name}'" in option.help and designs.label(name) in option.help
    doc = Ppo.__dataclass_fields__["reward_design"].metadata["doc"]
    assert all(repr(n) in doc for n in designs.NAMES if n != designs.DEFAULT)
    from rlhf.report.results import _reward_design

    its = [{"reward_design": "ensemble-min", "member_scores": [[0.0], [1.0]]}]
    assert _reward_design({"iterations": its}) == {
        "design": "ensemble-min",
        "what": DESIGNS["ensemble-min"].label,
        "ensemble_size": 2,
    }
    assert _reward_design({"iterations": [{}]})["what"] == DESIGNS["judge"].label


def test_the_registry_and_the_profile_check_import_no_torch():
    code = "import sys, rlhf.designs, rlhf.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
