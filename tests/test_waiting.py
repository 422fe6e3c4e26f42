"""ex.job(id).waiting: why a RUNNABLE job waits, from what Batch describes (pure)."""

import pytest

from batchfutures.waiting import needs_of, place_in_queue, why_waiting

ARN = "arn:aws:batch:us-east-1:123456789012:job/{}"


def job(job_id="j1", vcpus=1, memory=2048, gpus=0, reason=None, status="RUNNABLE", consumes=None):
    requirements = [{"type": "VCPU", "value": str(vcpus)}, {"type": "MEMORY", "value": str(memory)}]
    if gpus:
        requirements.append({"type": "GPU", "value": str(gpus)})
    detail = {"jobId": job_id, "jobArn": ARN.format(job_id), "status": status,
              "container": {"resourceRequirements": requirements}}
    if reason:
        detail["statusReason"] = reason
    if consumes:
        detail["consumableResourceProperties"] = {"consumableResourceList": [
            {"consumableResource": name, "quantity": quantity} for name, quantity in consumes.items()]}
    return detail


def snapshot(*job_ids, vcpus_in_use=None):
    answer = {"frontOfQueue": {"jobs": [{"jobArn": ARN.format(j), "earliestTimeAtPosition": 1}
                                        for j in job_ids], "lastUpdatedAt": 1}}
    if vcpus_in_use is not None:
        answer["queueUtilization"] = {"totalCapacityUsage": [
            {"capacityUnit": "VCPU", "quantity": vcpus_in_use}]}
    return answer


def ce(name="ce", state="ENABLED", status="VALID", max_vcpus=16, kind="EC2", reason=None):
    detail = {"computeEnvironmentName": name, "computeEnvironmentArn": f"arn:ce/{name}",
              "state": state, "status": status,
              "computeResources": {"type": kind, "maxvCpus": max_vcpus}}
    if reason:
        detail["statusReason"] = reason
    return detail


QUEUE = {"jobQueueName": "q", "state": "ENABLED", "status": "VALID"}
LICENCE = {"consumableResourceName": "licence", "consumableResourceArn": "arn:cr/licence",
           "totalQuantity": 3, "inUseQuantity": 3, "availableQuantity": 0}


@pytest.mark.parametrize("case, kwargs, reason, position, words", [
    ("not runnable", dict(job=job(status="RUNNING")), None, None, ()),
    ("third in line", dict(job=job("c"), snapshot=snapshot("a", "b", "c", vcpus_in_use=2),
                           queue=QUEUE, environments=[ce()]),
     "queued", 3, ("number 3", "2 RUNNABLE ahead")),
    ("behind the first 100", dict(job=job("z"), snapshot=snapshot(*[str(i) for i in range(100)])),
     "queued", None, ("behind the first 100",)),
    ("no snapshot read", dict(job=job(reason="waiting for capacity")), "queued", None,
     ("unknown", "Batch says: waiting for capacity")),
    ("queue disabled", dict(job=job(), queue=dict(QUEUE, state="DISABLED"), environments=[ce()]),
     "queue-disabled", None, ("DISABLED",)),
    ("every CE disabled or invalid",
     dict(job=job(), queue=QUEUE, environments=[ce("a", state="DISABLED"),
                                                ce("b", status="INVALID", reason="bad role")]),
     "environments-unusable", None, ("a DISABLED/VALID", "b ENABLED/INVALID (bad role)")),
    ("one CE usable is enough", dict(job=job("a"), snapshot=snapshot("a", vcpus_in_use=0),
                                     environments=[ce("a", state="DISABLED"), ce("b")]),
     "queued", 1, ()),
    ("more vCPUs than maxvCpus", dict(job=job(vcpus=32), environments=[ce(max_vcpus=16)]),
     "too-large", None, ("32 vCPU",)),
    ("a GPU on Fargate", dict(job=job(gpus=1), environments=[ce(kind="FARGATE", max_vcpus=256)]),
     "too-large", None, ("1 GPU",)),
    ("more memory than the CE's instances", dict(job=job(memory=600000), environments=[ce()],
                                                max_memory_mib={"ce": 390000}),
     "too-large", None, ("600000 MiB",)),
    ("Batch says too large", dict(job=job(reason="MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - x")),
     "too-large", None, ()),
    ("licence busy", dict(job=job("b", consumes={"licence": 1}), snapshot=snapshot("a", "b"),
                          environments=[ce()], resources=[LICENCE]),
     "resource-busy", 2, ("licence", "3 of 3 in use", "number 2")),
    ("licence free", dict(job=job(consumes={"licence": 1}), environments=[ce()],
                          resources=[dict(LICENCE, inUseQuantity=1, availableQuantity=2)]),
     "queued", None, ()),
    ("maxvCpus reached", dict(job=job("b", vcpus=2), snapshot=snapshot("a", "b", vcpus_in_use=15),
                              environments=[ce(max_vcpus=16)]),
     "capacity-full", 2, ("15 of 16 vCPUs",)),
    ("capacity over two CEs", dict(job=job("b", vcpus=2), snapshot=snapshot("b", vcpus_in_use=15),
                                   environments=[ce("x", max_vcpus=16), ce("y", max_vcpus=16)]),
     "queued", 1, ()),
])
def test_why_a_job_waits(case, kwargs, reason, position, words):
    waiting = why_waiting(kwargs.pop("job"), **kwargs)
    if reason is None:
        assert waiting is None
        return
    assert (waiting.reason, waiting.position) == (reason, position), case
    for word in words:
        assert word in str(waiting), (case, str(waiting))


