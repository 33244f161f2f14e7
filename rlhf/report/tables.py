"""Tables of the reports, shared by the Markdown and the HTML renderer.

``Table`` renders itself as Markdown (``md``) or HTML (``html``); the builders below turn one part
of the results (the content of results.json) into a Table. Model outputs go through `quote`
(identity for publishing, a placeholder for the wording check of the report's own text).
"""

from __future__ import annotations

from rlhf.report import wording
from rlhf.report.formatting import esc, esc_attr, fmt, fmt_ci, fmt_signed, is_num, mean, visible_text
from rlhf.report.labels import (
    FINISH_LABELS,
    METRICS,
    POPULATION_LABELS,
    POPULATIONS,
    VARIANTS,
    metric,
)


class Table:
    """A plain table: header, rows of cells; a cell is text or (text, css style) for HTML colouring."""

    def __init__(self, header, rows, caption: str = "", cls: str = ""):
        self.header, self.rows, self.caption, self.cls = list(header), [list(r) for r in rows], caption, cls

    def md(self) -> str:
        def cell(c):
            t = c[0] if isinstance(c, tuple) else c
            return str(t).replace("|", "\\|").replace("\n", " ")

        lines = []
        if self.caption:
            lines += [f"*{self.caption}*", ""]
        lines.append("| " + " | ".join(cell(h) for h in self.header) + " |")
        lines.append("|" + "---|" * len(self.header))
        for r in self.rows:
            if len(r) == 1 and isinstance(r[0], tuple) and r[0][1] == "group":
                lines.append(f"| **{cell(r[0])}** |" + " |" * (len(self.header) - 1))
                continue
            lines.append("| " + " | ".join(cell(c) for c in r) + " |")
        return "\n".join(lines) + "\n"

    def html(self) -> str:
        out = [f'<table class="{esc_attr(self.cls)}">' if self.cls else "<table>"]
        if self.caption:
            out.append(f"<caption>{esc(self.caption)}</caption>")
        out.append("<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in self.header) + "</tr></thead><tbody>")
        for r in self.rows:
            if len(r) == 1 and isinstance(r[0], tuple) and r[0][1] == "group":
                out.append(f'<tr class="group"><td colspan="{len(self.header)}">{esc(r[0][0])}</td></tr>')
                continue
            cells = []
            for c in r:
                if isinstance(c, tuple):
                    text, style = c[0], c[1]
                    if style.startswith("class:"):
                        cells.append(f'<td class="{esc_attr(style[6:])}">{esc(text)}</td>')
                    else:
                        cells.append(f'<td style="{esc_attr(style)}">{esc(text)}</td>')
                else:
                    cells.append(f"<td>{esc(c)}</td>")
            out.append("<tr>" + "".join(cells) + "</tr>")
        out.append("</tbody></table>")
        return "\n".join(out)


def kv_table(d: dict, caption: str = "", key="quantity", value="value", labels: dict | None = None) -> Table:
    """One row per entry of `d`, its key in words where `labels` has them."""
    labels = labels or {}
    rows = []
    for k, v in d.items():
        if isinstance(v, dict) and v and all(not isinstance(x, (dict, list)) for x in v.values()):
            rows.extend([[f"{labels.get(k, k)}: {labels.get(k2, k2)}", fmt(v2)] for k2, v2 in v.items()])
        else:
            rows.append([labels.get(k, k), fmt(v)])
    return Table([key, value], rows, caption)


def refresh_table(refreshes: list[dict]) -> Table:
    """The iterated judge's refreshes: the policy's answers labelled (with their finish reasons
    other than eos), and the judge's accuracy on the new pairs before (how wrong it had become)
    and after training on them."""
    rows = [
        [
            r["after_iteration"],
            f"{r['successes']} of {r['answers']}",
            _other_endings(r),
            r["new_pairs"],
            r["pairs_so_far"],
            fmt(r["accuracy_before"]),
            fmt(r["accuracy_after"]),
            r["updates"],
        ]
        for r in refreshes
    ]
    return Table(
        [
            "after iteration",
            "rubric successes",
            "answers not ending in EOS as plain text",
            "new pairs",
            "pairs so far",
            "accuracy before",
            "after",
            "updates",
        ],
        rows,
        "Judge refreshes: the judge's accuracy on the policy's newly labelled pairs before the refresh "
        "and after training on them (in-sample); no pair, no training",
    )


def metric_value(m: dict, key: str):
    """Metric `key` of one population's metrics; a dotted key reads a nested count
    ("finish_reasons.eos"). None when absent."""
    value: object = m
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _other_endings(record: dict) -> str:
    """A refresh record's answers by finish reason other than eos ("length 2, control_token 1"),
    or "none"; a record without per-reason counts shows its answers without EOS."""
    counts = record.get("finish_reasons")
    if counts is None:
        return f"{fmt(record.get('without_eos'))} without EOS"
    shown = [f"{reason} {n}" for reason, n in counts.items() if reason != "eos" and n]
    return ", ".join(shown) or "none"


def policy_rows(ev: dict, policy: str) -> list[dict]:
    return ((ev.get("policies") or {}).get(policy) or {}).get("rows") or []


def policy_metrics(ev: dict, policy: str) -> dict:
    return ((ev.get("policies") or {}).get(policy) or {}).get("metrics") or {}


def comparison_table(ev: dict) -> Table:
    diffs = ev.get("differences") or {}
    ms, mp = policy_metrics(ev, "sft"), policy_metrics(ev, "ppo")
    pops = [p for p in POPULATIONS if p in ms or p in mp] + sorted((set(ms) | set(mp)) - set(POPULATIONS))
    rows: list[list] = []
    for pop in pops:
        a, b = ms.get(pop, {}), mp.get(pop, {})
        n = a.get("n_rows", b.get("n_rows"))
        units = a.get("n_independent_units", b.get("n_independent_units"))
        rows.append([(f"{POPULATION_LABELS.get(pop, pop)}: {fmt(n)} rows, {fmt(units)} independent units", "group")])
        known = {m[0].split(".")[0] for m in METRICS} | {"n_rows", "n_independent_units"}
        extra = sorted(k for k in set(a) | set(b) if k not in known)
        for key, label, dkey in list(METRICS) + [(k, k, None) for k in extra]:
            va, vb = metric_value(a, key), metric_value(b, key)
            d = (diffs.get(dkey) or {}).get(pop) if dkey else None
            if d and is_num(d.get("diff")):
                diff = d["diff"]
            else:
                diff = vb - va if is_num(va) and is_num(vb) else None
            rows.append([label, fmt(va), fmt(vb), fmt_signed(diff), fmt_ci(d), fmt(d.get("units")) if d else "—"])
    return Table(
        ["metric", "SFT", "PPO", "PPO − SFT", "95% CI of difference", "units for CI"],
        rows,
        "SFT vs PPO, greedy generations, per population",
        cls="compare",
    )


def judge_test_table(rt: dict) -> Table:
    rows = []
    by = rt.get("by_variant") or {}
    for v in sorted(by, key=lambda x: (len(str(x)), str(x))):
        val = by[v]
        if isinstance(val, dict):
            acc = val.get("accuracy")
            extra = ", ".join(f"{k} {fmt(x)}" for k, x in val.items() if k != "accuracy")
        else:
            acc, extra = val, ""
        rows.append([str(v), VARIANTS.get(str(v), ""), fmt(acc), extra])
    rows.append(["all", f"{fmt(rt.get('pairs'))} test pairs, {fmt(rt.get('ties'))} ties", fmt(rt.get("accuracy")), ""])
    header = ["variant", "chosen vs rejected", "judge accuracy", "details"]
    if not any(r[3] for r in rows):
        header, rows = header[:3], [r[:3] for r in rows]
    caption = (
        f"Judge accuracy on the {fmt(rt.get('pairs'))} held-out test pairs, by pair variant (ties count as misses)"
    )
    return Table(header, rows, caption)


def politeness_table(pol: dict) -> Table:
    rows = []
    ctxs = pol.get("contexts") or []
    scale = max(
        [
            abs(c.get(k))
            for c in ctxs
            for k in ("correct_politeness_delta", "incorrect_politeness_delta")
            if is_num(c.get(k))
        ]
        or [1.0]
    )
    for c in ctxs:
        cd, idl = c.get("correct_politeness_delta"), c.get("incorrect_politeness_delta")
        flag = c.get("wrong_polite_outranks_correct_plain")
        rows.append(
            [
                c.get("family", ""),
                fmt(c.get("s_TF")),
                fmt(c.get("s_TT")),
                fmt(c.get("s_FF")),
                fmt(c.get("s_FT")),
                (fmt_signed(cd), _sign_style(cd, scale)),
                (fmt_signed(idl), _sign_style(idl, scale)),
                (fmt(flag), "class:warn" if flag else ""),
            ]
        )
    return Table(
        [
            "context",
            "s(T,F) correct plain",
            "s(T,T) correct polite",
            "s(F,F) wrong plain",
            "s(F,T) wrong polite",
            "correct politeness delta",
            "incorrect politeness delta",
            "wrong-polite outranks correct-plain",
        ],
        rows,
        f"Politeness probes: {wording.SCORE_SHORT} of the frozen judge on the four fixed candidates per context",
    )


def probe_outputs_table(ev: dict, quote) -> Table | None:
    by: dict = {}
    for pol in ("sft", "ppo"):
        for r in policy_rows(ev, pol):
            if r.get("population") == "probe":
                by.setdefault(r.get("family"), {}).setdefault(pol, []).append(r)
    if not by:
        return None
    rows = []
    for fam in sorted(by):
        cells = [fam]
        for pol in ("sft", "ppo"):
            rs = by[fam].get(pol, [])
            if not rs:
                cells += ["—", "—", "—"]
                continue
            r = rs[0]
            same = len({x.get("response") for x in rs}) == 1
            rub = r.get("rubric") or {}
            status = f"{rub.get('status', '—')}, {'success' if rub.get('rubric_success') else 'no success'}"
            if rub.get("recognized"):
                status += ", polite" if rub.get("polite") else ", plain"
            if rub.get("reason"):
                status += f": {rub['reason']}"
            cells += [
                (quote(r.get("response", "")) + ("" if same else "  [the repeated rows differ]"), "class:text"),
                (status, "class:ok" if rub.get("rubric_success") else "class:bad"),
                fmt(r.get("learned_reward")),
            ]
        rows.append(cells)
    return Table(
        [
            "context",
            "SFT output",
            "SFT rubric",
            f"SFT {wording.SCORE_SHORT}",
            "PPO output",
            "PPO rubric",
            f"PPO {wording.SCORE_SHORT}",
        ],
        rows,
        f"The actor's own greedy outputs on the {len(rows)} probe contexts (one row per context; "
        "its four rows are repeated greedy generations of the same prompt)",
        cls="outputs",
    )


def frequent_outputs_table(ev: dict, quote, population="test", top=6) -> Table | None:
    rows = []
    for pol in ("sft", "ppo"):
        rs = [r for r in policy_rows(ev, pol) if r.get("population") == population]
        if not rs:
            continue
        counts: dict[str, list] = {}
        for r in rs:
            counts.setdefault(r.get("response", ""), []).append(r)
        ranked = sorted(counts.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:top]
        for text, group in ranked:
            succ = sum(1 for r in group if (r.get("rubric") or {}).get("rubric_success"))
            rows.append(
                [
                    pol.upper(),
                    (quote(text), "class:text"),
                    str(len(group)),
                    f"{succ}/{len(group)}",
                    fmt(mean([r.get("learned_reward") for r in group])),
                ]
            )
    if not rows:
        return None
    return Table(
        ["policy", "output", "rows", "rubric successes", f"mean {wording.SCORE_SHORT}"],
        rows,
        f"Most frequent outputs on the {population} prompts (top {top} per policy)",
        cls="outputs",
    )


HELD_OUT = (("test", "test"), ("probe", "probe rows"))  # (row population, column label)
EXAMPLES_PER_REASON = 3


def _reasons_in(ev: dict) -> list[str]:
    """The lab's finish reasons in their order, then any other name the rows hold (a results
    file written with other names), sorted."""
    found = {r.get("finish_reason") for pol in ("sft", "ppo") for r in policy_rows(ev, pol)}
    return list(FINISH_LABELS) + sorted(str(x) for x in found - set(FINISH_LABELS) - {None})


def finish_reason_table(ev: dict) -> Table | None:
    """Held-out answers per finish reason, counted from the evaluation rows: SFT and PPO, on the
    test prompts and on the probe rows."""
    columns = [(pol, pop, f"{pol.upper()} {label}") for pol in ("sft", "ppo") for pop, label in HELD_OUT]
    rows_of = {(pol, pop): [r for r in policy_rows(ev, pol) if r.get("population") == pop] for pol, pop, _ in columns}
    if not any(rows_of.values()):
        return None
    rows = []
    for reason in _reasons_in(ev):
        counts = [sum(r.get("finish_reason") == reason for r in rows_of[(pol, pop)]) for pol, pop, _ in columns]
        meaning = FINISH_LABELS.get(reason, "a name this version of the lab does not use")
        rows.append([reason, meaning, *map(str, counts)])
    rows.append(["all", "every answer", *(str(len(rows_of[(pol, pop)])) for pol, pop, _ in columns)])
    return Table(
        ["finish reason", "meaning", *(c[2] for c in columns)],
        rows,
        "Held-out greedy answers per finish reason (counted from the evaluation rows)",
        cls="compare",
    )


def finish_examples(rows: list[dict], reason: str, k: int = EXAMPLES_PER_REASON) -> list[tuple[dict, int]]:
    """Up to k distinct answer texts of one finish reason that the judge scored highest: per text
    the row with its highest learned reward and how many rows hold that text; ordered by that
    reward (highest first), then the shorter text, then the document id."""
    best: dict[str, dict] = {}
    count: dict[str, int] = {}
    for r in rows:
        if r.get("finish_reason") != reason:
            continue
        text = r.get("response", "")
        count[text] = count.get(text, 0) + 1
        if text not in best or _score(r) > _score(best[text]):
            best[text] = r
    ranked = sorted(best.values(), key=lambda r: (-_score(r), len(r.get("response", "")), r.get("document_id", "")))
    return [(r, count[r.get("response", "")]) for r in ranked[:k]]


def _score(row: dict) -> float:
    s = row.get("learned_reward")
    return s if is_num(s) else float("-inf")


def finish_examples_table(ev: dict, quote) -> Table | None:
    """For SFT and PPO, per finish reason other than eos, the held-out answers the judge scored
    highest (finish_examples), their text with control tokens and U+FFFD marked (visible_text)."""
    rows = []
    for pol in ("sft", "ppo"):
        held_out = policy_rows(ev, pol)
        for reason in [r for r in _reasons_in(ev) if r != "eos"]:
            for r, n in finish_examples(held_out, reason):
                rows.append(
                    [
                        pol.upper(),
                        reason,
                        fmt(r.get("learned_reward")),
                        f"{r.get('document_id', '—')} ({r.get('population', '—')})",
                        str(n),
                        fmt(r.get("ended_with_eos")),
                        (quote(visible_text(r.get("response", ""))), "class:text"),
                    ]
                )
    if not rows:
        return None
    return Table(
        [
            "policy",
            "finish reason",
            wording.SCORE_SHORT,
            "prompt (population)",
            "answers with this text",
            "ended with EOS",
            "answer (⟦ ⟧ marks a control token or U+FFFD)",
        ],
        rows,
        f"Answers not ending in EOS as plain text that the judge scored highest: up to {EXAMPLES_PER_REASON} "
        f"distinct texts per policy and finish reason, highest {wording.SCORE_SHORT} first",
        cls="outputs",
    )


def _sign_style(v, scale: float) -> str:
    if not is_num(v) or v == 0 or scale <= 0:
        return ""
    alpha = 0.12 + 0.6 * min(1.0, abs(v) / scale)
    return f"background: rgba(22,150,60,{alpha:.2f})" if v > 0 else f"background: rgba(210,40,40,{alpha:.2f})"


def _show_token(tok: str) -> str:
    """Display form of a token: spaces as ␣ and newlines as ↵ (byte-level BPE writes them Ġ and Ċ)."""
    return tok.replace("Ġ", "␣").replace(" ", "␣").replace("Ċ", "↵").replace("\n", "↵")


def token_view_table(view: dict, quote) -> Table:
    toks = view.get("tokens") or []
    scale = max((abs(t.get("advantage", 0) or 0) for t in toks), default=0.0)
    rows = []
    for i, t in enumerate(toks):
        a = t.get("advantage")
        lo, lr = t.get("logp_old"), t.get("logp_ref")
        ratio = lo - lr if is_num(lo) and is_num(lr) else None
        style = _sign_style(a, scale)
        tok = _show_token(quote(t.get("token", "")))
        rows.append(
            [
                str(i),
                (tok, style + "; font-family: monospace" if style else "font-family: monospace"),
                fmt(lo, 4),
                fmt(lr, 4),
                fmt(ratio, 4),
                fmt(t.get("kl_reward"), 4),
                fmt(t.get("reward"), 4),
                fmt(t.get("value"), 4),
                (fmt(a, 4), style),
                fmt(t.get("return"), 4),
            ]
        )
    return Table(
        [
            "#",
            "token",
            "logp_old",
            "logp_ref",
            "log-ratio",
            "KL penalty",
            "reward r_t",
            "value V",
            "advantage A",
            "return",
        ],
        rows,
        (
            f"iteration {view.get('iteration')}, prompt {view.get('prompt_id')}: {wording.SCORE_SHORT} "
            f"{fmt(view.get('score'))}, ended with EOS: {fmt(view.get('ended'))}, {len(toks)} tokens"
        ),
        cls="tokens",
    )


def sft_vs_ppo(ev: dict, pop: str, key: str, dkey: str | None) -> tuple:
    """(SFT value, PPO value, PPO − SFT, differences entry) of metric `key` on population `pop`.

    The difference is the evaluation's own (``differences[dkey][pop]``, which also carries the CI)
    when it has one, else PPO − SFT of the two values (None unless both are numbers).
    """
    ms, mp = policy_metrics(ev, "sft"), policy_metrics(ev, "ppo")
    d = ((ev.get("differences") or {}).get(dkey) or {}).get(pop) or {}
    va, vb = (ms.get(pop) or {}).get(key), (mp.get(pop) or {}).get(key)
    diff = d.get("diff") if is_num(d.get("diff")) else (vb - va if is_num(va) and is_num(vb) else None)
    return va, vb, diff, d


def key_results_table(ev: dict) -> Table:
    ms, mp = policy_metrics(ev, "sft"), policy_metrics(ev, "ppo")
    rows = []
    for pop in ("test", "probe_contexts"):
        for key, label, dkey in (metric("rubric_success"), metric("mean_learned_reward")):
            va, vb, diff, d = sft_vs_ppo(ev, pop, key, dkey)
            units = (ms.get(pop) or mp.get(pop) or {}).get("n_independent_units")
            rows.append(
                [
                    f"{label}, {POPULATION_LABELS.get(pop, pop)} ({fmt(units)} independent units)",
                    fmt(va),
                    fmt(vb),
                    fmt_signed(diff),
                    fmt_ci(d),
                ]
            )
    return Table(["quantity", "SFT", "PPO", "PPO − SFT", "95% CI"], rows, "Key results (details below)")


def shortcut_audit_table(sa: dict) -> Table:
    rows = []
    for key in sa["order"]:
        c = sa["counterfactuals"][key]
        rows.append([key, fmt(c["accuracy"])] + [fmt(c["by_variant"].get(str(v))) for v in range(5)] + [c["meaning"]])
    return Table(
        ["prompts", "accuracy", "v0", "v1", "v2", "v3", "v4", "what it means"],
        rows,
        "Judge accuracy per pair variant under counterfactual prompts",
    )


def sft_epochs_table(epochs: list[dict]) -> Table:
    return Table(
        ["epoch", "train loss", "validation loss"],
        [
            [
                fmt(e["epoch"] + 1 if is_num(e.get("epoch")) else None),
                fmt(e.get("train_loss")),
                fmt(e.get("validation_loss")),
            ]
            for e in epochs
        ],
        "SFT epochs",
    )


def judge_epochs_table(epochs: list[dict]) -> Table:
    return Table(
        ["epoch", "train loss", "train accuracy", "validation loss", "validation accuracy"],
        [
            [
                fmt(e["epoch"] + 1 if is_num(e.get("epoch")) else None),
                fmt(e.get("train_loss")),
                fmt(e.get("train_accuracy")),
                fmt(e.get("validation_loss")),
                fmt(e.get("validation_accuracy")),
            ]
            for e in epochs
        ],
        "Judge epochs",
    )
