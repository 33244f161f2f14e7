"""Tasks for tests_unit/test_study_pool.py, importable by a study pool's worker processes."""

import os
import time
from pathlib import Path


def wait_for_stop(started: str, seconds: float = 120.0) -> str:
    """Say it started (its pid in `started`), then poll for a stop as a training loop does at its
    boundaries: stop with rlhf.checkpoint.Interrupted when asked, else finish after `seconds`."""
    from rlhf.checkpoint import Interrupted, stop_requested

    Path(started).write_text(str(os.getpid()))
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if stop_requested():
            raise Interrupted("stopped at a boundary")
        time.sleep(0.05)
    return "finished"


def fail(message: str) -> None:
    raise ValueError(message)
