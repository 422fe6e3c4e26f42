"""launcher="threads" and the settings a thread cannot apply: ``LocalEnvironment(image=PYTHON)``
(another interpreter) and ``requirements=`` (an environment archive on the worker's path) are
refused, never silently ignored: ConfigurationError when the settings are given to a
LocalEnvironment whose emulator runs threads, CannotStartContainerError for an attempt the
emulator's threads cannot run (runtime/threads.py's `threads_refusal`, `attempt_refusal`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from batchfutures import BatchExecutor, ConfigurationError, LocalEnvironment, envarchive
from batchfutures.emulator import BatchEmulator
from batchfutures.emulator.runtime import threads
from batchfutures.errors import JobFailedError

HERE = "/opt/py/bin/python3.11"  # "this process's interpreter" in the pure tables
WORKER = ["python", "-m", "batchfutures.worker", "file:///storage/runs/r/jobs/k"]


@pytest.mark.parametrize("interpreter, archive, refused", [
    (None, False, None),  # the emulator's own image: this interpreter
    (HERE, False, None),  # image= this very interpreter: nothing differs
    ("/venvs/slim/bin/python", False, ["image='/venvs/slim/bin/python'"]),
    (None, True, ["requirements="]),
    ("/venvs/slim/bin/python", True, ["image='/venvs/slim/bin/python'", "requirements="]),
    ("/opt/py/bin/python3", False, ["image='/opt/py/bin/python3'"]),  # kept as given, not resolved
])
def test_what_a_thread_cannot_apply(interpreter: Optional[str], archive: bool,
                                    refused: Optional[List[str]]) -> None:
    refusal = threads.threads_refusal(interpreter, archive, HERE)
    if refused is None:
        assert refusal is None
        return
    assert refusal is not None
    for setting in refused:
        assert setting in refusal
    assert "launcher='process'" in refusal and "leave them out" in refusal  # what to do


@pytest.mark.parametrize("argv, env, refused", [
    ([HERE] + WORKER[1:], {}, None),
    ([HERE] + WORKER[1:], {threads.ARCHIVE_VARIABLE: ""}, None),  # empty: no archive
    (["/venvs/slim/bin/python"] + WORKER[1:], {}, "image='/venvs/slim/bin/python'"),
    ([HERE] + WORKER[1:], {threads.ARCHIVE_VARIABLE: "file:///s/envs/abc.zip"}, "requirements="),
    (["true"], {}, "runs only the worker's command"),
    ([], {}, "runs only the worker's command"),
    ([HERE, "-m", "batchfutures.worker", "--warm", "url"], {}, "runs only the worker's command"),
])
def test_which_attempts_a_thread_can_start(argv: List[str], env: Dict[str, str],
                                           refused: Optional[str]) -> None:
    refusal = threads.attempt_refusal(argv, env, HERE)
    if refused is None:
        assert refusal is None
    else:
        assert refusal is not None and refused in refusal


def test_the_archive_variable_is_requirements_pointer() -> None:
    assert threads.ARCHIVE_VARIABLE == envarchive.POINTER_VARIABLE


class ThreadEnvironment(LocalEnvironment):
    """A LocalEnvironment whose emulator runs attempts as threads (opted into, as tests do)."""

    def __init__(self, workdir: Path, **options: Any) -> None:
        super().__init__(workdir, max_vcpus=2, **options)
        self._emulator = BatchEmulator(self.workdir / "emulator", launcher="threads",
                                       max_vcpus=2)


def other_interpreter(tmp_path: Path) -> str:
    """An interpreter path that is not this process's (a link to it, kept as given)."""
    link = tmp_path / "image" / "bin" / "python"
    link.parent.mkdir(parents=True)
    os.symlink(sys.executable, link)
    return str(link)


def test_image_is_refused_when_the_executor_is_made(tmp_path: Path) -> None:
    env = ThreadEnvironment(tmp_path / "work", image=other_interpreter(tmp_path))
    try:
        with pytest.raises(ConfigurationError, match=r"launcher='threads'.*image="):
            BatchExecutor(env)
        assert env.emulator.list_jobs(jobQueue=env.job_queue)["jobSummaryList"] == []
    finally:
        env.emulator.close()


def test_requirements_are_refused_when_given(tmp_path: Path) -> None:
    env = ThreadEnvironment(tmp_path / "work")
    try:
        with pytest.raises(ConfigurationError, match=r"launcher='threads'.*requirements="):
            BatchExecutor(env, requirements=["numpy==2.1.3"])
        with BatchExecutor(env) as ex:  # without them the threads run calls as before
            assert ex.submit(pow, 2, 5).result(timeout=120) == 32
            with pytest.raises(ConfigurationError, match="requirements="):
                ex.with_settings(requirements=["numpy==2.1.3"])
    finally:
        env.emulator.close()


def test_this_interpreter_as_the_image_runs_in_threads(tmp_path: Path) -> None:
    env = ThreadEnvironment(tmp_path / "work", image=sys.executable)
    try:
        with BatchExecutor(env) as ex:
            assert ex.submit(pow, 3, 2).result(timeout=120) == 9
    finally:
        env.emulator.close()


def test_an_attempt_the_threads_cannot_run_fails_to_start(tmp_path: Path) -> None:
    """The folder's emulator was started with threads before this LocalEnvironment (first
    settings win): its image= reaches the emulator, whose attempt is refused, not run here."""
    workdir = (tmp_path / "work").resolve()
    emulator = BatchEmulator.shared(workdir / "emulator", launcher="threads", max_vcpus=2)
    env = LocalEnvironment(workdir, max_vcpus=2, image=other_interpreter(tmp_path))
    try:
        with BatchExecutor(env) as ex:
            assert env.emulator is emulator
            future = ex.submit(pow, 2, 3)
            with pytest.raises(JobFailedError, match=r"CannotStartContainerError.*image=") as failed:
                future.result(timeout=120)
            assert "launcher='process'" in str(failed.value)
    finally:
        emulator.close()
