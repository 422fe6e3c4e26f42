"""`batchfutures check`: verify an environment end to end, one verdict per part.

Each check returns (name, ok, one line saying what was found, or what is wrong and how to fix
it); a broken part does not stop the others, so one run lists everything to fix. The parts, in
the order a first run meets them:

    credentials     the boto3 chain finds some
    region          where the region came from (environments.choose_region)
    job queue       DescribeJobQueues: ENABLED and VALID
    signing key     the key the client signs payloads with, read as the client reads it
                    (GetSecretValue with the client's credentials); the key is never printed
    bucket          a sealed object written, read back (its seal checked) and deleted under the
                    prefix, through the storage path the executor uses
    job definition  DescribeJobDefinitions: ACTIVE
    image           the definition's image: in ECR (DescribeImages), and its py<X.Y> tag this
                    client's Python; an image of another registry is not checked (said so)

The decisions (which fix a failure names, what an image URI is, whether its tags fit this
Python) are pure functions below, with table tests.
"""

from __future__ import annotations

import re
import sys
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import batchapi
from ..awsclients import CLIENT_CONFIG
from ..errors import ConfigurationError

if TYPE_CHECKING:
    from ..environments import Environment

Verdict = Tuple[str, bool, str]
STEP_2 = "docs/aws.md step 2"
STEP_3 = "docs/aws.md step 3"


class CheckFailed(Exception):
    """A part is wrong: the message says what, and how to fix it."""


# -- credentials, region ------------------------------------------------------------------------
def _credentials(env: Environment) -> str:
    if env.is_local:
        return "not needed (local emulator)"
    credentials = env.session.get_credentials()
    if credentials is None:
        raise CheckFailed("no AWS credentials found: run `aws configure` (or `aws configure sso`, "
                          "or set AWS_PROFILE), then `aws sts get-caller-identity` must work")
    method = getattr(credentials, "method", "unknown source")
    return f"found ({method})"


def _region(env: Environment) -> str:
    if env.is_local:
        return "not needed (local emulator)"
    if not env.region_name:
        raise CheckFailed("no AWS region: export AWS_DEFAULT_REGION=<the stack's region> (boto3 "
                          "does not read AWS_REGION by itself; batchfutures reads both), or set "
                          "`region` in ~/.aws/config, or give a job queue ARN")
    return f"{env.region_name} (from {env.region_source})"


# -- job queue ----------------------------------------------------------------------------------
def _queue(env: Environment) -> str:
    try:
        env.check_queue()
    except ConfigurationError as error:
        raise CheckFailed(queue_fix(str(error), _variable_hint(env, "BATCHFUTURES_JOB_QUEUE",
                                                               "JobQueue"))) from error
    return f"{env.job_queue} is ENABLED and VALID"


def queue_fix(message: str, hint: str) -> str:
    """The queue's failure with what to do about it."""
    if "does not exist" in message:
        return f"{message}: {hint}"
    return message


def _variable_hint(env: Environment, variable: str, output: str) -> str:
    if env.is_local:
        return "the local emulator always has it: is --workdir an emulator folder?"
    region = env.region_name
    return (f"{variable} must be the stack's {output} output"
            + (f", and the stack in {region}" if region else "") + f" ({STEP_3})")


# -- signing key --------------------------------------------------------------------------------
def _signing_key(env: Environment) -> str:
    signer = env.storage.signer
    try:
        _ = signer.key  # loads it (GetSecretValue, a variable, a file); never printed
    except ConfigurationError as error:
        raise CheckFailed(signing_key_fix(str(error), env.signing_secret,
                                          env.is_local)) from error
    return describe_key_source(signer.source)


def describe_key_source(source: str) -> str:
    """Where the key was read from, in words (never the key)."""
    scheme, _, where = source.partition(":")
    if scheme == "secretsmanager":
        return f"read from Secrets Manager secret {where}"
    if scheme == "file":
        return f"key file {where}"
    return ("BATCHFUTURES_SIGNING_KEY of this process (on AWS the jobs need it too: pass it "
            "with secrets=)")


# What a Secrets Manager error code means for the signing key, and the fix.
SECRET_FIXES = {
    "AccessDeniedException": "the caller may not read it: it needs secretsmanager:GetSecretValue "
                             "on the secret (the stack's client policy <stack>-client grants it; "
                             "a secret under your own KMS key also needs kms:Decrypt)",
    "ResourceNotFoundException": "no such secret in this region: BATCHFUTURES_SIGNING_SECRET must "
                                 f"be the stack's SigningSecret output ({STEP_3})",
    "InvalidRequestException": "the secret is scheduled for deletion: restore it "
                               "(`aws secretsmanager restore-secret --secret-id ...`)",
    "DecryptionFailure": "its KMS key cannot decrypt it for this caller: allow kms:Decrypt on "
                         "the secret's key",
}


