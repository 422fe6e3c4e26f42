"""Multi-node parallel jobs: each node a local process, Batch's variables, the main node decides."""

import json

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from emulator_harness import QUEUE, pid_gone, py, wait_until

from batchfutures.emulator.server import EmulatorServer

pytestmark = pytest.mark.slow  # every test runs node processes

# Every node writes what it sees; the main node waits (bounded) for the others, then exits `code`.
NODE = ("import json, os, sys, time\n"
        "folder = sys.argv[1]\n"
        "index = int(os.environ['AWS_BATCH_JOB_NODE_INDEX'])\n"
        "seen = {k: v for k, v in os.environ.items() if k.startswith('AWS_BATCH')}\n"
        "seen['pid'] = os.getpid()\n"
        "json.dump(seen, open(os.path.join(folder, f'.node-{index}'), 'w'))\n"
        "os.replace(os.path.join(folder, f'.node-{index}'), os.path.join(folder, f'node-{index}.json'))\n"
        "count = int(os.environ['AWS_BATCH_JOB_NUM_NODES'])\n"
        "if index == int(os.environ['AWS_BATCH_JOB_MAIN_NODE_INDEX']):\n"
        "    deadline = time.time() + 60\n"
        "    names = [os.path.join(folder, f'node-{i}.json') for i in range(count)]\n"
        "    while time.time() < deadline and not all(map(os.path.exists, names)):\n"
        "        time.sleep(0.01)\n"
        "    sys.exit(int(sys.argv[2]))\n"
        "sys.exit(int(sys.argv[3]))\n")


def container(command, vcpus=1, memory=128):
    return {"image": "local", "command": command,
            "resourceRequirements": [{"type": "VCPU", "value": str(vcpus)},
                                     {"type": "MEMORY", "value": str(memory)}]}


def register(emu, num_nodes=3, main=0, ranges=None, vcpus=1):
    ranges = ranges or [{"targetNodes": "0:", "container": container(["python", "-c", "pass"], vcpus)}]
    return emu.register_job_definition(
        jobDefinitionName="mnp", type="multinode",
        nodeProperties={"numNodes": num_nodes, "mainNode": main, "nodeRangeProperties": ranges}
    )["jobDefinitionArn"]


def node_command(folder, main_code=0, other_code=0, other=None):
    return ["python", "-S", "-c", NODE, str(folder), str(main_code), str(other_code)]


def submit(emu, definition, **params):
    return emu.submit_job(jobName="mnp", jobQueue=QUEUE, jobDefinition=definition, **params)["jobId"]


def overrides(command, targets="0:"):
    return {"nodePropertyOverrides": [{"targetNodes": targets,
                                       "containerOverrides": {"command": command}}]}


