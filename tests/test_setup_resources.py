"""The AWS setup: the CloudFormation template, the worker Dockerfile and `batchfutures image`.

The template is checked by cfn-lint and created, as `batchfutures template` prints it, in moto's
CloudFormation (a ThreadedMotoServer on 127.0.0.1, driven by stock boto3 clients with fake
credentials); its outputs are then used as the three BATCHFUTURES_* variables for
`batchfutures check`. The image commands are run by sh with stand-ins for `aws` and `docker`
that record what they were asked to do. No traffic leaves 127.0.0.1.

What moto's CloudFormation cannot do, and how these tests get around it:
- AWS::Batch::ComputeEnvironment without ServiceRole (the template's default, so that Batch
  uses its service-linked role): moto requires a ServiceRole naming an existing IAM role. The
  stack is created with BatchServiceRoleArn set to a role made in moto first, as the
  service-linked role AWSServiceRoleForBatch would be.
- AWS::S3::BucketPolicy: not implemented; moto skips it (checked statically instead).
- AWS::SecretsManager::Secret: not implemented either. The stack is created with the template's
  SigningSecretArn parameter naming a secret made in moto first (the bring-your-own-secret path);
  the secret the template makes by default is checked statically.
- CommaDelimitedList defaults: moto does not split a parameter's default, so those parameters
  are passed explicitly with their template defaults.
- AWS::S3::Bucket: moto applies only encryption and tags, so the lifecycle rule and the public
  access block are checked in the template itself.
- A statement dropped from a policy's Statement list by Fn::If and AWS::NoValue: moto leaves a
  null in the list and refuses the document (MalformedPolicyDocument), so the template's
  conditional grant (KmsKeyArn) is a resource of its own with Condition, which moto honours.
"""

import ast
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import batchfutures
from batchfutures.cli.setup_resources import (
    DEFAULT_REPOSITORY,
    dockerfile_path,
    image_commands,
    image_tag,
    package_dir,
    python_minor,
    template_path,
    template_text,
)
from batchfutures.errors import ConfigurationError

pytestmark = pytest.mark.filterwarnings(  # moto says so when it skips the bucket policy
    "ignore:Tried to parse AWS.*BucketPolicy:UserWarning")

ROOT = Path(__file__).resolve().parents[1]
MINOR = "%d.%d" % sys.version_info[:2]
MOTO_ACCOUNT = "123456789012"
REGION = "us-east-1"


# -- reading the template ---------------------------------------------------------------------
class _CfnLoader(yaml.SafeLoader):
    """PyYAML with CloudFormation's short-form tags (!Ref, !Sub, !GetAtt, !If...)."""


def _construct_tag(loader, suffix, node):
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    if suffix == "Condition":
        return {"Condition": value}
    return {f"Fn::{suffix}": value}


_CfnLoader.add_multi_constructor("!", _construct_tag)


def load_template(text=None):
    return yaml.load(text if text is not None else template_text(), Loader=_CfnLoader)  # noqa: S506


@pytest.fixture(scope="module")
def template():
    return load_template()


def resources_of(template, kind):
    return {name: r for name, r in template["Resources"].items() if r["Type"] == kind}


def allow_statements(template):
    """Every Allow statement of every IAM policy in the template, with where it is."""
    found = []
    for name, resource in template["Resources"].items():
        documents = []
        if resource["Type"] == "AWS::IAM::Role":
            documents = [p["PolicyDocument"] for p in resource["Properties"].get("Policies", [])]
        elif resource["Type"] == "AWS::IAM::ManagedPolicy":
            documents = [resource["Properties"]["PolicyDocument"]]
        for document in documents:
            found += [(name, s) for s in document["Statement"] if s["Effect"] == "Allow"]
    return found


def as_list(value):
    return value if isinstance(value, list) else [value]


# -- the template: shipped, printed, linted ---------------------------------------------------
def test_template_is_package_data_and_printed_for_this_python(template):
    assert template_path().is_file() and template_path().parent.name == "templates"
    shipped = template_path().read_text(encoding="utf-8")
    printed = template_text()
    assert template["Parameters"]["PythonVersion"]["Default"] == MINOR
    assert load_template(shipped)["Parameters"]["PythonVersion"]["Default"] == "3.11"
    # only the PythonVersion default differs from the shipped file
    assert re.sub(r'Default: "3\.\d+"', "X", printed, count=1) == re.sub(
        r'Default: "3\.\d+"', "X", shipped, count=1)


def test_cfn_lint_passes(template):
    from cfnlint.api import lint  # cfn-lint is in the test extra

    regions = ["us-east-1", "eu-west-1", "ap-northeast-1"]
    assert [str(m) for m in lint(template_text(), regions=regions)] == []
    shipped = template_path().read_text(encoding="utf-8")  # differs only in a default
    assert [str(m) for m in lint(shipped, regions=["us-east-1"])] == []
    # and it does look: a wrong compute environment type is reported
    broken = template_text().replace("Type: SPOT\n", "Type: SPOTTY\n", 1)
    assert any("spotty" in str(m).lower() for m in lint(broken, regions=["us-east-1"]))


def test_outputs_are_the_values_the_client_needs(template):
    # the three BATCHFUTURES_* variables, and the signing secret's ARN (signing_secret=); with
    # KmsKeyArn, the policy the clients attach for the key
    always = {name for name, o in template["Outputs"].items() if "Condition" not in o}
    assert always == {"JobQueue", "JobDefinition", "IoBucket", "Stack", "SigningSecret",
                      "MultiNodeJobQueue"}
    assert set(template["Outputs"]) - always == {"PayloadKeyPolicy"}
    assert template["Outputs"]["PayloadKeyPolicy"] == {
        "Condition": "HasKmsKey", "Value": {"Ref": "PayloadKeyPolicy"},
        "Description": template["Outputs"]["PayloadKeyPolicy"]["Description"]}
    descriptions = " ".join(o["Description"] for o in template["Outputs"].values())
    for variable in ("BATCHFUTURES_JOB_QUEUE", "BATCHFUTURES_JOB_DEFINITION", "BATCHFUTURES_IO_BUCKET",
                     "BATCHFUTURES_STACK", "signing_secret="):
        assert variable in descriptions
    assert template["Outputs"]["SigningSecret"]["Value"] == {
        "Fn::If": ["CreateSigningSecret", {"Ref": "SigningSecret"}, {"Ref": "SigningSecretArn"}]}


