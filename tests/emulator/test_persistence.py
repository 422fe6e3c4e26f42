"""Memory of the past: records on the folder, read by other instances and processes; TTL; orphans."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from emulator_harness import QUEUE, pid_gone, py, wait_until

import batchfutures
from batchfutures.emulator import BatchEmulator

REPO = str(Path(batchfutures.__file__).resolve().parent.parent)


def comparable(details):
    for detail in details:
        detail.get("arrayProperties", {}).pop("statusSummaryLastUpdatedAt", None)
    return details


def finished_work(emu):
    """A plain job retried once, and an array with a failed child: ids to describe."""
    retried = emu.job(py("import os; print('attempt', os.environ['AWS_BATCH_JOB_ATTEMPT']);"
                         "raise SystemExit(os.environ['AWS_BATCH_JOB_ATTEMPT'] == '1')"),
                      name="retried", retryStrategy={"attempts": 2}, tags={"team": "a"})
    array = emu.job(py("import os; raise SystemExit(os.environ['AWS_BATCH_JOB_ARRAY_INDEX'] == '2')"),
                    name="array", size=3)
    emu.wait(retried)
    emu.wait(array)
    return [retried, array] + [f"{array}:{i}" for i in range(3)]


@pytest.mark.slow
@pytest.mark.parametrize("close_first", [False, True])
def test_another_instance_describes_what_the_first_ran(make_emulator, close_first):
    first = make_emulator()
    ids = finished_work(first)
    expected = comparable(first.describe_jobs(jobs=ids)["jobs"])
    assert [d["status"] for d in expected] == ["SUCCEEDED", "FAILED", "SUCCEEDED", "SUCCEEDED", "FAILED"]
    if close_first:
        first.close()
    second = make_emulator()
    # the records are written shortly after each change: wait until they caught up
    wait_until(lambda: comparable(second.describe_jobs(jobs=ids)["jobs"]) == expected,
               "the second instance to describe the jobs as the first does")
    retried = second.detail(ids[0])
    assert second.log_lines(retried, 0) == ["attempt 1"]
    assert second.log_lines(retried, 1) == ["attempt 2"]
    assert retried["tags"] == {"team": "a"}
    assert second.describe_jobs(jobs=[f"{ids[1]}:3", f"{ids[1]}:x", "nope"]) == {"jobs": []}


@pytest.mark.slow
def test_another_instance_lists_the_children_of_an_array(make_emulator):
    first = make_emulator()
    ids = finished_work(first)
    second = make_emulator()
    wait_until(lambda: second.status(ids[1]) == "FAILED", "the array's record")
    failed = second.list_jobs(arrayJobId=ids[1], jobStatus="FAILED")["jobSummaryList"]
    assert [s["jobId"] for s in failed] == [f"{ids[1]}:2"]
    assert failed[0]["container"]["exitCode"] == 1


@pytest.mark.slow
def test_a_finished_job_is_forgotten_after_the_ttl_in_every_instance(make_emulator):
    first = make_emulator(metadata_ttl=1)
    second = make_emulator(metadata_ttl=1)
    job = first.run(py("pass"))["jobId"]
    array = first.run(py("pass"), size=2)["jobId"]
    ids = [job, array, f"{array}:0"]
    wait_until(lambda: len(second.describe_jobs(jobs=ids)["jobs"]) == 3, "the records")
    for emu in (first, second):
        wait_until(lambda emu=emu: emu.describe_jobs(jobs=ids) == {"jobs": []},
                   "the jobs to be forgotten", timeout=30)
    assert first.list_jobs(jobQueue=QUEUE, jobStatus="SUCCEEDED")["jobSummaryList"] == []
    assert first.list_jobs(arrayJobId=array, jobStatus="SUCCEEDED")["jobSummaryList"] == []
    third = make_emulator(metadata_ttl=1)
    assert third.describe_jobs(jobs=ids) == {"jobs": []}


@pytest.mark.slow
def test_a_running_job_is_not_forgotten(make_emulator, tmp_path):
    emu = make_emulator(metadata_ttl=1)
    done = emu.run(py("pass"))["jobId"]
    go = str(tmp_path / "go")
    job = emu.job(py(f"import os, time\nwhile not os.path.exists({go!r}): time.sleep(0.01)"))
    emu.wait(job, ["RUNNING"])
    wait_until(lambda: emu.detail(done) is None, "the finished job to be forgotten")
    assert emu.status(job) == "RUNNING"
    (tmp_path / "go").touch()
    assert emu.wait(job)["status"] == "SUCCEEDED"


OWNER = textwrap.dedent("""
    import sys, time
    from batchfutures.emulator import BatchEmulator
    folder, pid_file = sys.argv[1], sys.argv[2]
    emulator = BatchEmulator(folder, max_vcpus=1)
    code = ("import os, time\\n"
            f"open({pid_file!r}, 'w').write(str(os.getpid()))\\n"
            "time.sleep(120)\\n")
    request = dict(jobQueue="batchfutures", jobDefinition="batchfutures-worker",
                   containerOverrides={"command": ["python", "-S", "-c", code]})
    job = emulator.submit_job(jobName="orphan", **request)["jobId"]
    array = emulator.submit_job(jobName="orphans", arrayProperties={"size": 3}, **request)["jobId"]
    print(job, array, flush=True)
    time.sleep(600)
