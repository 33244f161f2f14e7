"""Pytest wiring shared by every layer.

* Each test carries exactly one run tier (`unit`, `gpu`, `benchmark`); a test without one, or
  with two, stops collection with an error naming it.
* The layer marker (`property`, `reproducibility`, `heldout`) is added from the test's folder.
* Every run writes `junit.xml` and `results.json` into a folder of its own tier, so that no tier
  wipes another's results: `reports/unit/` for `pytest -m unit`, `reports/gpu/`,
  `reports/benchmark/`, and `reports/other/` for any other selection (`--reports-dir=DIR` or
  RLHF_REPORTS_DIR chooses the folder itself). Tests put numbers into `results.json` through
  the `record_result` fixture; those numbers are the published results. Both files carry the
  run's provenance: commit, dirty flag, package versions, Python, CPU arithmetic (rlhf.runtime),
  CUDA device, profile hashes and the command line.
* `pytest --benchmark` runs the benchmark tier the right way: `-m benchmark`, no xdist (timings
  need one process), and pytest-benchmark's JSON written to `reports/benchmark/benchmark.json`.
* `pytest --benchmark-smoke` runs every benchmark once, untimed (pytest-benchmark's
  `--benchmark-disable`), in one process, with its reports in `reports/benchmark-smoke/` so that
  it never overwrites a measured run's: what CI runs after the unit tier, so the tier cannot rot.
"""

from __future__ import annotations

import rlhf  # noqa: F401 - first: pins the CPU arithmetic before anything imports torch (rlhf.runtime)

# isort: split

import json
import os
import struct
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import settings as _hypothesis_settings

# The test tier's xdist workers already fill the cores: the protocol's legs run one after the other
# (rlhf.legs), in every lab and subprocess the tests start, unless a test asks for them side by side.
os.environ["RLHF_LEGS"] = "sequential"

TIERS = ("unit", "gpu", "benchmark")
LAYER_OF_FOLDER = {
    "tests_property": "property",
    "tests_reproducibility": "reproducibility",
    "tests_heldout": "heldout",
}

# One hypothesis profile for every property test: no deadline (the first call of a model is
# slow), derandomized so that CI and a rerun draw the same examples, no example database on
# disk. Tests set only their number of examples (tests_property/property_budget.py).
# `pytest --hypothesis-profile=explore` searches instead: fresh random examples on every run,
# at least 2000 per test (property_budget.examples), and a failure prints the blob that replays it.
_hypothesis_settings.register_profile("rlhf", deadline=None, derandomize=True, database=None)
_hypothesis_settings.register_profile(
    "explore", deadline=None, derandomize=False, database=None, max_examples=2000, print_blob=True
)
_hypothesis_settings.load_profile("rlhf")

_RECORDS: dict[str, dict] = {}
_OUTCOMES: dict[str, dict] = {}
_SESSION_START = time.time()  # results.json: each test's start, in seconds from here


def pytest_addoption(parser):
    parser.addoption(
        "--reports-dir",
        default=os.environ.get("RLHF_REPORTS_DIR"),
        help="folder for junit.xml and results.json (default: reports/<tier>/); write --reports-dir=DIR",
    )
    parser.addoption(
        "--benchmark",
        action="store_true",
        help="run the benchmark tier: -m benchmark, no xdist, JSON in reports/benchmark/benchmark.json",
    )
    parser.addoption(
        "--benchmark-smoke",
        action="store_true",
        help="run every benchmark once, untimed (CI): -m benchmark, no xdist, --benchmark-disable, "
        "reports in reports/benchmark-smoke/",
    )
    parser.addoption(
        "--model-dir",
        default=os.environ.get("RLHF_MODEL_DIR"),
        help="gpu tier: local Qwen2.5-0.5B-Instruct directory (rlhf fetch-model --out DIR)",
    )
    parser.addoption(
        "--gpu-out",
        default=os.environ.get("RLHF_GPU_OUT"),
        help="gpu tier: folder of gpu_numbers.json, written as each stage finishes (default: the reports folder)",
    )
    parser.addoption(
        "--random-weights",
        action="store_true",
        help="gpu tier: use the full Qwen2.5-0.5B shape with random weights (no download)",
    )


