"""report.html of the over-optimisation frontier (rlhf.studies.frontier) and confirmation.html of
its test confirmation: one page each, the lab's CSS, written from frontier.json's content only.
"""

from __future__ import annotations

from pathlib import Path

from rlhf import designs
from rlhf.io import write_text
from rlhf.report import wording
from rlhf.report.formatting import esc, fmt, fmt_signed, fmt_t95
from rlhf.report.plots import _figure, _png
from rlhf.report.render import page_html
from rlhf.report.tables import Table
from rlhf.rubric import TOKEN_FAULTS

LEARNING_RATES = (
    "The embedded profile's PPO learning rates are actor 1e-4 and critic 1e-3 (the SPEC's: 5e-6 and 1e-5; "
    "a hidden-64 adapter does not move at those)."
)
POP_NAMES = {
    "test": "test prompts (180)",
    "all_unique_contexts": "all unique contexts (200)",
    "probe_contexts": "probe contexts (20)",
}


def _arm_label(name: str, arm: dict) -> str:
    return f"{name} ({arm['describe']})"


def _fit_curve(fit: dict):
    """(d, gain) of a Gao fit's curve as the study wrote it (rlhf.studies.statistics.gao_curve);
    None for a fit that does not describe its points."""
    curve = fit.get("curve") if fit.get("describes") else None
    return (curve["d"], curve["gain"]) if curve else None


def plot_groups(result: dict) -> list[tuple[str, list[str]]]:
    """The frontier plot's panels: the SPEC's reward at each KL coefficient; the reward designs at
    the SPEC's raw 0.02; the designs at the grid's best c beside that grid arm (when the study has them)."""
    arms = result["arms"]
    groups = [
        (
            "the SPEC's reward at each KL coefficient",
            [n for n, a in arms.items() if a["design"] == designs.DEFAULT and not a.get("c_from_grid")],
        ),
        ("reward designs (raw KL coefficient 0.02)", [n for n, a in arms.items() if a["raw"] is not None]),
    ]
    best = [n for n, a in arms.items() if a.get("c_from_grid")]
    if best:
        choice = result["grid_choice"]
        groups.append((f"at the grid's best c = {choice['c']:g}", [choice["arm"], *best]))
    return groups


def _refresh_points(arm: dict) -> tuple[list[int], str] | None:
    """The checkpoints of an iterated judge's arm measured right after a refresh, for marking."""
    after = {r["after_iteration"] for r in arm.get("refreshes", [])}
    its = [k for k, r in enumerate(arm["curve"]) if r["iteration"] in after]
    return (its, "judge refreshed here") if its else None


def frontier_plot(result: dict) -> bytes:
    """Gold (top) and standardised proxy (bottom) against d = sqrt(KL), one column per panel of
    `plot_groups`; mean over seeds, bars: seed SD; best-of-n at its bound; the SFT level; a Gao
    fit, dotted, where it describes the points; an iterated judge's checkpoints right after a
    refresh ringed."""
    arms = result["arms"]
    groups = plot_groups(result)
    fig = _figure((6.5 * len(groups), 10))
    bon = result["best_of_n"]["points"]
    for row, (key, what) in enumerate((("gold", "validation rubric success"), ("proxy_std", "judge score (SD units)"))):
        for col, (title, names) in enumerate(groups):
            ax = fig.add_subplot(2, len(groups), len(groups) * row + col + 1)
            for name in names:
                curve = arms[name]["curve"]
                xs = [r["d"]["mean"] for r in curve]
                ys = [r[key]["mean"] for r in curve]
                err = [r[key]["sd"] or 0.0 for r in curve]
                line = ax.errorbar(xs, ys, yerr=err, marker="o", markersize=3, capsize=2, linewidth=1, label=name)
                marked = _refresh_points(arms[name])
                if marked:
                    ax.scatter(
                        [xs[k] for k in marked[0]],
                        [ys[k] for k in marked[0]],
                        s=40,
                        facecolors="none",
                        edgecolors=line[0].get_color(),
                        label=f"{name}: {marked[1]}",
                    )
                fitted = _fit_curve(arms[name]["fit"]) if key == "gold" else None
                if fitted:
                    base = result["sft_level"]["mean"]
                    ax.plot(fitted[0], [base + g for g in fitted[1]], ":", color=line[0].get_color(), linewidth=1)
            ax.errorbar(
                [p["d_bound"] for p in bon],
                [p[key]["mean"] for p in bon],
                yerr=[p[key]["sd"] or 0.0 for p in bon],
                fmt="--",
                color="black",
                marker="s",
                markersize=4,
                capsize=2,
                label=f"best-of-n (n = {bon[0]['n']}..{bon[-1]['n']}; d: upper bound)",
            )
            if key == "gold":
                ax.axhline(result["sft_level"]["mean"], color="grey", linewidth=1, label="SFT, greedy")
            ax.set(title=f"{what}: {title}", xlabel="d = sqrt(KL from SFT)")
            ax.legend(fontsize=7, loc="best")
    return _png(fig)