def test_the_template_creates_a_random_signing_secret(template):
    secret = template["Resources"]["SigningSecret"]
    assert secret["Type"] == "AWS::SecretsManager::Secret"
    assert secret["Condition"] == "CreateSigningSecret"  # unless SigningSecretArn names one
    generated = secret["Properties"]["GenerateSecretString"]
    assert generated["PasswordLength"] >= 32 and "SecretStringTemplate" not in generated
    assert "SecretString" not in secret["Properties"]  # no value in the template itself
    assert template["Parameters"]["SigningSecretArn"]["Default"] == ""


def test_kms_key_arn_switches_the_bucket_to_sse_kms_and_adds_the_key_policy(template):
    assert template["Parameters"]["KmsKeyArn"]["Default"] == ""
    assert template["Conditions"]["HasKmsKey"] == {"Fn::Not": [{"Fn::Equals": [
        {"Ref": "KmsKeyArn"}, ""]}]}
    (rule,) = template["Resources"]["IoBucket"]["Properties"]["BucketEncryption"][
        "ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": {"Fn::If": ["HasKmsKey", "aws:kms", "AES256"]},
        "KMSMasterKeyID": {"Fn::If": ["HasKmsKey", {"Ref": "KmsKeyArn"}, {"Ref": "AWS::NoValue"}]}}
    policy = template["Resources"]["PayloadKeyPolicy"]
    assert (policy["Type"], policy["Condition"]) == ("AWS::IAM::ManagedPolicy", "HasKmsKey")
    # the job role (S3) and the execution role (the signing key, when the secret is under it)
    assert policy["Properties"]["Roles"] == [{"Ref": "JobRole"}, {"Ref": "ExecutionRole"}]
    assert policy["Properties"]["ManagedPolicyName"] == {"Fn::Sub": "${AWS::StackName}-payload-key"}
    # the only use of the key, and the only conditional resources are this one and the secret
    assert "KmsKeyArn" not in str({n: r for n, r in template["Resources"].items()
                                   if n not in ("IoBucket", "PayloadKeyPolicy")})
    assert {n for n, r in template["Resources"].items() if "Condition" in r} == {
        "SigningSecret", "PayloadKeyPolicy", "S3GatewayEndpoint"}
    groups = template["Metadata"]["AWS::CloudFormation::Interface"]["ParameterGroups"]
    assert sorted(p for g in groups for p in g["Parameters"]) == sorted(template["Parameters"])


def test_bucket_expires_runs_blocks_public_access_and_denies_plain_http(template):
    from batchfutures.storage import Storage

    bucket = template["Resources"]["IoBucket"]["Properties"]
    assert all(bucket["PublicAccessBlockConfiguration"][key] is True for key in (
        "BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"))
    rules = {r["Id"]: r for r in bucket["LifecycleConfiguration"]["Rules"]}
    assert all(r["Status"] == "Enabled" for r in rules.values())
    expiring = {r["Prefix"]["Fn::Sub"]: r["ExpirationInDays"] for r in rules.values()
                if "ExpirationInDays" in r}
    assert expiring == {"${IoPrefix}/runs/": {"Ref": "PayloadRetentionDays"},
                        "${IoPrefix}/jobs/": {"Ref": "PayloadRetentionDays"},
                        "${IoPrefix}/cache/": {"Ref": "PayloadRetentionDays"}}
    # the prefixes are storage.py's layout: R/runs/<run>/... and R/jobs/<batch job id>, and
    # cache.py's index objects, R/cache/<function digest>/<run>.<job key>
    from batchfutures.cache import CACHE_FOLDER

    assert CACHE_FOLDER == "cache"
    storage = Storage("s3://bucket/batchfutures")
    assert storage.run_url("r1").startswith("s3://bucket/batchfutures/runs/")
    assert storage.url("jobs", "id").startswith("s3://bucket/batchfutures/jobs/")
    assert template["Parameters"]["PayloadRetentionDays"]["Default"] == 30
    assert template["Parameters"]["IoPrefix"]["Default"] == "batchfutures"  # the client's default
    policy = template["Resources"]["IoBucketPolicy"]["Properties"]["PolicyDocument"]
    (deny,) = policy["Statement"]
    assert (deny["Effect"], deny["Principal"], deny["Action"]) == ("Deny", "*", "s3:*")
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert deny["Resource"] == [{"Fn::GetAtt": ["IoBucket", "Arn"]}, {"Fn::Sub": "${IoBucket.Arn}/*"}]


def test_compute_environments_queues_and_gpu_instances(template):
    environments = resources_of(template, "AWS::Batch::ComputeEnvironment")
    kinds = {r["Properties"]["ComputeResources"]["Type"]: name for name, r in environments.items()
             if name != "MultiNodeComputeEnvironment"}  # tests/test_multinode_template.py
    assert set(kinds) == {"EC2", "SPOT", "FARGATE"}
    for kind in ("EC2", "SPOT"):
        resources = environments[kinds[kind]]["Properties"]["ComputeResources"]
        assert resources["MinvCpus"] == 0
        images = {c["ImageType"] for c in resources["Ec2Configuration"]}
        assert images == {"ECS_AL2023", "ECS_AL2023_NVIDIA"}  # the GPU AMI for GPU instances
        assert "GpuInstanceTypes" in str(resources["InstanceTypes"])
    assert {"g4dn", "g5"} <= set(template["Parameters"]["GpuInstanceTypes"]["Default"].split(","))
    # IMDSv2 only, one hop: containers cannot reach the instance role's credentials
    metadata = template["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"][
        "MetadataOptions"]
    assert metadata["HttpTokens"] == "required" and metadata["HttpPutResponseHopLimit"] == 1
    for kind in ("EC2", "SPOT"):
        assert environments[kinds[kind]]["Properties"]["ComputeResources"]["LaunchTemplate"] == {
            "LaunchTemplateId": {"Ref": "LaunchTemplate"},
            "Version": {"Fn::GetAtt": ["LaunchTemplate", "LatestVersionNumber"]}}
    spot = environments[kinds["SPOT"]]["Properties"]["ComputeResources"]
    assert spot["BidPercentage"] == {"Ref": "SpotBidPercentage"}
    for environment in environments.values():  # the service-linked role unless one is given
        assert environment["Properties"]["ServiceRole"] == {
            "Fn::If": ["HasServiceRole", {"Ref": "BatchServiceRoleArn"}, {"Ref": "AWS::NoValue"}]}
    queues = resources_of(template, "AWS::Batch::JobQueue")
    ec2_order = queues["Ec2JobQueue"]["Properties"]["ComputeEnvironmentOrder"]
    assert [o["ComputeEnvironment"]["Ref"] for o in ec2_order] == [kinds["EC2"], kinds["SPOT"]]
    fargate_order = queues["FargateJobQueue"]["Properties"]["ComputeEnvironmentOrder"]
    assert [o["ComputeEnvironment"]["Ref"] for o in fargate_order] == [kinds["FARGATE"]]
    for queue in queues.values():
        reasons = {a["Reason"] for a in queue["Properties"]["JobStateTimeLimitActions"]}
        assert all(r.startswith("MISCONFIGURATION:") for r in reasons)  # never cancel for CAPACITY