def reports_folder(config) -> Path:
    """reports/<tier>/ for a run of exactly one tier, reports/other/ otherwise."""
    if config.getoption("--reports-dir"):
        return Path(config.getoption("--reports-dir"))
    if config.getoption("--benchmark-smoke"):
        return Path("reports") / "benchmark-smoke"
    markexpr = (config.option.markexpr or "").strip()
    return Path("reports") / (markexpr if markexpr in TIERS else "other")


@pytest.hookimpl(tryfirst=True)  # before xdist registers its scheduler (trylast) and before -m is applied
def pytest_configure(config):
    smoke = config.getoption("--benchmark-smoke")
    if smoke and config.getoption("--benchmark"):
        raise pytest.UsageError("--benchmark times the tier and --benchmark-smoke runs it untimed: give one of them")
    if config.getoption("--benchmark") or smoke:
        config.option.markexpr = "benchmark"
        # pytest-benchmark times nothing under xdist: one process, whatever addopts says (the
        # benchmarks refuse xdist workers, timed or not).
        config.option.numprocesses, config.option.dist, config.option.tx = None, "no", []
    if smoke:
        config.option.benchmark_disable = True  # each benchmark function runs once, nothing is timed
    reports = reports_folder(config)
    reports.mkdir(parents=True, exist_ok=True)
    config._rlhf_reports = reports
    config._rlhf_gpu_out = Path(config.getoption("--gpu-out") or reports)
    config._rlhf_gpu_out.mkdir(parents=True, exist_ok=True)
    if getattr(config.option, "xmlpath", None) is None and not hasattr(config, "workerinput"):
        config.option.xmlpath = str(reports / "junit.xml")
    if config.getoption("--benchmark") and getattr(config.option, "benchmark_json", None) is None:
        config.option.benchmark_json = reports / "benchmark.json"


def pytest_sessionstart(session):
    """Provenance as junit.xml testsuite properties (results.json gets the same dict)."""
    config = session.config
    if hasattr(config, "workerinput"):
        return
    from _pytest.junitxml import xml_key

    xml = config.stash.get(xml_key, None)
    if xml is not None:
        for key, value in provenance(config).items():
            xml.add_global_property(key, value if isinstance(value, str) else json.dumps(value, sort_keys=True))


def pytest_terminal_summary(terminalreporter, config):
    folder = config._rlhf_reports
    lines = [f"reports: {folder / 'junit.xml'} and {folder / 'results.json'}"]
    if config.getoption("--benchmark"):
        lines.append(f"benchmark numbers: {folder / 'benchmark.json'} (pytest-benchmark JSON)")
    if config.getoption("--benchmark-smoke"):
        lines.append("benchmark smoke run: every benchmark ran once, untimed; no figure of this run is a measurement")
    coverage_line = getattr(config, "_rlhf_coverage_line", None)
    if coverage_line:
        lines.append(coverage_line)
    for line in lines:
        terminalreporter.write_line(line)
    bench = sys.modules.get("bench_common")  # a benchmark module ran: its one summary, written once
    if bench is not None:
        bench.finish(config, terminalreporter)


def cpu_and_dtype() -> dict:
    """The CPU's flags that decide kernels and dtypes, and the dtype a BF16 profile computes in
    on this CPU (rlhf.runtime.choose_dtype): recorded by the benchmark tier."""
    from rlhf import runtime

    flags = runtime.cpu_flags() or frozenset()
    return {
        "cpu_flags": sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c"))),
        "bf16_weights_compute_in": runtime.choose_dtype("bfloat16", "cpu"),
    }


def pytest_benchmark_update_machine_info(config, machine_info):
    """pytest-benchmark's machine_info in benchmark.json: the CPU's flags and the dtype chosen."""
    machine_info.update(cpu_and_dtype())


