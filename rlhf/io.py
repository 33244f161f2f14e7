"""The one atomic writer and the one hashing helper.

Every artifact of the lab is written through `write_bytes` / `write_json`: a temporary file in
the same folder, fsync, then `os.replace`. An existing file is never overwritten unless the
caller says `overwrite=True` explicitly (only for files that are not artifacts, e.g. logs).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


_UMASK = os.umask(0)
os.umask(_UMASK)


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


def write_bytes(path: str | os.PathLike, data: bytes, *, overwrite: bool = False) -> Path:
    """Atomically write `data` to `path` (temp file + fsync + rename); refuse to overwrite."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not overwrite:
        raise ArtifactExists(f"refusing to overwrite existing artifact {path}")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's 0600 would make artifacts private
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if not overwrite and path.exists():  # lost a race: still never overwrite
            raise ArtifactExists(f"refusing to overwrite existing artifact {path}")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_text(path, text: str, *, overwrite: bool = False) -> Path:
    return write_bytes(path, text.encode("utf-8"), overwrite=overwrite)


def dumps_json(obj) -> str:
    """Canonical JSON text (sorted keys, fixed separators) so that hashes are stable."""
    return json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path, obj, *, overwrite: bool = False) -> Path:
    return write_text(path, dumps_json(obj), overwrite=overwrite)


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_with_sidecar(path, data: bytes, manifest: dict) -> dict:
    """Write `data` and `<path>.json` (its manifest, with the SHA-256 and size added); never overwrite.

    The one way artifacts that are loaded back (resume states, role states) are written, so that
    `read_verified` can check them before anything reads their content.
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
