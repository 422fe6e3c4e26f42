"""Real Lithops 3.x (from PyPI, the `test` extra; its code unchanged, nothing of it patched) runs a
map on its `aws_batch` backend against the emulator's endpoint, storage on moto's S3 server,
then `lithops clean` removes what its backend made (issue 34, point 6).

Lithops is configured as its users configure it: a config dict (backend aws_batch, storage
aws_s3, the `runtime` named so that it builds no image), botocore's endpoint variables
(AWS_ENDPOINT_URL_BATCH the emulator, AWS_ENDPOINT_URL_S3 and AWS_ENDPOINT_URL moto's server,
so STS, ECR and anything else reach 127.0.0.1 only), `account_id` and `user_id` in its config
(no GetCallerIdentity), and the endpoint's pair as its keys (moto's server takes any).

What the image would run, its ENTRYPOINT `python entry_point.py`, the emulator is told with
`--image PATTERN=COMMAND`: Lithops' job definition gives no command. Its containers get the
emulator's environment, which points S3 at moto's server.

The emulator is started with `--control-plane-delay 0`, so Lithops' polls of a compute
environment or queue (3 s, 5 s and 30 s sleeps between them) find each transition done at their
first look. One wait is Lithops' own and stays: after submitting its get-metadata job it looks
for the result at once, then sleeps 20 s before looking again (`_generate_runtime_meta`), so the
test takes about half a minute.
"""

from __future__ import annotations

import time
import uuid

import pytest
import yaml

pytestmark = pytest.mark.slow  # an emulator process, job processes, a 20 s wait of Lithops'

REGION, ACCOUNT, USER_ID = "us-east-1", "123456789012", "AIDAEMULATORTEST"
RUNTIME = "lithops-emulated:latest"  # not Lithops' default: no docker build
ENTRY_POINT = "python -m lithops.serverless.backends.aws_batch.entry_point"
CALLS = 6


def triangle(n):
    return n * (n + 1) // 2


def ended_jobs(batch, queue, timeout=60.0):
    """The queue's jobs (ListJobs, every status) once none is left unfinished."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = batch.list_jobs(jobQueue=queue, filters=[{"name": "JOB_NAME", "values": ["*"]}])
        summaries = jobs["jobSummaryList"]
        if all(j["status"] in ("SUCCEEDED", "FAILED") for j in summaries):
            return summaries
        assert time.monotonic() < deadline, summaries
        time.sleep(0.2)


@pytest.fixture
def lithops_world(serve, moto_server, tmp_path, monkeypatch):
    """The emulator (its containers pointed at moto's S3) and this process's environment for
    Lithops; yields (endpoint, config)."""
    home, temp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    temp.mkdir()
    aws = {"AWS_ENDPOINT_URL_S3": moto_server, "AWS_ENDPOINT_URL": moto_server,
           "AWS_DEFAULT_REGION": REGION, "AWS_CONFIG_FILE": "/dev/null",
           "AWS_SHARED_CREDENTIALS_FILE": "/dev/null", "AWS_EC2_METADATA_DISABLED": "true",
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
           "HOME": str(home), "TMPDIR": str(temp)}
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN",
                 "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "LITHOPS_CONFIG", "LITHOPS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in aws.items():
        monkeypatch.setenv(name, value)
    import os
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # Lithops' temp files under TMPDIR
    with serve(tmp_path / "emulator", "--control-plane-delay", "0",
               "--image", f"*/{RUNTIME}={ENTRY_POINT}", env=dict(os.environ)) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL_BATCH", endpoint.url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", endpoint.access_key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", endpoint.secret_access_key)
        config = {
            "lithops": {"backend": "aws_batch", "storage": "aws_s3", "monitoring_interval": 1},
            "aws": {"region": REGION, "access_key_id": endpoint.access_key_id,
                    "secret_access_key": endpoint.secret_access_key},
            "aws_batch": {"runtime": RUNTIME, "runtime_cpu": 0.5, "runtime_memory": 1024,
                          "env_type": "FARGATE", "env_max_cpus": 4,
                          "account_id": ACCOUNT, "user_id": USER_ID,
                          "execution_role": f"arn:aws:iam::{ACCOUNT}:role/ecsTaskExecutionRole",
                          "job_role": f"arn:aws:iam::{ACCOUNT}:role/lithops-job-role",
                          "subnets": ["subnet-0123"], "security_groups": ["sg-0123"]},
            "aws_s3": {"storage_bucket": f"lithops-{uuid.uuid4().hex[:12]}"},
        }
        yield endpoint, config


def test_lithops_maps_on_the_emulator_and_cleans_up(lithops_world, tmp_path):
    import boto3
    import lithops
    from click.testing import CliRunner
    from lithops.scripts.cli import lithops_cli

    endpoint, config = lithops_world
    batch = boto3.client("batch", region_name=REGION, endpoint_url=endpoint.url,
                         aws_access_key_id=endpoint.access_key_id,
                         aws_secret_access_key=endpoint.secret_access_key)
    # the names Lithops' backend gives what it makes (AWSBatchBackend.__init__)
    package = f"lithops_v{lithops.__version__.replace('.', '')}_{USER_ID[-4:].lower()}"
    queue, environment = f"{package}_FARGATE_queue", f"{package}_FARGATE_env"

    fexec = lithops.FunctionExecutor(config=config)
    futures = fexec.map(triangle, range(CALLS))
    results = fexec.get_result(futures, timeout=180)
    assert results == list(map(triangle, range(CALLS)))

    # what Lithops made and ran on the emulator
    [made_environment] = [ce for ce in batch.describe_compute_environments()["computeEnvironments"]
                          if ce["computeEnvironmentName"] == environment]
    assert (made_environment["status"], made_environment["state"]) == ("VALID", "ENABLED")
    [made_queue] = [q for q in batch.describe_job_queues()["jobQueues"]
                    if q["jobQueueName"] == queue]
    assert made_queue["computeEnvironmentOrder"][0]["computeEnvironment"].endswith(environment)
    definitions = [d for d in batch.describe_job_definitions(status="ACTIVE")["jobDefinitions"]
                   if package in d["jobDefinitionName"]]
    assert len(definitions) == 1 and "command" not in definitions[0]["containerProperties"]
    # Lithops reads results from storage: its array job ends on Batch a moment later
    summaries = ended_jobs(batch, queue)
    assert {j["status"] for j in summaries} == {"SUCCEEDED"}, summaries
    assert sorted(j.get("arrayProperties", {}).get("size", 1) for j in summaries) == [1, CALLS]

    # `lithops clean`, as a user runs it: the backend's clean, then Lithops' storage and cache
    path = tmp_path / "lithops.yaml"
    path.write_text(yaml.safe_dump(config))
    cleaned = CliRunner().invoke(lithops_cli, ["clean", "--config", str(path)],
                                 catch_exceptions=False)
    assert cleaned.exit_code == 0, cleaned.output

    # what its clean deletes: every ACTIVE job definition, queue and compute environment whose
    # name holds its package name
    assert [d["jobDefinitionName"] for d in batch.describe_job_definitions(status="ACTIVE")[
        "jobDefinitions"] if package in d["jobDefinitionName"]] == []
    assert [q["jobQueueName"] for q in batch.describe_job_queues()["jobQueues"]
            if package in q["jobQueueName"]] == []
    assert [ce["computeEnvironmentName"] for ce in batch.describe_compute_environments()[
        "computeEnvironments"] if package in ce["computeEnvironmentName"]] == []
    # and nothing else: what the emulator was started with is untouched
    assert [q["jobQueueName"] for q in batch.describe_job_queues()["jobQueues"]] == ["batchfutures"]
