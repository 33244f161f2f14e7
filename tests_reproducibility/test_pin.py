"""Pinned CPU arithmetic (issue 12 item 2, rlhf.pin): set before torch, honoured, recorded.

The pin makes the bytes independent of what the CPU offers. One machine cannot be two CPUs, so
the test limits what MKL and oneDNN may use (`MKL_ENABLE_INSTRUCTIONS=SSE4_2`,
`ONEDNN_MAX_CPU_ISA=SSE41`: what an older or a non-Intel CPU gets) and requires the same state
bytes; as a control it shows that the same switch does change the bytes of an unpinned run,
and that torch's own kernel choice (ATEN_CPU_CAPABILITY) does too.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from rlhf import pin
from rlhf.io import read_json, sha256_file

pytestmark = pytest.mark.unit

X86 = platform.machine().lower() in ("x86_64", "amd64")
DESCRIBE = "import json, rlhf, torch; from rlhf import pin; print(json.dumps(pin.describe()))"


def clean_env(**extra) -> dict:
    """This process's environment without the pin's variables (the conftest process set them)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in pin.PIN and k != pin.SWITCH and k not in ("MKL_ENABLE_INSTRUCTIONS", "RLHF_CRASH_AT")
    }
    env.update(extra)
    return env


def describe_in_subprocess(code: str = DESCRIBE, **env) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(**env))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_this_test_process_is_pinned():
    """conftest.py imports rlhf before anything imports torch."""
    d = pin.describe()
    assert d["status"] == "pinned" and d["pin"] == pin.PIN
    assert all(os.environ[k] == v for k, v in pin.PIN.items())
    if X86:
        assert d["cpu_capability"] == "AVX2" and d["comparable"], d["note"]
        assert pin.identity_tag().startswith("pinned:x86_64:aten-avx2:mkl-compatible:onednn-avx2:threads=")
    else:
        assert not d["comparable"] and "not x86-64" in d["note"]


def test_the_switch_turns_it_off_and_says_so():
    d = describe_in_subprocess(RLHF_CPU_PIN="off")
    assert d["status"] == "off" and d["pin"] == {} and not d["comparable"]
    assert "turned off with RLHF_CPU_PIN" in d["note"] and "NOT comparable" in d["note"]
    assert d["environment"]["ATEN_CPU_CAPABILITY"] is None


def test_torch_imported_first_cannot_be_pinned_and_says_so():
    d = describe_in_subprocess("import json, torch, rlhf; from rlhf import pin; print(json.dumps(pin.describe()))")
    assert d["status"] == "late" and not d["comparable"]
    assert "torch was imported before rlhf" in d["note"]


def test_a_users_own_setting_is_overridden_and_recorded():
    d = describe_in_subprocess(ATEN_CPU_CAPABILITY="avx512")
    assert d["status"] == "pinned" and d["overridden_user_settings"] == {"ATEN_CPU_CAPABILITY": "avx512"}
    if X86:
        assert d["cpu_capability"] == "AVX2"


def sft_epoch_sha(tmp_path, name, profile_file, **env) -> str:
    run = tmp_path / name
    done = subprocess.run(
        [sys.executable, "-m", "rlhf", "sft", "--run", str(run), "--profile", str(profile_file), "--stop-after", "1"],
        capture_output=True,
        text=True,
        env=clean_env(**env),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return sha256_file(run / "sft" / "state-stop001.pt.gz")


@pytest.mark.skipif(not X86, reason="the AVX2/MKL pin exists on x86-64 only; elsewhere hashes are not compared")
def test_pinned_bytes_do_not_depend_on_what_the_cpu_offers(tmp_path, small_profile_file, record_result):
    sha = {
        "pinned": sft_epoch_sha(tmp_path, "pinned", small_profile_file),
        "pinned_mkl_sse42": sft_epoch_sha(
            tmp_path, "pinned_sse", small_profile_file, MKL_ENABLE_INSTRUCTIONS="SSE4_2", ONEDNN_MAX_CPU_ISA="SSE41"
        ),
        "unpinned": sft_epoch_sha(tmp_path, "unpinned", small_profile_file, RLHF_CPU_PIN="off"),
        "unpinned_mkl_sse42": sft_epoch_sha(
            tmp_path, "unpinned_sse", small_profile_file, RLHF_CPU_PIN="off", MKL_ENABLE_INSTRUCTIONS="SSE4_2"
        ),
        "unpinned_aten_default": sft_epoch_sha(
            tmp_path, "unpinned_default", small_profile_file, RLHF_CPU_PIN="off", ATEN_CPU_CAPABILITY="default"
        ),
    }
    record_result("sft_epoch1_state_sha256", sha)
    assert sha["pinned"] == sha["pinned_mkl_sse42"], "the pinned bytes changed with the instructions MKL may use"
    # Controls: the same switches do reach the arithmetic when nothing is pinned.
    assert sha["unpinned_mkl_sse42"] != sha["unpinned"], "MKL_ENABLE_INSTRUCTIONS changed nothing: a vacuous test"
    assert sha["unpinned_aten_default"] != sha["unpinned"], "ATEN_CPU_CAPABILITY changed nothing: a vacuous test"
    assert sha["pinned"] != sha["unpinned_aten_default"]


def test_the_pin_is_in_every_identity_and_results_file(lab_run):
    run = lab_run.run
    record = read_json(run / "run.json")
    tag = record["identity"]["arithmetic"]
    assert tag == pin.identity_tag()
    for stage in ("sft", "judge", "ppo"):
        for leg in ("boundary", "resumed", "continuous"):
            assert read_json(run / stage / f"state-{leg}.pt.gz.json")["identity"]["arithmetic"] == tag
    assert read_json(run / "evaluation" / "results.json")["arithmetic"] == record["arithmetic"]
    assert read_json(run / "shortcut_audit" / "results.json")["arithmetic"] == record["arithmetic"]
    assert read_json(run / "results.json")["run"]["arithmetic"] == record["arithmetic"]
