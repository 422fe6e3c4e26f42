"""Compute environments and job queues as Batch runs them: Create/Update/Delete with their
statuses (CREATING, UPDATING, DELETING -> VALID or gone) and Batch's refusals, through a stock
boto3 client on the emulator's HTTP endpoint; jobs of a created queue on its environment's
vCPUs. The decisions (what Batch refuses, when a transition ends) are table-tested first.
"""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError
from emulator_harness import py, wait_until
from model_check import check_output

from batchfutures.emulator import computeenvs
from batchfutures.emulator.computeenvs import check_create, check_update, merged_resources, settled
from batchfutures.emulator.server import EmulatorServer

DELAY = 1.0  # seconds each CREATING, UPDATING, DELETING lasts here (seen under load)
EC2 = {"type": "EC2", "maxvCpus": 4, "minvCpus": 0, "instanceRole": "ecsInstanceRole",
       "instanceTypes": ["optimal"], "subnets": ["subnet-1"], "securityGroupIds": ["sg-1"]}
FARGATE = {"type": "FARGATE_SPOT", "maxvCpus": 1, "subnets": ["subnet-1"],
           "securityGroupIds": ["sg-1"]}


@pytest.mark.parametrize("params, refused", [
    ({"type": "MANAGED", "computeResources": EC2}, None),
    ({"type": "MANAGED", "computeResources": FARGATE}, None),
    ({"type": "UNMANAGED", "unmanagedvCpus": 4}, None),
    ({"type": "MANAGED"}, "computeResources is required"),
    ({"type": "UNMANAGED", "computeResources": EC2}, "can't be specified for an UNMANAGED"),
    ({"type": "MANAGED", "state": "PAUSED", "computeResources": EC2}, "state must be"),
    ({"type": "MANAGED", "computeResources": dict(EC2, type="GPU")}, "computeResources.type"),
    ({"type": "MANAGED", "computeResources": dict(FARGATE, minvCpus=0)}, "minvCpus isn't applicable"),
    ({"type": "MANAGED", "computeResources": dict(FARGATE, instanceRole="r")}, "instanceRole isn't"),
    ({"type": "MANAGED", "computeResources": dict(EC2, minvCpus=8)}, "minvCpus 8 must be between"),
    ({"type": "MANAGED", "computeResources": dict(EC2, desiredvCpus=9)}, "desiredvCpus 9"),
    ({"type": "MANAGED", "computeResources": dict(EC2, instanceRole=None)}, "instanceRole is required"),
    ({"type": "MANAGED", "computeResources": dict(EC2, type="SPOT", bidPercentage=150)},
     "bidPercentage"),
])
def test_what_create_compute_environment_refuses(params, refused):
    found = check_create(params)
    assert (found is None) if refused is None else (refused in found)


RECORD = {"type": "MANAGED", "state": "ENABLED", "status": "VALID", "changedAt": 0.0,
          "computeResources": EC2}


@pytest.mark.parametrize("record, params, refused", [
    (RECORD, {"state": "DISABLED"}, None),
    (RECORD, {"computeResources": {"maxvCpus": 8}}, None),
    (RECORD, {"computeResources": {"maxvCpus": 8, "type": "EC2"}}, None),
    (RECORD, {"state": "STOPPED"}, "state must be"),
    (dict(RECORD, status="CREATING"), {"state": "DISABLED"}, "being modified"),
    (dict(RECORD, status="DELETING"), {"state": "DISABLED"}, "being modified"),
    (RECORD, {"computeResources": {"type": "SPOT"}}, "can't be changed"),
    (RECORD, {"computeResources": {"minvCpus": 9}}, "minvCpus 9"),
    (dict(RECORD, computeResources=None), {"computeResources": {"maxvCpus": 2}}, "UNMANAGED"),
])
def test_what_update_compute_environment_refuses(record, params, refused):
    found = check_update(record, params)
    assert (found is None) if refused is None else (refused in found)


