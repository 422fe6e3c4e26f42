"""Which environment BatchExecutor runs on: an instance, a mapping, or the process environment."""

import os
import subprocess
import sys
import textwrap

import pytest

from batchfutures import AWSBatchEnvironment, BatchExecutor, ConfigurationError, LocalEnvironment
from batchfutures.environments import choose_region, queue_region_conflict, resolve_environment


@pytest.mark.slow
def test_no_environment_means_the_embedded_default():
    executor = BatchExecutor()
    try:
        assert isinstance(executor.environment, LocalEnvironment)
        # conftest points BATCHFUTURES_WORKDIR at a private folder: the default honours it
        assert str(executor.environment.workdir) == str(
            os.path.realpath(os.environ["BATCHFUTURES_WORKDIR"]))
        assert executor.submit(sum, [1, 2, 3]).result(timeout=60) == 6
    finally:
        executor.shutdown()


def test_a_mapping_means_aws():
    env = resolve_environment({"job_queue": "q", "job_definition": "d:1", "io_bucket": "bucket",
                               "region_name": "us-east-1"})
    assert isinstance(env, AWSBatchEnvironment)
    assert (env.job_queue, env.job_definition, env.io_bucket) == ("q", "d:1", "bucket")
    assert env.storage.root_url == "s3://bucket/batchfutures"


def test_the_process_environment_means_aws(monkeypatch):
    monkeypatch.setenv("BATCHFUTURES_JOB_QUEUE", "arn:aws:batch:us-east-1:123456789012:job-queue/q")
    monkeypatch.setenv("BATCHFUTURES_JOB_DEFINITION", "def")
    monkeypatch.setenv("BATCHFUTURES_IO_BUCKET", "bkt")
    monkeypatch.setenv("BATCHFUTURES_IO_PREFIX", "runs-here")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    env = resolve_environment(None)
    assert isinstance(env, AWSBatchEnvironment)
    assert env.storage.root_url == "s3://bkt/runs-here"


@pytest.mark.parametrize("bad", [{"job_queue": "q"}, {"io_bucket": "b", "job_definition": "d"},
                                 {"job_queue": "q", "io_bucket": "b"},
                                 {"job_queue": "q", "io_bucket": "b", "job_definition": "d",
                                  "colour": "red"}, 42])
def test_bad_environments_are_configuration_errors(bad):
    with pytest.raises(ConfigurationError):
        BatchExecutor(bad)


def test_bad_local_settings(tmp_path):
    with pytest.raises(ConfigurationError):
        LocalEnvironment(tmp_path, max_vcpus=0)
    with pytest.raises(ConfigurationError):
        LocalEnvironment(tmp_path, metadata_ttl=0)


