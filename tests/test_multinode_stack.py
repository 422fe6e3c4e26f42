"""Multi-node jobs with the stack: the main node's own address, the multinode definition the
client derives from a container one, and the multi-node queue.

The main node's address comes from an ECS task metadata endpoint served here on 127.0.0.1 (the
shape ECS serves at ECS_CONTAINER_METADATA_URI_V4). Definitions are registered in the emulator
(its Batch API, and its HTTP endpoint through a stock boto3 client for the end-to-end run).
The template's side (queue, compute environment, security group rule) is checked in
tests/test_setup_resources.py.
"""

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest
import s3server
from s3server import emulator_endpoint

from batchfutures import AWSBatchEnvironment, BatchExecutor, node
from batchfutures.emulator import BatchEmulator
from batchfutures.errors import ConfigurationError
from batchfutures.jobdefinitions import multinode_definition_from
from batchfutures.submission import multinode_queue
from batchfutures.worker.nodes import task_address

REGION = "us-east-1"
moto_server, aws_env = s3server.moto_server, s3server.aws_env  # fake credentials (fixtures)
# what ECS answers at ${ECS_CONTAINER_METADATA_URI_V4} for a container of an awsvpc task
CONTAINER_METADATA = {
    "DockerId": "ea32192c8553fbff06c9340478a2ff089b2bb5646fb718b4ee206641c9086d66",
    "Name": "default",
    "Networks": [{"NetworkMode": "awsvpc", "IPv4Addresses": ["10.0.2.106"],
                  "IPv4SubnetCIDRBlock": "10.0.2.0/24", "PrivateDNSName": "ip-10-0-2-106.ec2.internal"}],
}


class _Metadata(BaseHTTPRequestHandler):
    answers: dict = {}

    def do_GET(self):  # noqa: N802 - http.server's name
        body = self.answers.get(self.path)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def metadata_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def main_node_environ(uri):
    return {"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_NUM_NODES": "3",
            "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0", "ECS_CONTAINER_METADATA_URI_V4": uri}


def test_the_main_node_reads_its_address_from_task_metadata_v4(metadata_server):
    _Metadata.answers = {"/v4/abc": CONTAINER_METADATA}
    info = node(main_node_environ(f"{metadata_server}/v4/abc"))
    assert info.is_main and info.main_address == "10.0.2.106"
    other = node({**main_node_environ(f"{metadata_server}/v4/abc"),
                  "AWS_BATCH_JOB_NODE_INDEX": "1",
                  "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.2.106"})
    assert other.main_address == info.main_address  # what the other nodes are told


def test_task_metadata_without_an_ipv4_address_gives_none(metadata_server):
    _Metadata.answers = {"/v4/bridge": {"Networks": [{"NetworkMode": "bridge"}]},
                         "/v4/v6": {"Networks": [{"IPv4Addresses": ["fd00::5", "10.1.0.9"]}]},
                         "/v4/odd": ["not", "a", "mapping"]}
    assert task_address(f"{metadata_server}/v4/bridge") is None
    assert task_address(f"{metadata_server}/v4/v6") == "10.1.0.9"
    assert task_address(f"{metadata_server}/v4/odd") is None
    assert task_address(f"{metadata_server}/v4/missing") is None  # 404


@pytest.mark.parametrize("queue, stack, expected", [
    ("arn:aws:batch:us-east-1:123456789012:job-queue/bf-ec2", "bf",
     "arn:aws:batch:us-east-1:123456789012:job-queue/bf-multinode"),
    ("bf-ec2", "bf", "bf-multinode"),
    ("arn:aws:batch:us-east-1:123456789012:job-queue/bf-ec2", None,
     "arn:aws:batch:us-east-1:123456789012:job-queue/bf-ec2"),  # no stack: the queue given
    ("arn:aws:batch:us-east-1:123456789012:job-queue/mine", "bf",
     "arn:aws:batch:us-east-1:123456789012:job-queue/mine"),  # not the stack's: as given
])
def test_multi_node_jobs_go_to_the_stacks_multinode_queue(queue, stack, expected):
    assert multinode_queue(queue, stack) == expected


# -- the multinode definition derived from a container one ----------------------------------------
@pytest.fixture
def emulator(tmp_path):
    emulator = BatchEmulator(tmp_path / "emulator", max_vcpus=2)
    try:
        yield emulator
    finally:
        emulator.close()


CONTAINER = {"image": "worker:py3", "command": ["python", "-m", "batchfutures.worker"],
             "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                      {"type": "MEMORY", "value": "2048"}],
             "jobRoleArn": "arn:aws:iam::123456789012:role/job",
             "executionRoleArn": "arn:aws:iam::123456789012:role/execution"}


def test_a_container_definition_becomes_a_multinode_one_once(emulator):
    emulator.register_job_definition(
        jobDefinitionName="st-worker", type="container", containerProperties=CONTAINER,
        platformCapabilities=["EC2"], propagateTags=True, retryStrategy={"attempts": 1},
        tags={"batchfutures:stack": "st"})
    arn = multinode_definition_from(emulator, "st-worker", stack="st")
    (made,) = emulator.describe_job_definitions(jobDefinitions=[arn])["jobDefinitions"]
    assert made["type"] == "multinode" and made["jobDefinitionName"].startswith("st_")
    properties = made["nodeProperties"]
    assert properties["mainNode"] == 0
    (group,) = properties["nodeRangeProperties"]
    assert group["targetNodes"] == "0:"  # every node, whatever SubmitJob's numNodes
    assert group["container"]["image"] == CONTAINER["image"]
    assert group["container"]["jobRoleArn"] == CONTAINER["jobRoleArn"]
    assert made["tags"]["batchfutures:stack"] == "st"
    assert made["retryStrategy"]["attempts"] == 1 and made["propagateTags"] is True
    # content-addressed: asked again, nothing new is registered
    assert multinode_definition_from(emulator, "st-worker", stack="st") == arn
    revisions = emulator.describe_job_definitions(
        jobDefinitionName=made["jobDefinitionName"])["jobDefinitions"]
    assert len(revisions) == 1


