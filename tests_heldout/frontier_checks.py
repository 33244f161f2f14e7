"""Helpers of the frontier's test files: the committed studies, finish-reason counts by hand, and the
numbers of a frontier or confirmation page read back from its HTML."""

from __future__ import annotations

import html.parser
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ("out_of_vocabulary", "control_token", "broken_text")  # each a kind of its own (docs/results.md)
NUMBER = re.compile(r"[+\-−]?\d+(?:\.\d+)?(?:e[+\-]\d+)?")


# The arm table's ending columns, in the page's order, and their labels: each token fault on its
# own; a summary that counted the faults as one kind holds `undecodable` instead.
ENDING_COLUMNS = {
    "cut_at_limit": "cut at the limit",
    **{f: f for f in FAULTS},
    "undecodable": "undecodable",
    "repeats_polite_closing": "closing repeated",
}


def reason_counts(rows: list[dict]) -> dict[str, int]:
    """Each finish reason's rows, counted here by hand."""
    return {k: sum(r["finish_reason"] == k for r in rows) for k in ("eos", "length", *FAULTS)}


def committed(revision: str) -> dict:
    return json.loads((ROOT / "results" / f"frontier-{revision}" / "frontier.json").read_text())


class _Tables(html.parser.HTMLParser):
    """Every <table> of a page as (section heading, header cells, rows of cell texts)."""

    def __init__(self):
        super().__init__()
        self.tables: list[tuple[str, list[str], list[list[str]]]] = []
        self.heading, self.in_h2 = "", False
        self.row: list[str] | None = None
        self.cell: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "h2":
            self.in_h2, self.heading = True, ""
        elif tag == "table":
            self.tables.append((self.heading, [], []))
        elif tag == "tr":
            self.row = []
        elif tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag == "h2":
            self.in_h2 = False
        elif tag in ("td", "th") and self.row is not None and self.cell is not None:
            self.row.append(self.cell.strip())
            self.cell = None
        elif tag == "tr" and self.row is not None:
            _, head, rows = self.tables[-1]
            if head:
                rows.append(self.row)
            else:
                head.extend(self.row)
            self.row = None

    def handle_data(self, data):
        if self.in_h2:
            self.heading += data
        if self.cell is not None:
            self.cell += data


def page_tables(path) -> list[tuple[str, list[str], list[list[str]]]]:
    parser = _Tables()
    parser.feed(Path(path).read_text())
    return parser.tables


def shown(cell: str, *values) -> None:
    """The cell shows exactly these numbers, in order, each to the page's rounding: a value is
    (number, digits shown) or a number shown to 3 digits; scientific notation to 3 significant
    digits; None is shown as a dash."""
    pairs = [value if isinstance(value, tuple) else (value, 3) for value in values]
    assert cell.count("—") == sum(v is None for v, _ in pairs), f"{cell!r}: a missing value is shown as —"
    pairs = [(v, d) for v, d in pairs if v is not None]
    got = NUMBER.findall(cell)
    assert len(got) == len(pairs), f"{cell!r} shows {got}, not {values}"
    for text, (v, digits) in zip(got, pairs):
        g = float(text.replace("−", "-"))
        tolerance = 0.005 * abs(v) if "e" in text else 0.5 * 10**-digits
        assert abs(g - v) <= tolerance + 1e-12, f"{cell!r}: {text} is not {v}"


def bon_ensemble_shows(ens_rows: list[list[str]], result: dict) -> None:
    """The best-of-n-under-the-ensemble table: gold per n and ranking, then the change n = 1 -> max."""
    e = result["best_of_n_ensemble"]
    assert len(ens_rows) == len(result["best_of_n"]["points"]) + 1
    designs = list(e["designs"])
    for row, p in zip(ens_rows, result["best_of_n"]["points"]):
        shown(row[0], (p["n"], 0))
        shown(row[1], p["gold"]["mean"], p["gold"]["sd"])
        for cell, d in zip(row[2:], designs, strict=True):
            g = e["designs"][d]["points"][result["best_of_n"]["points"].index(p)]["gold"]
            shown(cell, g["mean"], g["sd"])
    last = ens_rows[-1]
    shown(last[0], (e["ns"][0], 0), (e["ns"][-1], 0))
    for cell, c in zip(
        last[1:], [e["judge_gold_change"], *(e["designs"][d]["gold_change"] for d in designs)], strict=True
    ):
        interval = c["t95_unclipped"] if c.get("clipped") else []
        shown(cell, c["mean"], *c["t95"], *interval, (c["positive"], 0), (c["negative"], 0), (c["n"], 0))


