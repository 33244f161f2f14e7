"""A run's identity (rlhf.identities): what the code part is computed from, and how a refusal
names what changed.

* The code identity is computed over a copy of the package in a temporary folder (the real tree
  is never edited): the copy has the real tree's identity, and editing a module of the package,
  a module of a subpackage (rlhf/studies/, rlhf/report/) or a profile changes it.
* A refused rerun or resume names every part that differs, a part only the saved identity holds
  and a part only the current one holds included: in `describe_change` and in each of its callers
  that refuses (a resume state, run.json, a study's record: seeds, frontier and its confirmation).
"""

from __future__ import annotations

import shutil
import types
from pathlib import Path

import pytest
import torch

from rlhf import identities, lab
from rlhf.checkpoint import StateError, load_state, save_state
from rlhf.lab import run as lab_run
from rlhf.studies import StudyError, record

pytestmark = pytest.mark.unit

PACKAGE = Path(identities.__file__).parent

# Saved and current identities that agree on `code`, differ on `config`, and each hold one part
# the other lacks (a part added or dropped by another version of the lab).
SAVED = {"profile": "embedded", "revision": "r001", "code": "c" * 64, "config": "1" * 64, "saved_only": "s" * 64}
CURRENT = {"profile": "embedded", "revision": "r001", "code": "c" * 64, "config": "2" * 64, "current_only": "n" * 64}


@pytest.fixture
def package_copy(tmp_path, monkeypatch):
    """The package copied into tmp_path (sources and profiles), and code_sha256 pointed at it."""
    copy = tmp_path / "rlhf"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(identities, "CODE_DIR", copy)
    return copy


@pytest.mark.parametrize(
    "relative",
    ["ppo_math.py", "studies/seeds.py", "studies/frontier/selection.py", "report/tables.py", "profiles/embedded.toml"],
)
def test_editing_any_source_file_or_profile_changes_the_code_identity(package_copy, relative):
    before = identities.code_sha256()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(identities, "CODE_DIR", PACKAGE)
        assert identities.code_sha256() == before, "the copy's identity is not the real tree's"
    path = package_copy / relative
    assert path.is_file(), f"{relative} is not in the package any more: name another file of it"
    original = path.read_bytes()
    path.write_bytes(original + b"\n# one edited line\n")
    edited = identities.code_sha256()
    path.write_bytes(original)
    assert edited != before, f"editing rlhf/{relative} left the code identity unchanged"
    assert identities.code_sha256() == before


def test_describe_change_names_a_part_held_on_one_side_only():
    message = identities.describe_change(SAVED, CURRENT)
    assert message is not None and message.startswith("identity changed in config, current_only, saved_only (")
    assert f"saved_only was {'s' * 40}, now None" in message
    assert f"current_only was None, now {'n' * 40}" in message
    assert "code" not in message.split(" (")[0]  # an equal part is not named
    assert identities.describe_change(SAVED, dict(SAVED)) is None


def refuse_resume_state(tmp_path):
    path = tmp_path / "state.pt.gz"
    save_state(path, {"step": 1, "x": torch.zeros(2)}, SAVED)
    load_state(path, SAVED)  # its own identity loads
    with pytest.raises(StateError) as refused:
        load_state(path, CURRENT)
    return str(refused.value)


def refuse_run_record(tmp_path, monkeypatch):
    from rlhf.config import load_profile

    ctx = types.SimpleNamespace(
        run=tmp_path, profile=load_profile("embedded"), device="cpu", precision={}, determinism={}
    )
    monkeypatch.setattr(lab_run, "run_identity", lambda _ctx: SAVED)
    lab.check_run_record(ctx)  # writes run.json
    written = (tmp_path / lab.RUN_FILE).read_bytes()
    monkeypatch.setattr(lab_run, "run_identity", lambda _ctx: CURRENT)
    with pytest.raises(StateError) as refused:
        lab.check_run_record(ctx)
    assert (tmp_path / lab.RUN_FILE).read_bytes() == written  # nothing written
    return str(refused.value)


def refuse_study(check, path, error):
    check(path, SAVED)  # writes the record
    check(path, SAVED)  # the same identity continues
    with pytest.raises(error) as refused:
        check(path, CURRENT)
    return str(refused.value)


@pytest.mark.parametrize("caller", ["resume state", "run.json", "study record"])
def test_every_refusal_names_the_parts_held_on_one_side_only(caller, tmp_path, monkeypatch):
    if caller == "resume state":
        message = refuse_resume_state(tmp_path)
    elif caller == "run.json":
        message = refuse_run_record(tmp_path, monkeypatch)
    else:
        message = refuse_study(record.open_record, tmp_path, StudyError)
    assert "identity changed in config, current_only, saved_only (" in message, message
    assert "saved_only was ssss" in message and "now None" in message, message
    assert "current_only was None, now nnnn" in message, message
