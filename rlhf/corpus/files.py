"""The corpus on disk: its file layout, `prepare` (build, audit, write atomically; an existing
folder is never changed) and `load_corpus` (every file re-hashed against the manifest, the audit
run again)."""

from __future__ import annotations

import json
from pathlib import Path

from rlhf.corpus.build import build_corpus
from rlhf.corpus.design import (
    CONTENT_SHA256_DEFINITION,
    DEFAULT_REVISION,
    LOCATIONS,
    POPULATIONS,
    SPLITS,
    AuditError,
    CorpusExistsError,
    CorpusIntegrityError,
    get_revision,
)
from rlhf.corpus.invariants import audit
from rlhf.corpus.views import Corpus, preference_rows
from rlhf.io import atomic_folder, read_json, sha256_bytes, sha256_file, write_bytes, write_json


def _rel(part: str, pop: str, split: str) -> str:
    return f"{part}/{pop}/{split}.jsonl"


def _export_rel(split: str) -> str:
    return f"exports/preference_pairs/{split}.jsonl"


def layout(revision: str = DEFAULT_REVISION) -> list[str]:
    """Relative paths of every records file `prepare` writes (manifest.json aside)."""
    get_revision(revision)
    return [_rel(part, p, s) for part in ("inputs", "labels") for p, s in LOCATIONS] + [_export_rel(s) for s in SPLITS]


def _jsonl(records) -> bytes:
    return "".join(
        json.dumps(r, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records
    ).encode("utf-8")


def _files_of(corpus: dict) -> dict[str, bytes]:
    files = {}
    for part in ("inputs", "labels"):
        for pop, split in LOCATIONS:
            files[_rel(part, pop, split)] = _jsonl(corpus[part][pop][split])
    for split in SPLITS:
        files[_export_rel(split)] = _jsonl(preference_rows(corpus["inputs"]["pair"][split]))
    return files


def prepare(out_dir, revision: str = DEFAULT_REVISION) -> dict:
    """Build, audit and write the corpus into an empty or new `out_dir`; return the manifest."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CorpusExistsError(
            f"refusing to prepare a corpus into {out}: it exists and is not an "
            f"empty folder (an existing corpus is never overwritten)"
        )
    corpus = build_corpus(revision)
    summary = audit(corpus)
    files = _files_of(corpus)
    manifest = {
        "audit": summary,
        "families": corpus["families"],
        "probe_families": corpus["probe_families"],
        "content_sha256": CONTENT_SHA256_DEFINITION,
        "files": {rel: sha256_bytes(data) for rel, data in files.items()},
    }
    with atomic_folder(out) as tmp:  # a crash never leaves a half-written corpus at `out`
        for rel, data in files.items():
            write_bytes(tmp / rel, data)
        write_json(tmp / "manifest.json", manifest)
    load_corpus(out)  # read back what was written: hashes and audit
    return manifest


def _read_jsonl(path: Path, rel: str) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusIntegrityError(f"{rel} line {n}: not JSON ({e})") from None
            if not isinstance(rec, dict):
                raise CorpusIntegrityError(f"{rel} line {n}: not a JSON object")
            out.append(rec)
    return out


def load_corpus(directory) -> "Corpus":
    """Verify every file against the manifest, parse, re-run the audit; return a Corpus."""
    root = Path(directory)
    mpath = root / "manifest.json"
    if not mpath.is_file():
        raise CorpusIntegrityError(f"{root} has no manifest.json (not a corpus, or incomplete)")
    manifest = read_json(mpath)
    try:
        revision = manifest["audit"]["revision"]
        listed = dict(manifest["files"])
    except (KeyError, TypeError):
        raise CorpusIntegrityError(f"{mpath}: manifest lacks audit.revision or files") from None
    expected = set(layout(revision))
    if set(listed) != expected:
        raise CorpusIntegrityError(
            f"{mpath}: manifest lists {sorted(set(listed) ^ expected)} against the {revision} layout"
        )
    present = {
        p.relative_to(root).as_posix() for p in root.rglob("*") if (p.is_file() or p.is_symlink()) and p != mpath
    }
    for rel in sorted(expected - present):
        raise CorpusIntegrityError(f"corpus file {rel} is missing from {root}")
    for rel in sorted(present - expected):
        raise CorpusIntegrityError(f"unexpected file {rel} in corpus {root}")
    for rel in sorted(expected):
        if (root / rel).is_symlink():
            raise CorpusIntegrityError(f"corpus file {rel} is a symbolic link")
        actual = sha256_file(root / rel)
        if actual != listed[rel]:
            raise CorpusIntegrityError(
                f"corpus file {rel} does not match its manifest hash (expected {listed[rel]}, found {actual})"
            )
    rev = get_revision(revision)
    data = {
        "dataset": manifest["audit"].get("dataset"),
        "revision": revision,
        "seed": manifest["audit"].get("seed"),
        "families": manifest.get("families"),
        "probe_families": manifest.get("probe_families"),
        "inputs": {p: {} for p in POPULATIONS},
        "labels": {p: {} for p in POPULATIONS},
    }
    for part in ("inputs", "labels"):
        for pop, split in LOCATIONS:
            data[part][pop][split] = _read_jsonl(root / _rel(part, pop, split), _rel(part, pop, split))
    try:
        summary = audit(data)
    except AuditError as e:
        raise AuditError(f"corpus {root} failed its audit: {e}") from e
    for split in SPLITS:
        rel = _export_rel(split)
        if _read_jsonl(root / rel, rel) != preference_rows(data["inputs"]["pair"][split]):
            raise AuditError(f"corpus {root}: {rel} differs from the {split} pair inputs")
    if manifest["audit"] != summary:
        raise AuditError(f"corpus {root}: manifest audit {manifest['audit']} differs from the recomputed {summary}")
    assert rev.name == summary["revision"]
    return Corpus(data, root=root, manifest=manifest, _summary=summary)
