"""Memory like Docker: each attempt in its own cgroup, the kernel's OOM kill reported as Batch does.

These run where this process may create cgroups (root on Linux, as on the project's machines);
the RLIMIT fallback is exercised by forcing it (isolation="rlimit" or the environment variable).
"""

import os
import signal
import subprocess
import sys

import boto3
import pytest
from botocore.config import Config
from emulator_harness import py, wait_until

from batchfutures.emulator.runtime import cgroups
from batchfutures.emulator.server import EmulatorServer

OOM = "OutOfMemoryError: Container killed due to memory usage"
EXITED = "Essential container in task exited"
MiB = 1024 * 1024

needs_cgroups = pytest.mark.skipif(cgroups.detect() is None,
                                   reason="this process cannot create cgroups here")

PLAIN_ALLOCATION = "b = bytearray(600 * 2**20)"  # no MemoryError handling: the example
C_ALLOCATION = ("import ctypes\n"
                "libc = ctypes.CDLL(None)\n"
                "libc.malloc.restype = ctypes.c_void_p\n"
                "n = 600 * 2**20\n"
                "p = libc.malloc(n)\n"
                "assert p, 'malloc failed'\n"
                "ctypes.memset(p, 1, n)  # touching the pages is what costs memory\n")


def attempt_groups():
    """Every attempt cgroup of this process under its memory and cpu parents."""
    system = cgroups.detect()
    found = []
    for parent in set(system.parents.values()):
        found += [parent / n for n in os.listdir(parent) if n.startswith(cgroups.PREFIX)]
    return found


def own_groups():
    tag = f"-{os.getpid()}-"
    return [g for g in attempt_groups() if tag in g.name]


@pytest.mark.slow
@needs_cgroups
@pytest.mark.parametrize("code", [PLAIN_ALLOCATION, C_ALLOCATION], ids=["bytearray", "malloc"])
def test_a_plain_command_over_its_memory_is_killed_by_the_kernel_and_reported_as_batch_does(
        make_emulator, code):
    emu = make_emulator()
    assert emu.cgroups is not None
    detail = emu.run(py(code), memory=128)
    assert detail["status"] == "FAILED"
    [attempt] = detail["attempts"]
    assert attempt["container"]["exitCode"] == 137
    assert attempt["container"]["reason"] == OOM
    assert detail["statusReason"] == EXITED
    assert detail["container"]["reason"] == OOM


@pytest.mark.slow
@needs_cgroups
def test_each_attempt_has_its_own_group_with_the_jobs_memory_and_cpu_and_it_is_removed_after(
        make_emulator, tmp_path):
    emu = make_emulator()
    marker = tmp_path / "groups"
    code = ("import sys, time\n"
            f"open({str(marker)!r}, 'w').write(open('/proc/self/cgroup').read())\n"
            "time.sleep(60)\n")
    job_id = emu.job(py(code), memory=300, vcpus=0.5)
    wait_until(lambda: marker.exists() and marker.read_text(), "the job to start")
    lines = dict(line.split(":", 2)[1:] for line in marker.read_text().splitlines())
    memory_path = lines["memory"]
    name = memory_path.rsplit("/", 1)[1]
    assert name.startswith(cgroups.PREFIX)
    [memory_group] = [g for g in attempt_groups() if g.name == name and "memory" in str(g)]
    assert int((memory_group / "memory.limit_in_bytes").read_text()) == 300 * MiB
    cpu = cgroups.detect().parents.get("cpu")
    if cpu is not None:
        assert int((cpu / name / "cpu.shares").read_text()) == 512  # 1024 per vCPU
    emu.terminate_job(jobId=job_id, reason="enough")
    emu.wait(job_id)
    wait_until(lambda: not [g for g in attempt_groups() if g.name == name], "the group to go")


@pytest.mark.slow
@needs_cgroups
def test_the_worker_forked_from_the_fork_server_runs_in_its_group_too(make_emulator, tmp_path):
    # The real worker command, with a payload URL that does not exist: it fails, but only after
    # its process (forked from the fork server) ran in the attempt's group.
    emu = make_emulator()
    job_id = emu.job(["python", "-m", "batchfutures.worker", (tmp_path / "nothing").as_uri()],
                     memory=256)
    detail = emu.wait(job_id)
    assert detail["status"] == "FAILED"
    assert "reason" not in detail["attempts"][0]["container"]
    wait_until(lambda: not own_groups(), "no group left")


@pytest.mark.slow
def test_the_fallback_can_be_forced_and_then_makes_no_cgroups(make_emulator, monkeypatch):
    monkeypatch.setenv("BATCHFUTURES_EMULATOR_ISOLATION", "rlimit")
    emu = make_emulator()
    assert emu.cgroups is None
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_DATA)[0] // 2**20)"
    detail = emu.run(py(code), memory=200)
    assert detail["status"] == "SUCCEEDED"
    assert emu.log_lines(detail) == ["200"]  # RLIMIT_DATA is the limit