""")


@pytest.mark.slow
@pytest.mark.parametrize("reaped", [True, False])
def test_a_job_whose_owner_process_died_is_recovered_as_failed(make_emulator, tmp_path, reaped):
    # not reaped: the dead owner is a zombie until its parent waits for it (a Popen nobody
    # waited for yet); a zombie is not alive
    folder, pid_file = tmp_path / "emulator", tmp_path / "job.pid"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(folder), str(pid_file)], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        job, array = owner.stdout.readline().split()
        watcher = make_emulator()
        wait_until(lambda: watcher.status(job) == "RUNNING", "the owner's record to say RUNNING")
        wait_until(lambda: watcher.status(f"{array}:0") == "RUNNABLE", "the array's record")
        wait_until(lambda: pid_file.exists() and pid_file.read_text(), "the job's pid")
        job_pid = int(pid_file.read_text())
    finally:
        owner.send_signal(signal.SIGKILL)
        if reaped:
            owner.wait()
        owner.stdout.close()
    try:
        wait_until(lambda: pid_gone(owner.pid), "the owner to be dead")
        reader = make_emulator()
        ids = [job, array, f"{array}:1"]
        details = wait_until(lambda: (lambda found: found if [d["status"] for d in found] == ["FAILED"] * 3
                                      else None)(reader.describe_jobs(jobs=ids)["jobs"]),
                             "the orphans to be FAILED")
        for detail in details:
            assert "exited" in detail["statusReason"], detail["statusReason"]
            assert str(owner.pid) in detail["statusReason"]
        wait_until(lambda: pid_gone(job_pid), "the orphaned job's process to be ended")
        assert reader.detail(job)["attempts"][0]["statusReason"]  # the attempt is closed too
    finally:
        owner.wait()


@pytest.mark.slow
def test_close_ends_running_jobs_as_failed(make_emulator, tmp_path):
    first = make_emulator(max_vcpus=1)
    job = first.job(py("import os, time\n"
                       f"open({str(tmp_path / 'job.pid')!r}, 'w').write(str(os.getpid()))\n"
                       "time.sleep(120)\n"))
    waiting = first.job(py("pass"), size=2)
    first.wait(job, ["RUNNING"])
    wait_until(lambda: (tmp_path / "job.pid").exists() and (tmp_path / "job.pid").read_text(), "the pid")
    pid = int((tmp_path / "job.pid").read_text())
    first.close()
    wait_until(lambda: pid_gone(pid), "the job's process to be ended")
    second = make_emulator()
    details = second.describe_jobs(jobs=[job, waiting, f"{waiting}:0"])["jobs"]
    assert [d["status"] for d in details] == ["FAILED"] * 3
    assert all(d["statusReason"] for d in details)
    assert details[0]["attempts"][0]["stoppedAt"] >= details[0]["attempts"][0]["startedAt"]


def test_shared_gives_one_emulator_per_folder(tmp_path):
    one = BatchEmulator.shared(tmp_path / "a", max_vcpus=1)
    try:
        assert BatchEmulator.shared(tmp_path / "a") is one
        assert BatchEmulator.shared(str(tmp_path / "a" / ".." / "a")) is one
        other = BatchEmulator.shared(tmp_path / "b")
        assert other is not one
        other.close()
    finally:
        one.close()
    again = BatchEmulator.shared(tmp_path / "a")
    assert again is not one
    again.close()
