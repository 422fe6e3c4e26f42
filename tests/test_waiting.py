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
