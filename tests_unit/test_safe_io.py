"""What the lab loads back cannot run code, what it writes is all or nothing, and a model
directory whose weights were replaced is refused by hash.

* A resume state or role file with a VALID sidecar hash (an attacker, or a careless copy, can
  always write a matching sidecar) whose payload would execute code under full unpickling is
  refused, and the code never runs: the hash check is about damage, the loaders' formats
  (weights-only unpickling, safetensors) are what keeps code out.
* `rlhf.io.write_bytes` interrupted at the write, the fsync or the rename leaves no file at the
  target, no temporary file beside it, and every other file as it was.
* Weights replaced in a model directory (same shapes, so every config check passes) are refused
  by the SHA-256 that the directory's build manifest or fetch marker recorded.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import pathlib
import pickle
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlhf import io as rio
from rlhf.checkpoint import StateError, load_state, save_state
from rlhf.io import read_json, read_verified, sha256_bytes, write_json, write_with_sidecar
from rlhf.models import FETCH_MARKER, ModelCheckError, directory_identity, load_base
from rlhf.roles import RoleStateError, load_role, new_role, save_role

pytestmark = pytest.mark.unit


class TouchOnUnpickle:
    """Unpickling this calls pathlib.Path.touch(sentinel): proof that code ran."""

    def __init__(self, sentinel: pathlib.Path):
        self.sentinel = sentinel

    def __reduce__(self):
        return (pathlib.Path.touch, (self.sentinel,))


def torch_saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def code_running_payload(kind: str, sentinel: pathlib.Path) -> bytes:
    """A state-shaped object with a code-running entry, as torch.save bytes or plain pickle."""
    obj = {
        "format": "rlhf-state-1",
        "structure": "{}",
        "tensors": {"x": torch.zeros(2)},
        "payload": TouchOnUnpickle(sentinel),
    }
    return torch_saved(obj) if kind == "torch.save" else pickle.dumps(obj)


def rewrite_sidecar(path: pathlib.Path, data: bytes) -> None:
    """Replace the payload and give its sidecar the payload's true SHA-256 and size."""
    sidecar = pathlib.Path(str(path) + ".json")
    manifest = read_json(sidecar)
    manifest.update(sha256=sha256_bytes(data), bytes=len(data))
    path.write_bytes(data)
    write_json(sidecar, manifest, overwrite=True)


# ================================================================= states and role files


@pytest.mark.parametrize("kind", ["torch.save", "pickle"])
def test_the_payload_would_run_code_under_full_unpickling(tmp_path, kind):
    """Control for the tests below: the payload is live, so their sentinel check means something."""
    sentinel = tmp_path / "ran"
    data = code_running_payload(kind, sentinel)
    if kind == "torch.save":
        torch.load(io.BytesIO(data), weights_only=False)
    else:
        pickle.loads(data)
    assert sentinel.exists()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("kind", ["torch.save", "pickle"])
def test_state_with_a_valid_hash_and_a_code_running_payload_is_refused(tmp_path, kind):
    """Catches a state loader that unpickles in full (weights_only=False, pickle.load): the
    sidecar hash matches, so only the weights-only unpickler stands between the file and code."""
    sentinel = tmp_path / "ran"
    path = tmp_path / "state.pt.gz"
    data = gzip.compress(code_running_payload(kind, sentinel), compresslevel=1, mtime=0)
    identity = {"config": "c" * 64}
    write_with_sidecar(path, data, {"file": path.name, "identity": identity})
    assert read_verified(path, StateError, "state")[0] == data  # the hash check passes
    for given in (None, identity):
        with pytest.raises(StateError, match="cannot be decoded"):
            load_state(path, given)
    assert not sentinel.exists()


def test_a_real_state_still_loads(tmp_path):
    """Control: the same loader reads what save_state wrote (the refusal above is not blanket)."""
    path = tmp_path / "state.pt.gz"
    save_state(path, {"step": 3, "w": torch.arange(4.0)}, {"config": "c" * 64})
    state = load_state(path, {"config": "c" * 64})
    assert state["step"] == 3 and torch.equal(state["w"], torch.arange(4.0))


@pytest.fixture
def saved_actor(embedded_profile, embedded_dir, move_adapters, tmp_path):
    role = new_role("actor", embedded_profile, embedded_dir)
    move_adapters(role.model, 7)
    path = tmp_path / "actor.safetensors"
    save_role(role, path)
    return role, path


