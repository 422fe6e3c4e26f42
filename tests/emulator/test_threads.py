"""launcher="threads" (threads.py): the worker's code in threads of the emulator's process, with
the same storage reads and writes, lifecycle and records; chosen explicitly, never by
LocalEnvironment. Real emulators, real storage, the real executor."""

from __future__ import annotations

import logging
import os
import threading
import uuid
from typing import Any, Tuple

import pytest
from emulator_harness import QUEUE, Harness, wait_until

from batchfutures import BatchExecutor, LocalEnvironment, serialization, signing, wire
from batchfutures.emulator import BatchEmulator
from batchfutures.emulator.jobstate import TIMEOUT_REASON
from batchfutures.emulator.service import Launcher
from batchfutures.errors import JobFailedError
from batchfutures.storage import Storage

MAX_VCPUS = 8


class ThreadEnvironment(LocalEnvironment):
    """A LocalEnvironment whose emulator runs attempts as threads: opted into here, by the test."""

    def __init__(self, workdir: Any) -> None:
        super().__init__(workdir, max_vcpus=MAX_VCPUS)
        self._emulator = BatchEmulator(self.workdir / "emulator", launcher="threads",
                                       max_vcpus=MAX_VCPUS)


@pytest.fixture
def thread_env(tmp_path):
    env = ThreadEnvironment(tmp_path / "work")
    yield env
    env.emulator.close()


@pytest.fixture
def temu(make_emulator) -> Harness:
    return make_emulator(launcher="threads", max_vcpus=4)


def worker_job(emu: Harness, tmp_path: Any, fn: Any, *args: Any,
               **params: Any) -> Tuple[str, str, Storage]:
    """One worker job of one item, its inputs written as the executor writes them."""
    signer = signing.Signer.from_key_file(tmp_path / "signing.key", create=True)
    storage = Storage((tmp_path / "storage").as_uri(), signer=signer)
    run_id, key = "run-" + uuid.uuid4().hex[:8], uuid.uuid4().hex
    url = storage.job_url(run_id, key)
    header = {"functions": [storage.put_function(run_id, serialization.dumps(fn, by_value=True))],
              "items": 1, "chunksize": 1, "run_id": run_id, "job_key": key,
              **serialization.payload_stamp()}
    storage.write_inputs(url, header, [wire.pack_items([(0, args, {})], by_value=True)])
    job_id = emu.job(["python", "-m", "batchfutures.worker", url], memory=256,
                     env={signing.SOURCE_VARIABLE: signer.source}, **params)
    return job_id, url, storage


def value_of(storage: Storage, url: str) -> Any:
    _, outcomes = wire.unpack_result(storage.read_result(url, 0))
    return wire.decode_outcome(outcomes[0])


# -- functions the jobs run (shipped by value: this module is not installed) -------------------
def square_in(x: int) -> Tuple[int, int]:
    return x * x, os.getpid()


def fail(x: int) -> None:
    raise ValueError(f"bad item {x}")


def wait_for(path: str) -> str:
    import time

    open(path + ".started", "w").close()
    while not os.path.exists(path):
        time.sleep(0.01)
    return "late"


def out_of_memory_once(marker: str) -> str:
    if os.path.exists(marker):
        return "second attempt"
    open(marker, "w").close()
    raise MemoryError


def attempt_threads() -> int:
    return sum(t.name.startswith("bf-emulator-attempt") for t in threading.enumerate())


# -- the executor over threads ------------------------------------------------------------------
def test_a_map_of_thousands_of_children_runs_in_threads_of_this_process(thread_env):
    with BatchExecutor(thread_env) as ex:
        results = list(ex.map(square_in, range(3000), chunksize=1))
    assert [value for value, _ in results] == [x * x for x in range(3000)]
    assert {pid for _, pid in results} == {os.getpid()}  # no process was started
    assert attempt_threads() <= MAX_VCPUS  # threads for the attempts running, not per child
    emulator = thread_env.emulator
    arrays = emulator.list_jobs(jobQueue=QUEUE, jobStatus="SUCCEEDED")["jobSummaryList"]
    assert sum(a["arrayProperties"]["size"] for a in arrays) == 3000
    for summary in arrays:  # the scheduler's usual records
        parent = emulator.describe_jobs(jobs=[summary["jobId"]])["jobs"][0]
        assert parent["arrayProperties"]["statusSummary"]["SUCCEEDED"] == summary["arrayProperties"]["size"]


