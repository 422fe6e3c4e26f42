"""What third-party clients (Metaflow and others) call besides the executor's operations:
DescribeComputeEnvironments, the multi-node parent as AWS shows it, CancelJobs/TerminateJobs,
FilterLogEvents, scheduling policies and share identifiers. Every in-process answer is checked
against botocore's output shapes (Harness); the HTTP ones go through a stock boto3 client."""

import json
import os

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from emulator_harness import QUEUE, py, wait_until
from model_check import check_output

from batchfutures.emulator.jobstate import MAIN_NODE_EXITED, MISCONFIGURED
from batchfutures.emulator.server import EmulatorServer

pytestmark = pytest.mark.slow  # emulators and job processes

GROUP = "/aws/batch/job"
SLEEP = py("import time; time.sleep(60)")


def clients(server):
    config = Config(retries={"total_max_attempts": 1})
    return [boto3.client(service, endpoint_url=server.endpoint_url, region_name="us-east-1",
                         config=config, **server.credentials) for service in ("batch", "logs")]


def multinode(emu, num_nodes, main=0, vcpus=1):
    container = {"image": "local", "command": ["true"],
                 "resourceRequirements": [{"type": "VCPU", "value": str(vcpus)},
                                          {"type": "MEMORY", "value": "128"}]}
    return emu.register_job_definition(
        jobDefinitionName="mnp", type="multinode",
        nodeProperties={"numNodes": num_nodes, "mainNode": main, "nodeRangeProperties": [
            {"targetNodes": "0:", "container": container}]})["jobDefinitionArn"]


def submit_nodes(emu, definition, command=None):
    params = {}
    if command is not None:
        params["nodeOverrides"] = {"nodePropertyOverrides": [
            {"targetNodes": "0:", "containerOverrides": {"command": command}}]}
    return emu.submit_job(jobName="mnp", jobQueue=QUEUE, jobDefinition=definition,
                          **params)["jobId"]


# -- DescribeComputeEnvironments ---------------------------------------------------------------
def test_every_queue_names_a_managed_valid_compute_environment_that_can_be_described(make_emulator):
    emu = make_emulator(max_vcpus=3, compute_environment="local-ce")
    emu.create_job_queue(jobQueueName="other", priority=1, computeEnvironmentOrder=[])
    queues = emu.describe_job_queues()["jobQueues"]
    entries = {e["computeEnvironment"] for q in queues for e in q["computeEnvironmentOrder"]}
    assert len(queues) == 2 and len(entries) == 1
    (environment,) = emu.describe_compute_environments(
        computeEnvironments=list(entries))["computeEnvironments"]
    assert environment["computeEnvironmentArn"] in entries
    assert environment["computeEnvironmentName"] == "local-ce"
    assert (environment["type"], environment["state"], environment["status"]) == (
        "MANAGED", "ENABLED", "VALID")
    resources = environment["computeResources"]
    assert resources["type"] == "EC2" and resources["maxvCpus"] == 3
    assert resources["instanceTypes"]
    by_name = emu.describe_compute_environments(computeEnvironments=["local-ce", "nope"])
    assert by_name["computeEnvironments"] == [environment]  # an unknown one is left out
    assert emu.describe_compute_environments()["computeEnvironments"] == [environment]
    with pytest.raises(ClientError) as refused:
        emu.describe_compute_environments(maxResults=0)
    assert refused.value.response["Error"]["Code"] == "ClientException"


def test_compute_environments_through_the_http_endpoint(make_emulator):
    emu = make_emulator(max_vcpus=2.5)
    with EmulatorServer(emu.emulator) as server:
        batch, _ = clients(server)
        (queue,) = batch.describe_job_queues(jobQueues=[QUEUE])["jobQueues"]
        names = [e["computeEnvironment"] for e in queue["computeEnvironmentOrder"]]
        found = batch.describe_compute_environments(computeEnvironments=names)
        check_output("batch", "DescribeComputeEnvironments", found)
        (environment,) = found["computeEnvironments"]
        assert environment["computeResources"]["maxvCpus"] == 2  # never more than run at once


