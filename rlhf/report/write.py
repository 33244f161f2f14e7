"""Writing the three report files of a run folder, and the command-line summary."""

from __future__ import annotations

from pathlib import Path

from rlhf.io import dumps_json, write_text
from rlhf.report import wording
from rlhf.report.formatting import fmt, fmt_ci, fmt_signed
from rlhf.report.labels import FINISH_LABELS, metric
from rlhf.report.plots import make_plots
from rlhf.report.render import render_html, render_markdown
from rlhf.report.results import collect_results
from rlhf.report.sections import warnings_said
from rlhf.report.tables import policy_metrics, policy_rows, sft_vs_ppo

REPORT_FILES = ("results.json", "report.md", "report.html")


def _model_texts(res: dict) -> list[str]:
    ev = res["evaluation"]
    texts = (
        [r.get("response", "") for pol in ("sft", "ppo") for r in policy_rows(ev, pol)] if ev["status"] == "run" else []
    )
    texts += [t.get("token", "") for v in res["ppo"]["token_views"] for t in v.get("tokens") or []]
    return [t for t in texts if isinstance(t, str)]


def _wording_check(res: dict) -> dict:
    """``wording_check`` of results.json; ReportWordingError if the report's own text fails it.

    The report's own text is checked with every model output replaced by a placeholder; model
    outputs are data, quoted verbatim: their own hits are recorded, never rewritten.
    """
    placeholder = lambda s: wording.MODEL_TEXT_PLACEHOLDER  # noqa: E731 - the report's own text only
    own_hits = {
        "report.md": wording.find_forbidden_wording(render_markdown(res, placeholder)),
        "report.html": wording.find_forbidden_wording(render_html(res, {}, placeholder)),
    }
    if any(own_hits.values()):
        raise wording.ReportWordingError(
            "report text names the learned score as something it is not (SPEC §9.5): "
            + "; ".join(f"{k}: {h}" for k, hs in own_hits.items() for h in hs)
        )
    model_hits = sorted({h for t in _model_texts(res) for h in wording.find_forbidden_wording(t)})
    return {"patterns": "rlhf.report.FORBIDDEN_PATTERNS", "report_text": own_hits, "model_outputs": model_hits}


def write_reports(run_dir, *, keep_existing: bool = False) -> dict:
    """Write results.json, report.md and report.html into `run_dir`; return their paths.

    A file already there with the bytes this code writes is kept (a rerun rebuilds nothing); one
    that differs is a FileExistsError (before writing anything) that says how to rebuild it.
    ReportWordingError if the report's own text names the learned score forbiddenly.
    `keep_existing` (the lab's rerun after a crash between the three writes): files already
    there are kept, the missing ones are written.
    """
    run = Path(run_dir)
    paths = {name: run / name for name in REPORT_FILES}
    res = collect_results(run)
    res["reports"] = {k.replace(".", "_"): str(p.resolve()) for k, p in paths.items()}
    res["wording_check"] = _wording_check(res)
    texts = {"results.json": dumps_json(res), "report.md": render_markdown(res)}
    texts["report.html"] = render_html(res, make_plots(res))
    existing = [name for name, p in paths.items() if p.exists()]
    differ = [name for name in existing if paths[name].read_text(encoding="utf-8") != texts[name]]
    if differ and not keep_existing:
        raise FileExistsError(
            f"refusing to overwrite report files of {run}: {', '.join(differ)} differ from what this code writes; "
            f"to rebuild them, move {', '.join(existing)} out of {run} and run rlhf report --run {run} again"
        )
    for name, text in texts.items():  # a file already there with these bytes is kept as it is
        if name not in existing:
            write_text(paths[name], text)
    return {k: p for k, p in paths.items()}


def print_summary(results: dict) -> str:
    """A short plain-text summary of results (the content of results.json) for the command line."""
    lines = ["RLHF with PPO: summary (learned reward = predicted score of simulated preferences)"]
    ev = results.get("evaluation") or {}
    if ev.get("status") == "run":
        lines.append(f"{'quantity':<44}{'SFT':>9}{'PPO':>9}{'PPO-SFT':>9}  95% CI")
        for key, label, dkey in (metric("rubric_success"), metric("mean_learned_reward")):
            name = "rubric success" if key == "rubric_success" else "learned reward"
            for pop in ("test", "probe_rows", "probe_contexts"):
                va, vb, diff, d = sft_vs_ppo(ev, pop, key, dkey)
                lines.append(f"{name + ', ' + pop:<44}{fmt(va):>9}{fmt(vb):>9}{fmt_signed(diff):>9}  {fmt_ci(d)}")
        for pol in ("sft", "ppo"):
            counts = (policy_metrics(ev, pol).get("test") or {}).get("finish_reasons")
            if counts:  # in the lab's order of the reasons (results.json sorts its keys)
                shown = {r: counts[r] for r in FINISH_LABELS if r in counts} | counts
                lines.append(f"{pol.upper()} test answers by finish reason: {fmt(shown)}")
        rt = results.get("judge_test") or {}
        lines.append(
            f"judge test accuracy: {fmt(rt.get('accuracy'))} ({fmt(rt.get('pairs'))} pairs, "
            f"{fmt(rt.get('ties'))} ties); by variant: {fmt(rt.get('by_variant'))}"
        )
        counts = (ev.get("politeness") or {}).get("counts")
        if counts:
            lines.append(f"politeness probes ({fmt(counts.get('contexts'))} contexts): {fmt(counts)}")
    else:
        lines.append("evaluation: not run (evaluation/results.json absent)")
    sp = (results.get("ppo") or {}).get("summary") or {}
    if sp:
        lines.append(
            f"PPO: {fmt(sp.get('iterations'))} iterations, {fmt(sp.get('truncations'))} truncations, mean "
            f"learned reward of rollouts {fmt(sp.get('mean_score_first_10'))} -> "
            f"{fmt(sp.get('mean_score_last_10'))}"
        )
    lines.append(f"over-optimisation warnings: {warnings_said(results)}")
    rep = (results.get("reports") or {}).get("report_html")
    lines.append(f"report: {rep or Path(results.get('run_dir', '.')) / 'report.html'}")
    return "\n".join(lines)