_PROVENANCE: dict = {}


def provenance(config) -> dict:
    """Where these results come from: code, packages, machine, arithmetic, profiles, command."""
    if _PROVENANCE:
        return _PROVENANCE
    import platform
    import subprocess
    import sys
    from importlib import metadata

    def git(*args):
        try:
            out = subprocess.run(["git", *args], cwd=config.rootpath, capture_output=True, text=True, timeout=20)
            return out.stdout.strip() if out.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            return None

    versions = {}
    for name in (
        "torch",
        "transformers",
        "tokenizers",
        "safetensors",
        "peft",
        "hypothesis",
        "pytest",
        "pytest-xdist",
        "pytest-benchmark",
        "rlhf",
    ):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    import torch

    from rlhf import runtime
    from rlhf.config import PROFILES, load_profile, profile_hash

    status = git("status", "--porcelain")
    _PROVENANCE.update(
        {
            "commit": git("rev-parse", "HEAD"),
            "dirty": None if status is None else bool(status),
            "packages": versions,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "arithmetic": runtime.describe(),
            "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "profiles_sha256": {name: profile_hash(load_profile(name)) for name in PROFILES},
            "command_line": [Path(sys.argv[0]).name, *sys.argv[1:]],
        }
    )
    return _PROVENANCE


# The `e2e` layer: a test that uses one of these fixtures (directly or through another fixture)
# trains a lab, runs a lab or a training stage in a subprocess, or builds .venv-verl.
# A module whose tests start fresh processes without such a fixture (whole pytest sessions,
# `rlhf` commands, the emulated CPU) says so once, in its `pytestmark`.
# `pytest -m "unit and not e2e"` leaves them out (the inner loop); `pytest -m unit` runs them.
E2E_FIXTURES = frozenset(
    {
        "lab_run",  # the whole embedded lab on r001, with the interrupt/resume protocol
        "lab_run_r002",  # the whole embedded lab on r002
        "small_run",  # the small-budget lab (SMALL_BUDGET), every stage
        "small_profile_file",  # asked for only by tests that train on the small budget
        "small_study",  # the 2-seed study on the small budget (tests_heldout/test_seeds.py)
        "base_study",  # the base-model study (tests_heldout/test_base_study.py)
        "full_width",  # qwen2.5-0.5b at full width, random weights, in a subprocess
        "stopped_run",  # SFT stopped after an epoch, then resumed (tests_reproducibility/test_bad_input.py)
        "small_frontier",  # a 2-seed frontier on the small budget (tests_heldout/test_frontier*.py)
    }
)


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
        names = getattr(item, "fixturenames", ())
        if E2E_FIXTURES.intersection(names) or item.get_closest_marker("e2e") is not None:
            item.add_marker(pytest.mark.e2e)
        if item.get_closest_marker("xdist_group") is not None:
            pass  # the module chose its worker group (its labs are shared under a file lock)
        elif "lab_run" in names:
            item.add_marker(pytest.mark.xdist_group("lab"))  # one worker runs the tests of the lab
        elif "lab_run_r002" in names:
            item.add_marker(pytest.mark.xdist_group("lab_r002"))
    if bad:
        raise pytest.UsageError(
            "every test needs exactly one run tier (unit, gpu or benchmark):\n  " + "\n  ".join(bad)
        )


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
    if report.when == "setup":  # where and when it ran: the run's timeline, worker by worker
        entry["worker"] = getattr(report, "worker_id", "main")
        entry["started_s"] = round(report.start - _SESSION_START, 2)
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
        "counts": {
            k: sum(1 for t in _OUTCOMES.values() if t["outcome"] == k) for k in ("passed", "failed", "error", "skipped")
        },
        "provenance": provenance(config),
        "tests": _OUTCOMES,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
    write_coverage_map(config)


