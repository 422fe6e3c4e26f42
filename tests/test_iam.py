"""The template's IAM, checked two ways.

1. Against AWS's Service Authorization Reference (SAR): every action, resource type and condition
   key of every policy in the template must be one the SAR lists for that service. The table
   below is transcribed from the SAR pages named in each entry (a review found the template
   once used `batch:CreateAction`, which Batch does not define; this test would have failed).

2. Enforced, on moto's server: the stack is created in moto's CloudFormation, the job role's and
   the client policy's documents are put on two IAM users, and moto is switched to checking
   every request's signature and the caller's policies (POST /moto-api/reset-auth with 0, the
   server form of INITIAL_NO_AUTH_ACTION_COUNT). Then the real worker (`python -m
   batchfutures.worker`) runs a job under the job policy's credentials, the client's storage
   calls and `batchfutures check` run under the client policy's, and calls each must not make
   are refused.

What moto can check and what it cannot (so what part 2 leaves to part 1 and to the docs):
- S3: moto authorizes each request against the object or bucket ARN, so the resource scoping
  (<IoPrefix>/runs/* for the worker, <IoPrefix>/* for the client) is really enforced. Since
  moto 5.2.x its server names the action after the S3 operation (s3:ListObjectsV2,
  s3:HeadObject) where AWS checks the IAM action (s3:ListBucket, s3:GetObject): the users get
  the documents through as_moto_names(), which grants each operation where its action is
  granted, on the same resources, and nothing else.
- Secrets Manager: moto authorizes it against Resource "*" only, so a statement scoped to one
  secret is refused by moto's server even where AWS allows it.
- Batch: moto names a Batch request's action after its URL in lower case
  (batch:describejobqueues), which no policy matches, so under enforcement moto refuses every
  Batch call, allowed or not.
  Both are evaluated instead with moto's own policy evaluator (moto.iam.access_control.IAMPolicy)
  against the actions and ARNs the real calls name.
- Conditions: moto's evaluator gets no request context, and it treats a condition on a key the
  request lacks as met. The client policy's conditions (iam:PassedToService, the
  batchfutures:stack tag on SubmitJob, TagResource, CancelJob and TerminateJob, and
  RegisterJobDefinition's batch:Privileged, batch:User, batch:Image, batch:LogDriver and
  batch:AWSLogsGroup) and the payload key's kms:ViaService are therefore evaluated on the
  deployed document by condition_met() below (the IAM operators the documents use, ...IfExists
  included), against the request contexts AWS would send: register_contexts() builds
  RegisterJobDefinition's from the request batchfutures' own code makes, one per container,
  with the keys the SAR lists for it, each present only when the request sets what it names.
- S3's 404-or-403 for a missing key: moto always answers 404. AWS answers 404 only to a caller
  allowed s3:ListBucket on the bucket, judged without any s3:prefix (a GET carries none): checked
  on the deployed documents, a grant of s3:ListBucket on the bucket with no condition.
- DeleteObjects (what s3fs's rm sends, so Storage.delete and the client's cleanup): moto
  authorizes it as s3:DeleteObject on the bucket ARN, where AWS checks each key's object ARN, so
  a prefix-scoped grant is refused there. The client's deletes are checked one key at a time
  (DeleteObject, the same action on AWS). Note that s3fs reports a refused key of a bulk delete
  without raising.
- SSE-KMS (the KmsKeyArn parameter): moto's S3 stores an object under a KMS key without asking
  KMS, so it never checks the caller's kms:GenerateDataKey or kms:Decrypt. The stack is created
  with and without the parameter; the grant is checked on the deployed documents (exactly the
  two actions, on exactly that key) and with moto's evaluator, and the job runs under the key
  with IAM enforcement on (its S3 side).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import uuid
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import test_setup_resources as setup

from batchfutures import serialization, wire
from batchfutures.storage import Storage

pytestmark = pytest.mark.filterwarnings(
    "ignore:Tried to parse AWS.*BucketPolicy:UserWarning")

REGION = setup.REGION
ACCOUNT = setup.MOTO_ACCOUNT
STACK = "bf-iam"

# -- 1. the Service Authorization Reference ---------------------------------------------------
# action -> (resource types it takes, or () where Resource must be "*"; its condition keys).
# Sources (Service Authorization Reference, "Actions, resources, and condition keys for ..."):
#   AWS Batch        https://docs.aws.amazon.com/service-authorization/latest/reference/list_awsbatch.html
#   Amazon S3        https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazons3.html
#   Secrets Manager  https://docs.aws.amazon.com/service-authorization/latest/reference/list_awssecretsmanager.html
#   Systems Manager  https://docs.aws.amazon.com/service-authorization/latest/reference/list_awssystemsmanager.html
#   CloudWatch Logs  https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazoncloudwatchlogs.html
#   Amazon ECR       https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonelasticcontainerregistry.html
#   IAM              https://docs.aws.amazon.com/service-authorization/latest/reference/list_awsidentityandaccessmanagementiam.html
#   STS              https://docs.aws.amazon.com/service-authorization/latest/reference/list_awssecuritytokenservice.html
#   KMS              https://docs.aws.amazon.com/service-authorization/latest/reference/list_awskeymanagementservice.html
#   Service Quotas   https://docs.aws.amazon.com/service-authorization/latest/reference/list_service-quotas.html
#                    (the resource type "key" of both actions is also in cfn-lint's bundled copy,
#                    cfnlint/data/AdditionalSpecs/Policies.json)
_S3_COMMON = {"s3:AccessGrantsInstanceArn", "s3:authType", "s3:ResourceAccount", "s3:signatureAge",
              "s3:signatureversion", "s3:TlsVersion", "s3:x-amz-content-sha256"}
# the condition keys of KMS's resource type "key"
_KMS_KEY = {"aws:ResourceTag/${TagKey}", "kms:KeyOrigin", "kms:KeySpec", "kms:KeyUsage",
            "kms:MultiRegion", "kms:MultiRegionKeyType", "kms:ResourceAliases"}
SAR: Dict[str, Tuple[Tuple[str, ...], frozenset]] = {
    "batch:SubmitJob": (("job", "job-queue", "job-definition", "job-definition-revision",
                         "consumable-resource"),
                        frozenset({"batch:ShareIdentifier", "batch:EKSImage", "batch:EKSNamespace",
                                   "aws:RequestTag/${TagKey}", "aws:TagKeys"})),
    "batch:TagResource": (("job", "job-definition-revision", "job-queue", "compute-environment",
                           "scheduling-policy"),
                          frozenset({"aws:RequestTag/${TagKey}", "aws:TagKeys",
                                     "aws:ResourceTag/${TagKey}"})),
    "batch:RegisterJobDefinition": (("job-definition",), frozenset({
        "aws:ResourceTag/${TagKey}", "batch:User", "batch:Privileged", "batch:Image",
        "batch:LogDriver", "batch:AWSLogsGroup", "batch:AWSLogsRegion",
        "batch:AWSLogsStreamPrefix", "batch:AWSLogsCreateGroup", "aws:RequestTag/${TagKey}",
        "aws:TagKeys"})),
    # the resource type "job" carries aws:ResourceTag/${TagKey} (its row in "Resource types")
    "batch:CancelJob": (("job",), frozenset({"aws:ResourceTag/${TagKey}"})),
    "batch:TerminateJob": (("job",), frozenset({"aws:ResourceTag/${TagKey}"})),
    "batch:DescribeJobs": ((), frozenset()),
    "batch:ListJobs": ((), frozenset()),
    "batch:DescribeJobQueues": ((), frozenset()),
    "batch:DescribeComputeEnvironments": ((), frozenset()),
    "ec2:DescribeInstanceTypes": ((), frozenset()),
    # future.cost's prices (Price List: list_awspricelist.html; EC2: list_amazonec2.html): no
    # resource types
    "pricing:GetProducts": ((), frozenset()),
    "ec2:DescribeSpotPriceHistory": ((), frozenset()),
    "batch:DescribeJobDefinitions": ((), frozenset()),
    # the resource types job-queue and consumable-resource carry aws:ResourceTag/${TagKey}
    "batch:GetJobQueueSnapshot": (("job-queue",), frozenset({"aws:ResourceTag/${TagKey}"})),
    "batch:DescribeConsumableResource": (("consumable-resource",),
                                         frozenset({"aws:ResourceTag/${TagKey}"})),
    "s3:GetObject": (("object",), frozenset(_S3_COMMON | {"s3:ExistingObjectTag/<key>"})),
    "s3:PutObject": (("object",), frozenset(_S3_COMMON | {
        "s3:if-none-match", "s3:if-match", "s3:x-amz-server-side-encryption",
        "s3:x-amz-server-side-encryption-aws-kms-key-id"})),
    "s3:DeleteObject": (("object",), frozenset(_S3_COMMON | {"s3:if-match"})),
    "s3:AbortMultipartUpload": (("object",), frozenset(_S3_COMMON)),
    "s3:ListBucket": (("bucket",), frozenset(_S3_COMMON | {"s3:delimiter", "s3:max-keys",
                                                           "s3:prefix"})),
    "secretsmanager:GetSecretValue": (("Secret",), frozenset({
        "secretsmanager:SecretId", "secretsmanager:VersionId", "secretsmanager:VersionStage",
        "aws:ResourceTag/${TagKey}"})),
    "ssm:GetParameters": (("parameter",), frozenset({"aws:ResourceTag/${TagKey}"})),
    "logs:GetLogEvents": (("log-stream",), frozenset()),
    # echo_output="live": the resource type "log-group" (required), no action condition keys
    "logs:StartLiveTail": (("log-group",), frozenset()),
    "logs:CreateLogStream": (("log-stream",), frozenset()),
    "logs:PutLogEvents": (("log-stream",), frozenset()),
    # resource type "quota" (required), condition key servicequotas:service
    "servicequotas:GetServiceQuota": (("quota",), frozenset({"servicequotas:service"})),
    "ecr:GetAuthorizationToken": ((), frozenset()),
    "ecr:BatchGetImage": (("repository",), frozenset()),
    "ecr:DescribeImages": (("repository",), frozenset()),
    # Amazon SQS (list_amazonsqs.html): every queue action on the resource type "queue"
    "sqs:CreateQueue": (("queue",), frozenset({"aws:RequestTag/${TagKey}", "aws:TagKeys",
                                               "aws:ResourceTag/${TagKey}"})),
    "sqs:TagQueue": (("queue",), frozenset({"aws:RequestTag/${TagKey}", "aws:TagKeys",
                                            "aws:ResourceTag/${TagKey}"})),
    "sqs:ListQueueTags": (("queue",), frozenset({"aws:ResourceTag/${TagKey}"})),
    "sqs:GetQueueUrl": (("queue",), frozenset({"aws:ResourceTag/${TagKey}"})),
    "sqs:SendMessage": (("queue",), frozenset({"aws:ResourceTag/${TagKey}"})),
    "sqs:ReceiveMessage": (("queue",), frozenset({"aws:ResourceTag/${TagKey}"})),
    "sqs:DeleteMessage": (("queue",), frozenset({"aws:ResourceTag/${TagKey}"})),
    "sqs:ChangeMessageVisibility": (("queue",), frozenset({"aws:ResourceTag/${TagKey}"})),
    "sqs:DeleteQueue": (("queue",), frozenset({"aws:ResourceTag/${TagKey}"})),
    "sqs:ListQueues": ((), frozenset()),
    "ecr:GetDownloadUrlForLayer": (("repository",), frozenset()),
    "ecr:BatchCheckLayerAvailability": (("repository",), frozenset()),
    "iam:PassRole": (("role",), frozenset({"iam:AssociatedResourceArn", "iam:PassedToService"})),
    "sts:AssumeRole": (("role",), frozenset()),
    "kms:GenerateDataKey": (("key",), frozenset(_KMS_KEY | {
        "kms:CallerAccount", "kms:EncryptionAlgorithm", "kms:EncryptionContext:${EncryptionContextKey}",
        "kms:EncryptionContextKeys", "kms:RecipientAttestation:ImageSha384",
        "kms:RecipientAttestation:PCR${PCR_ID}", "kms:RequestAlias", "kms:ViaService"})),
    "kms:Decrypt": (("key",), frozenset(_KMS_KEY | {
        "kms:CallerAccount", "kms:EncryptionAlgorithm", "kms:EncryptionContext:${EncryptionContextKey}",
        "kms:EncryptionContextKeys", "kms:RecipientAttestation:ImageSha384",
        "kms:RecipientAttestation:PCR${PCR_ID}", "kms:RequestAlias", "kms:ViaService"})),
}
# the ARN shape of each resource type (the SAR's "Resource types" tables), as a prefix test
RESOURCE_ARNS = {
    "job": ":batch:{region}:{account}:job/",
    "compute-environment": ":batch:{region}:{account}:compute-environment/",
    "scheduling-policy": ":batch:{region}:{account}:scheduling-policy/",
    "job-queue": ":batch:{region}:{account}:job-queue/",
    "consumable-resource": ":batch:{region}:{account}:consumable-resource/",
    "job-definition": ":batch:{region}:{account}:job-definition/",
    "job-definition-revision": ":batch:{region}:{account}:job-definition/",
    "object": ":s3:::", "bucket": ":s3:::", "Secret": ":secretsmanager:{region}:{account}:secret:",
    "parameter": ":ssm:{region}:{account}:parameter/",
    "log-stream": ":logs:{region}:{account}:log-group:",
    "log-group": ":logs:{region}:{account}:log-group:",
    "repository": ":ecr:{region}:{account}:repository/", "role": ":iam::{account}:role/",
    "key": ":kms:{region}:{account}:key/",
    "queue": ":sqs:{region}:{account}:",
    "quota": ":servicequotas:{region}:{account}:",  # ...:<service code>/<quota code>
}
# global condition keys (IAM User Guide, "AWS global condition context keys")
GLOBAL_KEYS = {"aws:SecureTransport", "aws:SourceAccount", "aws:SourceArn"}


def policy_documents(template: Dict[str, Any]) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """(resource name, policy document) for every policy the template writes."""
    for name, resource in template["Resources"].items():
        properties = resource["Properties"]
        if resource["Type"] == "AWS::IAM::Role":
            yield name, properties["AssumeRolePolicyDocument"]
            for policy in properties.get("Policies", []):
                yield name, policy["PolicyDocument"]
        elif resource["Type"] in ("AWS::IAM::ManagedPolicy", "AWS::S3::BucketPolicy"):
            yield name, properties["PolicyDocument"]


def as_list(value: Any) -> List[Any]:
    return value if isinstance(value, list) else [value]


def resolved_arn(value: Any) -> str:
    """A Resource entry as a string with the template's pseudo parameters filled in."""
    if isinstance(value, dict) and "Fn::Sub" in value:
        text = value["Fn::Sub"]
        for name, filled in (("${AWS::Partition}", "aws"), ("${AWS::Region}", REGION),
                             ("${AWS::AccountId}", ACCOUNT), ("${IoBucket.Arn}", "arn:aws:s3:::b")):
            text = text.replace(name, filled)
        return text
    if isinstance(value, dict) and value.get("Fn::GetAtt", [None])[0] == "IoBucket":
        return "arn:aws:s3:::b"
    return json.dumps(value)  # a Ref or Fn::If: checked by type in the test