@pytest.mark.parametrize("kind", ["torch.save", "pickle"])
def test_role_file_with_a_valid_hash_and_a_pickle_payload_is_refused(saved_actor, tmp_path, kind):
    """Catches a role loader that accepts anything but safetensors (torch.load, pickle.loads)
    once the hash matches, and one whose refusal is a stray decoder exception instead of the
    RoleStateError every other bad role file gets."""
    role, path = saved_actor
    sentinel = tmp_path / "ran"
    payload = code_running_payload(kind, sentinel)
    rewrite_sidecar(path, payload)
    assert read_verified(path, RoleStateError, "role state")[0] == payload  # the hash check passes
    before = role.learned_state()
    with pytest.raises(RoleStateError, match="not a safetensors file"):
        load_role(role, path)
    assert not sentinel.exists()
    after = role.learned_state()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing half-loaded


def test_role_file_with_tensors_in_torch_format_is_refused(saved_actor):
    """The role's own tensors, saved with torch.save instead of safetensors, are refused too:
    the format is part of the contract, not only the content."""
    role, path = saved_actor
    tensors = load_file(str(path))
    rewrite_sidecar(path, torch_saved(tensors))
    with pytest.raises(RoleStateError, match="not a safetensors file"):
        load_role(role, path)


# ================================================================= the atomic writer


class BrokenWrite:
    """A file object that writes half of the data, then fails like a full disk."""

    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data):
        self.f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    def __getattr__(self, name):
        return getattr(self.f, name)


def inject(monkeypatch, where: str):
    """Make one step of write_bytes fail: the write, the fsync or the rename."""

    def fail(*args, **kwargs):
        raise OSError(errno.EIO, f"{where} failed (injected)")

    if where == "write":
        real_fdopen = os.fdopen
        monkeypatch.setattr(rio.os, "fdopen", lambda fd, *a, **k: BrokenWrite(real_fdopen(fd, *a, **k)))
    elif where == "fsync":
        monkeypatch.setattr(rio.os, "fsync", fail)
    else:  # the step that puts the file in place: os.replace (overwrite) or os.link (never overwrite)
        monkeypatch.setattr(rio.os, "replace", fail)
        monkeypatch.setattr(rio.os, "link", fail)


STEPS = ["write", "fsync", "replace"]


@pytest.mark.parametrize("where", STEPS)
def test_a_failed_write_leaves_no_target_no_temp_file_and_other_files_intact(tmp_path, monkeypatch, where):
    """Catches a writer that writes the target in place (a half file where an artifact should be)
    or forgets its temporary file when a step fails."""
    earlier = tmp_path / "earlier.bin"
    rio.write_bytes(earlier, b"earlier artifact")
    inject(monkeypatch, where)
    with pytest.raises(OSError, match="injected"):
        rio.write_bytes(tmp_path / "state.bin", b"new artifact" * 1000)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier.bin"]
    assert earlier.read_bytes() == b"earlier artifact"


@pytest.mark.parametrize("where", STEPS)
def test_a_failed_overwrite_keeps_the_old_content(tmp_path, monkeypatch, where):
    """Catches an overwrite that truncates or deletes the old file before the new one is
    complete: with overwrite=True a failure anywhere must leave the old bytes."""
    target = tmp_path / "log.json"
    rio.write_bytes(target, b"old content")
    inject(monkeypatch, where)
    with pytest.raises(OSError, match="injected"):
        rio.write_bytes(target, b"new content" * 1000, overwrite=True)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.json"]
    assert target.read_bytes() == b"old content"


def test_the_writer_without_failures_replaces_and_leaves_nothing_else(tmp_path):
    """Control: the same calls succeed when nothing is injected."""
    target = tmp_path / "log.json"
    rio.write_bytes(target, b"old content")
    rio.write_bytes(target, b"new content", overwrite=True)
    assert target.read_bytes() == b"new content"
    assert [p.name for p in tmp_path.iterdir()] == ["log.json"]


# ================================================================= modes of what is written

