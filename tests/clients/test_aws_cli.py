"""The AWS CLI (v1, `awscli` from PyPI, run as `python -m awscli` with this interpreter; since 1.46
it carries its own botocore, `awscli/botocore`, so the endpoint meets a second botocore's models
and signer besides the installed one) against the emulator's endpoint: plain, array and multi-node jobs
submitted, described, listed, logged, cancelled and terminated, asserting what the CLI prints
(JSON output) and its exit status.

The CLI is configured only by the environment, as in CI: AWS_ENDPOINT_URL (one URL serves Batch
and CloudWatch Logs), the endpoint's pair in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY,
AWS_DEFAULT_REGION, and no config or credentials files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow  # an emulator process, CLI processes, job processes

QUEUE, GROUP = "batchfutures", "/aws/batch/job"
MAX_VCPUS = 4  # conftest.MAX_VCPUS: the emulator's

STATUS_KEYS = {"SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED"}
ESSENTIAL = "Essential container in task exited"
MISCONFIGURED = "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT"


class CliError(Exception):
    def __init__(self, returncode, stderr):
        super().__init__(f"aws exited {returncode}: {stderr.strip()}")
        self.returncode, self.stderr = returncode, stderr


@pytest.fixture(scope="module")
def aws(endpoint):
    """`aws("batch", "describe-jobs", "--jobs", id)`: the CLI's JSON answer, parsed (None when it
    prints nothing); a non-zero exit raises CliError with what it printed on stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=endpoint.url, AWS_ACCESS_KEY_ID=endpoint.access_key_id,
               AWS_SECRET_ACCESS_KEY=endpoint.secret_access_key, AWS_DEFAULT_REGION="us-east-1",
               AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               AWS_EC2_METADATA_DISABLED="true", NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")

    def run(*args):
        done = subprocess.run([sys.executable, "-m", "awscli", *args, "--output", "json"],
                              capture_output=True, text=True, timeout=120, env=env)
        if done.returncode != 0:
            raise CliError(done.returncode, done.stderr)
        return json.loads(done.stdout) if done.stdout.strip() else None

    return run


