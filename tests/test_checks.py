"""`batchfutures check`'s decisions (issue 28.1): what an image URI is, whether an image's tags fit
this Python, and which fix each failure names. The end-to-end runs are in test_first_run.py
(AWS, in a box) and test_cli.py (the local emulator)."""

import pytest

from batchfutures.cli.checks import (
    EcrImage,
    bucket_fix,
    definition_image,
    describe_key_source,
    image_fix,
    parse_ecr_image,
    python_tag_verdict,
    signing_key_fix,
)

REPO = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize("uri, expected", [
    (f"{REPO}/batchfutures-worker:py3.11",
     EcrImage("123456789012", "us-east-1", "batchfutures-worker", "py3.11", None)),
    (f"{REPO}/team/worker", EcrImage("123456789012", "us-east-1", "team/worker", None, None)),
    (f"{REPO}/worker@{DIGEST}", EcrImage("123456789012", "us-east-1", "worker", None, DIGEST)),
    ("123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com/w:t",
     EcrImage("123456789012", "us-gov-west-1", "w", "t", None)),
    ("123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn/w:t",
     EcrImage("123456789012", "cn-north-1", "w", "t", None)),
    ("ghcr.io/me/worker:py3.11", None),
    ("public.ecr.aws/me/worker:py3.11", None),
    ("python:3.11-slim", None),
    ("batchfutures-local", None),
])
def test_ecr_image_uris(uri, expected):
    assert parse_ecr_image(uri) == expected


def test_an_image_without_tag_or_digest_is_looked_up_as_latest():
    assert parse_ecr_image(f"{REPO}/w").image_id == {"imageTag": "latest"}
    assert parse_ecr_image(f"{REPO}/w@{DIGEST}").image_id == {"imageDigest": DIGEST}


@pytest.mark.parametrize("tags, ok, says", [
    (["py3.11"], True, "tagged py3.11, this client's Python"),
    (["latest", "py3.11", "py3.12"], True, "tagged py3.11"),
    (["py3.12"], False, "tagged py3.12 but this client runs Python 3.11"),
    (["py3.1"], False, "tagged py3.1 but"),  # 3.1 is not 3.11
    (["latest", "v2"], True, "no py<X.Y> tag: its Python was not checked"),
    ([], True, "not checked"),
])
def test_python_tags(tags, ok, says):
    verdict, detail = python_tag_verdict(tags, "3.11")
    assert verdict is ok and says in detail
    if not ok:
        assert "PythonVersion=3.11" in detail and "batchfutures image" in detail


@pytest.mark.parametrize("code, says", [
    ("ImageNotFoundException", "is not in ECR: push it: `batchfutures image --region us-east-1 | sh`"),
    ("RepositoryNotFoundException", "ECR repository w does not exist in account 123456789012"),
    ("AccessDeniedException",
     "ecr:DescribeImages on arn:aws:ecr:us-east-1:123456789012:repository/w"),
    ("ThrottlingException", "ECR DescribeImages failed (ThrottlingException)"),
])
def test_image_failures_name_their_fix(code, says):
    image = parse_ecr_image(f"{REPO}/w:py3.11")
    assert says in image_fix(code, image, f"{REPO}/w:py3.11")


@pytest.mark.parametrize("message, secret, local, says", [
    ("AWSBatchEnvironment needs a signing key for its payloads: ...", None, False,
     "export BATCHFUTURES_SIGNING_SECRET=<the stack's SigningSecret output>"),
    ("cannot read the signing key from Secrets Manager secret S: AccessDeniedException", "S", False,
     "secretsmanager:GetSecretValue"),
    ("cannot read the signing key from Secrets Manager secret S: ResourceNotFoundException", "S",
     False, "no such secret in this region"),
    ("cannot read the signing key from Secrets Manager secret S: Weird", "S", False,
     "cannot read the signing key from Secrets Manager secret S: Weird"),
    ("the signing key file /w/signing.key does not hold a hex key", None, True,
     "set BATCHFUTURES_SIGNING_KEY"),
])
def test_signing_key_failures_name_their_fix(message, secret, local, says):
    assert says in signing_key_fix(message, secret, local)


def test_the_key_source_is_said_never_the_key():
    assert describe_key_source("secretsmanager:arn:aws:secretsmanager:r:1:secret:k") == (
        "read from Secrets Manager secret arn:aws:secretsmanager:r:1:secret:k")
    assert describe_key_source("file:/w/signing.key") == "key file /w/signing.key"
    assert describe_key_source("env").startswith("BATCHFUTURES_SIGNING_KEY of this process")


@pytest.mark.parametrize("error, says", [
    (PermissionError("Access Denied"), "access denied (Access Denied): the caller needs s3:PutObject"),
    (FileNotFoundError("NoSuchBucket"), "the bucket does not exist (NoSuchBucket): "
                                        "BATCHFUTURES_IO_BUCKET must be the stack's IoBucket"),
    (OSError("boom"), "s3://b/batchfutures: boom"),
])
def test_bucket_failures_name_their_fix(error, says):
    assert says in bucket_fix(error, "s3://b/batchfutures", local=False)


def test_the_image_of_a_container_or_multinode_definition():
    assert definition_image({"containerProperties": {"image": "a"}}) == "a"
    assert definition_image({"nodeProperties": {"nodeRangeProperties": [
        {"targetNodes": "0:", "container": {"image": "b"}}]}}) == "b"
    assert definition_image({}) is None
