"""Resume states: lossless, gzip level 1, weights-only loading, hash-checked, never overwritten.

A state is a plain dict of tensors, numbers, strings, lists and dicts (what
`torch.load(weights_only=True)` accepts: no arbitrary pickle is ever executed). It is written
as `torch.save` bytes, gzip level 1, through the one atomic writer, with a sidecar
`<file>.json` holding its SHA-256 and its identity. Loading re-hashes the file first, so a
truncated or bit-flipped state is refused before anything reads it.

Identity: what a state was computed from (profile, corpus, code, base model, the CPU
arithmetic pin and initial fingerprints; rlhf.identities). A resume whose current identity differs
is refused with a message naming each part that changed.

Stopping on request: Ctrl-C in the `rlhf` command calls `request_stop()`; the training loops
check `stop_requested()` at their next boundary (an epoch, a PPO iteration), save a checkpoint
and raise `Interrupted`, whose message says how to continue. A study's worker processes ignore
Ctrl-C: the study asks them through a stop file (rlhf.studies.StudyPool).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from rlhf import costs
from rlhf.identities import describe_change
from rlhf.io import WRITES_IN_FLIGHT, read_verified, write_with_sidecar


class StateError(ValueError):
    """A resume state that cannot be used (corrupted, truncated, or from another identity)."""


class Interrupted(Exception):
    """A stop was requested (Ctrl-C); a checkpoint was saved at the last boundary."""


_stop = {"requested": False}


@dataclass(frozen=True)
class Leg:
    """One leg of a resumable training stage (SFT, the judge, PPO), as rlhf.lab runs it:

        state       where it starts: None from scratch, else a saved state to continue from
        stop        stop after this many epochs (SFT, judge) / iterations (PPO); None: the end
        progress    progress(step, total, history, measured) after each update and epoch (SFT,
                    judge; measured None) or iteration (PPO, after its judge refresh; measured:
                    rlhf.ppo.Measured, the iteration's seconds and reward sums): the history as
                    recorded so far
        checkpoint  checkpoint(done, make_state) after each epoch/iteration but the last, which
                    may save make_state() (rlhf.lab's crash-safe legs)
        watch       PPO only: watch(history) after each iteration (and once on a resumed
                    history); True stops PPO there (`ppo.stop_on_warning`)
        quiet       the leg only checks the run (the continuous leg the resumed one is compared
                    with): it prints no epoch, iteration or warning line, which the legs that
                    make the run have printed

    `Leg()` runs the whole stage from scratch, reporting nothing."""

    state: dict | None = None
    stop: int | None = None
    progress: Callable | None = None
    checkpoint: Callable | None = None
    watch: Callable | None = None
    quiet: bool = False


STOP_FILE = "RLHF_STOP_FILE"  # a study's worker: a stop is requested once this file exists


def request_stop() -> None:
    _stop["requested"] = True


def stop_requested() -> bool:
    """A stop was asked for: Ctrl-C in this process (request_stop), or, in a study's worker
    process, by the study (the file its environment names under STOP_FILE exists)."""
    if _stop["requested"]:
        return True
    path = os.environ.get(STOP_FILE)
    return path is not None and os.path.exists(path)


def flatten_state(state) -> dict:
    """Canonical form: every tensor (contiguous copy) under its path, the rest as sorted JSON.

    Two equal states give the same bytes (pickle memoisation of shared Python objects would
    otherwise make equal states serialise differently), so file hashes can be compared too.
    """
    tensors: dict[str, torch.Tensor] = {}

    def walk(node, path):
        if isinstance(node, torch.Tensor):
            tensors[path] = node.detach().to("cpu").contiguous().clone()
            return {"__tensor__": path}
        if isinstance(node, dict):
            # Sorted: an optimizer re-loaded from a state dict lists its keys in another order.
            items = sorted(node.items(), key=lambda kv: (str(type(kv[0])), kv[0]))
            if any(not isinstance(k, str) for k in node):
                return {"__intkeys__": [[k, walk(v, f"{path}.{k}")] for k, v in items]}
            return {k: walk(v, f"{path}.{k}") for k, v in items}
        if isinstance(node, (list, tuple)):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(node)]
        return node

    structure = walk(state, "state")
    return {"format": "rlhf-state-1", "structure": json.dumps(structure, sort_keys=True), "tensors": tensors}


def unflatten_state(flat: dict):
    if flat.get("format") != "rlhf-state-1":
        raise StateError(f"unknown state format {flat.get('format')!r}")
    tensors = flat["tensors"]

    def build(node):
        if isinstance(node, dict):
            if set(node) == {"__tensor__"}:
                return tensors[node["__tensor__"]]
            if set(node) == {"__intkeys__"}:
                return {k: build(v) for k, v in node["__intkeys__"]}
            return {k: build(v) for k, v in node.items()}
        if isinstance(node, list):
            return [build(v) for v in node]
        return node

    return build(json.loads(flat["structure"]))


def save_state(path, state: dict, identity: dict) -> dict:
    """Write a resume state atomically with its sidecar manifest; refuse to overwrite."""
    return _write_flat(path, flatten_state(state), identity)


def _write_flat(path, flat: dict, identity: dict) -> dict:
    """torch.save bytes of a flattened state, gzip level 1, through the one atomic writer."""
    buf = io.BytesIO()
    torch.save(flat, buf)
    data = gzip.compress(buf.getvalue(), compresslevel=1, mtime=0)
    manifest = write_with_sidecar(path, data, {"file": Path(path).name, "identity": identity})
    costs.count("state_saves")
    return manifest


class StateWriter:
    """Writes a leg's checkpoints in a background thread, one at a time, while training goes on.

    `save(path, state, identity)` takes the state's snapshot at once, on the caller's thread
    (flatten_state copies every tensor to the CPU and the rest to JSON text, so the training
    that follows cannot change what is written), then serialises, compresses and writes it
    (save_state's bytes, through the same atomic writer) in a thread of its own. The next
    `save` and `wait()` wait for the write in flight and raise its error, if any; the end of a
    leg calls `wait()` before its final state is written. A crash loses at most the checkpoint
    being written: its temporary file never became the checkpoint (rlhf.io), and a rerun
    continues from the one before, bit-identically.

    On a GPU this takes the compression of PPO's state (141 MB at the full Qwen width) out of
    the training loop; the time a save still had to wait is counted (rlhf.costs save_wait_s)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, path, state: dict, identity: dict) -> None:
        self.wait()
        flat = flatten_state(state)
        self._thread = threading.Thread(target=self._write, args=(path, flat, identity), name="rlhf-state-writer")
        WRITES_IN_FLIGHT.add(self._thread)
        self._thread.start()

    def _write(self, path, flat: dict, identity: dict) -> None:
        try:
            _write_flat(path, flat, identity)
        except BaseException as err:  # noqa: BLE001 - handed to the training thread at its next wait
            self._error = err
        finally:
            WRITES_IN_FLIGHT.discard(threading.current_thread())

    def wait(self) -> None:
        """Return once no write is in flight; raise the last write's error, if it failed."""
        if self._thread is not None:
            t = time.perf_counter()
            self._thread.join()
            costs.count("save_wait_s", time.perf_counter() - t)
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def abandon(self) -> None:
        """Let a write in flight finish without raising its error: the leg is ending with an
        error of its own, which is the one to report (a checkpoint that failed to write is
        swept away by the rerun)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._error = None


def load_state(path, identity: dict | None = None) -> dict:
    """Verify the hash (and identity, when given), then load with weights-only unpickling."""
    data, manifest = read_verified(path, StateError, "state")
    if identity is not None:
        check_identity(manifest["identity"], identity, what=str(path))
    try:
        raw = gzip.decompress(data)
        flat = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - any decode failure means an unusable file
        raise StateError(f"state {path} cannot be decoded: {err}") from err
    return unflatten_state(flat)


def check_identity(saved: dict, current: dict, what: str = "state") -> None:
    """Raise StateError naming every part of the identity that differs."""
    change = describe_change(saved, current)
    if change:
        raise StateError(f"refusing to resume {what}: {change}")


def assert_states_equal(a, b, path: str = "state") -> int:
    """Recursively compare two states exactly (tensors bit for bit). Returns tensors compared."""
    if isinstance(a, torch.Tensor):
        if isinstance(b, torch.Tensor) and a.device != b.device:
            # A state read from disk sits on the CPU, one still in memory may sit on CUDA: the bits
            # are what is compared, wherever they live.
            a, b = a.cpu(), b.cpu()
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            raise AssertionError(f"{path}: tensors differ")
        return 1
    if isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            raise AssertionError(
                f"{path}: keys differ ({sorted(set(a) ^ set(b))[:5] if isinstance(b, dict) else type(b)})"
            )
        return sum(assert_states_equal(a[k], b[k], f"{path}.{k}") for k in sorted(a, key=str))
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            raise AssertionError(f"{path}: lengths differ")
        return sum(assert_states_equal(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
    if a != b and not (isinstance(a, float) and isinstance(b, float) and a != a and b != b):
        raise AssertionError(f"{path}: {a!r} != {b!r}")
    return 0
