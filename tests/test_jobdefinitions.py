"""Job definitions: registered from an image (TorchX-style options, multi-node, secrets), derived
with secrets, found without a revision; Fargate sizes and tag limits. Requests are checked against
botocore's Batch model; registration and lookup run on the emulator's Batch API."""

import botocore.session
import pytest
import s3server
from botocore.validate import ParamValidator
from s3server import emulator_endpoint

from batchfutures import ConfigurationError
from batchfutures.jobdefinitions import (
    check_fargate,
    check_tags,
    definition_name,
    definition_properties,
    definition_with_secrets,
    describe_job_definition,
    ensure_job_definition,
    multinode_definition_from,
    parse_mounts,
    parse_ulimits,
    split_reference,
    with_stack_defaults,
)
from batchfutures.logs import log_group_of

MODEL = botocore.session.get_session().get_service_model("batch")
moto_server, aws_env = s3server.moto_server, s3server.aws_env  # fake credentials (fixtures)


def valid(properties):
    request = dict(properties, jobDefinitionName=definition_name(properties))
    report = ParamValidator().validate(request, MODEL.operation_model("RegisterJobDefinition").input_shape)
    assert not report.has_errors(), report.generate_report()
    return request


def test_every_option_lands_where_batch_expects_it():
    properties = definition_properties(
        "123.dkr.ecr.us-east-1.amazonaws.com/worker:py3.11", job_role_arn="arn:aws:iam::1:role/job",
        execution_role_arn="arn:aws:iam::1:role/exec", privileged=True,
        ulimits=["nofile:1024:4096"], shm_size=2048,
        mounts=["type=bind,src=/data,dst=/mnt/data,readonly", "type=volume,src=fs-123,dst=/efs",
                "type=device,src=/dev/fuse,perm=rw"],
        log_configuration={"logDriver": "awslogs", "options": {"awslogs-group": "/aws/batch/x"}})
    valid(properties)
    container = properties["containerProperties"]
    assert container["command"] == ["python", "-m", "batchfutures.worker"]
    assert container["privileged"] is True and container["jobRoleArn"].endswith("role/job")
    assert container["ulimits"] == [{"name": "nofile", "softLimit": 1024, "hardLimit": 4096}]
    assert container["linuxParameters"]["sharedMemorySize"] == 2048
    assert container["linuxParameters"]["devices"] == [
        {"hostPath": "/dev/fuse", "containerPath": "/dev/fuse", "permissions": ["READ", "WRITE"]}]
    volumes = {v["name"]: v for v in container["volumes"]}
    points = {p["containerPath"]: p for p in container["mountPoints"]}
    assert volumes[points["/mnt/data"]["sourceVolume"]]["host"] == {"sourcePath": "/data"}
    assert points["/mnt/data"]["readOnly"] is True and points["/efs"]["readOnly"] is False
    assert volumes[points["/efs"]["sourceVolume"]]["efsVolumeConfiguration"] == {"fileSystemId": "fs-123"}


def test_the_name_follows_the_content():
    a = definition_properties("img:1")
    assert definition_name(a) == definition_name(definition_properties("img:1"))
    assert definition_name(a) != definition_name(definition_properties("img:2"))
    assert definition_name(a).startswith("batchfutures-") and len(definition_name(a)) <= 128


def test_fargate_definition():
    properties = definition_properties("img:1", platform="fargate",
                                       execution_role_arn="arn:aws:iam::1:role/exec")
    valid(properties)
    assert properties["platformCapabilities"] == ["FARGATE"]
    with pytest.raises(ConfigurationError, match="execution_role_arn"):
        definition_properties("img:1", platform="FARGATE")
    with pytest.raises(ConfigurationError, match="privileged"):
        definition_properties("img:1", platform="FARGATE", execution_role_arn="r", privileged=True)


