"""Shared fixtures of the verl checks: the hand-off folder and the lab's expectations file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

HANDOFF = Path(os.environ.get("RLHF_VERL_HANDOFF", "")) if os.environ.get("RLHF_VERL_HANDOFF") else None
EXPECT = Path(os.environ.get("RLHF_VERL_EXPECT", "")) if os.environ.get("RLHF_VERL_EXPECT") else None


@pytest.fixture(scope="session")
def handoff() -> Path:
    if HANDOFF is None or not (HANDOFF / "manifest.json").is_file():
        raise RuntimeError("set RLHF_VERL_HANDOFF to a folder written by `rlhf export-verl`")
    return HANDOFF


@pytest.fixture(scope="session")
def expect() -> dict:
    if EXPECT is None or not EXPECT.is_file():
        raise RuntimeError("set RLHF_VERL_EXPECT to the expectations JSON written with rlhf")
    return json.loads(EXPECT.read_text())
