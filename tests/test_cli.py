"""The command line against the embedded emulator, as a user runs it: separate processes."""

import json
import os
import subprocess
import sys

import pytest

from batchfutures import BatchExecutor, LocalEnvironment


def run_cli(workdir, *args, check=True):
    env = dict(os.environ)
    for name in ("BATCHFUTURES_JOB_QUEUE", "BATCHFUTURES_JOB_DEFINITION", "BATCHFUTURES_IO_BUCKET"):
        env.pop(name, None)
    completed = subprocess.run([sys.executable, "-m", "batchfutures", "--workdir", str(workdir), *args],
                               capture_output=True, text=True, timeout=120, env=env)
    if check:
        assert completed.returncode == 0, completed.stderr + completed.stdout
    return completed


def shout(text):
    print(f"the job says {text}")
    return text.upper()


@pytest.fixture
def finished_job(tmp_path):
    env = LocalEnvironment(tmp_path)
    with BatchExecutor(env) as executor:
        future = executor.submit(shout, "hello")
        assert future.result(timeout=60) == "HELLO"
    return tmp_path, future.job_id


def test_demo_prints_real_results(tmp_path):
    out = run_cli(tmp_path, "demo", "--items", "6", "--chunksize", "2").stdout
    assert "[0, 1, 4, 9, 16, 25]" in out


def test_status_of_a_job_another_process_ran(finished_job):
    workdir, job_id = finished_job
    status = json.loads(run_cli(workdir, "status", job_id).stdout)
    assert status["jobId"] == job_id and status["status"] == "SUCCEEDED"
    assert status["exitCode"] == 0


def test_result_and_logs_of_a_job_another_process_ran(finished_job):
    workdir, job_id = finished_job
    assert run_cli(workdir, "result", job_id).stdout.strip() == "'HELLO'"
    assert "the job says hello" in run_cli(workdir, "logs", job_id).stdout


def test_unknown_job(tmp_path):
    completed = run_cli(tmp_path, "status", "no-such-job", check=False)
    assert completed.returncode == 1 and "unknown" in completed.stdout


def test_check_reports_each_part(tmp_path):
    out = run_cli(tmp_path, "check").stdout.splitlines()
    assert [line.split(":")[0] for line in out] == [
        "ok   credentials", "ok   job queue", "ok   bucket", "ok   job definition"]


def test_cleanup_removes_stored_runs(finished_job):
    workdir, _ = finished_job
    assert "1 run(s) to remove" in run_cli(workdir, "cleanup", "--all", "--dry-run").stdout
    assert list((workdir / "storage" / "runs").iterdir())
    assert "1 run(s) removed" in run_cli(workdir, "cleanup", "--all").stdout
    assert not list((workdir / "storage" / "runs").iterdir())


def test_cleanup_keeps_recent_runs(finished_job):
    workdir, _ = finished_job
    assert "0 run(s) removed" in run_cli(workdir, "cleanup", "--older-than", "1").stdout


def test_jobs_lists_this_librarys_jobs(finished_job):
    workdir, job_id = finished_job
    out = run_cli(workdir, "jobs").stdout
    assert job_id in out and "SUCCEEDED" in out and "bf-shout" in out
    assert job_id not in run_cli(workdir, "jobs", "--status", "FAILED").stdout