@pytest.mark.parametrize("bad", [["nofile"], ["nofile:a:b"], [":1:2"]])
def test_bad_ulimits(bad):
    with pytest.raises(ConfigurationError):
        parse_ulimits(bad)


@pytest.mark.parametrize("bad", [["type=bind,src=/a"], ["type=nfs,src=x,dst=/y"], ["dst=/y"]])
def test_bad_mounts(bad):
    with pytest.raises(ConfigurationError):
        parse_mounts(bad)


def test_bad_platform_and_image():
    with pytest.raises(ConfigurationError):
        definition_properties("img", platform="LAMBDA")
    with pytest.raises(ConfigurationError):
        definition_properties("")


def test_fargate_sizes():
    check_fargate(0.25, 512, 0)
    check_fargate(4, 30720, 0)
    for vcpus, memory, gpus in ((1, 1024, 0), (3, 4096, 0), (1, 2048, 1)):
        with pytest.raises(ConfigurationError):
            check_fargate(vcpus, memory, gpus)


def test_logs_are_read_from_the_group_the_job_definition_names():
    custom = {"container": {"logConfiguration": {"logDriver": "awslogs",
                                                 "options": {"awslogs-group": "/aws/batch/stack"}}}}
    assert log_group_of(custom, "/aws/batch/job") == "/aws/batch/stack"
    assert log_group_of({"container": {}}, "/aws/batch/job") == "/aws/batch/job"


# -- Fargate's 16- and 32-vCPU sizes (botocore's Batch model, ResourceRequirement value) -------
@pytest.mark.parametrize("vcpus, memory", [
    (16, 32768), (16, 40960), (16, 122880), (32, 61440), (32, 122880), (32, 249856), (8, 61440)])
def test_fargate_large_sizes_are_accepted(vcpus, memory):
    check_fargate(vcpus, memory, 0)


@pytest.mark.parametrize("vcpus, memory", [
    (16, 30720), (16, 131072), (16, 36864), (32, 65536), (32, 245760), (32, 32768), (64, 249856)])
def test_fargate_sizes_batch_does_not_offer_are_refused(vcpus, memory):
    with pytest.raises(ConfigurationError):
        check_fargate(vcpus, memory, 0)


# -- multi-node parallel definitions from image= ---------------------------------------------
def test_nodes_make_a_multinode_definition_with_one_node_group():
    properties = definition_properties("img:1", nodes=3, job_role_arn="arn:aws:iam::1:role/job")
    valid(properties)
    assert properties["type"] == "multinode" and "containerProperties" not in properties
    nodes = properties["nodeProperties"]
    assert (nodes["numNodes"], nodes["mainNode"]) == (3, 0)
    (group,) = nodes["nodeRangeProperties"]
    assert group["targetNodes"] == "0:"  # every node runs the same container
    assert group["container"]["command"] == ["python", "-m", "batchfutures.worker"]
    assert group["container"]["jobRoleArn"].endswith("role/job")
    assert properties["platformCapabilities"] == ["EC2"]
    single = definition_properties("img:1", job_role_arn="arn:aws:iam::1:role/job")
    assert single["type"] == "container" and "nodeProperties" not in single
    assert definition_properties("img:1", nodes=1) == definition_properties("img:1")
    assert definition_name(properties) != definition_name(single)
    with pytest.raises(ConfigurationError, match="EC2"):
        definition_properties("img:1", nodes=2, platform="FARGATE", execution_role_arn="arn:x")


# -- secrets ------------------------------------------------------------------------------------
SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:bf/jobs/db-AbCdEf"
PARAMETER = "arn:aws:ssm:us-east-1:123456789012:parameter/bf/jobs/token"
EXECUTION_ROLE = "arn:aws:iam::123456789012:role/bf-execution"


