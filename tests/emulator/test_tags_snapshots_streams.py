"""The calls third-party clients make besides running jobs, through stock boto3 clients on the
HTTP endpoint (every answer checked against botocore's model): Batch's ListTagsForResource,
TagResource, UntagResource and GetJobQueueSnapshot, CloudWatch Logs' DescribeLogStreams and
DescribeLogGroups, and what AWS refuses of them.

No job here starts a process: jobs ask for more vCPUs than the emulator has and wait RUNNABLE,
and log streams are files written by the test (a stream is a file of the logs folder).
"""

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from emulator_harness import wait_until
from model_check import Checked

from batchfutures.emulator import BatchEmulator
from batchfutures.emulator.server import EmulatorServer

QUEUE, DEFINITION, GROUP = "batchfutures", "batchfutures-worker", "/aws/batch/job"
KEYS = {"access_key_id": "AKIDEMULATORTEST", "secret_access_key": "emulator-test-secret"}
BIG = "1000000"  # vCPUs no emulator has: the job is held RUNNABLE, no process starts
ACCOUNT_ARN = "arn:aws:batch:us-east-1:123456789012"


@pytest.fixture
def emulator(tmp_path):
    service = BatchEmulator(tmp_path / "emulator", max_vcpus=2)
    yield service
    service.close()


@pytest.fixture
def server(emulator):
    with EmulatorServer(Checked(emulator), **KEYS) as running:
        yield running


def make_client(name, server):
    return boto3.client(name, endpoint_url=server.endpoint_url, region_name="us-east-1",
                        aws_access_key_id=KEYS["access_key_id"],
                        aws_secret_access_key=KEYS["secret_access_key"],
                        config=Config(retries={"mode": "standard", "max_attempts": 0}))


@pytest.fixture
def batch(server):
    return make_client("batch", server)


@pytest.fixture
def logs(server):
    return make_client("logs", server)


def held(batch, name="held", queue=QUEUE, **extra):
    """A job that waits RUNNABLE (it asks for more vCPUs than there are): its submit answer."""
    return batch.submit_job(jobName=name, jobQueue=queue, jobDefinition=DEFINITION,
                            containerOverrides={"command": ["true"], "resourceRequirements": [
                                {"type": "VCPU", "value": BIG}, {"type": "MEMORY", "value": "64"}]},
                            **extra)


def wait_status(batch, job_id, status):
    return wait_until(lambda: (batch.describe_jobs(jobs=[job_id])["jobs"] or [{}])[0]
                      .get("status") == status, f"{job_id} {status}")


def refused(call, code="ClientException", words=""):
    with pytest.raises(ClientError) as raised:
        call()
    error = raised.value.response["Error"]
    assert error["Code"] == code, error
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert words.lower() in error["Message"].lower(), error
    return error["Message"]


# -- tags -------------------------------------------------------------------------------------
def test_a_jobs_tags_are_listed_changed_and_shown_by_describe_jobs(batch):
    job = held(batch, tags={"team": "a", "cost": "1"})
    arn = job["jobArn"]
    assert batch.list_tags_for_resource(resourceArn=arn)["tags"] == {"team": "a", "cost": "1"}
    batch.tag_resource(resourceArn=arn, tags={"cost": "2", "owner": "me"})
    assert batch.list_tags_for_resource(resourceArn=arn)["tags"] == {
        "team": "a", "cost": "2", "owner": "me"}
    batch.untag_resource(resourceArn=arn, tagKeys=["team", "not-there"])
    assert batch.list_tags_for_resource(resourceArn=arn)["tags"] == {"cost": "2", "owner": "me"}
    assert batch.describe_jobs(jobs=[job["jobId"]])["jobs"][0]["tags"] == {"cost": "2", "owner": "me"}
    batch.cancel_job(jobId=job["jobId"], reason="done")


def test_a_job_propagating_tags_has_its_definitions_too(batch):
    definition = batch.register_job_definition(
        jobDefinitionName="tagged", type="container", propagateTags=True,
        tags={"from": "definition", "team": "d"},
        containerProperties={"image": "local", "command": ["true"], "resourceRequirements": [
            {"type": "VCPU", "value": BIG}, {"type": "MEMORY", "value": "64"}]})
    job = batch.submit_job(jobName="propagating", jobQueue=QUEUE,
                           jobDefinition=definition["jobDefinitionArn"], tags={"team": "j"})
    assert batch.list_tags_for_resource(resourceArn=job["jobArn"])["tags"] == {
        "from": "definition", "team": "j"}  # the job's win
    plain = batch.submit_job(jobName="plain", jobQueue=QUEUE, propagateTags=False,
                             jobDefinition=definition["jobDefinitionArn"], tags={"team": "j"})
    assert batch.list_tags_for_resource(resourceArn=plain["jobArn"])["tags"] == {"team": "j"}
    for answer in (job, plain):
        batch.cancel_job(jobId=answer["jobId"], reason="done")