# -- the multi-node parent ---------------------------------------------------------------------
def test_the_multinode_parent_shows_its_main_nodes_attempts_exit_code_reason_and_times(
        make_emulator, tmp_path):
    emu = make_emulator(max_vcpus=2)
    marker = tmp_path / "other-started"
    code = ("import os, sys, time\n"
            f"marker = {str(marker)!r}\n"
            "if os.environ['AWS_BATCH_JOB_NODE_INDEX'] == '1':\n"
            "    open(marker, 'w').close()\n"
            "    time.sleep(60)\n"
            "deadline = time.time() + 60\n"
            "while not os.path.exists(marker) and time.time() < deadline:\n"
            "    time.sleep(0.01)\n"
            "sys.exit(3)\n")
    job_id = submit_nodes(emu, multinode(emu, 2, main=0), py(code))
    parent = emu.wait(job_id)
    main = emu.detail(f"{job_id}#0")
    assert parent["status"] == "FAILED" and "container" not in parent
    assert parent["attempts"] == main["attempts"] and len(parent["attempts"]) == 1
    assert parent["attempts"][-1]["container"]["exitCode"] == 3  # what Metaflow reads
    assert parent["statusReason"] == main["statusReason"] == "Essential container in task exited"
    assert (parent["startedAt"], parent["stoppedAt"]) == (main["startedAt"], main["stoppedAt"])
    (listed,) = [j for j in emu.list_jobs(jobQueue=QUEUE, jobStatus="FAILED")["jobSummaryList"]
                 if j["jobId"] == job_id]
    assert listed["container"]["exitCode"] == 3 and listed["stoppedAt"] == main["stoppedAt"]


def test_a_runnable_multinode_parent_shows_its_main_nodes_reason(make_emulator):
    emu = make_emulator(max_vcpus=2)
    job_id = submit_nodes(emu, multinode(emu, 3))  # 3 vCPUs at once: never fits
    emu.wait(f"{job_id}#0", ["RUNNABLE"], check=lambda d: "statusReason" in d)
    parent = emu.detail(job_id)
    assert parent["status"] == "RUNNABLE" and parent["statusReason"] == MISCONFIGURED
    assert parent["attempts"] == [] and parent["startedAt"] == 0
    emu.cancel_job(jobId=job_id, reason="never fits")
    assert emu.wait(job_id)["statusReason"] == "never fits"


def test_a_node_stopped_by_the_main_nodes_end_ends_by_its_own_exit_code(make_emulator, tmp_path):
    emu = make_emulator(max_vcpus=3)
    ready = tmp_path / "ready"
    ready.mkdir()
    code = ("import os, signal, sys, time\n"
            "index = os.environ['AWS_BATCH_JOB_NODE_INDEX']\n"
            f"ready = {str(ready)!r}\n"
            "if index == '1':  # leaves cleanly when stopped\n"
            "    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
            "if index != '0':\n"
            "    open(os.path.join(ready, index), 'w').close()\n"
            "    time.sleep(60)\n"
            "    sys.exit(9)\n"
            "deadline = time.time() + 60\n"
            "while len(os.listdir(ready)) < 2 and time.time() < deadline:\n"
            "    time.sleep(0.01)\n")
    job_id = submit_nodes(emu, multinode(emu, 3), py(code))
    assert emu.wait(job_id)["status"] == "SUCCEEDED"
    clean, killed = emu.wait(f"{job_id}#1"), emu.wait(f"{job_id}#2")
    assert clean["status"] == "SUCCEEDED" and clean["attempts"][-1]["container"]["exitCode"] == 0
    assert clean["statusReason"] == "Essential container in task exited"
    assert killed["status"] == "FAILED" and killed["statusReason"] == MAIN_NODE_EXITED
    assert killed["attempts"][-1]["container"]["exitCode"] == 143  # SIGTERM


def test_nodes_that_exit_zero_never_fail_whichever_node_ends_first(make_emulator):
    emu = make_emulator(max_vcpus=2)
    definition = multinode(emu, 2)
    for _ in range(4):  # the race the main node's end used to lose
        job_id = submit_nodes(emu, definition)
        assert emu.wait(job_id)["status"] == "SUCCEEDED"
        for index in (0, 1):
            node = emu.wait(f"{job_id}#{index}")
            codes = [a["container"].get("exitCode") for a in node["attempts"]]
            if codes and codes[-1] == 0:
                assert node["status"] == "SUCCEEDED", node


# -- CancelJobs, TerminateJobs -----------------------------------------------------------------
def test_cancel_jobs_and_terminate_jobs_report_each_job(make_emulator):
    emu = make_emulator(max_vcpus=1)
    running = emu.job(SLEEP, vcpus=1)
    emu.wait(running, ["RUNNING"])
    waiting = emu.job(SLEEP, vcpus=1)
    emu.wait(waiting, ["RUNNABLE"])
    unknown = "00000000-0000-0000-0000-000000000000"
    answer = emu.cancel_jobs(jobs=[running, waiting, unknown], reason="bulk cancel")
    assert answer == {"successful": [running, waiting, unknown], "errors": []}
    assert emu.wait(waiting)["statusReason"] == "bulk cancel"
    assert emu.status(running) == "RUNNING"  # CancelJob leaves a started job alone
    answer = emu.terminate_jobs(jobs=[running], reason="bulk stop")
    assert answer == {"successful": [running], "errors": []}
    detail = emu.wait(running)
    assert detail["status"] == "FAILED" and detail["statusReason"] == "bulk stop"
    assert detail["isTerminated"] is True
    for jobs, reason in (([running] * 51, "r"), ([], "r"), ([running], "x" * 1025)):
        with pytest.raises(ClientError) as refused:
            emu.terminate_jobs(jobs=jobs, reason=reason)
        assert refused.value.response["Error"]["Code"] == "ClientException"


