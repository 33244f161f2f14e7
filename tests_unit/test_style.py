"""Style cannot regress: `ruff check` (lint: pyflakes, pycodestyle, import order) and
`ruff format --check` over the package, the tests and conftest.py, with the configuration in
pyproject.toml ([tool.ruff]). ruff is a pinned test extra, so `bash setup.sh` installs it."""

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
