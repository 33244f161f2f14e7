"""report.html of a multi-seed study (rlhf.studies.seeds): one page, the same CSS, tables and plot canvas
as a run's report, written from the content of seeds.json only.

It shows both kinds of uncertainty side by side: each run's single-run bootstrap interval
(prompts resampled inside one trained run) and the across-seed mean with its t-interval
(training randomness), plus the per-token view of a held-out answer that PPO changed.
"""

from __future__ import annotations

from pathlib import Path

from rlhf.io import write_text
from rlhf.report import wording
from rlhf.report.formatting import esc, fmt, fmt_signed, fmt_t95
from rlhf.report.labels import POPULATION_LABELS
from rlhf.report.plots import _figure, _png
from rlhf.report.render import page_html
from rlhf.report.tables import Table, _show_token, _sign_style

PLOTTED = (("rubric_success", "test"), ("rubric_success", "all_unique_contexts"), ("learned_reward", "test"))
DIFF_ROWS = tuple((k, p) for k in ("rubric_success", "learned_reward") for p in POPULATION_LABELS)


def _label(key: str, pop: str) -> str:
    name = "rubric success" if key == "rubric_success" else wording.SCORE_SHORT
    return f"{name}, {POPULATION_LABELS[pop]}"


def differences_table(result: dict) -> Table:
    """PPO − SFT across seeds, beside run 0's single-run bootstrap interval."""
    across, first = result["across"], result["seeds"][0]
    rows = []
    for key, pop in DIFF_ROWS:
        m = f"{key}.{pop}"
        s, sft, ppo = across[f"{m}.ppo_minus_sft"], across[f"{m}.sft"], across[f"{m}.ppo"]
        boot = first["single_run_bootstrap"][m]
        rows.append(
            [
                _label(key, pop),
                fmt(sft["mean"]),
                fmt(ppo["mean"]),
                fmt_signed(s["mean"]),
                fmt(s["sd"]),
                fmt_t95(s),
                f"{s['positive']} of {s['n']}",
                fmt(s["sign_test_p"]),
                f"{fmt_signed(boot['diff'])} [{fmt_signed(boot['ci95'][0])}, {fmt_signed(boot['ci95'][1])}]",
            ]
        )
    return Table(
        [
            "quantity",
            "SFT mean",
            "PPO mean",
            "PPO − SFT mean",
            "SD over seeds",
            "95% t-interval over seeds",
            "seeds with PPO > SFT",
            "sign-test p",
            "run 0 alone: diff [bootstrap 95%]",
        ],
        rows,
        f"PPO − SFT over {len(result['seeds'])} training seeds. The {wording.SCORE_SHORT} rows are raw judge "
        "scores: each seed trains its own judge, with its own scale, so their mean over seeds mixes scales "
        "(its sign count does not).",
        cls="compare",
    )


def answer_kinds_shown(result: dict) -> list[str]:
    """The kinds of test answers seeds.json counts (answers.test.POLICY.KIND), each once, as they
    come: each token fault on its own, or `undecodable` in a study that counted them as one kind."""
    kinds = [m.split(".", 3)[3] for m in result["across"] if m.startswith("answers.test.")]
    return list(dict.fromkeys(kinds))


def other_table(result: dict) -> Table:
    """Judge accuracy, shortcut audit, politeness, truncations, UNCERTIFIED, the test answers of
    each kind: mean, SD, range."""
    rows = []
    for m, s in result["across"].items():
        if m.startswith(("rubric_success.", "learned_reward.")):
            continue
        rows.append([m, fmt(s["mean"]), fmt(s["sd"]), fmt_t95(s), f"{fmt(s['min'])} … {fmt(s['max'])}"])
    kinds = answer_kinds_shown(result)
    old = " (undecodable: the token faults counted as one kind)" if "undecodable" in kinds else ""
    return Table(
        ["quantity", "mean", "SD", "95% t-interval", "min … max"],
        rows,
        "Judge, shortcut audit, politeness probe counts (of 20 contexts), truncations and UNCERTIFIED "
        "counts (of 180 test rows / 80 probe rows)"
        + (f"; answers.test.POLICY.KIND: the 180 test answers of each kind, {', '.join(kinds)}{old}" if kinds else ""),
        cls="compare",
    )


def per_seed_table(result: dict) -> Table:
    rows = []
    for r in result["seeds"]:
        m, b = r["metrics"], r["single_run_bootstrap"]["rubric_success.test"]
        rows.append(
            [
                str(r["index"]),
                str(r["seeds"]["seeds.torch"]),
                fmt(r["protocol"]),
                fmt(m["rubric_success.test.sft"]),
                fmt(m["rubric_success.test.ppo"]),
                f"{fmt_signed(b['diff'])} [{fmt_signed(b['ci95'][0])}, {fmt_signed(b['ci95'][1])}]",
                fmt_signed(m["learned_reward.test.ppo_minus_sft"]),
                fmt(m["judge.test_accuracy"]),
                fmt(m.get("shortcut_audit.d_conflict")),
                str(m.get("politeness.wrong_polite_outranks_correct_plain")),
                f"{m['truncations.test.sft']} / {m['truncations.test.ppo']}",
                f"{m['uncertified.test.sft']} / {m['uncertified.test.ppo']}",
                r["identity"]["ppo_state_sha256"][:12],
            ]
        )
    return Table(
        [
            "seed",
            "torch seed",
            "protocol",
            "SFT test",
            "PPO test",
            "PPO − SFT [bootstrap 95%]",
            f"{wording.SCORE_SHORT} PPO − SFT",
            "judge test acc.",
            "audit conflict acc.",
            "wrong+polite > correct+plain",
            "truncations SFT / PPO",
            "UNCERTIFIED SFT / PPO",
            "PPO state",
        ],
        rows,
        "One row per training seed (test prompts; rubric success unless named)",
        cls="compare",
    )


