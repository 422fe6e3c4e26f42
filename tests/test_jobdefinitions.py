"""Job definitions registered from an image: TorchX-style options, checked against the model."""

import botocore.session
import pytest
from botocore.validate import ParamValidator

from batchfutures import ConfigurationError
from batchfutures.jobdefinitions import (
    check_fargate,
    definition_name,
    definition_properties,
    parse_mounts,
    parse_ulimits,
)
from batchfutures.session import log_group_of

MODEL = botocore.session.get_session().get_service_model("batch")


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