UMASK_WRITES = """
import json, sys, rlhf
from pathlib import Path
from rlhf.io import atomic_folder, write_bytes, write_json, write_with_sidecar
out = Path(sys.argv[1])
write_bytes(out / "state.bin", b"state")
write_json(out / "results.json", {"a": 1})
write_bytes(out / "log.json", b"new", overwrite=True)
write_with_sidecar(out / "actor.safetensors", b"weights", {"role": "actor"})
with atomic_folder(out / "handoff") as tmp:
    write_bytes(tmp / "data.parquet", b"rows")
    private = tmp / "model.safetensors"  # as another library may leave a file it wrote
    private.write_bytes(b"weights")
    private.chmod(0o600)
"""


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077], ids=["022", "002", "077"])
def test_what_the_lab_writes_has_the_modes_the_users_umask_allows(tmp_path, umask):
    """Catches a writer that leaves its temporary file's private mode (0600, folders 0700): a run
    folder shared with a team, a results folder served to others or a CI artifact could then be
    read by no one else, and reading back as the same user would never notice."""
    import subprocess
    import sys

    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([sys.executable, "-c", UMASK_WRITES, str(out)], capture_output=True, text=True, umask=umask)
    assert done.returncode == 0, done.stderr[-2000:]
    modes = {p.relative_to(out).as_posix(): p.stat().st_mode & 0o777 for p in out.rglob("*")}
    files = {name: mode for name, mode in modes.items() if (out / name).is_file()}
    assert set(files) == {
        "state.bin",
        "results.json",
        "log.json",
        "actor.safetensors",
        "actor.safetensors.json",
        "handoff/data.parquet",
        "handoff/model.safetensors",
    }
    foreign = files.pop("handoff/model.safetensors")
    assert files == dict.fromkeys(files, 0o666 & ~umask), f"umask {umask:o}: {files}"
    assert foreign & 0o444 == 0o444 & ~umask, f"umask {umask:o}: a file another library wrote stayed {foreign:o}"
    assert modes["handoff"] == 0o777 & ~umask


def test_every_file_of_a_lab_run_is_readable_by_the_group_and_others(lab_run):
    """The whole run folder as `rlhf lab` leaves it: no file or folder is more private than the
    suite's umask makes it (with the usual 022, everything is readable by group and others)."""
    umask = os.umask(0)
    os.umask(umask)
    read, enter = 0o044 & ~umask, 0o011 & ~umask
    private = [
        str(p.relative_to(lab_run.run))
        for p in lab_run.run.rglob("*")
        if p.stat().st_mode & read != read or (p.is_dir() and p.stat().st_mode & enter != enter)
    ]
    assert not private, f"{len(private)} private path(s), e.g. {private[:5]}"


# ================================================================= replaced model weights


def replace_weights(model_dir: pathlib.Path) -> None:
    """Different valid weights of the same shapes and dtypes: every config check still passes."""
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 0.01
    path.unlink()
    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.fixture
def model_copy(tmp_path, embedded_dir):
    dst = tmp_path / "base"
    shutil.copytree(embedded_dir, dst)
    return dst


def as_fetched(model_dir: pathlib.Path) -> None:
    """Make the copy look like `rlhf fetch-model` output: its marker records the file hashes."""
    (model_dir / "manifest.json").unlink()
    write_json(
        model_dir / FETCH_MARKER, {"repo_id": "test/embedded", "revision": "r", "files": directory_identity(model_dir)}
    )


@pytest.mark.parametrize("record", ["build manifest", "fetch marker"])
def test_replaced_weights_are_refused_by_their_sha256(model_copy, embedded_profile, record):
    """Catches a loader that trusts a directory because its config, shapes and marker look right:
    the replaced model.safetensors has the same shapes and the marker is untouched; only the
    recorded SHA-256 differs."""
    if record == "fetch marker":
        as_fetched(model_copy)
    load_base(embedded_profile, model_copy)  # the untouched copy loads
    marker_before = {p.name: p.read_bytes() for p in model_copy.iterdir() if p.suffix == ".json"}
    replace_weights(model_copy)
    assert {p.name: p.read_bytes() for p in model_copy.iterdir() if p.suffix == ".json"} == marker_before
    with pytest.raises(ModelCheckError, match=r"model\.safetensors has SHA-256"):
        load_base(embedded_profile, model_copy)


def test_replaced_weights_are_refused_with_the_callers_precomputed_identity(model_copy, embedded_profile):
    """The lab hashes the directory once and hands the hashes to every role's loader: those
    hashes are checked against the record too, so the role loader cannot skip the check."""
    replace_weights(model_copy)
    identity = {"files": directory_identity(model_copy)}
    with pytest.raises(ModelCheckError, match=r"model\.safetensors has SHA-256"):
        load_base(embedded_profile, model_copy, identity=identity)


