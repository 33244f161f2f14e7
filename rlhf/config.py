"""Profiles are plain TOML files (rlhf/profiles/*.toml) read into plain dicts."""
from __future__ import annotations

import tomllib
from pathlib import Path

from rlhf.io import dumps_json, sha256_text

PROFILE_DIR = Path(__file__).parent / "profiles"
PROFILES = ("embedded", "qwen2.5-0.5b")
DEFAULT_PROFILE = "embedded"


def load_profile(name_or_path: str = DEFAULT_PROFILE) -> dict:
    """Read a profile by name (`embedded`, `qwen2.5-0.5b`) or by path to a TOML file."""
    path = Path(name_or_path)
    if name_or_path in PROFILES:
        path = PROFILE_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise FileNotFoundError(f"unknown profile {name_or_path!r}: no file {path} "
                                f"(known profiles: {', '.join(PROFILES)})")
    with open(path, "rb") as f:
        profile = tomllib.load(f)
    return profile


def profile_hash(profile: dict) -> str:
    """SHA-256 of the profile's canonical JSON: the identity of a configuration."""
    return sha256_text(dumps_json(profile))


def configure_torch(profile: dict) -> None:
    """Apply the profile's runtime settings (thread count) and the global torch seed."""
    import torch
    threads = profile.get("runtime", {}).get("torch_threads", 0)
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(profile["seeds"]["torch"])
