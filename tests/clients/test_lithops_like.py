"""The calls Lithops 3.x's `aws_batch` backend makes (3.8.0 from PyPI, lithops/serverless/
backends/aws_batch/aws_batch.py: `_create_compute_env`, `_create_queue`, `_create_job_def`,
`invoke`, `clean`), in
its order and with its arguments, made with boto3 against `python -m batchfutures.emulator`:
it creates its own compute environment and job queue, waits for each to be VALID, registers
its job definition, submits an array job, then disables and deletes the queue and the
environment, waiting for each to be gone.

Real Lithops runs against the emulator in test_lithops.py (Lithops is in the `test` extra; its
commandless job definition runs the entry point given with `--image`). This copy of its calls
stays for what that run cannot show: each transition seen on the way (CREATING, then VALID, on
an emulator with its default control-plane delay, polled every 0.1 s where Lithops sleeps 3 to
30 s), in a few seconds. One deviation: the definition here carries the command Lithops' image
would run (it reads `__LITHOPS_PAYLOAD` and the array index, as Lithops' entry point does), as
this module shares the plain `endpoint` fixture, started with no `--image`.
"""

from __future__ import annotations

import json
import time

import boto3
import pytest

pytestmark = pytest.mark.slow  # an emulator process, job processes

PACKAGE = "lithops_v3-8-0_TEST"  # f"lithops_v{version}_{last 4 of the access key}"
ENV_TYPE = "FARGATE_SPOT"
QUEUE = f"{PACKAGE}_{ENV_TYPE.replace('_', '-')}_queue"
ENV = f"{PACKAGE}_{ENV_TYPE.replace('_', '-')}_env"
JOB_DEF = f"{PACKAGE}--{ENV_TYPE}--batch-default-runtime-v311--latest--1024mb"
POLL = 0.1  # Lithops sleeps 3 to 30 s between polls; the calls are the same
ENTRY_POINT = """
import json, os, pathlib
payload = json.loads(os.environ["__LITHOPS_PAYLOAD"])
index = int(os.environ.get("AWS_BATCH_JOB_ARRAY_INDEX", "0"))
out = pathlib.Path(payload["results"]) / f"{index}.json"
out.write_text(json.dumps({"call": index, "value": payload["data"][index] ** 2,
                           "action": os.environ["__LITHOPS_ACTION"]}))
"""


