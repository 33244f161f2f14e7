"""Hypothesis properties of the confirmation's statistics (rlhf.studies.statistics): the exact
sign-flip permutation p against an enumeration of every sign pattern and against SciPy's
permutation test, and the power rule against its own definition.

Differences are drawn on the lattice the lab produces (multiples of 1/180: two success rates
over the 180 test prompts), from -1 to 1.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from property_budget import examples
from scipy import stats as scipy_stats

from rlhf.studies import StudyError
from rlhf.studies.statistics import seeds_needed, sign_flip_p, t975

pytestmark = pytest.mark.unit

DIFFERENCES = st.lists(st.integers(-180, 180).map(lambda k: k / 180), min_size=1, max_size=12)


def enumerated_p(values):
    """Every one of the 2^n sign patterns, counted: the definition of the test."""
    observed = abs(sum(values))
    hits = sum(
        abs(sum(s * abs(v) for s, v in zip(signs, values))) >= observed - 1e-9
        for signs in itertools.product((1, -1), repeat=len(values))
    )
    return hits / 2 ** len(values)


@examples(150)
@given(DIFFERENCES)
def test_sign_flip_p_counts_every_sign_pattern(values):
    assert sign_flip_p(values) == pytest.approx(enumerated_p(values), abs=1e-12)


@examples(40)
@given(DIFFERENCES.filter(lambda v: len(v) >= 2))
def test_sign_flip_p_is_scipys_exact_permutation_test(values):
    """SciPy's permutation_test with one sample and `samples` permutations flips signs; with
    n_resamples=inf it enumerates all 2^n patterns (feasible up to the 12 drawn here)."""
    ref = scipy_stats.permutation_test(
        (np.array(values),),
        lambda x, axis: np.sum(x, axis=axis),
        permutation_type="samples",
        n_resamples=np.inf,
        alternative="two-sided",
    )
    # SciPy's two-sided p doubles the smaller tail and clips at 1; under the symmetric sign-flip
    # null that is P(|S| >= |observed|) exactly
    assert sign_flip_p(values) == pytest.approx(min(1.0, ref.pvalue), abs=1e-9)


def test_sign_flip_p_by_hand_and_at_forty_seeds():
    assert sign_flip_p([1 / 180] * 5) == 2 / 32  # all five up: the two extreme patterns of 32
    assert sign_flip_p([0.1, -0.1]) == 1.0
    assert sign_flip_p([0.0, 0.0, 0.0]) == 1.0  # no difference at all: every pattern is as extreme
    forty = [k / 180 for k in range(1, 41)]  # 2^40 patterns: only the lattice count reaches it
    assert sign_flip_p(forty) == 2 / 2**40
    mostly_up = [*(-v for v in forty[:10]), *forty[10:]]  # net 710/180 of at most 820/180
    assert 2 / 2**40 < sign_flip_p(mostly_up) < 1e-6
    assert sign_flip_p(mostly_up) == sign_flip_p([-v for v in mostly_up])  # two-sided


def test_sign_flip_p_refuses_a_value_off_the_lattice_and_an_empty_list():
    with pytest.raises(StudyError, match="not a multiple of 1/180"):
        sign_flip_p([0.1, 0.0012345])
    with pytest.raises(StudyError, match="at least one"):
        sign_flip_p([])
    assert sign_flip_p([0.5, 0.25], scale=4) == 0.5


@examples(100)
@given(st.floats(0.0, 0.6), st.floats(0.02, 0.3), st.integers(2, 60))
def test_the_power_rule_is_the_smallest_n_within_the_half_width(sd, half_width, cap):
    got = seeds_needed(sd, half_width, cap)
    width = lambda n: t975(n - 1) * sd / math.sqrt(n)  # noqa: E731
    assert got["expected_half_width"] == width(got["n"])
    if got["capped"]:
        assert got["n"] == cap and all(width(n) > half_width for n in range(2, cap + 1))
    else:
        assert got["expected_half_width"] <= half_width
        assert all(width(n) > half_width for n in range(2, got["n"]))


def test_the_power_rule_by_hand():
    # sd 0.2: t(0.975, 17) 0.2 / sqrt(18) = 0.0995 <= 0.1 < t(0.975, 16) 0.2 / sqrt(17) = 0.1028
    assert seeds_needed(0.2) == {"n": 18, "expected_half_width": pytest.approx(0.09946, abs=1e-5), "capped": False}
    assert seeds_needed(0.5)["capped"] and seeds_needed(0.5)["n"] == 40
    assert seeds_needed(0.5)["expected_half_width"] == pytest.approx(2.0227 * 0.5 / math.sqrt(40), abs=1e-4)
    assert seeds_needed(0.0)["n"] == 2
    with pytest.raises(StudyError):
        seeds_needed(float("nan"))


def test_t975_is_scipys_quantile():
    for df in (1, 2, 4, 9, 17, 39, 120):
        assert t975(df) == pytest.approx(scipy_stats.t.ppf(0.975, df), rel=1e-12)