def test_job_definitions_run_the_worker(template):
    definitions = resources_of(template, "AWS::Batch::JobDefinition")
    platforms = {r["Properties"]["PlatformCapabilities"][0]: r["Properties"]
                 for r in definitions.values()}
    assert set(platforms) == {"EC2", "FARGATE"}
    for properties in platforms.values():
        container = properties["ContainerProperties"]
        assert container["Command"] == ["python", "-m", "batchfutures.worker"]
        assert {r["Type"]: r["Value"] for r in container["ResourceRequirements"]} == {
            "VCPU": "1", "MEMORY": "2048"}
        assert container["JobRoleArn"] == {"Fn::GetAtt": ["JobRole", "Arn"]}
        assert container["LogConfiguration"]["Options"]["awslogs-group"] == {"Ref": "LogGroup"}
        default_image = container["Image"]["Fn::If"][1]["Fn::Sub"]
        assert default_image.endswith(f"/{DEFAULT_REPOSITORY}:py${{PythonVersion}}")
        # Fargate pulls the image with it; on both, ECS resolves the containers' secrets with it
        assert container["ExecutionRoleArn"] == {"Fn::GetAtt": ["ExecutionRole", "Arn"]}
    assert template["Resources"]["LogGroup"]["Properties"]["RetentionInDays"] == {
        "Ref": "LogRetentionDays"}


def test_iam_is_least_privilege(template):
    statements = allow_statements(template)
    assert statements
    for name, statement in statements:
        actions = as_list(statement["Action"])
        assert not any(a == "*" or a.endswith(":*") for a in actions), (name, actions)
        if statement.get("Resource") == "*":  # only actions that have no resource-level scope
            assert set(actions) <= {
                "ecr:GetAuthorizationToken", "batch:DescribeJobs", "batch:ListJobs",
                "batch:DescribeJobQueues", "batch:DescribeJobDefinitions",
                "batch:DescribeComputeEnvironments", "ec2:DescribeInstanceTypes",
                "sqs:ListQueues", "pricing:GetProducts", "ec2:DescribeSpotPriceHistory",
            }, (name, actions)
    # echo_output="live": Live Tail of the stack's own log group only (not Batch's shared one)
    tailing = [(n, s) for n, s in statements if "logs:StartLiveTail" in as_list(s["Action"])]
    assert [(n, s["Sid"], as_list(s["Action"])) for n, s in tailing] == [
        ("ClientPolicy", "LiveTailLogs", ["logs:StartLiveTail"])]
    assert as_list(tailing[0][1]["Resource"]) == [{"Fn::Sub": (
        "arn:${AWS::Partition}:logs:${AWS::Region}:${AWS::AccountId}:log-group:${LogGroup}" + end)}
        for end in ("", ":*")]
    job_statements = {s["Sid"]: s for n, s in statements if n == "JobRole"}
    assert set(job_statements) == {"RunObjects", "MissingKeysAre404", "ReadSigningKey",
                                   "WarmQueues"}
    (key_statement,) = [s for n, s in statements if n == "PayloadKeyPolicy"]
    assert set(key_statement["Action"]) == {"kms:GenerateDataKey", "kms:Decrypt"}
    assert key_statement["Resource"] == {"Ref": "KmsKeyArn"}
    assert not [s for n, s in statements if n != "PayloadKeyPolicy" and "kms" in str(s).lower()]
    objects = job_statements["RunObjects"]
    assert objects["Resource"] == {"Fn::Sub": "${IoBucket.Arn}/${IoPrefix}/runs/*"}
    assert set(objects["Action"]) == {"s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"}
    listing = job_statements["MissingKeysAre404"]
    assert listing["Action"] == "s3:ListBucket" and "Condition" not in listing  # see test_iam
    assert job_statements["ReadSigningKey"]["Resource"] == {"Fn::If": [
        "CreateSigningSecret", {"Ref": "SigningSecret"}, {"Ref": "SigningSecretArn"}]}
    instance_role = template["Resources"]["InstanceRole"]["Properties"]
    assert instance_role["ManagedPolicyArns"] == [{"Fn::Sub": (
        "arn:${AWS::Partition}:iam::aws:policy/service-role/AmazonEC2ContainerServiceforEC2Role")}]
    execution = [s for n, s in statements if n == "ExecutionRole"]
    assert {a for s in execution for a in as_list(s["Action"])} == {
        "ecr:GetAuthorizationToken", "ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer",
        "ecr:BatchGetImage", "logs:CreateLogStream", "logs:PutLogEvents",
        "secretsmanager:GetSecretValue", "ssm:GetParameters"}


def test_the_signing_secret_outlives_the_stack(template):
    """delete-stack keeps the bucket (Retain), so the key that verifies what it holds stays too."""
    for name in ("IoBucket", "SigningSecret"):
        resource = template["Resources"][name]
        assert (resource["DeletionPolicy"], resource["UpdateReplacePolicy"]) == ("Retain", "Retain")


def test_the_stacks_definitions_hand_the_signing_key_to_the_container(template):
    """Through ECS `secrets`, resolved by the agent with the execution role (which may read that
    secret): the worker needs no network path to Secrets Manager (multi-node nodes have none)."""
    secret = {"Fn::If": ["CreateSigningSecret", {"Ref": "SigningSecret"}, {"Ref": "SigningSecretArn"}]}
    for name in ("Ec2JobDefinition", "FargateJobDefinition"):
        container = template["Resources"][name]["Properties"]["ContainerProperties"]
        assert container["Secrets"] == [{"Name": "BATCHFUTURES_SIGNING_KEY", "ValueFrom": secret}]
        # and which secret it is: the worker uses it for jobs signed with that secret only
        assert container["Environment"][0] == {"Name": "BATCHFUTURES_SIGNING_KEY_FROM", "Value": secret}
        assert container["ExecutionRoleArn"] == {"Fn::GetAtt": ["ExecutionRole", "Arn"]}
    from batchfutures.signing import KEY_FROM_VARIABLE, KEY_VARIABLE

    assert (KEY_VARIABLE, KEY_FROM_VARIABLE) == ("BATCHFUTURES_SIGNING_KEY",
                                                 "BATCHFUTURES_SIGNING_KEY_FROM")
    execution = {s.get("Sid"): s for n, s in allow_statements(template) if n == "ExecutionRole"}
    assert execution["SigningKeyForContainers"]["Action"] == "secretsmanager:GetSecretValue"
    assert execution["SigningKeyForContainers"]["Resource"] == secret