def signing_key_fix(message: str, secret: Optional[str], local: bool) -> str:
    """A signing key failure with its fix: the key's absence, or the Secrets Manager code that
    ends signing.Signer.from_secrets_manager's message."""
    if "needs a signing key" in message and not secret:
        return ("no signing key: export BATCHFUTURES_SIGNING_SECRET=<the stack's SigningSecret "
                f"output> ({STEP_3}), or pass signing_secret= to AWSBatchEnvironment")
    code = message.rsplit(": ", 1)[-1].strip()
    if secret and code in SECRET_FIXES:
        return f"cannot read Secrets Manager secret {secret}: {code}: {SECRET_FIXES[code]}"
    if local:
        return f"{message} (fix the key file, or set BATCHFUTURES_SIGNING_KEY)"
    return message


# -- bucket -------------------------------------------------------------------------------------
def _bucket(env: Environment) -> str:
    storage = env.storage
    try:
        signed = bool(storage.signer.key)
    except ConfigurationError:  # the signing key's own line says why; probe the bucket anyway
        signed = False
    try:
        if signed:
            # what a submission writes and a result read does: a sealed object under runs/
            run_id = f"check-{uuid.uuid4().hex}"
            payload = b"batchfutures check " + run_id.encode()
            url = storage.put_function(run_id, payload)
            if bytes(storage.get_function(url)) != payload:
                raise CheckFailed(f"wrote {url} but read back other bytes")
            storage.delete_run(run_id)
        else:
            probe = storage.url("check", uuid.uuid4().hex)
            storage.put_bytes(probe, b"batchfutures check")
            if storage.get_bytes(probe) != b"batchfutures check":
                raise CheckFailed(f"wrote {probe} but could not read it back")
            storage.delete(probe)
    except CheckFailed:
        raise
    except Exception as error:
        raise CheckFailed(bucket_fix(error, storage.root_url, env.is_local)) from error
    how = "a signed object written, read back, deleted" if signed else \
        "an unsigned object written, read back, deleted: no signing key, see its line"
    return f"{storage.root_url} is writable and readable ({how})"


def bucket_fix(error: BaseException, root_url: str, local: bool) -> str:
    """The bucket's failure in one line with its fix (s3fs raises PermissionError for 403,
    FileNotFoundError for a missing bucket)."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    if local:
        return f"{root_url}: {text}"
    if isinstance(error, PermissionError):
        return (f"{root_url}: access denied ({text}): the caller needs s3:PutObject, s3:GetObject "
                f"and s3:DeleteObject under it (the stack's client policy grants them); "
                f"BATCHFUTURES_IO_PREFIX must equal the stack's IoPrefix, and the bucket must "
                f"be this account's (or pass expected_bucket_owner=)")
    if isinstance(error, FileNotFoundError):
        return (f"{root_url}: the bucket does not exist ({text}): BATCHFUTURES_IO_BUCKET must be "
                f"the stack's IoBucket output ({STEP_3})")
    return f"{root_url}: {text}"


# -- job definition, image ----------------------------------------------------------------------
def _definition(env: Environment) -> str:
    name = env.job_definition
    definition = env.describe_definition()
    if definition is None:
        raise CheckFailed(f"job definition {name} does not exist or is not ACTIVE: "
                          + _variable_hint(env, "BATCHFUTURES_JOB_DEFINITION", "JobDefinition"))
    return f"{definition.get('jobDefinitionArn', name)} (image {definition_image(definition)})"


def definition_image(definition: Dict[str, Any]) -> Optional[str]:
    """The image a job definition runs: its container's, else its first node range's."""
    image = (definition.get("containerProperties") or {}).get("image")
    if image:
        return str(image)
    for node_range in (definition.get("nodeProperties") or {}).get("nodeRangeProperties") or []:
        image = (node_range.get("container") or {}).get("image")
        if image:
            return str(image)
    return None


@dataclass(frozen=True)
class EcrImage:
    registry: str  # the account id
    region: str
    repository: str
    tag: Optional[str]
    digest: Optional[str]

    @property
    def image_id(self) -> Dict[str, str]:
        return {"imageDigest": self.digest} if self.digest else {"imageTag": self.tag or "latest"}


# https://docs.aws.amazon.com/AmazonECR/latest/userguide/Registries.html (private registry URL)
ECR_IMAGE = re.compile(
    r"(?P<registry>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/"
    r"(?P<repository>[a-z0-9][a-z0-9._/-]*?)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[a-f0-9]{64}))?")


def parse_ecr_image(uri: str) -> Optional[EcrImage]:
    """The ECR repository, tag or digest of an image URI; None for another registry."""
    match = ECR_IMAGE.fullmatch(uri or "")
    if not match:
        return None
    return EcrImage(match["registry"], match["region"], match["repository"], match["tag"],
                    match["digest"])


PYTHON_TAG = re.compile(r"py(\d+\.\d+)")


def python_tag_verdict(tags: Sequence[str], client_minor: str) -> Tuple[bool, str]:
    """Whether an image's tags fit a client of Python ``client_minor``: (ok, what was found)."""
    minors = sorted({m[1] for m in map(PYTHON_TAG.fullmatch, tags) if m})
    if client_minor in minors:
        return True, f"tagged py{client_minor}, this client's Python"
    if minors:
        theirs = ", ".join(f"py{minor}" for minor in minors)
        return False, (f"tagged {theirs} but this client runs Python {client_minor}: push an "
                       f"image for it (`batchfutures image | sh`, tag py{client_minor}) and "
                       f"deploy the stack with PythonVersion={client_minor}, or run the client "
                       f"with the image's Python")
    return True, "no py<X.Y> tag: its Python was not checked (the worker refuses a mismatch)"


