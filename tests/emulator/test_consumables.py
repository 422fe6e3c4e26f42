"""Consumable resources (Batch's resource-aware scheduling): the six operations through a stock
boto3 client on the emulator's HTTP endpoint, and jobs that wait RUNNABLE until the units they
need are free (REPLENISHABLE units come back when a job ends, NON_REPLENISHABLE ones do not).
"""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from emulator_harness import py, wait_until
from model_check import check_output
from test_controlplane import overlaps, refusal, timed

from batchfutures.emulator.consumables import check_create, fits, requirements, updated_total
from batchfutures.emulator.server import EmulatorServer

ARN = "arn:aws:batch:us-east-1:123456789012:consumable-resource/"


@pytest.mark.parametrize("name, total, kind, refused", [
    ("licence", 3, None, None),
    ("licence", 0, "NON_REPLENISHABLE", None),
    ("bad name!", 3, None, "consumableResourceName"),
    ("licence", -1, None, "non-negative"),
    ("licence", 3, "SOMETIMES", "resourceType"),
])
def test_what_create_consumable_resource_refuses(name, total, kind, refused):
    found = check_create(name, total, kind)
    assert (found is None) if refused is None else (refused in found)


@pytest.mark.parametrize("total, operation, quantity, expected", [
    (3, "SET", 5, (5, None)), (3, None, 1, (1, None)), (3, "ADD", 2, (5, None)),
    (3, "REMOVE", 3, (0, None)), (3, "REMOVE", 4, (3, "Cannot remove 4")),
    (3, "MULTIPLY", 2, (3, "operation must be")), (3, "ADD", -1, (3, "non-negative")),
    (3, "SET", None, (3, "quantity is required")),
])
def test_what_update_consumable_resource_does(total, operation, quantity, expected):
    found = updated_total(total, operation, quantity)
    assert found[0] == expected[0]
    assert (found[1] is None) if expected[1] is None else (expected[1] in found[1])


def test_a_jobs_needs_name_resources_by_name_or_arn_and_add_up():
    properties = {"consumableResourceList": [
        {"consumableResource": "licence", "quantity": 1},
        {"consumableResource": f"{ARN}db", "quantity": 2},
        {"consumableResource": "licence", "quantity": 2}]}
    assert requirements(properties) == [("db", 2), ("licence", 3)]
    assert requirements(None) == []


@pytest.mark.parametrize("needs, available, expected", [
    ([], {}, True), ([("a", 1)], {"a": 1}, True), ([("a", 2)], {"a": 1}, False),
    ([("a", 1), ("b", 1)], {"a": 1}, False), ([("a", 1), ("b", 1)], {"a": 5, "b": 1}, True),
])
def test_a_job_fits_when_every_resource_has_its_units(needs, available, expected):
    assert fits(needs, available) is expected


@pytest.fixture
def endpoint(make_emulator):
    emu = make_emulator(max_vcpus=8)
    with EmulatorServer(emu.emulator) as server:
        yield emu, boto3.client("batch", endpoint_url=server.endpoint_url,
                                region_name="us-east-1", **server.credentials)


def checked(operation, answer):
    answer = {k: v for k, v in answer.items() if k != "ResponseMetadata"}
    return check_output("batch", operation, answer)


def test_the_operations_through_boto3(endpoint):
    _, batch = endpoint
    made = batch.create_consumable_resource(consumableResourceName="licence", totalQuantity=3,
                                            tags={"team": "a"})
    assert made["consumableResourceArn"] == f"{ARN}licence"
    batch.create_consumable_resource(consumableResourceName="tokens", totalQuantity=10,
                                     resourceType="NON_REPLENISHABLE")
    assert "already exists" in refusal(lambda: batch.create_consumable_resource(
        consumableResourceName="licence", totalQuantity=1))
    found = checked("DescribeConsumableResource",
                    batch.describe_consumable_resource(consumableResource=f"{ARN}licence"))
    assert (found["totalQuantity"], found["inUseQuantity"], found["availableQuantity"],
            found["resourceType"], found["tags"]) == (3, 0, 3, "REPLENISHABLE", {"team": "a"})
    listed = checked("ListConsumableResources", batch.list_consumable_resources())
    assert [r["consumableResourceName"] for r in listed["consumableResources"]] == ["licence", "tokens"]
    page = batch.list_consumable_resources(maxResults=1)
    assert len(page["consumableResources"]) == 1 and page["nextToken"]
    rest = batch.list_consumable_resources(maxResults=1, nextToken=page["nextToken"])
    assert [r["consumableResourceName"] for r in rest["consumableResources"]] == ["tokens"]
    only = batch.list_consumable_resources(filters=[{"name": "CONSUMABLE_RESOURCE_NAME",
                                                     "values": ["TOK*"]}])
    assert [r["consumableResourceName"] for r in only["consumableResources"]] == ["tokens"]
    assert batch.update_consumable_resource(consumableResource="licence", operation="ADD",
                                            quantity=2)["totalQuantity"] == 5
    assert "Cannot remove" in refusal(lambda: batch.update_consumable_resource(
        consumableResource="licence", operation="REMOVE", quantity=9))
    # a definition or a job naming a resource that does not exist is refused
    assert "does not exist" in refusal(lambda: batch.register_job_definition(
        jobDefinitionName="needs-missing", type="container",
        containerProperties={"image": "x", "command": ["true"],
                             "resourceRequirements": [{"type": "MEMORY", "value": "64"}]},
        consumableResourceProperties={"consumableResourceList": [
            {"consumableResource": "nope", "quantity": 1}]}))
    assert "at least 1" in refusal(lambda: batch.submit_job(
        jobName="zero", jobQueue="batchfutures", jobDefinition="batchfutures-worker",
        consumableResourcePropertiesOverride={"consumableResourceList": [
            {"consumableResource": "licence", "quantity": 0}]}))
    batch.delete_consumable_resource(consumableResource="tokens")
    assert "does not exist" in refusal(
        lambda: batch.describe_consumable_resource(consumableResource="tokens"))
    assert "does not exist" in refusal(
        lambda: batch.list_jobs_by_consumable_resource(consumableResource="tokens"))


