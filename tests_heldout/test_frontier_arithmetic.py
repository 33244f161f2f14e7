"""The over-optimisation frontier's arithmetic (SPEC §12): the best-of-n KL bound, the fits, the
seed interval of a bounded quantity, profile text, finish-reason counts, and that validation
measurements read the learning view only."""

from __future__ import annotations

import math
import random

import pytest
from frontier_checks import FAULTS, reason_counts

from rlhf.config import ProfileError, load_profile, profile_text_with
from rlhf.studies.statistics import across_seeds, gao_fit
from rlhf.studies.validation import bon_kl_bound, validation_prompts

pytestmark = pytest.mark.unit


def _exact_bon_kl(n: int, outcomes: int) -> float:
    """KL(best-of-n || uniform) over `outcomes` equally likely, distinct-scored outcomes: the i-th
    best of N is kept with probability (i/N)^n - ((i-1)/N)^n."""
    kl = 0.0
    for i in range(1, outcomes + 1):
        p = (i / outcomes) ** n - ((i - 1) / outcomes) ** n
        if p > 0:
            kl += p * math.log(p * outcomes)
    return kl


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_best_of_n_kl_bound_is_the_no_ties_limit(n):
    bound = bon_kl_bound(n)
    assert bound == pytest.approx(math.log(n) - (n - 1) / n, abs=1e-15)
    coarse, fine = _exact_bon_kl(n, 20), _exact_bon_kl(n, 200_000)
    assert coarse <= bound + 1e-12  # ties (coarse outcomes) only lower it: an upper bound
    assert fine == pytest.approx(bound, abs=1e-3)


def test_best_of_n_refuses_n_below_one():
    with pytest.raises(ValueError, match="n >= 1"):
        bon_kl_bound(0)


@pytest.mark.parametrize("alpha,beta", [(0.3, 0.2), (1.0, 0.5), (0.05, 0.4)])
def test_rl_fit_recovers_known_alpha_beta(alpha, beta):
    rng = random.Random(7)
    ds = [0.1 * k for k in range(1, 40)]
    pts = [(d, d * (alpha - beta * math.log(d)) + rng.gauss(0, 1e-3)) for d in ds]
    fit = gao_fit(pts, "rl")
    assert fit["alpha"] == pytest.approx(alpha, abs=5e-3)
    assert fit["beta"] == pytest.approx(beta, abs=5e-3)
    assert fit["d_star"] == pytest.approx(math.exp(alpha / beta - 1), rel=0.05)
    assert fit["describes"] and fit["r2"] > 0.99
    assert len(fit["residuals"]) == len(pts)


def test_bon_fit_recovers_known_alpha_beta_and_refuses_a_poor_one():
    pts = [(d, d * (0.4 - 0.25 * d)) for d in (0.2, 0.5, 0.8, 1.1, 1.4, 1.7)]
    fit = gao_fit(pts + [(0.0, 0.0)], "bon")  # d = 0 carries nothing
    assert fit["n"] == 6
    assert (fit["alpha"], fit["beta"]) == (pytest.approx(0.4), pytest.approx(0.25))
    assert fit["d_star"] == pytest.approx(0.8)
    noise = [(d, (-1) ** k * 0.3) for k, d in enumerate((0.2, 0.5, 0.8, 1.1, 1.4, 1.7))]
    poor = gao_fit(noise, "bon")
    assert not poor["describes"] and poor["why_not"]
    falling = gao_fit([(d, -0.2 * d - 0.01 * d * math.log(d)) for d in (0.5, 1, 2, 3, 4)], "rl")
    assert falling["describes"] and falling["d_star"] is None and "no peak above SFT" in falling["peak"]
    few = gao_fit([(d, d * (0.4 - 0.25 * d)) for d in (0.5, 1, 2)], "bon")
    assert not few["describes"] and few["why_not"] == "only 3 points"


