"""Cleanup: the policy as a table, the storage listings it reads on local disk and moto's S3,
and the survey that joins them with what Batch (the emulator) says."""

import time

import pytest
import s3server

from batchfutures import cleanup
from batchfutures.cleanup import JobState, decide
from batchfutures.errors import ConfigurationError

DAY = 86400.0
aws_env = s3server.aws_env  # the fixture s3_root needs (conftest shares the others)


# -- the policy ----------------------------------------------------------------------------------
A, E, U, S = JobState.ACTIVE, JobState.ENDED, JobState.UNKNOWN, JobState.UNSUBMITTED


@pytest.mark.parametrize("states, age, horizon, all_finished, removed", [
    ([A], 30 * DAY, DAY, True, False),  # in progress: never, not even --all or very old
    ([E, A], 30 * DAY, DAY, True, False),
    ([E, E], 2 * DAY, DAY, False, True),  # finished and older than the horizon
    ([E], 0.5 * DAY, DAY, False, False),  # finished but recent
    ([E], 60.0, DAY, True, True),  # --all: every finished run
    ([E], None, DAY, False, False),  # no time known: only --all removes it
    ([E], None, DAY, True, True),
    ([U], 2 * DAY, DAY, False, True),  # Batch forgot it and it is old
    ([U], 60.0, DAY, True, False),  # Batch does not know it yet: --all does not touch it
    ([E, U], 0.5 * DAY, DAY, True, False),
    ([S], 60.0, 0.0, True, False),  # a payload being submitted right now, even with horizon 0
    ([S], 2 * 3600.0, 0.0, False, True),
    ([], 2 * DAY, DAY, False, True),  # nothing recorded, old
    ([], 60.0, DAY, True, False),
    ([U], None, DAY, True, False),
])
def test_cleanup_policy(states, age, horizon, all_finished, removed):
    decision = decide(states, age, horizon, all_finished=all_finished)
    assert decision.remove is removed, decision.reason
    assert decision.reason


@pytest.mark.parametrize("value, seconds", [
    (None, 7 * DAY), ("", 7 * DAY), ("1", DAY), ("0.5", DAY / 2), ("0", 0.0), ("off", None),
    ("never", None),
])
def test_local_retention_from_the_environment(value, seconds):
    environ = {} if value is None else {cleanup.RETENTION_VARIABLE: value}
    assert cleanup.local_retention_seconds(environ) == seconds


@pytest.mark.parametrize("value", ["-1", "week", "nan"])
def test_local_retention_refuses_nonsense_by_its_variable_name(value):
    with pytest.raises(ConfigurationError, match="BATCHFUTURES_LOCAL_RETENTION_DAYS"):
        cleanup.local_retention_seconds({cleanup.RETENTION_VARIABLE: value})



# -- the storage side ----------------------------------------------------------------------------
def make_run(storage, run_id, job_ids):
    """A run with one inputs object per job; a job id None leaves its payload without pointer."""
    for key, job_id in job_ids.items():
        job_url = storage.job_url(run_id, key)
        storage.put_bytes(storage.inputs_url(job_url), b"inputs")
        if job_id is not None:
            storage.write_job_pointer(job_id, job_url)


def test_storage_lists_job_pointers_and_removes_them_with_their_run(storage):
    make_run(storage, "run-a", {"k1": "job-1", "k2": "job-2"})
    make_run(storage, "run-b", {"k3": "job-3"})
    pointers = dict(storage.list_job_pointers())
    assert sorted(pointers) == ["job-1", "job-2", "job-3"]
    assert all(written and abs(written - time.time()) < DAY for written in pointers.values())
    assert storage.run_job_keys("run-a") == ["k1", "k2"] and storage.run_job_keys("nope") == []
    assert storage.split_job_url(storage.job_url("run-a", "k1")) == ("run-a", "k1")
    assert storage.split_job_url("s3://elsewhere/runs/x/jobs/y") is None
    storage.delete_run("run-a", ["job-1", "job-2"])
    assert [run for run, _ in storage.list_runs()] == ["run-b"]
    assert [job for job, _ in storage.list_job_pointers()] == ["job-3"]
    with pytest.raises(ValueError):
        storage.delete_job_pointer("../x")


FORGOTTEN, SUBMITTING = "20240101T000000-000000000a", "20240101T000000-000000000b"  # run-id shape


def test_survey_keeps_what_batch_cannot_vouch_for_until_it_is_old(storage, local_env):
    make_run(storage, FORGOTTEN, {"k1": "0b7c-unknown-to-batch"})
    make_run(storage, SUBMITTING, {"k2": None})
    batch = local_env.batch

    def decisions(**kwargs):
        return {r.run_id: r.decision.remove for r in cleanup.survey(storage, batch, **kwargs)}

    assert decisions(horizon_seconds=DAY, all_finished=True) == {FORGOTTEN: False,
                                                                 SUBMITTING: False}
    later = time.time() + 2 * DAY
    assert decisions(horizon_seconds=DAY, now=later) == {FORGOTTEN: True, SUBMITTING: True}
    reports = cleanup.survey(storage, batch, horizon_seconds=DAY, now=later)
    assert [r.states for r in reports] == [[JobState.UNKNOWN], [JobState.UNSUBMITTED]]
    assert sorted(cleanup.remove(storage, reports)) == [FORGOTTEN, SUBMITTING]
    assert storage.list_runs() == [] and storage.list_job_pointers() == []