def write_coverage_map(config) -> None:
    """With --cov (pytest-cov; pyproject.toml's [tool.coverage.run]: rlhf/, lines and branches,
    the processes the tests start included): the combined data written as coverage.json (coverage's
    JSON report: every file's run and missed lines and branches) and coverage.md (per module:
    statements, missed, branches, partial, the missed lines) beside junit.xml."""
    plugin = config.pluginmanager.get_plugin("_cov")
    if plugin is None or not getattr(plugin, "cov_controller", None):
        return
    import coverage

    cov = coverage.Coverage(config_file=str(Path(config.rootpath) / "pyproject.toml"))
    cov.load()
    folder = config._rlhf_reports
    for name, write in (
        ("coverage.json", lambda out: cov.json_report(outfile=out)),
        ("coverage.md", lambda out: _markdown_report(cov, out)),
    ):
        tmp = folder / f"{name}.tmp"
        total = write(str(tmp))
        os.replace(tmp, folder / name)
    config._rlhf_coverage_line = (
        f"coverage: {folder / 'coverage.json'} and {folder / 'coverage.md'} "
        f"({total:.1f}% of rlhf/'s statements and branches run)"
    )


def _markdown_report(cov, out: str) -> float:
    with open(out, "w") as f:
        return cov.report(file=f, show_missing=True, output_format="markdown", precision=1)


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
    """The embedded lab on r001 run once per session, as `rlhf lab` runs it, but for the
    interrupt/resume legs of SFT and the judge: SFT and the judge once each, PPO with the protocol
    at the SPEC's boundary (iteration 40 of 100), evaluation, shortcut audit and reports. SFT's
    and the judge's protocol at the same boundary as here (epoch 1) are checked on the small-budget
    lab (`small_run`, tests_reproducibility/test_resume_small.py); running them here too would
    repeat 20 SFT epochs and 2 judge epochs (about a minute on 2 cores) to check the same code.

    tests_reproducibility and tests_heldout assert on its files; it takes a few minutes on 2 cores.
    Built once per test run across xdist workers (`shared_lab`): read it, copy it before writing.
    """
    return shared_lab(tmp_path_factory, "lab_run", "embedded", "r001", protocol=True, once=("sft", "judge"))


@pytest.fixture(scope="session")
def lab_run_r002(tmp_path_factory):
    """The embedded lab on r002, each stage run once (no interrupt/resume legs): the golden numbers.
    Built once per test run across xdist workers (`shared_lab`)."""
    return shared_lab(tmp_path_factory, "lab_run_r002", "embedded", "r002", protocol=False)


def _run_whole_lab(run, revision: str, protocol: bool, profile="embedded", once: tuple[str, ...] = ()):
    """`rlhf lab`'s run; the training stages named in `once` (sft, judge) run first without the
    interrupt/resume protocol, and run_lab skips them as complete."""
    import time as _time

    from rlhf import lab

    t0 = _time.perf_counter()
    ctx = lab.open_context(run, profile, revision=revision)
    stages = {"sft": lab.stage_sft, "judge": lab.stage_judge}
    for name in once:
        stages[name](ctx, protocol=False)
    lab.run_lab(ctx, protocol=protocol)
    ctx.stage_seconds = {
        "total": _time.perf_counter() - t0,
        **{s: read_timing(run / s / "timings.json") for s in ("sft", "judge", "ppo")},
    }
    return ctx


def read_timing(path) -> float:
    return round(json.loads(Path(path).read_text())["seconds"], 1)


# The small budget (not rlhf.miniature's MINIATURE_BUDGET, the qwen dry run's): every stage
# and every leg of the protocol, and every part of the held-out evaluation, in about 20 seconds.
# Only budgets change (epochs, updates per epoch, iterations, boundaries, and the sizes of what is
# measured): SFT's and the judge's validation cut to their first 16 examples or pairs, every
# held-out set to its first 3 units (15 test prompts and pairs, 3 probe contexts) and held-out
# answers to 8 new tokens. The whole sets are evaluated by the embedded labs (`lab_run`,
# `lab_run_r002`); on a small lab they took half its time and checked the same code.
SMALL_EVALUATION_UNITS = 3
SMALL_TEST_PROMPTS = 15  # 3 of the 36 test families, 5 prompts each (both revisions)
SMALL_PROBE_ROWS = 12  # 3 of the 20 probe contexts, 4 rows each


