"""Job definitions and their revisions; faults injected on demand."""

import pytest
from botocore.exceptions import ClientError
from emulator_harness import QUEUE, py

ARN = "arn:aws:batch:us-east-1:123456789012:job-definition/"


def register(emu, name, command):
    return emu.register_job_definition(
        jobDefinitionName=name, type="container",
        containerProperties={"image": "local", "command": command,
                             "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                                      {"type": "MEMORY", "value": "256"}]})


@pytest.mark.slow
def test_registering_again_makes_a_new_revision(emu, tmp_path):
    first = register(emu, "echo", py("print('one')"))
    second = register(emu, "echo", py("print('two')"))
    assert (first["revision"], second["revision"]) == (1, 2)
    assert first["jobDefinitionArn"] == f"{ARN}echo:1"
    assert second["jobDefinitionArn"] == f"{ARN}echo:2"

    by_name = emu.describe_job_definitions(jobDefinitionName="echo")["jobDefinitions"]
    assert sorted(d["revision"] for d in by_name) == [1, 2]
    listed = emu.describe_job_definitions(jobDefinitions=["echo"])["jobDefinitions"]
    assert sorted(d["revision"] for d in listed) == [1, 2]
    [one] = emu.describe_job_definitions(jobDefinitions=["echo:1"])["jobDefinitions"]
    assert one["containerProperties"]["command"] == py("print('one')")
    assert one["status"] == "ACTIVE" and one["type"] == "container"
    [two] = emu.describe_job_definitions(jobDefinitions=[f"{ARN}echo:2"])["jobDefinitions"]
    assert two["containerProperties"]["command"] == py("print('two')")

    # a job names a revision, or the latest
    for reference, expected in (("echo", "two"), ("echo:1", "one"), (f"{ARN}echo:1", "one")):
        job = emu.submit_job(jobName="echo", jobQueue=QUEUE, jobDefinition=reference)["jobId"]
        detail = emu.wait(job)
        assert emu.log_lines(detail) == [expected]
        assert detail["jobDefinition"] == f"{ARN}echo:{1 if expected == 'one' else 2}"


@pytest.mark.slow
def test_a_deregistered_revision_is_inactive_and_not_used(emu):
    register(emu, "gone", py("pass"))
    register(emu, "gone", py("pass"))
    emu.deregister_job_definition(jobDefinition="gone:2")
    active = emu.describe_job_definitions(jobDefinitionName="gone", status="ACTIVE")["jobDefinitions"]
    assert [d["revision"] for d in active] == [1]
    inactive = emu.describe_job_definitions(jobDefinitionName="gone", status="INACTIVE")["jobDefinitions"]
    assert [d["revision"] for d in inactive] == [2]
    job = emu.submit_job(jobName="gone", jobQueue=QUEUE, jobDefinition="gone")
    assert emu.wait(job["jobId"])["jobDefinition"] == f"{ARN}gone:1"
    with pytest.raises(ClientError):
        emu.submit_job(jobName="gone", jobQueue=QUEUE, jobDefinition="gone:2")


def test_the_default_definition_is_there(emu):
    [worker] = emu.describe_job_definitions(jobDefinitionName="batchfutures-worker")["jobDefinitions"]
    assert worker["revision"] == 1
    assert worker["containerProperties"]["command"][-2:] == ["-m", "batchfutures.worker"]


# -- faults ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_injected_throttling_answers_429_only_for_the_chosen_operations(emu):
    job = emu.job(py("pass"))
    emu.inject_faults(1.0, operations={"DescribeJobs"})
    for _ in range(3):
        with pytest.raises(ClientError) as raised:
            emu.describe_jobs(jobs=[job])
        assert raised.value.response["Error"]["Code"] == "TooManyRequestsException"
        assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
        assert raised.value.operation_name == "DescribeJobs"
    emu.list_jobs(jobQueue=QUEUE)  # other operations answer
    emu.inject_faults(0)
    assert emu.wait(job)["status"] == "SUCCEEDED"


@pytest.mark.slow
def test_a_fraction_of_calls_fails_and_the_jobs_run_regardless(emu):
    emu.inject_faults(0.5, seed=7)
    failed = answered = 0
    for _ in range(200):
        try:
            emu.describe_job_queues()
            answered += 1
        except ClientError as error:
            assert error.response["Error"]["Code"] == "TooManyRequestsException"
            failed += 1
    assert failed and answered  # some of each; the seed makes it repeatable
    emu.inject_faults(0)
    assert emu.run(py("pass"))["status"] == "SUCCEEDED"


@pytest.mark.slow
def test_faults_reach_the_logs_too_and_another_code_can_be_chosen(emu):
    detail = emu.run(py("print('x')"))
    stream = detail["container"]["logStreamName"]
    emu.inject_faults(1.0, code="ServerException", operations={"GetLogEvents", "SubmitJob"})
    with pytest.raises(ClientError) as raised:
        emu.logs.get_log_events(logGroupName="/aws/batch/job", logStreamName=stream)
    assert raised.value.response["Error"]["Code"] == "ServerException"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    with pytest.raises(ClientError):
        emu.job(py("pass"))
    emu.inject_faults(0.0)
    assert emu.logs.get_log_events(logGroupName="/aws/batch/job", logStreamName=stream)["events"]


def test_a_rate_outside_0_to_1_is_refused(emu):
    with pytest.raises(ValueError):
        emu.inject_faults(1.5)