def user_data_parts(template):
    """The launch template's user data, read as cloud-init reads it: a MIME multi-part archive."""
    import email

    data = template["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]
    message = email.message_from_string(data["UserData"]["Fn::Base64"])
    assert message.is_multipart() and message.get_content_type() == "multipart/mixed"
    return [(part.get_content_type(), part.get_payload()) for part in message.get_payload()]


def test_the_launch_template_encrypts_the_root_volume_and_closes_instance_metadata(template):
    data = template["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]
    (root,) = data["BlockDeviceMappings"]
    assert root["DeviceName"] == "/dev/xvda" and root["Ebs"]["Encrypted"] is True
    assert data["MetadataOptions"] == {"HttpEndpoint": "enabled", "HttpTokens": "required",
                                       "HttpPutResponseHopLimit": 1, "HttpProtocolIpv6": "disabled"}
    ((kind, script),) = user_data_parts(template)
    assert kind == "text/cloud-boothook" and script.startswith("#cloud-boothook\n#!/bin/bash\n")
    assert "ECS_AWSVPC_BLOCK_IMDS=true" in script and "/etc/ecs/ecs.config" in script
    assert "-d 169.254.169.254/32 -m owner ! --uid-owner 0 -j DROP" in script
    # every EC2 compute environment (multi-node's included) takes it
    for name, environment in resources_of(template, "AWS::Batch::ComputeEnvironment").items():
        resources = environment["Properties"]["ComputeResources"]
        if resources["Type"] != "FARGATE":
            assert resources["LaunchTemplate"]["LaunchTemplateId"] == {"Ref": "LaunchTemplate"}, name


@pytest.mark.slow  # runs bash
def test_the_boothook_sets_the_agent_and_the_rule_once_at_every_boot(template, tmp_path):
    """The boothook run by bash, with /etc/ecs in a folder here and a stand-in iptables that
    keeps its rules in a file: twice (cloud-init runs a boothook at every boot)."""
    ((_, script),) = user_data_parts(template)
    config = tmp_path / "etc-ecs"
    cache = tmp_path / "var-cache"  # the jobs' environment cache (requirements=)
    script = script.replace("/etc/ecs", str(config)).replace("/var/cache/batchfutures", str(cache))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    owners = tmp_path / "owners"  # a stand-in chown: this test need not run as root
    (bin_dir / "chown").write_text(f"#!/bin/bash\necho \"$*\" >> {owners}\n")
    (bin_dir / "chown").chmod(0o755)
    rules = tmp_path / "rules"
    rules.write_text("")
    fake = bin_dir / "iptables"
    fake.write_text(f"""#!/bin/bash
rule="${{*:2}}"
case "$1" in
  -C) grep -qxF -- "$rule" {rules} ;;
  -I) chain="$2"; shift 3; echo "$chain $*" >> {rules} ;;  # -I CHAIN POSITION RULE
  *) exit 2 ;;
esac
""")
    fake.chmod(0o755)
    (config / "ecs.config").parent.mkdir()
    (config / "ecs.config").write_text("ECS_CLUSTER=batch-cluster\n")
    environment = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    for _ in range(2):
        done = subprocess.run(["bash", "-c", script], env=environment, capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0, done.stderr
    assert (config / "ecs.config").read_text().splitlines() == [
        "ECS_CLUSTER=batch-cluster", "ECS_AWSVPC_BLOCK_IMDS=true",
        "ECS_ENABLE_SPOT_INSTANCE_DRAINING=true"]
    assert rules.read_text().splitlines() == [
        "OUTPUT -d 169.254.169.254/32 -m owner ! --uid-owner 0 -j DROP"]
    assert (cache / "envs").is_dir() and (cache / "envs").stat().st_mode & 0o777 == 0o700
    assert owners.read_text().splitlines() == [f"1000:1000 {cache}/envs"] * 2


def test_the_dockerfile_runs_the_worker_as_a_user_the_metadata_rule_drops():
    """The iptables rule spares uid 0 only: the worker image must not run as root."""
    users = [argument for instruction, argument in dockerfile_instructions() if instruction == "USER"]
    assert users and users[-1] not in ("root", "0")


# -- the stack in moto's CloudFormation -------------------------------------------------------
@pytest.fixture(scope="module")
def moto_url():
    from s3server import private_moto_server

    with private_moto_server() as url:
        yield url


@pytest.fixture(scope="module")
def aws(moto_url):
    from s3server import admin_clients

    return admin_clients(moto_url)


@pytest.fixture(scope="module")
def network(aws):
    return make_network(aws)


def make_network(aws):
    """A VPC's two subnets and security group, and the role moto needs as Batch's service role."""
    ec2 = aws("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.20.{i}.0/24",
                                 AvailabilityZone=f"{REGION}{zone}")["Subnet"]["SubnetId"]
               for i, zone in ((1, "a"), (2, "b"))]
    group = ec2.create_security_group(GroupName="batchfutures-test", Description="outbound only",
                                      VpcId=vpc)["GroupId"]
    iam = aws("iam")
    try:  # moto's state is the process's: another module may have made it already
        role = iam.get_role(RoleName="AWSServiceRoleForBatch")["Role"]["Arn"]
    except iam.exceptions.NoSuchEntityException:
        role = iam.create_role(
            RoleName="AWSServiceRoleForBatch", Path="/aws-service-role/batch.amazonaws.com/",
            AssumeRolePolicyDocument=('{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", '
                                      '"Principal": {"Service": "batch.amazonaws.com"}, '
                                      '"Action": "sts:AssumeRole"}]}'))["Role"]["Arn"]
    return {"subnets": subnets, "security_group": group, "service_role": role}


def create_stack(aws, network, name, template, **parameters):
    secret = aws("secretsmanager").create_secret(  # moto's CloudFormation cannot make one
        Name=f"{name}/signing-key", SecretString="k" * 64)["ARN"]
    values = {"SubnetIds": ",".join(network["subnets"]),
              "SecurityGroupIds": network["security_group"],
              "BatchServiceRoleArn": network["service_role"],  # moto needs a ServiceRole
              "SigningSecretArn": secret}
    for key, parameter in template["Parameters"].items():  # moto does not split list defaults
        if parameter["Type"] == "CommaDelimitedList" and key not in parameters:
            values[key] = parameter["Default"]
    values.update({key: str(value) for key, value in parameters.items()})
    cloudformation = aws("cloudformation")
    cloudformation.create_stack(
        StackName=name, TemplateBody=template_text(), Capabilities=["CAPABILITY_NAMED_IAM"],
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in values.items()])
    deadline = time.monotonic() + 60
    while True:
        stack = cloudformation.describe_stacks(StackName=name)["Stacks"][0]
        if not stack["StackStatus"].endswith("_IN_PROGRESS") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert stack["StackStatus"] == "CREATE_COMPLETE", stack.get("StackStatusReason")
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    summaries = cloudformation.list_stack_resources(StackName=name)["StackResourceSummaries"]
    physical = {r["LogicalResourceId"]: r["PhysicalResourceId"] for r in summaries}
    return outputs, physical


@pytest.fixture(scope="module")
def stack(aws, network, template):
    outputs, physical = create_stack(aws, network, "bf-test", template)
    return {"name": "bf-test", "outputs": outputs, "physical": physical}


def test_stack_creates_in_moto_with_the_three_outputs(aws, stack, template):
    outputs, physical = stack["outputs"], stack["physical"]
    assert set(outputs) == {"JobQueue", "JobDefinition", "IoBucket", "Stack", "SigningSecret",
                            "MultiNodeJobQueue"}
    assert outputs["Stack"] == "bf-test"
    # every resource but the types moto's CloudFormation does not implement, and the key's
    # policy (KmsKeyArn is empty)
    # (RouteTableIds is empty: no S3 endpoint)
    assert set(template["Resources"]) - set(physical) <= {"IoBucketPolicy", "SigningSecret",
                                                          "PayloadKeyPolicy", "S3GatewayEndpoint"}
    assert "S3GatewayEndpoint" not in physical
    assert "PayloadKeyPolicy" not in physical and "PayloadKeyPolicy" not in outputs
    assert outputs["SigningSecret"].startswith(f"arn:aws:secretsmanager:{REGION}:{MOTO_ACCOUNT}:secret:")

    batch = aws("batch")
    (queue,) = batch.describe_job_queues(jobQueues=[outputs["JobQueue"]])["jobQueues"]
    assert queue["jobQueueName"] == "bf-test-ec2"
    assert (queue["state"], queue["status"]) == ("ENABLED", "VALID")
    order = sorted(queue["computeEnvironmentOrder"], key=lambda o: o["order"])
    assert [o["computeEnvironment"] for o in order] == [
        physical["OnDemandComputeEnvironment"], physical["SpotComputeEnvironment"]]
    environments = batch.describe_compute_environments(computeEnvironments=[
        physical[n] for n in ("OnDemandComputeEnvironment", "SpotComputeEnvironment",
                              "FargateComputeEnvironment")])["computeEnvironments"]
    kinds = {e["computeResources"]["type"]: e["computeResources"] for e in environments}
    assert set(kinds) == {"EC2", "SPOT", "FARGATE"}
    assert kinds["EC2"]["instanceTypes"] == ["optimal", "g4dn", "g5"]
    assert kinds["SPOT"]["bidPercentage"] == 100
    assert kinds["EC2"]["instanceRole"] == kinds["SPOT"]["instanceRole"]

    assert outputs["JobDefinition"] == "bf-test-worker"  # a name: its latest ACTIVE revision
    (definition,) = batch.describe_job_definitions(
        jobDefinitionName=outputs["JobDefinition"], status="ACTIVE")["jobDefinitions"]
    container = definition["containerProperties"]
    assert container["image"] == (
        f"{MOTO_ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{DEFAULT_REPOSITORY}:py{MINOR}")
    assert container["command"] == ["python", "-m", "batchfutures.worker"]
    assert {r["type"]: r["value"] for r in container["resourceRequirements"]} == {
        "VCPU": "1", "MEMORY": "2048"}
    job_role = aws("iam").get_role(RoleName=physical["JobRole"])["Role"]
    assert container["jobRoleArn"] == job_role["Arn"]
    assert container["logConfiguration"]["options"]["awslogs-group"] == "/aws/batch/bf-test"

    bucket = outputs["IoBucket"]
    aws("s3").head_bucket(Bucket=bucket)
    encryption = aws("s3").get_bucket_encryption(Bucket=bucket)
    assert encryption["ServerSideEncryptionConfiguration"]["Rules"][0][
        "ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    (group,) = aws("logs").describe_log_groups(logGroupNamePrefix="/aws/batch/bf-test")["logGroups"]
    assert group["retentionInDays"] == 30


def policy_document(response):
    """GetRolePolicy's document; moto stores one made by CloudFormation as a Python repr."""
    document = response["PolicyDocument"]
    return ast.literal_eval(document) if isinstance(document, str) else document


def test_job_role_reaches_only_the_payload_prefix(aws, stack):
    iam = aws("iam")
    role = stack["physical"]["JobRole"]
    (name,) = iam.list_role_policies(RoleName=role)["PolicyNames"]
    document = policy_document(iam.get_role_policy(RoleName=role, PolicyName=name))
    bucket = stack["outputs"]["IoBucket"]
    objects, listing, secret, warm = document["Statement"]
    assert objects["Resource"] == f"arn:aws:s3:::{bucket}/batchfutures/runs/*"
    assert warm["Resource"] == f"arn:aws:sqs:{REGION}:{MOTO_ACCOUNT}:bf-test-warm-*"
    assert set(warm["Action"]) == {"sqs:ReceiveMessage", "sqs:ChangeMessageVisibility",
                                   "sqs:DeleteMessage", "sqs:SendMessage"}
    assert set(objects["Action"]) == {"s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"}
    assert listing["Resource"] == f"arn:aws:s3:::{bucket}"
    assert secret["Resource"] == stack["outputs"]["SigningSecret"]
    assert iam.list_attached_role_policies(RoleName=role)["AttachedPolicies"] == []
    client = iam.get_policy(PolicyArn=f"arn:aws:iam::{MOTO_ACCOUNT}:policy/bf-test-client")
    assert client["Policy"]["PolicyName"] == "bf-test-client"


def test_kms_key_arn_stack_encrypts_with_the_key_and_attaches_its_policy(aws, network, template):
    key = aws("kms").create_key(Description="batchfutures payloads")["KeyMetadata"]["Arn"]
    outputs, physical = create_stack(aws, network, "bf-kms", template, KmsKeyArn=key)
    (rule,) = aws("s3").get_bucket_encryption(Bucket=outputs["IoBucket"])[
        "ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"] == {"SSEAlgorithm": "aws:kms",
                                                         "KMSMasterKeyID": key}
    policy_arn = f"arn:aws:iam::{MOTO_ACCOUNT}:policy/bf-kms-payload-key"
    assert outputs["PayloadKeyPolicy"] == policy_arn
    iam = aws("iam")
    attached = iam.list_attached_role_policies(RoleName=physical["JobRole"])["AttachedPolicies"]
    assert [p["PolicyArn"] for p in attached] == [policy_arn]
    # the job role's own policy is what it is without the key (test_iam checks the statements)
    (name,) = iam.list_role_policies(RoleName=physical["JobRole"])["PolicyNames"]
    document = policy_document(iam.get_role_policy(RoleName=physical["JobRole"], PolicyName=name))
    assert [s["Sid"] for s in document["Statement"]] == ["RunObjects", "MissingKeysAre404",
                                                         "ReadSigningKey", "WarmQueues"]
    # an object written without SSE headers lands under the key too
    aws("s3").put_object(Bucket=outputs["IoBucket"], Key="batchfutures/check/x", Body=b"x")
    head = aws("s3").head_object(Bucket=outputs["IoBucket"], Key="batchfutures/check/x")
    assert (head["ServerSideEncryption"], head["SSEKMSKeyId"]) == ("aws:kms", key)


def test_fargate_outputs(aws, network, template):
    outputs, physical = create_stack(aws, network, "bf-fargate", template,
                                     DefaultPlatform="FARGATE", IoPrefix="team/runs",
                                     GpuInstanceTypes="")
    (queue,) = aws("batch").describe_job_queues(jobQueues=[outputs["JobQueue"]])["jobQueues"]
    assert queue["jobQueueName"] == "bf-fargate-fargate"
    assert [o["computeEnvironment"] for o in queue["computeEnvironmentOrder"]] == [
        physical["FargateComputeEnvironment"]]
    assert outputs["JobDefinition"] == "bf-fargate-worker-fargate"
    (definition,) = aws("batch").describe_job_definitions(
        jobDefinitionName=outputs["JobDefinition"], status="ACTIVE")["jobDefinitions"]
    execution = aws("iam").get_role(RoleName=physical["ExecutionRole"])["Role"]["Arn"]
    assert definition["containerProperties"]["executionRoleArn"] == execution
    environments = aws("batch").describe_compute_environments(
        computeEnvironments=[physical["OnDemandComputeEnvironment"]])["computeEnvironments"]
    assert environments[0]["computeResources"]["instanceTypes"] == ["optimal"]  # no GPU types
    iam = aws("iam")
    (name,) = iam.list_role_policies(RoleName=physical["JobRole"])["PolicyNames"]
    objects = policy_document(iam.get_role_policy(RoleName=physical["JobRole"], PolicyName=name))[
        "Statement"][0]
    assert objects["Resource"] == f"arn:aws:s3:::{outputs['IoBucket']}/team/runs/runs/*"


def execution_statements(aws, physical):
    iam = aws("iam")
    (name,) = iam.list_role_policies(RoleName=physical["ExecutionRole"])["PolicyNames"]
    document = policy_document(iam.get_role_policy(RoleName=physical["ExecutionRole"],
                                                   PolicyName=name))
    return {s["Sid"]: s for s in document["Statement"]}


@pytest.mark.parametrize("image_uri, repositories", [
    # the stack's own image: its batchfutures-worker repository
    ("", [f"arn:aws:ecr:{REGION}:{MOTO_ACCOUNT}:repository/batchfutures-worker"]),
    # an ECR image: its repository, in the account and region of its host name
    ("210987654321.dkr.ecr.eu-west-1.amazonaws.com/worker:py3.11",
     ["arn:aws:ecr:eu-west-1:210987654321:repository/worker",
      "arn:aws:ecr:eu-west-1:210987654321:repository/worker/*"]),
    # a nested repository name, by digest: <first part> and what is under it
    (f"{MOTO_ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/team/worker@sha256:" + "a" * 64,
     [f"arn:aws:ecr:{REGION}:{MOTO_ACCOUNT}:repository/team",
      f"arn:aws:ecr:{REGION}:{MOTO_ACCOUNT}:repository/team/*"]),
    # another registry: the execution role pulls nothing from ECR for it
    ("public.example.org/worker:1", [f"arn:aws:ecr:{REGION}:{MOTO_ACCOUNT}:repository/batchfutures-worker"]),
])
def test_ecr_pull_is_scoped_to_the_images_repository(aws, network, template, image_uri, repositories):
    name = "bf-ecr-" + str(abs(hash(image_uri)) % 10**6)
    _, physical = create_stack(aws, network, name, template, ImageUri=image_uri)
    pull = execution_statements(aws, physical)["EcrPull"]
    assert as_list(pull["Resource"]) == repositories
    assert "*" not in as_list(pull["Resource"])  # never any repository
    # `batchfutures check` may look up the image where the jobs pull it from, nowhere else
    iam = aws("iam")
    arn = f"arn:aws:iam::{MOTO_ACCOUNT}:policy/{name}-client"
    version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
    client = policy_document({"PolicyDocument": iam.get_policy_version(
        PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]})
    (check_image,) = [s for s in client["Statement"] if s.get("Sid") == "CheckImage"]
    assert check_image["Action"] == "ecr:DescribeImages"
    assert as_list(check_image["Resource"]) == repositories
    # and the stack's definitions hand the signing key to the container, read with this role
    (definition,) = aws("batch").describe_job_definitions(
        jobDefinitionName=f"{name}-worker", status="ACTIVE")["jobDefinitions"]
    (secret,) = definition["containerProperties"]["secrets"]
    assert secret["name"] == "BATCHFUTURES_SIGNING_KEY"
    assert definition["containerProperties"]["environment"][0] == {  # then the host cache's
        "name": "BATCHFUTURES_SIGNING_KEY_FROM", "value": secret["valueFrom"]}
    assert execution_statements(aws, physical)["SigningKeyForContainers"]["Resource"] == \
        secret["valueFrom"]


def test_stack_outputs_pass_batchfutures_check(stack, moto_url, monkeypatch, capsys):
    """docs/aws.md's step: the three variables from the outputs, then `batchfutures check`."""
    from s3server import admin_clients

    from batchfutures.cli.app import main

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL": moto_url,
                       "BATCHFUTURES_JOB_QUEUE": stack["outputs"]["JobQueue"],
                       "BATCHFUTURES_JOB_DEFINITION": stack["outputs"]["JobDefinition"],
                       "BATCHFUTURES_IO_BUCKET": stack["outputs"]["IoBucket"],
                       # the signing key (moto's CloudFormation made no secret of its own)
                       "BATCHFUTURES_SIGNING_KEY": "test-signing-key-" + "0" * 47}.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_BATCH",
                "AWS_ENDPOINT_URL_LOGS", "BATCHFUTURES_IO_PREFIX", "BATCHFUTURES_IMAGE"):
        monkeypatch.delenv(key, raising=False)
    from test_first_run import push_image  # step 2: the image in ECR (check looks it up)

    push_image(admin_clients(moto_url)("ecr"), DEFAULT_REPOSITORY, image_tag())
    code = main(["check"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0, lines
    assert len(lines) == 7 and all(line.startswith("ok") for line in lines), lines
    assert any(f"s3://{stack['outputs']['IoBucket']}/batchfutures" in line for line in lines)


# -- the Dockerfile ---------------------------------------------------------------------------
def dockerfile_instructions():
    """(instruction, argument) pairs, continuation lines joined, comments dropped."""
    joined, pending = [], ""
    for line in dockerfile_path().read_text(encoding="utf-8").splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1]  # Docker drops the backslash and the newline
            continue
        joined.append(pending + line)
        pending = ""
    return [tuple(text.strip().split(None, 1)) for text in joined]


def test_dockerfile_takes_the_python_version_as_a_build_arg():
    assert dockerfile_path().is_file() and dockerfile_path().parent == template_path().parent
    instructions = dockerfile_instructions()
    first_from = next(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    assert ("ARG", "PYTHON_VERSION=3.11") in instructions[:first_from]
    assert instructions[first_from][1] == "python:${PYTHON_VERSION}-slim"
    assert ("ARG", "PYTHON_VERSION") in instructions[first_from:]  # usable after FROM too
    assert ("ARG", 'CLOUDPICKLE_VERSION=""') in instructions
    assert not any(op == "ENTRYPOINT" for op, _ in instructions)  # Batch's command runs as is
    assert ("USER", "batchfutures") in instructions


def test_dockerfile_installs_every_requirement():
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    required = [line.strip() for line in config["options"]["install_requires"].splitlines()
                if line.strip()]
    names = {re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0].lower() for r in required}
    pip_line = next(arg for op, arg in dockerfile_instructions()
                    if op == "RUN" and "pip install" in arg)
    installed = {re.split(r"[<>=!~$\"]", word.strip('"'), maxsplit=1)[0].lower()
                 for word in pip_line.split() if word.startswith('"')}
    assert names <= installed, names - installed
    assert '"cloudpickle${CLOUDPICKLE_VERSION:+==${CLOUDPICKLE_VERSION}}"' in pip_line


@pytest.mark.slow  # runs sh / python processes
def test_dockerfile_layout_runs_the_worker(tmp_path):
    """COPY, PYTHONPATH, the build-time checks and CMD, run here against a copy of the package."""
    instructions = dockerfile_instructions()
    (copy,) = [arg for op, arg in instructions if op == "COPY"]
    source, destination = copy.split()
    assert source == "." and destination.endswith("/batchfutures/")
    paths = [arg.split("=", 1)[1] for op, arg in instructions
             if op == "ENV" and arg.startswith("PYTHONPATH=")]
    assert paths == [destination.rstrip("/").rsplit("/", 1)[0]]
    root = tmp_path / "image"
    copied = root / destination.strip("/")
    shutil.copytree(package_dir(), copied)  # the build context is the package folder
    (copied / "__pycache__").mkdir(exist_ok=True)
    pythonpath = str(root / paths[0].lstrip("/"))
    python_dir = tmp_path / "bin"
    python_dir.mkdir()
    # the image's `python`: a wrapper, not a symlink, since a venv's interpreter reached through
    # a symlink elsewhere no longer finds its pyvenv.cfg (and so its packages)
    wrapper = python_dir / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    environment = {**os.environ, "PYTHONPATH": pythonpath, "PYTHON_VERSION": MINOR,
                   "PATH": f"{python_dir}{os.pathsep}{os.environ['PATH']}"}
    checks = [arg for op, arg in instructions if op == "RUN" and "/opt/batchfutures" in arg]
    assert len(checks) == 1
    script = checks[0].replace("/opt/batchfutures", str(root))
    done = subprocess.run(["sh", "-c", script], env=environment, capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not list(copied.rglob("__pycache__"))
    wrong = subprocess.run(["sh", "-c", script], env={**environment, "PYTHON_VERSION": "3.99"},
                           capture_output=True, text=True, cwd=tmp_path)
    assert wrong.returncode != 0 and f"runs Python {MINOR}, not 3.99" in wrong.stderr

    (cmd,) = [arg for op, arg in instructions if op == "CMD"]
    import json

    argv = json.loads(cmd)
    shown = subprocess.run([sys.executable, *argv[1:]], env=environment, capture_output=True,
                           text=True, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert f"Python {sys.version.split()[0]}" in shown.stdout
    assert f"batchfutures {batchfutures.__version__}" in shown.stdout
    where = subprocess.run([sys.executable, "-c", "import batchfutures.worker as w; print(w.__file__)"],
                           env=environment, capture_output=True, text=True, cwd=tmp_path)
    assert where.stdout.strip().startswith(str(copied)), where  # the copy, not the installed one


# -- batchfutures image -----------------------------------------------------------------------
def test_image_commands_name_this_python_and_its_cloudpickle():
    import cloudpickle

    text = image_commands(region="us-east-1")
    assert f"--build-arg PYTHON_VERSION={MINOR}" in text
    assert f"--build-arg CLOUDPICKLE_VERSION={cloudpickle.__version__}" in text
    assert f'IMAGE="$REGISTRY/{DEFAULT_REPOSITORY}:py{MINOR}"' in text
    assert f"--file {dockerfile_path()}" in text and f"  {package_dir()}\n" in text
    assert "aws ecr get-login-password --region \"$REGION\" | docker login" in text
    assert f"Python {MINOR}" in text.splitlines()[1]


def test_image_commands_for_another_python_and_repository():
    other = "3.13" if MINOR == "3.12" else "3.12"  # a Python other than the one running
    text = image_commands(f"{other}.1", "210987654321.dkr.ecr.eu-west-1.amazonaws.com/team/worker")
    assert f"--build-arg PYTHON_VERSION={other}" in text
    assert "CLOUDPICKLE_VERSION=" not in text.replace("CLOUDPICKLE_VERSION=<", "")  # not ours to pin
    assert "REGION=eu-west-1" in text
    assert "REGISTRY=210987654321.dkr.ecr.eu-west-1.amazonaws.com" in text
    assert f'IMAGE="$REGISTRY/team/worker:py{other}"' in text
    assert "ImageUri=$IMAGE" in text
    tagged = image_commands(repository="ghcr.io/me/worker:v7")
    assert "IMAGE=ghcr.io/me/worker:v7" in tagged and "aws " not in tagged
    assert image_commands(repository="mine", region="cn-north-1").count("amazonaws.com.cn") == 1


@pytest.mark.parametrize("value, minor", [("3.11", "3.11"), ("3.11.7", "3.11"), ("py3.9", "3.9"),
                                          (" 3.13 ", "3.13"), ("3.12.0rc1", "3.12")])
def test_python_versions_are_read_as_minor_versions(value, minor):
    assert python_minor(value) == minor
    assert image_tag(value) == f"py{minor}"
    assert python_minor() == MINOR


@pytest.mark.parametrize("kwargs", [
    {"python_version": "2.7"}, {"python_version": "3"}, {"python_version": "latest"},
    {"repository": "Upper/Case"}, {"repository": "repo@sha256:abc"}, {"repository": "repo:"},
    {"region": "mars-1"},
    {"repository": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/w", "region": "us-east-1"},
])
def test_image_commands_refuse_bad_values(kwargs):
    with pytest.raises(ConfigurationError):
        image_commands(**kwargs)


@pytest.mark.slow  # runs sh / python processes
@pytest.mark.parametrize("kwargs", [
    {}, {"region": "us-east-1"}, {"python_version": "3.12", "repository": "team/w"},
    {"repository": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/w:latest"},
    {"repository": "localhost:5000/w"},
])
def test_image_commands_are_valid_sh(kwargs):
    done = subprocess.run(["sh", "-n"], input=image_commands(**kwargs), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


_AWS_STANDIN = """#!/bin/sh
echo "aws $*" >> "$LOG"
case "$*" in
  "sts get-caller-identity"*) echo 123456789012 ;;
  "configure get region") echo eu-central-1 ;;
  "ecr describe-repositories"*) echo "RepositoryNotFoundException" >&2; exit 254 ;;
  "ecr get-login-password"*) echo not-a-password ;;
esac
"""
_DOCKER_STANDIN = """#!/bin/sh
echo "docker $*" >> "$LOG"
if [ "$1" = login ]; then read password; echo "stdin $password" >> "$LOG"; fi
if [ "$1" = buildx ] && [ "$2" = build ]; then
  for last; do :; done
  test -f "$last/worker/__main__.py" && echo "context has the worker" >> "$LOG"
fi
"""


def run_image_script(tmp_path, text, **environment):
    bin_dir = tmp_path / "standins"
    bin_dir.mkdir()
    for name, body in (("aws", _AWS_STANDIN), ("docker", _DOCKER_STANDIN)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(stat.S_IRWXU)
    log = tmp_path / "calls.log"
    env = {key: value for key, value in os.environ.items()
           if key not in ("AWS_REGION", "AWS_DEFAULT_REGION")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", LOG=str(log), **environment)
    done = subprocess.run(["sh", "-c", text], env=env, capture_output=True, text=True, timeout=60)
    return done, log.read_text().splitlines() if log.exists() else []


@pytest.mark.slow  # runs sh / python processes
def test_image_script_creates_logs_in_builds_and_pushes(tmp_path, stack, aws):
    done, calls = run_image_script(tmp_path, image_commands(region=REGION, platforms="all"))
    assert done.returncode == 0, done.stderr
    image = f"123456789012.dkr.ecr.{REGION}.amazonaws.com/{DEFAULT_REPOSITORY}:py{MINOR}"
    def step(prefix):
        (index,) = [i for i, call in enumerate(calls) if call.startswith(prefix)]
        return index

    # in this order (the password pipe's two ends may log in either order)
    assert step("aws sts get-caller-identity") < step("aws ecr describe-repositories") \
        < step("aws ecr create-repository") < step("aws ecr get-login-password") \
        < step("docker buildx build") < step("context has the worker")
    assert step("docker login") < step("docker buildx build") and len(calls) == 9
    assert f"--repository-name {DEFAULT_REPOSITORY}" in calls[step("aws ecr create-repository")]
    assert calls[step("docker login")].endswith(
        f"--password-stdin 123456789012.dkr.ecr.{REGION}.amazonaws.com")
    assert "stdin not-a-password" in calls
    build = calls[step("docker buildx build")]
    assert f"--build-arg PYTHON_VERSION={MINOR}" in build and f"--tag {image} --push" in build
    assert "--platform linux/amd64,linux/arm64" in build  # x86 and Graviton
    assert f"pushed {image}" in done.stdout
    # the image it pushes is the one the stack's job definition runs (moto's account is the same)
    (definition,) = aws("batch").describe_job_definitions(
        jobDefinitionName=stack["outputs"]["JobDefinition"], status="ACTIVE")["jobDefinitions"]
    assert definition["containerProperties"]["image"] == image


@pytest.mark.slow  # runs sh / python processes
def test_image_script_builds_this_machines_platform_by_default(tmp_path):
    from batchfutures.cli.setup_resources import host_platform

    done, calls = run_image_script(tmp_path, image_commands(region=REGION))
    assert done.returncode == 0, done.stderr
    (build,) = [call for call in calls if call.startswith("docker buildx build")]
    assert f"--platform {host_platform()} " in build and "--builder" not in build
    assert not any(call.startswith("docker buildx inspect") for call in calls)  # no builder
    assert "context has the worker" in calls and len(calls) == 8  # 9 less the builder look-up


@pytest.mark.slow  # runs sh / python processes
def test_image_script_finds_the_region_when_it_runs(tmp_path):
    done, calls = run_image_script(tmp_path, image_commands())
    assert done.returncode == 0, done.stderr
    assert calls[0] == "aws configure get region"
    assert "--tag 123456789012.dkr.ecr.eu-central-1.amazonaws.com/" in "\n".join(calls)
    again = tmp_path / "again"
    again.mkdir()
    done, calls = run_image_script(again, image_commands(), AWS_REGION="ap-south-1")
    assert done.returncode == 0, done.stderr
    assert calls[0].startswith("aws sts") and "ap-south-1" in calls[-2]  # the build's --tag
