"""Over-optimisation warning signals (rlhf.signals) on hand-made histories whose values are known,
warning rules firing where they must, and their lead, miss and false-alarm counts by hand."""

from __future__ import annotations

import math

import pytest

from rlhf import signals
from rlhf.signals import Rule, choose_rule, first_firing, gold_events, quantile_distance, score_rule, wasserstein_1

pytestmark = pytest.mark.unit


def record(i: int, **over) -> dict:
    """One iteration's record with the logged keys rlhf.signals reads (4 answers, 2 updates)."""
    base = {
        "mean_sequence_log_ratio": 0.1 * i,
        "entropy": 2.0 if i < 6 else 1.0,
        "response_length": 10.0 + i,
        "truncations": 1 if i >= 6 else 0,
        "clip_fraction": [0.0, 0.2],
        "update_shift": [0.01, 0.03],
        "advantage_quantiles": [q + (0.5 if i >= 6 else 0.0) for q in (-1.0, -0.5, 0.0, 0.5, 1.0)],
        "scores": [1.0, 2.0, 3.0, 4.0] if i < 6 else [5.0, 6.0, 7.0, 8.0],
    }
    base.update(over)
    return base


@pytest.fixture
def history():
    return {"iterations": [record(i) for i in range(12)]}


def test_the_signals_of_a_known_history(history):
    s = signals.signal_series(history, w=3)
    assert set(s) == set(signals.SIGNALS)
    assert all(v is None for name in s for v in s[name][:2])  # the early window fills at iteration 2
    # kl: mean of 0.1 i over the window i-2..i = 0.1 (i - 1).
    assert s["kl"][2] == pytest.approx(0.1) and s["kl"][11] == pytest.approx(1.0)
    assert s["kl_growth"][4] is None and s["kl_growth"][5] == pytest.approx(0.3)  # kl[5] - kl[2]
    # entropy 2.0 early; window 6..8 all 1.0 -> drop 1.0; window 5..7 -> (2 + 1 + 1) / 3.
    assert s["entropy_drop"][2] == 0.0 and s["entropy_drop"][7] == pytest.approx(2.0 - 4 / 3)
    assert s["entropy_drop"][8] == pytest.approx(1.0)
    assert s["truncation_rate"][8] == pytest.approx(0.25) and s["truncation_rate"][5] == 0.0
    assert s["length_growth"][5] == pytest.approx((13 + 14 + 15) / 3 - (10 + 11 + 12) / 3)
    assert s["clip_fraction"][3] == pytest.approx(0.1) and s["update_shift"][3] == pytest.approx(0.02)
    # Every advantage quantile shifted by 0.5: W1 = 0.5 once the window is all shifted.
    assert s["advantage_drift"][2] == 0.0 and s["advantage_drift"][8] == pytest.approx(0.5)
    assert s["score_drift"][8] == pytest.approx(4.0) and s["score_drift"][2] == 0.0
    assert s["score_spread"][2] == pytest.approx(math.sqrt(1.25))  # population SD of 1, 2, 3, 4 (x3)
    assert all(v is None for v in s["ensemble_disagreement"]) and all(v is None for v in s["judge_error"])


def test_the_ensemble_and_refresh_signals():
    its = [record(i, member_scores=[[1.0, 1.0, 1.0, 1.0], [3.0, 1.0, 1.0, 1.0]]) for i in range(6)]
    h = {"iterations": its, "refreshes": [{"after_iteration": 4, "accuracy_before": 0.25}]}
    s = signals.signal_series(h, w=2)
    assert s["ensemble_disagreement"][1] == pytest.approx((1.0 + 0 + 0 + 0) / 4)  # SD of (1, 3) is 1
    assert s["judge_error"][:3] == [None, None, None] and s["judge_error"][3:] == [0.75, 0.75, 0.75]


def test_distances_by_hand():
    assert wasserstein_1([0.0, 1.0, 5.0], [2.0, 0.0, 1.0]) == pytest.approx((0 + 0 + 3) / 3)
    assert quantile_distance([0.0, 1.0, 2.0], [0.0, 1.0, 4.0]) == pytest.approx((0 / 2 + 0 + 2 / 2) / 2)
    with pytest.raises(ValueError):
        wasserstein_1([1.0], [1.0, 2.0])