def test_each_node_runs_with_batchs_variables_and_the_main_node_decides(make_emulator, tmp_path):
    emu = make_emulator(max_vcpus=3)
    definition = register(emu, num_nodes=3, main=1)
    job_id = submit(emu, definition, nodeOverrides=overrides(node_command(tmp_path)))
    detail = emu.wait(job_id)
    assert detail["status"] == "SUCCEEDED"
    assert detail["nodeProperties"]["numNodes"] == 3 and detail["nodeProperties"]["mainNode"] == 1
    # as AWS: no container of its own; its attempts (and exit code) are its main node's
    assert "container" not in detail
    assert detail["attempts"] == emu.detail(f"{job_id}#1")["attempts"]
    seen = [json.loads((tmp_path / f"node-{i}.json").read_text()) for i in range(3)]
    for index, env in enumerate(seen):
        assert env["AWS_BATCH_JOB_ID"] == f"{job_id}#{index}"
        assert env["AWS_BATCH_JOB_NODE_INDEX"] == str(index)
        assert env["AWS_BATCH_JOB_NUM_NODES"] == "3"
        assert env["AWS_BATCH_JOB_MAIN_NODE_INDEX"] == "1"
        assert "AWS_BATCH_JOB_ARRAY_INDEX" not in env
    assert "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS" not in seen[1]  # the main node
    assert seen[0]["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] == "127.0.0.1"
    # (a node that had not exited yet when the main node did was stopped: any final status)
    nodes = emu.list_jobs(multiNodeJobId=job_id,
                          filters=[{"name": "JOB_NAME", "values": ["mnp"]}])["jobSummaryList"]
    assert sorted(n["jobId"] for n in nodes) == [f"{job_id}#{i}" for i in range(3)]
    assert {n["nodeProperties"]["nodeIndex"]: n["nodeProperties"]["isMainNode"] for n in nodes} == {
        0: False, 1: True, 2: False}
    assert emu.detail(f"{job_id}#2")["nodeDetails"] == {"nodeIndex": 2, "isMainNode": False}
    assert emu.detail(f"{job_id}#1")["attempts"][0]["container"]["exitCode"] == 0
    assert emu.describe_jobs(jobs=[f"{job_id}:2", f"{job_id}#3"])["jobs"] == []
    [listed] = [j for j in emu.list_jobs(jobQueue=QUEUE, jobStatus="SUCCEEDED")["jobSummaryList"]
                if j["jobId"] == job_id]
    assert listed["nodeProperties"] == {"numNodes": 3}


def test_the_main_nodes_failure_fails_the_job_and_stops_the_other_nodes(make_emulator, tmp_path):
    emu = make_emulator(max_vcpus=3)
    definition = register(emu, num_nodes=3)
    pids = tmp_path / "pids"
    pids.mkdir()
    hold = ("import json, os, sys, time\n"
            "index = int(os.environ['AWS_BATCH_JOB_NODE_INDEX'])\n"
            f"folder = {str(pids)!r}\n"
            "json.dump(os.getpid(), open(folder + f'.{index}', 'w'))  # then renamed: whole\n"
            "os.replace(folder + f'.{index}', os.path.join(folder, f'pid-{index}'))\n"
            "if index == 0:\n"
            "    while len(os.listdir(folder)) < 3:\n"
            "        time.sleep(0.01)\n"
            "    sys.exit(3)\n"
            "time.sleep(60)\n")
    job_id = submit(emu, definition, nodeOverrides=overrides(py(hold)))
    detail = emu.wait(job_id)
    assert detail["status"] == "FAILED"
    assert detail["statusReason"] == "Essential container in task exited"
    main = emu.detail(f"{job_id}#0")
    assert main["attempts"][0]["container"]["exitCode"] == 3
    for index in (1, 2):
        node = emu.wait(f"{job_id}#{index}")
        assert node["status"] == "FAILED"
        assert node["statusReason"] == "The main node exited"
        pid = json.loads((pids / f"pid-{index}").read_text())
        wait_until(lambda p=pid: pid_gone(p), "the node's process to end")


def test_another_nodes_failure_does_not_decide_the_job(make_emulator, tmp_path):
    emu = make_emulator(max_vcpus=3)
    definition = register(emu, num_nodes=2)
    job_id = submit(emu, definition, nodeOverrides=overrides(node_command(tmp_path, 0, 5)))
    assert emu.wait(job_id)["status"] == "SUCCEEDED"
    assert emu.wait(f"{job_id}#1")["status"] == "FAILED"  # exit 5, or stopped with the main


def test_node_ranges_and_overrides_give_each_node_its_own_container(make_emulator, tmp_path):
    emu = make_emulator(max_vcpus=4)
    marker = tmp_path / "other-ran"
    main_code = ("import os, time\n"  # the main node waits for the other one (bounded)
                 f"deadline = time.time() + 60\n"
                 f"while not os.path.exists({str(marker)!r}) and time.time() < deadline:\n"
                 "    time.sleep(0.01)\n"
                 "print('main')\n")
    other_code = f"print('overridden'); open({str(marker)!r}, 'w').close()"
    ranges = [{"targetNodes": "0:", "container": container(py("print('worker')"))},
              {"targetNodes": "0", "container": container(py(main_code), memory=256)}]
    definition = register(emu, num_nodes=3, ranges=ranges)
    job_id = submit(emu, definition, nodeOverrides={
        "numNodes": 2, "nodePropertyOverrides": [
            {"targetNodes": "1:", "containerOverrides": {"command": py(other_code)}}]})
    detail = emu.wait(job_id)
    assert detail["status"] == "SUCCEEDED" and detail["nodeProperties"]["numNodes"] == 2
    main, other = emu.detail(f"{job_id}#0"), emu.wait(f"{job_id}#1")
    assert emu.log_lines(main) == ["main"] and emu.log_lines(other) == ["overridden"]
    assert {"type": "MEMORY", "value": "256"} in main["container"]["resourceRequirements"]
    assert emu.describe_jobs(jobs=[f"{job_id}#2"])["jobs"] == []


def test_nodes_that_together_need_more_vcpus_than_there_are_wait_runnable(make_emulator):
    emu = make_emulator(max_vcpus=2)
    definition = register(emu, num_nodes=3)
    job_id = submit(emu, definition)
    emu.wait(f"{job_id}#0", ["RUNNABLE"], check=lambda d: "statusReason" in d)
    assert emu.detail(job_id)["status"] == "RUNNABLE"
    emu.cancel_job(jobId=job_id, reason="never fits")
    detail = emu.wait(job_id)
    assert detail["status"] == "FAILED" and detail["statusReason"] == "never fits"
    assert all(emu.detail(f"{job_id}#{i}")["statusReason"] == "never fits" for i in range(3))


def test_invalid_multinode_definitions_and_requests_are_refused(emu):
    with pytest.raises(ClientError, match="mainNode"):
        register(emu, num_nodes=2, main=2)
    with pytest.raises(ClientError, match="cover"):
        submit(emu, register(emu, num_nodes=3, ranges=[
            {"targetNodes": "0:1", "container": container(["true"])}]))
    with pytest.raises(ClientError, match="Array jobs"):
        submit(emu, register(emu), arrayProperties={"size": 2})


def test_a_multinode_job_through_the_http_endpoint_with_stock_boto3(make_emulator, tmp_path):
    emu = make_emulator(max_vcpus=2)
    # the endpoint serves only requests signed with its pair: the one the clients below use
    with EmulatorServer(emu.emulator, access_key_id="x", secret_access_key="x") as server:
        batch = boto3.client("batch", endpoint_url=server.endpoint_url, region_name="us-east-1",
                             aws_access_key_id="x", aws_secret_access_key="x",
                             config=Config(retries={"total_max_attempts": 1}))
        definition = batch.register_job_definition(
            jobDefinitionName="mnp", type="multinode",
            nodeProperties={"numNodes": 2, "mainNode": 0, "nodeRangeProperties": [
                {"targetNodes": "0:", "container": container(node_command(tmp_path))}]}
        )["jobDefinitionArn"]
        job_id = batch.submit_job(jobName="mnp", jobQueue=QUEUE, jobDefinition=definition)["jobId"]
        detail = wait_until(lambda: next((j for j in batch.describe_jobs(jobs=[job_id])["jobs"]
                                          if j["status"] in ("SUCCEEDED", "FAILED")), None), "the end")
        assert detail["status"] == "SUCCEEDED"
        nodes = batch.list_jobs(multiNodeJobId=job_id,
                                filters=[{"name": "JOB_NAME", "values": ["mnp"]}])["jobSummaryList"]
        assert len(nodes) == 2