def test_an_update_changes_only_the_members_it_names():
    merged = merged_resources(EC2, {"maxvCpus": 16, "minvCpus": None,
                                    "updateToLatestImageVersion": True})
    assert merged == dict(EC2, maxvCpus=16)


@pytest.mark.parametrize("status, elapsed, expected", [
    ("CREATING", 0.1, "CREATING"), ("CREATING", 0.5, "VALID"), ("UPDATING", 0.49, "UPDATING"),
    ("UPDATING", 0.5, "VALID"), ("DELETING", 0.2, "DELETING"), ("DELETING", 0.5, None),
    ("VALID", 100.0, "VALID"),
])
def test_a_transition_ends_after_the_delay(status, elapsed, expected):
    assert settled(status, 1000.0, 1000.0 + elapsed, 0.5) == expected


def test_what_an_environment_lets_its_jobs_use(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir(mode=0o700)
    store = computeenvs.ComputeEnvironments(folder, "own", max_vcpus=8, delay=0)
    store.create("ec2", {"type": "MANAGED", "computeResources": EC2})
    store.create("off", {"type": "MANAGED", "state": "DISABLED", "computeResources": EC2})
    store.create("mine", {"type": "UNMANAGED", "unmanagedvCpus": 3})
    assert store.capacity("own") == (None, True)  # the emulator's own: its max_vcpus only
    assert store.capacity("ec2") == (4.0, True)
    assert store.capacity("off") == (4.0, False)
    assert store.capacity("mine") == (3.0, True)
    assert store.capacity("gone") == (0.0, False)
    assert store.spot_type("ec2") is None
    store.create("spot", {"type": "MANAGED", "computeResources": FARGATE})
    assert store.spot_type("spot") == "FARGATE_SPOT"
    assert store.names() == ["own", "ec2", "off", "mine", "spot"]


# -- over HTTP, with a stock boto3 client ------------------------------------------------------
@pytest.fixture
def endpoint(make_emulator):
    """(the checked emulator, a boto3 batch client on its HTTP endpoint)."""
    emu = make_emulator(max_vcpus=4, control_plane_delay=DELAY)
    with EmulatorServer(emu.emulator) as server:
        yield emu, boto3.client("batch", endpoint_url=server.endpoint_url,
                                region_name="us-east-1", **server.credentials)


def refusal(call) -> str:
    with pytest.raises(ClientError) as raised:
        call()
    error = raised.value.response["Error"]
    assert error["Code"] == "ClientException"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    return error["Message"]


def environment(batch, name):
    found = batch.describe_compute_environments(computeEnvironments=[name])["computeEnvironments"]
    check_output("batch", "DescribeComputeEnvironments", {"computeEnvironments": found})
    return found[0] if found else None


def queue(batch, name):
    found = batch.describe_job_queues(jobQueues=[name])["jobQueues"]
    check_output("batch", "DescribeJobQueues", {"jobQueues": found})
    return found[0] if found else None


def settle(describe, status="VALID"):
    """Wait until a described resource reaches `status` (None: gone); what it was before."""
    seen = []

    def reached():
        found = describe()
        seen.append(found["status"] if found else None)
        return seen[-1] == status
    wait_until(reached, f"status {status}")
    return seen


def test_an_environment_and_its_queue_from_creation_to_deletion(endpoint):
    _, batch = endpoint
    made = batch.create_compute_environment(computeEnvironmentName="ce-a", type="MANAGED",
                                            computeResources=FARGATE)
    assert made["computeEnvironmentArn"].endswith(":compute-environment/ce-a")
    assert environment(batch, "ce-a")["status"] == "CREATING"
    order = [{"order": 1, "computeEnvironment": made["computeEnvironmentArn"]}]
    # as Batch: an environment must be VALID before a queue takes it
    assert "must be VALID" in refusal(lambda: batch.create_job_queue(
        jobQueueName="q-a", priority=1, computeEnvironmentOrder=order))
    settle(lambda: environment(batch, "ce-a"))
    detail = environment(batch, made["computeEnvironmentArn"])  # by ARN too
    assert (detail["state"], detail["type"]) == ("ENABLED", "MANAGED")
    assert detail["computeResources"]["maxvCpus"] == 1
    names = [c["computeEnvironmentName"]
             for c in batch.describe_compute_environments()["computeEnvironments"]]
    assert names == ["batchfutures-local", "ce-a"]
    assert "already exists" in refusal(lambda: batch.create_compute_environment(
        computeEnvironmentName="ce-a", type="MANAGED", computeResources=FARGATE))

    batch.create_job_queue(jobQueueName="q-a", priority=1, computeEnvironmentOrder=order)
    seen = settle(lambda: queue(batch, "q-a"))
    assert seen[0] == "CREATING"
    assert queue(batch, "q-a")["computeEnvironmentOrder"] == order
    assert "already exists" in refusal(lambda: batch.create_job_queue(
        jobQueueName="q-a", priority=1, computeEnvironmentOrder=order))

    # teardown in Batch's order: each refusal as Batch words it
    assert "ENABLED" in refusal(lambda: batch.delete_job_queue(jobQueue="q-a"))
    batch.update_compute_environment(computeEnvironment="ce-a", state="DISABLED")
    assert environment(batch, "ce-a")["status"] == "UPDATING"
    assert refusal(lambda: batch.delete_compute_environment(computeEnvironment="ce-a")) == \
        "Cannot delete, resource is being modified"
    settle(lambda: environment(batch, "ce-a"))
    assert refusal(lambda: batch.delete_compute_environment(computeEnvironment="ce-a")) == \
        "Cannot delete, found existing JobQueue relationship"
    batch.update_job_queue(jobQueue="q-a", state="DISABLED")
    assert queue(batch, "q-a")["status"] == "UPDATING"
    settle(lambda: queue(batch, "q-a"))
    assert queue(batch, "q-a")["state"] == "DISABLED"
    batch.delete_job_queue(jobQueue=queue(batch, "q-a")["jobQueueArn"])
    assert queue(batch, "q-a")["status"] == "DELETING"
    # a queue being deleted still holds its environment
    assert "JobQueue relationship" in refusal(
        lambda: batch.delete_compute_environment(computeEnvironment="ce-a"))
    settle(lambda: queue(batch, "q-a"), None)
    assert "does not exist" in refusal(lambda: batch.update_job_queue(jobQueue="q-a",
                                                                      state="ENABLED"))
    batch.delete_compute_environment(computeEnvironment="ce-a")
    assert environment(batch, "ce-a")["status"] == "DELETING"
    settle(lambda: environment(batch, "ce-a"), None)
    assert "ce-a does not exist" in refusal(
        lambda: batch.delete_compute_environment(computeEnvironment="ce-a"))


def test_a_queue_refuses_what_batch_refuses(endpoint):
    _, batch = endpoint
    for name, resources in (("ec2", EC2), ("fargate", FARGATE)):
        batch.create_compute_environment(computeEnvironmentName=name, type="MANAGED",
                                         computeResources=resources)
    settle(lambda: environment(batch, "ec2"))
    settle(lambda: environment(batch, "fargate"))
    mixed = [{"order": 1, "computeEnvironment": "ec2"}, {"order": 2, "computeEnvironment": "fargate"}]
    assert "can't be mixed" in refusal(lambda: batch.create_job_queue(
        jobQueueName="mixed", priority=1, computeEnvironmentOrder=mixed))
    assert "does not exist" in refusal(lambda: batch.create_job_queue(
        jobQueueName="none", priority=1, computeEnvironmentOrder=[
            {"order": 1, "computeEnvironment": "no-such-ce"}]))
    assert "at most 3" in refusal(lambda: batch.create_job_queue(
        jobQueueName="many", priority=1, computeEnvironmentOrder=[
            {"order": i, "computeEnvironment": "ec2"} for i in range(4)]))
    assert "emulator's own" in refusal(lambda: batch.delete_compute_environment(
        computeEnvironment="batchfutures-local"))
    assert "minvCpus isn't applicable" in refusal(lambda: batch.create_compute_environment(
        computeEnvironmentName="bad", type="MANAGED", computeResources=dict(FARGATE, minvCpus=0)))
    assert environment(batch, "bad") is None
    # an update merges: only maxvCpus changes
    batch.update_compute_environment(computeEnvironment="ec2", computeResources={"maxvCpus": 8})
    resources = environment(batch, "ec2")["computeResources"]
    assert resources == dict(EC2, maxvCpus=8)


def test_the_folder_keeps_environments_for_every_instance(make_emulator):
    first = make_emulator(control_plane_delay=0)
    first.create_compute_environment(computeEnvironmentName="kept", type="UNMANAGED",
                                     unmanagedvCpus=2)
    second = make_emulator(control_plane_delay=0)
    [found] = second.describe_compute_environments(computeEnvironments=["kept"])["computeEnvironments"]
    assert (found["type"], found["status"], found["unmanagedvCpus"]) == ("UNMANAGED", "VALID", 2)
    files = list((Path(first.emulator.folder) / "computeenvs").iterdir())
    assert [f.name for f in files] == ["kept.json"]
    assert json.loads(files[0].read_text())["unmanagedvCpus"] == 2
    assert computeenvs.SETTLE_SECONDS > 0  # the default delay is not zero: CREATING is seen


# -- jobs on a created environment -------------------------------------------------------------
def overlaps(path: Path) -> int:
    """The most jobs that ran at once, from the start/end lines each job wrote."""
    events = []
    for line in path.read_text().splitlines():
        kind, stamp = line.split()
        events.append((float(stamp), 1 if kind == "start" else -1))
    running = most = 0
    for _, change in sorted(events, key=lambda e: (e[0], e[1])):
        running += change
        most = max(most, running)
    return most


def timed(path: Path, seconds: float):
    return py("import time\n"
              f"open({str(path)!r}, 'a').write(f'start {{time.time()}}\\n')\n"
              f"time.sleep({seconds})\n"
              f"open({str(path)!r}, 'a').write(f'end {{time.time()}}\\n')\n")


@pytest.mark.slow
def test_jobs_of_a_created_queue_run_on_its_environments_vcpus(make_emulator, tmp_path):
    emu = make_emulator(max_vcpus=4, control_plane_delay=0)
    emu.create_compute_environment(computeEnvironmentName="one", type="MANAGED",
                                   computeResources=dict(FARGATE, type="FARGATE", maxvCpus=1))
    emu.create_job_queue(jobQueueName="narrow", priority=1,
                         computeEnvironmentOrder=[{"order": 1, "computeEnvironment": "one"}])
    log = tmp_path / "narrow.log"
    jobs = [emu.job(timed(log, 0.3), queue="narrow", name=f"n{i}") for i in range(3)]
    assert all(emu.wait(j)["status"] == "SUCCEEDED" for j in jobs)
    assert overlaps(log) == 1  # maxvCpus 1: one at a time, though the emulator has 4
    # the same jobs on the emulator's own queue run side by side
    wide = tmp_path / "wide.log"
    jobs = [emu.job(timed(wide, 0.6), name=f"w{i}") for i in range(3)]
    assert all(emu.wait(j)["status"] == "SUCCEEDED" for j in jobs)
    assert overlaps(wide) >= 2


@pytest.mark.slow
def test_a_disabled_environment_starts_nothing_until_enabled(make_emulator, tmp_path):
    emu = make_emulator(max_vcpus=2, control_plane_delay=0)
    emu.create_compute_environment(computeEnvironmentName="off", type="MANAGED", state="DISABLED",
                                   computeResources=dict(FARGATE, type="FARGATE", maxvCpus=2))
    emu.create_job_queue(jobQueueName="held", priority=1,
                         computeEnvironmentOrder=[{"order": 1, "computeEnvironment": "off"}])
    job = emu.job(py("pass"), queue="held")
    emu.wait(job, ["RUNNABLE"])
    other = emu.job(py("pass"))  # another environment's queue is not held by it
    assert emu.wait(other)["status"] == "SUCCEEDED"
    assert emu.detail(job)["status"] == "RUNNABLE"
    emu.update_compute_environment(computeEnvironment="off", state="ENABLED")
    assert emu.wait(job)["status"] == "SUCCEEDED"


@pytest.mark.slow
def test_deleting_a_queue_terminates_the_jobs_in_it(make_emulator):
    emu = make_emulator(control_plane_delay=0)
    emu.create_job_queue(jobQueueName="doomed", priority=1, computeEnvironmentOrder=[])
    job = emu.job(py("import time; time.sleep(60)"), queue="doomed")
    emu.wait(job, ["RUNNING"])
    emu.update_job_queue(jobQueue="doomed", state="DISABLED")
    emu.delete_job_queue(jobQueue="doomed")
    detail = emu.wait(job)
    assert detail["status"] == "FAILED" and detail["isTerminated"] is True
    assert detail["statusReason"] == "Job queue doomed was deleted"


@pytest.mark.slow
def test_a_job_larger_than_its_environment_waits_with_batchs_reason(make_emulator):
    emu = make_emulator(max_vcpus=4, control_plane_delay=0)
    emu.create_compute_environment(computeEnvironmentName="small", type="MANAGED",
                                   computeResources=dict(FARGATE, type="FARGATE", maxvCpus=1))
    reason = "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE"
    emu.create_job_queue(jobQueueName="small-q", priority=1,
                         computeEnvironmentOrder=[{"order": 1, "computeEnvironment": "small"}],
                         jobStateTimeLimitActions=[{"reason": reason, "state": "RUNNABLE",
                                                    "maxTimeSeconds": 1, "action": "CANCEL"}])
    big = emu.job(py("pass"), queue="small-q", vcpus=2)  # fits the machine, not the environment
    held = emu.wait(big, ["RUNNABLE"], check=lambda d: "statusReason" in d)
    assert held["statusReason"] == (f"{reason} - CE(s) associated with the job queue cannot "
                                    "meet the CPU requirement of the job.")
    detail = emu.wait(big)
    assert detail["statusReason"] == f"Canceled by JobStateTimeLimit action due to reason: {reason}"
    assert emu.run(py("pass"), queue="small-q", vcpus=1)["status"] == "SUCCEEDED"


def test_compute_environments_and_consumable_resources_carry_tags(endpoint):
    _, batch = endpoint
    arn = batch.create_compute_environment(computeEnvironmentName="tagged", type="MANAGED",
                                           computeResources=EC2, tags={"a": "1"})["computeEnvironmentArn"]
    assert batch.list_tags_for_resource(resourceArn=arn)["tags"] == {"a": "1"}
    batch.tag_resource(resourceArn=arn, tags={"b": "2"})
    batch.untag_resource(resourceArn=arn, tagKeys=["a"])
    assert environment(batch, "tagged")["tags"] == {"b": "2"}
    made = batch.create_consumable_resource(consumableResourceName="licence", totalQuantity=1)
    batch.tag_resource(resourceArn=made["consumableResourceArn"], tags={"team": "x"})
    assert batch.describe_consumable_resource(consumableResource="licence")["tags"] == {"team": "x"}
    assert "not found" in refusal(lambda: batch.tag_resource(
        resourceArn=arn.replace("tagged", "other"), tags={"c": "3"}))
    assert "not found" in refusal(lambda: batch.list_tags_for_resource(
        resourceArn=arn.replace("tagged", "batchfutures-local")))