def first_families(records: list[dict], n: int | None) -> list[dict]:
    """The records of the first n families in file order (the held-out cut by hand; None: all)."""
    families: list = []
    for r in records:
        if r["family"] not in families:
            families.append(r["family"])
    return records if n is None else [r for r in records if r["family"] in families[:n]]


SMALL_BUDGET = {
    ("sft", "epochs"): 2,
    ("sft", "max_updates_per_epoch"): 3,
    ("sft", "max_validation_examples"): 16,
    ("judge", "epochs"): 2,
    ("judge", "max_updates_per_epoch"): 3,
    ("judge", "max_validation_examples"): 16,
    ("ppo", "iterations"): 4,
    ("ppo", "resume_stop_iteration"): 2,
    ("ppo", "checkpoint_every"): 1,
    ("evaluation", "max_new_tokens"): 8,
    ("evaluation", "max_units"): SMALL_EVALUATION_UNITS,
}


def write_small_profile(path) -> Path:
    """The embedded profile's TOML with SMALL_BUDGET written in (a real file, so that a
    subprocess can be given `--profile PATH`); name `embedded-small`."""
    from rlhf.config import PROFILE_DIR, profile_text_with

    text = profile_text_with((PROFILE_DIR / "embedded.toml").read_text(), "embedded-small", SMALL_BUDGET)
    path = Path(path)
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def small_profile_file(tmp_path_factory):
    """One file for the whole test run, shared by the xdist workers: the path is part of what a
    run records (the politeness exercise hashes the profile file by path), so the crash test's
    runs and the shared `small_run` name the same file."""
    from filelock import FileLock

    folder = shared_root(tmp_path_factory) / "shared-profiles"
    folder.mkdir(exist_ok=True)
    path = folder / "embedded-small.toml"
    with FileLock(str(folder / "write.lock")):
        if not path.is_file():
            write_small_profile(path)
    return path


# The small budget with the frontier's cuts: checkpoints every 2 of 4 iterations and 8-token
# rollouts (its validation reads the small budget's first 3 families, 15 prompts, at 8 tokens).
FRONTIER_BUDGET = {
    **SMALL_BUDGET,
    ("ppo", "checkpoint_every"): 2,
    ("ppo", "max_new_tokens"): 8,
}


@pytest.fixture(scope="session")
def small_frontier(tmp_path_factory):
    """`rlhf frontier` on the small budget: 2 seeds of r002; arms: the SPEC's default, c = 0.05
    sigma, the standardised judge and the oracle; best-of-1 and -2; one KL sample per prompt.
    Built once per test run (file lock), with the corpus's evaluation view refusing every call:
    nothing on the frontier's path may read a test prompt. Returns (study folder, frontier.json)."""
    from filelock import FileLock

    from rlhf.config import PROFILE_DIR, profile_text_with
    from rlhf.corpus import Corpus, EvaluationView
    from rlhf.studies.frontier.study import run_frontier

    folder = shared_root(tmp_path_factory) / "shared-frontier"
    folder.mkdir(exist_ok=True)
    out = folder / "study"
    with FileLock(str(folder / "build.lock")):
        if not (out / "frontier.json").is_file():
            profile = folder / "embedded-frontier-small.toml"
            text = (PROFILE_DIR / "embedded.toml").read_text()
            profile.write_text(profile_text_with(text, "embedded-frontier-small", FRONTIER_BUDGET))

            def refuse(*args, **kwargs):
                raise PermissionError("the frontier read the evaluation view (test prompts)")

            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(Corpus, "evaluation_view", refuse)
                mp.setattr(EvaluationView, "__init__", refuse)
                run_frontier(
                    out,
                    n=2,
                    revision="r002",
                    sft_budget="full",
                    workers=1,
                    profile_name=str(profile),
                    settings=small_frontier_settings(),
                    say=lambda line: None,
                )
    return out, json.loads((out / "frontier.json").read_text())


