"""Plots of the HTML report: PNG bytes drawn with matplotlib (Agg canvas, no global pyplot state).

matplotlib is imported inside the functions, so that importing ``rlhf.report`` stays light.
"""

from __future__ import annotations

import io

from rlhf.report import wording
from rlhf.report.formatting import fmt, is_num
from rlhf.report.labels import PHASE_LABELS, PPO_PHASES
from rlhf.report.tables import policy_metrics

# (curve key, title, kind) of the eight PPO panels; kind None: one value per iteration.
PPO_PANELS = (
    ("mean_score", "mean {score} (judge score) of the 4 rollouts", None),
    ("mean_sampled_log_ratio", "mean sampled-token log-ratio log π_old − log π_ref", None),
    ("value_loss", "critic value loss (2 updates per iteration)", "pairs"),
    ("clip_fraction", "clip fraction (2 updates per iteration)", "pairs"),
    ("response_length", "mean response length (tokens)", None),
    ("truncations", "truncated responses (cut at 64 without EOS)", "bars"),
    ("policy_loss", "actor clipped surrogate loss (2 updates per iteration)", "pairs"),
    ("mean_value", "mean critic value V and mean return (per token)", "value"),
)


def make_plots(res: dict) -> dict[str, bytes]:
    """PNG bytes per plot name: verdict, sft, judge, ppo, timings (matplotlib Agg, no global pyplot state)."""
    plots = {"verdict": verdict_plot(res), "sft": sft_plot(res), "judge": judge_plot(res), "ppo": ppo_plot(res)}
    if res["timings"].get("ppo_phase_totals_s"):
        plots["timings"] = timings_plot(res)
    return plots


def _figure(figsize):
    from matplotlib.figure import Figure

    return Figure(figsize=figsize)


def _png(fig) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def _smooth(ys, w=10):
    """Running mean of the last `w` numbers (NaN where the window holds none)."""
    out = []
    for i in range(len(ys)):
        win = [y for y in ys[max(0, i - w + 1) : i + 1] if is_num(y)]
        out.append(sum(win) / len(win) if win else float("nan"))
    return out


def _flat_pairs(curves: dict, key: str):
    """x, y of a per-iteration list of per-update values, the updates spread within their iteration."""
    xs, ys = [], []
    for it, rec in zip(curves.get("iteration", []), curves.get(key, [])):
        vals = rec if isinstance(rec, list) else [rec]
        for j, v in enumerate(vals):
            xs.append(it + j / max(1, len(vals)))
            ys.append(v)
    return xs, ys


def _per_update_and_smoothed(ax, steps: list, values: list) -> None:
    """A loss per update, thin, and its running mean over the last 10 updates, thick."""
    ax.plot(steps, values, lw=0.8, color="#4c72b0", label="per update")
    ax.plot(steps, _smooth(values), lw=2, color="#c44e52", label="mean of last 10")


def sft_plot(res: dict) -> bytes:
    from matplotlib.ticker import MaxNLocator

    c = res["sft"]["curves"]
    fig = _figure((12, 3.6))
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    _per_update_and_smoothed(ax1, c.get("step", []), c.get("loss", []))
    if any(is_num(v) and v > 0 for v in c.get("loss", [])):
        ax1.set_yscale("log")
    ax1.set(title="SFT loss per update (log scale)", xlabel="update", ylabel="token cross-entropy")
    ax1.legend()
    ep = res["sft"]["epochs"]
    ax2.plot([e.get("epoch", i) + 1 for i, e in enumerate(ep)], [e.get("train_loss") for e in ep], "o-", label="train")
    ax2.plot(
        [e.get("epoch", i) + 1 for i, e in enumerate(ep)],
        [e.get("validation_loss") for e in ep],
        "s-",
        label="validation",
    )
    ax2.set(title="SFT loss per epoch", xlabel="epoch", ylabel="loss")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.legend()
    return _png(fig)


