"""The test wiring itself: tiers are enforced, layers are added, reports are written, and CI
runs exactly the README's test command."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.e2e]  # e2e: whole pytest sessions in subprocesses

ROOT = Path(__file__).resolve().parents[1]


def run_pytest(tmp_path, test_source: str, *args):
    """Run pytest with the project's conftest.py and pytest.ini on one throw-away test file."""
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    ini = (ROOT / "pytest.ini").read_text().replace("-n 2 --dist loadgroup", "")
    (tmp_path / "pytest.ini").write_text(ini)
    (tmp_path / "tests_property").mkdir(exist_ok=True)
    (tmp_path / "tests_property" / "test_x.py").write_text(test_source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--reports-dir=" + str(tmp_path / "rep"), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_test_without_a_tier_is_refused(tmp_path):
    out = run_pytest(tmp_path, "def test_no_tier():\n    assert 1 + 1 == 2\n")
    assert out.returncode != 0
    assert "exactly one run tier" in out.stdout + out.stderr and "test_no_tier" in out.stdout + out.stderr


def test_a_test_with_two_tiers_is_refused(tmp_path):
    src = "import pytest\n@pytest.mark.unit\n@pytest.mark.gpu\ndef test_two():\n    assert 2 > 1\n"
    out = run_pytest(tmp_path, src)
    assert out.returncode != 0 and "test_two" in out.stdout + out.stderr


def test_layer_marker_from_folder_and_reports_written(tmp_path):
    src = (
        "import pytest\npytestmark = pytest.mark.unit\n"
        "def test_recorded(record_result):\n    record_result('answer', 42)\n    assert 6 * 7 == 42\n"
    )
    out = run_pytest(tmp_path, src, "-m", "unit and property")
    assert out.returncode == 0, out.stdout + out.stderr
    results = json.loads((tmp_path / "rep" / "results.json").read_text())
    (test,) = results["tests"].values()
    assert test["outcome"] == "passed" and test["results"] == {"answer": 42}
    assert (tmp_path / "rep" / "junit.xml").read_text().count("testcase") >= 1
    none = run_pytest(tmp_path, src, "-m", "unit and not property")
    assert none.returncode == 5  # the layer marker was added, so nothing else is selected


SMOKE = ".venv/bin/python -m pytest --benchmark-smoke"


def test_ci_runs_the_readme_test_command_verbatim():
    lines = [l for l in (ROOT / "README.md").read_text().splitlines()]
    start = lines.index("```bash")
    first, second = lines[start + 1], lines[start + 2]
    assert "rlhf lab" in first and "pytest -m unit" in second
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert second in ci
    # and then every benchmark once, untimed (the README says so where it names the CI command)
    assert any(line.startswith(SMOKE) for line in ci[ci.index(second) + 1 :])
    assert "pytest --benchmark-smoke" in "\n".join(lines[start : start + 20])


@pytest.mark.parametrize("unit_rc,smoke_rc", [(0, 0), (1, 0), (0, 1), (2, 3)])
def test_ci_runs_both_and_fails_when_either_fails(tmp_path, unit_rc, smoke_rc):
    """.ci/run with stand-ins for setup.sh and the venv's python: the smoke run follows the unit
    tier even when that failed, and CI's exit is the first failure's (0 only when both pass)."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "setup.sh").write_text("exit 0\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    python = tmp_path / ".venv" / "bin" / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        'echo "$*" >> calls.log\n'
        f'case "$*" in *"-m unit"*) exit {unit_rc};; *--benchmark-smoke*) exit {smoke_rc};; esac\n'
        "exit 99\n"
    )
    python.chmod(0o755)
    out = subprocess.run(["bash", ".ci/run"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls == ["-m pytest -m unit --cov", "-m pytest --benchmark-smoke"], calls
    assert out.returncode == (unit_rc or smoke_rc), (out.returncode, out.stdout + out.stderr)


def test_setup_refuses_an_unknown_option(tmp_path):
    """A mistyped option (say `--test`) must not fall through to a partial set-up that looks done."""
    shutil.copy(ROOT / "setup.sh", tmp_path / "setup.sh")
    out = subprocess.run(["bash", "setup.sh", "--test"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown option --test" in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "setup.sh"]  # nothing created


def test_torch_is_pinned_to_the_local_cpu_wheel():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"torch==2.13.0"' in text
    assert "torch==2.13.0" in (ROOT / "setup.sh").read_text()


def test_tests_of_the_lab_run_share_one_xdist_worker(tmp_path):
    """conftest sends every test that uses `lab_run` to one xdist worker, so the lab runs once
    per session. Here a stand-in `lab_run` fixture (shadowing the real one) records the worker;
    with pytest 9.2.0 and pytest-xdist 3.8.0 the group was silently ignored."""
    seen = tmp_path / "workers"
    seen.mkdir()
    src = (
        "import os, pytest\npytestmark = pytest.mark.unit\n"
        "@pytest.fixture\ndef lab_run():\n    return os.environ.get('PYTEST_XDIST_WORKER', 'none')\n"
        "def _mark(kind, worker, i):\n"
        f"    open(os.path.join({str(seen)!r}, f'{{kind}}-{{i}}-{{worker}}'), 'w').close()\n"
    )
    src += "".join(f"def test_lab_{i}(lab_run):\n    _mark('lab', lab_run, {i})\n" for i in range(6))
    src += "".join(
        f"def test_other_{i}():\n    import time; time.sleep(0.2)\n"
        f"    _mark('other', os.environ.get('PYTEST_XDIST_WORKER', 'none'), {i})\n"
        for i in range(6)
    )
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    shutil.copy(ROOT / "pytest.ini", tmp_path / "pytest.ini")  # with its -n 2 --dist loadgroup
    (tmp_path / "tests_unit").mkdir()
    (tmp_path / "tests_unit" / "test_x.py").write_text(src)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--reports-dir=" + str(tmp_path / "rep"), "tests_unit"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    marks = [p.name.split("-") for p in seen.iterdir()]
    lab_workers = {w for kind, _, w in marks if kind == "lab"}
    assert len([m for m in marks if m[0] == "lab"]) == 6
    assert len(lab_workers) == 1 and lab_workers != {"none"}, f"lab tests ran on {sorted(lab_workers)}"
    # results.json's timeline: each test's worker (the one it ran on) and its start in the session
    timeline = json.loads((tmp_path / "rep" / "results.json").read_text())["tests"]
    ran_on = {kind + "-" + i: w for kind, i, w in marks}
    for nodeid, entry in timeline.items():
        kind, i = nodeid.rsplit("::test_", 1)[1].split("@")[0].split("_")
        assert entry["worker"] == ran_on[f"{kind}-{i}"], nodeid
        assert 0 < entry["started_s"] < 120, nodeid
    others = sorted(e["started_s"] for n, e in timeline.items() if "test_other_" in n and e["worker"] == "gw0")
    assert all(b - a >= 0.19 for a, b in zip(others, others[1:])), others  # each sleeps 0.2 s (times kept to 0.01 s)


def run_in_copy(tmp_path, files: dict, *args, keep_xdist=False):
    """pytest in a throw-away project with the project's conftest.py and pytest.ini, no --reports-dir."""
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    ini = (ROOT / "pytest.ini").read_text()
    (tmp_path / "pytest.ini").write_text(ini if keep_xdist else ini.replace("-n 2 --dist loadgroup", ""))
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    # As a user's shell would: not inside this suite's xdist worker (pytest-benchmark reads
    # PYTEST_XDIST_WORKER and turns itself off) and without a reports folder chosen.
    env = {
        k: v
        for k, v in __import__("os").environ.items()
        if k != "RLHF_REPORTS_DIR" and not k.startswith("PYTEST_XDIST")
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


# Stand-in test bodies: what is under test is where their outcomes and records land, so each
# body is one plain arithmetic assertion (and a record), not a check of the project.
UNIT_AND_GPU = {
    "tests_unit/test_x.py": "import pytest\n@pytest.mark.unit\ndef test_u(record_result):\n"
    "    record_result('u', 1)\n    assert 6 * 7 == 42\n"
    "@pytest.mark.gpu\ndef test_g():\n    assert 2 ** 3 == 8\n"
}


def test_each_tier_writes_its_own_reports_folder(tmp_path):
    """A `pytest -m gpu` run must not wipe the CI results of `pytest -m unit`."""
    out = run_in_copy(tmp_path, UNIT_AND_GPU, "-m", "unit")
    assert out.returncode == 0, out.stdout + out.stderr
    unit = json.loads((tmp_path / "reports" / "unit" / "results.json").read_text())
    assert list(unit["tests"]) == ["tests_unit/test_x.py::test_u"]
    out = run_in_copy(tmp_path, UNIT_AND_GPU, "-m", "gpu")
    assert out.returncode == 0, out.stdout + out.stderr
    gpu = json.loads((tmp_path / "reports" / "gpu" / "results.json").read_text())
    assert list(gpu["tests"]) == ["tests_unit/test_x.py::test_g"]
    assert json.loads((tmp_path / "reports" / "unit" / "results.json").read_text()) == unit  # untouched
    assert (tmp_path / "reports" / "unit" / "junit.xml").is_file() and (
        tmp_path / "reports" / "gpu" / "junit.xml"
    ).is_file()
    assert "reports: reports/gpu/junit.xml and reports/gpu/results.json" in out.stdout


def test_reports_carry_provenance(tmp_path):
    out = run_in_copy(tmp_path, UNIT_AND_GPU, "-m", "unit")
    assert out.returncode == 0, out.stdout + out.stderr
    prov = json.loads((tmp_path / "reports" / "unit" / "results.json").read_text())["provenance"]
    assert set(prov) == {
        "commit",
        "dirty",
        "packages",
        "python",
        "platform",
        "arithmetic",
        "cuda_device",
        "profiles_sha256",
        "command_line",
    }
    assert prov["packages"]["torch"] == "2.13.0+cpu" or prov["packages"]["torch"].startswith("2.13.0")
    assert prov["arithmetic"]["status"] == "pinned"
    assert set(prov["profiles_sha256"]) == {"embedded", "qwen2.5-0.5b"}
    assert prov["command_line"][-2:] == ["-m", "unit"]
    junit = (tmp_path / "reports" / "unit" / "junit.xml").read_text()
    for key in ("commit", "dirty", "packages", "arithmetic", "command_line"):
        assert f'<property name="{key}"' in junit


def test_pytest_dash_dash_benchmark_runs_the_benchmark_tier(tmp_path):
    """`pytest --benchmark`, literally as the design card writes it: the benchmark tier, one
    process even with -n 2 in addopts, pytest-benchmark's JSON written, its path printed."""
    files = {
        "tests_unit/test_b.py": "import pytest\n@pytest.mark.benchmark\ndef test_b(benchmark):\n"
        "    assert benchmark(sum, range(100)) == 4950\n"
        "@pytest.mark.unit\ndef test_u():\n    assert 6 * 7 == 42\n"
    }
    out = run_in_copy(tmp_path, files, "--benchmark", keep_xdist=True)
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads((tmp_path / "reports" / "benchmark" / "benchmark.json").read_text())
    assert [b["name"] for b in data["benchmarks"]] == ["test_b"]
    results = json.loads((tmp_path / "reports" / "benchmark" / "results.json").read_text())
    assert list(results["tests"]) == ["tests_unit/test_b.py::test_b"]  # -m benchmark: the unit test is not run
    assert "benchmark numbers: reports/benchmark/benchmark.json" in out.stdout
    assert "gw0" not in out.stdout  # no xdist worker


def test_pytest_benchmark_smoke_runs_each_benchmark_once_untimed(tmp_path):
    """`pytest --benchmark-smoke` (CI): the benchmark tier in one process, each benchmark function
    once (pytest-benchmark's --benchmark-disable: no warm-up, no rounds, no JSON), its reports in
    reports/benchmark-smoke/, and a measured run's reports/benchmark/ left as it was."""
    calls = tmp_path / "calls"
    files = {
        "tests_unit/test_b.py": "import pytest\n@pytest.mark.benchmark\ndef test_b(benchmark):\n"
        f"    def f():\n        open({str(calls)!r}, 'a').write('x')\n        return 6 * 7\n"
        "    assert benchmark.pedantic(f, rounds=5, warmup_rounds=2, iterations=1) == 42\n"
        "@pytest.mark.unit\ndef test_u():\n    assert 6 * 7 == 42\n"
    }
    (tmp_path / "reports" / "benchmark").mkdir(parents=True)
    (tmp_path / "reports" / "benchmark" / "results.json").write_text("measured")
    out = run_in_copy(tmp_path, files, "--benchmark-smoke", keep_xdist=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert calls.read_text() == "x"  # once
    results = json.loads((tmp_path / "reports" / "benchmark-smoke" / "results.json").read_text())
    assert list(results["tests"]) == ["tests_unit/test_b.py::test_b"]  # the unit test is not run
    assert not list(tmp_path.glob("reports/**/benchmark.json"))  # nothing timed, nothing written
    assert (tmp_path / "reports" / "benchmark" / "results.json").read_text() == "measured"
    assert "every benchmark ran once, untimed" in out.stdout
    assert "gw0" not in out.stdout  # no xdist worker
    both = run_in_copy(tmp_path, files, "--benchmark-smoke", "--benchmark")
    assert both.returncode != 0 and "give one of them" in both.stdout + both.stderr


COVERED_HERE = (
    "import subprocess, sys, torch\nimport pytest\nfrom rlhf import dpo_math\npytestmark = pytest.mark.unit\n"
    "def test_in_this_process():\n"
    "    assert float(dpo_math.dpo_loss(*(torch.zeros(2),) * 4, beta=0.1)) == pytest.approx(0.6931472)\n"
    "def test_in_a_process_it_starts():\n"
    "    code = 'import torch; from rlhf import grpo_math; print(grpo_math.group_advantages(torch.ones(4), 2))'\n"
    "    assert subprocess.run([sys.executable, '-c', code]).returncode == 0\n"
)


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize("with_cov", [True, False])
def test_cov_writes_the_coverage_map_of_the_workers_and_the_processes_they_start(tmp_path, monkeypatch, with_cov):
    """`--cov` (the unit tier's command): rlhf/'s lines and branches run by the xdist workers and
    by a Python process a test starts, combined, in coverage.json and coverage.md beside junit.xml,
    and one console line naming them; without --cov, neither file and no line."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")  # [tool.coverage.run]
    for key in [k for k in __import__("os").environ if k.startswith("COVERAGE_")]:
        monkeypatch.delenv(key)  # measured by its own --cov only, not by an outer run's
    args = ("-m", "unit", "--cov") if with_cov else ("-m", "unit")
    out = run_in_copy(tmp_path, {"tests_unit/test_x.py": COVERED_HERE}, *args, keep_xdist=with_cov)
    assert out.returncode == 0, out.stdout + out.stderr
    folder = tmp_path / "reports" / "unit"
    if not with_cov:
        assert not (folder / "coverage.json").exists() and "coverage:" not in out.stdout
        return
    files = json.loads((folder / "coverage.json").read_text())["files"]
    by_name = {Path(name).as_posix().split("rlhf/", 1)[-1]: f for name, f in files.items()}
    dpo, grpo = ROOT / "rlhf" / "dpo_math.py", ROOT / "rlhf" / "grpo_math.py"
    assert line_of(dpo, "return -F.logsigmoid(") in by_name["dpo_math.py"]["executed_lines"]
    assert line_of(grpo, "groups = rewards.view(") in by_name["grpo_math.py"]["executed_lines"]  # the subprocess
    assert line_of(grpo, "raise ValueError(") in by_name["grpo_math.py"]["missing_lines"]
    assert by_name["grpo_math.py"]["summary"]["num_branches"] > 0  # branch coverage
    assert "rlhf/dpo\\_math.py" in (folder / "coverage.md").read_text()
    assert out.stdout.count("coverage: reports/unit/coverage.json and reports/unit/coverage.md (") == 1