def small_frontier_settings():
    """The small frontier's arms and measurement sizes: the SPEC's default, a one-point grid, the
    standardised judge, the oracle, the iterated judge (a refresh after iteration 2 of 4) and a
    worst-case ensemble of 2 judges at the grid's best c (so: after the grid)."""
    from rlhf.studies.frontier.arms import SPEC_KL, Arm, Settings

    refresh = (("refresh_every", 2), ("refresh_prompts", 8), ("refresh_updates", 2))
    arms = (
        Arm("spec-default", "judge", raw=SPEC_KL),
        Arm("c0.05", "judge", c=0.05),
        Arm("standardised-judge", "standardised-judge", raw=SPEC_KL),
        Arm("oracle", "oracle", raw=SPEC_KL),
        Arm("iterated-judge", "iterated-judge", raw=SPEC_KL, ppo=refresh),
        Arm("ensemble-min-cbest", "ensemble-min", c_from_grid=True, ppo=(("ensemble_size", 2),)),
    )
    return Settings(arms=arms, bon_ns=(1, 2), kl_samples=1)


def without_coverage(env: dict) -> dict:
    """`env` without the coverage tool's variables: a process started with it is not measured by
    `--cov`. For a process killed at a crash point (its measurement would die with it), one under
    emulation, and the fresh processes that only repeat, under other settings, code the tier
    measures in its own processes (the coverage tracer doubles their time)."""
    return {k: v for k, v in env.items() if not k.startswith("COVERAGE_")}


def shared_root(tmp_path_factory) -> Path:
    """The test run's temporary root, shared by its xdist workers (pytest-xdist's recipe: each
    worker's basetemp lies in it); without xdist, the session's own basetemp."""
    base = tmp_path_factory.getbasetemp()
    return base if os.environ.get("PYTEST_XDIST_WORKER") is None else base.parent


@pytest.fixture(scope="session")
def small_run(tmp_path_factory, small_profile_file):
    """The small-budget lab on r001, as `rlhf lab --profile <small profile>` runs it: every stage,
    the interrupt/resume protocol's legs included. Built once per test run, across xdist workers
    (`shared_lab`); `ctx.stage_seconds` holds its timings. Read it; a test that writes into a run
    folder copies it first (shutil.copytree to its tmp_path).

    Used by the crash test (the uninterrupted reference), the verl export, the resume, non-finite
    and held-out recomputation modules."""
    from rlhf.config import load_profile

    return shared_lab(tmp_path_factory, "small_run", load_profile(str(small_profile_file)), "r001", protocol=True)


def shared_lab(tmp_path_factory, name: str, profile, revision: str, protocol: bool, once: tuple[str, ...] = ()):
    """The whole lab (`_run_whole_lab`) run once per test run, whatever the number of xdist
    workers (pytest-xdist's recipe: the first worker runs it under a file lock in the workers'
    shared temporary root; the others wait, then open the finished run). Returns the run's
    Context with `stage_seconds`."""
    from filelock import FileLock

    from rlhf import lab

    folder = shared_root(tmp_path_factory) / f"shared-{name}"
    folder.mkdir(exist_ok=True)
    run, seconds = folder / "run", folder / "stage_seconds.json"
    with FileLock(str(folder / "build.lock")):
        if not seconds.is_file():
            ctx = _run_whole_lab(run, revision, protocol, profile, once)
            seconds.write_text(json.dumps(ctx.stage_seconds))
            return ctx
    from rlhf.config import load_profile

    # Read-only: another worker may be using the run (nothing swept, prepared or written).
    ctx = lab.read_context(run, profile if not isinstance(profile, str) else load_profile(profile), revision)
    ctx.stage_seconds = json.loads(seconds.read_text())
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


