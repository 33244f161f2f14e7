"""Across-seed statistics of a study: what the training seeds' draw does to a number.

``across_seeds(values)``: n, mean, sample SD, a 95% Student-t interval over seeds, the count of
positive / negative / zero values, and the exact two-sided sign-test p. The t-interval treats the
n runs as independent draws of training randomness (init, order, sampling) with a roughly normal
spread of outcomes, for this corpus and these held-out prompts; with n = 5 it has 4 degrees of
freedom (t = 2.7764), so it is wide, and it is only as good as that normality assumption (the
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
        "n = 5 (4 degrees of freedom, t = 2.7764) it is wide and leans on normality; the count of "
        "seeds with a positive difference and the sign-test p need no such assumption. It is not "
        "the single-run bootstrap interval, which resamples prompts inside one trained run."
    ),
}


def t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with `df` degrees of freedom, exactly, by the finite series of
    Abramowitz & Stegun 26.7.3 (theta = arctan(t / sqrt(df)), c = cos(theta)):

        df odd   (2/pi) (theta + sin(theta) c (1 + 2/3 c^2 + 2*4/(3*5) c^4 + ... up to c^(df-3)))
        df even  sin(theta) (1 + 1/2 c^2 + 1*3/(2*4) c^4 + ... up to c^(df-2))
    """
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:
        term, total = 1.0, 0.0
        for k in range(1, (df - 1) // 2 + 1):  # the df - 1 over 2 terms of the odd series
            total += term
            term *= 2 * k / (2 * k + 1) * c2
        return 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0))
    term, total = 1.0, 0.0
    for k in range(1, df // 2 + 1):
        total += term
        term *= (2 * k - 1) / (2 * k) * c2
    return math.sin(theta) * total


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom: the t where P(|T| < t) =
    0.95 (t_two_sided_mass), by bisection to the last bit (t(0.975, 4) = 2.7764451...)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, not {df}")
    lo, hi = 0.0, 20.0
    while t_two_sided_mass(hi, df) < 0.95:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if t_two_sided_mass(mid, df) < 0.95 else (lo, mid)
    return hi


def sign_test_p(positive: int, negative: int) -> float:
    """Exact two-sided sign-test p of `positive` vs `negative` (zeros dropped), Binomial(n, 1/2)."""
    n = positive + negative
    if n == 0:
        return 1.0
    k = min(positive, negative)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def sign_flip_p(values: list[float], scale: int = 180) -> float:
    """Exact two-sided sign-flip permutation p of paired differences `values` (one per seed).

    Under "no difference" each seed's difference is as likely +|d| as -|d|, so the 2^n sign
    patterns are equally likely; p is the share whose |sum| reaches the observed |sum|:

        p = #{eps in {-1, +1}^n : |sum_i eps_i |d_i|| >= |sum_i d_i|} / 2^n

    counted exactly by dynamic programming over the integer lattice d * scale (a difference of
    two success rates over 180 prompts is a multiple of 1/180), so 40 seeds cost 40 passes over
    at most 2 * 40 * scale + 1 sums where an enumeration would cost 2^40 patterns. A value off
    the lattice is refused: rounding it would change the test. Zero differences count as
    patterns of both signs, as in the enumeration.
    """
    if not values:
        raise StudyError("a sign-flip test needs at least one difference")
    steps = []
    for v in values:
        k = round(v * scale)
        if not math.isfinite(v) or abs(v * scale - k) > 1e-6:
            raise StudyError(f"sign-flip test: {v!r} is not a multiple of 1/{scale}")
        steps.append(abs(k))
    observed = abs(sum(round(v * scale) for v in values))
    counts = {0: 1}  # sum -> number of sign patterns reaching it
    for a in steps:
        nxt: dict[int, int] = {}
        for total, c in counts.items():
            nxt[total + a] = nxt.get(total + a, 0) + c
            nxt[total - a] = nxt.get(total - a, 0) + c
        counts = nxt
    extreme = sum(c for total, c in counts.items() if abs(total) >= observed)
    return extreme / 2 ** len(values)


def seeds_needed(sd: float, half_width: float = 0.10, cap: int = 40) -> dict:
    """The power rule: the smallest n >= 2 whose expected 95% half-width t(0.975, n-1) * sd / sqrt(n)
    is at most `half_width`, for a spread `sd` measured before the read; at most `cap` seeds, and
    then the half-width expected at the cap is what the study can promise."""
    if not (math.isfinite(sd) and sd >= 0 and half_width > 0 and cap >= 2):
        raise StudyError(f"power rule needs sd >= 0, half_width > 0 and cap >= 2, not {sd}, {half_width}, {cap}")
    for n in range(2, cap + 1):
        expected = t975(n - 1) * sd / math.sqrt(n)
        if expected <= half_width:
            return {"n": n, "expected_half_width": expected, "capped": False}
    return {"n": cap, "expected_half_width": t975(cap - 1) * sd / math.sqrt(cap), "capped": True}


def across_seeds(values: list[float], bounds: tuple[float, float] | None = None) -> dict:
    """Mean, sample SD, 95% t-interval over seeds, sign counts and sign-test p of per-seed values.

    `bounds` (lo, hi): the range the quantity cannot leave (a rate: 0..1; a difference of rates:
    -1..1; a count: 0..N). The t-interval, which knows nothing of bounds, is then cut to them;
    `t95_unclipped` keeps the formula's value and `clipped` says whether the cut changed it."""
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
    t95 = [mean - half, mean + half] if half is not None else None
    bounded = {}
    if bounds is not None and t95 is not None:
        lo, hi = bounds
        cut = [max(lo, t95[0]), min(hi, t95[1])]
        bounded = {"bounds": list(bounds), "t95_unclipped": t95, "clipped": cut != t95}
        t95 = cut
    return {
        "n": n,
        "mean": mean,
        "sd": sd,
        "t95": t95,
        **bounded,
        "positive": positive,
        "negative": negative,
        "zero": n - positive - negative,
        "sign_test_p": sign_test_p(positive, negative),
        "min": min(values),
        "max": max(values),
    }


def paired(values: list[float]) -> dict:
    """One paired comparison over seeds (a per-seed difference of two success rates): across_seeds
    bounded to [-1, 1], the exact sign-flip p and the seeds up."""
    stats = across_seeds(values, (-1.0, 1.0))
    return {**stats, "per_seed": values, "sign_flip_p": sign_flip_p(values), "seeds_up": stats["positive"]}


def across_table(rows: list[dict], bounds=lambda key: None) -> dict:
    """{metric: across_seeds(its per-seed values, bounds(metric))} over every metric the rows share."""
    keys = sorted(set.intersection(*(set(r["metrics"]) for r in rows)))
    return {k: across_seeds([r["metrics"][k] for r in rows], bounds(k)) for k in keys}


# Rows of each held-out population (rlhf.evaluate), the bound of a count over it.
ROWS = {"test": 180, "probe_rows": 80, "probe_contexts": 20, "all_rows": 260, "all_unique_contexts": 200}


def metric_bounds(key: str) -> tuple[float, float] | None:
    """The range a study metric cannot leave, from its name: rates 0..1 and their PPO − SFT
    differences -1..1; a count over a population's rows 0..its rows (ROWS), of the 20 probe
    contexts 0..20; None for an unbounded score (the learned reward)."""
    if key.startswith(("rubric_success.", "judge.", "shortcut_audit.")):
        return (-1.0, 1.0) if key.endswith("ppo_minus_sft") else (0.0, 1.0)
    if key.startswith("politeness."):
        return (0.0, 20.0)
    if key.startswith(("truncations.", "uncertified.", "answers.", "without_eos.")):
        return (0.0, float(ROWS[key.split(".")[1]]))
    return None


# ------------------------------------------------------------------------------ frontier fits

GAO_FORMS = {
    "rl": "gain(d) = d (alpha - beta log d), the form Gao, Schulman & Hilton (2022) fit for RL",
    "bon": "gain(d) = d (alpha - beta d), their form for best-of-n",
}
MIN_R2 = 0.5  # a fit that explains less of the points' variance than this is not shown


def _second_term(d: float, form: str) -> float:
    """-d log d (rl) or -d^2 (bon): what beta multiplies in Gao's forms."""
    return -d * math.log(d) if form == "rl" else -d * d


def gao_gain(alpha: float, beta: float, d: float, form: str) -> float:
    """Gao's gold gain at d = sqrt(KL): d (alpha - beta log d) (rl) or d (alpha - beta d) (bon)."""
    return alpha * d + beta * _second_term(d, form)


def gao_curve(fit: dict, d_max: float, n: int = 50) -> dict | None:
    """The fitted gain at n evenly spaced d in (0, d_max], for a fit that describes its points
    (None otherwise): what a report plots, so that it reads the curve instead of computing it."""
    if not fit.get("describes"):
        return None
    form = next(k for k, v in GAO_FORMS.items() if v == fit["form"])
    ds = [d_max * k / n for k in range(1, n + 1)]
    return {"d": ds, "gain": [gao_gain(fit["alpha"], fit["beta"], d, form) for d in ds]}


def gao_fit(points: list[tuple[float, float]], form: str) -> dict:
    """Least squares of gold gain over SFT against d = sqrt(KL) in one of Gao's two forms
    (GAO_FORMS), over (d, gain) points; points at d = 0 carry no information (both forms are 0
    there) and are left out. Linear in (alpha, beta): gain = alpha f1 + beta f2 with f1 = d and
    f2 = -d log d (rl) or -d^2 (bon), solved by the 2 x 2 normal equations.

    `describes` is True when there are at least 4 points and R^2 (about the points' mean) >=
    MIN_R2; `why_not` says otherwise. The peak d* solves gain'(d) = 0: exp(alpha / beta - 1) (rl)
    or alpha / (2 beta) (bon). It is a peak above SFT only when the curve first rises, alpha > 0,
    and then falls, beta > 0; otherwise d_star is None and `peak` says which way the curve goes."""
    if form not in GAO_FORMS:
        raise ValueError(f"unknown form {form!r}; one of {', '.join(GAO_FORMS)}")
    pts = [(d, g) for d, g in points if d > 0]
    base = {"form": GAO_FORMS[form], "n": len(pts)}
    if len(pts) < 2:
        return {**base, "describes": False, "why_not": f"{len(pts)} point(s) with d > 0: nothing to fit"}

    def f2(d: float) -> float:
        return _second_term(d, form)

    a11 = sum(d * d for d, _ in pts)
    a12 = sum(d * f2(d) for d, _ in pts)
    a22 = sum(f2(d) ** 2 for d, _ in pts)
    b1 = sum(d * g for d, g in pts)
    b2 = sum(f2(d) * g for d, g in pts)
    det = a11 * a22 - a12 * a12
    if abs(det) <= 1e-12 * max(a11 * a22, 1e-300):
        return {**base, "describes": False, "why_not": "the points' d values do not separate the two terms"}
    alpha = (b1 * a22 - b2 * a12) / det
    beta = (a11 * b2 - a12 * b1) / det
    fitted = [alpha * d + beta * f2(d) for d, _ in pts]
    residuals = [g - f for (_, g), f in zip(pts, fitted)]
    mean_g = sum(g for _, g in pts) / len(pts)
    ss_tot = sum((g - mean_g) ** 2 for _, g in pts)
    ss_res = sum(r * r for r in residuals)
    r2 = 1 - ss_res / ss_tot if ss_tot > 0 else None
    d_star = None
    if alpha > 0 and beta > 0:
        d_star = math.exp(alpha / beta - 1) if form == "rl" else alpha / (2 * beta)
        shape = "rises, peaks at d*, then falls"
    elif alpha <= 0:
        shape = "falls below SFT from the start (alpha <= 0): no peak above SFT"
    else:
        shape = "rises without a peak (beta <= 0)"
    peak = None if d_star is None else alpha * d_star + beta * f2(d_star)
    why_not = None
    if len(pts) < 4:
        why_not = f"only {len(pts)} points"
    elif r2 is None or r2 < MIN_R2:
        why_not = f"R^2 = {r2 if r2 is None else round(r2, 3)} < {MIN_R2}: the form does not describe the points"
    return {
        **base,
        "alpha": alpha,
        "beta": beta,
        "d_star": d_star,
        "gain_at_d_star": peak,
        "peak": shape,
        "r2": r2,
        "rms_residual": math.sqrt(ss_res / len(pts)),
        "residuals": residuals,
        "describes": why_not is None,
        "why_not": why_not,
    }