def test_image_definitions_carry_the_secrets_as_arns():
    properties = definition_properties("img:1", execution_role_arn=EXECUTION_ROLE,
                                       secrets={"TOKEN": PARAMETER, "DB": SECRET})
    valid(properties)
    assert properties["containerProperties"]["secrets"] == [
        {"name": "DB", "valueFrom": SECRET}, {"name": "TOKEN", "valueFrom": PARAMETER}]
    assert definition_name(properties) != definition_name(
        definition_properties("img:1", execution_role_arn=EXECUTION_ROLE))
    multinode = definition_properties("img:1", execution_role_arn=EXECUTION_ROLE, nodes=2,
                                      secrets=[("DB", SECRET)])
    assert multinode["nodeProperties"]["nodeRangeProperties"][0]["container"]["secrets"] == [
        {"name": "DB", "valueFrom": SECRET}]
    with pytest.raises(ConfigurationError, match="execution_role_arn"):
        definition_properties("img:1", secrets={"DB": SECRET})


class Recording:
    """The emulator's Batch API as it is, with the RegisterJobDefinition requests kept."""

    def __init__(self, batch):
        self.batch, self.registered, self.described = batch, [], 0

    def register_job_definition(self, **request):
        self.registered.append(request)
        return self.batch.register_job_definition(**request)

    def describe_job_definitions(self, **request):
        self.described += 1
        return self.batch.describe_job_definitions(**request)

    def __getattr__(self, name):
        return getattr(self.batch, name)


@pytest.fixture
def batch(tmp_path):
    from batchfutures.emulator import BatchEmulator

    emulator = BatchEmulator(tmp_path / "emulator", max_vcpus=1)
    yield Recording(emulator)
    emulator.close()