@pytest.mark.slow
@needs_cgroups
def test_in_a_cgroup_there_is_no_rlimit(make_emulator):
    emu = make_emulator(isolation="cgroups")
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_DATA)[0])"
    detail = emu.run(py(code), memory=200)
    assert emu.log_lines(detail) == [str(-1)]  # RLIM_INFINITY: the kernel's limit is the cgroup


def test_an_unknown_isolation_is_refused(tmp_path):
    from batchfutures.emulator import BatchEmulator

    with pytest.raises(ValueError):
        BatchEmulator(tmp_path / "e", isolation="containers")


CRASHING = """
import sys, time
from batchfutures.emulator import BatchEmulator
emulator = BatchEmulator(sys.argv[1], max_vcpus=2)
ids = [emulator.submit_job(jobName="held", jobQueue="batchfutures",
                           jobDefinition="batchfutures-worker",
                           containerOverrides={"command": ["python", "-S", "-c",
                                                           "import time; time.sleep(600)"],
                                               "resourceRequirements": [
                                                   {"type": "MEMORY", "value": "64"}]})["jobId"]
       for _ in range(2)]
while sum(j["status"] == "RUNNING" for j in emulator.describe_jobs(jobs=ids)["jobs"]) < 2:
    time.sleep(0.02)
print("running", flush=True)
time.sleep(600)
"""


@needs_cgroups
@pytest.mark.slow
def test_groups_left_by_an_emulator_that_crashed_are_swept_by_the_next_start(make_emulator, tmp_path):
    folder = tmp_path / "emulator"
    crashed = subprocess.Popen([sys.executable, "-c", CRASHING, str(folder)], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert crashed.stdout.readline().strip() == "running"
        tag = f"-{crashed.pid}-"
        left = [g for g in attempt_groups() if tag in g.name]
        assert len(left) >= 2  # memory (and cpu) groups of its two attempts
        os.kill(crashed.pid, signal.SIGKILL)
        crashed.wait()
        # its attempts die with it (PDEATHSIG); its groups stay until someone removes them
        wait_until(lambda: all(not (g / "cgroup.procs").read_text().split() for g in left
                               if g.exists()), "the attempts to die")
        assert all(g.exists() for g in left)
        make_emulator(folder)  # a later start sweeps its predecessors' leftovers
        wait_until(lambda: not any(g.exists() for g in left), "the groups to be swept")
    finally:
        if crashed.poll() is None:
            crashed.kill()
            crashed.wait()


@pytest.mark.slow
@needs_cgroups
def test_the_out_of_memory_kill_through_the_http_endpoint_with_stock_boto3(make_emulator):
    emu = make_emulator()
    # the endpoint serves only requests signed with its pair: the one the clients below use
    with EmulatorServer(emu.emulator, access_key_id="x", secret_access_key="x") as server:
        batch = boto3.client("batch", endpoint_url=server.endpoint_url, region_name="us-east-1",
                             aws_access_key_id="x", aws_secret_access_key="x",
                             config=Config(retries={"max_attempts": 1}))
        job_id = batch.submit_job(
            jobName="oom", jobQueue="batchfutures", jobDefinition="batchfutures-worker",
            containerOverrides={"command": py(PLAIN_ALLOCATION),
                                "resourceRequirements": [{"type": "MEMORY", "value": "128"}]})["jobId"]
        detail = wait_until(lambda: next((j for j in batch.describe_jobs(jobs=[job_id])["jobs"]
                                          if j["status"] in ("SUCCEEDED", "FAILED")), None),
                            "the job to end")
        container = detail["attempts"][0]["container"]
        assert (container["exitCode"], container["reason"]) == (137, OOM)
        job_id = batch.submit_job(
            jobName="killed", jobQueue="batchfutures", jobDefinition="batchfutures-worker",
            containerOverrides={"command": py("import os; os.kill(os.getpid(), 9)"),
                                "resourceRequirements": [{"type": "MEMORY", "value": "128"}]})["jobId"]
        detail = wait_until(lambda: next((j for j in batch.describe_jobs(jobs=[job_id])["jobs"]
                                          if j["status"] in ("SUCCEEDED", "FAILED")), None),
                            "the job to end")
        container = detail["attempts"][0]["container"]
        assert container["exitCode"] == 137 and "reason" not in container


def test_cpu_shares_become_cgroup_v2_weights_as_docker_converts_them():
    assert cgroups.shares_to_weight(2) == 1
    assert cgroups.shares_to_weight(1024) == 39
    assert cgroups.shares_to_weight(262144) == 10000
