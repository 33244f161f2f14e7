"""The SFT-budget rule qualifies a budget on the oracle control's GAIN over SFT (at least
rlhf.studies.sft_budget.GAIN), read from the oracle study's mean curve: an oracle whose own gold
is high but adds little to SFT leaves no room, and one whose gold is modest but adds much does."""

import pytest

from rlhf.studies import sft_budget

pytestmark = pytest.mark.unit


def oracle_study(sft_per_seed, best_gold, best_iteration):
    """A frontier.json of the oracle arm alone, as run_frontier returns it: the seeds' SFT gold and
    the oracle's best point of the mean curve (gain = best gold - the seeds' mean SFT gold)."""
    sft = sum(sft_per_seed) / len(sft_per_seed)
    return {
        "sft_level": {"mean": sft},
        "seeds": [{"sft": {"gold": g}} for g in sft_per_seed],
        "arms": {"oracle": {"best": {"gold": best_gold, "iteration": best_iteration, "gain": best_gold - sft}}},
    }


@pytest.mark.parametrize(
    "sft_per_seed, best_gold, qualifies",
    [
        ([0.90, 0.94, 0.92], 0.97, False),  # gold far above GAIN, gain +0.05: no room
        ([0.20, 0.30, 0.25], 0.36, True),  # gold modest, gain +0.11: room
        ([0.05, 0.04, 0.06], 0.149, False),  # gold above GAIN, gain +0.099: just short
    ],
)
def test_a_budget_qualifies_on_the_oracle_gain_over_sft_not_on_its_gold(
    monkeypatch, tmp_path, sft_per_seed, best_gold, qualifies
):
    calls = []

    def run_frontier(folder, **kw):
        calls.append((folder, kw["sft_budget"], [a.name for a in kw["settings"].arms]))
        return oracle_study(sft_per_seed, best_gold, 40)

    monkeypatch.setattr(sft_budget, "run_frontier", run_frontier)
    got = sft_budget.oracle_gain(tmp_path, "sft-e6", "r002", "embedded", 1, print)
    sft = sum(sft_per_seed) / 3
    assert calls == [(tmp_path / "frontier-sft-e6", "sft-e6", ["oracle"])]
    assert got["gain"] == pytest.approx(best_gold - sft) and got["sft_gold"] == pytest.approx(sft)
    assert got["best_gold"] == best_gold and got["best_iteration"] == 40
    assert got["sft_gold_per_seed"] == sft_per_seed
    assert got["qualifies"] is qualifies
    assert best_gold >= sft_budget.GAIN  # the premise: a rule on the oracle's own gold would pass each