def iteration_plot(result: dict) -> bytes:
    """Gold against PPO iteration per arm (mean over seeds)."""
    fig = _figure((7, 4.5))
    ax = fig.add_subplot(1, 1, 1)
    for name, arm in result["arms"].items():
        ax.plot(
            [r["iteration"] for r in arm["curve"]],
            [r["gold"]["mean"] for r in arm["curve"]],
            marker="o",
            markersize=3,
            linewidth=1,
            label=name,
        )
    ax.axhline(result["sft_level"]["mean"], color="grey", linewidth=1, label="SFT (greedy)")
    ax.set(title="validation gold against PPO iteration", xlabel="iteration", ylabel="rubric success")
    ax.legend(fontsize=7, loc="best")
    return _png(fig)


def warnings_plot(result: dict) -> bytes | None:
    """One panel per scored signal: each run a row (x: PPO iteration), its gold's drop (the first
    checkpoint more than the margin below SFT) as a black cross, the signal's firing as a red dot;
    runs whose gold held in green."""
    warn = result.get("warnings") or {}
    scores = warn.get("scores") or []
    if not scores:
        return None
    cols = 4
    rows_n = -(-len(scores) // cols)
    fig = _figure((4.2 * cols, 3.6 * rows_n))
    for k, sc in enumerate(scores):
        ax = fig.add_subplot(rows_n, cols, k + 1)
        for y, run in enumerate(sc["runs"]):
            held = run["drop"] is None
            ax.hlines(y, 0, 100, color="green" if held else "lightgrey", linewidth=0.6)
            if not held:
                ax.plot([run["drop"]], [y], "kx", markersize=4)
            if run["fired_at"] is not None:
                ax.plot([run["fired_at"]], [y], "o", color="red", markersize=3)
        ax.set(title=f"{sc['signal']} (lead {fmt(sc['median_lead'], 1)})", xlabel="iteration", yticks=[])
    return _png(fig)


def warnings_table(result: dict) -> Table | None:
    warn = result.get("warnings") or {}
    scores = warn.get("scores") or []
    if not scores:
        return None
    rows = [
        [
            sc["signal"],
            sc["rule"],
            sc["fell"],
            sc["early"],
            fmt(sc["median_lead"], 1),
            sc["late"],
            sc["misses"],
            f"{sc['false_alarms']} of {sc['held']}",
        ]
        for sc in scores
    ]
    sample = (
        "in-sample (chosen on this study's runs)" if warn["in_sample"] else "out of sample (chosen on another study)"
    )
    return Table(
        [
            "signal",
            "frozen rule",
            "runs where gold fell",
            "warned early",
            "median lead (iterations)",
            "late",
            "missed",
            "false alarms (runs where gold held)",
        ],
        rows,
        f"Warnings scored against {warn.get('gold', 'validation gold')}, {sample}: the rules of "
        f"{warn['rules_file']} chosen on "
        f"{warn['chosen_on']['study'].get('revision')}; gold falls at the first checkpoint from which it stays more "
        f"than {warn['drop_margin']} below the seed's SFT at every later one (checkpoints every 10 iterations, so a "
        "lead is measured to the checkpoint that saw the fall)",
    )


def arms_table(result: dict) -> Table:
    rows = []
    for name, arm in result["arms"].items():
        best = arm["best"]
        last = arm["curve"][-1]
        share = best["share_of_oracle_gain"]
        rows.append(
            [
                _arm_label(name, arm),
                ", ".join(fmt(b, 3) for b in arm["kl_coef_per_seed"]),
                f"{fmt(best['gold'])} at {best['iteration']} (d {fmt(best['d'], 2)})",
                f"{fmt_signed(best['gain'])}" + ("" if share is None else f" ({fmt(100 * share, 0)}%)"),
                f"{fmt(last['gold']['mean'])} ± {fmt(last['gold']['sd'])}",
                fmt(last["d"]["mean"], 2),
                fmt_signed(last["proxy_std"]["mean"], 2),
                _endings(last),
                fmt(last["uncertified"]["mean"], 1),
            ]
        )
    return Table(
        [
            "arm",
            "raw KL coefficient per seed",
            "best mean gold (iteration)",
            "its gain over SFT (share of the oracle's best gain)",
            "gold at the last iteration (± seed SD)",
            "d there",
            "proxy (SD units)",
            f"{' / '.join(_ending_labels(_last_point(result)))} (of the answers)",
            "UNCERTIFIED",
        ],
        rows,
        "Mean over seeds; counts are of the greedy answers to the validation prompts at the arm's last iteration. "
        f"The share of the oracle control's best gain is shown only where that gain is at least "
        f"{result.get('oracle_min_gain', 0.0)} (a share of a gain within the noise is no number).",
    )


def refresh_table(name: str, arm: dict) -> Table:
    """An iterated judge's refreshes, mean over seeds (read from the study's JSON)."""
    rows = [
        [
            r["after_iteration"],
            f"{fmt(r['successes'], 1)} of {r['answers']}",
            fmt(r["new_pairs"], 1),
            r["seeds_with_pairs"],
            fmt(r["accuracy_before"]),
            fmt(r["accuracy_after"]),
        ]
        for r in arm["refreshes"]
    ]
    return Table(
        [
            "after iteration",
            "rubric successes (mean)",
            "labelled pairs (mean)",
            "seeds with pairs",
            "judge accuracy before",
            "after",
        ],
        rows,
        f"{name}: the judge's accuracy on the policy's newly labelled pairs before each refresh (how wrong it had "
        "become) and after training on them (in-sample); mean over the seeds that had pairs",
    )


# The endings a curve point counts, each with its column label: the token faults each on its own;
# a summary that counted them as one kind holds `undecodable` instead.
ENDINGS = {
    "cut_at_limit": "cut at the limit",
    **{fault: fault for fault in TOKEN_FAULTS},
    "undecodable": "undecodable",
    "repeats_polite_closing": "closing repeated",
}


def _last_point(result: dict) -> dict:
    """The first arm's curve point at the last iteration (every arm's counts the same endings)."""
    return next(iter(result["arms"].values()))["curve"][-1]


def _ending_keys(point: dict) -> list[str]:
    """The ENDINGS a point holds, in ENDINGS' order (older summaries: none, answers without EOS only)."""
    return [k for k in ENDINGS if k in point]


def _ending_labels(point: dict) -> list[str]:
    return [ENDINGS[k] for k in _ending_keys(point)] or ["without EOS"]


def _endings(point: dict) -> str:
    """Cut at the limit / each token fault (or, in older summaries, undecodable) / polite closing
    repeated, means over seeds (older summaries still: answers without EOS only)."""
    keys = _ending_keys(point)
    if not keys:
        return f"{fmt(point['truncations']['mean'], 1)} without EOS"
    return " / ".join(fmt(point[k]["mean"], 1) for k in keys)


def fits_table(result: dict) -> Table:
    rows = []
    fits = [(name, arm["fit"]) for name, arm in result["arms"].items()] + [("best-of-n", result["best_of_n"]["fit"])]
    for name, f in fits:
        if "alpha" not in f:
            rows.append([name, "—", "—", "—", "—", "—", f["why_not"]])
            continue
        shown = f"shown; {f.get('peak', '')}" if f["describes"] else f"not shown: {f['why_not']}"
        rows.append(
            [
                name,
                fmt(f["alpha"], 3),
                fmt(f["beta"], 3),
                fmt(f["d_star"], 2),
                fmt(f["r2"], 2),
                fmt(f["rms_residual"], 3),
                shown,
            ]
        )
    return Table(["curve", "α", "β", "peak d*", "R²", "RMS residual", "verdict"], rows)


def bon_table(result: dict) -> Table:
    rows = [
        [
            p["n"],
            fmt(p["kl_bound"], 3),
            fmt(p["d_bound"], 3),
            f"{fmt(p['gold']['mean'])} ± {fmt(p['gold']['sd'])}",
            fmt_signed(p["proxy_std"]["mean"], 2),
            fmt(p["truncations"]["mean"], 1),
        ]
        for p in result["best_of_n"]["points"]
    ]
    return Table(
        ["n", "KL bound log n − (n−1)/n", "d bound", "gold (± seed SD)", "proxy (SD units)", "truncations of 180"], rows
    )


def bon_ensemble_table(result: dict) -> Table:
    """Best-of-n's gold per n ranked by the judge alone and by each ensemble reward (the same
    draws), and the change from n = 1 to the largest n over seeds."""
    e = result["best_of_n_ensemble"]
    designs = list(e["designs"])
    rows = []
    for k, p in enumerate(result["best_of_n"]["points"]):
        cells = [f"{fmt(p['gold']['mean'])} ± {fmt(p['gold']['sd'])}"]
        for d in designs:
            g = e["designs"][d]["points"][k]["gold"]
            cells.append(f"{fmt(g['mean'])} ± {fmt(g['sd'])}")
        rows.append([p["n"], *cells])
    changes = [e["judge_gold_change"], *(e["designs"][d]["gold_change"] for d in designs)]
    rows.append(
        [
            f"n = {e['ns'][0]} → {e['ns'][-1]}",
            *(
                f"{fmt_signed(c['mean'])} {fmt_t95(c)}; {c['positive']} up, {c['negative']} down of {c['n']}"
                for c in changes
            ),
        ]
    )
    return Table(["best of n", "gold, judge", *(f"gold, {d}" for d in designs)], rows)


def seeds_table(result: dict) -> Table:
    rows = [
        [
            s["seed"],
            fmt(s["sigma_validation"], 2),
            fmt(s["mean_validation"], 2),
            f"{fmt(s['train_spread']['mean'], 2)} / {fmt(s['train_spread']['sd'], 2)}",
            fmt(s["sft"]["gold"]),
        ]
        for s in result["seeds"]
    ]
    return Table(
        [
            "seed",
            "σ (judge SD, SFT samples, validation)",
            "judge mean there",
            "train-prompt mean / SD (standardised arm)",
            "SFT greedy gold",
        ],
        rows,
    )


def _chosen(sel: dict | None, arms: dict) -> str:
    """The paragraph on the point chosen on validation (none in a study of controls alone)."""
    if sel is None:
        return "<p><b>Chosen on validation</b>: nothing: every arm of this study is a control, never chosen.</p>"
    return (
        f"<p><b>Chosen on validation</b> ({esc(sel['rule'])}): arm <b>{esc(sel['arm'])}</b> "
        f"({esc(arms[sel['arm']]['describe'])}) at iteration <b>{sel['iteration']}</b>, mean validation gold "
        f"{fmt(sel['mean_validation_gold'])} against SFT's {fmt(sel['sft_mean_validation_gold'])} "
        f"({'above' if sel['above_sft'] else 'not above'} SFT). The SPEC's default for comparison: "
        f"{esc(sel['default']['arm'])} at iteration {sel['default']['iteration']}.</p>"
    )


def frontier_intro(result: dict) -> list[str]:
    """The page's opening paragraphs: how to reproduce it and what its numbers read, the operating
    point chosen on validation, and the grid's best c where arms ran there."""
    sel, arms = result["selection"], result["arms"]
    body = [
        f"<p>Reproduce: <code>{esc(result['command'])}</code>. "
        "Every number on this page reads validation prompts only. "
        f"Gold: {esc(result['gold'])}. Proxy: {esc(result['proxy'])}. Distance: {esc(result['kl_estimator'])}. "
        f"Best-of-n: {esc(result['bon_kl'])}. {esc(LEARNING_RATES)}</p>",
        _chosen(sel, arms),
    ]
    choice = result.get("grid_choice")
    if choice and any(a.get("c_from_grid") for a in arms.values()):
        body.append(
            f"<p><b>The grid's best c</b> ({esc(choice['rule'])}): c = {choice['c']:g} ({esc(choice['arm'])}, mean "
            f"validation gold {fmt(choice['mean_validation_gold'])} at iteration {choice['iteration']}); the arms "
            "marked 'at the grid's best c' ran there after the grid was measured."
            + (
                " It is the grid's largest c: gold may still rise beyond it; this grid does not show where it stops."
                if choice.get("at_edge")
                else ""
            )
            + "</p>"
        )
    return body


def bon_section(result: dict) -> list[str]:
    """Best-of-n under the judge, and under each ensemble reward where the study measured it."""
    e = result.get("best_of_n_ensemble")
    if not e:
        return [bon_table(result).html()]
    return [
        bon_table(result).html(),
        f"<p>The same draws ranked by an ensemble of {e['ensemble_size']} judges "
        f"({esc(', '.join(e['members']))}; λ = {fmt(e['ensemble_lambda'], 2)} for "
        "ensemble-uncertainty) instead of the judge alone: gold (± seed SD) per n, and its change "
        "from the smallest to the largest n (95% t-interval over seeds).</p>",
        bon_ensemble_table(result).html(),
    ]


def frontier_sections(result: dict) -> list[tuple[str, list[str]]]:
    """The page's sections in order; "@name" marks where a figure goes."""
    arms = result["arms"]
    warned = warnings_table(result)
    refreshes = [refresh_table(n, a).html() for n, a in arms.items() if a.get("refreshes")]
    return [
        ("Frontier", [*frontier_intro(result), "@frontier", "@iterations"]),
        (
            "Arms",
            [
                "<p>Mean over seeds; the raw KL coefficient of an arm in units of σ is c · σ of its seed.</p>",
                arms_table(result).html(),
            ],
        ),
        *([("Judge refreshes", refreshes)] if refreshes else []),
        *([("Over-optimisation warnings", [warned.html(), "@warnings"])] if warned is not None else []),
        ("Best-of-n", bon_section(result)),
        (
            "Fits",
            [
                "<p>Gold gain over SFT against d, least squares over the checkpoints of all seeds: RL "
                f"{esc(next(iter(arms.values()))['fit']['form'])}; best-of-n {esc(result['best_of_n']['fit']['form'])} "
                "(gain over best-of-1). A fit is shown only where it describes the points.</p>",
                fits_table(result).html(),
            ],
        ),
        ("Seeds and spreads", [seeds_table(result).html()]),
        ("Honesty", ['<ul class="honesty">' + "".join(f"<li>{esc(x)}</li>" for x in wording.HONESTY) + "</ul>"]),
    ]


def render_frontier_html(result: dict, plots: dict[str, bytes] | None) -> str:
    st = result["study"]
    title = (
        f"RLHF with PPO — over-optimisation frontier on {st['revision']} "
        f"({st['n']} seeds, SFT budget {st['sft_budget']})"
    )
    plots = plots or {}
    figures = {
        "frontier": (plots.get("frontier"), "gold and proxy against sqrt(KL)"),
        "iterations": (plots.get("iterations"), "gold against iteration"),
        "warnings": (plots.get("warnings"), "each signal's firing against the iteration where gold fell"),
    }
    return page_html(title, frontier_sections(result), figures)


def write_frontier_report(out, result: dict) -> Path:
    hits = wording.find_forbidden_wording(render_frontier_html(result, None))
    if hits:
        raise wording.ReportWordingError(f"frontier report text: {hits}")
    plots = {"frontier": frontier_plot(result), "iterations": iteration_plot(result)}
    warned = warnings_plot(result)
    if warned is not None:
        plots["warnings"] = warned
    page = render_frontier_html(result, plots)
    return write_text(Path(out) / "report.html", page, keep_existing=True)


def confirmation_table(point: dict) -> Table:
    rows = []
    for key, label in (
        ("rubric_success", "rubric success"),
        ("learned_reward_std", "judge score (SD units of each judge)"),
    ):
        for pop, pop_name in POP_NAMES.items():
            s = point["across"][f"{key}.{pop}.ppo_minus_sft"]
            rows.append(
                [
                    f"{label}, {pop_name}",
                    fmt_signed(s["mean"]),
                    fmt(s["sd"]),
                    fmt_t95(s),
                    f"{s['positive']} of {s['n']}",
                ]
            )
    return Table(["PPO − SFT", "mean over seeds", "SD", "95% t-interval over seeds", "positive seeds"], rows)


def point_where(point: dict) -> str:
    """'at iteration N', or for a point stopped by a warning rule the iteration of each seed."""
    if point["iteration"] is not None:
        return f"at iteration {point['iteration']}"
    stops = ", ".join(str(r["iteration"]) for r in point["seeds"])
    return f"where a warning stopped PPO (iteration per seed: {stops})"


def render_confirmation_html(record: dict, result: dict) -> str:
    st = record["study"]
    title = f"RLHF with PPO — the frontier's choice confirmed on test ({st['n']} fresh seeds, {st['revision']})"
    iv = record["interval"]
    intro = (
        "<p>The operating point was chosen on validation prompts before any test prompt was read (report.html). "
        "Each point below "
        f"ran on {st['n']} fresh training seeds (study seed {st['study_seed']}) and was evaluated on test as SPEC §8. "
        f"{esc(iv['name'])}: {esc(iv['formula'])}; intervals of bounded quantities are cut to their bounds. "
        f"{esc(LEARNING_RATES)}</p>"
    )
    sections = [("How the points were chosen", [intro])] + [
        (f"{p['arm']} {point_where(p)} ({p['describe']})", [confirmation_table(p).html()]) for p in record["points"]
    ]
    warned = warnings_table(record)
    if warned is not None:
        sections.append(("Over-optimisation warnings on these seeds", [warned.html()]))
    return page_html(title, sections, {})


def write_confirmation_report(out, record: dict, result: dict) -> Path:
    page = render_confirmation_html(record, result)
    hits = wording.find_forbidden_wording(page)
    if hits:
        raise wording.ReportWordingError(f"confirmation report text: {hits}")
    return write_text(Path(out) / "confirmation.html", page, keep_existing=True)
