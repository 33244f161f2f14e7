"""The test wiring itself: tiers are enforced, layers are added, reports are written, and CI
runs exactly the README's test command."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def run_pytest(tmp_path, test_source: str, *args):
    """Run pytest with the project's conftest.py and pytest.ini on one throw-away test file."""
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    ini = (ROOT / "pytest.ini").read_text().replace("-n 2 --dist loadgroup", "")
    (tmp_path / "pytest.ini").write_text(ini)
    (tmp_path / "tests_property").mkdir(exist_ok=True)
    (tmp_path / "tests_property" / "test_x.py").write_text(test_source)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "--reports-dir=" + str(tmp_path / "rep"), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_a_test_without_a_tier_is_refused(tmp_path):
    out = run_pytest(tmp_path, "def test_no_tier():\n    assert 1 + 1 == 2\n")
    assert out.returncode != 0
    assert "exactly one run tier" in out.stdout + out.stderr and "test_no_tier" in out.stdout + out.stderr


def test_a_test_with_two_tiers_is_refused(tmp_path):
    src = "import pytest\n@pytest.mark.unit\n@pytest.mark.gpu\ndef test_two():\n    assert 2 > 1\n"
    out = run_pytest(tmp_path, src)
    assert out.returncode != 0 and "test_two" in out.stdout + out.stderr


def test_layer_marker_from_folder_and_reports_written(tmp_path):
    src = ("import pytest\npytestmark = pytest.mark.unit\n"
           "def test_recorded(record_result):\n    record_result('answer', 42)\n    assert 6 * 7 == 42\n")
    out = run_pytest(tmp_path, src, "-m", "unit and property")
    assert out.returncode == 0, out.stdout + out.stderr
    results = json.loads((tmp_path / "rep" / "results.json").read_text())
    (test,) = results["tests"].values()
    assert test["outcome"] == "passed" and test["results"] == {"answer": 42}
    assert (tmp_path / "rep" / "junit.xml").read_text().count("testcase") >= 1
    none = run_pytest(tmp_path, src, "-m", "unit and not property")
    assert none.returncode == 5  # the layer marker was added, so nothing else is selected


def test_ci_runs_the_readme_test_command_verbatim():
    lines = [l for l in (ROOT / "README.md").read_text().splitlines()]
    start = lines.index("```bash")
    first, second = lines[start + 1], lines[start + 2]
    assert "rlhf lab" in first and "pytest -m unit" in second
    assert second in (ROOT / ".ci" / "run").read_text().splitlines()


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
    src = ("import os, pytest\npytestmark = pytest.mark.unit\n"
           "@pytest.fixture\ndef lab_run():\n    return os.environ.get('PYTEST_XDIST_WORKER', 'none')\n"
           f"def _mark(kind, worker, i):\n    open(os.path.join({str(seen)!r}, f'{{kind}}-{{i}}-{{worker}}'), 'w').close()\n")
    src += "".join(f"def test_lab_{i}(lab_run):\n    _mark('lab', lab_run, {i})\n" for i in range(6))
    src += "".join(f"def test_other_{i}():\n    import time; time.sleep(0.2)\n"
                   f"    _mark('other', os.environ.get('PYTEST_XDIST_WORKER', 'none'), {i})\n" for i in range(6))
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    shutil.copy(ROOT / "pytest.ini", tmp_path / "pytest.ini")  # with its -n 2 --dist loadgroup
    (tmp_path / "tests_unit").mkdir()
    (tmp_path / "tests_unit" / "test_x.py").write_text(src)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--reports-dir=" + str(tmp_path / "rep"), "tests_unit"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    marks = [p.name.split("-") for p in seen.iterdir()]
    lab_workers = {w for kind, _, w in marks if kind == "lab"}
    assert len([m for m in marks if m[0] == "lab"]) == 6
    assert len(lab_workers) == 1 and lab_workers != {"none"}, f"lab tests ran on {sorted(lab_workers)}"
