"""Counts of what a stage pays beyond its arithmetic: fixed costs no GPU speeds up, and launches.

    base_loads    frozen bases read from the model folder (`from_pretrained` and the move to the
                  device): one per process and base (rlhf.models.load_base keeps it)
    role_builds   roles made: each a copy of the loaded base with its own adapters and head
                  (rlhf.roles.new_role)
    base_hashes   SHA-256 passes over a frozen base (rlhf.roles.fingerprint): one per base and
                  process; a copy proves itself equal to the base it was copied from, tensor by
                  tensor, instead of hashing its bytes again
    state_saves   resume states written (rlhf.checkpoint); checkpoints in a background thread
    save_wait_s   seconds a training thread waited for a background save to finish
    decode_steps  cached decode steps (a drawn token after the first, rlhf.generate)
    graph_captures, graph_replays   CUDA graphs of a decode step captured, and replayed (one
                  replay per decode step where they apply: rlhf.generate.GraphedDecoder)

A stage records what it paid (`since(snapshot())`) in its timings.json, so that the cost model
of a run (docs/gpu-cost.md, the dry run's projection) is checked against counts, not guessed.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_COUNTS: defaultdict[str, float] = defaultdict(float)
NAMES = (
    "base_loads",
    "role_builds",
    "base_hashes",
    "state_saves",
    "save_wait_s",
    "decode_steps",
    "graph_captures",
    "graph_replays",
)


def count(name: str, amount: float = 1) -> None:
    """Add `amount` to the process's count `name` (one of NAMES)."""
    if name not in NAMES:
        raise ValueError(f"unknown fixed cost {name!r}; known: {', '.join(NAMES)}")
    _COUNTS[name] += amount


def snapshot() -> dict[str, float]:
    """The process's counts so far, every name present."""
    return {name: _COUNTS[name] for name in NAMES}


def since(start: dict[str, float]) -> dict[str, float]:
    """What was paid since `start` (a snapshot): counts as ints, seconds rounded to the ms."""
    now = snapshot()
    return {
        name: round(now[name] - start[name], 3) if name.endswith("_s") else int(now[name] - start[name])
        for name in NAMES
    }


@contextmanager
def phase(seconds: dict, name: str, sync: Callable[[], None] | None = None) -> Iterator[None]:
    """The block's wall seconds recorded as seconds[name], once `sync()` has returned (on a
    GPU: the device's queued kernels finished, so each phase is charged its own work). The
    block's calls stay where they are, visible in the code that makes them."""
    t = time.perf_counter()
    yield
    if sync is not None:
        sync()
    seconds[name] = time.perf_counter() - t