def test_a_rule_fires_after_its_patience():
    series = [None, 0.1, 0.6, 0.7, 0.2, 0.8, 0.9, 0.95]
    assert first_firing(series, Rule("x", 0.5, 1)) == 2
    assert first_firing(series, Rule("x", 0.5, 2)) == 3
    assert first_firing(series, Rule("x", 0.5, 3)) == 7
    assert first_firing(series, Rule("x", 0.99, 1)) is None


def test_gold_events_peak_dip_and_lasting_drop():
    points = [(10, 0.7), (20, 0.8), (30, 0.74), (40, 0.6)]
    assert gold_events(points, 0.75) == {"peak": 20, "first_dip": 40, "drop": 40, "margin": signals.DROP_MARGIN}
    # Without a margin, 10 dips below SFT and recovers; the fall that lasts starts at 30.
    assert gold_events(points, 0.75, margin=0.0) == {"peak": 20, "first_dip": 10, "drop": 30, "margin": 0.0}
    assert gold_events([(10, 0.9), (20, 0.9)], 0.75)["drop"] is None
    recovered = gold_events([(10, 0.5), (20, 0.5), (30, 0.76)], 0.75)
    assert recovered["first_dip"] == 10 and recovered["drop"] is None  # a dip it recovered from


def run(name, series, gold, sft=0.7):
    return {"name": name, "series": {"x": series}, "gold": gold, "sft": sft}


def test_lead_miss_and_false_alarm_counted_by_hand():
    fell_early = run("a", [0.0] * 5 + [1.0] * 20, [(10, 0.72), (20, 0.5)])  # fires at 5, drop at 20: lead 15
    fell_late = run("b", [0.0] * 12 + [1.0] * 13, [(10, 0.5), (20, 0.4)])  # fires at 12, drop at 10: lead -2
    fell_missed = run("c", [0.0] * 25, [(10, 0.6), (20, 0.3)])  # never fires
    held_quiet = run("d", [0.0] * 25, [(10, 0.8), (20, 0.9)])
    held_alarm = run("e", [0.0, 2.0] + [0.0] * 23, [(10, 0.8), (20, 0.9)])  # fires at 1, gold held
    undefined = run("f", [None] * 25, [(10, 0.5), (20, 0.4)])  # the signal does not exist there: not scored
    s = score_rule(Rule("x", 0.5, 1), [fell_early, fell_late, fell_missed, held_quiet, held_alarm, undefined])
    assert [r["lead"] for r in s["runs"]] == [15, -2, None, None, None]
    assert (s["fell"], s["held"], s["early"], s["late"], s["misses"], s["false_alarms"]) == (3, 2, 1, 1, 1, 1)
    assert s["median_lead"] == pytest.approx(6.5)


def test_a_rule_is_chosen_on_its_runs_only_within_the_false_alarm_bound():
    fell = [run(f"f{k}", [0.0] * 3 + [0.4 + 0.1 * k] * 22, [(10, 0.72), (20, 0.3)]) for k in range(3)]
    held = [run(f"h{k}", [0.0] * 10 + [0.45] * 15, [(10, 0.8), (20, 0.8)]) for k in range(5)]
    rule = choose_rule("x", fell + held, patiences=(1,), max_false_alarm_rate=0.2)
    # 0.45 or below would fire on every held run; 0.5 is the lowest value firing on none of them.
    assert rule == Rule("x", 0.5, 1)
    s = score_rule(rule, fell + held)
    assert (s["early"], s["misses"], s["false_alarms"]) == (2, 1, 0)
    assert choose_rule("x", [run("n", [None] * 5, [(10, 0.7)])]) is None


def test_a_missing_rules_file_is_refused_naming_it_never_read_as_no_rules(tmp_path, monkeypatch):
    from rlhf import signals

    gone = tmp_path / "warning_rules.json"
    with pytest.raises(FileNotFoundError, match="warning-rules file .*warning_rules.json.*reinstall"):
        signals.frozen_rules(gone)
    monkeypatch.setattr(signals, "RULES_FILE", gone)  # a package installed without its data file
    with pytest.raises(FileNotFoundError, match="ship inside the rlhf package"):
        signals.frozen_rules()