def test_every_action_resource_and_condition_key_is_in_the_service_authorization_reference():
    template = setup.load_template()
    checked = 0
    for name, document in policy_documents(template):
        for statement in document["Statement"]:
            for action in as_list(statement["Action"]):
                if action == "s3:*":  # the bucket policy's Deny of plain HTTP covers every action
                    assert statement["Effect"] == "Deny" and name == "IoBucketPolicy"
                    continue
                assert action in SAR, f"{name}: {action} is not in the SAR table"
                resource_types, keys = SAR[action]
                for operator in (statement.get("Condition") or {}).values():
                    for key in operator:
                        pattern = re.sub(r"/[^/]+$", "/${TagKey}", key) if key.startswith(
                            ("aws:RequestTag/", "aws:ResourceTag/")) else key
                        assert key in GLOBAL_KEYS or pattern in keys, (
                            f"{name} {statement.get('Sid')}: {action} has no condition key {key}")
                resources = as_list(statement.get("Resource", []))
                if not resource_types:  # the SAR gives it no resource type: "*" is required
                    assert resources == ["*"], (name, action, resources)
                elif "Principal" not in statement:  # an identity policy names ARNs of its types
                    assert "*" not in resources, (name, action)
                    for resource in resources:
                        text = resolved_arn(resource)
                        if text.startswith("arn:"):
                            shapes = [RESOURCE_ARNS[t].format(region=REGION, account=ACCOUNT)
                                      for t in resource_types]
                            assert any(shape in text for shape in shapes), (name, action, text)
                checked += 1
    assert checked > 30
    # the key a review flagged is gone for good
    assert "CreateAction" not in setup.template_text()


