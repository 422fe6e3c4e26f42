"""Smaller gaps closed: tag limits, queue time limit actions, logConfiguration, shared queue state,
the array summary's timestamp."""

import pytest
from emulator_harness import QUEUE, py, wait_until

from batchfutures.emulator.model import model_has

BIG = 1_000_000  # vCPUs no emulator has: the job is held RUNNABLE


@pytest.mark.slow
def test_more_than_50_tags_with_the_definitions_moves_the_job_to_failed(emu):
    definition = emu.register_job_definition(
        jobDefinitionName="tagged", type="container", propagateTags=True,
        tags={f"d{i}": "x" for i in range(30)},
        containerProperties={"image": "local", "command": py("pass"),
                             "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                                      {"type": "MEMORY", "value": "256"}]})
    job = emu.job(py("pass"), definition=definition["jobDefinitionArn"],
                  tags={f"j{i}": "y" for i in range(25)})
    detail = emu.wait(job)
    assert detail["status"] == "FAILED"
    assert "50 tags" in detail["statusReason"]
    assert detail["attempts"] == []
    # an array fails as a whole, before any child exists
    array = emu.job(py("pass"), definition=definition["jobDefinitionArn"], size=3,
                    tags={f"j{i}": "y" for i in range(25)})
    parent = emu.wait(array)
    assert parent["status"] == "FAILED" and "50 tags" in parent["statusReason"]
    assert set(parent["arrayProperties"]["statusSummary"].values()) == {0}
    assert parent["arrayProperties"]["size"] == 3
    assert emu.describe_jobs(jobs=[f"{array}:0"])["jobs"] == []
    assert emu.list_jobs(arrayJobId=array, jobStatus="FAILED")["jobSummaryList"] == []
    # fewer, or not propagated, is fine
    assert emu.run(py("pass"), definition=definition["jobDefinitionArn"],
                   tags={f"j{i}": "y" for i in range(20)})["status"] == "SUCCEEDED"
    assert emu.run(py("pass"), definition=definition["jobDefinitionArn"], propagateTags=False,
                   tags={f"j{i}": "y" for i in range(25)})["status"] == "SUCCEEDED"


def test_a_job_depending_on_an_array_that_never_spawned_fails(emu):
    array = emu.job(py("pass"), size=2, propagateTags=True, tags={f"t{i}": "x" for i in range(51)})
    after = emu.job(py("pass"), size=2, dependsOn=[{"jobId": array, "type": "N_TO_N"}])
    assert emu.wait(array)["status"] == "FAILED"
    assert emu.wait(after)["status"] == "FAILED"


def test_a_queue_time_limit_action_cancels_a_job_held_runnable_for_its_reason(emu):
    reason = "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT"
    emu.create_job_queue(jobQueueName="limited", priority=1, computeEnvironmentOrder=[],
                         jobStateTimeLimitActions=[{"reason": reason, "state": "RUNNABLE",
                                                    "maxTimeSeconds": 1, "action": "CANCEL"}])
    [queue] = emu.describe_job_queues(jobQueues=["limited"])["jobQueues"]
    assert queue["jobStateTimeLimitActions"][0]["maxTimeSeconds"] == 1
    held = emu.job(py("pass"), queue="limited", vcpus=BIG)
    emu.wait(held, ["RUNNABLE"], check=lambda d: d.get("statusReason", "").startswith(reason))
    detail = emu.wait(held)
    assert detail["status"] == "FAILED"
    # AWS's words ("Jobs stuck in a RUNNABLE status"): the action's reason after this prefix
    assert detail["statusReason"] == f"Canceled by JobStateTimeLimit action due to reason: {reason}"
    assert detail["isCancelled"] is True
    # a queue without the action keeps the job RUNNABLE
    kept = emu.job(py("pass"), vcpus=BIG)
    emu.wait(kept, ["RUNNABLE"], check=lambda d: "statusReason" in d)
    emu.update_job_queue(jobQueue="limited", jobStateTimeLimitActions=[])
    assert "jobStateTimeLimitActions" not in emu.describe_job_queues(jobQueues=["limited"])["jobQueues"][0]
    emu.cancel_job(jobId=kept, reason="done")


def test_invalid_time_limit_actions_are_refused(emu):
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError):
        emu.create_job_queue(jobQueueName="bad", priority=1, computeEnvironmentOrder=[],
                             jobStateTimeLimitActions=[{"reason": "x", "state": "RUNNABLE",
                                                        "maxTimeSeconds": 60, "action": "TERMINATE"}])


@pytest.mark.slow
def test_the_definitions_log_configuration_is_shown(emu):
    configuration = {"logDriver": "awslogs", "options": {"awslogs-group": "/custom"}}
    definition = emu.register_job_definition(
        jobDefinitionName="logged", type="container",
        containerProperties={"image": "local", "command": py("pass"),
                             "logConfiguration": configuration,
                             "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                                      {"type": "MEMORY", "value": "256"}]})
    detail = emu.run(py("pass"), definition=definition["jobDefinitionArn"])
    assert detail["container"]["logConfiguration"] == configuration


@pytest.mark.slow
def test_queue_state_is_shared_by_every_instance_on_one_folder(make_emulator):
    first, second = make_emulator(), make_emulator()
    first.create_job_queue(jobQueueName="shared", priority=3, computeEnvironmentOrder=[])
    [seen] = second.describe_job_queues(jobQueues=["shared"])["jobQueues"]
    assert seen["priority"] == 3 and seen["state"] == "ENABLED"
    second.update_job_queue(jobQueue=QUEUE, state="DISABLED")
    [default] = first.describe_job_queues(jobQueues=[QUEUE])["jobQueues"]
    assert default["state"] == "DISABLED"
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError, match="DISABLED"):
        first.job(py("pass"))
    first.update_job_queue(jobQueue=QUEUE, state="ENABLED")
    assert second.run(py("pass"))["status"] == "SUCCEEDED"
    # a third instance made later finds both, and does not reset what was changed
    third = make_emulator()
    names = [q["jobQueueName"] for q in third.describe_job_queues()["jobQueues"]]
    assert names == [QUEUE, "shared"]
    assert third.describe_job_queues(jobQueues=["shared"])["jobQueues"][0]["priority"] == 3


@pytest.mark.slow
def test_an_arrays_summary_says_when_it_was_updated(emu):
    array = emu.job(py("pass"), size=2)
    detail = emu.wait(array)
    if not model_has("ArrayPropertiesDetail", "statusSummaryLastUpdatedAt"):
        # a botocore older than the field (2026): boto3 drops it from AWS's answer, and so here
        assert "statusSummaryLastUpdatedAt" not in detail["arrayProperties"]
        return
    updated = detail["arrayProperties"]["statusSummaryLastUpdatedAt"]
    assert detail["createdAt"] <= updated <= detail["stoppedAt"]
    wait_until(lambda: emu.detail(array)["arrayProperties"]["statusSummary"]["SUCCEEDED"] == 2,
               "the summary")
