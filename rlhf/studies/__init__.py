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
    validation      measurements on validation prompts only (what the SFT budget and the frontier read)
    frontier/       `rlhf frontier`: the over-optimisation frontier, one module per concern (its docstring)
    warnings        over-optimisation warning rules chosen on one frontier study, scored on any
    base            `rlhf base-study`: can the embedded base carry the lab?
    record          a study's arguments checked before anything is written; its study.json
    reproduce       `rlhf reproduce`: one seed of a committed seed study recomputed and compared

A study's page is written by rlhf.report.study, a run profile's TOML by rlhf.config.profile_text_with.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
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


def worker_pool(workers: int) -> ProcessPoolExecutor:
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
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=ctx,
        max_tasks_per_child=1,
        initializer=_take_environment,
        initargs=(dict(os.environ),),
    )


def _take_environment(environment: dict) -> None:
    """A forked task's environment is the study process's when it queued the task, not the
    server's from when the server started."""
    os.environ.clear()
    os.environ.update(environment)


class StudyError(ValueError):
    """A study folder or its arguments are not what the study needs."""
