"""Pinned CPU arithmetic (rlhf.runtime): set before torch, in force, recorded.

The pin makes the bytes independent of what the CPU offers. Each test proves its point on an
Intel and on an AMD processor, or says what stands in where a lever exists on one vendor only:

* the settings in force are read back, not assumed: torch's kernel capability and the branch
  MKL itself reports; a weaker setting (`MKL_CBWR=AVX2`, which MKL runs as AUTO on AMD) makes
  the run's identity say "unpinned" on both vendors;
* the control that moves unpinned bytes on both vendors is torch's own kernel choice
  (`ATEN_CPU_CAPABILITY=default`, the widest kernels);
* limiting what MKL may use (`MKL_ENABLE_INSTRUCTIONS=SSE4_2`, what an older CPU offers) is a
  lever MKL honours on Intel processors only, so that pair runs where MKL sees an Intel CPU; on
  any other, the emulated other-vendor CPU of tests_unit/test_arithmetic.py stands in (the lab's
  arithmetic on a virtual Intel CPU equals the AMD machine's, entry for entry).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from conftest import without_coverage
from rlhf import runtime
from rlhf.io import read_json, sha256_file

pytestmark = [pytest.mark.unit, pytest.mark.e2e]  # e2e: fresh processes, `rlhf` commands, an SFT epoch

X86 = platform.machine().lower() in ("x86_64", "amd64")
DESCRIBE = "import json, rlhf, torch; from rlhf import runtime; print(json.dumps(runtime.describe()))"


def clean_env(**extra) -> dict:
    """This process's environment without the pin's variables (the conftest process set them)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in runtime.PIN and k != runtime.SWITCH and k not in ("MKL_ENABLE_INSTRUCTIONS", "RLHF_CRASH_AT")
    }
    env.update(extra)
    return env


def describe_in_subprocess(code: str = DESCRIBE, **env) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(**env))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_pin_requests_what_the_golden_numbers_were_made_under():
    """Written out on purpose: a test that read rlhf.runtime.PIN back could not fail."""
    assert runtime.PIN == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def test_this_test_process_is_pinned():
    """conftest.py imports rlhf before anything imports torch; the settings are in force."""
    d = runtime.describe()
    assert d["status"] == "pinned" and d["pin"] == runtime.PIN
    assert all(os.environ[k] == v for k, v in runtime.PIN.items())
    if X86:
        assert d["cpu_capability"] == "AVX2" and d["comparable"], d["note"]
        assert d["mkl_branch"] == "COMPATIBLE", "MKL does not run the branch the pin asks for"
        assert runtime.identity_tag().startswith("pinned:x86_64:aten-avx2:mkl-compatible:onednn-avx2:threads=")
    else:
        assert not d["comparable"] and "not x86-64" in d["note"]


def test_the_switch_turns_it_off_and_says_so():
    d = describe_in_subprocess(RLHF_CPU_PIN="off")
    assert d["status"] == "off" and d["pin"] == {} and not d["comparable"]
    assert "turned off with RLHF_CPU_PIN" in d["note"] and "NOT comparable" in d["note"]
    assert d["environment"]["ATEN_CPU_CAPABILITY"] is None


def test_torch_imported_first_cannot_be_pinned_and_says_so():
    d = describe_in_subprocess(
        "import json, torch, rlhf; from rlhf import runtime; print(json.dumps(runtime.describe()))"
    )
    assert d["status"] == "late" and not d["comparable"]
    assert "torch was imported before rlhf" in d["note"]


def test_a_users_own_setting_is_overridden_and_recorded():
    d = describe_in_subprocess(ATEN_CPU_CAPABILITY="avx512")
    assert d["status"] == "pinned" and d["overridden_user_settings"] == {"ATEN_CPU_CAPABILITY": "avx512"}
    if X86:
        assert d["cpu_capability"] == "AVX2"


@pytest.mark.skipif(not X86, reason="the AVX2/MKL pin exists on x86-64 only")
@pytest.mark.parametrize("weaker", ["AVX2", "AUTO"])
def test_a_weaker_mkl_setting_is_seen_in_force_and_unpins_the_identity(weaker):
    """MKL_CBWR changed after the pin was set (as a wrong pin value would): MKL reports another
    branch (AUTO on AMD for AVX2, AVX2 on Intel), and the run says so, on both vendors."""
    code = (
        "import json, os, rlhf; os.environ['MKL_CBWR'] = %r; import torch; from rlhf import runtime; "
        "print(json.dumps([runtime.describe(), runtime.identity_tag()]))" % weaker
    )
    d, tag = describe_in_subprocess(code)
    assert d["mkl_branch"] != "COMPATIBLE" and not d["comparable"]
    assert f"MKL runs its {d['mkl_branch']} branch, not COMPATIBLE" in d["note"]
    assert tag.startswith("unpinned:") and "mkl-compatible" not in tag