@pytest.fixture(scope="module")
def definition(aws):
    """A container job definition: prints its job id and array index, exits with $CODE (0)."""
    answer = aws("batch", "register-job-definition", "--job-definition-name", "cli-echo",
                 "--type", "container", "--container-properties", json.dumps({
                     "image": "local",
                     "command": ["sh", "-c", 'echo "job $AWS_BATCH_JOB_ID index '
                                 '${AWS_BATCH_JOB_ARRAY_INDEX:-none}"; exit ${CODE:-0}'],
                     "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                              {"type": "MEMORY", "value": "128"}]}))
    assert answer["jobDefinitionName"] == "cli-echo" and answer["revision"] >= 1
    assert answer["jobDefinitionArn"].endswith(f":job-definition/cli-echo:{answer['revision']}")
    return answer["jobDefinitionArn"]


def describe(aws, job_id):
    (job,) = aws("batch", "describe-jobs", "--jobs", job_id)["jobs"]
    return job


def wait_for(aws, job_id, statuses, deadline=90):
    """Poll describe-jobs (the CLI) until the job's status is one of `statuses`."""
    end = time.monotonic() + deadline
    while True:
        job = describe(aws, job_id)
        if job["status"] in statuses or time.monotonic() > end:
            assert job["status"] in statuses, job
            return job
        time.sleep(0.2)


def submit(aws, name, definition, *args):
    answer = aws("batch", "submit-job", "--job-name", name, "--job-queue", QUEUE,
                 "--job-definition", definition, *args)
    assert answer["jobName"] == name and answer["jobArn"].endswith(f":job/{answer['jobId']}")
    return answer["jobId"]


def log_lines(aws, stream):
    answer = aws("logs", "get-log-events", "--log-group-name", GROUP, "--log-stream-name", stream,
                 "--start-from-head")
    return [event["message"] for event in answer["events"]]


def sleeper(seconds=60):
    return ["--container-overrides", json.dumps({"command": ["sleep", str(seconds)]})]


def test_the_cli_sees_the_queue_and_compute_environment(aws):
    (queue,) = [q for q in aws("batch", "describe-job-queues")["jobQueues"]
                if q["jobQueueName"] == QUEUE]
    assert (queue["state"], queue["status"]) == ("ENABLED", "VALID")
    (order,) = queue["computeEnvironmentOrder"]
    (environment,) = aws("batch", "describe-compute-environments", "--compute-environments",
                         order["computeEnvironment"])["computeEnvironments"]
    assert environment["computeResources"]["maxvCpus"] == MAX_VCPUS
    assert (environment["state"], environment["status"]) == ("ENABLED", "VALID")


def test_a_plain_job_succeeds_and_its_log_stream_holds_what_it_printed(aws, definition):
    job_id = submit(aws, "cli-plain", definition)
    job = wait_for(aws, job_id, {"SUCCEEDED", "FAILED"})
    assert job["status"] == "SUCCEEDED", job
    assert job["statusReason"] == ESSENTIAL
    assert job["container"]["exitCode"] == 0
    assert job["jobDefinition"] == definition and job["jobQueue"].endswith(f":job-queue/{QUEUE}")
    assert job["createdAt"] <= job["startedAt"] <= job["stoppedAt"]
    (attempt,) = job["attempts"]
    stream = job["container"]["logStreamName"]
    assert attempt["container"]["logStreamName"] == stream and stream.startswith("cli-echo/default/")
    assert log_lines(aws, stream) == [f"job {job_id} index none"]
    # listed by queue and status, and found by name with a filter (then every status counts)
    listed = aws("batch", "list-jobs", "--job-queue", QUEUE, "--job-status", "SUCCEEDED")
    (summary,) = [s for s in listed["jobSummaryList"] if s["jobId"] == job_id]
    assert (summary["status"], summary["container"]["exitCode"]) == ("SUCCEEDED", 0)
    by_name = aws("batch", "list-jobs", "--job-queue", QUEUE, "--filters",
                  "name=JOB_NAME,values=cli-plain")["jobSummaryList"]
    assert [s["jobId"] for s in by_name] == [job_id]
    # and its log found again among the group's events by a filter pattern
    found = aws("logs", "filter-log-events", "--log-group-name", GROUP, "--log-stream-names",
                stream, "--filter-pattern", f'"{job_id}"')["events"]
    assert [e["message"] for e in found] == [f"job {job_id} index none"]


def test_a_failing_plain_job_reports_its_exit_code(aws, definition):
    job_id = submit(aws, "cli-exit3", definition, "--container-overrides",
                    "environment=[{name=CODE,value=3}]")
    job = wait_for(aws, job_id, {"SUCCEEDED", "FAILED"})
    assert (job["status"], job["statusReason"]) == ("FAILED", ESSENTIAL)
    assert job["container"]["exitCode"] == 3
    assert job["attempts"][-1]["container"]["exitCode"] == 3
    listed = aws("batch", "list-jobs", "--job-queue", QUEUE, "--job-status", "FAILED")
    (summary,) = [s for s in listed["jobSummaryList"] if s["jobId"] == job_id]
    assert summary["container"]["exitCode"] == 3 and summary["statusReason"] == ESSENTIAL


def test_an_array_job_reports_its_status_summary_children_and_their_logs(aws, definition):
    # child 2 exits 1: the parent fails once every child is done, two having succeeded
    job_id = submit(aws, "cli-array", definition, "--array-properties", "size=3",
                    "--container-overrides", json.dumps({"command": [
                        "sh", "-c", 'echo "child $AWS_BATCH_JOB_ARRAY_INDEX of '
                        '$AWS_BATCH_JOB_ARRAY_SIZE"; test "$AWS_BATCH_JOB_ARRAY_INDEX" != 2']}))
    parent = wait_for(aws, job_id, {"SUCCEEDED", "FAILED"})
    assert parent["status"] == "FAILED", parent
    assert parent["arrayProperties"]["size"] == 3
    summary = parent["arrayProperties"]["statusSummary"]
    assert set(summary) == STATUS_KEYS
    assert {k: v for k, v in summary.items() if v} == {"SUCCEEDED": 2, "FAILED": 1}
    assert "container" not in parent or "exitCode" not in parent["container"]
    # the children, by --array-job-id, one page of one at a time (the CLI follows nextToken)
    children = aws("batch", "list-jobs", "--array-job-id", job_id, "--filters",
                   "name=JOB_NAME,values=cli-array", "--page-size", "1")["jobSummaryList"]
    assert sorted(c["jobId"] for c in children) == [f"{job_id}:{i}" for i in range(3)]
    assert {c["arrayProperties"]["index"]: (c["status"], c["container"]["exitCode"])
            for c in children} == {0: ("SUCCEEDED", 0), 1: ("SUCCEEDED", 0), 2: ("FAILED", 1)}
    failed = aws("batch", "list-jobs", "--array-job-id", job_id, "--job-status", "FAILED")
    assert [c["jobId"] for c in failed["jobSummaryList"]] == [f"{job_id}:2"]
    # the parent listed by its queue with its size
    listed = aws("batch", "list-jobs", "--job-queue", QUEUE, "--job-status", "FAILED")
    (row,) = [s for s in listed["jobSummaryList"] if s["jobId"] == job_id]
    assert row["arrayProperties"] == {"size": 3}
    # a child described: its index, its own stream, what it printed
    child = describe(aws, f"{job_id}:1")
    assert child["arrayProperties"]["index"] == 1 and child["status"] == "SUCCEEDED"
    assert log_lines(aws, child["container"]["logStreamName"]) == ["child 1 of 3"]


@pytest.fixture(scope="module")
def multinode(aws, tmp_path_factory):
    """A 3-node definition whose main node (0) waits until the other two have left a mark in a
    shared folder, so every node runs to its own end; each prints its place; the main node exits
    with $CODE (0)."""
    shared = tmp_path_factory.mktemp("nodes")
    script = ('echo "node $AWS_BATCH_JOB_NODE_INDEX of $AWS_BATCH_JOB_NUM_NODES main '
              '$AWS_BATCH_JOB_MAIN_NODE_INDEX"; marks="$SHARED/${AWS_BATCH_JOB_ID%%#*}"; '
              'if [ "$AWS_BATCH_JOB_NODE_INDEX" = "$AWS_BATCH_JOB_MAIN_NODE_INDEX" ]; then '
              'i=0; while [ "$(ls "$marks" 2>/dev/null | wc -l)" -lt 2 ] && [ $i -lt 600 ]; '
              'do sleep 0.1; i=$((i+1)); done; echo "main saw $(ls "$marks" | wc -l) nodes"; '
              'exit ${CODE:-0}; fi; mkdir -p "$marks"; touch "$marks/$AWS_BATCH_JOB_NODE_INDEX"')
    container = {"image": "local", "command": ["sh", "-c", script],
                 "environment": [{"name": "SHARED", "value": str(shared)}],
                 "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                          {"type": "MEMORY", "value": "128"}]}
    answer = aws("batch", "register-job-definition", "--job-definition-name", "cli-mnp",
                 "--type", "multinode", "--node-properties", json.dumps({
                     "numNodes": 3, "mainNode": 0,
                     "nodeRangeProperties": [{"targetNodes": "0:", "container": container}]}))
    definitions = aws("batch", "describe-job-definitions", "--job-definition-name", "cli-mnp",
                      "--status", "ACTIVE")["jobDefinitions"]
    assert [d["type"] for d in definitions] == ["multinode"]
    assert definitions[0]["nodeProperties"]["numNodes"] == 3
    return answer["jobDefinitionArn"]


def test_a_multinode_job_reports_its_nodes_statuses_and_logs(aws, multinode):
    job_id = submit(aws, "cli-mnp", multinode)
    parent = wait_for(aws, job_id, {"SUCCEEDED", "FAILED"})
    assert parent["status"] == "SUCCEEDED", parent
    assert parent["statusReason"] == ESSENTIAL
    assert parent["nodeProperties"]["numNodes"] == 3 and parent["nodeProperties"]["mainNode"] == 0
    assert "container" not in parent
    assert parent["attempts"][-1]["container"]["exitCode"] == 0  # the main node's
    nodes = aws("batch", "list-jobs", "--multi-node-job-id", job_id, "--job-status",
                "SUCCEEDED")["jobSummaryList"]
    assert sorted(n["jobId"] for n in nodes) == [f"{job_id}#{i}" for i in range(3)]
    assert {n["nodeProperties"]["nodeIndex"]: (n["nodeProperties"]["isMainNode"],
                                               n["nodeProperties"]["numNodes"],
                                               n["container"]["exitCode"]) for n in nodes} == {
        0: (True, 3, 0), 1: (False, 3, 0), 2: (False, 3, 0)}
    for index in range(3):
        node = describe(aws, f"{job_id}#{index}")
        assert node["nodeDetails"] == {"nodeIndex": index, "isMainNode": index == 0}
        printed = [f"node {index} of 3 main 0"] + (["main saw 2 nodes"] if index == 0 else [])
        assert log_lines(aws, node["container"]["logStreamName"]) == printed


def test_a_multinode_job_fails_with_its_main_nodes_exit_code(aws, multinode):
    job_id = submit(aws, "cli-mnp-fail", multinode, "--node-overrides", json.dumps({
        "nodePropertyOverrides": [{"targetNodes": "0:0", "containerOverrides": {
            "environment": [{"name": "CODE", "value": "5"}]}}]}))
    parent = wait_for(aws, job_id, {"SUCCEEDED", "FAILED"})
    assert (parent["status"], parent["statusReason"]) == ("FAILED", ESSENTIAL)
    assert parent["attempts"][-1]["container"]["exitCode"] == 5
    failed = aws("batch", "list-jobs", "--multi-node-job-id", job_id, "--job-status", "FAILED")
    assert [n["jobId"] for n in failed["jobSummaryList"]] == [f"{job_id}#0"]
    assert failed["jobSummaryList"][0]["container"]["exitCode"] == 5


def test_cancel_job_fails_a_runnable_job_with_the_reason_given(aws, definition):
    # 8 vCPUs never fit the emulator's 4: RUNNABLE, with Batch's reason, until cancelled
    job_id = submit(aws, "cli-cancel", definition, "--container-overrides",
                    "resourceRequirements=[{type=VCPU,value=8},{type=MEMORY,value=128}]")
    job = wait_for(aws, job_id, {"RUNNABLE"})
    assert job["statusReason"].startswith(MISCONFIGURED)
    runnable = aws("batch", "list-jobs", "--job-queue", QUEUE, "--job-status", "RUNNABLE")
    assert job_id in [s["jobId"] for s in runnable["jobSummaryList"]]
    aws("batch", "cancel-job", "--job-id", job_id, "--reason", "not needed by cli")
    job = wait_for(aws, job_id, {"FAILED"})
    assert job["statusReason"] == "not needed by cli"
    assert job["isCancelled"] is True and job["attempts"] == []


def test_terminate_job_stops_a_running_job_with_sigterm(aws, definition):
    job_id = submit(aws, "cli-terminate", definition, *sleeper())
    wait_for(aws, job_id, {"RUNNING"})
    # with neither a status nor filters, list-jobs lists the RUNNING jobs
    running = aws("batch", "list-jobs", "--job-queue", QUEUE)["jobSummaryList"]
    assert job_id in [s["jobId"] for s in running] and {s["status"] for s in running} == {"RUNNING"}
    aws("batch", "terminate-job", "--job-id", job_id, "--reason", "stopped by cli")
    job = wait_for(aws, job_id, {"FAILED"})
    assert job["statusReason"] == "stopped by cli" and job["isTerminated"] is True
    assert job["container"]["exitCode"] == 143  # SIGTERM, as `docker stop` ends it


def test_terminate_job_on_an_array_parent_stops_every_child(aws, definition):
    job_id = submit(aws, "cli-array-terminate", definition, "--array-properties", "size=3",
                    *sleeper())
    parent = wait_for(aws, job_id, {"PENDING"})
    assert parent["arrayProperties"]["size"] == 3
    aws("batch", "terminate-job", "--job-id", job_id, "--reason", "array stopped by cli")
    parent = wait_for(aws, job_id, {"FAILED"})
    assert parent["statusReason"] == "array stopped by cli"
    assert {k: v for k, v in parent["arrayProperties"]["statusSummary"].items() if v} == {
        "FAILED": 3}
    children = aws("batch", "list-jobs", "--array-job-id", job_id, "--job-status", "FAILED")
    assert sorted(c["jobId"] for c in children["jobSummaryList"]) == [
        f"{job_id}:{i}" for i in range(3)]
    assert {c["statusReason"] for c in children["jobSummaryList"]} == {"array stopped by cli"}


def test_a_multinode_job_is_terminated_as_a_whole(aws, multinode):
    job_id = submit(aws, "cli-mnp-terminate", multinode, "--node-overrides", json.dumps({
        "nodePropertyOverrides": [{"targetNodes": "0:", "containerOverrides": {
            "command": ["sleep", "60"]}}]}))
    wait_for(aws, job_id, {"RUNNING"})
    aws("batch", "terminate-job", "--job-id", job_id, "--reason", "mnp stopped by cli")
    parent = wait_for(aws, job_id, {"FAILED"})
    assert parent["statusReason"] == "mnp stopped by cli"
    nodes = aws("batch", "list-jobs", "--multi-node-job-id", job_id, "--filters",
                "name=JOB_NAME,values=cli-mnp-terminate")["jobSummaryList"]
    assert len(nodes) == 3 and {n["status"] for n in nodes} == {"FAILED"}


def test_the_cli_reports_batchs_refusals_with_a_non_zero_exit(aws, definition):
    with pytest.raises(CliError) as refused:
        submit(aws, "cli-refused", definition.replace(":job-definition/", ":job-definition/x"))
    assert refused.value.returncode != 0
    assert "An error occurred (ClientException) when calling the SubmitJob operation" in (
        refused.value.stderr)
    with pytest.raises(CliError) as refused:
        aws("batch", "submit-job", "--job-name", "cli-refused", "--job-queue", "no-such-queue",
            "--job-definition", definition)
    assert "(ClientException)" in refused.value.stderr and "no-such-queue" in refused.value.stderr
    with pytest.raises(CliError) as refused:
        submit(aws, "cli-refused", definition, "--array-properties", "size=1")
    assert "(ClientException)" in refused.value.stderr
    # an unknown id is no error: describe-jobs answers an empty list, as Batch does
    assert aws("batch", "describe-jobs", "--jobs", "no-such-job") == {"jobs": []}


def test_a_wrong_secret_is_refused_and_the_cli_says_so(endpoint, aws):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=endpoint.url, AWS_ACCESS_KEY_ID=endpoint.access_key_id,
               AWS_SECRET_ACCESS_KEY="not-the-secret", AWS_DEFAULT_REGION="us-east-1",
               AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               AWS_MAX_ATTEMPTS="1")
    done = subprocess.run([sys.executable, "-m", "awscli", "batch", "describe-job-queues"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode != 0 and "InvalidSignatureException" in done.stderr


# -- what the CLI's users also call: finding streams and groups, tags, the queue's front ------
def test_describe_log_streams_lists_a_jobs_stream(aws, definition):
    job_id = submit(aws, "cli-streams", definition)
    stream = wait_for(aws, job_id, {"SUCCEEDED"})["container"]["logStreamName"]
    streams = aws("logs", "describe-log-streams", "--log-group-name", GROUP,
                  "--log-stream-name-prefix", stream)["logStreams"]
    assert [s["logStreamName"] for s in streams] == [stream]
    newest = aws("logs", "describe-log-streams", "--log-group-name", GROUP, "--order-by",
                 "LastEventTime", "--descending", "--page-size", "2")["logStreams"]  # pages
    assert stream in [s["logStreamName"] for s in newest]
    stamps = [s["lastEventTimestamp"] for s in newest if "lastEventTimestamp" in s]
    assert stamps == sorted(stamps, reverse=True)
    with pytest.raises(CliError) as refused:  # as CloudWatch: no time order within a prefix
        aws("logs", "describe-log-streams", "--log-group-name", GROUP, "--order-by",
            "LastEventTime", "--log-stream-name-prefix", stream)
    assert "(InvalidParameterException)" in refused.value.stderr


def test_describe_log_groups_lists_batchs_group(aws):
    groups = aws("logs", "describe-log-groups", "--log-group-name-prefix", "/aws/batch/")
    assert GROUP in [g["logGroupName"] for g in groups["logGroups"]]


def test_list_tags_for_resource_shows_a_jobs_tags(aws, definition):
    answer = aws("batch", "submit-job", "--job-name", "cli-tags", "--job-queue", QUEUE,
                 "--job-definition", definition, "--tags", "team=cli")
    assert describe(aws, answer["jobId"])["tags"] == {"team": "cli"}
    assert aws("batch", "list-tags-for-resource", "--resource-arn", answer["jobArn"]) == {
        "tags": {"team": "cli"}}
    aws("batch", "tag-resource", "--resource-arn", answer["jobArn"], "--tags", "stage=test")
    aws("batch", "untag-resource", "--resource-arn", answer["jobArn"], "--tag-keys", "team")
    assert aws("batch", "list-tags-for-resource", "--resource-arn", answer["jobArn"]) == {
        "tags": {"stage": "test"}}
    assert describe(aws, answer["jobId"])["tags"] == {"stage": "test"}
    with pytest.raises(CliError) as refused:  # aws: keys are AWS's own
        aws("batch", "tag-resource", "--resource-arn", answer["jobArn"], "--tags", "aws:x=y")
    assert "(ClientException)" in refused.value.stderr and "aws:" in refused.value.stderr


def test_get_job_queue_snapshot_shows_the_front_of_the_queue(aws, definition):
    job_id = submit(aws, "cli-snapshot", definition, "--container-overrides",
                    "resourceRequirements=[{type=VCPU,value=8},{type=MEMORY,value=128}]")
    try:
        wait_for(aws, job_id, {"RUNNABLE"})
        snapshot = aws("batch", "get-job-queue-snapshot", "--job-queue", QUEUE)
        assert job_id in [j["jobArn"].rsplit("/", 1)[-1] for j in snapshot["frontOfQueue"]["jobs"]]
    finally:
        aws("batch", "cancel-job", "--job-id", job_id, "--reason", "snapshot test done")