def test_definition_and_queue_tags(batch):
    definition = batch.register_job_definition(
        jobDefinitionName="def-tags", type="container", tags={"a": "1"},
        containerProperties={"image": "local", "command": ["true"], "resourceRequirements": [
            {"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "64"}]})
    arn = definition["jobDefinitionArn"]
    batch.tag_resource(resourceArn=arn, tags={"b": "2"})
    assert batch.list_tags_for_resource(resourceArn=arn)["tags"] == {"a": "1", "b": "2"}
    (described,) = batch.describe_job_definitions(jobDefinitions=[arn])["jobDefinitions"]
    assert described["tags"] == {"a": "1", "b": "2"}
    batch.untag_resource(resourceArn=arn, tagKeys=["a", "b"])
    assert batch.list_tags_for_resource(resourceArn=arn)["tags"] == {}

    created = batch.create_job_queue(jobQueueName="tagged-queue", priority=1,
                                     computeEnvironmentOrder=[], tags={"q": "1"})
    queue_arn = created["jobQueueArn"]
    assert batch.list_tags_for_resource(resourceArn=queue_arn)["tags"] == {"q": "1"}
    batch.tag_resource(resourceArn=queue_arn, tags={"r": "2"})
    (queue,) = batch.describe_job_queues(jobQueues=["tagged-queue"])["jobQueues"]
    assert queue["tags"] == {"q": "1", "r": "2"}


def test_tags_live_in_the_records_another_instance_reads(emulator, batch, tmp_path):
    job = held(batch, tags={"team": "a"})
    batch.tag_resource(resourceArn=f"{ACCOUNT_ARN}:job-queue/{QUEUE}", tags={"shared": "yes"})
    other = Checked(BatchEmulator(tmp_path / "emulator", max_vcpus=1))
    try:
        assert other.list_tags_for_resource(
            resourceArn=f"{ACCOUNT_ARN}:job-queue/{QUEUE}")["tags"] == {"shared": "yes"}
        wait_until(lambda: other.describe_jobs(jobs=[job["jobId"]])["jobs"], "the record")
        # the other instance tags the job: its owner (this emulator) writes it in its record
        other.tag_resource(resourceArn=job["jobArn"], tags={"by": "other"})
        assert batch.list_tags_for_resource(resourceArn=job["jobArn"])["tags"] == {
            "team": "a", "by": "other"}
        wait_until(lambda: other.list_tags_for_resource(resourceArn=job["jobArn"])["tags"]
                   == {"team": "a", "by": "other"}, "the tags in the record")
        batch.cancel_job(jobId=job["jobId"], reason="done")
        wait_status(batch, job["jobId"], "FAILED")
        emulator.close()  # its owner is gone: the record itself takes the change
        other.untag_resource(resourceArn=job["jobArn"], tagKeys=["team"])
        assert other.list_tags_for_resource(resourceArn=job["jobArn"])["tags"] == {"by": "other"}
        again = Checked(BatchEmulator(tmp_path / "emulator", max_vcpus=1))
        try:
            assert again.describe_jobs(jobs=[job["jobId"]])["jobs"][0]["tags"] == {"by": "other"}
        finally:
            again.emulator.close()
    finally:
        other.emulator.close()


@pytest.mark.slow
def test_tagging_another_processs_job_goes_through_its_owner(tmp_path):
    """The job's owner is `python -m batchfutures.emulator`: it writes the change in the record."""
    repo = Path(__file__).resolve().parents[2]
    path = [str(repo), os.environ.get("PYTHONPATH")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    process = subprocess.Popen(
        [sys.executable, "-m", "batchfutures.emulator", "--port", "0", "--folder", str(tmp_path),
         "--max-vcpus", "1", "--access-key-id", KEYS["access_key_id"]],  # the secret: below
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(env, BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY=KEYS["secret_access_key"]))
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url or process.stderr.read()
        remote = boto3.client("batch", endpoint_url=url, region_name="us-east-1",
                              aws_access_key_id=KEYS["access_key_id"],
                              aws_secret_access_key=KEYS["secret_access_key"])
        job = held(remote, tags={"team": "a"})
        local = Checked(BatchEmulator(tmp_path, max_vcpus=1))
        try:
            wait_until(lambda: local.describe_jobs(jobs=[job["jobId"]])["jobs"], "the record")
            local.tag_resource(resourceArn=job["jobArn"], tags={"by": "local"})
            wait_until(lambda: remote.list_tags_for_resource(resourceArn=job["jobArn"])["tags"]
                       == {"team": "a", "by": "local"}, "the owner's change")
            wait_until(lambda: local.list_tags_for_resource(resourceArn=job["jobArn"])["tags"]
                       == {"team": "a", "by": "local"}, "the record's change")
        finally:
            local.emulator.close()
        remote.cancel_job(jobId=job["jobId"], reason="done")
    finally:
        process.terminate()
        process.communicate(timeout=30)


def test_tags_batch_refuses(batch):
    job = held(batch)
    arn = job["jobArn"]
    refused(lambda: batch.tag_resource(resourceArn=arn, tags={"aws:owner": "x"}), words="aws:")
    refused(lambda: batch.tag_resource(resourceArn=arn, tags={"AWS:Owner": "x"}), words="aws:")
    refused(lambda: batch.untag_resource(resourceArn=arn, tagKeys=["aws:owner"]), words="aws:")
    refused(lambda: batch.tag_resource(resourceArn=arn, tags={"k" * 129: "x"}), words="128")
    refused(lambda: batch.tag_resource(resourceArn=arn, tags={"k": "v" * 257}), words="256")
    refused(lambda: batch.tag_resource(resourceArn=arn, tags={"k": "a|b"}))
    refused(lambda: batch.tag_resource(resourceArn=arn, tags={f"k{i}": "v" for i in range(51)}),
            words="50")
    batch.tag_resource(resourceArn=arn, tags={f"k{i}": "v" for i in range(40)})
    refused(lambda: batch.tag_resource(resourceArn=arn, tags={f"n{i}": "v" for i in range(11)}),
            words="50")
    assert len(batch.list_tags_for_resource(resourceArn=arn)["tags"]) == 40  # unchanged
    refused(lambda: held(batch, name="reserved", tags={"aws:x": "y"}), words="aws:")
    refused(lambda: batch.create_job_queue(jobQueueName="bad-tags", priority=1,
                                           computeEnvironmentOrder=[], tags={"aws:x": "y"}),
            words="aws:")
    # resources that do not exist, or are no job, job definition or job queue
    missing = f"{ACCOUNT_ARN}:job/00000000-0000-0000-0000-000000000000"
    for resource in (missing, f"{arn}:0", f"{ACCOUNT_ARN}:job-queue/nope",
                     f"{ACCOUNT_ARN}:job-definition/{DEFINITION}:99",
                     f"{ACCOUNT_ARN}:compute-environment/batchfutures-local", "not-an-arn"):
        refused(lambda arn=resource: batch.list_tags_for_resource(resourceArn=arn))
        refused(lambda arn=resource: batch.tag_resource(resourceArn=arn, tags={"k": "v"}))
    batch.cancel_job(jobId=job["jobId"], reason="done")


# -- GetJobQueueSnapshot ----------------------------------------------------------------------
def test_the_snapshot_lists_the_runnable_jobs_in_the_order_they_would_run(batch):
    batch.create_job_queue(jobQueueName="other", priority=1, computeEnvironmentOrder=[])
    first, second = held(batch, "first"), held(batch, "second")
    elsewhere = held(batch, "elsewhere", queue="other")
    array = held(batch, "array", arrayProperties={"size": 2})
    children = [f"{array['jobId']}:0", f"{array['jobId']}:1"]
    for job_id in [first["jobId"], second["jobId"], *children]:
        wait_status(batch, job_id, "RUNNABLE")
    snapshot = batch.get_job_queue_snapshot(jobQueue=QUEUE)
    front = snapshot["frontOfQueue"]
    assert [j["jobArn"].rsplit("/", 1)[-1] for j in front["jobs"]] == [
        first["jobId"], second["jobId"], *children]
    assert front["lastUpdatedAt"] >= max(j["earliestTimeAtPosition"] for j in front["jobs"])
    by_arn = batch.get_job_queue_snapshot(jobQueue=f"{ACCOUNT_ARN}:job-queue/other")
    assert [j["jobArn"] for j in by_arn["frontOfQueue"]["jobs"]] == [elsewhere["jobArn"]]
    batch.cancel_job(jobId=first["jobId"], reason="done")
    wait_status(batch, first["jobId"], "FAILED")
    after = batch.get_job_queue_snapshot(jobQueue=QUEUE)["frontOfQueue"]["jobs"]
    assert after[0]["jobArn"] == second["jobArn"]
    for job in (second, elsewhere, array):
        batch.cancel_job(jobId=job["jobId"], reason="done")
    refused(lambda: batch.get_job_queue_snapshot(jobQueue="no-such-queue"), words="no-such-queue")


# -- DescribeLogStreams, DescribeLogGroups ----------------------------------------------------
def write_stream(emulator, name, text, mtime):
    path = emulator.folder / "logs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def test_describe_log_streams_orders_filters_and_pages(emulator, logs):
    write_stream(emulator, "def/default/b", "one\n", 1_700_000_300)
    write_stream(emulator, "def/default/a", "two\n", 1_700_000_100)
    write_stream(emulator, "other/default/c", "three\n", 1_700_000_200)
    write_stream(emulator, "def/default/empty", "", 1_700_000_000)

    def names(**params):
        return [s["logStreamName"] for s in logs.describe_log_streams(logGroupName=GROUP, **params)
                ["logStreams"]]

    everything = ["def/default/a", "def/default/b", "def/default/empty", "other/default/c"]
    assert names() == everything
    assert names(descending=True) == everything[::-1]
    assert names(logStreamNamePrefix="def/default/") == everything[:3]
    assert names(logStreamNamePrefix="def/default/a") == ["def/default/a"]
    assert names(orderBy="LastEventTime") == [
        "def/default/empty", "def/default/a", "other/default/c", "def/default/b"]
    assert names(orderBy="LastEventTime", descending=True)[0] == "def/default/b"
    (stream,) = logs.describe_log_streams(logGroupName=GROUP, logStreamNamePrefix="def/default/b")[
        "logStreams"]
    assert stream["lastEventTimestamp"] == stream["firstEventTimestamp"] == 1_700_000_300_000
    assert stream["creationTime"] <= stream["firstEventTimestamp"]
    assert stream["arn"].endswith(":log-group:/aws/batch/job:log-stream:def/default/b")
    for order in ("LogStreamName", "LastEventTime"):
        pages, token = [], None
        while True:
            extra = {"nextToken": token} if token else {}
            page = logs.describe_log_streams(logGroupName=GROUP, orderBy=order, limit=3, **extra)
            pages.append([s["logStreamName"] for s in page["logStreams"]])
            token = page.get("nextToken")
            if not token:
                break
        assert [len(p) for p in pages] == [3, 1]
        assert sorted(sum(pages, [])) == everything
    # the CLI's own paginator follows the tokens too
    paginator = logs.get_paginator("describe_log_streams")
    assert [s["logStreamName"] for page in paginator.paginate(logGroupName=GROUP, limit=1)
            for s in page["logStreams"]] == everything


def test_describe_log_streams_refuses_what_cloudwatch_refuses(logs):
    refused(lambda: logs.describe_log_streams(logGroupName=GROUP, orderBy="LastEventTime",
                                              logStreamNamePrefix="def/"),
            "InvalidParameterException", "LastEventTime")
    refused(lambda: logs.describe_log_streams(logGroupName="/aws/batch/other"),
            "ResourceNotFoundException")
    refused(lambda: logs.describe_log_streams(), "InvalidParameterException")
    refused(lambda: logs.describe_log_streams(logGroupName=GROUP, logGroupIdentifier=GROUP),
            "InvalidParameterException")
    refused(lambda: logs.describe_log_streams(logGroupName=GROUP, nextToken="garbage"),
            "InvalidParameterException", "nextToken")
    refused(lambda: logs.describe_log_streams(logGroupName=GROUP, limit=51),
            "InvalidParameterException")


def test_describe_log_groups_knows_batchs_group(logs):
    (group,) = logs.describe_log_groups()["logGroups"]
    assert group["logGroupName"] == GROUP
    assert group["arn"] == group["logGroupArn"] + ":*"
    assert logs.describe_log_groups(logGroupNamePrefix="/aws/batch")["logGroups"] == [group]
    assert logs.describe_log_groups(logGroupNamePrefix="/aws/lambda")["logGroups"] == []
    assert logs.describe_log_groups(logGroupNamePattern="BATCH")["logGroups"] == [group]
    assert logs.describe_log_groups(limit=1)["logGroups"] == [group]
    assert "nextToken" not in logs.describe_log_groups(limit=1)
    refused(lambda: logs.describe_log_groups(logGroupNamePrefix="/aws", logGroupNamePattern="b"),
            "InvalidParameterException")
    refused(lambda: logs.describe_log_groups(nextToken="garbage"), "InvalidParameterException")
    refused(lambda: logs.describe_log_groups(limit=51), "InvalidParameterException")