def frontier_page_shows(page: Path, result: dict) -> dict:
    """Every number of a frontier page read back equals the study's JSON; returns its tables."""
    parsed = page_tables(page)
    tables = {head[0]: rows for _, head, rows in parsed}
    (arm_head,) = [head for _, head, _ in parsed if head[0] == "arm"]
    point = next(iter(result["arms"].values()))["curve"][-1]
    endings = [k for k in ENDING_COLUMNS if k in point]
    assert ("undecodable" in point) != all(f in point for f in FAULTS)  # one kind, or each fault its own
    assert arm_head[7] == " / ".join(ENDING_COLUMNS[k] for k in endings) + " (of the answers)"
    arm_rows = {r[0].split(" (")[0]: r for r in tables["arm"]}
    assert sorted(arm_rows) == sorted(result["arms"]) and len(tables["arm"]) == len(result["arms"])
    for name, arm in result["arms"].items():
        row = arm_rows[name]
        best, last = arm["best"], arm["curve"][-1]
        shown(row[1], *arm["kl_coef_per_seed"])
        shown(row[2], best["gold"], (best["iteration"], 0), (best["d"], 2))
        share = best["share_of_oracle_gain"]
        shown(row[3], best["gain"], *([] if share is None else [(100 * share, 0)]))
        shown(row[4], last["gold"]["mean"], last["gold"]["sd"])
        shown(row[5], (last["d"]["mean"], 2))
        shown(row[6], (last["proxy_std"]["mean"], 2))
        shown(row[7], *((last[k]["mean"], 1) for k in endings))
        shown(row[8], (last["uncertified"]["mean"], 1))
    for row, p in zip(tables["n"], result["best_of_n"]["points"], strict=True):
        shown(row[0], (p["n"], 0))
        shown(row[1], p["kl_bound"])
        shown(row[2], p["d_bound"])
        shown(row[3], p["gold"]["mean"], p["gold"]["sd"])
        shown(row[4], (p["proxy_std"]["mean"], 2))
        shown(row[5], (p["truncations"]["mean"], 1))
    bon_ensemble_shows(tables["best of n"], result)
    for row, s in zip(tables["seed"], result["seeds"], strict=True):
        shown(row[0], (s["seed"], 0))
        shown(row[1], (s["sigma_validation"], 2))
        shown(row[2], (s["mean_validation"], 2))
        shown(row[3], (s["train_spread"]["mean"], 2), (s["train_spread"]["sd"], 2))
        shown(row[4], s["sft"]["gold"])
    fits = {**{n: a["fit"] for n, a in result["arms"].items()}, "best-of-n": result["best_of_n"]["fit"]}
    assert sorted(r[0] for r in tables["curve"]) == sorted(fits)
    for row in tables["curve"]:
        fit = fits[row[0]]
        if "alpha" in fit:
            shown(row[1], fit["alpha"])
            shown(row[2], fit["beta"])
            shown(row[3], (fit["d_star"], 2))
            shown(row[4], (fit["r2"], 2))
            shown(row[5], fit["rms_residual"])
    for row, sc in zip(tables["signal"], result["warnings"]["scores"], strict=True):
        assert row[0] == sc["signal"]
        shown(row[2], (sc["fell"], 0))
        shown(row[3], (sc["early"], 0))
        if sc["median_lead"] is not None:
            shown(row[4], (sc["median_lead"], 1))
        shown(row[5], (sc["late"], 0))
        shown(row[6], (sc["misses"], 0))
        shown(row[7], (sc["false_alarms"], 0), (sc["held"], 0))
    text = page.read_text()
    sel = result["selection"]
    chosen = re.search(r"at iteration <b>(\d+)</b>, mean validation gold ([\d.]+) against SFT's ([\d.]+)", text)
    assert chosen and int(chosen[1]) == sel["iteration"]
    shown(chosen[2], sel["mean_validation_gold"])
    shown(chosen[3], sel["sft_mean_validation_gold"])
    grid = result["grid_choice"]
    best_c = re.search(r"c = ([\d.]+) \(([^,]+), mean validation gold ([\d.]+) at iteration (\d+)\)", text)
    assert best_c and (float(best_c[1]), best_c[2], int(best_c[4])) == (grid["c"], grid["arm"], grid["iteration"])
    shown(best_c[3], grid["mean_validation_gold"])
    return tables


def confirmation_page_shows(page, record: dict) -> None:
    """Every number of confirmation.html read back equals the confirmation's JSON: per point, PPO -
    SFT on each population, its mean, SD, interval (and the interval before the cut, where cut)
    and the count of positive seeds."""
    tables = [t for t in page_tables(page) if t[0] != "Over-optimisation warnings on these seeds"]
    assert len(tables) == len(record["points"])
    pops = ("test", "all_unique_contexts", "probe_contexts")  # the page's order
    for (heading, _, rows), point in zip(tables, record["points"], strict=True):
        assert heading.startswith(point["arm"] + " ")
        keys = [f"{q}.{pop}.ppo_minus_sft" for q in ("rubric_success", "learned_reward_std") for pop in pops]
        for row, key in zip(rows, keys, strict=True):
            st = point["across"][key]
            shown(row[1], st["mean"])
            shown(row[2], st["sd"])
            cut = list(st["t95_unclipped"]) if st.get("clipped") else []
            shown(row[3], *st["t95"], *cut)
            shown(row[4], (st["positive"], 0), (st["n"], 0))
