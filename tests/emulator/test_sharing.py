"""Several emulators on one folder: stopping and depending on jobs that another one runs."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from emulator_harness import py, wait_until

import batchfutures

REPO = str(Path(batchfutures.__file__).resolve().parent.parent)


def holder(folder, name):
    """Code for a job that runs until ``folder/<name>.go`` exists, then exits with its content."""
    go = str(folder / f"{name}.go")
    return py("import os, sys, time\n"
              f"while not os.path.exists({go!r}): time.sleep(0.01)\n"
              f"sys.exit(int(open({go!r}).read() or 0))\n")


@pytest.mark.slow
@pytest.mark.parametrize("terminate", [False, True])
def test_another_instance_in_this_process_stops_a_job(make_emulator, tmp_path, terminate):
    owner, other = make_emulator(max_vcpus=1), make_emulator(max_vcpus=1)
    running = owner.job(holder(tmp_path, "running"))
    queued = owner.job(holder(tmp_path, "queued"))
    owner.wait(running, ["RUNNING"])
    wait_until(lambda: other.status(queued) == "RUNNABLE", "the other instance to see the queue")
    stop = other.terminate_job if terminate else other.cancel_job
    stop(jobId=queued, reason="from the other instance")
    detail = owner.wait(queued)
    assert detail["statusReason"] == "from the other instance" and detail["attempts"] == []
    stop(jobId=running, reason="stop it")
    if terminate:
        assert owner.wait(running)["statusReason"] == "stop it"
    else:  # cancel does nothing once running
        (tmp_path / "running.go").write_text("0")
        assert owner.wait(running)["status"] == "SUCCEEDED"
    wait_until(lambda: other.status(running) in ("SUCCEEDED", "FAILED"), "the record to follow")


OWNER = textwrap.dedent("""
    import sys, time
    from batchfutures.emulator import BatchEmulator
    folder, go = sys.argv[1], sys.argv[2]
    emulator = BatchEmulator(folder, max_vcpus=1)
    code = ("import os, time\\n"
            f"while not os.path.exists({go!r}): time.sleep(0.01)\\n")
    job = emulator.submit_job(jobName="far", jobQueue="batchfutures",
                              jobDefinition="batchfutures-worker",
                              containerOverrides={"command": ["python", "-S", "-c", code]})["jobId"]
    print(job, flush=True)
    while True:
        detail = emulator.describe_jobs(jobs=[job])["jobs"][0]
        if detail["status"] in ("SUCCEEDED", "FAILED"):
            break
        time.sleep(0.02)
    print(detail["status"], detail["attempts"][-1]["container"].get("exitCode"),
          detail["statusReason"], flush=True)
    emulator.close()
""")


@pytest.mark.slow
def test_another_process_terminates_a_job_through_the_folder(make_emulator, tmp_path):
    folder = tmp_path / "emulator"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(folder), str(tmp_path / "go")],
                             env=env, stdout=subprocess.PIPE, text=True)
    try:
        job = owner.stdout.readline().strip()
        here = make_emulator(folder)
        wait_until(lambda: here.status(job) == "RUNNING", "the owner's record to say RUNNING")
        here.terminate_job(jobId=job, reason="stopped from another process")
        line = owner.stdout.readline().split(" ", 2)  # 143: SIGTERM, as docker stop sends
        assert line == ["FAILED", "143", "stopped from another process\n"]
        assert owner.wait(timeout=30) == 0
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        owner.stdout.close()
    assert here.wait(job)["statusReason"] == "stopped from another process"


@pytest.mark.slow
def test_a_dependency_on_another_instances_jobs(make_emulator, tmp_path):
    owner, other = make_emulator(), make_emulator()
    good, bad = owner.job(holder(tmp_path, "good")), owner.job(holder(tmp_path, "bad"))
    wait_until(lambda: other.status(good) and other.status(bad), "the other instance to see them")
    after_good = other.job(py("pass"), dependsOn=[{"jobId": good}])
    after_bad = other.job(py("pass"), dependsOn=[{"jobId": bad}])
    other.wait(after_good, ["PENDING"])
    other.wait(after_bad, ["PENDING"])
    (tmp_path / "good.go").write_text("0")
    (tmp_path / "bad.go").write_text("3")
    assert other.wait(after_good)["status"] == "SUCCEEDED"
    failed = other.wait(after_bad)
    assert failed["status"] == "FAILED" and failed["statusReason"].startswith("Dependent Job failed")
    assert failed["attempts"] == []


@pytest.mark.slow
def test_n_to_n_on_another_instances_array(make_emulator, tmp_path):
    owner, other = make_emulator(), make_emulator()
    code = py("import os, sys; sys.exit(int(os.environ['AWS_BATCH_JOB_ARRAY_INDEX']) == 1)")
    first = owner.job(code, size=3)
    wait_until(lambda: other.status(first), "the other instance to see the array")
    second = other.job(py("pass"), size=3, dependsOn=[{"jobId": first, "type": "N_TO_N"}])
    assert other.wait(second)["status"] == "FAILED"
    statuses = [other.detail(f"{second}:{i}")["status"] for i in range(3)]
    assert statuses == ["SUCCEEDED", "FAILED", "SUCCEEDED"]
    assert other.detail(f"{second}:1")["statusReason"] == "Dependent Job failed"