def test_bulk_stops_through_the_http_endpoint(make_emulator):
    emu = make_emulator(max_vcpus=1)
    with EmulatorServer(emu.emulator) as server:
        batch, _ = clients(server)
        job_id = batch.submit_job(jobName="s", jobQueue=QUEUE, jobDefinition="batchfutures-worker",
                                  containerOverrides={"command": SLEEP})["jobId"]
        emu.wait(job_id, ["RUNNING"])
        answer = batch.terminate_jobs(jobs=[job_id], reason="stop")
        check_output("batch", "TerminateJobs", answer)
        assert answer["successful"] == [job_id] and answer["errors"] == []
        assert emu.wait(job_id)["statusReason"] == "stop"
        answer = batch.cancel_jobs(jobs=[job_id], reason="again")  # finished: nothing to do
        check_output("batch", "CancelJobs", answer)
        assert answer["successful"] == [job_id]


# -- FilterLogEvents ---------------------------------------------------------------------------
def printing(emu, lines):
    detail = emu.run(py("print(" + repr("\n".join(lines)) + ")"))
    assert detail["status"] == "SUCCEEDED"
    return detail["attempts"][-1]["container"]["logStreamName"]


def all_pages(logs, **request):
    """Every event of a FilterLogEvents search, page by page: (stream, message, eventId)."""
    found, token = [], None
    while True:
        page = logs.filter_log_events(logGroupName=GROUP, **request,
                                      **({"nextToken": token} if token else {}))
        found.extend((e["logStreamName"], e["message"], e["eventId"]) for e in page["events"])
        token = page.get("nextToken")
        if not token:
            return found


def test_filter_log_events_by_stream_prefix_and_pattern(emu):
    first = printing(emu, ["alpha one", "beta two", "ERROR three"])
    second = printing(emu, ["alpha four", "ERROR: five"])
    logs = emu.logs
    found = logs.filter_log_events(logGroupName=GROUP, logStreamNames=[first])
    assert [e["message"] for e in found["events"]] == ["alpha one", "beta two", "ERROR three"]
    assert {e["logStreamName"] for e in found["events"]} == {first} and "nextToken" not in found
    prefix = first.rsplit("/", 1)[0] + "/"
    every = logs.filter_log_events(logGroupName=GROUP, logStreamNamePrefix=prefix)["events"]
    assert {(e["logStreamName"], e["message"]) for e in every} >= {
        (first, "alpha one"), (second, "ERROR: five")}
    assert len({e["eventId"] for e in every}) == len(every)
    assert [e["timestamp"] for e in every] == sorted(e["timestamp"] for e in every)
    errors = logs.filter_log_events(logGroupName=GROUP, logStreamNames=[first, second],
                                    filterPattern="ERROR")["events"]
    assert sorted(e["message"] for e in errors) == ["ERROR three", "ERROR: five"]
    phrase = logs.filter_log_events(logGroupName=GROUP, logStreamNames=[first, second],
                                    filterPattern='"alpha four"')["events"]
    assert [e["message"] for e in phrase] == ["alpha four"]
    either = logs.filter_log_events(logGroupName=GROUP, logStreamNames=[first, second],
                                    filterPattern="?beta ?five")["events"]
    assert sorted(e["message"] for e in either) == ["ERROR: five", "beta two"]
    assert logs.filter_log_events(logGroupName=GROUP, logStreamNames=[first],
                                  filterPattern="alpha -one")["events"] == []
    # one event a page: the token goes on within a stream and across streams, none twice
    paged, token = [], None
    while True:
        request = {"logGroupName": GROUP, "logStreamNames": [first, second], "limit": 1}
        page = logs.filter_log_events(**request, **({"nextToken": token} if token else {}))
        assert len(page["events"]) <= 1
        paged.extend(e["message"] for e in page["events"])
        token = page.get("nextToken")
        if not token:
            break
    assert sorted(paged) == sorted(["alpha one", "beta two", "ERROR three", "alpha four",
                                    "ERROR: five"])
    oldest_first = all_pages(logs, logStreamNames=[first, second], limit=2)
    newest_first = all_pages(logs, logStreamNames=[first, second], limit=2, startFromHead=False)
    assert newest_first == oldest_first[::-1] and len(oldest_first) == 5
    assert not logs.filter_log_events(logGroupName=GROUP, logStreamNames=[first],
                                      endTime=0)["events"]
    for bad in ({"logStreamNames": [first], "logStreamNamePrefix": prefix},
                {"filterPattern": '{ $.level = "x" }'}, {"nextToken": "garbage"}):
        with pytest.raises(ClientError) as refused:
            logs.filter_log_events(logGroupName=GROUP, **bad)
        assert refused.value.response["Error"]["Code"] == "InvalidParameterException"
    with pytest.raises(ClientError) as refused:
        logs.filter_log_events(logGroupName="/other")
    assert refused.value.response["Error"]["Code"] == "ResourceNotFoundException"