def test_a_multinode_definition_is_used_as_it_is(emulator):
    emulator.register_job_definition(
        jobDefinitionName="mn", type="multinode", nodeProperties={
            "numNodes": 2, "mainNode": 0,
            "nodeRangeProperties": [{"targetNodes": "0:", "container": CONTAINER}]})
    assert multinode_definition_from(emulator, "mn") == "mn"


def test_a_fargate_definition_cannot_run_nodes(emulator):
    fargate = dict(CONTAINER, networkConfiguration={"assignPublicIp": "ENABLED"},
                   resourceRequirements=[{"type": "VCPU", "value": "1"},
                                         {"type": "MEMORY", "value": "2048"}])
    emulator.register_job_definition(jobDefinitionName="fg", type="container",
                                     containerProperties=fargate,
                                     platformCapabilities=["FARGATE"])
    with pytest.raises(ConfigurationError, match="Fargate"):
        multinode_definition_from(emulator, "fg")
    with pytest.raises(ConfigurationError, match="does not exist"):
        multinode_definition_from(emulator, "no-such-definition")


def where_am_i(x):
    from batchfutures import node as this_node

    info = this_node()
    return (info.index, info.count, x)


@pytest.mark.slow
def test_nodes_run_with_a_container_definition_as_the_stack_gives_it(tmp_path, s3_endpoint):
    """AWSBatchEnvironment(job_definition=<a container definition>) with nodes=2: the client
    registers the multinode copy, so SubmitJob's nodeOverrides are accepted and each node runs."""
    bucket = f"bf-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=bucket)
    with emulator_endpoint(tmp_path / "emulator", max_vcpus=2):
        batch = boto3.client("batch", region_name=REGION)
        (given,) = batch.describe_job_definitions(jobDefinitionName="batchfutures-worker",
                                                  status="ACTIVE")["jobDefinitions"]
        assert given["type"] == "container"
        env = AWSBatchEnvironment(job_queue="batchfutures", io_bucket=bucket,
                                  job_definition="batchfutures-worker", region_name=REGION)
        with BatchExecutor(env, nodes=2) as executor:
            future = executor.submit(where_am_i, 5)
            assert future.result(timeout=120) == [(0, 2, 5), (1, 2, 5)]
        (job,) = batch.describe_jobs(jobs=[future.job_id])["jobs"]
        assert job["nodeProperties"]["numNodes"] == 2
        (used,) = batch.describe_job_definitions(jobDefinitions=[job["jobDefinition"]])[
            "jobDefinitions"]
        assert used["type"] == "multinode" and used["jobDefinitionName"].startswith("batchfutures-")


# -- the signing key on a node: from ECS secrets, not from Secrets Manager ------------------------
@pytest.mark.parametrize("container, expected", [
    # the stack's definitions: the key ECS resolved from the job's own secret: no call made
    ({"BATCHFUTURES_SIGNING_KEY": "e" * 64, "BATCHFUTURES_SIGNING_KEY_FROM": "<secret>"}, "e" * 64),
    # a key resolved from another secret is not this job's: Secrets Manager is asked
    ({"BATCHFUTURES_SIGNING_KEY": "e" * 64, "BATCHFUTURES_SIGNING_KEY_FROM": "<other>"}, "s" * 64),
    # a key of unknown origin, or none: Secrets Manager is asked
    ({"BATCHFUTURES_SIGNING_KEY": "e" * 64}, "s" * 64),
    ({}, "s" * 64),
])
def test_a_worker_takes_the_key_ecs_put_in_its_container(aws_env, monkeypatch, container, expected):
    """A multi-node node has no network path to Secrets Manager (no public IP): the stack's job
    definitions have ECS put the signing secret's value in BATCHFUTURES_SIGNING_KEY, and name the
    secret in BATCHFUTURES_SIGNING_KEY_FROM; the worker uses it for a job signed with that secret
    (the client's BATCHFUTURES_SIGNING_KEY_SOURCE), and asks Secrets Manager otherwise."""
    from batchfutures import signing

    secrets = boto3.client("secretsmanager", region_name=REGION)
    arn = secrets.create_secret(Name=f"st/signing-key-{uuid.uuid4().hex[:8]}",
                                SecretString="s" * 64)["ARN"]
    other = secrets.create_secret(Name=f"st/other-{uuid.uuid4().hex[:8]}",
                                  SecretString="o" * 64)["ARN"]
    for name in (signing.KEY_VARIABLE, signing.KEY_FROM_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    for name, value in container.items():
        monkeypatch.setenv(name, value.replace("<secret>", arn).replace("<other>", other))
    monkeypatch.setenv(signing.SOURCE_VARIABLE, f"secretsmanager:{arn}")
    signer = signing.job_signer()
    assert signer.key == expected.encode()
    assert signer.job_environment() == {signing.SOURCE_VARIABLE: f"secretsmanager:{arn}"}
