"""The arithmetic fingerprint (rlhf.arithmetic, `rlhf arithmetic`): it is stable, it moves when the
pin is broken, it names the first operation where two machines part, and a CPU of the other
vendor computes the lab's arithmetic bit for bit alike.

The other vendor is an emulated one: `qemu-x86_64 -cpu MODEL` (Debian's qemu-user, installed by
`bash setup.sh --tests`) runs this Python on a virtual Intel CPU where the machine is an AMD one, and on a
virtual AMD CPU where it is an Intel one. The emulator computes every IEEE operation exactly as
the hardware does; what it cannot copy is a processor's approximate instructions (reciprocal and
reciprocal square root estimates), whose low bits each vendor defines for itself. So the test
fails for both kinds of CPU dependence: a library that picks its kernels by vendor, and an
operation built on approximate instructions. The control shows it can see the second kind: MKL's
vector square root (which the lab does not use) differs there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import without_coverage
from rlhf import arithmetic, runtime
from rlhf.io import read_json

pytestmark = [pytest.mark.unit, pytest.mark.e2e]  # e2e: `rlhf arithmetic` in subprocesses, under qemu

X86 = runtime.describe()["machine"] in ("x86_64", "amd64")
GOLDEN = Path(__file__).parents[1] / "tests_reproducibility" / "golden_embedded.json"


@pytest.fixture(scope="module")
def here():
    return arithmetic.measure()


def fingerprint_in_subprocess(tmp_path, name, *prefix, **env) -> tuple[dict, subprocess.CompletedProcess]:
    out = tmp_path / f"{name}.json"
    clean = {k: v for k, v in os.environ.items() if k not in runtime.PIN and k != runtime.SWITCH}
    if prefix:  # under emulation: not measured by --cov (its code is this process's own `here`, measured)
        clean = without_coverage(clean)
    clean.update(env)
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "rlhf", "arithmetic", "--out", str(out)],
        capture_output=True,
        text=True,
        env=clean,
        timeout=900,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return arithmetic.load(out), done


def test_the_fingerprint_is_the_same_on_every_measurement(here):
    again = arithmetic.measure()
    assert again["class"] == here["class"]
    assert arithmetic.differences(again, here) == []
    assert len(here["ops"]) > 60 and len(here["model"]) > 60


def test_measuring_leaves_the_callers_rng_and_threads_alone():
    import torch

    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    threads = torch.get_num_threads()
    arithmetic.measure()
    assert torch.equal(torch.rand(3), expected), "the fingerprint moved the caller's random stream"
    assert torch.get_num_threads() == threads


@pytest.mark.skipif(not X86, reason="the AVX2/MKL pin exists on x86-64 only")
def test_the_fingerprint_moves_when_the_pin_is_broken(tmp_path, here):
    """Unpinned with torch's default (widest) kernels: most entries move, the class changes, and
    the command says the golden numbers do not apply (exit status 1)."""
    broken, done = fingerprint_in_subprocess(tmp_path, "broken", RLHF_CPU_PIN="off", ATEN_CPU_CAPABILITY="default")
    diff = arithmetic.differences(broken, here)
    assert broken["class"] != here["class"]
    assert len(diff) > 40, diff
    assert done.returncode == 1
    assert "the golden numbers do not apply here" in done.stdout and "turned off with RLHF_CPU_PIN" in done.stdout


def test_the_verdict_names_the_first_differing_operation(here):
    known = {"cpu-a": here}
    assert arithmetic.verdict(here, known)["verified"] == "cpu-a"
    assert "the golden numbers apply on this machine" in arithmetic.verdict(here, known)["line"]
    other = json.loads(json.dumps(here))
    other["ops"] = [list(e) for e in other["ops"]]
    index = next(i for i, (name, _) in enumerate(other["ops"]) if name == "adamw.step1")
    other["ops"][index][1] = "0" * 16
    other["model"][-1][1] = "1" * 16
    other["class"] = arithmetic.class_of(other)
    v = arithmetic.verdict(here, {"cpu-b": other})
    assert v["verified"] is None and v["first_difference"] == {"cpu-b": "ops.adamw.step1"}
    assert "not verified on this machine's arithmetic class" in v["line"] and "cpu-b from ops.adamw.step1" in v["line"]
    assert arithmetic.differences(here, other) == ["ops.adamw.step1", f"model.{here['model'][-1][0]}"]


def test_the_committed_fingerprints_are_the_golden_files_classes():
    """Every verified CPU has its fingerprint in rlhf/fingerprints/, and each file is named in
    the golden file with its class and CPU: the two cannot drift apart."""
    golden = read_json(GOLDEN)
    known = arithmetic.verified()
    assert known, "no verified fingerprint is committed"
    entries = {e["fingerprint"]: e for e in golden["verified_on"]}
    assert sorted(entries) == sorted(known), "verified_on and rlhf/fingerprints/ name different CPUs"
    for name, fp in known.items():
        assert entries[name]["class"] == fp["class"], f"{name}: verified_on says class {entries[name]['class']}"
        assert fp["env"]["family_model"] in entries[name]["cpu"], f"{name}: verified_on names another CPU"
    for name, fp in known.items():
        assert fp["class"] == arithmetic.class_of(fp), f"{name}: its class is not the hash of its entries"
        assert fp["env"]["arithmetic"]["comparable"], f"{name} was measured unpinned"


def test_rlhf_lab_says_whether_the_golden_numbers_apply(here, embedded_profile):
    from rlhf.config import load_profile

    line = arithmetic.golden_line(embedded_profile)
    assert line.startswith("golden numbers: ")
    assert arithmetic.verdict(here)["line"] in line
    qwen = arithmetic.golden_line(load_profile("qwen2.5-0.5b"))
    assert "none for profile qwen2.5-0.5b" in qwen and "embedded FP32 profile only" in qwen


def test_the_command_prints_every_verified_class_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "mine.json"
    out.write_text("{}")
    done = subprocess.run(
        [sys.executable, "-m", "rlhf", "arithmetic", "--out", str(out)], capture_output=True, text=True
    )
    assert done.returncode == 2 and "exists" in done.stderr, done.stderr
    assert out.read_text() == "{}"
    done = subprocess.run([sys.executable, "-m", "rlhf", "arithmetic"], capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    for name, fp in arithmetic.verified().items():
        assert f"verified class {fp['class']} ({name}:" in done.stdout


def other_vendor_model() -> tuple[str, bool]:
    """The emulated CPU of the other vendor: (qemu model, whether MKL must take it for Intel)."""
    if runtime.mkl_sees_intel():
        return "EPYC-Rome", False
    return "Haswell-v4", True


@pytest.mark.skipif(not X86, reason="the AVX2/MKL pin exists on x86-64 only")
def test_a_cpu_of_the_other_vendor_computes_the_same_class(tmp_path, here, record_result):
    """The lab's arithmetic on an emulated CPU of the other vendor is this machine's, entry for
    entry; the control (MKL's vector square root) shows the emulated CPU does compute differently
    where an operation leans on approximate instructions. About 3 minutes (the emulator runs the
    fingerprint some 50 times slower than the CPU itself: its primitive ops about 2 minutes)."""
    qemu = shutil.which("qemu-x86_64")
    assert qemu, "qemu-x86_64 is missing: bash setup.sh --tests installs Debian's qemu-user (apt-get install qemu-user)"
    model, intel = other_vendor_model()
    emulated, _ = fingerprint_in_subprocess(tmp_path, model, qemu, "-cpu", model)
    record_result("emulated_cpu", {"model": model, "class": emulated["class"], "here": here["class"]})
    assert emulated["env"]["mkl_sees_intel"] is intel, "the emulator did not present the other vendor to MKL"
    assert emulated["env"]["arithmetic"]["comparable"], emulated["env"]["arithmetic"]["note"]
    assert arithmetic.differences(emulated, here) == [], f"{model} parts from this CPU"
    assert emulated["class"] == here["class"]
    # Control: an operation on approximate instructions does differ there, so equality above is
    # a measurement, not an emulator that copies the host.
    assert emulated["probes"]["sqrt.vector_math"] != here["probes"]["sqrt.vector_math"]
    assert emulated["probes"]["adamw.single_tensor"] != here["probes"]["adamw.single_tensor"]
    assert emulated["probes"]["sqrt.ieee"] == here["probes"]["sqrt.ieee"]


def test_the_verdict_reads_the_compared_entries_only_and_names_what_parts(here):
    """What the class is made of decides the verdict: where the fingerprint was measured (env),
    the probes and the BF16 section never part a class; one bit of one compared entry does, named;
    a fingerprint holding other entries than a verified one is named as such, not as a blank."""
    same = json.loads(json.dumps(here))
    same["env"]["family_model"], same["env"]["vendor"] = "25/1", "AuthenticAMD"
    same["probes"] = {k: "f" * 16 for k in same["probes"]}
    same["bf16"] = [[name, "e" * 16] for name, _ in same["bf16"]]
    assert arithmetic.class_of(same) == here["class"]
    assert arithmetic.verdict(same, {"cpu-a": here})["verified"] == "cpu-a"

    name, value = here["model"][5]
    flipped = json.loads(json.dumps(here))
    flipped["model"][5] = [name, value[:-1] + ("0" if value[-1] != "0" else "1")]  # one hex digit
    flipped["class"] = arithmetic.class_of(flipped)
    v = arithmetic.verdict(flipped, {"cpu-a": here})
    assert v["verified"] is None and v["first_difference"] == {"cpu-a": f"model.{name}"}
    assert f"cpu-a from model.{name}" in v["line"]

    older = json.loads(json.dumps(here))
    dropped = older["ops"].pop()[0]
    older["class"] = arithmetic.class_of(older)
    v = arithmetic.verdict(here, {"cpu-old": older})
    assert v["verified"] is None and v["first_difference"] == {"cpu-old": None}
    assert f"cpu-old in which entries it holds (ops.{dropped} only here)" in v["line"]


def test_the_golden_comparison_fails_on_a_verified_class_and_skips_naming_the_difference_on_another(
    small_run, here, request, tmp_path, monkeypatch
):
    """The golden test's decision, on a lab whose numbers are not the golden ones (the small
    budget): on a verified class it fails naming the values; on an unverified class it skips,
    naming where the CPU parts from the verified classes."""
    import importlib

    import _pytest.outcomes

    golden_test = importlib.import_module("tests_reproducibility.test_golden")  # fails, never skips, if missing
    monkeypatch.setattr(request.config, "_rlhf_reports", str(tmp_path), raising=False)
    record = lambda *args: None  # noqa: E731 - the measured numbers are not this test's results
    verified = (here, {**arithmetic.verdict(here, {"cpu-a": here})})
    try:
        golden_test.check_against_golden("r001", small_run.run, request, record, verified)
    except AssertionError as err:
        assert re.search(r"(?s)on a verified arithmetic class \(cpu-a.*states_sha256_continuous", str(err))
    except _pytest.outcomes.Skipped as skip:  # a skip here would hide a failing golden test
        pytest.fail(f"on a verified class the golden comparison skipped instead of failing: {skip}")
    else:
        pytest.fail("on a verified class the golden comparison passed with differing values")
    other = json.loads(json.dumps(here))
    other["ops"][0] = [other["ops"][0][0], "0" * 16]
    other["class"] = arithmetic.class_of(other)
    unverified = (here, arithmetic.verdict(here, {"cpu-b": other}))
    with pytest.raises(_pytest.outcomes.Skipped, match=f"(?s)cpu-b from ops.{here['ops'][0][0]}.*golden value"):
        golden_test.check_against_golden("r001", small_run.run, request, record, unverified)
    assert (tmp_path / "golden_embedded.measured.json").is_file()  # what it measured, for the record