def test_the_kms_grant_names_a_key_arn_and_nothing_else():
    """The KMS statement's Resource is a Ref to KmsKeyArn: the parameter admits only the SAR's
    ARN shape of a key (an alias ARN in an identity policy does not grant use of its key)."""
    template = setup.load_template()
    (statement,) = template["Resources"]["PayloadKeyPolicy"]["Properties"]["PolicyDocument"][
        "Statement"]
    assert statement["Resource"] == {"Ref": "KmsKeyArn"}
    pattern = re.compile(template["Parameters"]["KmsKeyArn"]["AllowedPattern"])
    shape = RESOURCE_ARNS["key"].format(region=REGION, account=ACCOUNT)
    for good in ("", f"arn:aws{shape}1234abcd-12ab-34cd-56ef-1234567890ab",
                 f"arn:aws{shape}mrk-1234abcd12ab34cd56ef1234567890ab",
                 "arn:aws-cn:kms:cn-north-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"):
        assert pattern.match(good), good
    for bad in ("*", "1234abcd-12ab-34cd-56ef-1234567890ab", "alias/payloads",
                f"arn:aws:kms:{REGION}:{ACCOUNT}:alias/payloads", f"arn:aws:kms:{REGION}:{ACCOUNT}:key/*",
                "arn:aws:s3:::bucket/key/x"):
        assert not pattern.match(bad), bad


# -- 2. enforced on moto's server -------------------------------------------------------------
@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    from s3server import private_moto_server

    with private_moto_server() as url:
        yield url


@pytest.fixture(scope="module")
def admin(moto_url):
    from s3server import admin_clients

    return admin_clients(moto_url)


@pytest.fixture(scope="module")
def network(admin) -> Dict[str, Any]:
    return setup.make_network(admin)


def managed_policy_document(iam: Any, arn: str) -> Dict[str, Any]:
    version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
    document = iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"][
        "Document"]
    return setup.policy_document({"PolicyDocument": document})


# The S3 operations AWS authorizes through each IAM action (S3 API Reference, each operation's
# "Permissions"). moto's server names an S3 request after its operation (ListObjectsV2,
# HeadObject) since moto 5.2.x, where AWS checks s3:ListBucket and s3:GetObject.
S3_OPERATIONS_OF_ACTION: Dict[str, Tuple[str, ...]] = {
    "s3:ListBucket": ("s3:ListObjectsV2", "s3:ListObjects", "s3:HeadBucket"),
    "s3:GetObject": ("s3:HeadObject",),
    "s3:PutObject": ("s3:CreateMultipartUpload", "s3:UploadPart", "s3:CompleteMultipartUpload"),
    "s3:DeleteObject": ("s3:DeleteObjects",),
}


def as_moto_names(document: Dict[str, Any]) -> Dict[str, Any]:
    """The document with each S3 action also granted under the operation names moto checks.

    The same resources and conditions: what AWS allows through s3:ListBucket on the bucket, moto
    allows through s3:ListObjectsV2 on the bucket, and nothing more. Older moto names requests
    after the IAM action, which the document keeps."""
    statements = []
    for statement in document["Statement"]:
        actions = as_list(statement.get("Action", []))
        extra = [name for action in actions for name in S3_OPERATIONS_OF_ACTION.get(action, ())]
        statements.append({**statement, "Action": actions + extra} if extra else statement)
    return {**document, "Statement": statements}