def judge_plot(res: dict) -> bytes:
    c = res["judge"]["curves"]
    fig = _figure((12, 3.6))
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    _per_update_and_smoothed(ax1, c.get("step", []), c.get("loss", []))
    ax1.set(title="Judge Bradley-Terry loss per update", xlabel="update", ylabel="−log σ(r_chosen − r_rejected)")
    ax1.legend()
    ax2.plot(c.get("step", []), c.get("accuracy", []), lw=0.6, color="#4c72b0", alpha=0.6, label="per update (8 pairs)")
    ax2.plot(c.get("step", []), _smooth(c.get("accuracy", [])), lw=2, color="#c44e52", label="mean of last 10")
    ep = res["judge"]["epochs"]
    per_epoch = max(1, len(c.get("step", [])) // max(1, len(ep)))
    ax2.plot(
        [(e.get("epoch", i) + 1) * per_epoch - 1 for i, e in enumerate(ep)],
        [e.get("validation_accuracy") for e in ep],
        "D",
        color="#55a868",
        ms=8,
        label="validation, end of epoch",
    )
    ax2.set(title="Judge pair accuracy", xlabel="update", ylabel="accuracy", ylim=(-0.02, 1.05))
    ax2.legend(loc="lower right")
    return _png(fig)


def verdict_plot(res: dict) -> bytes:
    """The report's one picture: the learned reward PPO optimises, per iteration (numbered from 1,
    as the console counts), beside held-out test rubric success at SFT (iteration 0) and at the
    end; a dotted line where each over-optimisation warning fired."""
    c = res["ppo"]["curves"]
    its = [i + 1 for i in c.get("iteration", [])]
    fig = _figure((9, 3.6))
    ax = fig.add_subplot(1, 1, 1)
    ys = c.get("mean_score", [])
    ax.plot(its, ys, lw=0.8, color="#9db4d8", label=f"mean {wording.SCORE_SHORT} of the 4 rollouts")
    ax.plot(its, _smooth(ys), lw=2, color="#4c72b0", label="mean of last 10")
    ax.set(xlabel="PPO iteration", ylabel=wording.SCORE_SHORT)
    for w in (res.get("warnings") or {}).get("fired", []):
        ax.axvline(w["iteration"], color="#e0a800", ls=":", lw=1.2)
        ax.text(w["iteration"], 0.98, " " + w["signal"], transform=ax.get_xaxis_transform(), fontsize=7, va="top")
    ev = res["evaluation"]
    if ev["status"] == "run":
        success = [(policy_metrics(ev, p).get("test") or {}).get("rubric_success") for p in ("sft", "ppo")]
        if all(is_num(v) for v in success):
            right = ax.twinx()
            right.plot(
                [0, its[-1] if its else 0],
                success,
                "o--",  # two measurements, SFT's and the end's: nothing is measured between them
                color="#c44e52",
                lw=1.2,
                label="held-out test rubric success (SFT, end)",
            )
            right.set(ylabel="test rubric success", ylim=(-0.02, 1.05))
            right.legend(loc="lower right", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("What PPO optimised, and what it did on held-out test prompts")
    return _png(fig)


def ppo_plot(res: dict) -> bytes:
    """The eight PPO panels of ``PPO_PANELS`` on a 4 x 2 grid."""
    c = res["ppo"]["curves"]
    fig = _figure((12, 12.8))
    for k, (key, title, kind) in enumerate(PPO_PANELS):
        ax = fig.add_subplot(4, 2, k + 1)
        _ppo_panel(ax, c, key, kind)
        if key == "mean_sampled_log_ratio":
            ax.axhline(0, color="grey", lw=0.8)
        if kind != "bars":
            ax.legend(fontsize=8)
        ax.set(title=title.format(score=wording.SCORE_SHORT), xlabel="PPO iteration")
    return _png(fig)


def _ppo_panel(ax, c: dict, key: str, kind: str | None) -> None:
    its = c.get("iteration", [])
    if kind == "value":
        ax.plot(its, c.get("mean_value", []), lw=1.2, color="#4c72b0", label="mean value V")
        ax.plot(its, c.get("mean_return", []), lw=1.2, color="#c44e52", label="mean return A + V")
    elif kind == "pairs":
        xs, ys = _flat_pairs(c, key)
        ax.plot(xs, ys, lw=0.8, color="#4c72b0", label="per update")
        ax.plot(xs, _smooth(ys, 20), lw=2, color="#c44e52", label="mean of last 10 iterations")
    elif kind == "bars":
        ys = c.get(key, [])
        ax.bar(its, ys, color="#c44e52", width=0.8)
        ax.text(0.98, 0.9, f"total {sum(y for y in ys if is_num(y))}", transform=ax.transAxes, ha="right")
        ax.set_ylim(0, max([1] + [y for y in ys if is_num(y)]) * 1.2)
    else:
        ys = c.get(key, [])
        ax.plot(its, ys, lw=0.8, color="#4c72b0", label="per iteration")
        ax.plot(its, _smooth(ys), lw=2, color="#c44e52", label="mean of last 10")


def timings_plot(res: dict) -> bytes:
    tot = res["timings"]["ppo_phase_totals_s"]
    names = [p for p in PPO_PHASES if p in tot and p != "iteration"]
    fig = _figure((9, 3.2))
    ax = fig.add_subplot(1, 1, 1)
    ax.barh([PHASE_LABELS.get(n, n) for n in names][::-1], [tot[n] for n in names][::-1], color="#4c72b0")
    ax.set(title=f"PPO time per phase (whole loop {fmt(tot.get('iteration'), 1)} s)", xlabel="seconds")
    return _png(fig)
