"""Style cannot regress: `ruff check` (lint: pyflakes, pycodestyle, import order) and
`ruff format --check` over the package, the tests and conftest.py, with the configuration in
pyproject.toml ([tool.ruff]); and `mypy` over the package (basic mode, [tool.mypy]), so that a
hint which no longer matches its code fails here. ruff and mypy are pinned test extras, so
`bash setup.sh` installs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
TREES = [
    "rlhf",
    "tests_unit",
    "tests_property",
    "tests_reproducibility",
    "tests_heldout",
    "tests_gpu",
    "tests_verl",
    "conftest.py",
]


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_ruff_lint_is_clean():
    out = ruff("check", "--no-cache", *TREES)
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format_is_clean():
    out = ruff("format", "--check", "--no-cache", *TREES)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_style_checks_can_fail(tmp_path):
    """The same configuration on a file with an unused import, unsorted imports and a badly
    formatted line: both checks must refuse it."""
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport os\nx = {'a':1}\n")
    config = str(ROOT / "pyproject.toml")
    lint = ruff("check", "--no-cache", "--config", config, str(bad), cwd=tmp_path)
    assert lint.returncode == 1 and "F401" in lint.stdout and "I001" in lint.stdout, lint.stdout
    fmt = ruff("format", "--check", "--no-cache", "--config", config, str(bad), cwd=tmp_path)
    assert fmt.returncode == 1 and "bad.py" in fmt.stdout + fmt.stderr, fmt.stdout + fmt.stderr


def mypy(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    # The cache makes a rerun take seconds; the first run over rlhf/ takes a minute or two.
    cache = str(ROOT / ".mypy_cache")
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", cache, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_mypy_type_check_is_clean():
    out = mypy("rlhf")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_type_check_can_fail(tmp_path):
    """The same configuration on a file that passes a string where an int is declared."""
    bad = tmp_path / "bad.py"
    bad.write_text('def double(n: int) -> int:\n    return 2 * n\n\n\ndouble("2")\n')
    out = mypy("--config-file", str(ROOT / "pyproject.toml"), str(bad), cwd=tmp_path)
    assert out.returncode == 1 and "[arg-type]" in out.stdout, out.stdout + out.stderr