# What an ECR error code means for the image, and the fix.
def image_fix(code: str, image: EcrImage, uri: str) -> str:
    push = f"push it: `batchfutures image --region {image.region} | sh` ({STEP_2})"
    if code == "ImageNotFoundException":
        return f"{uri} is not in ECR: {push}"
    if code == "RepositoryNotFoundException":
        return (f"{uri}: ECR repository {image.repository} does not exist in account "
                f"{image.registry}, {image.region}: {push}")
    if code in ("AccessDeniedException", "AccessDenied"):
        return (f"{uri}: not allowed to look it up (ecr:DescribeImages on "
                f"arn:aws:ecr:{image.region}:{image.registry}:repository/{image.repository}): "
                f"allow it, or ask whoever can to run `aws ecr describe-images "
                f"--repository-name {image.repository}`")
    return f"{uri}: ECR DescribeImages failed ({code})"


def _image(env: Environment) -> str:
    if env.is_local:
        return "not needed (local emulator: the jobs run this Python)"
    try:
        definition = env.describe_definition()
    except Exception as error:
        raise CheckFailed(f"not checked: the job definition cannot be read ({error})") from error
    uri = definition_image(definition) if definition else None
    if not uri:
        raise CheckFailed("not checked: no job definition to read the image from (see its line)")
    client_minor = "%d.%d" % sys.version_info[:2]
    image = parse_ecr_image(uri)
    if image is None:
        return (f"{uri} is not in ECR: not checked (it must exist and run Python "
                f"{client_minor})")
    try:
        answer = batchapi.call(_ecr_client(env, image.region).describe_images,
                               registryId=image.registry, repositoryName=image.repository,
                               imageIds=[image.image_id])
    except Exception as error:
        code = batchapi.error_code(error) or type(error).__name__
        raise CheckFailed(image_fix(code, image, uri)) from error
    tags = [image.tag] if image.tag else []
    for detail in answer.get("imageDetails") or []:
        tags.extend(detail.get("imageTags") or [])
    ok, found = python_tag_verdict(tags, client_minor)
    if not ok:
        raise CheckFailed(f"{uri} is in ECR but {found}")
    return f"{uri} is in ECR, {found}"


def _ecr_client(env: Environment, region: str) -> Any:
    if region == env.region_name:
        return env.client("ecr")
    # start-up: botocore.config costs ~35 ms, which `check` on the local emulator never needs
    from botocore.config import Config

    return env.session.client("ecr", region_name=region, config=Config(**CLIENT_CONFIG))


CHECKS: List[Tuple[str, Callable[[Environment], str]]] = [
    ("credentials", _credentials),
    ("region", _region),
    ("job queue", _queue),
    ("signing key", _signing_key),
    ("bucket", _bucket),
    ("job definition", _definition),
    ("image", _image),
]


def run_checks(env: Environment) -> List[Verdict]:
    verdicts = []
    for name, check in CHECKS:
        try:
            verdicts.append((name, True, check(env)))
        except Exception as error:  # each broken part gets its own line
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            verdicts.append((name, False, message))
    return verdicts
