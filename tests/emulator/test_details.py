"""Smaller parts of the contract: parameters, GPUs, interpreters, ids, the environment, records."""

import json
import sys
import threading

import pytest
from emulator_harness import QUEUE, py, wait_until

import batchfutures.emulator.records as records


@pytest.mark.slow
def test_ref_parameters_are_substituted_in_the_command(emu):
    emu.register_job_definition(
        jobDefinitionName="with-parameters", type="container", parameters={"word": "default"},
        containerProperties={"image": "local", "command": py("print('Ref::word')"),
                             "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                                      {"type": "MEMORY", "value": "256"}]})
    request = dict(jobQueue=QUEUE, jobDefinition="with-parameters")
    given = emu.wait(emu.submit_job(jobName="given", parameters={"word": "given"}, **request)["jobId"])
    default = emu.wait(emu.submit_job(jobName="default", **request)["jobId"])
    assert emu.log_lines(given) == ["given"] and emu.log_lines(default) == ["default"]
    assert given["parameters"] == {"word": "given"}
    assert given["container"]["command"] == py("print('given')")


@pytest.mark.slow
def test_a_gpu_requirement_runs_where_the_emulator_has_gpus(make_emulator):
    emu = make_emulator(gpus=1)
    job = emu.submit_job(jobName="gpu", jobQueue=QUEUE, jobDefinition="batchfutures-worker",
                         containerOverrides={"command": py("pass"), "resourceRequirements": [
                             {"type": "GPU", "value": "1"}]})["jobId"]
    detail = emu.wait(job)
    assert detail["status"] == "SUCCEEDED"
    assert {"type": "GPU", "value": "1"} in detail["container"]["resourceRequirements"]


def test_more_gpus_than_the_emulator_has_wait_runnable_with_batchs_reason(make_emulator):
    emu = make_emulator(gpus=0)
    job = emu.submit_job(jobName="gpu", jobQueue=QUEUE, jobDefinition="batchfutures-worker",
                         containerOverrides={"command": py("pass"), "resourceRequirements": [
                             {"type": "GPU", "value": "1"}]})["jobId"]
    detail = emu.wait(job, ["RUNNABLE"], check=lambda d: "statusReason" in d)
    assert detail["statusReason"].startswith("MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT")


@pytest.mark.slow
def test_python_python3_and_python3_x_mean_this_interpreter(emu):
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for name in ("python", "python3", version):
        detail = emu.run([name, "-S", "-c", "import sys; print(sys.executable)"], name=name.replace(".", "-"))
        assert detail["status"] == "SUCCEEDED"
        assert emu.log_lines(detail) == [sys.executable]


@pytest.mark.slow
def test_jobs_are_found_by_arn_too(emu):
    response = emu.submit_job(jobName="arn", jobQueue=QUEUE, jobDefinition="batchfutures-worker",
                              containerOverrides={"command": py("pass")})
    emu.wait(response["jobId"])
    [detail] = emu.describe_jobs(jobs=[response["jobArn"]])["jobs"]
    assert detail["jobId"] == response["jobId"]


@pytest.mark.slow
def test_operations_by_api_name(emu):
    job = emu.emulator.invoke("SubmitJob", {"jobName": "by-name", "jobQueue": QUEUE,
                                            "jobDefinition": "batchfutures-worker",
                                            "containerOverrides": {"command": py("print('hi')")}})
    detail = emu.wait(job["jobId"])
    stream = detail["container"]["logStreamName"]
    page = emu.emulator.invoke("GetLogEvents", {"logGroupName": "/aws/batch/job",
                                                "logStreamName": stream, "startFromHead": True})
    assert [e["message"] for e in page["events"]] == ["hi"]


@pytest.mark.slow
def test_records_are_rewritten_per_interval_not_per_transition(emu, monkeypatch):
    writes = []
    original = records.write_atomically

    def counting(path, text):
        writes.append(path.name)
        original(path, text)

    monkeypatch.setattr(records, "write_atomically", counting)
    size = 40
    array = emu.job(["true"], name="counted", size=size)
    assert emu.wait(array)["status"] == "SUCCEEDED"
    record = emu.emulator.folder / "jobs" / f"{array}.json"
    wait_until(lambda: record.exists() and json.loads(record.read_text())["job"]["status"] == "SUCCEEDED",
               "the final record on disk")
    transitions = size * 5  # each child: PENDING, RUNNABLE, STARTING, RUNNING, SUCCEEDED
    chunk_writes = [name for name in writes if name == "0.json"]
    assert 0 < len(chunk_writes) < transitions / 4


@pytest.mark.slow
def test_calls_from_many_threads_at_once(make_emulator):
    emu = make_emulator(max_vcpus=2)
    submitted, errors = [], []

    def client(number):
        try:
            ids = [emu.job(py("pass"), name=f"t{number}-{i}") for i in range(3)]
            ids.append(emu.job(py("pass"), name=f"t{number}-array", size=2))
            submitted.extend(ids)
            for job_id in ids:  # describe and list while the scheduler moves them
                emu.describe_jobs(jobs=ids)
                emu.list_jobs(jobQueue=QUEUE, jobStatus="RUNNING")
                emu.wait(job_id)
        except Exception as error:  # reported below, with the thread's failure
            errors.append(error)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    assert len(set(submitted)) == 24
    details = emu.describe_jobs(jobs=submitted)["jobs"]
    assert [d["status"] for d in details] == ["SUCCEEDED"] * 24


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["rlimit", "auto"])
@pytest.mark.parametrize("path", ["setpriv+prlimit", "setpriv+prlimit(2)", "preexec_fn"])
def test_every_launch_path_sets_the_memory_limit_and_the_death_signal(make_emulator, monkeypatch,
                                                                      path, isolation):
    from batchfutures.emulator.runtime import launcher

    if path != "setpriv+prlimit":
        monkeypatch.setattr(launcher, "_prlimit_path", None)
    if path == "preexec_fn":
        monkeypatch.setattr(launcher, "_setpriv_path", None)
    emu = make_emulator(isolation=isolation)
    code = ("import ctypes, os, resource\n"
            "print(*resource.getrlimit(resource.RLIMIT_DATA))\n"
            "signal = ctypes.c_int()\n"
            "ctypes.CDLL(None).prctl(2, ctypes.byref(signal))  # PR_GET_PDEATHSIG\n"
            "print(signal.value, os.getsid(0) == os.getpid() == os.getpgid(0))\n"
            "print('batchfutures-' in open('/proc/self/cgroup').read())\n")
    detail = emu.run(py(code), memory=300)
    assert detail["status"] == "SUCCEEDED", emu.log_lines(detail)
    limit, death, in_cgroup = emu.log_lines(detail)
    if emu.cgroups is None:  # the fallback: RLIMIT_DATA is the limit
        assert limit == f"{300 * 1024 * 1024} {300 * 1024 * 1024}"
        assert in_cgroup == "False"
    else:  # the attempt's own cgroup is, from its first instruction
        assert limit == "-1 -1"
        assert in_cgroup == "True"
    assert death == "9 True"  # SIGKILL when the emulator goes; its own session and group
