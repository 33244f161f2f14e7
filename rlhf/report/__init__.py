"""Reports of a finished run: ``results.json``, ``report.md`` and a self-contained ``report.html``.

``write_reports(run_dir)`` reads the run folder (layout: the docstring of ``rlhf.lab``; the
evaluation stage adds ``evaluation/results.json``) and writes three files into it, atomically,
never overwriting (``FileExistsError`` if any of them is already there, before anything is
written):

``results.json``  every number, machine-readable: corpus audit, SFT / judge / PPO histories
                  (summaries and full curves), timings, resume checks with their SHA-256,
                  role fingerprints, the scoring check, the per-token views, the evaluation
                  results, and ``judge_test`` (judge test accuracy, ``accuracy`` and
                  ``by_variant``) at the top level.
``report.md``     the same story as text tables.
``report.html``   one file with no external resource: inline CSS, learning curves drawn with
                  matplotlib (Agg, no pyplot state) embedded as ``data:image/png;base64`` URIs.

A missing ``evaluation/results.json`` is not an error: the reports say "not run" where the
evaluation would be. The three histories and the corpus manifest are required.

Honesty (SPEC §1, §8) is part of the product: ``HONESTY`` is printed in both reports, and the
learned score is only ever named ``SCORE_NAME`` ("predicted score of simulated preferences").

Wording check (SPEC §9.5): ``find_forbidden_wording(text)`` flags wording that names the learned
score helpfulness, satisfaction or human utility (``FORBIDDEN_PATTERNS``). The honesty
disclaimers necessarily contain some of those words ("no claim of learning human
satisfaction"): they are allowed by an exact allow-list, ``ALLOWED_DISCLAIMERS`` (the
``HONESTY`` sentences), removed from the text before it is scanned; any other use is flagged.
``write_reports`` checks the text it authors itself (with every model output replaced by a
placeholder) and refuses to write a report that fails (``ReportWordingError``). Model outputs
are data, quoted verbatim; their own hits are recorded in ``results.json``
(``wording_check.model_outputs``), never rewritten.

The package, one concern per module:

``wording``     names of the score, ``HONESTY``, ``DPO_NOTE``, ``FORBIDDEN_PATTERNS``,
                ``find_forbidden_wording``, ``ReportWordingError``
``labels``      populations, metrics, pair variants, PPO phases, stages
``results``     ``collect_results`` (the content of results.json) and its helpers
``formatting``  ``fmt``, ``fmt_signed`` and the other number and text helpers
``tables``      ``Table`` and one builder per table
``sections``    ``build_sections``: one function per section of the report
``plots``       ``make_plots``: one function per plot
``render``      ``render_markdown``, ``render_html`` (and ``CSS``)
``write``       ``write_reports``, ``print_summary``

The entry points, ``Table`` and the wording names are imported here: use ``rlhf.report.X``; the
fixed vocabulary stays in ``rlhf.report.labels``. The wording names (``SCORE_NAME``,
``HONESTY`` ...) live in ``rlhf.report.wording`` and the other modules read them there at call
time, so a test that changes one patches ``rlhf.report.wording``.
"""

from __future__ import annotations

from rlhf.report import wording as wording  # re-exported: tests patch rlhf.report.wording
from rlhf.report.formatting import fmt, fmt_signed
from rlhf.report.plots import make_plots
from rlhf.report.render import CSS, render_html, render_markdown
from rlhf.report.results import REQUIRED_INPUTS, collect_results
from rlhf.report.sections import build_sections
from rlhf.report.tables import Table
from rlhf.report.wording import (
    ALLOWED_DISCLAIMERS,
    DPO_NOTE,
    FORBIDDEN_PATTERNS,
    HONESTY,
    MODEL_TEXT_PLACEHOLDER,
    SCORE_NAME,
    SCORE_SHORT,
    ReportWordingError,
    find_forbidden_wording,
)
from rlhf.report.write import REPORT_FILES, print_summary, write_reports

__all__ = [
    "ALLOWED_DISCLAIMERS",
    "CSS",
    "DPO_NOTE",
    "FORBIDDEN_PATTERNS",
    "HONESTY",
    "MODEL_TEXT_PLACEHOLDER",
    "REPORT_FILES",
    "REQUIRED_INPUTS",
    "SCORE_NAME",
    "SCORE_SHORT",
    "ReportWordingError",
    "Table",
    "build_sections",
    "collect_results",
    "find_forbidden_wording",
    "fmt",
    "fmt_signed",
    "make_plots",
    "print_summary",
    "render_html",
    "render_markdown",
    "write_reports",
]