def licensed(emu, name="licensed", total=None):
    """A job definition needing one unit of `licence` (made with `total` units if given)."""
    if total is not None:
        emu.create_consumable_resource(consumableResourceName="licence", totalQuantity=total)
    emu.register_job_definition(
        jobDefinitionName=name, type="container",
        containerProperties={"image": "x", "command": py("pass"),
                             "resourceRequirements": [{"type": "VCPU", "value": "0.25"},
                                                      {"type": "MEMORY", "value": "64"}]},
        consumableResourceProperties={"consumableResourceList": [
            {"consumableResource": "licence", "quantity": 1}]})


@pytest.mark.slow
def test_three_licences_among_many_jobs_never_run_more_than_three_at_once(make_emulator,
                                                                          tmp_path: Path):
    emu = make_emulator(max_vcpus=8)
    licensed(emu, total=3)
    log = tmp_path / "runs.log"
    array = emu.job(timed(log, 0.4), size=8, definition="licensed", memory=None)
    seen_waiting = []

    def sample():
        found = emu.describe_consumable_resource(consumableResource="licence")
        waiting = emu.list_jobs(arrayJobId=array, jobStatus="RUNNABLE")["jobSummaryList"]
        seen_waiting.append((found["inUseQuantity"], len(waiting)))
        return emu.status(array) in ("SUCCEEDED", "FAILED")

    wait_until(sample, "the array's end")
    assert emu.detail(array)["status"] == "SUCCEEDED"
    assert overlaps(log) <= 3
    assert max(used for used, _ in seen_waiting) <= 3
    assert any(used == 3 and waiting > 0 for used, waiting in seen_waiting)  # held, not failed
    after = emu.describe_consumable_resource(consumableResource="licence")
    assert (after["inUseQuantity"], after["availableQuantity"], after["totalQuantity"]) == (0, 3, 3)
    child = emu.detail(f"{array}:0")
    assert child["consumableResourceProperties"] == {"consumableResourceList": [
        {"consumableResource": f"{ARN}licence", "quantity": 1}]}
    [listed] = emu.list_jobs_by_consumable_resource(consumableResource="licence")["jobs"]
    assert (listed["jobStatus"], listed["quantity"]) == ("SUCCEEDED", 1)


@pytest.mark.slow
def test_non_replenishable_units_are_spent_and_a_job_waits_for_more(make_emulator):
    emu = make_emulator()
    emu.create_consumable_resource(consumableResourceName="licence", totalQuantity=2,
                                   resourceType="NON_REPLENISHABLE")
    licensed(emu)
    assert emu.run(py("pass"), definition="licensed")["status"] == "SUCCEEDED"
    spent = emu.describe_consumable_resource(consumableResource="licence")
    assert spent["totalQuantity"] == 1  # taken from the total for good
    # SubmitJob's override asks for 2: more than is left, so it waits RUNNABLE
    job = emu.job(py("pass"), definition="licensed", consumableResourcePropertiesOverride={
        "consumableResourceList": [{"consumableResource": "licence", "quantity": 2}]})
    emu.wait(job, ["RUNNABLE"])
    [front] = emu.get_job_queue_snapshot(jobQueue="batchfutures")["frontOfQueue"]["jobs"]
    assert front["jobArn"].endswith(job)
    other = emu.job(py("pass"))  # a job needing no licence is held behind it: FIFO
    emu.wait(other, ["RUNNABLE"])
    emu.update_consumable_resource(consumableResource="licence", operation="ADD", quantity=1)
    assert emu.wait(job)["status"] == "SUCCEEDED"
    assert emu.wait(other)["status"] == "SUCCEEDED"
    assert emu.detail(other)["startedAt"] >= emu.detail(job)["startedAt"]  # it did not jump ahead
    assert emu.describe_consumable_resource(consumableResource="licence")["totalQuantity"] == 0
