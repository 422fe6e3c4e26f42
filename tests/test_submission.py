"""The SubmitJob request is a pure function of the job's settings (table tests, no I/O)."""

import pytest
from botocore.session import get_session
from botocore.validate import ParamValidator

from batchfutures.settings import JobSettings
from batchfutures.submission import RETRY_RULES, build_request, job_name_for

MODEL = get_session().get_service_model("batch")


def request(size=1, **settings):
    return build_request(JobSettings.from_kwargs(**settings), name="bf-f", job_queue="q",
                         job_definition="d", command=["python", "-m", "batchfutures.worker", "u"],
                         size=size, memory_mib=2048, run_id="run-1", user="me")


@pytest.mark.parametrize("settings, size, check", [
    ({}, 1, lambda r: "arrayProperties" not in r and "timeout" not in r),
    ({}, 7, lambda r: r["arrayProperties"] == {"size": 7}),
    ({"vcpus": 0.25}, 1, lambda r: {"type": "VCPU", "value": "0.25"}
     in r["containerOverrides"]["resourceRequirements"]),
    ({"gpus": 2}, 1, lambda r: {"type": "GPU", "value": "2"}
     in r["containerOverrides"]["resourceRequirements"]),
    ({"timeout": 60.2}, 1, lambda r: r["timeout"] == {"attemptDurationSeconds": 61}),
    ({"retries": 3}, 1, lambda r: r["retryStrategy"] == {"attempts": 3, "evaluateOnExit": RETRY_RULES}),
    ({"tags": {"team": "x"}}, 1, lambda r: r["tags"]["team"] == "x" and r["propagateTags"]),
    ({"share_id": "A", "priority": 5}, 1,
     lambda r: r["shareIdentifier"] == "A" and r["schedulingPriorityOverride"] == 5),
    ({"vcpus": 4}, 1, lambda r: {"name": "BATCHFUTURES_VCPUS", "value": "4"}
     in r["containerOverrides"]["environment"]),
    ({"environment": {"BATCHFUTURES_VCPUS": "1", "A": "b"}}, 1,  # the user's value wins, once
     lambda r: [e for e in r["containerOverrides"]["environment"] if e["name"] == "BATCHFUTURES_VCPUS"]
     == [{"name": "BATCHFUTURES_VCPUS", "value": "1"}]),
])
def test_build_request(settings, size, check):
    built = request(size, **settings)
    assert check(built), built
    report = ParamValidator().validate(built, MODEL.operation_model("SubmitJob").input_shape)
    assert not report.has_errors(), report.generate_report()


def test_retry_rules_fit_batchs_limit():
    assert len(RETRY_RULES) <= 5 and all(rule["action"] == "EXIT" for rule in RETRY_RULES)


@pytest.mark.parametrize("fn, name", [
    (len, "bf-len"), (lambda x: x, "bf-lambda"), (type("C", (), {"__call__": lambda s: 1})(), "bf-C"),
])
def test_job_names(fn, name):
    assert job_name_for(fn) == name


def test_the_environments_own_tags_are_sent_and_win_over_a_users_tag_of_the_same_key():
    """The stack's tag: its client policy refuses a SubmitJob without it (and Cancel/Terminate
    of jobs without it), so a user's tags= cannot replace it."""
    request = build_request(JobSettings.from_kwargs(tags={"batchfutures:stack": "theirs", "a": "b"}),
                            name="bf-f", job_queue="q", job_definition="d", command=["x"], size=1,
                            memory_mib=2048, run_id="r", user="u",
                            environment_tags={"batchfutures:stack": "mine"})
    assert request["tags"]["batchfutures:stack"] == "mine" and request["tags"]["a"] == "b"


def test_an_aws_environment_with_a_stack_tags_its_jobs_and_names_its_definitions():
    from batchfutures import AWSBatchEnvironment
    from batchfutures.jobdefinitions import definition_name

    env = AWSBatchEnvironment("q", "bucket-name", job_definition="d", stack="team-a",
                              region_name="us-east-1")
    assert env.job_tags() == {"batchfutures:stack": "team-a"}
    assert AWSBatchEnvironment("q", "bucket-name", job_definition="d",
                               region_name="us-east-1").job_tags() == {}
    assert definition_name({"image": "x"}, stack="team-a").startswith("team-a_")