# ------------------------------------------------------------------------- TensorBoard read-back
# The series a run's event files must hold, written out by hand from its JSON (not through
# rlhf.events): tests_unit/test_events.py (a lab) and tests_heldout/test_frontier.py (a study).

PPO_PHASES = ("generation", "reference", "judge", "critic_values", "actor_update", "critic_update", "iteration")


def read_series(folder) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} in the order TensorBoard reads them, purges applied."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def read_texts(folder) -> dict[str, list[tuple[int, str]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    acc.Reload()
    return {
        tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]
        for tag in acc.Tags()["tensors"]
    }


def epoch_stage_expected(history: dict) -> dict[str, dict[int, float]]:
    """SFT or the judge: per update at its step; per epoch at the step of the epoch's last update."""
    exp: dict[str, dict[int, float]] = defaultdict(dict)
    last_step = {}
    for u in history["updates"]:
        s = u["step"]
        exp["train/loss"][s] = u["loss"]
        exp["train/learning_rate"][s] = u["lr"]
        exp["train/grad_norm"][s] = u["grad_norm"]
        if "accuracy" in u:
            exp["train/accuracy"][s] = u["accuracy"]
        if "tokens" in u:
            exp["train/num_tokens"][s] = u["tokens"]
        last_step[u["epoch"]] = s
    for e in history["epochs"]:
        s = last_step[e["epoch"]]
        exp["train/epoch_loss"][s] = e["train_loss"]
        exp["eval/loss"][s] = e["validation_loss"]
        if "validation_accuracy" in e:
            exp["train/epoch_accuracy"][s] = e["train_accuracy"]
            exp["eval/accuracy"][s] = e["validation_accuracy"]
    return exp


def rollout_rewards(logp_old, logp_ref, score, mask, truncated, *, kl_coef: float, truncation_penalty: float):
    """The rewards as a rollout makes them (rlhf.ppo.rollout): the per-token penalty
    (rlhf.ppo_math.log_ratio_penalty), then the score and truncation penalty once at the end
    (rlhf.ppo_math.token_rewards). [B, T]"""
    from rlhf.ppo_math import log_ratio_penalty, token_rewards

    penalty = log_ratio_penalty(logp_old, logp_ref, mask, kl_coef)
    return token_rewards(penalty, score, mask, truncated, truncation_penalty=truncation_penalty)


def ppo_expected(history: dict, kl_coef: float, truncation_penalty: float) -> dict[str, dict[int, float]]:
    """PPO per iteration, recomputed from the record's raw lists where it keeps them."""
    exp: dict[str, dict[int, float]] = defaultdict(dict)
    for r in history["iterations"]:
        i, n = r["iteration"] + 1, len(r["scores"])  # iteration k (from 1) at step k
        paid = r.get("paid_scores", r["scores"])
        kl = r["mean_sequence_log_ratio"]
        mean_score = sum(r["scores"]) / n
        exp["objective/scores"][i] = mean_score
        exp["objective/paid_scores"][i] = sum(paid) / n
        exp["objective/scores_std"][i] = (sum((x - mean_score) ** 2 for x in r["scores"]) / n) ** 0.5
        exp["objective/sampled_log_ratio"][i] = kl
        exp["objective/sampled_log_ratio_per_token"][i] = r["mean_sampled_log_ratio"]
        exp["objective/log_ratio_penalty_per_token"][i] = r["mean_kl_penalty"]
        exp["objective/non_score_reward"][i] = -kl_coef * kl
        # each answer's sum_t r_t (SPEC section 6), averaged: paid score, truncation penalty, -beta * log-ratio
        exp["objective/rlhf_reward"][i] = (sum(paid) + truncation_penalty * r["truncations"]) / n - kl_coef * kl
        exp["policy/entropy_avg"][i] = r["entropy"]
        for tag, key in (
            ("policy/approxkl_avg", "update_shift"),
            ("policy/clipfrac_avg", "clip_fraction"),
            ("loss/policy_avg", "policy_loss"),
            ("critic/vf_loss", "value_loss"),
            ("actor/grad_norm", "actor_grad_norm"),
            ("critic/grad_norm", "critic_grad_norm"),
        ):
            exp[tag][i] = sum(r[key]) / len(r[key])
        exp["critic/values/mean"][i] = r["mean_value"]
        exp["critic/advantages/mean"][i] = r["mean_advantage"]
        exp["critic/returns/mean"][i] = r["mean_return"]
        exp["response_length/mean"][i] = r["response_length"]
        exp["response_length/clip_ratio"][i] = r["truncations"] / n
        exp["val/num_eos_tokens"][i] = n - r["truncations"]
        exp["actor/lr"][i] = r["actor_lr"][-1]
        exp["critic/lr"][i] = r["critic_lr"][-1]
    from rlhf import signals  # the signals' own formulas are recomputed in tests_unit/test_signals.py

    rules_window = signals.frozen_rules()[1]
    for name, values in signals.signal_series(history, rules_window).items():
        for i, v in enumerate(values):
            if v is not None:
                exp[f"signals/{name}"][i + 1] = v
    for f in history.get("refreshes", []):
        s = f["after_iteration"]
        exp["judge_refresh/new_pairs"][s] = f["new_pairs"]
        exp["judge_refresh/pairs_so_far"][s] = f["pairs_so_far"]
        for key in ("accuracy_before", "accuracy_after"):
            if f[key] is not None:
                exp[f"judge_refresh/{key}"][s] = f[key]
    return exp


