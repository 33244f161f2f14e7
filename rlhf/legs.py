"""A stage's continuous leg in a process of its own, beside the interrupted and resumed legs.

The continuous leg depends on nothing the other two make (it starts from scratch with the same
seeds), so on a machine with a second core it runs in a second process while this one runs the
interrupted and resumed legs; each process keeps the pinned single-threaded arithmetic, so the
bytes are those of the legs run one after the other. The other process writes only the
continuous leg's files (its checkpoints and state-continuous.pt.gz, crash-safe as any leg's)
and, last, what it measured (continuous-leg.json: seconds, clock and timings); a crash or Ctrl-C
in either process leaves a run that a rerun of the same command continues.

`LEGS`: `side-by-side` where the machine has a second core, else `sequential`; the environment
variable RLHF_LEGS=sequential (the test tier sets it: its workers already fill the cores) or
`--legs sequential` asks for one leg after the other."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from pathlib import Path

from rlhf.io import read_json, write_json  # torch-free: the command line's help reads LEGS

SIDE_BY_SIDE, SEQUENTIAL = "side-by-side", "sequential"
LEGS = (SIDE_BY_SIDE, SEQUENTIAL)
RESULT_FILE = "continuous-leg.json"  # in the stage's folder: what the other process measured
INTERRUPTED = 130  # the other process's exit status after Ctrl-C (as `rlhf` exits)


def default_legs() -> str:
    """Side by side with a second core, unless RLHF_LEGS=sequential; else sequential."""
    if os.environ.get("RLHF_LEGS") == SEQUENTIAL or (os.cpu_count() or 1) < 2:
        return SEQUENTIAL
    return SIDE_BY_SIDE


def _child(target, args: tuple, result: str) -> None:
    """The other process: Ctrl-C asks for a stop at the next boundary (as in `rlhf`); the leg's
    measurements are written last, so a result file means the leg is complete."""
    from rlhf.checkpoint import Interrupted, request_stop

    sys.stdout = open(os.devnull, "w")  # this process runs quiet: the stage says the leg once, when it is done
    signal.signal(signal.SIGINT, lambda *_: request_stop())
    try:
        measured = target(*args)
    except Interrupted as stop:
        print(f"continuous leg: {stop}", file=sys.stderr, flush=True)
        sys.exit(INTERRUPTED)
    write_json(Path(result), measured, overwrite=True)


class Beside:
    """One leg in a process of its own: `start()`, then `wait()` for what it measured. The
    process is a child of this one: it ends with it."""

    def __init__(self, folder: Path, target, args: tuple):
        self.result = Path(folder) / RESULT_FILE
        # spawn: a fresh interpreter (no copy of this process's threads or torch state), which
        # pins its arithmetic as it imports rlhf, as this process did
        self.process = multiprocessing.get_context("spawn").Process(
            target=_child, args=(target, args, str(self.result)), daemon=True
        )

    def start(self) -> Beside:
        self.result.unlink(missing_ok=True)
        self.process.start()
        return self

    def wait(self) -> dict:
        """The other leg's measurements once its process ends; its failure raised here, naming
        what to do (the run continues when the command is rerun)."""
        from rlhf.checkpoint import Interrupted

        self.process.join()
        code = self.process.exitcode
        if code == INTERRUPTED:
            raise Interrupted("the continuous leg stopped on request; run the same command again to continue")
        if code != 0 or not self.result.is_file():
            raise RuntimeError(
                f"the continuous leg's process ended with status {code} before finishing: run the same command "
                "again to continue (its checkpoints are kept), or add --legs sequential to run it in this process"
            )
        return read_json(self.result)
