"""The reports of the session's embedded lab run, rendered by a real browser (SPEC §1, §8, §9.5).

The lab run (`lab_run`) is copied to a temporary folder so that this test never changes the
session's run (other held-out tests write its evaluation/results.json). The copy gets the real
evaluation stage if the run has none yet, then `write_reports`. Every report file must be free
of forbidden wording, and headless Chromium must render report.html with its tables and
decoded images. The screenshot is kept as reports/report_screenshot.png.

Chromium is a system package: `bash setup.sh --tests` installs Debian's `chromium`. Without it this
test fails (it is never skipped).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rlhf import report

pytestmark = pytest.mark.unit

CHROMIUM = Path("/usr/bin/chromium")
# Test-only probe appended to a copy of the page: after load, write what the browser decoded
# into attributes of <body>, which --dump-dom then shows. report.html itself has no script.
PROBE = (
    "<script>window.addEventListener('load', function () {"
    "var imgs = Array.prototype.slice.call(document.images);"
    "document.body.setAttribute('data-images', imgs.map(function (i) {"
    "return i.complete + ':' + i.naturalWidth + 'x' + i.naturalHeight; }).join(','));"
    "document.body.setAttribute('data-tables', String(document.querySelectorAll('table').length));"
    "});</script>"
)


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.glob('chromium-profile-*')))}"
    cmd = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def test_reports_render_in_headless_chromium(lab_run, tmp_path, request, record_result):
    if not CHROMIUM.is_file():
        pytest.fail(
            f"{CHROMIUM} is missing: run `bash setup.sh --tests` (it installs Debian's chromium) "
            f"to render and check report.html"
        )
    run = tmp_path / "run"
    shutil.copytree(lab_run.run, run, ignore=shutil.ignore_patterns("state-*.pt.gz", "checkpoints"))
    for name in report.REPORT_FILES:  # the lab wrote its reports; write them anew in the copy
        (run / name).unlink()
    paths = report.write_reports(run)

    # SPEC §9.5: no report file names the learned score helpfulness, satisfaction or utility
    for name, path in paths.items():
        assert report.find_forbidden_wording(path.read_text(encoding="utf-8")) == [], name
    page = paths["report.html"].read_text(encoding="utf-8")
    for sentence in report.HONESTY:
        assert sentence in page and sentence in paths["report.md"].read_text(encoding="utf-8")
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I)
    n_tables = page.count("<table")
    n_imgs = len(re.findall(r'<img src="data:image/png;base64,', page))
    assert n_imgs == 5 and len(re.findall(r"<img\b", page)) == n_imgs  # the verdict, sft, judge, ppo, timings
    assert "Evaluation not run" not in page  # the real evaluation is in this report

    # the DOM as Chromium built it, with every image decoded
    probe_page = tmp_path / "probe.html"
    probe_page.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    out = _chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probe_page.as_uri())
    assert out.returncode == 0, out.stderr[-2000:]
    dom = out.stdout
    assert len(re.findall(r"<table\b", dom)) == n_tables >= 20
    assert len(re.findall(r"<img\b", dom)) == n_imgs
    tables = re.search(r'data-tables="(\d+)"', dom)
    images = re.search(r'data-images="([^"]*)"', dom)
    assert tables and int(tables.group(1)) == n_tables, "the browser did not finish loading the page"
    assert images, "the browser did not finish loading the page"
    decoded = [m.groups() for m in re.finditer(r"(true|false):(\d+)x(\d+)", images.group(1))]
    assert len(decoded) == n_imgs
    for complete, w, h in decoded:
        assert complete == "true" and int(w) >= 600 and int(h) >= 250, decoded

    # the screenshot a person looks at, kept with the test reports
    reports_dir = Path(request.config._rlhf_reports)
    shot = reports_dir / "report_screenshot.png"
    tmp_shot = tmp_path / "report_screenshot.png"
    out = _chromium(tmp_path, f"--screenshot={tmp_shot}", "--window-size=1280,4000", paths["report.html"].as_uri())
    assert out.returncode == 0 and tmp_shot.is_file(), out.stderr[-2000:]
    from PIL import Image

    with Image.open(tmp_shot) as im:
        assert im.size == (1280, 4000)
        colours = im.convert("RGB").resize((320, 1000)).getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text, tables and plots, not a blank page
    shutil.copyfile(tmp_shot, shot)
    record_result("report_tables", n_tables)
    record_result("report_images", n_imgs)
    record_result("report_screenshot", str(shot))
    record_result("report_summary", report.print_summary(json.loads(paths["results.json"].read_text(encoding="utf-8"))))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str):
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_a_real_tensorboard_lists_the_runs_curves_in_headless_chromium(small_run, tmp_path, request, record_result):
    """`tensorboard --logdir RUN/tensorboard` (the line `rlhf lab` prints) on a free local port:
    its HTTP API lists the stages as runs and each run's tags as our reader finds them, and its
    Time Series page, rendered by headless Chromium, lists every run and every tag group with
    its number of charts. The screenshot is kept as reports/tensorboard_screenshot.png."""
    import sys
    import time
    import urllib.error

    from conftest import read_series

    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: run `bash setup.sh --tests` (it installs Debian's chromium)")
    logdir = small_run.run / "tensorboard"
    stages = sorted(p.name for p in logdir.iterdir())
    tags = {stage: sorted(read_series(logdir / stage)) for stage in stages}
    port = _free_port()
    board = subprocess.Popen(
        [str(Path(sys.executable).parent / "tensorboard"), "--logdir", str(logdir), "--host", "127.0.0.1"]
        + ["--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, runs = time.monotonic() + 120, []
        while time.monotonic() < deadline and sorted(runs) != stages:
            try:
                runs = _get_json(f"{base}/data/runs")
            except (urllib.error.URLError, ConnectionError):
                runs = []  # not listening yet: TensorBoard takes seconds to start; the deadline bounds the wait
            time.sleep(0.5)
        assert sorted(runs) == stages, f"TensorBoard lists {runs}, not the stages {stages}"
        served = _get_json(f"{base}/data/plugin/scalars/tags")
        assert {run: sorted(t) for run, t in served.items()} == tags
        out = _chromium(tmp_path, "--virtual-time-budget=20000", "--dump-dom", f"{base}/#timeseries")
        assert out.returncode == 0, out.stderr[-2000:]
        text = " ".join(
            re.sub(r"<[^>]+>", " ", re.sub(r"<(style|script)\b.*?</\1>", "", out.stdout, flags=re.S)).split()
        )
        run_list = re.search(r"Run (.*?) All Scalars", text)
        assert run_list and run_list.group(1).split() == stages, text[:2000]
        groups: dict[str, set[str]] = {}
        for stage_tags in tags.values():
            for tag in stage_tags:
                groups.setdefault(tag.split("/")[0], set()).add(tag)
        for group, members in groups.items():
            n = len(members)  # TensorBoard counts a group's cards from 2 on
            listed = f" {group} {n} cards " if n > 1 else f" {group} "
            assert listed in f" {text} ", f"{group}: {n} cards not listed"
        shot = tmp_path / "tensorboard.png"
        out = _chromium(
            tmp_path,
            "--virtual-time-budget=20000",
            "--window-size=1400,1000",
            f"--screenshot={shot}",
            f"{base}/#timeseries",
        )
        assert out.returncode == 0 and shot.is_file(), out.stderr[-2000:]
    finally:
        board.terminate()
        board.wait(timeout=30)
    shutil.copyfile(shot, Path(request.config._rlhf_reports) / "tensorboard_screenshot.png")
    record_result("tensorboard_runs", stages)
    record_result("tensorboard_tag_groups", {g: len(m) for g, m in sorted(groups.items())})