def register(batch, name, **container):
    container = {"image": "img:1", "command": ["python", "-m", "batchfutures.worker"],
                 "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                          {"type": "MEMORY", "value": "2048"}], **container}
    registered = batch.batch.register_job_definition(
        jobDefinitionName=name, type="container", containerProperties=container,
        propagateTags=True, tags={"batchfutures:stack": "bf"})
    # as the stack's CloudFormation leaves it: with aws: tags, which only AWS may set (the API
    # refuses them from a caller), so they are written into the emulator's record
    definitions = batch.batch.definitions
    definitions.set_tags(definitions.resolve(registered["jobDefinitionArn"]),
                         {"aws:cloudformation:stack-name": "bf", "batchfutures:stack": "bf"})
    return registered


def test_definition_with_secrets_registers_a_copy_once(batch):
    base = register(batch, "bf-worker", executionRoleArn=EXECUTION_ROLE,
                    jobRoleArn="arn:aws:iam::123456789012:role/bf-job",
                    secrets=[{"name": "DB", "valueFrom": "arn:old"}])
    arn = definition_with_secrets(batch, "bf-worker", {"DB": SECRET, "TOKEN": PARAMETER})
    (request,) = batch.registered
    valid({k: v for k, v in request.items() if k != "jobDefinitionName"})
    assert request["jobDefinitionName"].startswith("batchfutures-")
    container = request["containerProperties"]
    assert container["secrets"] == [{"name": "DB", "valueFrom": SECRET},  # DB replaced
                                    {"name": "TOKEN", "valueFrom": PARAMETER}]
    assert container["executionRoleArn"] == EXECUTION_ROLE and container["image"] == "img:1"
    assert container["jobRoleArn"].endswith("role/bf-job") and request["propagateTags"] is True
    assert request["tags"] == {"batchfutures:stack": "bf", "batchfutures:managed": "true"}
    (registered,) = batch.describe_job_definitions(jobDefinitions=[arn])["jobDefinitions"]
    assert registered["containerProperties"]["secrets"] == container["secrets"]
    # the base definition is left as it was
    assert describe_job_definition(batch, "bf-worker")["jobDefinitionArn"] == base["jobDefinitionArn"]
    # the same definition and secrets: the same ARN, nothing registered again
    assert definition_with_secrets(batch, base["jobDefinitionArn"], [("TOKEN", PARAMETER),
                                                                     ("DB", SECRET)]) == arn
    assert len(batch.registered) == 1
    described = batch.described  # and asked again of this client: answered without a request
    assert definition_with_secrets(batch, "bf-worker", {"TOKEN": PARAMETER, "DB": SECRET}) == arn
    assert batch.described == described
    # another client (another process) finds the registered copy instead of registering it
    assert definition_with_secrets(Recording(batch.batch), "bf-worker",
                                   {"DB": SECRET, "TOKEN": PARAMETER}) == arn
    assert [d["revision"] for d in batch.batch.describe_job_definitions(
        jobDefinitionName=request["jobDefinitionName"])["jobDefinitions"]] == [1]
    other = definition_with_secrets(batch, "bf-worker", {"DB": SECRET})
    assert other != arn and len(batch.registered) == 2
    assert definition_with_secrets(batch, "bf-worker", {}) == "bf-worker"  # nothing to add


def test_definition_with_secrets_needs_an_execution_role_and_a_definition(batch):
    register(batch, "no-role")
    with pytest.raises(ConfigurationError, match="execution role"):
        definition_with_secrets(batch, "no-role", {"DB": SECRET})
    with pytest.raises(ConfigurationError, match="does not exist"):
        definition_with_secrets(batch, "missing", {"DB": SECRET})
    assert batch.registered == []


# -- a definition named without a revision ------------------------------------------------------
def test_a_definition_without_a_revision_is_its_highest_active_one(batch):
    arns = [register(batch, "w")["jobDefinitionArn"] for _ in range(3)]
    batch.deregister_job_definition(jobDefinition=arns[2])
    base_arn = arns[0].rsplit(":", 1)[0]
    assert base_arn.endswith(":job-definition/w")
    assert describe_job_definition(batch, "w")["revision"] == 2
    assert describe_job_definition(batch, base_arn)["revision"] == 2  # ARN without revision
    assert describe_job_definition(batch, "w:1")["revision"] == 1
    assert describe_job_definition(batch, arns[0])["revision"] == 1
    assert describe_job_definition(batch, "w:3")["status"] == "INACTIVE"  # asked for by revision
    assert describe_job_definition(batch, "missing") is None
    assert describe_job_definition(batch, "w:9") is None


def test_the_highest_revision_is_found_past_the_first_page(batch):
    for _ in range(103):  # DescribeJobDefinitions returns 100 per page
        register(batch, "many")
    assert describe_job_definition(batch, "many")["revision"] == 103


@pytest.mark.parametrize("reference, expected", [
    ("w", ("w", None)), ("w:3", ("w", 3)),
    ("arn:aws:batch:us-east-1:123456789012:job-definition/w", ("w", None)),
    ("arn:aws:batch:us-east-1:123456789012:job-definition/w:12", ("w", 12))])
def test_references_are_split_into_name_and_revision(reference, expected):
    assert split_reference(reference) == expected


@pytest.mark.parametrize("bad", ["", "w:", "w:latest", "arn:aws:batch:us-east-1:1:job-queue/q"])
def test_bad_references(bad):
    with pytest.raises(ConfigurationError):
        split_reference(bad)


# -- tags ---------------------------------------------------------------------------------------
def tags(count, prefix="k"):
    return {f"{prefix}{i}": "v" for i in range(count)}


@pytest.mark.parametrize("job, definition", [
    (tags(50), {}), (tags(30), tags(20, "d")), (tags(30), {**tags(5), **tags(20, "d")}),
    (tags(45), {"aws:cloudformation:stack-name": "s", **tags(5, "d")}), ({"a": ""}, None)])
def test_tags_within_the_limits(job, definition):
    check_tags(job, definition)


@pytest.mark.parametrize("job, definition, message", [
    (tags(51), {}, "more than the 50"),
    (tags(30), tags(21, "d"), "more than the 50"),
    ({"aws:owner": "me"}, {}, "reserved"), ({"AWS:Owner": "me"}, {}, "reserved"),
    ({"k" * 129: "v"}, {}, "128"), ({"k": "v" * 257}, {}, "256"), ({"k": "a;b"}, {}, "letters"),
])
def test_tags_batch_would_refuse_or_fail(job, definition, message):
    with pytest.raises(ConfigurationError, match=message):
        check_tags(job, definition)


# -- AWSBatchEnvironment refuses what the definition's platform cannot run, when it is made ----
@pytest.fixture
def endpoint(tmp_path, aws_env):
    """The emulator behind its HTTP endpoint, boto3 pointed at it (fake credentials)."""
    with emulator_endpoint(tmp_path / "endpoint", max_vcpus=1) as emulator:
        yield emulator


def aws_environment(**options):
    from batchfutures import AWSBatchEnvironment

    return AWSBatchEnvironment(job_queue="q", io_bucket="bucket", region_name="us-east-1", **options)


def test_ec2_jobs_under_one_vcpu_are_refused_when_the_executor_is_made(endpoint):
    from batchfutures import BatchExecutor

    endpoint.register_job_definition(
        jobDefinitionName="on-ec2", type="container", platformCapabilities=["EC2"],
        containerProperties={"image": "img:1", "resourceRequirements": [
            {"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "2048"}]})
    endpoint.register_job_definition(
        jobDefinitionName="on-fargate", type="container", platformCapabilities=["FARGATE"],
        containerProperties={"image": "img:1", "executionRoleArn": EXECUTION_ROLE,
                             "resourceRequirements": [{"type": "VCPU", "value": "0.5"},
                                                      {"type": "MEMORY", "value": "1024"}]})
    known = {d["jobDefinitionArn"] for d in endpoint.describe_job_definitions()["jobDefinitions"]}
    for options in ({"image": "img:1"}, {"job_definition": "on-ec2"},
                    {"job_definition": "arn:aws:batch:us-east-1:123456789012:job-definition/on-ec2"}):
        with pytest.raises(ConfigurationError, match="at least 1 vCPU"):
            BatchExecutor(aws_environment(**options), vcpus=0.5)
        with BatchExecutor(aws_environment(**options), vcpus=1) as executor:  # one vCPU is fine
            with pytest.raises(ConfigurationError, match="at least 1 vCPU"):
                executor.with_settings(vcpus=0.25)
    # nothing was registered on the way
    after = {d["jobDefinitionArn"] for d in endpoint.describe_job_definitions()["jobDefinitions"]}
    assert after == known
    assert endpoint.list_jobs(jobQueue="batchfutures")["jobSummaryList"] == []
    # on Fargate a half vCPU is a size (with a memory Fargate offers for it)
    with BatchExecutor(aws_environment(job_definition="on-fargate"), vcpus=0.5, memory=1024):
        pass
    with pytest.raises(ConfigurationError, match="Fargate"):
        BatchExecutor(aws_environment(job_definition="on-fargate"), vcpus=0.5, memory=8192)
    fargate_image = {"image": "img:1", "platform": "FARGATE", "execution_role_arn": EXECUTION_ROLE}
    with BatchExecutor(aws_environment(**fargate_image), vcpus=0.25, memory=512):
        pass
    with pytest.raises(ConfigurationError, match="EC2"):
        BatchExecutor(aws_environment(**fargate_image), vcpus=1, memory=2048, nodes=2)


# -- a stack's client: the stack tag and the stack's log group on every registration ------------
STACK_LOGS = {"logDriver": "awslogs",
              "options": {"awslogs-group": "/aws/batch/st", "awslogs-region": "eu-west-1"}}
OWN_LOGS = {"logDriver": "awslogs", "options": {"awslogs-group": "/aws/batch/st-custom"}}


def _containers(properties):
    if "containerProperties" in properties:
        return [properties["containerProperties"]]
    return [g["container"] for g in properties["nodeProperties"]["nodeRangeProperties"]]


@pytest.mark.parametrize("properties, tags, logs", [
    # image=: no tags of its own but batchfutures:managed, no log configuration
    (definition_properties("img:1"), {"batchfutures:managed": "true", "batchfutures:stack": "st"},
     [STACK_LOGS]),
    # nodes=: every node group's container
    (definition_properties("img:1", nodes=3), {"batchfutures:managed": "true",
                                               "batchfutures:stack": "st"}, [STACK_LOGS]),
    # a definition with a log configuration of its own keeps it (the policy judges it)
    (definition_properties("img:1", log_configuration=OWN_LOGS),
     {"batchfutures:managed": "true", "batchfutures:stack": "st"}, [OWN_LOGS]),
    # a copy of another stack's definition: its tag is replaced, not kept beside
    ({"type": "container", "containerProperties": {"image": "i"}, "tags": {"batchfutures:stack": "x"}},
     {"batchfutures:stack": "st"}, [STACK_LOGS]),
])
def test_a_stacks_registrations_carry_its_tag_and_log_group(properties, tags, logs):
    before = repr(properties)
    made = with_stack_defaults(properties, "st", "eu-west-1")
    assert made["tags"] == tags
    assert [c.get("logConfiguration") for c in _containers(made)] == logs
    assert repr(properties) == before  # the argument is left as it was
    assert with_stack_defaults(properties, None, "eu-west-1") is properties  # no stack: as given


def test_without_a_region_the_log_configuration_names_the_group_only():
    made = with_stack_defaults(definition_properties("img:1"), "st")
    assert made["containerProperties"]["logConfiguration"] == {
        "logDriver": "awslogs", "options": {"awslogs-group": "/aws/batch/st"}}


def test_every_path_of_a_stacks_client_registers_with_the_tag_and_the_group(batch):
    """image=, nodes= (from image=), secrets= and nodes= (from a definition) with stack=: each
    RegisterJobDefinition carries batchfutures:stack (TagResource on create is allowed only
    with it) and the stack's log group; a job of the definition is read from that group."""
    register(batch, "st-worker", executionRoleArn=EXECUTION_ROLE)  # no logConfiguration
    arns = [ensure_job_definition(batch, "img:1", stack="st"),
            ensure_job_definition(batch, "img:1", stack="st", nodes=2),
            definition_with_secrets(batch, "st-worker", {"DB": SECRET}, stack="st"),
            multinode_definition_from(batch, "st-worker", stack="st")]
    assert len(batch.registered) == 4 and len(set(arns)) == 4
    for request in batch.registered:
        assert request["jobDefinitionName"].startswith("st_")
        assert request["tags"]["batchfutures:stack"] == "st", request
        valid({k: v for k, v in request.items() if k != "jobDefinitionName"})
        for container in _containers(request):
            assert container["logConfiguration"] == {
                "logDriver": "awslogs", "options": {"awslogs-group": "/aws/batch/st"}}
    # the log reader follows the job's definition to the stack's group, not /aws/batch/job
    # (4 vCPUs on a 1-vCPU emulator: the job waits, no worker starts)
    job = batch.submit_job(jobName="j", jobQueue="batchfutures", jobDefinition=arns[0],
                           containerOverrides={"resourceRequirements": [
                               {"type": "VCPU", "value": "4"}]})
    (described,) = batch.describe_jobs(jobs=[job["jobId"]])["jobs"]
    assert log_group_of(described, "/aws/batch/job") == "/aws/batch/st"
    batch.terminate_job(jobId=job["jobId"], reason="test over")
    # without stack=, nothing is added: Batch's default group, batchfutures' own tag only
    plain = ensure_job_definition(batch, "img:1")
    assert batch.registered[-1]["tags"] == {"batchfutures:managed": "true"}
    assert "logConfiguration" not in batch.registered[-1]["containerProperties"]
    assert plain.split("/")[-1].startswith("batchfutures-")
