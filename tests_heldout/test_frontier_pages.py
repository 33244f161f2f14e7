"""Every number of the frontier's pages (the committed studies' and the small study's) read back
from the HTML and matched with the study it shows."""

from __future__ import annotations

import json

import pytest
from frontier_checks import FAULTS, ROOT, bon_ensemble_shows, frontier_page_shows, page_tables, shown

# One xdist worker runs the frontier's files: the small study is built once, and no worker waits for another's.
pytestmark = [pytest.mark.unit, pytest.mark.xdist_group("frontier")]


@pytest.mark.parametrize("revision", ["r001", "r002"])
def test_every_number_of_the_committed_frontier_pages_is_their_studys(revision, tmp_path):
    """The committed page, and the page this code renders from the committed JSON, read back
    number by number."""
    from rlhf.report.frontier import render_frontier_html

    folder = ROOT / "results" / f"frontier-{revision}"
    result = json.loads((folder / "frontier.json").read_text())
    frontier_page_shows(folder / "report.html", result)
    (page := tmp_path / "report.html").write_text(render_frontier_html(result, None))
    frontier_page_shows(page, result)


def test_every_number_of_the_frontier_page_is_the_studys(small_frontier, tmp_path):
    out, result = small_frontier
    frontier_page_shows(out / "report.html", result)
    # The small study's refreshes may label no pair (accuracies None): the refresh table is also
    # read back from the page rendered with every column distinct, so a swapped column shows.
    from rlhf.report.frontier import render_frontier_html

    distinct = {"after_iteration": 5, "successes": 3.5, "answers": 64, "new_pairs": 7.5, "seeds_with_pairs": 2}
    distinct.update(accuracy_before=0.25, accuracy_after=0.875)
    variant = json.loads(json.dumps(result))
    variant["arms"]["iterated-judge"]["refreshes"] = [distinct, *result["arms"]["iterated-judge"]["refreshes"]]
    # Every ending column of the arm table distinct and not 0 (the small study's answers hold no
    # token fault), so a fault left out or two columns swapped show.
    for k, arm in enumerate(variant["arms"].values()):
        for j, key in enumerate(("cut_at_limit", *FAULTS, "repeats_polite_closing")):
            arm["curve"][-1][key] = {**arm["curve"][-1][key], "mean": 10.0 * (k + 1) + j + 0.5}
    (tmp := tmp_path / "variant-report.html").write_text(render_frontier_html(variant, None))
    frontier_page_shows(tmp, variant)
    (refresh_rows,) = [rows for _, head, rows in page_tables(tmp) if head[0] == "after iteration"]
    for row, r in zip(refresh_rows, variant["arms"]["iterated-judge"]["refreshes"], strict=True):
        shown(row[0], (r["after_iteration"], 0))
        shown(row[1], (r["successes"], 1), (r["answers"], 0))
        shown(row[2], (r["new_pairs"], 1))
        shown(row[3], (r["seeds_with_pairs"], 0))
        shown(row[4], r["accuracy_before"])
        shown(row[5], r["accuracy_after"])
    # The same for best-of-n under the ensemble (on the small study its rankings may pick alike).
    for k, design in enumerate(variant["best_of_n_ensemble"]["designs"].values()):
        for j, p in enumerate(design["points"]):
            p["gold"] = {**p["gold"], "mean": 0.1 * (k + 1) + 0.01 * j, "sd": 0.001 * (k + 1)}
        design["gold_change"] = {**design["gold_change"], "mean": -0.1 * (k + 1)}
    tmp.unlink()
    tmp.write_text(render_frontier_html(variant, None))
    (ens_rows,) = [rows for _, head, rows in page_tables(tmp) if head[0] == "best of n"]
    bon_ensemble_shows(ens_rows, variant)
