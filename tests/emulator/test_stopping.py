"""CancelJob and TerminateJob in each state; children one by one; the parent; never retried."""

import os

import pytest
from botocore.exceptions import ClientError
from emulator_harness import pid_gone, py, wait_until

RETRIES = {"attempts": 3}


def sleeper(folder, name="job"):
    """Code for a job that writes its pid to ``folder/<name>.pid`` then runs until ``folder/go``."""
    return py("import os, sys, time\n"
              f"open(os.path.join({str(folder)!r}, {name!r} + '.pid'), 'w').write(str(os.getpid()))\n"
              f"while not os.path.exists(os.path.join({str(folder)!r}, 'go')): time.sleep(0.01)\n")


def pid_of(folder, name="job"):
    path = folder / f"{name}.pid"
    wait_until(lambda: path.exists() and path.read_text(), f"{name} to write its pid")
    return int(path.read_text())


def assert_stopped_before_start(detail, reason, cancelled):
    assert detail["status"] == "FAILED"
    assert detail["statusReason"] == reason
    assert detail["attempts"] == []
    assert detail["isCancelled"] is cancelled
    assert detail["isTerminated"] is (not cancelled)


@pytest.mark.slow
@pytest.mark.parametrize("terminate", [False, True])
def test_in_submitted(emu, tmp_path, terminate):
    # Inside a listener the scheduler is between steps: a job submitted there is still SUBMITTED.
    seen = {}

    def submit_and_stop():
        if seen:
            return
        seen["job"] = job = emu.job(sleeper(tmp_path))
        seen["status"] = emu.status(job)
        stop = emu.terminate_job if terminate else emu.cancel_job
        stop(jobId=job, reason="stopped while submitted")

    emu.add_listener(submit_and_stop)
    emu.job(py("pass"), name="wake")  # any change calls the listener
    wait_until(lambda: seen, "the listener to run")
    assert seen["status"] == "SUBMITTED"
    assert_stopped_before_start(emu.wait(seen["job"]), "stopped while submitted", not terminate)
    assert not (tmp_path / "job.pid").exists()


@pytest.mark.slow
@pytest.mark.parametrize("terminate", [False, True])
def test_in_pending(emu, tmp_path, terminate):
    first = emu.job(sleeper(tmp_path, "first"))
    job = emu.job(py("pass"), dependsOn=[{"jobId": first}], retryStrategy=RETRIES)
    emu.wait(job, ["PENDING"])
    (emu.terminate_job if terminate else emu.cancel_job)(jobId=job, reason="not needed")
    assert_stopped_before_start(emu.wait(job), "not needed", not terminate)
    assert emu.wait(first, ["RUNNING"])["status"] == "RUNNING"  # the dependency is not touched
    (tmp_path / "go").touch()
    assert emu.wait(first)["status"] == "SUCCEEDED"


@pytest.mark.slow
@pytest.mark.parametrize("terminate", [False, True])
def test_in_runnable(make_emulator, tmp_path, terminate):
    emu = make_emulator(max_vcpus=1)
    holder = emu.job(sleeper(tmp_path, "holder"))
    emu.wait(holder, ["RUNNING"])
    job = emu.job(sleeper(tmp_path, "job"), retryStrategy=RETRIES)
    emu.wait(job, ["RUNNABLE"])
    (emu.terminate_job if terminate else emu.cancel_job)(jobId=job, reason="no room")
    assert_stopped_before_start(emu.wait(job), "no room", not terminate)
    (tmp_path / "go").touch()
    assert emu.wait(holder)["status"] == "SUCCEEDED"
    assert not (tmp_path / "job.pid").exists()


@pytest.mark.slow
def test_cancel_does_nothing_once_running(emu, tmp_path):
    job = emu.job(sleeper(tmp_path))
    emu.wait(job, ["RUNNING"])
    emu.cancel_job(jobId=job, reason="too late")
    assert emu.status(job) == "RUNNING"
    (tmp_path / "go").touch()
    detail = emu.wait(job)
    assert detail["status"] == "SUCCEEDED"
    assert detail["statusReason"] != "too late"
    assert detail["isCancelled"] is False