def test_an_unrecorded_weight_file_is_refused(model_copy, embedded_profile):
    """Catches a second weight file slipped in beside the recorded ones (a shard the loader may
    prefer), which no recorded hash would otherwise cover."""
    shutil.copy(model_copy / "model.safetensors", model_copy / "extra.safetensors")
    with pytest.raises(ModelCheckError, match=r"extra\.safetensors holds weights"):
        load_base(embedded_profile, model_copy)


def test_replaced_weights_change_the_base_identity(model_copy, embedded_profile, embedded_dir):
    """Where nothing was recorded, the identity that every state and role file carries still
    moves with the weights' hash, so a resume over replaced weights is refused."""
    (model_copy / "manifest.json").unlink()
    before = load_base(embedded_profile, model_copy).identity
    replace_weights(model_copy)
    after = load_base(embedded_profile, model_copy).identity
    assert before["files"]["model.safetensors"] != after["files"]["model.safetensors"]
    assert {k: v for k, v in before["files"].items() if k != "model.safetensors"} == {
        k: v for k, v in after["files"].items() if k != "model.safetensors"
    }


@pytest.mark.parametrize("content", [b'{"stages": {"sft": ', b"", b"\xff\xfe not utf-8"])
def test_a_json_file_cut_short_or_damaged_is_refused_naming_the_file_and_what_to_do(tmp_path, capsys, content):
    from rlhf import cli

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_bytes(content)
    with pytest.raises(rio.DamagedFile, match=rf"{run / 'run.json'} is not valid JSON .*rerun the command"):
        read_json(run / "run.json")
    before = sorted(p.name for p in run.iterdir())
    assert cli.main(["sft", "--run", str(run)]) != 0
    err = capsys.readouterr().err
    assert f"{run / 'run.json'} is not valid JSON" in err and "damaged or was cut short" in err
    assert sorted(p.name for p in run.iterdir()) == before  # nothing written beside it


@pytest.mark.parametrize("stage", ["sft", "judge", "ppo"])
def test_resume_with_nothing_to_resume_is_refused_before_anything_is_written_naming_the_command(
    tmp_path, capsys, stage
):
    from rlhf import cli

    run = tmp_path / "new"
    assert cli.main([stage, "--run", str(run), "--resume"]) != 0
    err = capsys.readouterr().err
    assert f"nothing to resume in {run / stage}" in err and f"rlhf {stage} --run {run} --stop-after N" in err
    assert not run.exists()


def test_a_non_empty_folder_that_is_not_a_run_is_refused_with_nothing_written(tmp_path, capsys):
    from rlhf import cli

    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "thesis.tex").write_text("mine")
    (folder / "figures").mkdir()
    assert cli.main(["sft", "--run", str(folder)]) != 0
    err = capsys.readouterr().err
    assert f"folder {folder} is not empty and is not a run" in err and "figures, thesis.tex" in err
    assert "give a new or empty folder" in err
    assert sorted(p.name for p in folder.iterdir()) == ["figures", "thesis.tex"]  # nothing written beside them


def test_what_a_run_folder_holds_before_its_corpus_is_not_foreign(tmp_path):
    from rlhf.lab import refuse_foreign_folder

    refuse_foreign_folder(tmp_path / "absent")  # a new folder
    for held in (
        [],  # empty
        ["profile.toml"],  # a study's run profile, written before the lab runs in it
        ["profile.toml", ".corpus.tmp123"],  # what a crash while preparing the corpus left
        ["profile.toml", "lab.log"],  # the seed study logs each seed's lab into its folder first
        ["profile.toml", "frontier.log"],  # so do the frontier and the confirmations
        ["corpus"],  # a run whose corpus is written, its run.json not yet
        ["run.json", "sft", "anything"],  # a run
    ):
        folder = tmp_path / "-".join(held or ["empty"])
        folder.mkdir()
        for name in held:
            (folder / name).mkdir() if name in ("corpus", "sft") else (folder / name).write_text("x")
        refuse_foreign_folder(folder)


def test_a_study_s_seed_folder_with_its_log_opened_is_a_run_folder_for_the_lab(tmp_path):
    """What every study does before a seed's lab runs: its profile written, its log opened."""
    import contextlib

    from rlhf.lab import refuse_foreign_folder
    from rlhf.studies import log_to
    from rlhf.studies.derivation import write_study_profiles

    (folder,) = write_study_profiles(tmp_path, "embedded", 1, 3, "sft-demos6")
    with contextlib.ExitStack() as stack:
        log_to(folder / "frontier.log", stack)
        print("seed 0: SFT")
    refuse_foreign_folder(folder)
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="it holds notes.txt"):
        refuse_foreign_folder(folder)