def test_filter_log_events_through_the_http_endpoint(make_emulator):
    emu = make_emulator()
    stream = printing(emu, ["hello", "world"])
    with EmulatorServer(emu.emulator) as server:
        _, logs = clients(server)
        found = logs.filter_log_events(logGroupName=GROUP, logStreamNamePrefix=stream,
                                       filterPattern="world")
        check_output("logs", "FilterLogEvents", found)
        assert [(e["logStreamName"], e["message"]) for e in found["events"]] == [(stream, "world")]


# -- scheduling policies and share identifiers ----------------------------------------------
def test_share_identifiers_need_a_queue_with_a_scheduling_policy(make_emulator):
    emu = make_emulator()
    with pytest.raises(ClientError, match="scheduling policy"):
        emu.job(["true"], shareIdentifier="teamA")  # the default queue is FIFO
    arn = emu.create_scheduling_policy(name="fair", fairsharePolicy={
        "shareDecaySeconds": 600, "shareDistribution": [
            {"shareIdentifier": "teamA", "weightFactor": 0.5}]})["arn"]
    emu.create_job_queue(jobQueueName="fairq", priority=1, schedulingPolicyArn=arn,
                         computeEnvironmentOrder=[])
    (queue,) = emu.describe_job_queues(jobQueues=["fairq"])["jobQueues"]
    assert queue["schedulingPolicyArn"] == arn
    with pytest.raises(ClientError, match="shareIdentifier"):
        emu.job(["true"], queue="fairq")  # a fair-share queue needs one
    detail = emu.run(["true"], queue="fairq", shareIdentifier="teamA", schedulingPriorityOverride=3)
    assert detail["status"] == "SUCCEEDED" and detail["shareIdentifier"] == "teamA"
    (policy,) = emu.describe_scheduling_policies(arns=[arn])["schedulingPolicies"]
    assert policy["name"] == "fair" and policy["fairsharePolicy"]["shareDecaySeconds"] == 600
    assert {"arn": arn} in emu.list_scheduling_policies()["schedulingPolicies"]
    refusals = [
        lambda: emu.update_job_queue(jobQueue=QUEUE, schedulingPolicyArn=arn),  # FIFO stays FIFO
        lambda: emu.create_job_queue(jobQueueName="q2", priority=1, computeEnvironmentOrder=[],
                                     schedulingPolicyArn=arn + "x"),
        lambda: emu.create_scheduling_policy(name="fair"),
        lambda: emu.create_scheduling_policy(name="overlap", fairsharePolicy={"shareDistribution": [
            {"shareIdentifier": "team*"}, {"shareIdentifier": "teamA"}]}),
        lambda: emu.job(["true"], queue="fairq", shareIdentifier="bad id"),
    ]
    for refused_call in refusals:
        with pytest.raises(ClientError) as refused:
            refused_call()
        assert refused.value.response["Error"]["Code"] == "ClientException"


def test_scheduling_policies_are_shared_through_the_folder_and_the_endpoint(make_emulator, tmp_path):
    first = make_emulator()
    arn = first.create_scheduling_policy(name="shared")["arn"]
    second = make_emulator()  # another instance on the same folder
    assert second.describe_scheduling_policies(arns=[arn])["schedulingPolicies"][0]["arn"] == arn
    folder = tmp_path / "emulator" / "policies"
    assert oct(os.stat(folder).st_mode & 0o777) == "0o700"
    assert json.loads((folder / "shared.json").read_text())["arn"] == arn
    with EmulatorServer(second.emulator) as server:
        batch, _ = clients(server)
        listed = wait_until(lambda: batch.list_scheduling_policies()["schedulingPolicies"], "a policy")
        assert {"arn": arn} in listed