def test_a_raising_function_comes_back_as_itself(thread_env):
    with BatchExecutor(thread_env) as ex:
        future = ex.submit(fail, 7)
        with pytest.raises(ValueError, match="bad item 7"):
            future.result()


def test_a_terminated_attempt_fails_at_once_and_its_late_result_is_not_written(thread_env, tmp_path):
    release = tmp_path / "release"
    emulator = thread_env.emulator
    with BatchExecutor(thread_env) as ex:
        future = ex.submit(wait_for, str(release))
        running = wait_until(lambda: emulator.list_jobs(jobQueue=QUEUE)["jobSummaryList"],
                             "the job to run")
        job_id = running[0]["jobId"]
        wait_until((tmp_path / "release.started").exists, "the function to start")
        emulator.terminate_job(jobId=job_id, reason="the test says stop")
        with pytest.raises(JobFailedError, match="the test says stop"):
            future.result(timeout=60)
        detail = emulator.describe_jobs(jobs=[job_id])["jobs"][0]
        assert detail["status"] == "FAILED" and detail["statusReason"] == "the test says stop"
        assert detail["attempts"][-1]["container"]["exitCode"] == 137
        assert emulator.launcher.busy_threads == 1  # ended at once: its thread still runs
        release.touch()
        wait_until(lambda: emulator.launcher.busy_threads == 0, "the killed attempt's thread")
        url = detail["container"]["command"][-1]
        assert not thread_env.storage.has_result(url, 0)  # the late result was not written
        assert isinstance(future.exception(), JobFailedError)


# -- the emulator's lifecycle over threads ------------------------------------------------------
def test_a_timed_out_attempt_ends_with_batchs_reason(temu, tmp_path):
    release = tmp_path / "release"
    job_id, url, storage = worker_job(temu, tmp_path, wait_for, str(release),
                                      timeout={"attemptDurationSeconds": 1})
    detail = temu.wait(job_id)
    assert detail["status"] == "FAILED"
    assert detail["statusReason"] == TIMEOUT_REASON  # Batch's own words, one definition
    assert detail["attempts"][-1]["container"]["exitCode"] == 137
    release.touch()
    wait_until(lambda: temu.emulator.launcher.busy_threads == 0, "the timed-out attempt's thread")
    assert not storage.has_result(url, 0)


def test_retries_run_a_new_attempt_in_a_new_thread(temu, tmp_path):
    job_id, url, storage = worker_job(temu, tmp_path, out_of_memory_once,
                                      str(tmp_path / "marker"), retryStrategy={"attempts": 2})
    detail = temu.wait(job_id)
    assert detail["status"] == "SUCCEEDED"
    first, second = detail["attempts"]
    assert first["container"]["exitCode"] == 137  # the worker's MemoryError, as in a process
    assert first["container"]["reason"].startswith("OutOfMemoryError")
    assert second["container"]["exitCode"] == 0
    assert any("MemoryError" in line for line in temu.log_lines(detail, attempt=0))
    assert value_of(storage, url) == "second attempt"


def test_the_workers_messages_go_to_the_attempts_log_only(temu, tmp_path, caplog):
    storage = Storage((tmp_path / "storage").as_uri())
    missing = storage.job_url("run-none", uuid.uuid4().hex)  # no inputs there
    with caplog.at_level(logging.WARNING, logger="batchfutures"):
        detail = temu.run(["python", "-m", "batchfutures.worker", missing], memory=256)
    assert detail["status"] == "FAILED" and detail["container"]["exitCode"] == 1
    assert any(line.startswith("batchfutures.worker: child 0 failed")
               for line in temu.log_lines(detail))
    assert not [r for r in caplog.records if "child 0 failed" in r.getMessage()]


def test_only_the_workers_command_runs_in_a_thread(temu):
    detail = temu.run(["true"])
    assert detail["status"] == "FAILED" and detail["statusReason"] == "Task failed to start"
    assert detail["container"]["reason"].startswith("CannotStartContainerError")


def test_threads_are_chosen_explicitly_and_never_by_default(tmp_path):
    with pytest.raises(ValueError, match="launcher"):
        BatchEmulator(tmp_path / "a", launcher="fork")
    env = LocalEnvironment(tmp_path / "work", max_vcpus=1)
    try:
        assert env.emulator.launcher_kind is Launcher.PROCESS
    finally:
        env.emulator.close()
