"""scripts/gpu_check.sh: what can be checked without a GPU.

The script is valid bash, runs the gpu tier with random weights in one process under a
timeout inside 10 minutes, copies the tier's reports, and stops at once with a message saying
why (exit 2), before running anything, on a machine without CUDA and on a python whose
transformers, tokenizers or safetensors differ from pyproject.toml's pins (the GPU machine's own
transformers 5.17 fails at the lab's first cached generation step; scripts/gpu_wheels.sh fetches
the pinned wheels to carry).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def run_in_copy(tmp_path: Path, pyproject: str):
    """Run the script in a copy of the checkout holding only it and `pyproject` (no carried
    .whl/ of this checkout, whose wheels are for the GPU machine's Python): (process, OUTDIR)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts" / "gpu_check.sh")
    (tmp_path / "pyproject.toml").write_text(pyproject)
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "gpu_check.sh"), str(out)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )
    return proc, out


def test_script_is_valid_bash_and_runs_the_smoke_part_first_within_one_deadline():
    for script in (SCRIPT, ROOT / "scripts" / "gpu_wheels.sh"):
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0, script
    text = SCRIPT.read_text()
    run_line = next(line for line in text.splitlines() if "-m pytest" in line and not line.startswith("#"))
    assert re.search(r'timeout "\$left" "\$PY" -m pytest -m gpu --random-weights -n 0 -s\b', run_line), run_line
    limit = int(re.search(r"GPU_CHECK_TIMEOUT:-(\d+)", text).group(1))
    assert limit <= 570  # every part within one deadline, the build and the copies within 10 minutes
    parts = re.findall(r"^run_part (\S+) (\S+)$", text, flags=re.M)
    assert parts == [
        ("smoke", "tests_gpu/test_gpu_smoke.py"),
        ("real", "tests_gpu/test_qwen_pipeline.py"),
        ("determinism", "tests_gpu/test_gpu_determinism_cost.py"),
    ]
    assert all((ROOT / path).is_file() for _, path in parts)  # only tests_gpu/ is collected, part by part
    assert '--gpu-out "$OUTDIR"' in text  # the numbers land in OUTDIR as each stage finishes
    assert 'cp "reports/gpu-$1/junit.xml"' in text  # each part's own reports folder


def test_without_an_outdir_it_says_how_to_call_it():
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode != 0 and "usage: scripts/gpu_check.sh OUTDIR" in proc.stderr


def test_without_cuda_it_stops_before_running_anything(tmp_path):
    """Catches a script that would run (and 'pass') the tier on a machine without CUDA."""
    import torch

    if torch.cuda.is_available():
        # Deliberate: the refusal exists only where torch sees no CUDA device. CI machines have none,
        # so in CI this test always runs; on a GPU machine the gpu tier runs the script for real.
        pytest.skip("this machine has CUDA: the refusal cannot be shown here")
    proc, out = run_in_copy(tmp_path, (ROOT / "pyproject.toml").read_text())
    assert proc.returncode == 2, proc.stderr
    assert "sees no CUDA device" in proc.stderr
    assert list(out.iterdir()) == []  # no log, no reports: nothing ran


def test_other_library_versions_are_named_and_nothing_runs(tmp_path):
    """Catches a script that would run the tier on the GPU machine's own transformers (5.17,
    whose generation API the lab does not use) instead of the pinned one: a checkout whose
    pyproject pins another transformers than this python has is refused, naming both versions
    and the way out, before the CUDA check and before anything runs."""
    import importlib.metadata as md

    have = {name: md.version(name) for name in ("transformers", "tokenizers", "safetensors")}
    pins = {**have, "transformers": "5.17.0"}
    deps = ", ".join(f'"{name}=={version}"' for name, version in pins.items())
    proc, out = run_in_copy(tmp_path, f'[project]\nname = "x"\ndependencies = [{deps}]\n')
    assert proc.returncode == 2, proc.stderr
    assert f"transformers {have['transformers']} (the lab pins 5.17.0)" in proc.stderr
    assert "tokenizers" not in proc.stderr.split("Carry")[0]  # only what differs is named
    assert "bash scripts/gpu_wheels.sh" in proc.stderr
    assert "CUDA" not in proc.stderr and list(out.iterdir()) == []
