"""The emulator's requests and answers fit botocore's Batch model; the checker itself is strict."""

import pytest
from botocore.exceptions import ParamValidationError
from emulator_harness import DEFINITION, QUEUE, py
from model_check import check_output, problems, service_model


def _shape(name):
    return service_model("batch").shape_for(name)


def test_checker_rejects_unknown_keys_wrong_types_and_missing_members():
    good = {"jobName": "a", "jobId": "b", "jobQueue": "q", "status": "RUNNING", "startedAt": 1,
            "jobDefinition": "d"}
    assert problems(good, _shape("JobDetail")) == []
    assert any("unknown key 'bogus'" in p for p in problems(dict(good, bogus=1), _shape("JobDetail")))
    assert any("expected an integer" in p for p in problems(dict(good, startedAt="1"), _shape("JobDetail")))
    assert any("expected an integer" in p for p in problems(dict(good, startedAt=True), _shape("JobDetail")))
    missing = dict(good)
    del missing["jobQueue"]
    assert any("'jobQueue'" in p and "missing" in p for p in problems(missing, _shape("JobDetail")))
    not_started = dict(good)
    del not_started["startedAt"]  # required by the model: the emulator always sends it
    assert any("'startedAt'" in p for p in problems(not_started, _shape("JobDetail")))
    assert any("not one of" in p for p in problems(dict(good, status="DONE"), _shape("JobDetail")))
    nested = dict(good, attempts=[{"container": {"exitCode": "0"}}])
    assert any("$.attempts[0].container.exitCode" in p for p in problems(nested, _shape("JobDetail")))
    assert any("expected a list" in p for p in problems(dict(good, attempts={}), _shape("JobDetail")))
    with pytest.raises(AssertionError, match="unknown key"):
        check_output("batch", "SubmitJob", {"jobName": "a", "jobId": "b", "extra": 1})


@pytest.mark.slow
def test_every_operation_of_the_emulator_answers_with_the_models_shapes(emu):
    # Harness checks each answer; here every implemented operation is called at least once.
    emu.describe_job_queues()
    emu.describe_job_queues(jobQueues=[QUEUE])
    emu.create_job_queue(jobQueueName="second", priority=1, computeEnvironmentOrder=[
        {"order": 1, "computeEnvironment": "batchfutures-local"}])
    emu.update_job_queue(jobQueue="second", state="ENABLED")
    emu.register_job_definition(jobDefinitionName="shapes", type="container",
                                containerProperties={"image": "x", "command": py("pass")})
    emu.describe_job_definitions()
    emu.describe_job_definitions(jobDefinitionName="shapes", status="ACTIVE")
    job = emu.job(py("print('hi')"), name="shapes", tags={"k": "v"}, propagateTags=True,
                  retryStrategy={"attempts": 2}, timeout={"attemptDurationSeconds": 60},
                  parameters={"p": "v"})
    array = emu.job(py("pass"), name="shapes-array", size=2, dependsOn=[{"jobId": job}])
    emu.wait(array)
    emu.describe_jobs(jobs=[job, array, f"{array}:0", f"{array}:1"])
    emu.list_jobs(jobQueue=QUEUE, jobStatus="SUCCEEDED")
    emu.list_jobs(arrayJobId=array, jobStatus="SUCCEEDED")
    emu.list_jobs(jobQueue=QUEUE, filters=[{"name": "JOB_NAME", "values": ["shapes*"]}])
    emu.cancel_job(jobId=job, reason="done anyway")
    emu.terminate_job(jobId=job, reason="done anyway")
    emu.deregister_job_definition(jobDefinition="shapes:1")
    detail = emu.detail(job)
    emu.logs.get_log_events(logGroupName="/aws/batch/job",
                            logStreamName=detail["container"]["logStreamName"], startFromHead=True)


@pytest.mark.parametrize("method, params", [
    ("submit_job", {"jobName": "a", "jobDefinition": DEFINITION}),  # jobQueue missing
    ("submit_job", {"jobName": "a", "jobQueue": QUEUE, "jobDefinition": DEFINITION,
                    "arrayProperties": {"size": "5"}}),  # wrong type
    ("submit_job", {"jobName": "a", "jobQueue": QUEUE, "jobDefinition": DEFINITION, "colour": 1}),
    ("submit_job", {"jobName": "a", "jobQueue": QUEUE, "jobDefinition": DEFINITION,
                    "containerOverrides": {"command": "echo hi"}}),  # a string, not a list
    ("describe_jobs", {}),
    ("describe_jobs", {"jobs": "abc"}),
    ("list_jobs", {"jobQueue": QUEUE, "jobStatus": 3}),
    ("cancel_job", {"jobId": "x"}),  # reason missing
    ("terminate_job", {"jobId": "x", "reason": "r", "force": True}),
    ("register_job_definition", {"jobDefinitionName": "x"}),  # type missing
])
def test_requests_are_validated_as_botocore_does(emu, method, params):
    with pytest.raises(ParamValidationError):
        getattr(emu, method)(**params)


def test_log_requests_are_validated_too(emu):
    with pytest.raises(ParamValidationError):
        emu.logs.get_log_events(logGroupName="/aws/batch/job")  # logStreamName missing


def test_with_an_older_botocore_answers_lose_what_its_model_lacks(monkeypatch):
    from batchfutures.emulator import model

    answer = {"jobs": [{"jobId": "j", "status": "FAILED", "isCancelled": True,
                        "notInAnyModel": 1, "container": {"exitCode": 1, "madeUp": "x"},
                        "arrayProperties": {"size": 2, "statusSummary": {"FAILED": 2}}}]}
    monkeypatch.setattr(model, "_older_model", False)  # a model that knows every member
    assert model.as_boto3_returns("DescribeJobs", answer) is answer  # untouched, no copy
    monkeypatch.setattr(model, "_older_model", True)
    pruned = model.as_boto3_returns("DescribeJobs", answer)
    assert pruned == {"jobs": [{"jobId": "j", "status": "FAILED", "isCancelled": True,
                                "container": {"exitCode": 1},
                                "arrayProperties": {"size": 2, "statusSummary": {"FAILED": 2}}}]}
    assert "notInAnyModel" in answer["jobs"][0]  # the emulator's own record is not changed


def test_the_newer_members_are_named_against_the_installed_model():
    from batchfutures.emulator import model

    for shape, _ in model.NEWER_MEMBERS:  # each names a real shape; its member may be new
        assert model.service_model().shape_for(shape).type_name == "structure"
