"""The one atomic writer and the one hashing helper (and `read_json_of_kind`, the one reader of a
JSON file a user names, refused naming the file when it is not of its kind).

Every artifact of the lab is written through `write_bytes` / `write_json`: a temporary file in
the same folder, fsync, then `os.replace`. An existing file is never overwritten unless the
caller says `overwrite=True` explicitly (only for records that are meant to change, such as a
run's `run.json`). `keep_existing=True` makes a rerun after a crash idempotent: a file that is
already there was written whole (the rename is atomic), so it is kept as it is.

A crash can leave two kinds of debris, both removed by `sweep_incomplete` before a stage
continues: a temporary file (`.NAME.<random>.tmp`, killed before the rename) and a data file
without its sidecar manifest (killed between the two writes of `write_with_sidecar`, which
writes the manifest last). Neither is ever read.

`crash_point(name)` is the fault-injection hook of the crash tests (tests_reproducibility):
with `RLHF_CRASH_AT=name` (or `name@k` for the k-th time) the process kills itself with
SIGKILL there, as a power cut would (once the background writes in flight have landed, so that
the moment is reproducible). Unset, it costs one dictionary lookup.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

# Artifacts get the modes the user's umask allows (a shared run folder stays readable by the
# team): mkstemp and mkdtemp would create them private (0600/0700). Read once, at import.
_UMASK = os.umask(0)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK
FOLDER_MODE = 0o777 & ~_UMASK


class ArtifactExists(FileExistsError):
    """Raised instead of overwriting an artifact."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_text(text: str) -> str:
    return sha256_bytes(text.encode("utf-8"))


_CRASH_AT = os.environ.get("RLHF_CRASH_AT", "")
_crash_counts: dict[str, int] = {}
# Background writes in flight (rlhf.checkpoint.StateWriter's threads). A crash point lets them
# land before it kills, so that each crash test kills at a reproducible moment; the kill inside
# a background write itself (`write:NAME`, in the writing thread) is the test of losing one.
WRITES_IN_FLIGHT: set[threading.Thread] = set()


def crash_point(name: str) -> None:
    """Test hook: SIGKILL this process here when RLHF_CRASH_AT names this point (see module doc)."""
    if not _CRASH_AT:
        return
    want, _, nth = _CRASH_AT.partition("@")
    if want != name:
        return
    _crash_counts[name] = _crash_counts.get(name, 0) + 1
    if _crash_counts[name] == int(nth or 1):
        join_background_writes()
        os.kill(os.getpid(), signal.SIGKILL)


def join_background_writes() -> None:
    """Wait for every write in flight in this process's background writers (WRITES_IN_FLIGHT):
    what was saved before this moment is then on disk (a writer never waits for itself)."""
    for thread in list(WRITES_IN_FLIGHT):
        if thread is not threading.current_thread():
            thread.join()


def output_folder(path: str | os.PathLike) -> Path:
    """`path` as a folder to write into (a new one, or a run or study to continue): refused,
    naming it, when it exists and is not a folder. Nothing is written either way."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(
            f"{path} is a file, not a folder: name a new folder, or the folder of a run or study to continue "
            "(nothing was written)"
        )
    return path


def write_bytes(path: str | os.PathLike, data: bytes, *, overwrite: bool = False, keep_existing: bool = False) -> Path:
    """Atomically write `data` to `path` (temp file + fsync + rename); refuse to overwrite.

    keep_existing: if `path` exists, leave it as it is and return (a rerun after a crash)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and keep_existing:
        return path
    if path.exists() and not overwrite:
        raise ArtifactExists(f"refusing to overwrite existing artifact {path}")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)  # mkstemp's 0600 would make artifacts private
        with os.fdopen(fd, "wb") as f:
            half = len(data) // 2
            f.write(data[:half])
            if _CRASH_AT:
                f.flush()
                crash_point(f"write:{path.name}")  # killed with half the bytes in the temp file
            f.write(data[half:])
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            try:  # link refuses an existing target in one step: no check-then-rename race
                os.link(tmp, path)
            except FileExistsError:
                raise ArtifactExists(f"refusing to overwrite existing artifact {path}") from None
            os.unlink(tmp)
        _fsync_dir(path.parent)  # the rename itself survives a power cut
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


@contextmanager
def atomic_folder(out):
    """Build a folder under a temporary sibling name (`.NAME.<random>`) and rename it into place
    whole, so that a crash never leaves a half-written folder at `out` (rlhf.lab sweeps the
    temporary ones on a rerun). `out` must be absent or empty; the body writes into the
    yielded path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        os.chmod(tmp, FOLDER_MODE)  # mkdtemp's 0700 would make the folder private
        share_as_umask_allows(tmp)  # and so could files other libraries wrote inside it
        if out.exists():
            out.rmdir()  # empty, or this raises: never replaces content
        os.rename(tmp, out)
        _fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def share_as_umask_allows(root) -> None:
    """Give `root` and everything under it the read (and, for folders and executables, enter or
    run) bits the user's umask allows: files that other libraries write (safetensors, tokenizer
    files, mkdtemp's folder) can be private to the writing user otherwise."""
    root = Path(root)
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode & 0o7777
        if path.is_dir():
            wanted = mode | (0o555 & FOLDER_MODE)
        else:
            wanted = mode | (0o444 & FILE_MODE) | ((0o111 & FOLDER_MODE) if mode & 0o100 else 0)
        if wanted != mode:
            os.chmod(path, wanted)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path, text: str, *, overwrite: bool = False, keep_existing: bool = False) -> Path:
    return write_bytes(path, text.encode("utf-8"), overwrite=overwrite, keep_existing=keep_existing)


