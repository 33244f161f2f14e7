"""Pytest wiring shared by every layer.

* Each test carries exactly one run tier (`unit`, `gpu`, `benchmark`); a test without one, or
  with two, stops collection with an error naming it.
* The layer marker (`property`, `reproducibility`, `heldout`) is added from the test's folder.
* Every run writes `junit.xml` and `results.json` under the reports folder
  (`--reports-dir`, default `reports/`). Tests put numbers into `results.json` through the
  `record_result` fixture; those numbers are the published results.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

TIERS = ("unit", "gpu", "benchmark")
LAYER_OF_FOLDER = {
    "tests_property": "property",
    "tests_reproducibility": "reproducibility",
    "tests_heldout": "heldout",
}

# One hypothesis profile for every property test: no deadline (the first call of a model is
# slow), derandomized so that CI and a rerun draw the same examples, no example database on
# disk. Tests set only their number of examples.
from hypothesis import settings as _hypothesis_settings

_hypothesis_settings.register_profile("rlhf", deadline=None, derandomize=True, database=None)
_hypothesis_settings.load_profile("rlhf")

_RECORDS: dict[str, dict] = {}
_OUTCOMES: dict[str, dict] = {}


def pytest_addoption(parser):
    parser.addoption("--reports-dir", default=os.environ.get("RLHF_REPORTS_DIR", "reports"),
                     help="folder for junit.xml and results.json (default: reports/); write --reports-dir=DIR")
    parser.addoption("--model-dir", default=os.environ.get("RLHF_MODEL_DIR"),
                     help="gpu tier: local Qwen2.5-0.5B-Instruct directory (rlhf fetch-model --out DIR)")
    parser.addoption("--random-weights", action="store_true",
                     help="gpu tier: use the full Qwen2.5-0.5B shape with random weights (no download)")


def pytest_configure(config):
    reports = Path(config.getoption("--reports-dir"))
    reports.mkdir(parents=True, exist_ok=True)
    config._rlhf_reports = reports
    if getattr(config.option, "xmlpath", None) is None and not hasattr(config, "workerinput"):
        config.option.xmlpath = str(reports / "junit.xml")
    if hasattr(config.option, "benchmark_json") and config.option.benchmark_json is None:
        pass  # pytest-benchmark JSON is asked for explicitly (see README)


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the xdist_group markers
def pytest_collection_modifyitems(config, items):
    bad = []
    for item in items:
        tiers = [t for t in TIERS if item.get_closest_marker(t) is not None]
        if len(tiers) != 1:
            bad.append(f"{item.nodeid}: tiers {tiers or 'none'}")
        folder = Path(str(item.fspath)).relative_to(config.rootpath).parts[0]
        layer = LAYER_OF_FOLDER.get(folder)
        if layer:
            item.add_marker(getattr(pytest.mark, layer))
        if "lab_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("lab"))  # one worker runs the lab once
    if bad:
        raise pytest.UsageError("every test needs exactly one run tier (unit, gpu or benchmark):\n  "
                                + "\n  ".join(bad))


@pytest.fixture
def record_result(request):
    """Record a named number (or any JSON value) for this test in reports/results.json."""
    bucket = _RECORDS.setdefault(request.node.nodeid, {})

    def record(key: str, value):
        json.dumps(value)  # refuse what the report could not hold, here rather than at the end
        bucket[key] = value
        request.node.user_properties.append((key, json.dumps(value)))

    return record


def pytest_runtest_logreport(report):
    entry = _OUTCOMES.setdefault(report.nodeid, {"outcome": "passed", "duration_s": 0.0})
    entry["duration_s"] = round(entry["duration_s"] + report.duration, 4)
    if report.failed:
        entry["outcome"] = "failed" if report.when == "call" else "error"
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
    for key, value in report.user_properties:
        entry.setdefault("results", {})[key] = json.loads(value)


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if hasattr(config, "workerinput"):
        return  # xdist workers report through the controller
    path = config._rlhf_reports / "results.json"
    data = {
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "markexpr": config.option.markexpr,
        "exitstatus": int(exitstatus),
        "counts": {k: sum(1 for t in _OUTCOMES.values() if t["outcome"] == k)
                   for k in ("passed", "failed", "error", "skipped")},
        "tests": _OUTCOMES,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


# ---------------------------------------------------------------- shared fixtures (embedded)

@pytest.fixture(scope="module")
def one_thread():
    """One torch thread, as the embedded profile runs (two were ~27x slower for the tiny model)."""
    import torch
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def embedded_profile():
    from rlhf.config import load_profile
    return load_profile("embedded")


@pytest.fixture(scope="session")
def embedded_dir(tmp_path_factory):
    """The embedded base built once per session (deterministic, well under a second)."""
    from rlhf.embedded import build_embedded
    path = tmp_path_factory.mktemp("embedded") / "base"
    build_embedded(path)
    return path


@pytest.fixture(scope="session")
def embedded_base(embedded_profile, embedded_dir):
    from rlhf.models import load_base
    return load_base(embedded_profile, embedded_dir)


@pytest.fixture(scope="session")
def lab_run(tmp_path_factory):
    """The embedded lab run once per session (SFT, judge, PPO with the interrupt/resume protocol).

    tests_reproducibility and tests_heldout assert on its files; it takes a few minutes on 2 cores.
    """
    import time as _time
    from rlhf import lab
    run = tmp_path_factory.mktemp("lab") / "run"
    t0 = _time.perf_counter()
    ctx = lab.open_context(run, "embedded")
    seconds = {}
    for name, stage in (("sft", lab.stage_sft), ("reward", lab.stage_reward), ("ppo", lab.stage_ppo)):
        t = _time.perf_counter()
        stage(ctx)
        seconds[name] = _time.perf_counter() - t
    seconds["total"] = _time.perf_counter() - t0
    ctx.stage_seconds = seconds
    return ctx


@pytest.fixture(scope="session")
def move_adapters():
    """move(model, seed) -> generator: draw every LoRA B of `model` from N(0, 0.05^2).

    Fresh adapters have B = 0 (the identity), which would leave the adapted path untested.
    The generator is returned so that a caller can keep drawing (e.g. a head) from it.
    """
    import torch
    from rlhf.lora import lora_modules

    def move(model, seed: int):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for m in lora_modules(model).values():
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * 0.05)
        return g

    return move