@pytest.mark.slow
def test_terminate_kills_a_running_job_and_never_retries_it(emu, tmp_path):
    job = emu.job(sleeper(tmp_path), retryStrategy=RETRIES)
    emu.wait(job, ["RUNNING"])
    pid = pid_of(tmp_path)
    emu.terminate_job(jobId=job, reason="operator says stop")
    detail = emu.wait(job)
    assert detail["status"] == "FAILED"
    assert detail["statusReason"] == "operator says stop"
    assert detail["isTerminated"] is True
    [attempt] = detail["attempts"]
    assert attempt["container"]["exitCode"] == 143  # as docker stop: SIGTERM, the default ends it
    assert attempt["statusReason"] == "operator says stop"
    wait_until(lambda: pid_gone(pid), "the job's process to be gone")


@pytest.mark.slow
def test_terminate_lets_a_sigterm_handler_run_then_kills_what_outlives_the_grace(emu, tmp_path):
    """TerminateJob stops a container as `docker stop` does: SIGTERM, SIGKILL after a grace."""
    code = py("import os, signal, sys, time\n"
              f"folder = {str(tmp_path)!r}\n"
              "def cleanup(signum, frame):\n"
              "    open(os.path.join(folder, 'cleaned'), 'w').write('yes')\n"
              "    while True: time.sleep(0.1)  # ignores the request: the SIGKILL must follow\n"
              "signal.signal(signal.SIGTERM, cleanup)\n"
              "open(os.path.join(folder, 'job.pid'), 'w').write(str(os.getpid()))\n"
              "while True: time.sleep(0.01)\n")
    job = emu.job(code)
    emu.wait(job, ["RUNNING"])
    pid = pid_of(tmp_path)
    emu.terminate_job(jobId=job, reason="stop now")
    detail = emu.wait(job)
    assert (tmp_path / "cleaned").read_text() == "yes"  # its handler ran before the kill
    [attempt] = detail["attempts"]
    assert attempt["container"]["exitCode"] == 137 and detail["statusReason"] == "stop now"
    wait_until(lambda: pid_gone(pid), "the job's process to be gone")


@pytest.mark.slow
@pytest.mark.parametrize("reason", ["timeout", "memory", "shutdown"])
def test_a_terminate_reason_is_only_text(emu, tmp_path, reason):
    # reasons that look like the emulator's own must not change how the attempt is reported
    job = emu.job(sleeper(tmp_path), retryStrategy=RETRIES)
    emu.wait(job, ["RUNNING"])
    emu.terminate_job(jobId=job, reason=reason)
    detail = emu.wait(job)
    assert detail["statusReason"] == reason
    assert len(detail["attempts"]) == 1
    assert "reason" not in detail["attempts"][0]["container"]


@pytest.mark.slow
@pytest.mark.parametrize("terminate", [False, True])
def test_in_starting(make_emulator, tmp_path, terminate):
    # A listener sees the scheduler's state between steps: here the step that started the job.
    emu = make_emulator(max_vcpus=1)
    holder = emu.job(sleeper(tmp_path, "holder"))
    job = emu.job(py("import time; time.sleep(0.2)"))
    emu.wait(job, ["RUNNABLE"])
    seen = []

    def stop_when_starting():
        try:
            status = emu.emulator.describe_jobs(jobs=[job])["jobs"][0]["status"]
        except ClientError:  # closed
            return
        if not seen and status == "STARTING":
            seen.append("STARTING")
            (emu.terminate_job if terminate else emu.cancel_job)(jobId=job, reason="while starting")

    emu.add_listener(stop_when_starting)
    (tmp_path / "go").touch()  # the holder ends: the job starts
    detail = emu.wait(job)
    assert emu.wait(holder)["status"] == "SUCCEEDED"
    assert seen == ["STARTING"]
    if terminate:
        assert detail["status"] == "FAILED" and detail["statusReason"] == "while starting"
        assert len(detail["attempts"]) == 1
    else:
        assert detail["status"] == "SUCCEEDED"


@pytest.mark.slow
def test_stopping_a_finished_job_changes_nothing(emu):
    job = emu.job(py("pass"))
    before = emu.wait(job)
    emu.cancel_job(jobId=job, reason="late")
    emu.terminate_job(jobId=job, reason="later")
    after = emu.detail(job)
    assert after["status"] == "SUCCEEDED" and after["statusReason"] == before["statusReason"]