def test_needs_and_place_read_batchs_shapes():
    assert needs_of({"container": {"vcpus": 2, "memory": 512}}) == {"VCPU": 2, "MEMORY": 512, "GPU": 0}
    assert needs_of(job(vcpus=0.5, memory=1024, gpus=1)) == {"VCPU": 0.5, "MEMORY": 1024, "GPU": 1}
    child = {"jobId": "p:3", "jobArn": ARN.format("p:3")}
    assert place_in_queue(child, snapshot("x", "p")) == 2  # an array child: its array's place
    assert place_in_queue(child, None) is None


def test_a_child_listed_on_its_own_takes_its_own_place():
    child = {"jobId": "p:1", "jobArn": ARN.format("p:1")}
    assert place_in_queue(child, snapshot("p:0", "p:1")) == 2
    assert place_in_queue({"jobId": "p"}, snapshot("x", "p")) == 2
    assert place_in_queue({"jobId": "q"}, snapshot("x", "p")) is None


def hold(path):
    import pathlib
    import time

    while not pathlib.Path(path).exists():
        time.sleep(0.02)
    return "released"


@pytest.mark.slow
def test_look_up_on_the_emulator_names_the_queue_place_and_capacity(local_env, tmp_path):
    import concurrent.futures
    import time

    from batchfutures import BatchExecutor
    from batchfutures.waiting import look_up

    release = tmp_path / "release"
    ex = BatchExecutor(local_env, vcpus=2)  # the emulator's 2 vCPUs: one call at a time
    try:
        first = ex.submit(hold, str(release))
        second = ex.with_settings(tags={"second": "1"}).submit(hold, str(release))  # its own job
        for future in (first, second):  # sent now, not after the coalescing window
            with pytest.raises(concurrent.futures.TimeoutError):
                future.result(timeout=0.01)
        deadline = time.monotonic() + 60
        while True:
            described = local_env.batch.describe_jobs(jobs=[first.job_id, second.job_id])["jobs"]
            statuses = {job["jobId"]: job for job in described}
            if (statuses[first.job_id]["status"], statuses[second.job_id]["status"]) == (
                    "RUNNING", "RUNNABLE"):
                break
            assert time.monotonic() < deadline, [job["status"] for job in described]
            time.sleep(0.05)
        waiting = look_up(local_env.batch, statuses[second.job_id])
        assert waiting.reason == "capacity-full" and waiting.position == 1, waiting
        assert "2 of 2 vCPUs" in str(waiting)
        assert look_up(local_env.batch, statuses[first.job_id]) is None
        shown = ex.job(second.job_id).waiting  # the executor's view of the same
        assert (shown.reason, shown.position) == ("capacity-full", 1)
        assert ex.job(first.job_id).waiting is None  # it runs
        from test_cli import run_cli  # `batchfutures status` says it too, from another process

        shown = run_cli(local_env.workdir, "status", second.job_id).stdout
        assert "waiting" in shown and "number 1 in its queue" in shown, shown
    finally:
        release.write_text("go")
        ex.shutdown(wait=True)
    assert first.result() == second.result() == "released"
