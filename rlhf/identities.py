"""Run identity: what a run, a stage's state and a study are computed from, and how two differ.

An identity is a flat dict of parts (name -> short value, mostly SHA-256 hex). The parts:

    config       profile_hash of the profile (rlhf.config)
    corpus       SHA-256 of the corpus manifest.json
    code         `code_sha256()`: the package's source files and profiles (a study's record also
                 keeps `git_commit()`, the commit they were checked out at, where there is one)
    base_model   `base_model_sha256(files)`: the base model directory's file hashes
                 (rlhf.models.directory_identity), as one hash
    arithmetic   rlhf.runtime.identity_tag(): pinned or not, on which machine kind and thread count
    dtype        the dtype the base computes in (rlhf.models.compute_dtype; a run and its stages)
    real_tokens  the tokenizer's size: the ids that may be sampled and scored (rlhf.scoring;
                 a run and its stages)

A stage's state adds its revision and stage inputs (`identity_of`); run.json adds the profile
name and revision (`run_identity`); a study has its own parts (rlhf.studies.seeds). Whatever
refuses a mismatch names the parts that changed with `describe_change`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from rlhf import runtime
from rlhf.io import dumps_json, sha256_bytes, sha256_file

CODE_DIR = Path(__file__).parent


def code_sha256() -> str:
    """SHA-256 over the package's source files (subpackages included) and profiles (name + content, sorted)."""
    parts = []
    for p in sorted(list(CODE_DIR.rglob("*.py")) + list((CODE_DIR / "profiles").glob("*.toml"))):
        parts.append(f"{p.relative_to(CODE_DIR)}:{sha256_file(p)}")
    return sha256_bytes("\n".join(parts).encode())


def git_commit() -> str | None:
    """The commit (git HEAD) of the checkout the package runs from; None where there is none (an
    installed package, no git): only a repository whose top level holds this package counts."""
    root = CODE_DIR.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != root.resolve():
        return None
    return lines[1]


def base_model_sha256(files: dict) -> str:
    """One hash of a base model directory's file hashes ({name: SHA-256}, directory_identity)."""
    return sha256_bytes(dumps_json(files).encode())


def identity_of(profile_sha256: str, corpus_sha256: str, base_identity: dict, extra: dict | None = None) -> dict:
    """The identity parts of a learning stage: config, corpus, code, base model, arithmetic
    (rlhf.runtime: pinned or not, on which machine kind and thread count) (+ stage inputs)."""
    ident = {
        "config": profile_sha256,
        "corpus": corpus_sha256,
        "code": code_sha256(),
        "base_model": base_model_sha256(base_identity.get("files", base_identity)),
        "arithmetic": runtime.identity_tag(),
    }
    ident.update(extra or {})
    return ident


def run_identity(
    profile_name: str,
    profile_sha256: str,
    revision: str,
    corpus_sha256: str,
    base_files: dict,
    dtype: str,
    real_tokens: int,
) -> dict:
    """What a run is (run.json): a rerun in the same folder must match every part."""
    return {
        "profile": profile_name,
        "config": profile_sha256,
        "revision": revision,
        "corpus": corpus_sha256,
        "code": code_sha256(),
        "base_model": base_model_sha256(base_files),
        "arithmetic": runtime.identity_tag(),
        "dtype": dtype,
        "real_tokens": real_tokens,
    }


def changed_parts(old: dict, new: dict) -> list[str]:
    """The keys whose values differ between two dicts (a key missing on one side differs), sorted."""
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def describe_change(old: dict, new: dict, width: int = 40) -> str | None:
    """`identity changed in a, b (a was X, now Y; b was ...)`, each value cut to `width`
    characters; None when the identities are equal."""
    changed = changed_parts(old, new)
    if not changed:
        return None
    detail = "; ".join(f"{k} was {str(old.get(k))[:width]}, now {str(new.get(k))[:width]}" for k in changed)
    return f"identity changed in {', '.join(changed)} ({detail})"


def profile_changes(old: dict, new: dict) -> list[str]:
    """The profile keys whose values differ between two profiles' plain data (Profile.to_dict),
    as '[table] key: old -> new' (a top-level key without a table), in table order; compared as
    JSON holds them (a tuple read back from run.json is a list)."""
    old, new = json.loads(json.dumps(old)), json.loads(json.dumps(new))
    out = []
    for table in dict.fromkeys([*old, *new]):
        a, b = old.get(table), new.get(table)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [
                f"[{table}] {k}: {a.get(k)!r} -> {b.get(k)!r}" for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)
            ]
        elif a != b:
            out.append(f"{table}: {a!r} -> {b!r}")
    return out