def test_stopping_an_unknown_job_is_a_client_exception(emu):
    for stop in (emu.cancel_job, emu.terminate_job):
        with pytest.raises(ClientError) as raised:
            stop(jobId="00000000-0000-0000-0000-000000000000", reason="x")
        assert raised.value.response["Error"]["Code"] == "ClientException"


@pytest.mark.slow
def test_children_one_by_one(make_emulator, tmp_path):
    emu = make_emulator(max_vcpus=1)
    code = py("import os, time\n"
              f"folder = {str(tmp_path)!r}\n"
              "index = os.environ['AWS_BATCH_JOB_ARRAY_INDEX']\n"
              "open(os.path.join(folder, index + '.pid'), 'w').write(str(os.getpid()))\n"
              "while index == '0' and not os.path.exists(os.path.join(folder, 'go')):\n"
              "    time.sleep(0.01)\n")
    array = emu.job(code, size=3, retryStrategy=RETRIES)
    emu.wait(f"{array}:0", ["RUNNING"])
    emu.wait(f"{array}:1", ["RUNNABLE"])
    emu.cancel_job(jobId=f"{array}:1", reason="skip one")
    assert_stopped_before_start(emu.wait(f"{array}:1"), "skip one", True)
    pid = pid_of(tmp_path, "0")
    emu.terminate_job(jobId=f"{array}:0", reason="stop zero")
    zero = emu.wait(f"{array}:0")
    assert zero["status"] == "FAILED" and zero["statusReason"] == "stop zero"
    assert len(zero["attempts"]) == 1
    wait_until(lambda: pid_gone(pid), "child 0's process to be gone")
    assert emu.wait(f"{array}:2")["status"] == "SUCCEEDED"
    parent = emu.wait(array)
    assert parent["status"] == "FAILED"
    assert parent["arrayProperties"]["statusSummary"]["FAILED"] == 2
    assert parent["arrayProperties"]["statusSummary"]["SUCCEEDED"] == 1
    assert not (tmp_path / "1.pid").exists()


@pytest.mark.slow
@pytest.mark.parametrize("terminate", [False, True])
def test_on_the_parent(make_emulator, tmp_path, terminate):
    emu = make_emulator(max_vcpus=1)
    array = emu.job(sleeper(tmp_path), size=3, retryStrategy=RETRIES)
    emu.wait(f"{array}:0", ["RUNNING"])
    pid = pid_of(tmp_path)
    (emu.terminate_job if terminate else emu.cancel_job)(jobId=array, reason="whole array")
    for index in (1, 2):
        assert_stopped_before_start(emu.wait(f"{array}:{index}"), "whole array", not terminate)
    if terminate:
        zero = emu.wait(f"{array}:0")
        assert zero["status"] == "FAILED" and zero["statusReason"] == "whole array"
        wait_until(lambda: pid_gone(pid), "child 0's process to be gone")
    else:
        assert emu.status(f"{array}:0") == "RUNNING"  # cancel leaves started children alone
        (tmp_path / "go").touch()
        assert emu.wait(f"{array}:0")["status"] == "SUCCEEDED"
    parent = emu.wait(array)
    assert parent["status"] == "FAILED"
    assert parent["statusReason"] == "whole array"
    summary = parent["arrayProperties"]["statusSummary"]
    assert summary["FAILED"] == (3 if terminate else 2)


@pytest.mark.slow
def test_cancelling_an_array_before_it_expands_fails_every_child(emu, tmp_path):
    seen = {}

    def submit_and_cancel():
        if not seen:
            seen["array"] = array = emu.job(sleeper(tmp_path), size=3)
            emu.cancel_job(jobId=array, reason="never mind")

    emu.add_listener(submit_and_cancel)
    emu.job(py("pass"), name="wake")
    wait_until(lambda: seen, "the listener to run")
    array = seen["array"]
    parent = emu.wait(array)
    assert parent["status"] == "FAILED" and parent["statusReason"] == "never mind"
    assert parent["arrayProperties"]["statusSummary"]["FAILED"] == 3
    children = emu.describe_jobs(jobs=[f"{array}:{i}" for i in range(3)])["jobs"]
    assert [c["status"] for c in children] == ["FAILED"] * 3
    assert not any(name.endswith(".pid") for name in os.listdir(tmp_path))
