"""The studies' worker pool: a task runs in the study process's environment, and a server that
imported the lab under another CPU pin or crash point is never used."""

from __future__ import annotations

import os

import pytest

import rlhf.studies as studies

pytestmark = pytest.mark.unit


def _environment_of_task(keys: tuple[str, ...]) -> dict:
    return {k: os.environ.get(k) for k in keys}


def test_a_task_sees_the_environment_of_the_study_process_when_it_was_queued(monkeypatch):
    monkeypatch.setattr(studies, "PRELOAD", [])  # the server's imports do not matter here
    monkeypatch.setattr(studies, "_server_environment", None)
    with studies.worker_pool(1) as pool:
        assert pool._mp_context.get_start_method() == "forkserver"
        first = pool.submit(_environment_of_task, ("RLHF_POOL_PROBE",)).result()
    monkeypatch.setenv("RLHF_POOL_PROBE", "set after the server started")
    with studies.worker_pool(1) as pool:
        assert pool._mp_context.get_start_method() == "forkserver"
        second = pool.submit(_environment_of_task, ("RLHF_POOL_PROBE",)).result()
    assert first == {"RLHF_POOL_PROBE": None}
    assert second == {"RLHF_POOL_PROBE": "set after the server started"}


@pytest.mark.parametrize("key", studies.IMPORT_TIME_ENVIRONMENT)
def test_a_server_that_imported_the_lab_under_other_import_time_values_is_not_used(monkeypatch, key):
    """rlhf.io reads the crash point and torch the pin when they are imported: a pool whose
    process now has other values than the server had starts its tasks fresh (spawn)."""
    server = {k: os.environ.get(k) for k in studies.IMPORT_TIME_ENVIRONMENT}
    monkeypatch.setattr(studies, "_server_environment", server)
    with studies.worker_pool(1) as pool:
        assert pool._mp_context.get_start_method() == "forkserver"
    monkeypatch.setenv(key, "another value")
    with studies.worker_pool(1) as pool:
        assert pool._mp_context.get_start_method() == "spawn"
    assert studies._server_environment == server  # the server's record is kept, not replaced
