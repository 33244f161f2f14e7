"""Formatting of numbers and text for the reports (shared by tables, sections and the summary)."""

from __future__ import annotations

import html
import math
import re
from typing import TypeGuard


def mean(xs):
    """Mean of the finite numbers in `xs` (bools, None and NaN skipped); None if there are none."""
    xs = [x for x in xs if isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else None


def fmt(v, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v != 0 and abs(v) < 1e-3 or abs(v) >= 1e5:
            return f"{v:.2e}"
        return f"{v:.{digits}f}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt(x, digits) for x in v) + "]"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {fmt(x, digits)}" for k, x in v.items())
    return str(v)


def fmt_signed(v, digits: int = 3) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:+d}"
    if isinstance(v, float) and not math.isnan(v):
        return f"{v:+.{digits}f}"
    return fmt(v, digits)


def is_num(v: object) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def fmt_ci(d: dict | None) -> str:
    if not d or not isinstance(d.get("ci95"), (list, tuple)) or len(d["ci95"]) != 2:
        return "—"
    lo, hi = d["ci95"]
    return f"[{fmt_signed(lo)}, {fmt_signed(hi)}]"


def fmt_t95(stats: dict) -> str:
    """A 95% t-interval over seeds (rlhf.studies.statistics.across_seeds); when it was cut to the
    quantity's bounds, the formula's value beside it."""
    t = stats.get("t95")
    if not t:
        return "—"
    text = f"[{fmt_signed(t[0])}, {fmt_signed(t[1])}]"
    if stats.get("clipped"):
        lo, hi = stats["t95_unclipped"]
        text += f" (cut to the bounds; the formula gives [{fmt_signed(lo)}, {fmt_signed(hi)}])"
    return text


def esc(s) -> str:
    return html.escape(str(s), quote=False)


def esc_attr(s) -> str:
    return html.escape(str(s), quote=True)


def short_hash(h) -> str:
    return (h[:16] + "…") if isinstance(h, str) and len(h) > 16 else fmt(h)


CONTROL_TOKEN = re.compile(r"<\|[^|<>\s]*\|>")  # ChatML's control tokens as decoded text: <|im_start|>


def visible_text(text: str) -> str:
    """An answer's text with what a reader could miss marked: each control token as ⟦<|name|>⟧,
    each U+FFFD (bytes that are not UTF-8) as ⟦U+FFFD⟧, each newline as ↵. HTML escaping is
    the renderer's (Table.html)."""
    text = CONTROL_TOKEN.sub(lambda m: f"⟦{m.group(0)}⟧", text)
    return text.replace("\ufffd", "⟦U+FFFD⟧").replace("\n", "↵")
