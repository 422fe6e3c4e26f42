"""Metaflow's AWS Batch client (`metaflow.plugins.aws.batch`, from PyPI) against the emulator's
endpoint, driven through the calls `@batch` steps and `python flow.py batch list|kill` make:
`BatchClient().job()...job_def(...).execute()` (DescribeJobQueues, DescribeComputeEnvironments,
DescribeJobDefinitions, RegisterJobDefinition, SubmitJob), `RunningJob` (status, is_done,
status_code, reason, kill: DescribeJobs, TerminateJob), `BatchClient.unfinished_jobs` (ListJobs per
queue and status) and `Batch.list_jobs` / `Batch.kill_jobs`.

Metaflow reaches Batch through `boto3.session.Session().client("batch")`, so it is pointed at the
endpoint as a user points it at any compatible one: AWS_ENDPOINT_URL_BATCH, the endpoint's pair
as AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, no config files, METAFLOW_HOME an empty folder.

What Metaflow does not do, and so is not asserted here: array jobs (it never submits one), and
reading CloudWatch Logs (a task's output goes to its S3 datastore; the stream is read here with
the logs client of Metaflow's own client provider, `get_aws_client("logs")`).
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.slow  # an emulator process, job processes

QUEUE, GROUP = "batchfutures", "/aws/batch/job"
ESSENTIAL = "Essential container in task exited"
ROLE = "arn:aws:iam::123456789012:role/metaflow-batch"


@pytest.fixture
def metaflow_env(endpoint, monkeypatch, tmp_path):
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (("AWS_ENDPOINT_URL_BATCH", endpoint.url),
                        ("AWS_ENDPOINT_URL_CLOUDWATCH_LOGS", endpoint.url),
                        ("AWS_ACCESS_KEY_ID", endpoint.access_key_id),
                        ("AWS_SECRET_ACCESS_KEY", endpoint.secret_access_key),
                        ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_CONFIG_FILE", "/dev/null"),
                        ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
                        ("AWS_EC2_METADATA_DISABLED", "true"), ("NO_PROXY", "127.0.0.1"),
                        ("METAFLOW_HOME", str(tmp_path / "metaflow-home"))):
        monkeypatch.setenv(name, value)


@pytest.fixture
def batch(metaflow_env):
    from metaflow.plugins.aws.batch.batch_client import BatchClient

    return BatchClient()


def job_def(job, num_parallel=0):
    """What `Batch.create_job` passes for a plain `@batch(cpu=1, memory=128)` step."""
    return job.job_def(
        image="python:3.11", iam_role=ROLE, job_queue=QUEUE, execution_role=None,
        shared_memory=None, max_swap=None, swappiness=None, inferentia=None, efa=None,
        memory=128, host_volumes=None, efs_volumes=None, use_tmpfs=False, tmpfs_tempdir=None,
        tmpfs_size=None, tmpfs_path=None, num_parallel=num_parallel, ephemeral_storage=None,
        log_driver=None, log_options=None, privileged=None)


def new_job(batch, name, command, task_id="1", num_parallel=0, **environment):
    job = (batch.job().job_name(name).job_queue(QUEUE).image("python:3.11").iam_role(ROLE)
           .task_id(task_id).command(command).cpu(1).memory(128).attempts(1)
           .tag("app", "metaflow").parameter("metaflow.user", "tester")
           .parameter("metaflow.flow_name", "ClientFlow").parameter("metaflow.run_id", "7"))
    for key, value in environment.items():
        job.environment_variable(key, value)
    return job_def(job, num_parallel)


def wait_done(running, deadline=90):
    end = time.monotonic() + deadline
    while not running.is_done:  # RunningJob polls DescribeJobs at most once a second
        assert time.monotonic() < end, running.info
        time.sleep(0.1)
    return running


def wait_running(running, deadline=90):
    end = time.monotonic() + deadline
    while not running.is_running:
        assert not running.is_done and time.monotonic() < end, running.info
        time.sleep(0.1)
    return running


def log_lines(stream):
    from metaflow.plugins.aws.aws_client import get_aws_client

    answer = get_aws_client("logs").get_log_events(logGroupName=GROUP, logStreamName=stream,
                                                   startFromHead=True)
    return [event["message"] for event in answer["events"]]


def test_metaflow_registers_its_job_definition_once_on_the_queues_platform(batch):
    assert QUEUE in list(batch.active_job_queues())
    assert batch.region() == "us-east-1"
    first = new_job(batch, "mf-definition", ["true"]).payload["jobDefinition"]
    again = new_job(batch, "mf-definition", ["true"]).payload["jobDefinition"]
    assert first == again  # found by DescribeJobDefinitions(name, status=ACTIVE), not registered twice
    (definition,) = batch._client.describe_job_definitions(jobDefinitions=[first])["jobDefinitions"]
    assert definition["jobDefinitionName"].startswith("metaflow_")
    assert definition["type"] == "container" and definition["propagateTags"] is True
    assert definition["containerProperties"]["jobRoleArn"] == ROLE
    assert definition["containerProperties"]["linuxParameters"] == {}  # EC2, as the CE reports


def test_a_plain_step_succeeds_and_metaflow_reports_it(batch):
    running = new_job(batch, "mf-plain", ["sh", "-c", 'echo "step says $GREETING"'],
                      GREETING="hello").execute()
    wait_done(running)
    assert (running.status, running.is_successful, running.is_crashed) == ("SUCCEEDED", True, False)
    assert running.status_code == 0
    assert running.reason is None and running.status_reason == ESSENTIAL
    assert running.job_name == "mf-plain" and running.job_queue.endswith(f":job-queue/{QUEUE}")
    assert running.info["tags"] == {"app": "metaflow"}
    assert running.info["parameters"]["metaflow.flow_name"] == "ClientFlow"
    assert log_lines(running.info["container"]["logStreamName"]) == ["step says hello"]
    # attach_job, as `resume` and the UI do, sees the same
    attached = batch.attach_job(running.id)
    assert (attached.status, attached.status_code) == ("SUCCEEDED", 0)


def test_a_failing_step_is_crashed_with_its_exit_code(batch):
    running = new_job(batch, "mf-exit4", ["sh", "-c", "echo failing; exit 4"]).execute()
    wait_done(running)
    assert (running.status, running.is_crashed) == ("FAILED", True)
    assert running.status_code == 4
    assert running.status_reason == ESSENTIAL and running.reason is None


def test_kill_terminates_a_running_step(batch):
    running = new_job(batch, "mf-kill", ["sleep", "60"]).execute()
    wait_running(running)
    running.kill()
    wait_done(running)
    assert running.status == "FAILED"
    assert running.status_reason == "Metaflow initiated job termination."
    assert running.status_code == 143  # SIGTERM
    assert running.info["isTerminated"] is True


def test_batch_list_and_kill_find_a_runs_unfinished_jobs(batch, metaflow_env):
    from metaflow.plugins.aws.batch.batch import Batch

    ids = [new_job(batch, f"tester-ClientFlow-7-start-{n}-0", ["sleep", "60"]).execute().id
           for n in (1, 2)]
    other = new_job(batch, "tester-OtherFlow-8-start-1-0", ["sleep", "60"]).execute()
    for job_id in ids:
        wait_running(batch.attach_job(job_id))
    unfinished = {job["jobId"]: job["status"] for job in batch.unfinished_jobs()}
    assert {unfinished.get(job_id) for job_id in ids} == {"RUNNING"}
    # `python flow.py batch list` and `batch kill`
    lines = []
    Batch(None, None).list_jobs("ClientFlow", "7", "tester", lines.append)
    assert sorted(lines) == sorted(
        f"tester-ClientFlow-7-start-{n}-0 [{job_id}] (RUNNING)" for n, job_id in zip((1, 2), ids))
    lines = []
    Batch(None, None).kill_jobs("ClientFlow", "7", "tester", lines.append)
    assert sorted(lines) == sorted(f"Killing AWS Batch job: tester-ClientFlow-7-start-{n}-0 "
                                   f"[{job_id}] (RUNNING)" for n, job_id in zip((1, 2), ids))
    for job_id in ids:
        killed = wait_done(batch.attach_job(job_id))
        assert (killed.status, killed.status_reason) == ("FAILED",
                                                         "Metaflow initiated job termination.")
    assert not other.is_done  # another flow's job is left alone
    lines = []
    Batch(None, None).list_jobs("ClientFlow", "7", "tester", lines.append)
    assert lines == ["No running AWS Batch jobs found."]
    other.kill()
    wait_done(other)


def parallel_command(task_id, marks):
    """A `@parallel` step's command as Metaflow writes it: the control task's id, `ubf_control`
    and `[multinode-args]`, which `execute()` rewrites for the main node and the others. The main
    node waits until the two others have left a mark, so every node runs to its own end."""
    return ["sh", "-c",
            f'echo "task {task_id} [multinode-args] ubf_control"; '
            f'm="{marks}/${{AWS_BATCH_JOB_ID%%#*}}"; '
            'if [ "$AWS_BATCH_JOB_NODE_INDEX" = 0 ]; then i=0; '
            'while [ "$(ls "$m" 2>/dev/null | wc -l)" -lt 2 ] && [ $i -lt 600 ]; '
            'do sleep 0.1; i=$((i+1)); done; echo "main saw $(ls "$m" | wc -l) nodes"; '
            'exit ${CODE:-0}; fi; mkdir -p "$m"; touch "$m/$AWS_BATCH_JOB_NODE_INDEX"']


def test_a_parallel_step_runs_as_a_multinode_job(batch, tmp_path):
    running = new_job(batch, "mf-parallel", parallel_command("control-42", tmp_path),
                      task_id="control-42", num_parallel=3).execute()
    (definition,) = batch._client.describe_job_definitions(
        jobDefinitions=[running.info["jobDefinition"]])["jobDefinitions"]
    assert definition["type"] == "multinode"
    assert [r["targetNodes"] for r in definition["nodeProperties"]["nodeRangeProperties"]] == [
        "0:0", "1:2"]
    wait_done(running)
    assert (running.status, running.is_successful) == ("SUCCEEDED", True)
    assert running.status_code == 0  # attempts[-1].container.exitCode: the main node's
    assert running.reason == ESSENTIAL  # a multinode job's statusReason
    assert running.info["nodeProperties"]["numNodes"] == 3
    nodes = [batch.attach_job(f"{running.id}#{n}") for n in range(3)]
    assert [(node.status, node.status_code) for node in nodes] == [("SUCCEEDED", 0)] * 3
    printed = [log_lines(node.info["container"]["logStreamName"]) for node in nodes]
    assert printed == [["task control-42 --split-index 0 ubf_control", "main saw 2 nodes"],
                       ["task 42-node-1 --split-index 1 ubf_task"],
                       ["task 42-node-2 --split-index 2 ubf_task"]]


def test_a_parallel_step_fails_with_its_main_nodes_exit_code(batch, tmp_path):
    running = new_job(batch, "mf-parallel-fail", parallel_command("control-43", tmp_path),
                      task_id="control-43", num_parallel=3, CODE="6").execute()
    wait_done(running)
    assert (running.status, running.is_crashed) == ("FAILED", True)
    assert running.status_code == 6
    assert running.reason == ESSENTIAL
    main = batch.attach_job(f"{running.id}#0")
    assert (main.status, main.status_code) == ("FAILED", 6)


def test_kill_terminates_a_parallel_step_as_a_whole(batch):
    running = new_job(batch, "mf-parallel-kill", ["sleep", "60"], task_id="control-44",
                      num_parallel=2).execute()
    wait_running(running)
    running.kill()
    wait_done(running)
    assert running.status == "FAILED" and running.reason == "Metaflow initiated job termination."
    nodes = [batch.attach_job(f"{running.id}#{n}") for n in range(2)]
    assert {node.status for node in wait_all(nodes)} == {"FAILED"}


def wait_all(jobs):
    return [wait_done(job) for job in jobs]
