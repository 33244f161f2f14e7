"""Studies over whole lab runs (docs/studies.md), one concern per module:

    seeds           `rlhf seeds`: running a multi-seed study; its rows, invariants and seeds.json
    derivation      what a study run changes in its profile: the training seeds of run i
    statistics      the across-seed statistics (mean, SD, Student-t interval, sign test, exact
                    sign-flip p, the power rule's seed count)
    changed_answer  the per-token view of a held-out answer that PPO changed
    sft_budget      `rlhf choose-sft-budget`: the SFT budget where PPO has room to help (SFT success
                    in a band, the oracle control's gain), chosen on validation prompts only
    testbed         `rlhf choose-testbed`: the SFT recipe that is stable across seeds and leaves the
                    oracle control room, chosen on validation prompts only
    room            `rlhf confirm-oracle`: the testbed's room on test (the oracle against SFT)
    choice          `rlhf choose-design`: a design chosen on some validation seeds, estimated on others
    heldout         declared comparisons read on test on fresh seeds (what room, verdict, nested use)
    verdict         `rlhf confirm-design`: the answer on test, comparisons and seeds declared first
    nested          `rlhf nested`: PPO seeds nested in pipeline seeds, variance split by source
    compare_methods `rlhf compare-methods`, `rlhf confirm-methods`: DPO and GRPO beside PPO
    validation      measurements on validation prompts only (what the SFT budget and the frontier read)
    frontier/       `rlhf frontier`: the over-optimisation frontier, one module per concern (its docstring)
    warnings        over-optimisation warning rules chosen on one frontier study, scored on any
    base            `rlhf base-study`: can the embedded base carry the lab?
    record          a study's arguments checked before anything is written; its study.json
    reproduce       `rlhf reproduce`: one seed of a committed study recomputed and compared

A study's page is written by rlhf.report.study, a run profile's TOML by rlhf.config.profile_text_with.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import tempfile
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

# What a process reads from its environment when the lab is imported (the CPU pin before torch
# loads, the crash-injection point of rlhf.io): a server that imported the lab under other values
# cannot serve a task that needs these.
IMPORT_TIME_ENVIRONMENT = (
    "ATEN_CPU_CAPABILITY",
    "MKL_CBWR",
    "ONEDNN_MAX_CPU_ISA",
    "RLHF_CPU_PIN",
    "RLHF_CRASH_AT",
)
PRELOAD = ["rlhf.lab", "rlhf.studies.frontier.measure", "rlhf.studies.seeds"]
_server_environment: dict | None = None  # IMPORT_TIME_ENVIRONMENT as the fork server imported the lab


def log_to(path: Path, stack: contextlib.ExitStack) -> None:
    """A worker's output (stdout and stderr) appended to the run's log file for `stack`'s extent."""
    f = stack.enter_context(open(path, "a", buffering=1))
    stack.enter_context(contextlib.redirect_stdout(f))
    stack.enter_context(contextlib.redirect_stderr(f))


class StudyPool(ProcessPoolExecutor):
    """A study's worker processes, which Ctrl-C reaches through the study, not the terminal.

    The workers ignore SIGINT. Ctrl-C in the study's process requests a stop there
    (rlhf.checkpoint.request_stop); at its next `wait` the pool creates its stop file, which the
    workers' training loops see at their next boundary (rlhf.checkpoint.stop_requested): each
    saves a checkpoint and stops with rlhf.checkpoint.Interrupted. The tasks not yet started are
    cancelled and no new one is queued (`stopping`). A second Ctrl-C leaves the `with` block at
    once and ends the workers."""

    def __init__(self, workers: int, mp_context, environment: dict):
        from rlhf.checkpoint import STOP_FILE

        self.stop_file = Path(tempfile.mkdtemp(prefix="rlhf-study-")) / "stop"
        environment = {**environment, STOP_FILE: str(self.stop_file)}
        super().__init__(max_workers=workers, mp_context=mp_context, max_tasks_per_child=1,
                         initializer=_start_worker, initargs=(environment,))  # fmt: skip

    def submit(self, fn, /, *args, **kwargs) -> Future:
        """`fn(*args, **kwargs)` in a worker, unless a stop was requested before it starts (the
        executor hands a task to a worker before the previous one ends: cancelling cannot catch it)."""
        return super().submit(_unless_stopped, fn, args, kwargs)

    @property
    def stopping(self) -> bool:
        return self.stop_file.exists()

    def wait(self, pending, timeout: float = 1.0) -> set[Future]:
        """The tasks of `pending` finished within `timeout` seconds (cancelled ones included),
        after passing a stop requested here on to the workers."""
        from rlhf.checkpoint import stop_requested

        if stop_requested() and not self.stopping:
            self.stop_file.touch()
            for fut in pending:
                fut.cancel()  # a task not yet started; a running one stops at its next checkpoint
        done, _ = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
        return done

    def __exit__(self, exc_type, exc, tb):
        if exc_type is KeyboardInterrupt:  # the second Ctrl-C: now
            for process in list(getattr(self, "_processes", {}).values()):
                process.kill()
            self.shutdown(wait=False, cancel_futures=True)
            return False  # the stop file stays: a task handed on before the kill must still see it
        ended = super().__exit__(exc_type, exc, tb)  # waits for every worker
        shutil.rmtree(self.stop_file.parent, ignore_errors=True)  # no process reads it any more
        return ended


def _unless_stopped(fn, args: tuple, kwargs: dict):
    from rlhf.checkpoint import Interrupted, stop_requested

    if stop_requested():
        raise Interrupted("not started: the study was asked to stop")
    return fn(*args, **kwargs)


def outcome(fut: Future) -> str | None:
    """None for a task that finished; "stopped" for one cancelled or stopped at a checkpoint on
    request; else its error, named."""
    from rlhf.checkpoint import Interrupted

    if fut.cancelled():
        return "stopped"
    err = fut.exception()
    if err is None:
        return None
    if isinstance(err, Interrupted):
        return "stopped"
    return f"{type(err).__name__}: {err}"


def stopped_error(what: str) -> Exception:
    from rlhf.checkpoint import Interrupted

    return Interrupted(
        f"stopped on request: {what} saved a checkpoint or had not started. Run the same command again to continue"
    )


def worker_pool(workers: int) -> StudyPool:
    """`workers` processes for a study's runs, each running one task and exiting (nothing passes
    from one run to the next), in this process's environment. They fork from a server that has
    imported the lab once (multiprocessing's forkserver, preloaded), so a task starts without
    importing torch and transformers again (about 4 s each); where the server imported it under
    other IMPORT_TIME_ENVIRONMENT values than this process has now, they start fresh (spawn)."""
    global _server_environment
    now = {k: os.environ.get(k) for k in IMPORT_TIME_ENVIRONMENT}
    ctx: multiprocessing.context.BaseContext
    if _server_environment in (None, now):
        _server_environment = now
        server = multiprocessing.get_context("forkserver")
        server.set_forkserver_preload(PRELOAD)
        ctx = server
    else:
        ctx = multiprocessing.get_context("spawn")
    return StudyPool(workers, ctx, dict(os.environ))


def _start_worker(environment: dict) -> None:
    """A forked task's environment is the study process's when it queued the task (not the
    server's from when the server started), with the pool's stop file; Ctrl-C is the study's."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(environment)


class StudyError(ValueError):
    """A study folder or its arguments are not what the study needs."""
