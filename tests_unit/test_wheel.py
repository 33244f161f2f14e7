"""The package as a stranger installs it: the wheel built from this checkout, installed (not
editable) into a fresh virtual environment, and used from a folder outside the source tree.

`setup.sh` installs the checkout editable, so nothing else in the suite would see a module or a
data file the wheel leaves out. One build serves every test here (module fixture): the wheel's
file list against the tracked files, then the installed `rlhf` answering --help, --version, every
subcommand's --help, importing every module, scoring the frozen warning rules as the checkout
does, and running the miniature lab (`rlhf lab --dry-run`).

The fresh environment gets the dependencies (torch, transformers, ...) by a path file naming
this interpreter's site-packages, whose own path files (the editable install's) are not run:
only the wheel can provide `rlhf` there, and the test checks it does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.unit, pytest.mark.e2e]  # builds a wheel and starts fresh processes


def run(args, cwd, env=None, timeout=600) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel path, the fresh environment's python, an environment for its processes, a folder
    outside the source tree)."""
    base = tmp_path_factory.mktemp("wheel")
    dist, venv, outside = base / "dist", base / "venv", base / "outside"
    outside.mkdir()
    # Built from a copy of the files git sees: a build/ folder left in the checkout by an earlier
    # build would carry files the configuration no longer ships into the wheel.
    source = base / "source"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    )  # fmt: skip
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(dist), "."],
        cwd=source,
    )
    (wheel,) = dist.glob("rlhf-*.whl")
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=outside)
    python = venv / "bin" / "python"
    purelib = Path(
        run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], outside).stdout.strip()
    )
    (purelib / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        outside,
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return wheel, python, env, outside


def tracked_package_files() -> set[str]:
    listed = subprocess.run(["git", "ls-files", "rlhf"], cwd=ROOT, capture_output=True, text=True, check=True)
    return {f for f in listed.stdout.split() if (ROOT / f).is_file()}


def test_the_wheel_holds_every_tracked_file_of_the_package(installed):
    wheel = installed[0]
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(tracked_package_files() - names)
    assert not missing, f"the wheel leaves out {missing}"
    assert not [n for n in names if n.startswith("rlhf/") and n.endswith(".pyc")]


def test_the_installed_rlhf_answers_from_outside_the_tree(installed):
    _, python, env, outside = installed
    assert run(["rlhf", "--help"], outside, env).stdout.startswith("usage: rlhf")
    version = run(["rlhf", "--version"], outside, env).stdout.split()
    from rlhf import __version__

    assert version == ["rlhf", __version__]
    assert run(["rlhf"], outside, env).stdout.startswith("usage: rlhf")  # bare: the help
    # every module imports from the installed copy, and every subcommand's --help answers
    script = """
import importlib, json, pkgutil, sys
import rlhf
from rlhf import cli
names = [m.name for m in pkgutil.walk_packages(rlhf.__path__, "rlhf.")]
for n in names:
    if n.endswith(".__main__"):  # the command itself (python -m rlhf, python -m rlhf.cli), run below
        continue
    importlib.import_module(n)
parser = cli.build_parser()
sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
helped = []
for name in sub.choices:
    try:
        cli.main([name, "--help"])
    except SystemExit as e:
        assert e.code == 0, (name, e.code)
    helped.append(name)
print(json.dumps({"file": rlhf.__file__, "modules": names, "helped": helped}))
"""
    out = json.loads(run([str(python), "-c", script], outside, env).stdout.strip().splitlines()[-1])
    assert Path(out["file"]).resolve().is_relative_to(python.parent.parent.resolve()), out["file"]
    expected = {
        "rlhf." + ".".join(p.relative_to(ROOT / "rlhf").with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "rlhf").rglob("*.py")
        if "verl_handoff" not in p.parts and p.name != "__main__.py"
    } - {"rlhf."}
    assert expected <= set(out["modules"]) | {"rlhf.__init__"}, sorted(expected - set(out["modules"]))
    assert len(out["helped"]) >= 20


def test_the_installed_warning_rules_fire_as_the_checkout_s(installed, tmp_path):
    """A PPO history whose KL grows and whose answers run to the limit: the frozen rules loaded
    from the installed package fire on it at the iterations the checkout's fire at."""
    from rlhf import signals

    _, python, env, outside = installed
    iterations = [
        {
            "iteration": i,
            "scores": [0.1 * i + 0.01 * k for k in range(4)],
            "mean_sequence_log_ratio": 0.02 * i * i,
            "entropy": 2.0 - 0.05 * i,
            "truncations": min(4, i // 5),
            "response_length": 20.0 + 2 * i,
            "clip_fraction": [0.01 * i, 0.0],
            "update_shift": [0.001 * i, 0.0],
            "advantage_quantiles": [q * (1 + 0.1 * i) for q in range(-5, 6)],
        }
        for i in range(40)
    ]
    history = {"iterations": iterations, "refreshes": []}
    path = tmp_path / "history.json"
    path.write_text(json.dumps(history))
    rules, window = signals.frozen_rules()
    here = signals.firings(history, rules, window)
    assert here, "the history fires no frozen rule: it tests nothing"
    script = (
        "import json, sys; from rlhf import signals; rules, w = signals.frozen_rules(); "
        "print(json.dumps(signals.firings(json.load(open(sys.argv[1])), rules, w)))"
    )
    there = json.loads(run([str(python), "-c", script, str(path)], outside, env).stdout)
    assert there == here


def test_the_installed_miniature_lab_runs_every_stage(installed):
    _, _, env, outside = installed
    out = run(["rlhf", "lab", "--dry-run"], outside, env, timeout=900).stdout
    assert "every stage ran, the interrupt/resume protocol held" in out
