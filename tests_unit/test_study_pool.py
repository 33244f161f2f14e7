"""Ctrl-C in a study that runs its seeds over worker processes (rlhf.studies.StudyPool): the
terminal's SIGINT does not kill a worker mid-step; the study passes the stop on, each running task
stops at its next boundary, no queued task starts, and what stopped is told apart from what failed."""

import os
import signal
import time

import pytest
from pool_tasks import fail, wait_for_stop

pytestmark = pytest.mark.unit


@pytest.fixture
def clear_stop():
    from rlhf import checkpoint

    yield
    checkpoint._stop["requested"] = False


def _drain(pool, pending: set) -> None:
    deadline = time.monotonic() + 120
    while pending and time.monotonic() < deadline:
        pending -= pool.wait(pending)
    assert not pending, "the pool's tasks did not end"


def test_ctrl_c_stops_running_tasks_at_a_boundary_and_starts_no_queued_one(tmp_path, clear_stop):
    from rlhf.checkpoint import request_stop
    from rlhf.studies import outcome, worker_pool

    started = tmp_path / "started"
    with worker_pool(1) as pool:
        running = pool.submit(wait_for_stop, str(started))
        queued = pool.submit(wait_for_stop, str(tmp_path / "never"))
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(int(started.read_text()), signal.SIGINT)  # the terminal sends Ctrl-C to the workers too
        time.sleep(1.0)
        assert not running.done(), "the worker died of the terminal's Ctrl-C"
        assert not pool.stopping
        request_stop()  # what the study's own Ctrl-C handler does (rlhf.cli)
        _drain(pool, {running, queued})
        assert pool.stopping
    assert outcome(running) == "stopped" and outcome(queued) == "stopped"
    assert not (tmp_path / "never").exists()  # the queued task never began
    assert not pool.stop_file.parent.exists(), "the stop file's temporary folder outlived the pool"


def test_a_task_that_fails_is_named_with_its_error_and_no_stop_is_made(tmp_path, clear_stop):
    from rlhf.studies import outcome, worker_pool

    with worker_pool(1) as pool:
        fut = pool.submit(fail, "the judge's file is missing")
        _drain(pool, {fut})
        assert not pool.stopping and pool.stop_file.parent.is_dir()
    assert outcome(fut) == "ValueError: the judge's file is missing"
    assert not pool.stop_file.parent.exists(), "the stop file's temporary folder outlived the pool"