def test_a_fits_curve_is_its_formula_at_evenly_spaced_d_and_only_where_it_describes():
    """gao_curve: d_max * k / 50 for k = 1..50, gain = d (alpha - beta log d) (rl) or
    d (alpha - beta d) (bon), recomputed here; None for a fit that does not describe its points."""
    from rlhf.studies.statistics import gao_curve

    rl = gao_fit([(d, d * (0.3 - 0.2 * math.log(d))) for d in (0.3, 0.7, 1.2, 2.0, 3.1)], "rl")
    curve = gao_curve(rl, 4.0)
    assert curve["d"] == [4.0 * k / 50 for k in range(1, 51)]
    for d, g in zip(curve["d"], curve["gain"]):
        assert g == pytest.approx(d * (rl["alpha"] - rl["beta"] * math.log(d)), abs=1e-12)
    assert rl["alpha"] == pytest.approx(0.3) and rl["beta"] == pytest.approx(0.2)
    bon = gao_fit([(d, d * (0.4 - 0.25 * d)) for d in (0.2, 0.5, 0.8, 1.1, 1.4)], "bon")
    bon_curve = gao_curve(bon, 2.0, n=4)
    assert bon_curve == {
        "d": [0.5, 1.0, 1.5, 2.0],
        "gain": [pytest.approx(d * (0.4 - 0.25 * d)) for d in (0.5, 1, 1.5, 2)],
    }
    assert gao_curve(gao_fit([(0.5, 0.1), (1.0, 0.2)], "rl"), 3.0) is None  # 2 points: does not describe


def test_seed_interval_of_a_bounded_quantity_stays_inside_its_bounds():
    values = [-1.0, -0.9, -0.2, -0.95, -1.0]
    free = across_seeds(values)
    assert free["t95"][0] < -1  # the formula alone leaves the range
    cut = across_seeds(values, (-1.0, 1.0))
    assert cut["t95"][0] == -1.0 and cut["clipped"] and cut["t95_unclipped"] == free["t95"]
    assert not across_seeds([0.2, 0.3, 0.25], (-1.0, 1.0))["clipped"]


def test_profile_text_writes_floats_and_optional_tables_that_read_back(tmp_path):
    from rlhf.config import PROFILE_DIR

    changes = {("ppo", "kl_coef"): 0.1 + 0.2, ("ppo", "actor_lr"): 1e-5, ("evaluation", "max_units"): 3}
    path = tmp_path / "p.toml"
    path.write_text(profile_text_with((PROFILE_DIR / "embedded.toml").read_text(), "x", changes))
    p = load_profile(str(path))
    assert (p.ppo.kl_coef, p.ppo.actor_lr, p.evaluation.max_units) == (0.1 + 0.2, 1e-5, 3)
    with pytest.raises(ProfileError, match="finite"):
        profile_text_with(path.read_text(), "x", {("ppo", "kl_coef"): float("nan")})


def test_a_points_endings_count_each_finish_reason_of_its_rows():
    """cut_at_limit and each token fault are counted from the rows, each on its own, and the
    measurement's truncations (every answer whose finish reason is not eos) is their sum; a name
    that is no finish reason (the single `undecodable` of older measurements) is refused."""
    from rlhf.studies.frontier.selection import POINT_STATS, _point

    reasons = ["eos"] * 4 + ["length"] * 2 + ["control_token"] * 3 + ["broken_text"] * 5 + ["out_of_vocabulary"]
    rows = [{"finish_reason": r, "response": "Have a pleasant day. " * (k % 3)} for k, r in enumerate(reasons)]
    truncations = sum(r != "eos" for r in reasons)
    m = {"gold": 0.25, "proxy": 1.5, "truncations": truncations, "uncertified": 9, "rows": rows}
    point = _point(m)
    by_hand = reason_counts(rows)
    assert point["cut_at_limit"] == by_hand["length"] == 2
    assert (
        {f: point[f] for f in FAULTS}
        == {f: by_hand[f] for f in FAULTS}
        == {
            "out_of_vocabulary": 1,
            "control_token": 3,
            "broken_text": 5,
        }
    )
    assert point["cut_at_limit"] + sum(point[f] for f in FAULTS) == point["truncations"] == 11
    assert point["repeats_polite_closing"] == sum(k % 3 == 2 for k in range(len(reasons)))
    assert "undecodable" not in point and {"cut_at_limit", *FAULTS} <= set(POINT_STATS)
    with pytest.raises(ValueError, match="unknown finish reason 'undecodable'"):
        _point({**m, "rows": [*rows, {"finish_reason": "undecodable", "response": ""}]})


def test_validation_measurements_refuse_anything_but_the_learning_view(tmp_path):
    from rlhf.corpus import load_corpus, prepare

    prepare(tmp_path / "c", revision="r002")
    corpus = load_corpus(tmp_path / "c")
    with pytest.raises(TypeError, match="LearningView only"):
        validation_prompts(corpus.evaluation_view())
    rows = validation_prompts(corpus.learning_view())
    assert len(rows) == 180 and len({r["family"] for r in rows}) == 36
    with pytest.raises(PermissionError):
        corpus.learning_view().inputs("pair", "test")
