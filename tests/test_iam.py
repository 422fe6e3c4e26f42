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
  (<IoPrefix>/runs/* for the worker, <IoPrefix>/* for the client) is really enforced.
- Secrets Manager: moto authorizes it against Resource "*" only, so a statement scoped to one
  secret is refused by moto's server even where AWS allows it.
- Batch: moto names a Batch request's action after its URL in lower case
  (batch:describejobqueues), which no policy matches, so under enforcement moto refuses every
  Batch call, allowed or not.
  Both are evaluated instead with moto's own policy evaluator (moto.iam.access_control.IAMPolicy)
  against the actions and ARNs the real calls name.
- Conditions: moto's evaluator gets no request context, and it treats a condition on a key the
  request lacks as met. The template's client and job policies have no conditions (docs/aws.md
  says why), so nothing is lost here, but moto cannot show a condition's effect.
- S3's 404-or-403 for a missing key: moto always answers 404. AWS answers 404 only to a caller
  allowed s3:ListBucket on the bucket, judged without any s3:prefix (a GET carries none): checked
  on the deployed documents, a grant of s3:ListBucket on the bucket with no condition.
- DeleteObjects (what s3fs's rm sends, so Storage.delete and the client's cleanup): moto
  authorizes it as s3:DeleteObject on the bucket ARN, where AWS checks each key's object ARN, so
  a prefix-scoped grant is refused there. The client's deletes are checked one key at a time
  (DeleteObject, the same action on AWS). Note that s3fs reports a refused key of a bulk delete
  without raising.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import test_setup_resources as setup

from batchfutures import serialization
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
_S3_COMMON = {"s3:AccessGrantsInstanceArn", "s3:authType", "s3:ResourceAccount", "s3:signatureAge",
              "s3:signatureversion", "s3:TlsVersion", "s3:x-amz-content-sha256"}
SAR: Dict[str, Tuple[Tuple[str, ...], frozenset]] = {
    "batch:SubmitJob": (("job", "job-queue", "job-definition", "job-definition-revision"),
                        frozenset({"batch:ShareIdentifier", "batch:EKSImage", "batch:EKSNamespace",
                                   "aws:RequestTag/${TagKey}", "aws:TagKeys"})),
    "batch:TagResource": (("job", "job-definition-revision", "job-queue", "compute-environment",
                           "scheduling-policy"),
                          frozenset({"aws:RequestTag/${TagKey}", "aws:TagKeys"})),
    "batch:RegisterJobDefinition": (("job-definition",), frozenset({
        "aws:ResourceTag/${TagKey}", "batch:User", "batch:Privileged", "batch:Image",
        "batch:LogDriver", "batch:AWSLogsGroup", "batch:AWSLogsRegion",
        "batch:AWSLogsStreamPrefix", "batch:AWSLogsCreateGroup", "aws:RequestTag/${TagKey}",
        "aws:TagKeys"})),
    "batch:CancelJob": (("job",), frozenset()),
    "batch:TerminateJob": (("job",), frozenset()),
    "batch:DescribeJobs": ((), frozenset()),
    "batch:ListJobs": ((), frozenset()),
    "batch:DescribeJobQueues": ((), frozenset()),
    "batch:DescribeJobDefinitions": ((), frozenset()),
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
    "logs:CreateLogStream": (("log-stream",), frozenset()),
    "logs:PutLogEvents": (("log-stream",), frozenset()),
    "ecr:GetAuthorizationToken": ((), frozenset()),
    "ecr:BatchGetImage": (("repository",), frozenset()),
    "ecr:GetDownloadUrlForLayer": (("repository",), frozenset()),
    "ecr:BatchCheckLayerAvailability": (("repository",), frozenset()),
    "iam:PassRole": (("role",), frozenset({"iam:AssociatedResourceArn", "iam:PassedToService"})),
    "sts:AssumeRole": (("role",), frozenset()),
}
# the ARN shape of each resource type (the SAR's "Resource types" tables), as a prefix test
RESOURCE_ARNS = {
    "job": ":batch:{region}:{account}:job/",
    "compute-environment": ":batch:{region}:{account}:compute-environment/",
    "scheduling-policy": ":batch:{region}:{account}:scheduling-policy/",
    "job-queue": ":batch:{region}:{account}:job-queue/",
    "job-definition": ":batch:{region}:{account}:job-definition/",
    "job-definition-revision": ":batch:{region}:{account}:job-definition/",
    "object": ":s3:::", "bucket": ":s3:::", "Secret": ":secretsmanager:{region}:{account}:secret:",
    "parameter": ":ssm:{region}:{account}:parameter/",
    "log-stream": ":logs:{region}:{account}:log-group:",
    "repository": ":ecr:{region}:{account}:repository/", "role": ":iam::{account}:role/",
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
                        assert key in GLOBAL_KEYS or key in keys, (
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


# -- 2. enforced on moto's server -------------------------------------------------------------
@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="module")
def admin(moto_url):
    import boto3

    session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                    region_name=REGION)
    return lambda service: session.client(service, endpoint_url=moto_url)


@pytest.fixture(scope="module")
def stack(admin) -> Dict[str, Any]:
    outputs, physical = setup.create_stack(admin, setup.make_network(admin), STACK,
                                           setup.load_template())
    iam = admin("iam")
    (name,) = iam.list_role_policies(RoleName=physical["JobRole"])["PolicyNames"]
    job_policy = setup.policy_document(iam.get_role_policy(RoleName=physical["JobRole"],
                                                           PolicyName=name))
    client_arn = f"arn:aws:iam::{ACCOUNT}:policy/{STACK}-client"
    version = iam.get_policy(PolicyArn=client_arn)["Policy"]["DefaultVersionId"]
    document = iam.get_policy_version(PolicyArn=client_arn, VersionId=version)["PolicyVersion"][
        "Document"]
    client_policy = setup.policy_document({"PolicyDocument": document})
    # the worker and the client each get a user carrying exactly that policy
    keys = {}
    for user, document in (("bf-iam-worker", job_policy), ("bf-iam-client", client_policy)):
        iam.create_user(UserName=user)
        iam.put_user_policy(UserName=user, PolicyName="batchfutures",
                            PolicyDocument=json.dumps(document))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        keys[user] = (key["AccessKeyId"], key["SecretAccessKey"])
    roles = {logical: iam.get_role(RoleName=physical[logical])["Role"]["Arn"]
             for logical in ("JobRole", "ExecutionRole")}
    return {"outputs": outputs, "physical": physical, "job_policy": job_policy,
            "client_policy": client_policy, "keys": keys, "roles": roles}


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
    def switch(user: str) -> Dict[str, str]:
        variables = credentials(moto_url, stack["keys"][user])
        monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
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
    client.write_inputs(job_url, header, [serialization.pack_items([(0, (7, 2), {}),
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
    _, outcomes = serialization.unpack_result(client.read_result(job_url, 0))
    assert [serialization.outcome_result(o) for o in outcomes] == [(True, 49), (True, 64)]
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
                                                                               as_user):
    """`batchfutures check`'s bucket probe (PUT, GET, DELETE under <IoPrefix>/check/); its Batch
    checks are refused by moto under enforcement whatever the policy (see the module docstring)
    and are evaluated in test_the_client_policy_allows_the_batch_and_logs_calls."""
    import boto3

    from batchfutures import AWSBatchEnvironment
    from batchfutures.checks import run_checks

    def verdicts(user: str):
        variables = as_user(user)
        session = boto3.session.Session(aws_access_key_id=variables["AWS_ACCESS_KEY_ID"],
                                        aws_secret_access_key=variables["AWS_SECRET_ACCESS_KEY"],
                                        region_name=REGION)
        env = AWSBatchEnvironment(job_queue=stack["outputs"]["JobQueue"],
                                  io_bucket=stack["outputs"]["IoBucket"],
                                  job_definition=stack["outputs"]["JobDefinition"], session=session)
        return {name: (ok, line) for name, ok, line in run_checks(env)}

    client = verdicts("bf-iam-client")
    assert client["credentials"][0] and client["bucket"][0], client
    worker = verdicts("bf-iam-worker")  # the job role may not write check/
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
    registered = f"{batch}:job-definition/batchfutures-0123456789abcdef01234567"
    job = f"{batch}:job/6e6c6b1c-0000-4000-8000-000000000000"
    for action, resource in [
        ("batch:SubmitJob", outputs["JobQueue"]), ("batch:SubmitJob", stack_definition),
        ("batch:SubmitJob", stack_definition + ":3"), ("batch:SubmitJob", registered + ":1"),
        ("batch:SubmitJob", job), ("batch:TagResource", job),
        ("batch:TagResource", registered + ":1"), ("batch:RegisterJobDefinition", registered),
        ("batch:CancelJob", job), ("batch:TerminateJob", job),
        ("batch:DescribeJobs", "*"), ("batch:ListJobs", "*"), ("batch:DescribeJobQueues", "*"),
        ("batch:DescribeJobDefinitions", "*"),
        ("iam:PassRole", roles["JobRole"]), ("iam:PassRole", roles["ExecutionRole"]),
        ("logs:GetLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/batch/{STACK}"
                              f":log-stream:{STACK}-worker/default/abc"),
    ]:
        assert allowed(document, action, resource), (action, resource)
    for action, resource in [
        ("batch:SubmitJob", f"{batch}:job-queue/someone-elses-queue"),
        ("batch:RegisterJobDefinition", f"{batch}:job-definition/{outputs['JobDefinition']}"),
        ("batch:CreateComputeEnvironment", f"{batch}:compute-environment/x"),
        ("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/Admin"),
        ("logs:GetLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/other:log-stream:x"),
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