@pytest.mark.slow
def test_a_script_with_main_module_functions_and_lambdas(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        from batchfutures import BatchExecutor, LocalEnvironment
        SCALE = 3

        def scaled(x):
            return SCALE * x

        if __name__ == "__main__":
            import sys
            with BatchExecutor(LocalEnvironment(sys.argv[1])) as ex:
                print(list(ex.map(scaled, range(5), chunksize=2)))
                print(ex.submit(lambda: SCALE + 1).result())
    """))
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "work")], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[0, 3, 6, 9, 12]", "4"]


# -- what the user typed, checked when the environment is made (issue 10.6) ---------------------
QUEUE_ARN = "arn:aws:batch:us-east-1:123456789012:job-queue/my-queue"


def aws_environment(**overrides):
    values = dict(job_queue="q", io_bucket="my-bucket", job_definition="d:1",
                  region_name="us-east-1")
    values.update(overrides)
    return AWSBatchEnvironment(**values)


def test_a_missing_variable_is_named_as_the_user_sets_it(monkeypatch):
    monkeypatch.setenv("BATCHFUTURES_JOB_QUEUE", "q")
    with pytest.raises(ConfigurationError) as caught:
        resolve_environment(None)
    message = str(caught.value)
    assert "BATCHFUTURES_IO_BUCKET" in message and "BATCHFUTURES_JOB_DEFINITION" in message
    assert "io_bucket" not in message


@pytest.mark.parametrize("bucket", ["Bad_Bucket!", "ab", "a" * 64, "-bucket", "bucket-",
                                    "my..bucket", "192.168.1.1", "xn--bucket", "bucket/prefix"])
def test_an_invalid_bucket_name_is_refused_when_the_environment_is_made(bucket, monkeypatch):
    with pytest.raises(ConfigurationError, match="io_bucket"):
        aws_environment(io_bucket=bucket)
    monkeypatch.setenv("BATCHFUTURES_JOB_QUEUE", "q")
    monkeypatch.setenv("BATCHFUTURES_JOB_DEFINITION", "d")
    monkeypatch.setenv("BATCHFUTURES_IO_BUCKET", bucket)
    with pytest.raises(ConfigurationError, match="BATCHFUTURES_IO_BUCKET"):
        BatchExecutor(None)


@pytest.mark.parametrize("queue", [
    "arn:aws:batch:us-east-1:123:job-queue/q",  # account of 3 digits
    "arn:aws:batch:us-east-1:123456789012:jobqueue/q",
    "arn:aws:batch:us-east-1:123456789012:job-queue/",
    "arn:aws:s3:::bucket",
    "my queue",
])
def test_a_malformed_job_queue_is_refused(queue):
    with pytest.raises(ConfigurationError, match="job_queue"):
        aws_environment(job_queue=queue)


@pytest.mark.parametrize("definition", ["d", "d:3", "arn:aws:batch:us-east-1:123456789012:job-definition/d",
                                        "arn:aws:batch:us-east-1:123456789012:job-definition/d:7"])
def test_valid_names_and_arns_are_accepted(definition):
    env = aws_environment(job_queue=QUEUE_ARN, io_bucket="s3://my.bucket-1/",
                          job_definition=definition)
    assert (env.job_queue, env.io_bucket, env.job_definition) == (QUEUE_ARN, "my.bucket-1", definition)


def test_a_malformed_job_definition_is_refused():
    with pytest.raises(ConfigurationError, match="job_definition"):
        aws_environment(job_definition="arn:aws:batch:us-east-1:123456789012:job-queue/d")


def test_security_options_are_kept_and_checked():
    env = aws_environment(signing_secret="arn:aws:secretsmanager:us-east-1:123456789012:secret:k",
                          kms_key_id="alias/batchfutures", expected_bucket_owner="123456789012")
    assert env.signing_secret.endswith(":secret:k") and env.expected_bucket_owner == "123456789012"
    assert env.storage_options()["s3_additional_kwargs"] == {
        "ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "alias/batchfutures",
        "BucketKeyEnabled": True}
    assert "s3_additional_kwargs" not in aws_environment().storage_options()
    with pytest.raises(ConfigurationError, match="expected_bucket_owner"):
        aws_environment(expected_bucket_owner="me")
    with pytest.raises(ConfigurationError, match="kms_key_id"):
        aws_environment(kms_key_id="")


@pytest.fixture
def no_aws_setup(monkeypatch, tmp_path):
    """No region, no credentials, no config files, no instance metadata: nothing to find."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_botocore_failures_reach_the_user_as_configuration_errors(no_aws_setup):
    with pytest.raises(ConfigurationError, match="profile_name"):
        AWSBatchEnvironment("q", "my-bucket", "d", profile_name="nope")
    with pytest.raises(ConfigurationError, match="region"):
        AWSBatchEnvironment("q", "my-bucket", "d").client("batch")
    env = aws_environment()
    with pytest.raises(ConfigurationError, match="credentials") as caught:
        _ = env.expected_bucket_owner  # looked up on first use
    assert "expected_bucket_owner=" in str(caught.value)


def test_explained_aws_errors():
    from botocore.exceptions import ClientError, NoCredentialsError, ParamValidationError

    from batchfutures.environments import explain_aws_error

    def client_error(code):
        return ClientError({"Error": {"Code": code, "Message": "the message"}}, "Op")

    assert "credentials" in explain_aws_error(NoCredentialsError())
    assert "expired" in explain_aws_error(client_error("ExpiredToken"))
    assert explain_aws_error(client_error("AccessDeniedException")) == "not allowed by IAM: the message"
    assert "AWS would refuse" in explain_aws_error(ParamValidationError(report="bad Bucket"))


def test_workers_get_the_s3_guards_through_their_environment():
    from batchfutures.awsclients import worker_storage_options

    env = aws_environment(kms_key_id="alias/k", expected_bucket_owner="123456789012")
    variables = env.worker_environment()
    assert worker_storage_options(variables) == {"s3_additional_kwargs": {
        "ExpectedBucketOwner": "123456789012", "ServerSideEncryption": "aws:kms",
        "SSEKMSKeyId": "alias/k", "BucketKeyEnabled": True}}
    assert worker_storage_options({}) == {}


# -- the first run on AWS: the signing secret's variable, the region (issue 28.1) -----------------
EAST_QUEUE = "arn:aws:batch:us-east-1:123456789012:job-queue/batchfutures-ec2"


@pytest.mark.parametrize("given, session, environ, config, queue, expected", [
    ("eu-west-1", "us-west-2", {"AWS_REGION": "ap-south-1"}, "sa-east-1", EAST_QUEUE,
     ("eu-west-1", "region_name=")),
    (None, "us-west-2", {"AWS_REGION": "ap-south-1"}, "us-west-2", EAST_QUEUE,
     ("us-west-2", "the session")),
    # AWS_REGION alone: boto3's Session().region_name is None, the CLI v2 and the SDKs read it
    (None, None, {"AWS_REGION": "us-east-1"}, None, "q", ("us-east-1", "AWS_REGION")),
    (None, None, {"AWS_DEFAULT_REGION": "us-east-1"}, "us-east-1", "q",
     ("us-east-1", "AWS_DEFAULT_REGION")),
    (None, None, {"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "us-east-1"}, "us-east-1", "q",
     ("eu-west-1", "AWS_REGION")),  # the AWS CLI v2's order
    (None, None, {"AWS_REGION": ""}, "eu-central-1", EAST_QUEUE,
     ("eu-central-1", "the AWS config file")),
    (None, None, {}, None, EAST_QUEUE, ("us-east-1", "the job queue ARN")),
    (None, None, {}, None, "batchfutures-ec2", (None, "")),  # a name says no region
])
def test_the_region_is_chosen_in_order(given, session, environ, config, queue, expected):
    assert choose_region(given, session, environ, config, queue) == expected


@pytest.mark.parametrize("region, source, queue, fix", [
    ("us-east-1", "AWS_DEFAULT_REGION", EAST_QUEUE, None),
    (None, "", EAST_QUEUE, None),
    ("eu-west-1", "AWS_DEFAULT_REGION", "batchfutures-ec2", None),  # a name: any region
    ("eu-west-1", "AWS_REGION", EAST_QUEUE, "set AWS_REGION=us-east-1"),
    ("eu-west-1", "the AWS config file", EAST_QUEUE,
     "set AWS_DEFAULT_REGION=us-east-1 or pass region_name='us-east-1'"),
    ("eu-west-1", "region_name=", EAST_QUEUE, "pass region_name='us-east-1'"),
])
def test_a_queue_arn_of_another_region_is_refused(region, source, queue, fix):
    conflict = queue_region_conflict(region, source, queue)
    assert (conflict is None) == (fix is None)
    if fix:
        assert conflict.endswith(fix) and f"is in us-east-1 but the region is {region}" in conflict


def test_a_queue_arn_gives_the_region_when_nothing_else_does(monkeypatch, tmp_path):
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    env = aws_environment(job_queue=EAST_QUEUE, region_name=None)
    assert (env.region_name, env.region_source) == ("us-east-1", "the job queue ARN")
    assert env.client("batch").meta.region_name == "us-east-1"
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    with pytest.raises(ConfigurationError, match="set AWS_REGION=us-east-1"):
        aws_environment(job_queue=EAST_QUEUE, region_name=None)


SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:batchfutures/signing-key-AbCdEf"


def test_the_signing_secret_comes_from_its_variable(monkeypatch):
    monkeypatch.setenv("BATCHFUTURES_JOB_QUEUE", EAST_QUEUE)
    monkeypatch.setenv("BATCHFUTURES_JOB_DEFINITION", "batchfutures-worker")
    monkeypatch.setenv("BATCHFUTURES_IO_BUCKET", "bkt")
    monkeypatch.setenv("BATCHFUTURES_SIGNING_SECRET", SECRET_ARN)
    env = resolve_environment(None)
    assert env.signing_secret == SECRET_ARN
    assert env.storage.signer.source == f"secretsmanager:{SECRET_ARN}"
    assert resolve_environment({"job_queue": "q", "job_definition": "d", "io_bucket": "bkt",
                                "signing_secret": "batchfutures/signing-key",
                                "region_name": "us-east-1"}).signing_secret == \
        "batchfutures/signing-key"


@pytest.mark.parametrize("secret", ["", "arn:aws:secretsmanager:us-east-1:123:secret:x",
                                    "has space", "arn:aws:s3:::bucket", "x" * 513])
def test_a_malformed_signing_secret_is_refused_in_the_users_words(secret, monkeypatch):
    with pytest.raises(ConfigurationError, match="signing_secret"):
        aws_environment(signing_secret=secret)
    monkeypatch.setenv("BATCHFUTURES_JOB_QUEUE", "q")
    monkeypatch.setenv("BATCHFUTURES_JOB_DEFINITION", "d")
    monkeypatch.setenv("BATCHFUTURES_IO_BUCKET", "bkt")
    monkeypatch.setenv("BATCHFUTURES_SIGNING_SECRET", secret)
    if secret:  # an empty variable counts as unset
        with pytest.raises(ConfigurationError, match="BATCHFUTURES_SIGNING_SECRET"):
            resolve_environment(None)


def test_a_throttled_definition_read_is_read_again_not_given_up(tmp_path):
    """A throttled DescribeJobDefinitions leaves the definition's memory unread for now; the next
    ask reads it (before, the first failure was kept for the environment's whole life)."""
    env = LocalEnvironment(tmp_path / "wd")
    try:
        env.emulator.inject_faults(1.0, operations=["DescribeJobDefinitions"])
        assert env.definition_memory() is None
        env.emulator.inject_faults(0)
        memory = env.definition_memory()
        assert memory is not None and memory > 0
        env.emulator.inject_faults(1.0, operations=["DescribeJobDefinitions"])
        assert env.definition_memory() == memory  # read once it succeeded
    finally:
        env.emulator.inject_faults(0)
