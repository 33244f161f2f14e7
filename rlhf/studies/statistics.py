"""Across-seed statistics of a study: what the training seeds' draw does to a number.

``across_seeds(values)``: n, mean, sample SD, a 95% Student-t interval over seeds, the count of
positive / negative / zero values, and the exact two-sided sign-test p. The t-interval treats the
n runs as independent draws of training randomness (init, order, sampling) with a roughly normal
spread of outcomes, for this corpus and these held-out prompts; with n = 5 it has 4 degrees of
freedom (t = 2.776), so it is wide, and it is only as good as that normality assumption (the
sign count needs none). It says how much the conclusion depends on the draw of training seeds;
the single-run bootstrap intervals (rlhf.evaluate) resample prompts within one trained run and
say nothing about that.
"""

from __future__ import annotations

import math

from rlhf.studies import StudyError

INTERVAL = {
    "name": "95% Student-t interval over seeds",
    "formula": "mean ± t(0.975, n−1) · SD / √n, SD the sample standard deviation (n − 1)",
    "assumption": (
        "the n runs are independent draws of the training randomness (adapter and head init, "
        "data order, PPO sampling) with a roughly normal spread of outcomes; corpus, base and "
        "held-out prompts are the same in every run"
    ),
    "meaning": (
        "where the mean over training seeds plausibly lies, for this corpus and these prompts. With "
        "n = 5 (4 degrees of freedom, t = 2.776) it is wide and leans on normality; the count of "
        "seeds with a positive difference and the sign-test p need no such assumption. It is not "
        "the single-run bootstrap interval, which resamples prompts inside one trained run."
    ),
}


# t(0.975, df) for df = 1..30 (standard tables; tests recompute them by integrating the density).
T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (normal 1.960 beyond 30)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, not {df}")
    return T975[df - 1] if df <= len(T975) else 1.960


def sign_test_p(positive: int, negative: int) -> float:
    """Exact two-sided sign-test p of `positive` vs `negative` (zeros dropped), Binomial(n, 1/2)."""
    n = positive + negative
    if n == 0:
        return 1.0
    k = min(positive, negative)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def across_seeds(values: list[float]) -> dict:
    """Mean, sample SD, 95% t-interval over seeds, sign counts and sign-test p of per-seed values."""
    if not values or any(
        not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) for v in values
    ):
        raise StudyError(f"across-seed statistics need finite numbers, got {values}")
    n = len(values)
    mean = sum(values) / n
    sd: float | None = None
    half: float | None = None
    if n > 1:
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
        half = t975(n - 1) * sd / math.sqrt(n)
    positive, negative = sum(v > 0 for v in values), sum(v < 0 for v in values)
    return {
        "n": n,
        "mean": mean,
        "sd": sd,
        "t95": [mean - half, mean + half] if half is not None else None,
        "positive": positive,
        "negative": negative,
        "zero": n - positive - negative,
        "sign_test_p": sign_test_p(positive, negative),
        "min": min(values),
        "max": max(values),
    }


def across_table(rows: list[dict]) -> dict:
    """{metric: across_seeds(its per-seed values)} over every metric the rows share."""
    keys = sorted(set.intersection(*(set(r["metrics"]) for r in rows)))
    return {k: across_seeds([r["metrics"][k] for r in rows]) for k in keys}