def evaluation_expected(results: dict, ppo_iterations: int) -> dict[str, dict[int, float]]:
    from rlhf import rubric

    exp: dict[str, dict[int, float]] = defaultdict(dict)
    for policy, step in (("sft", 0), ("ppo", ppo_iterations)):
        for pop, m in results["policies"][policy]["metrics"].items():
            n = m["n_rows"]
            exp[f"eval/{pop}/rubric_success"][step] = m["rubric_success"]
            exp[f"eval/{pop}/uncertified_rate"][step] = m["uncertified"] / n
            exp[f"eval/{pop}/truncation_rate"][step] = m["without_eos"] / n
            for reason in rubric.FINISH_REASONS:
                exp[f"eval/{pop}/finish_{reason}_rate"][step] = m["finish_reasons"][reason] / n
            exp[f"eval/{pop}/learned_reward"][step] = m["mean_learned_reward"]
            exp[f"eval/{pop}/response_length"][step] = m["mean_length"]
    return exp


# Summed by PPO from the rollout's float32 penalty tensor (rlhf.ppo.reward_sums), not read from a
# JSON: equal to the history's hand formula up to the float32 rounding of each token's penalty, a few
# 1e-10 on a sum of small log-ratios of both signs (so a relative 1e-6 of a 1e-4 value can fail).
# The absolute tolerance still fails a missing or doubled penalty wherever it is over 1e-8 (most steps).
ABSOLUTE = {"objective/non_score_reward": 1e-8}


def assert_series_equal(got: dict, exp: dict, where: str) -> int:
    """Same tags; per tag the same steps, each once, in order; each value the JSON's as float32
    (ABSOLUTE: to its absolute tolerance)."""
    assert sorted(got) == sorted(exp), f"{where}: tags differ: {sorted(set(got) ^ set(exp))}"
    n = 0
    for tag, points in got.items():
        steps = [s for s, _ in points]
        assert steps == sorted(exp[tag]), f"{where} {tag}: steps {steps} != {sorted(exp[tag])}"
        for step, value in points:
            want = float(struct.unpack("f", struct.pack("f", exp[tag][step]))[0])  # as TensorBoard stores it
            tolerance = ABSOLUTE.get(tag, 1e-12)
            assert value == pytest.approx(want, rel=1e-6, abs=tolerance), (
                f"{where} {tag} step {step}: {value} != {want}"
            )
            n += 1
    return n