def test_release_unpins_before_torch_and_restores_the_users_settings():
    """A BF16 profile on the CPU runs unpinned by default (rlhf.cli): release() must give the user's
    own variables back, and the run must say it is unpinned and why."""
    code = (
        "import json, os, rlhf; from rlhf import runtime; runtime.release('profile q runs BF16 on the CPU'); "
        "import torch; print(json.dumps([runtime.describe(), runtime.identity_tag()]))"
    )
    d, tag = describe_in_subprocess(code, ATEN_CPU_CAPABILITY="avx512")
    assert d["status"] == "released" and not d["comparable"]
    assert d["environment"] == {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": None, "ONEDNN_MAX_CPU_ISA": None}
    assert "unpinned by default: profile q runs BF16 on the CPU" in d["note"]
    assert tag.endswith(":released")
    late = "import json, torch, rlhf; from rlhf import runtime; print(json.dumps(runtime.release('x')))"
    assert describe_in_subprocess(late) == "late", "a release after torch must not claim to unpin"


@pytest.mark.parametrize(
    "argv, status",
    [
        (["lab", "--out", "x"], "pinned"),
        (["lab", "--profile", "qwen2.5-0.5b", "--model-dir", "m", "--dry-run", "--cpu"], "released"),
        (["lab", "--profile", "qwen2.5-0.5b", "--model-dir", "m", "--dry-run", "--cpu", "--pin"], "pinned"),
        (["lab", "--profile", "qwen2.5-0.5b", "--model-dir", "m", "--dry-run"], "pinned"),
        (["sft", "--run", "r", "--profile", "qwen2.5-0.5b"], "pinned"),
    ],
    ids=["embedded", "bf16-cpu", "bf16-cpu-pin", "bf16-cuda", "cuda-stage"],
)
def test_the_command_line_unpins_a_bf16_profile_on_the_cpu_only(argv, status):
    """The embedded FP32 profile is always pinned; a BF16 profile run on the CPU is unpinned unless
    --pin (the pin caps oneDNN's BF16 at AVX2); a CUDA run keeps the pin for its CPU side."""
    code = (
        "import json, sys, rlhf; from rlhf import cli; cli._unpin_bf16_on_cpu(sys.argv[1:]); "
        "cli.build_parser().parse_args(sys.argv[1:]); import torch; from rlhf import runtime; "
        "print(json.dumps(runtime.describe()))"
    )
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=clean_env())
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["status"] == status


def sft_epoch_sha(tmp_path, name, profile_file, **env) -> str:
    """The state after one SFT epoch of a fresh process under `env` (not measured by --cov: the
    same SFT runs measured in the tier's own processes; the pin's levers are measured by the
    describing processes above)."""
    run = tmp_path / name
    done = subprocess.run(
        [sys.executable, "-m", "rlhf", "sft", "--run", str(run), "--profile", str(profile_file), "--stop-after", "1"],
        capture_output=True,
        text=True,
        env=without_coverage(clean_env(**env)),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return sha256_file(run / "sft" / "state-stop001.pt.gz")


@pytest.mark.skipif(not X86, reason="the AVX2/MKL pin exists on x86-64 only; elsewhere hashes are not compared")
def test_pinned_bytes_do_not_depend_on_what_the_cpu_offers(tmp_path, small_profile_file, record_result):
    runs = {
        "pinned": {},
        "unpinned": {"RLHF_CPU_PIN": "off"},
        "unpinned_aten_default": {"RLHF_CPU_PIN": "off", "ATEN_CPU_CAPABILITY": "default"},
    }
    intel = runtime.mkl_sees_intel()
    if intel:  # MKL honours MKL_ENABLE_INSTRUCTIONS on Intel processors only
        runs["pinned_mkl_sse42"] = {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"}
        runs["unpinned_mkl_sse42"] = {"RLHF_CPU_PIN": "off", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
    sha = {name: sft_epoch_sha(tmp_path, name, small_profile_file, **env) for name, env in runs.items()}
    record_result("sft_epoch1_state_sha256", sha)
    record_result("mkl_sees_intel", intel)
    # Control on every vendor: torch's own kernel choice reaches the arithmetic when nothing is
    # pinned, and the pin holds the bytes away from it.
    assert sha["unpinned_aten_default"] != sha["unpinned"], "ATEN_CPU_CAPABILITY changed nothing: a vacuous test"
    assert sha["pinned"] != sha["unpinned_aten_default"]
    if intel:
        assert sha["pinned"] == sha["pinned_mkl_sse42"], "the pinned bytes changed with the instructions MKL may use"
        assert sha["unpinned_mkl_sse42"] != sha["unpinned"], "MKL_ENABLE_INSTRUCTIONS changed nothing: a vacuous test"


def test_the_pin_is_in_every_identity_and_results_file(lab_run):
    run = lab_run.run
    record = read_json(run / "run.json")
    tag = record["identity"]["arithmetic"]
    assert tag == runtime.identity_tag()
    legs = sorted(run.glob("*/state-*.pt.gz.json"))
    assert {p.parent.name for p in legs} == {"sft", "judge", "ppo"} and len(legs) == 5  # PPO's three legs
    for sidecar in legs:
        assert read_json(sidecar)["identity"]["arithmetic"] == tag
    assert read_json(run / "evaluation" / "results.json")["arithmetic"] == record["arithmetic"]
    assert read_json(run / "shortcut_audit" / "results.json")["arithmetic"] == record["arithmetic"]
    assert read_json(run / "results.json")["run"]["arithmetic"] == record["arithmetic"]