def poll(what, done, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"still {value!r}"
        time.sleep(POLL)


def test_a_lithops_like_client_creates_maps_and_cleans_up(endpoint, tmp_path):
    batch = boto3.client("batch", region_name="us-east-1", endpoint_url=endpoint.url,
                         aws_access_key_id=endpoint.access_key_id,
                         aws_secret_access_key=endpoint.secret_access_key)

    def compute_envs(name=None):  # _get_compute_env
        res = batch.describe_compute_environments()
        assert res["ResponseMetadata"]["HTTPStatusCode"] == 200
        if name is None:
            return [ce for ce in res["computeEnvironments"] if PACKAGE in ce["computeEnvironmentName"]]
        found = [ce for ce in res["computeEnvironments"] if ce["computeEnvironmentName"] == name]
        assert len(found) <= 1
        return found[0] if found else None

    def job_queues(name=None):  # _get_job_queue
        res = batch.describe_job_queues()
        if name is None:
            return [jq for jq in res["jobQueues"] if PACKAGE in jq["jobQueueName"]]
        found = [jq for jq in res["jobQueues"] if jq["jobQueueName"] == name]
        return found[0] if found else None

    def job_defs(name=None):  # _get_job_def
        res = batch.describe_job_definitions(status="ACTIVE")
        if name is None:
            return [jd for jd in res["jobDefinitions"] if PACKAGE in jd["jobDefinitionName"]]
        found = [jd for jd in res["jobDefinitions"] if jd["jobDefinitionName"] == name]
        return found[0] if found else None

    # _create_compute_env
    assert compute_envs(ENV) is None
    res = batch.create_compute_environment(
        computeEnvironmentName=ENV, type="MANAGED",
        computeResources={"type": ENV_TYPE, "maxvCpus": 2, "subnets": ["subnet-0123"],
                          "securityGroupIds": ["sg-0123"]},
        serviceRole="")  # Lithops sends "" when no service role is configured
    assert res["ResponseMetadata"]["HTTPStatusCode"] == 200
    statuses = [compute_envs(ENV)["status"]]
    statuses.append(poll(lambda: compute_envs(ENV)["status"], lambda s: s != "CREATING"))
    assert statuses == ["CREATING", "VALID"]
    assert compute_envs(ENV)["state"] == "ENABLED"

    # _create_queue
    assert job_queues(QUEUE) is None
    batch.create_job_queue(jobQueueName=QUEUE, priority=1,
                           computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ENV}])
    assert poll(lambda: job_queues(QUEUE)["status"], lambda s: s != "CREATING") == "VALID"

    # _create_job_def (platformCapabilities FARGATE for a FARGATE_SPOT environment)
    assert job_defs(JOB_DEF) is None
    res = batch.register_job_definition(
        jobDefinitionName=JOB_DEF, type="container",
        containerProperties={
            "image": f"123456789012.dkr.ecr.us-east-1.amazonaws.com/{PACKAGE.lower()}/runtime:latest",
            "executionRoleArn": "arn:aws:iam::123456789012:role/ecsTaskExecutionRole",
            "jobRoleArn": "arn:aws:iam::123456789012:role/lithops-job-role",
            "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                     {"type": "MEMORY", "value": "1024"}],
            "networkConfiguration": {"assignPublicIp": "DISABLED"},
            "command": ["python", "-c", ENTRY_POINT]},  # the deviation: see the module doc
        platformCapabilities=["FARGATE"])
    assert res["ResponseMetadata"]["HTTPStatusCode"] == 200

    # invoke: total_workers > 1, so one array job
    data = [3, 1, 4, 1, 5]
    payload = {"executor_id": "abc123-0", "job_id": "M000", "data": data,
               "results": str(tmp_path)}
    submitted = batch.submit_job(
        jobName=f"{JOB_DEF}_abc123-0-M000", jobQueue=QUEUE, jobDefinition=JOB_DEF,
        arrayProperties={"size": len(data)},
        containerOverrides={"environment": [
            {"name": "__LITHOPS_ACTION", "value": "run_job"},
            {"name": "__LITHOPS_PAYLOAD", "value": json.dumps(payload)}]})
    final = poll(lambda: batch.describe_jobs(jobs=[submitted["jobId"]])["jobs"][0],
                 lambda job: job["status"] in ("SUCCEEDED", "FAILED"))
    assert final["status"] == "SUCCEEDED", final.get("statusReason")
    results = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(len(data))]
    assert [r["value"] for r in results] == [x * x for x in data]
    assert {r["action"] for r in results} == {"run_job"}

    # clean: job definitions, then queues, then compute environments
    for job_def in job_defs():
        batch.deregister_job_definition(jobDefinition=job_def["jobDefinitionArn"])
    assert job_defs() == []
    for job_queue in job_queues():
        batch.update_job_queue(jobQueue=job_queue["jobQueueArn"], state="DISABLED")
        name = job_queue["jobQueueName"]
        poll(lambda n=name: job_queues(n)["status"], lambda s: s == "VALID")
        batch.delete_job_queue(jobQueue=job_queue["jobQueueArn"])
        poll(lambda n=name: job_queues(n), lambda jq: jq is None or jq["status"] == "DELETED")
    assert job_queues() == []
    for compute_env in compute_envs():
        batch.update_compute_environment(computeEnvironment=compute_env["computeEnvironmentArn"],
                                         state="DISABLED")
        name = compute_env["computeEnvironmentName"]
        poll(lambda n=name: compute_envs(n)["status"], lambda s: s == "VALID")
        batch.delete_compute_environment(computeEnvironment=compute_env["computeEnvironmentArn"])
        poll(lambda n=name: compute_envs(n), lambda ce: ce is None or ce["status"] == "DELETED")
    assert compute_envs() == []
    # what the emulator was started with is untouched
    assert [q["jobQueueName"] for q in batch.describe_job_queues()["jobQueues"]] == ["batchfutures"]