def token_table(view: dict) -> Table:
    toks = view["tokens"]
    scale = max((abs(t["log_ratio"]) for t in toks), default=0.0)
    rows = []
    for i, t in enumerate(toks):
        style = _sign_style(t["log_ratio"], scale)
        rows.append(
            [
                str(i),
                (_show_token(t["token"]), (style + "; " if style else "") + "font-family: monospace"),
                fmt(t["logp_ppo"], 4),
                fmt(t["logp_sft"], 4),
                (fmt(t["log_ratio"], 4), style),
            ]
        )
    return Table(
        ["#", "token", "log π_PPO", "log π_SFT (reference)", "log-ratio"],
        rows,
        f"PPO's greedy answer to {view['document_id']} (run {view['seed']}), token by token",
        cls="tokens",
    )


def _point_withfmt_t95(ax, x: float, y: float, interval: list, **style) -> None:
    """One point at (x, y) with its [low, high] interval as an error bar."""
    ax.errorbar([x], [y], yerr=[[y - interval[0]], [interval[1] - y]], **style)


def plot_seeds(result: dict) -> bytes:
    """One panel per PLOTTED difference: a point per seed with its single-run bootstrap interval,
    and the across-seed mean with its t-interval."""
    fig = _figure((12, 3.8))
    rows = result["seeds"]
    for k, (key, pop) in enumerate(PLOTTED):
        ax = fig.add_subplot(1, len(PLOTTED), k + 1)
        m = f"{key}.{pop}"
        for j, r in enumerate(rows):
            b = r["single_run_bootstrap"][m]
            label = "one run: diff, bootstrap 95% (prompts)" if j == 0 else None
            _point_withfmt_t95(ax, j, b["diff"], b["ci95"], fmt="o", color="#4c72b0", capsize=3, label=label)
        s = result["across"][f"{m}.ppo_minus_sft"]
        x = len(rows) + 0.8
        if s["t95"]:
            label = "mean over seeds, 95% t-interval"
            _point_withfmt_t95(ax, x, s["mean"], s["t95"], fmt="D", color="#c44e52", capsize=5, ms=8, label=label)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(list(range(len(rows))) + [x], [str(r["index"]) for r in rows] + ["mean"])
        ax.set(title=f"PPO − SFT: {_label(key, pop)}", xlabel="training seed (run)")
        ax.legend(fontsize=7, loc="best")
    return _png(fig)


def _sections(result: dict) -> list[tuple[str, list[str]]]:
    st, iv, view = result["study"], result["interval"], result["changed_answer"]
    head = [
        f"<p>{esc(st['n'])} runs of the whole embedded lab on {esc(st['revision'])}, SFT budget "
        f"{esc(st['sft_budget'])}, study seed {esc(st['study_seed'])}. Reproduce: <code>{esc(result['command'])}"
        f"</code>. Seeds: {esc(result['derivation'])}.</p>",
        f"<p>{esc(iv['name'])}: {esc(iv['formula'])}. Assumption: {esc(iv['assumption'])}. {esc(iv['meaning'])}</p>",
    ]
    out = [
        ("Across seeds", head + [differences_table(result).html()]),
        (
            "Plot",
            [
                "<p>Blue: each run's PPO − SFT with its single-run bootstrap interval (prompts resampled inside "
                "that run). Red: the mean over runs with the t-interval over seeds (training randomness).</p>",
                "@plot",
            ],
        ),
        ("Per seed", [per_seed_table(result).html()]),
        ("Other quantities", [other_table(result).html()]),
    ]
    if view.get("seed") is None:
        out.append(("A changed answer", [f"<p>{esc(view['note'])}</p>"]))
    else:
        out.append(
            (
                "A changed answer",
                [
                    f"<p>Prompt {esc(view['document_id'])}: {esc(view['prompt'])}</p>",
                    f"<p>SFT answered: <code>{esc(view['sft']['response'])}</code> (rubric success "
                    f"{fmt(view['sft']['rubric_success'])}: {esc(view['sft']['reason'])}; "
                    f"{esc(wording.SCORE_SHORT)} {fmt(view['sft']['learned_reward'])}). PPO answered: "
                    f"<code>{esc(view['ppo']['response'])}</code> (rubric success "
                    f"{fmt(view['ppo']['rubric_success'])}: {esc(view['ppo']['reason'])}; {esc(wording.SCORE_SHORT)} "
                    f"{fmt(view['ppo']['learned_reward'])}).</p>",
                    "<p>Each token of PPO's answer under the PPO policy and under the SFT policy it started from "
                    "(PPO's frozen reference), teacher-forced; green where PPO made the token more likely than SFT "
                    "did.</p>",
                    token_table(view).html(),
                ],
            )
        )
    out.append(("Honesty", ['<ul class="honesty">' + "".join(f"<li>{esc(x)}</li>" for x in wording.HONESTY) + "</ul>"]))
    return out


def render_study_html(result: dict, plot: bytes | None) -> str:
    st = result["study"]
    title = f"RLHF with PPO — {st['n']}-seed study on {st['revision']} (SFT budget {st['sft_budget']})"
    return page_html(title, _sections(result), {"plot": (plot, "PPO − SFT per seed and across seeds")})


def write_study_report(out, result: dict) -> Path:
    """DIR/report.html (kept if a crash left it complete: written whole from seeds.json's content)."""
    page = render_study_html(result, plot_seeds(result))
    hits = wording.find_forbidden_wording(render_study_html(result, None))
    if hits:
        raise wording.ReportWordingError(f"study report text: {hits}")
    return write_text(Path(out) / "report.html", page, keep_existing=True)