def test_moto_names_extend_each_grant_to_its_operations_only():
    document = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::b"},
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": "arn:aws:s3:::b/p/*"},
        {"Effect": "Allow", "Action": "batch:DescribeJobs", "Resource": "*"}]}
    listing, reading, batch = as_moto_names(document)["Statement"]
    assert listing == {"Effect": "Allow", "Resource": "arn:aws:s3:::b", "Action": [
        "s3:ListBucket", "s3:ListObjectsV2", "s3:ListObjects", "s3:HeadBucket"]}
    assert reading["Action"] == ["s3:GetObject", "s3:HeadObject"]
    assert reading["Resource"] == "arn:aws:s3:::b/p/*"
    assert batch == document["Statement"][2]


def deploy(admin, network, name: str, users: Dict[str, Tuple[str, ...]],
           **parameters: str) -> Dict[str, Any]:
    """Create the stack in moto's CloudFormation and read back what its IAM resources hold.

    ``users``: user name -> the documents ("job", "client", "payload_key") put on that user,
    so that it acts with exactly the permissions of a principal the stack sets up."""
    outputs, physical = setup.create_stack(admin, network, name, setup.load_template(),
                                           **parameters)
    iam = admin("iam")
    (inline,) = iam.list_role_policies(RoleName=physical["JobRole"])["PolicyNames"]
    documents = {
        "job": setup.policy_document(iam.get_role_policy(RoleName=physical["JobRole"],
                                                         PolicyName=inline)),
        "client": managed_policy_document(iam, f"arn:aws:iam::{ACCOUNT}:policy/{name}-client")}
    attached = iam.list_attached_role_policies(RoleName=physical["JobRole"])["AttachedPolicies"]
    if "PayloadKeyPolicy" in outputs:
        documents["payload_key"] = managed_policy_document(iam, outputs["PayloadKeyPolicy"])
    keys = {}
    for user, carried in users.items():
        iam.create_user(UserName=user)
        for which in carried:
            iam.put_user_policy(UserName=user, PolicyName=f"batchfutures-{which}",
                                PolicyDocument=json.dumps(as_moto_names(documents[which])))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        keys[user] = (key["AccessKeyId"], key["SecretAccessKey"])
    roles = {logical: iam.get_role(RoleName=physical[logical])["Role"]["Arn"]
             for logical in ("JobRole", "ExecutionRole")}
    return {"outputs": outputs, "physical": physical, "job_policy": documents["job"],
            "client_policy": documents["client"], "payload_key_policy": documents.get("payload_key"),
            "job_role_attached": [p["PolicyArn"] for p in attached], "keys": keys, "roles": roles}


@pytest.fixture(scope="module")
def stack(admin, network) -> Dict[str, Any]:
    # the worker and the client each get a user carrying exactly that policy
    return deploy(admin, network, STACK, {"bf-iam-worker": ("job",), "bf-iam-client": ("client",)})


@pytest.fixture
def enforced(moto_url, stack) -> Iterator[None]:
    """moto checks every request's signature and the caller's policies while the test runs."""
    import requests

    previous = requests.post(f"{moto_url}/moto-api/reset-auth", data=b"0", timeout=10).json()[
        "PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT"]
    try:
        yield
    finally:  # moto's switch is the whole process's: put it back for every other test
        requests.post(f"{moto_url}/moto-api/reset-auth", data=str(previous).encode(), timeout=10)


def credentials(moto_url: str, keys: Tuple[str, str]) -> Dict[str, str]:
    """The process variables that make boto3, s3fs and the worker act as one moto IAM user."""
    from s3server import fake_aws_variables

    variables = fake_aws_variables(moto_url)
    del variables["AWS_SESSION_TOKEN"]  # a user's long-term key has none
    variables.update(AWS_ACCESS_KEY_ID=keys[0], AWS_SECRET_ACCESS_KEY=keys[1])
    return variables


@pytest.fixture
def as_user(moto_url, stack, monkeypatch):
    """Switch this process's AWS variables to a user's; returns them (for a subprocess too)."""
    def switch(user: str, deployed: Dict[str, Any] = stack) -> Dict[str, str]:
        variables = credentials(moto_url, deployed["keys"][user])
        monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        for key in [k for k in os.environ if k.startswith("AWS_ENDPOINT_URL_")]:
            # every service on this moto server: an emulator's Batch endpoint left set would
            # take the Batch checks elsewhere (a closed port: batchapi's retries, ~30 s)
            if key not in variables:
                monkeypatch.delenv(key)
        for key, value in variables.items():
            monkeypatch.setenv(key, value)
        # one payload signing key for the client and the workers this test starts (test keys
        # only: the Secrets Manager path is evaluated in test_the_signing_key_is_readable...)
        monkeypatch.setenv("BATCHFUTURES_SIGNING_KEY", "test-signing-key-" + "0" * 47)
        return variables
    return switch


def s3_client(variables: Dict[str, str]) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=variables["AWS_ENDPOINT_URL"], region_name=REGION,
                        aws_access_key_id=variables["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=variables["AWS_SECRET_ACCESS_KEY"])


def error_code(call, **request) -> str:
    """The S3 error code a call gets, or "ok"."""
    from botocore.exceptions import ClientError

    try:
        call(**request)
    except ClientError as error:
        return error.response["Error"]["Code"]
    return "ok"


def storage_for(stack: Dict[str, Any], variables: Dict[str, str]) -> Storage:
    root = f"s3://{stack['outputs']['IoBucket']}/batchfutures"
    return Storage(root, storage_options={"key": variables["AWS_ACCESS_KEY_ID"],
                                          "secret": variables["AWS_SECRET_ACCESS_KEY"],
                                          "client_kwargs": {"region_name": REGION}})


@pytest.mark.slow
def test_the_worker_runs_a_job_under_the_job_role_policy(stack, enforced, as_user):
    # the client writes the job under its policy, as Session does
    client_env = as_user("bf-iam-client")
    client = storage_for(stack, client_env)
    run_id, job_key = "run-" + uuid.uuid4().hex[:8], uuid.uuid4().hex
    # a builtin, so the worker can load it without this test module
    function_url = client.put_function(run_id, serialization.dumps(pow))
    header = {"functions": [function_url], "items": 2, "chunksize": 2, "run_id": run_id,
              "job_key": job_key, **serialization.payload_stamp()}
    job_url = client.job_url(run_id, job_key)
    client.write_inputs(job_url, header, [wire.pack_items([(0, (7, 2), {}),
                                                                     (0, (8, 2), {})])])
    client.write_job_pointer("job-1", job_url)

    # the real worker, as the container runs it, with the job role policy's credentials:
    # probe for an earlier result (a missing key), GET the inputs and the function, PUT the result
    worker_env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    worker_env.update(credentials(client_env["AWS_ENDPOINT_URL"], stack["keys"]["bf-iam-worker"]))
    worker_env.update(AWS_BATCH_JOB_ARRAY_INDEX="0", AWS_BATCH_JOB_ATTEMPT="1")
    done = subprocess.run([sys.executable, "-m", "batchfutures.worker", job_url], env=worker_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "AccessDenied" not in done.stderr

    # the client reads it back, and lists the results and the runs
    assert client.list_results(job_url) == {0}
    _, outcomes = wire.unpack_result(client.read_result(job_url, 0))
    assert [wire.outcome_result(o) for o in outcomes] == [(True, 49), (True, 64)]
    assert client.read_job_pointer("job-1") == job_url
    assert run_id in dict(client.list_runs())
    # a second attempt finds the result (GET of an existing key) and keeps it
    again = subprocess.run([sys.executable, "-m", "batchfutures.worker", job_url], env=worker_env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "already written" in again.stderr, again.stderr
    # (client.delete_run is not run here: see the module docstring on DeleteObjects)


def test_the_job_role_policy_refuses_what_a_worker_never_does(stack, enforced, as_user):
    worker = s3_client(as_user("bf-iam-worker"))
    bucket = stack["outputs"]["IoBucket"]
    run_key = "batchfutures/runs/r1/jobs/k/results/0"
    assert error_code(worker.put_object, Bucket=bucket, Key=run_key, Body=b"x",
                      IfNoneMatch="*") == "ok"
    assert error_code(worker.get_object, Bucket=bucket, Key=run_key) == "ok"
    assert error_code(worker.get_object, Bucket=bucket, Key=run_key + "-missing") == "NoSuchKey"
    assert error_code(worker.list_objects_v2, Bucket=bucket, Prefix="batchfutures/runs/") == "ok"
    # no deletes, nothing outside runs/ (job pointers, check probes, other prefixes)
    assert error_code(worker.delete_object, Bucket=bucket, Key=run_key) == "AccessDenied"
    for key in ("batchfutures/jobs/some-job", "batchfutures/check/x", "elsewhere/x"):
        assert error_code(worker.put_object, Bucket=bucket, Key=key, Body=b"x") == "AccessDenied"
        assert error_code(worker.get_object, Bucket=bucket, Key=key) == "AccessDenied"


def test_the_client_policy_reaches_its_prefix_only(stack, enforced, as_user):
    client = s3_client(as_user("bf-iam-client"))
    bucket = stack["outputs"]["IoBucket"]
    for key in ("batchfutures/jobs/j1", "batchfutures/check/probe", "batchfutures/runs/r/x"):
        assert error_code(client.put_object, Bucket=bucket, Key=key, Body=b"x") == "ok"
        assert error_code(client.get_object, Bucket=bucket, Key=key) == "ok"
        assert error_code(client.delete_object, Bucket=bucket, Key=key) == "ok"
    assert error_code(client.put_object, Bucket=bucket, Key="elsewhere/x", Body=b"x") == "AccessDenied"
    assert error_code(client.get_object, Bucket=bucket, Key="elsewhere/x") == "AccessDenied"
    assert error_code(client.put_bucket_policy, Bucket=bucket, Policy="{}") == "AccessDenied"


def test_batchfutures_checks_bucket_probe_passes_under_the_client_policy_only(stack, enforced,
                                                                               as_user,
                                                                               monkeypatch):
    """`batchfutures check`'s bucket probe: with a signing key, a sealed object under
    <IoPrefix>/runs/ written, read back and its run deleted; without one, PUT, GET, DELETE under
    <IoPrefix>/check/. Its Batch checks are refused by moto under enforcement whatever the policy
    (see the module docstring) and are evaluated in
    test_the_client_policy_allows_the_batch_and_logs_calls."""
    import boto3

    from batchfutures import AWSBatchEnvironment
    from batchfutures.cli.checks import run_checks

    def verdicts(user: str, signed: bool):
        variables = as_user(user)
        if not signed:
            monkeypatch.delenv("BATCHFUTURES_SIGNING_KEY")
        session = boto3.session.Session(aws_access_key_id=variables["AWS_ACCESS_KEY_ID"],
                                        aws_secret_access_key=variables["AWS_SECRET_ACCESS_KEY"],
                                        region_name=REGION)
        env = AWSBatchEnvironment(job_queue=stack["outputs"]["JobQueue"],
                                  io_bucket=stack["outputs"]["IoBucket"],
                                  job_definition=stack["outputs"]["JobDefinition"], session=session)
        return {name: (ok, line) for name, ok, line in run_checks(env)}

    for signed in (True, False):
        client = verdicts("bf-iam-client", signed)
        assert client["credentials"][0] and client["bucket"][0], client
    # the job role may not write check/ (the signed probe writes under runs/, which the job
    # role may: it cannot tell the two roles apart, and is not asked to here)
    worker = verdicts("bf-iam-worker", signed=False)
    assert not worker["bucket"][0] and "Access" in worker["bucket"][1], worker


def allowed(document: Dict[str, Any], action: str, resource: str) -> bool:
    """moto's own evaluation of one identity policy, for calls its server checks against "*"."""
    from moto.iam.access_control import IAMPolicy, PermissionResult

    return IAMPolicy(json.dumps(document)).is_action_permitted(action, resource) \
        == PermissionResult.PERMITTED


def test_the_signing_key_is_readable_by_the_job_role_and_the_client_only(stack):
    secret = stack["outputs"]["SigningSecret"]
    other = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:someone-elses-AbCdEf"
    for document in (stack["job_policy"], stack["client_policy"]):
        assert allowed(document, "secretsmanager:GetSecretValue", secret)
        assert not allowed(document, "secretsmanager:GetSecretValue", other)
        assert not allowed(document, "secretsmanager:PutSecretValue", secret)


def test_the_client_policy_allows_the_batch_and_logs_calls_the_client_makes(stack):
    document, outputs, roles = stack["client_policy"], stack["outputs"], stack["roles"]
    batch = f"arn:aws:batch:{REGION}:{ACCOUNT}"
    stack_definition = f"{batch}:job-definition/{outputs['JobDefinition']}"
    registered = f"{batch}:job-definition/{STACK}_0123456789abcdef01234567"
    job = f"{batch}:job/6e6c6b1c-0000-4000-8000-000000000000"
    for action, resource in [
        ("batch:SubmitJob", outputs["JobQueue"]), ("batch:SubmitJob", stack_definition),
        ("batch:SubmitJob", stack_definition + ":3"), ("batch:SubmitJob", registered + ":1"),
        ("batch:SubmitJob", job), ("batch:TagResource", job),
        ("batch:TagResource", registered + ":1"), ("batch:RegisterJobDefinition", registered),
        ("batch:CancelJob", job), ("batch:TerminateJob", job),
        ("batch:DescribeJobs", "*"), ("batch:ListJobs", "*"), ("batch:DescribeJobQueues", "*"),
        ("batch:DescribeJobDefinitions", "*"), ("batch:DescribeComputeEnvironments", "*"),
        ("ec2:DescribeInstanceTypes", "*"),
        ("pricing:GetProducts", "*"), ("ec2:DescribeSpotPriceHistory", "*"),  # future.cost
        # why a job waits: the stack's queues' snapshots, the account's consumable resources
        ("batch:GetJobQueueSnapshot", outputs["JobQueue"]),
        ("batch:GetJobQueueSnapshot", outputs["MultiNodeJobQueue"]),
        ("batch:DescribeConsumableResource", f"{batch}:consumable-resource/licence"),
        ("batch:SubmitJob", f"{batch}:consumable-resource/licence"),  # consumes=
        ("ecr:DescribeImages", f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/batchfutures-worker"),
        ("iam:PassRole", roles["JobRole"]), ("iam:PassRole", roles["ExecutionRole"]),
        ("logs:GetLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/batch/{STACK}"
                              f":log-stream:{STACK}-worker/default/abc"),
        ("logs:GetLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/batch/job"
                              f":log-stream:{STACK}_0123/default/abc"),
        # echo_output="live": Live Tail sessions of the stack's log group
        ("logs:StartLiveTail", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/batch/{STACK}"),
        ("logs:StartLiveTail", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/batch/{STACK}:*"),
    ]:
        assert allowed(document, action, resource), (action, resource)
    for action, resource in [
        ("batch:SubmitJob", f"{batch}:job-queue/someone-elses-queue"),
        ("batch:GetJobQueueSnapshot", f"{batch}:job-queue/someone-elses-queue"),
        ("batch:GetJobQueueSnapshot", f"arn:aws:batch:eu-north-1:{ACCOUNT}:job-queue/{STACK}-ec2"),
        ("batch:DescribeConsumableResource",
         f"arn:aws:batch:eu-north-1:{ACCOUNT}:consumable-resource/licence"),
        ("batch:UpdateConsumableResource", f"{batch}:consumable-resource/licence"),
        ("batch:ListConsumableResources", "*"),
        ("batch:RegisterJobDefinition", f"{batch}:job-definition/{outputs['JobDefinition']}"),
        ("batch:CreateComputeEnvironment", f"{batch}:compute-environment/x"),
        ("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/Admin"),
        ("ecr:DescribeImages", f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/someone-elses"),
        ("ecr:BatchGetImage", f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/batchfutures-worker"),
        ("logs:GetLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/other:log-stream:x"),
        # Batch's shared group would show every job of the account: never tailed
        ("logs:StartLiveTail", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/batch/job"),
        ("logs:StartLiveTail", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/other"),
        ("logs:StartLiveTail", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/batch/{STACK}-x"),
        ("logs:StopLiveTail", "*"),
        # another stack's definitions (its worker, its registered ones) and their logs
        ("batch:SubmitJob", f"{batch}:job-definition/other-worker:1"),
        ("batch:SubmitJob", f"{batch}:job-definition/{STACK}-worker-x-worker:1"),
        ("batch:SubmitJob", f"{batch}:job-definition/batchfutures-0123456789abcdef01234567:1"),
        ("batch:SubmitJob", f"{batch}:job-definition/other_0123456789abcdef01234567:1"),
        ("batch:RegisterJobDefinition", f"{batch}:job-definition/other_0123"),
        ("logs:GetLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/batch/job"
                              f":log-stream:other-worker/default/abc"),
        ("logs:GetLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/batch/{STACK}"
                              f":log-stream:other_0123/default/abc"),
    ]:
        assert not allowed(document, action, resource), (action, resource)


def test_a_missing_key_is_404_because_list_bucket_needs_no_prefix(stack):
    """S3 answers 404 for a missing key only to a caller allowed s3:ListBucket on the bucket, and
    a GET or HEAD carries no s3:prefix: so the grant must have no s3:prefix condition (the
    template once had one, and every probe of a result not yet written would have been 403)."""
    bucket_arn = f"arn:aws:s3:::{stack['outputs']['IoBucket']}"
    for document in (stack["job_policy"], stack["client_policy"]):
        grants = [statement for statement in document["Statement"]
                  if statement["Effect"] == "Allow" and "s3:ListBucket" in as_list(statement["Action"])
                  and bucket_arn in as_list(statement["Resource"])]
        assert grants and all("Condition" not in grant for grant in grants), grants
        assert allowed(document, "s3:ListBucket", bucket_arn)


# -- SSE-KMS: the KmsKeyArn parameter ---------------------------------------------------------
KMS_STACK = "bf-iam-kms"
SSE_KMS_ACTIONS = {"kms:GenerateDataKey", "kms:Decrypt"}


@pytest.fixture(scope="module")
def kms_key(admin) -> str:
    return admin("kms").create_key(Description="batchfutures payloads")["KeyMetadata"]["Arn"]


@pytest.fixture(scope="module")
def kms_stack(admin, network, kms_key) -> Dict[str, Any]:
    # each principal's user carries its own policy and the payload key policy, as docs/aws.md
    # says to attach them
    return deploy(admin, network, KMS_STACK, {"bf-iam-kms-worker": ("job", "payload_key"),
                                              "bf-iam-kms-client": ("client", "payload_key")},
                  KmsKeyArn=kms_key)


def kms_statements(document: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [s for s in document["Statement"]
            if any(a.lower().startswith("kms:") for a in as_list(s["Action"]))]


def test_kms_key_arn_grants_the_job_role_and_the_clients_the_sse_kms_actions_on_that_key(
        kms_stack, kms_key, admin):
    policy_arn = f"arn:aws:iam::{ACCOUNT}:policy/{KMS_STACK}-payload-key"
    assert kms_stack["outputs"]["PayloadKeyPolicy"] == policy_arn
    assert kms_stack["job_role_attached"] == [policy_arn]  # the stack attaches it to the job role
    # and to the execution role, which reads a SigningSecretArn encrypted with the key for ECS
    attached = admin("iam").list_attached_role_policies(
        RoleName=kms_stack["physical"]["ExecutionRole"])["AttachedPolicies"]
    assert [p["PolicyArn"] for p in attached] == [policy_arn]
    # what each principal holds: its own policy and the payload key policy
    for own in (kms_stack["job_policy"], kms_stack["client_policy"]):
        assert kms_statements(own) == []
        merged = {"Version": "2012-10-17",
                  "Statement": own["Statement"] + kms_stack["payload_key_policy"]["Statement"]}
        (grant,) = kms_statements(merged)
        assert grant["Effect"] == "Allow", grant
        # only through S3 (SSE-KMS) and Secrets Manager (a secret under the key)
        assert grant["Condition"] == {"StringEquals": {"kms:ViaService": [
            f"s3.{REGION}.amazonaws.com", f"secretsmanager.{REGION}.amazonaws.com"]}}
        for service in ("s3", "secretsmanager"):
            assert condition_met(grant["Condition"], {"kms:ViaService": f"{service}.{REGION}.amazonaws.com"})
        assert not condition_met(grant["Condition"], {})  # a direct call to KMS
        assert not condition_met(grant["Condition"], {"kms:ViaService": f"lambda.{REGION}.amazonaws.com"})
        assert set(as_list(grant["Action"])) == SSE_KMS_ACTIONS
        assert as_list(grant["Resource"]) == [kms_key]
        for action in SSE_KMS_ACTIONS:  # the SAR: both take a key ARN
            assert SAR[action][0] == ("key",)
            assert RESOURCE_ARNS["key"].format(region=REGION, account=ACCOUNT) in kms_key
            assert allowed(merged, action, kms_key), action
            other_key = kms_key.rsplit("/", 1)[0] + "/00000000-0000-4000-8000-000000000000"
            assert not allowed(merged, action, other_key), action
        for action in ("kms:Encrypt", "kms:ReEncryptFrom", "kms:GenerateDataKeyWithoutPlaintext",
                       "kms:CreateGrant", "kms:ScheduleKeyDeletion", "kms:PutKeyPolicy"):
            assert not allowed(merged, action, kms_key), action


def test_without_kms_key_arn_no_policy_mentions_kms(stack, admin):
    assert "PayloadKeyPolicy" not in stack["outputs"]
    assert "PayloadKeyPolicy" not in stack["physical"]
    assert stack["job_role_attached"] == [] and stack["payload_key_policy"] is None
    for document in (stack["job_policy"], stack["client_policy"]):
        assert "kms" not in json.dumps(document).lower(), document
    names = [p["PolicyName"] for p in admin("iam").list_policies(Scope="Local")["Policies"]]
    assert f"{STACK}-client" in names and f"{STACK}-payload-key" not in names


@pytest.mark.slow
def test_a_job_runs_under_the_payload_key_with_the_policies_docs_aws_md_names(
        kms_stack, kms_key, enforced, as_user):
    """The client's writes and the worker's result carry SSE-KMS under the key (the headers
    AWSBatchEnvironment(kms_key_id=) sends, and BATCHFUTURES_KMS_KEY_ID for the worker), under
    IAM enforcement of the S3 side (moto does not authorize the KMS side: see the docstring)."""
    from batchfutures.awsclients import KMS_VARIABLE

    client_env = as_user("bf-iam-kms-client", kms_stack)
    bucket = kms_stack["outputs"]["IoBucket"]
    client = Storage(f"s3://{bucket}/batchfutures", storage_options={
        "key": client_env["AWS_ACCESS_KEY_ID"], "secret": client_env["AWS_SECRET_ACCESS_KEY"],
        "client_kwargs": {"region_name": REGION},
        "s3_additional_kwargs": {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": kms_key,
                                 "BucketKeyEnabled": True}})
    run_id, job_key = "run-" + uuid.uuid4().hex[:8], uuid.uuid4().hex
    function_url = client.put_function(run_id, serialization.dumps(pow))
    header = {"functions": [function_url], "items": 1, "chunksize": 1, "run_id": run_id,
              "job_key": job_key, **serialization.payload_stamp()}
    job_url = client.job_url(run_id, job_key)
    client.write_inputs(job_url, header, [wire.pack_items([(0, (3, 4), {})])])

    worker_env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    worker_env.update(credentials(client_env["AWS_ENDPOINT_URL"],
                                  kms_stack["keys"]["bf-iam-kms-worker"]))
    worker_env.update({"AWS_BATCH_JOB_ARRAY_INDEX": "0", "AWS_BATCH_JOB_ATTEMPT": "1",
                       KMS_VARIABLE: kms_key})
    done = subprocess.run([sys.executable, "-m", "batchfutures.worker", job_url], env=worker_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    _, outcomes = wire.unpack_result(client.read_result(job_url, 0))
    assert [wire.outcome_result(o) for o in outcomes] == [(True, 81)]

    s3 = s3_client(client_env)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"batchfutures/runs/{run_id}/")
            ["Contents"]]
    assert any("results" in key for key in keys) and len(keys) >= 3, keys
    for key in keys:  # the function, the inputs and the result
        head = s3.head_object(Bucket=bucket, Key=key)
        assert (head["ServerSideEncryption"], head["SSEKMSKeyId"]) == ("aws:kms", kms_key), key


def conditions_of(document: Dict[str, Any], action: str) -> List[Dict[str, Any]]:
    return [s.get("Condition") for s in document["Statement"]
            if s["Effect"] == "Allow" and action in as_list(s["Action"])]


# The operators of the deployed documents, as the IAM User Guide defines them ("IAM JSON policy
# elements: Condition operators"): a value in the request against the policy's values (any of
# them matches); ...IfExists: a key the request lacks is met; without it, not met; a negated
# operator (StringNotLike) is met when the value matches none of them.
_OPERATORS = {
    "StringEquals": lambda value, wanted: value in wanted,
    "StringLike": lambda value, wanted: any(fnmatch.fnmatchcase(value, w) for w in wanted),
    "StringNotLike": lambda value, wanted: not any(fnmatch.fnmatchcase(value, w) for w in wanted),
    "Bool": lambda value, wanted: value.lower() in [w.lower() for w in wanted],
}


def condition_met(condition: Dict[str, Any], context: Dict[str, str]) -> bool:
    """A Condition block of the deployed documents evaluated against a request context (moto's
    evaluator gets none and treats every condition as met): every operator and key must hold."""
    for operator, keys in (condition or {}).items():
        base = operator[:-len("IfExists")] if operator.endswith("IfExists") else operator
        assert base in _OPERATORS, operator
        for key, wanted in keys.items():
            if key not in context:
                if operator.endswith("IfExists"):
                    continue
                return False
            if not _OPERATORS[base](str(context[key]), [str(w) for w in as_list(wanted)]):
                return False
    return True


def test_condition_met_follows_the_iam_operators():
    like = {"StringLike": {"k": ["a/*", "b"]}}
    assert condition_met(like, {"k": "a/x"}) and condition_met(like, {"k": "b"})
    assert not condition_met(like, {"k": "c"}) and not condition_met(like, {})
    unlike = {"StringNotLikeIfExists": {"k": ["root", "0:*"]}}
    assert condition_met(unlike, {}) and condition_met(unlike, {"k": "1000"})
    assert not condition_met(unlike, {"k": "root"}) and not condition_met(unlike, {"k": "0:0"})
    flag = {"BoolIfExists": {"k": "false"}}
    assert condition_met(flag, {}) and condition_met(flag, {"k": "false"})
    assert not condition_met(flag, {"k": "true"})
    assert not condition_met({"Bool": {"k": "false"}}, {})


def test_the_client_policy_conditions_refuse_other_stacks_jobs_and_other_services(stack):
    """The conditions, on the deployed document: PassRole only to Batch/ECS, Cancel/Terminate only
    of jobs tagged with this stack, SubmitJob only with that tag."""
    document = stack["client_policy"]
    (passing,) = conditions_of(document, "iam:PassRole")
    assert condition_met(passing, {"iam:PassedToService": "batch.amazonaws.com"})
    assert condition_met(passing, {"iam:PassedToService": "ecs-tasks.amazonaws.com"})
    for service in ("lambda.amazonaws.com", "ec2.amazonaws.com", "ecs.amazonaws.com"):
        assert not condition_met(passing, {"iam:PassedToService": service}), service
    assert not condition_met(passing, {})
    for action in ("batch:CancelJob", "batch:TerminateJob"):
        (managing,) = conditions_of(document, action)
        assert condition_met(managing, {"aws:ResourceTag/batchfutures:stack": STACK})
        assert not condition_met(managing, {"aws:ResourceTag/batchfutures:stack": "other"})
        assert not condition_met(managing, {})  # a job without the tag
    (submitting,) = conditions_of(document, "batch:SubmitJob")
    assert condition_met(submitting, {"aws:RequestTag/batchfutures:stack": STACK})
    assert not condition_met(submitting, {"aws:RequestTag/batchfutures:stack": "other"})
    assert not condition_met(submitting, {})
    (tagging,) = conditions_of(document, "batch:TagResource")
    ours = {"aws:RequestTag/batchfutures:stack": STACK}
    assert condition_met(tagging, ours)  # on create: no resource tag yet
    assert not condition_met(tagging, {**ours, "aws:ResourceTag/batchfutures:stack": "other"})


def test_a_child_job_is_refused_by_its_missing_tag_alone(stack):
    """An array child's ARN (job/<id>:<index>) is in ManageJobs' resources, but a child carries
    no tags (TagResource and ListTagsForResource: "ARNs for child jobs of array and multi-node
    parallel (MNP) jobs aren't supported"), so the tag condition refuses a stop of it alone; the
    parent, which has the tag, is allowed (batchfutures.childstops sends that instead)."""
    document, batch = stack["client_policy"], f"arn:aws:batch:{REGION}:{ACCOUNT}"
    parent = "6e6c6b1c-0000-4000-8000-000000000000"
    for action in ("batch:CancelJob", "batch:TerminateJob"):
        assert allowed(document, action, f"{batch}:job/{parent}:3")  # the resource matches
        (managing,) = conditions_of(document, action)
        assert not condition_met(managing, {})  # the child: no aws:ResourceTag at all
        assert condition_met(managing, {"aws:ResourceTag/batchfutures:stack": STACK})


FARGATE_QUOTAS = ("L-3032A538", "L-36FBB829")  # oomretry.FARGATE_VCPU_QUOTAS: on demand, Spot


def test_the_fargate_quota_statement_names_the_quotas_oomretry_reads():
    from batchfutures.oomretry import FARGATE_VCPU_QUOTAS

    assert sorted(FARGATE_VCPU_QUOTAS.values()) == sorted(FARGATE_QUOTAS)
    template = setup.load_template()
    statements = [s for s in template["Resources"]["ClientPolicy"]["Properties"][
        "PolicyDocument"]["Statement"] if "servicequotas:GetServiceQuota" in as_list(s["Action"])]
    assert [s["Sid"] for s in statements] == ["ReadFargateQuotas"]
    (statement,) = statements
    assert as_list(statement["Action"]) == ["servicequotas:GetServiceQuota"]
    assert "Condition" not in statement
    assert sorted(resolved_arn(r) for r in statement["Resource"]) == [
        f"arn:aws:servicequotas:{REGION}:{ACCOUNT}:fargate/{code}" for code in sorted(FARGATE_QUOTAS)]
    for name, document in policy_documents(template):  # no other policy reads quotas
        if name != "ClientPolicy":
            assert "servicequotas" not in json.dumps(document), name


def test_the_client_policy_reads_the_two_fargate_quotas_and_no_other(stack):
    """GetServiceQuota (retry_on_oom's cap on Fargate) on the deployed client policy, with moto's
    evaluator: fargate's two vCPU quotas in the stack's account and region, nothing else."""
    document = stack["client_policy"]
    quotas = f"arn:aws:servicequotas:{REGION}:{ACCOUNT}"
    for code in FARGATE_QUOTAS:
        assert allowed(document, "servicequotas:GetServiceQuota", f"{quotas}:fargate/{code}")
        # reading is all: no increase request, no other Service Quotas action
        for action in ("servicequotas:RequestServiceQuotaIncrease",
                       "servicequotas:ListServiceQuotas", "servicequotas:GetAWSDefaultServiceQuota"):
            assert not allowed(document, action, f"{quotas}:fargate/{code}"), action
    for other in (f"{quotas}:fargate/L-790AF391",  # another Fargate quota
                  f"{quotas}:ec2/L-1216C47A",  # another service's (EC2 on-demand vCPUs)
                  f"{quotas}:batch/L-3032A538",  # the same code under another service
                  f"arn:aws:servicequotas:eu-west-1:{ACCOUNT}:fargate/L-3032A538",
                  f"arn:aws:servicequotas:{REGION}:111122223333:fargate/L-3032A538"):
        assert not allowed(document, "servicequotas:GetServiceQuota", other), other
    assert not allowed(stack["job_policy"], "servicequotas:GetServiceQuota",
                       f"{quotas}:fargate/{FARGATE_QUOTAS[0]}")


def test_every_trust_policy_names_the_account(stack):
    template = setup.load_template()
    roles = {n: r for n, r in template["Resources"].items() if r["Type"] == "AWS::IAM::Role"}
    assert set(roles) == {"JobRole", "InstanceRole", "ExecutionRole"}
    for name, role in roles.items():
        for statement in role["Properties"]["AssumeRolePolicyDocument"]["Statement"]:
            keys = {k: v for operator in statement["Condition"].values() for k, v in operator.items()}
            assert keys["aws:SourceAccount"] == {"Ref": "AWS::AccountId"}, name


def test_the_clients_own_names_and_tags_are_the_ones_the_policy_allows(stack):
    """AWSBatchEnvironment(stack=...) (BATCHFUTURES_STACK, the Stack output) registers
    <stack>_<hash> definitions and tags its jobs batchfutures:stack=<stack>: the deployed client
    policy allows exactly those, and not a client's without stack= (batchfutures-<hash>)."""
    import boto3

    from batchfutures import AWSBatchEnvironment
    from batchfutures.jobdefinitions import definition_name, definition_properties

    assert stack["outputs"]["Stack"] == STACK
    document, batch = stack["client_policy"], f"arn:aws:batch:{REGION}:{ACCOUNT}"
    properties = definition_properties("example/image:1")
    ours = f"{batch}:job-definition/{definition_name(properties, STACK)}"
    unscoped = f"{batch}:job-definition/{definition_name(properties)}"
    assert allowed(document, "batch:RegisterJobDefinition", ours)
    assert allowed(document, "batch:SubmitJob", ours + ":1")
    assert not allowed(document, "batch:RegisterJobDefinition", unscoped)
    assert not allowed(document, "batch:SubmitJob", unscoped + ":1")
    session = boto3.session.Session(aws_access_key_id="x", aws_secret_access_key="y",
                                    region_name=REGION)
    env = AWSBatchEnvironment(job_queue=stack["outputs"]["JobQueue"], io_bucket="bucket",
                              image="example/image:1", stack=STACK, session=session)
    (submitting,) = conditions_of(document, "batch:SubmitJob")
    assert condition_met(submitting, {f"aws:RequestTag/{k}": v for k, v in env.job_tags().items()})
    with pytest.raises(Exception, match="stack name"):
        AWSBatchEnvironment(job_queue="q", io_bucket="bucket", image="i", stack="has_underscore",
                            session=session)


# -- RegisterJobDefinition: what a holder of the client policy may register --------------------
def register_contexts(request: Dict[str, Any]) -> List[Dict[str, str]]:
    """The request context of a RegisterJobDefinition, one per container (every node group's):
    the SAR's batch: keys for RegisterJobDefinition, each present only when the request sets
    what it names, and the request's tags (aws:RequestTag/<key>)."""
    tags = {f"aws:RequestTag/{key}": value for key, value in (request.get("tags") or {}).items()}
    containers = [request["containerProperties"]] if "containerProperties" in request else [
        group["container"] for group in request["nodeProperties"]["nodeRangeProperties"]]
    contexts = []
    for container in containers:
        context = dict(tags, **{"batch:Image": container["image"]})
        if "privileged" in container:
            context["batch:Privileged"] = str(bool(container["privileged"])).lower()
        if "user" in container:
            context["batch:User"] = container["user"]
        logs = container.get("logConfiguration")
        if logs:
            context["batch:LogDriver"] = logs["logDriver"]
            for option, key in (("awslogs-group", "batch:AWSLogsGroup"),
                                ("awslogs-region", "batch:AWSLogsRegion")):
                if option in logs.get("options", {}):
                    context[key] = logs["options"][option]
        contexts.append(context)
    return contexts


def registration_allowed(document: Dict[str, Any], request: Dict[str, Any]) -> bool:
    """RegisterJobDefinition's conditions for every container, and, as a request with tags is
    also authorized as batch:TagResource, TagResource's."""
    (registering,) = conditions_of(document, "batch:RegisterJobDefinition")
    (tagging,) = conditions_of(document, "batch:TagResource")
    contexts = register_contexts(request)
    return all(condition_met(registering, c) and condition_met(tagging, c) for c in contexts)


class Registrar:
    """moto's Batch for reading the stack's definitions; RegisterJobDefinition recorded, not sent."""

    def __init__(self, batch: Any) -> None:
        self.batch, self.requests = batch, []
        self.meta = batch.meta

    def register_job_definition(self, **request: Any) -> Dict[str, Any]:
        self.requests.append(request)
        return {"jobDefinitionArn": f"arn:aws:batch:{REGION}:{ACCOUNT}:job-definition/"
                                    f"{request['jobDefinitionName']}:1"}

    def describe_job_definitions(self, **request: Any) -> Dict[str, Any]:
        return self.batch.describe_job_definitions(**request)


STACK_IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/batchfutures-worker:py3.11"


def test_batchfutures_own_registrations_pass_the_client_policy(stack, admin):
    """image= (EC2, Fargate, nodes=), secrets= and nodes= from the stack's definition, as the
    client sends them with stack=: RegisterJobDefinition's and TagResource's conditions hold."""
    from batchfutures.jobdefinitions import (
        definition_with_secrets,
        ensure_job_definition,
        multinode_definition_from,
    )

    registrar, roles = Registrar(admin("batch")), stack["roles"]
    options = {"job_role_arn": roles["JobRole"], "execution_role_arn": roles["ExecutionRole"]}
    ensure_job_definition(registrar, STACK_IMAGE, stack=STACK, **options)
    ensure_job_definition(registrar, STACK_IMAGE, stack=STACK, platform="FARGATE", **options)
    ensure_job_definition(registrar, STACK_IMAGE, stack=STACK, nodes=3, **options)
    ensure_job_definition(registrar, STACK_IMAGE.replace(":py3.11", "@sha256:" + "0" * 64),
                          stack=STACK, **options)
    worker = stack["outputs"]["JobDefinition"]
    secret = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{STACK}/jobs/db-AbCdEf"
    definition_with_secrets(registrar, worker, {"DB": secret}, stack=STACK)
    multinode_definition_from(registrar, worker, stack=STACK)
    assert len(registrar.requests) == 6
    document = stack["client_policy"]
    for request in registrar.requests:
        assert registration_allowed(document, request), request
        assert allowed(document, "batch:RegisterJobDefinition",
                       f"arn:aws:batch:{REGION}:{ACCOUNT}:job-definition/{request['jobDefinitionName']}")


def _good_request() -> Dict[str, Any]:
    from batchfutures.jobdefinitions import definition_properties, with_stack_defaults

    return with_stack_defaults(definition_properties(STACK_IMAGE), STACK, REGION)


def _changed(container: Dict[str, Any], tags: Any = None) -> Dict[str, Any]:
    request = _good_request()
    request["containerProperties"].update(container)
    if tags is not None:
        request["tags"] = tags
    return request


@pytest.mark.parametrize("why, request_of", [
    ("privileged", lambda: _changed({"privileged": True})),
    ("runs as root", lambda: _changed({"user": "root"})),
    ("runs as uid 0", lambda: _changed({"user": "0:0"})),
    ("another log group", lambda: _changed({"logConfiguration": {
        "logDriver": "awslogs", "options": {"awslogs-group": "/aws/batch/job"}}})),
    ("another log driver", lambda: _changed({"logConfiguration": {
        "logDriver": "splunk", "options": {"awslogs-group": f"/aws/batch/{STACK}"}}})),
    ("no log configuration (Batch's /aws/batch/job)", lambda: _changed({"logConfiguration": None})),
    ("another image", lambda: _changed({"image": "docker.io/library/python:3.11"})),
    ("another repository of the account",
     lambda: _changed({"image": STACK_IMAGE.replace("batchfutures-worker", "admin-tools")})),
    ("without the stack tag (TagResource)", lambda: _changed({}, tags={"batchfutures:managed": "true"})),
    ("another stack's tag", lambda: _changed({}, tags={"batchfutures:stack": "other"})),
])
def test_the_client_policy_refuses_definitions_that_could_take_the_hosts(stack, why, request_of):
    request = request_of()
    if request["containerProperties"].get("logConfiguration", True) is None:
        del request["containerProperties"]["logConfiguration"]
    document = stack["client_policy"]
    assert registration_allowed(document, _good_request())  # the same request, unchanged, passes
    assert not registration_allowed(document, request), why


def test_a_privileged_node_group_refuses_the_whole_multinode_definition(stack):
    from batchfutures.jobdefinitions import definition_properties, with_stack_defaults

    request = with_stack_defaults(definition_properties(STACK_IMAGE, nodes=2), STACK, REGION)
    good = request["nodeProperties"]["nodeRangeProperties"][0]
    bad = dict(good, targetNodes="1:", container=dict(good["container"], privileged=True))
    request["nodeProperties"]["nodeRangeProperties"] = [dict(good, targetNodes="0:0"), bad]
    assert not registration_allowed(stack["client_policy"], request)


def test_allowed_images_and_image_uri_widen_or_move_the_image_condition(admin, network):
    """AllowedImages adds patterns beside the stack's repository; ImageUri replaces it."""
    from batchfutures.jobdefinitions import definition_properties, with_stack_defaults

    team = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/team/*"
    own_uri = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/ours/worker:2"
    for name, parameters, good, bad in [
        ("bf-iam-allowed", {"AllowedImages": team},
         [STACK_IMAGE, team.replace("*", "trainer:1")], ["docker.io/library/python:3.11"]),
        ("bf-iam-uri", {"ImageUri": own_uri}, [own_uri],
         [STACK_IMAGE, own_uri.replace(":2", ":3")]),
    ]:
        outputs, _ = setup.create_stack(admin, network, name, setup.load_template(), **parameters)
        document = managed_policy_document(admin("iam"), f"arn:aws:iam::{ACCOUNT}:policy/{name}-client")
        for image, expected in [(i, True) for i in good] + [(i, False) for i in bad]:
            request = with_stack_defaults(definition_properties(image), name, REGION)
            assert registration_allowed(document, request) is expected, (name, image)


def test_warm_queues_are_the_stacks_own_for_the_client_and_the_job_role(stack):
    """keepalive= pools make, use and delete <stack>-warm-* queues (warmpool.queue_base); the
    workers (the job role) only take, hold and answer calls on them."""
    from batchfutures.warmpool import queue_base

    base = queue_base(STACK, "run-1234abcd", "k0")
    assert base.startswith(f"{STACK}-warm-")
    queue = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{base}-work"
    other = f"arn:aws:sqs:{REGION}:{ACCOUNT}:someone-elses-queue"
    client_actions = ("sqs:CreateQueue", "sqs:TagQueue", "sqs:ListQueueTags", "sqs:GetQueueUrl",
                      "sqs:SendMessage", "sqs:ReceiveMessage", "sqs:DeleteMessage",
                      "sqs:DeleteQueue")
    worker_actions = ("sqs:ReceiveMessage", "sqs:ChangeMessageVisibility", "sqs:DeleteMessage",
                      "sqs:SendMessage")
    for action in client_actions:
        assert allowed(stack["client_policy"], action, queue), action
        assert not allowed(stack["client_policy"], action, other), action
    for action in worker_actions:
        assert allowed(stack["job_policy"], action, queue), action
        assert not allowed(stack["job_policy"], action, other), action
    for action in ("sqs:CreateQueue", "sqs:DeleteQueue", "sqs:SetQueueAttributes"):
        assert not allowed(stack["job_policy"], action, queue), action
    assert not allowed(stack["client_policy"], "sqs:SetQueueAttributes", queue)
    # cleanup lists queues by name (no resource-level permission), the workers do not
    assert allowed(stack["client_policy"], "sqs:ListQueues", "*")
    assert not allowed(stack["job_policy"], "sqs:ListQueues", "*")