def dumps_json(obj) -> str:
    """Canonical JSON text (sorted keys, fixed separators) so that hashes are stable."""
    return json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path, obj, *, overwrite: bool = False, keep_existing: bool = False) -> Path:
    return write_text(path, dumps_json(obj), overwrite=overwrite, keep_existing=keep_existing)


class DamagedFile(ValueError):
    """A file the lab wrote that no longer reads as what it wrote: the message names the file."""


def _load_json(path):
    with open(path, "rb") as f:
        return json.loads(f.read().decode("utf-8"))


def read_json(path):
    """A JSON file's content; a file that is not JSON (cut short, damaged, not UTF-8) is refused
    naming the file (DamagedFile, a ValueError)."""
    try:
        return _load_json(path)
    except ValueError as err:  # json's decoding errors, and bytes that are not UTF-8
        raise DamagedFile(
            f"{path} is not valid JSON ({err}): the file is damaged or was cut short; restore it, or remove "
            f"the folder it belongs to and rerun the command that makes it"
        ) from None


def read_json_of_kind(path, kind: str, required: Mapping[str, type | tuple[type, ...]], parts: str, made_by: str):
    """A JSON file a user names as a `kind` (a fingerprint file, a command's record): refused with
    a ValueError naming the file and what is wrong: it cannot be read, is not JSON, or lacks one of
    the `required` {key: type} (`parts` names them, `made_by` says what writes such a file)."""
    try:
        data = _load_json(path)
    except OSError as err:
        raise ValueError(f"cannot read {kind} {path}: {err.strerror or err}") from None
    except ValueError as err:  # json's decoding errors, and bytes that are not UTF-8
        raise ValueError(f"{path} is not a {kind}: not JSON ({err})") from None
    missing = [k for k, t in required.items() if not isinstance(data, dict) or not isinstance(data.get(k), t)]
    if missing:
        raise ValueError(f"{path} is not a {kind}: JSON without the {parts} {', '.join(missing)} ({made_by})")
    return data


def write_with_sidecar(path, data: bytes, manifest: dict) -> dict:
    """Write `data` and `<path>.json` (its manifest, with the SHA-256 and size added); never overwrite.

    The one way artifacts that are loaded back (resume states, role states) are written, so that
    `read_verified` can check them before anything reads their content. The manifest is written
    last: a data file without it is an interrupted write (`sweep_incomplete` removes it).
    """
    path = Path(path)
    sidecar = Path(str(path) + ".json")
    for p in (path, sidecar):
        if p.exists():
            raise ArtifactExists(f"refusing to overwrite existing artifact {p}")
    manifest = {**manifest, "sha256": sha256_bytes(data), "bytes": len(data)}
    write_bytes(path, data)
    write_json(sidecar, manifest)
    return manifest


def sweep_incomplete(folder, sidecar_patterns=("*.pt.gz", "*.safetensors")) -> list[str]:
    """Remove what a crash left in `folder`: temporary files of `write_bytes`, and data files of
    `write_with_sidecar` whose manifest was never written. Returns the names removed.

    Only debris is removed: a temp file was never renamed into place, and a data file without
    its manifest has no hash to check it by, so neither was ever a complete artifact."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for p in sorted(folder.glob(".*.tmp")):
        if p.is_file():
            p.unlink()
            removed.append(p.name)
    for pattern in sidecar_patterns:
        for p in sorted(folder.glob(pattern)):
            if p.is_file() and not Path(str(p) + ".json").is_file():
                p.unlink()
                removed.append(p.name)
    return removed


def read_verified(path, error=ValueError, what: str = "artifact") -> tuple[bytes, dict]:
    """Read a file written by `write_with_sidecar`; raise `error` if it is missing, truncated or
    does not match the SHA-256 in its manifest. Returns (bytes, manifest)."""
    path = Path(path)
    sidecar = Path(str(path) + ".json")
    if not path.is_file() or not sidecar.is_file():
        raise error(f"missing {what} {path} or its manifest {sidecar.name}")
    manifest = read_json(sidecar)
    data = path.read_bytes()
    if "bytes" in manifest and len(data) != manifest["bytes"]:
        raise error(f"{what} {path} is truncated: {len(data)} bytes, expected {manifest['bytes']}")
    if sha256_bytes(data) != manifest["sha256"]:
        raise error(f"hash mismatch: {what} {path} is corrupted or replaced (SHA-256 differs from its manifest)")
    return data, manifest
