"""The AWS setup that `batchfutures template` and `batchfutures image` print.

    template_text()   the CloudFormation template (templates/batchfutures.yaml), its
                      PythonVersion default set to this interpreter's minor version
    image_commands()  a POSIX sh script: create the ECR repository if missing, log docker in,
                      build templates/Dockerfile with docker buildx for linux/amd64 and
                      linux/arm64, for the client's Python and its exact cloudpickle, s3fs,
                      fsspec, aiobotocore, botocore and boto3 (`client_versions`), with the
                      installed batchfutures package as the build context, and push

Both files ship as package data. The defaults agree with each other: `image_commands()` pushes
<account>.dkr.ecr.<region>.amazonaws.com/batchfutures-worker:py<X.Y>, the image the template's
job definitions name when its ImageUri parameter is left empty. Nothing here calls AWS: the
script finds the account and region when it runs.
"""

from __future__ import annotations

import platform
import re
import shlex
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .._version import __version__
from ..errors import ConfigurationError

__all__ = [
    "DEFAULT_REPOSITORY",
    "IMAGE_PLATFORMS",
    "PINNED",
    "client_versions",
    "dockerfile_path",
    "image_commands",
    "image_tag",
    "package_dir",
    "python_minor",
    "template_path",
    "template_text",
]

DEFAULT_REPOSITORY = "batchfutures-worker"  # the template's default image names it too
# x86 and Graviton instances (and Fargate's default X86_64) run the one image
IMAGE_PLATFORMS = ("linux/amd64", "linux/arm64")
BUILDER = "batchfutures"  # the buildx builder the script makes (multi-platform needs one)
# the worker's libraries pinned to the client's: distribution name -> Dockerfile build argument
PINNED = {
    "cloudpickle": "CLOUDPICKLE_VERSION",
    "s3fs": "S3FS_VERSION",
    "fsspec": "FSSPEC_VERSION",
    "aiobotocore": "AIOBOTOCORE_VERSION",
    "botocore": "BOTOCORE_VERSION",
    "boto3": "BOTO3_VERSION",
}
_ECR_HOST = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")
_REPOSITORY_NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")
_REGION = re.compile(r"^[a-z]{2}(?:-[a-z]+)+-\d$")
_PYTHON_DEFAULT = re.compile(r'(\n  PythonVersion:\n(?:    .*\n)*?    Default: )"[^"\n]*"')


def package_dir() -> Path:
    """The installed batchfutures package folder: the worker image's build context."""
    return Path(__file__).resolve().parents[1]


TEMPLATES = Path(__file__).resolve().parent / "templates"  # shipped as package data


def template_path() -> Path:
    return TEMPLATES / "batchfutures.yaml"


def dockerfile_path() -> Path:
    return TEMPLATES / "Dockerfile"


def python_minor(python_version: Optional[str] = None) -> str:
    """'3.11' from None (this interpreter), '3.11', '3.11.7' or 'py3.11'."""
    if python_version is None:
        return ".".join(platform.python_version_tuple()[:2])
    text = str(python_version).strip()
    text = text[2:] if text.lower().startswith("py") else text
    match = re.match(r"^(3)\.(\d+)(?:\.\d+\w*)?$", text)
    if not match:
        raise ConfigurationError(
            f"python_version={python_version!r}: give a Python 3 version such as 3.11")
    return f"{match.group(1)}.{int(match.group(2))}"


def image_tag(python_version: Optional[str] = None) -> str:
    """The worker image tag for a Python minor version: 'py3.11'."""
    return f"py{python_minor(python_version)}"


def template_text() -> str:
    """The CloudFormation template, with PythonVersion defaulting to this interpreter's."""
    text = template_path().read_text(encoding="utf-8")
    replaced, count = _PYTHON_DEFAULT.subn(lambda m: f'{m.group(1)}"{python_minor()}"', text, count=1)
    return replaced if count else text


def client_versions() -> Dict[str, str]:
    """The installed version of each library in `PINNED` (those installed), by name."""
    found = {}
    for name in PINNED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _split_repository(repository: str) -> Tuple[str, str, Optional[str]]:
    """(registry host or '', repository path, tag or None) of a repository reference."""
    reference = repository.strip()
    if "@" in reference:
        raise ConfigurationError(
            f"repository {repository!r}: give a repository (and optionally a tag), not a digest")
    tag = None
    last = reference.rsplit("/", 1)[-1]
    if ":" in last:
        reference, tag = reference.rsplit(":", 1)
        if not tag:
            raise ConfigurationError(f"repository {repository!r} ends with an empty tag")
    host, _, path = reference.partition("/")
    if not path or not ("." in host or ":" in host or host == "localhost"):
        host, path = "", reference  # a bare name, or Docker Hub's user/name
    if not path:
        raise ConfigurationError(f"repository {repository!r} names no repository")
    return host, path, tag


def _check_region(region: str) -> str:
    if not _REGION.match(region):
        raise ConfigurationError(f"region={region!r} is not an AWS region name such as us-east-1")
    return region


def _dns_suffix(region: str) -> str:
    return "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"


def image_commands(python_version: str | None = None, repository: str | None = None,
                   region: str | None = None) -> str:
    """The shell commands that build the worker image for a Python version and push it.

    ``python_version``: the client's Python (default: this interpreter's); the image gets the
    same minor version, and the tag ``py<X.Y>``. ``repository``: an ECR repository name in your
    account (default ``batchfutures-worker``), an ECR repository URI
    (``<account>.dkr.ecr.<region>.amazonaws.com/<name>[:tag]``), or another registry's
    repository with its host (``ghcr.io/me/worker``, ``docker.io/me/worker``: no ECR steps);
    a name without a host is an ECR repository, slashes included. ``region``: the ECR region
    (default: the URI's, else AWS_REGION, AWS_DEFAULT_REGION or the AWS CLI's configured region,
    looked up when the script runs).
    """
    minor = python_minor(python_version)
    own_python = minor == python_minor()
    versions = client_versions() if own_python else {}  # another Python has its own
    if "s3fs" in versions:
        from ..worker.storagelib import S3FS_MINIMUM, parse_version

        if parse_version(versions["s3fs"]) < S3FS_MINIMUM:  # the image's build would fail on it
            raise ConfigurationError(
                f"s3fs {versions['s3fs']} is installed here; batchfutures needs s3fs>="
                f"{'.'.join(map(str, S3FS_MINIMUM))} (conditional writes): upgrade it "
                f"(pip install -U s3fs), then build the image")

    host, path, tag = _split_repository(repository or DEFAULT_REPOSITORY)
    tag = tag or image_tag(minor)
    if region is not None:
        region = _check_region(region.strip())
    ecr = _ECR_HOST.match(host) if host else None
    if host and not ecr:
        kind = "other"
    elif ecr:
        kind = "ecr-uri"
        if region and region != ecr.group("region"):
            raise ConfigurationError(
                f"repository {repository!r} is in {ecr.group('region')}, not region={region!r}")
        region = ecr.group("region")
    else:
        kind = "ecr-name"
        if not _REPOSITORY_NAME.match(path):
            raise ConfigurationError(
                f"repository {path!r} is not a valid ECR repository name (lowercase letters, "
                f"digits, '.', '_', '-' and '/')")

    q = shlex.quote
    lines: List[str] = [
        "#!/bin/sh",
        f"# Build the batchfutures {__version__} worker image for Python {minor} and push it.",
        "# Run it as it is (batchfutures image | sh) or a step at a time. It needs docker and,",
        "# for ECR, the AWS CLI with credentials that may push to the repository.",
        "# The libraries your functions import must be in the image too: add",
        "#   --build-arg EXTRA_PIP_PACKAGES='numpy pandas'",
        "# to the docker buildx build line (or build your own image FROM this one).",
        "set -eu",
    ]
    if kind == "other":
        registry = host
        lines += [f"IMAGE={q(f'{host}/{path}:{tag}')}", "",
                  f"# log in to {registry} first if it needs it: docker login {registry}"]
    else:
        if region:
            lines.append(f"REGION={q(region)}")
        else:
            lines += ['REGION="${AWS_REGION:-${AWS_DEFAULT_REGION:-$(aws configure get region || true)}}"',
                      'if [ -z "$REGION" ]; then echo "set AWS_REGION (or pass --region)" >&2; exit 1; fi']
        if kind == "ecr-uri":
            registry_value = q(host)
        else:
            lines.append('ACCOUNT="$(aws sts get-caller-identity --query Account --output text)"')
            if region:
                registry_value = f'"$ACCOUNT.dkr.ecr.$REGION.{_dns_suffix(region)}"'
            else:
                lines.append('case "$REGION" in cn-*) SUFFIX=amazonaws.com.cn ;; '
                             '*) SUFFIX=amazonaws.com ;; esac')
                registry_value = '"$ACCOUNT.dkr.ecr.$REGION.$SUFFIX"'
        lines += [
            f"REGISTRY={registry_value}",
            f'IMAGE="$REGISTRY/{path}:{tag}"',
            "",
            "# the ECR repository, created once",
            f'aws ecr describe-repositories --region "$REGION" --repository-names {q(path)} '
            ">/dev/null 2>&1 \\",
            f'  || aws ecr create-repository --region "$REGION" --repository-name {q(path)} '
            "--image-scanning-configuration scanOnPush=true >/dev/null",
            "# log docker in to the registry",
            'aws ecr get-login-password --region "$REGION" '
            '| docker login --username AWS --password-stdin "$REGISTRY"',
        ]
    build_args = [f"--build-arg PYTHON_VERSION={minor}"]
    build_args += [f"--build-arg {PINNED[name]}={q(version)}" for name, version in versions.items()]
    build_args.append(f"--build-arg BATCHFUTURES_VERSION={__version__}")
    what = ", ".join([f"Python {minor}", *(f"{n} {v}" for n, v in versions.items())])
    lines += [f"# build: {what} and this batchfutures (the build context is its package folder)"]
    if not own_python:
        lines.append("#    pin the libraries of that Python's client: add --build-arg "
                     + " --build-arg ".join(f"{arg}=<version>" for arg in PINNED.values()))
    platforms = ",".join(IMAGE_PLATFORMS)
    lines += [
        f"# for {' and '.join(IMAGE_PLATFORMS)} (x86 and Graviton) in one image, built by docker",
        "# buildx and pushed as it is built. Building the other architecture needs QEMU: Docker",
        "# Desktop has it; elsewhere run once: docker run --privileged --rm tonistiigi/binfmt --install all",
        f"docker buildx inspect {BUILDER} >/dev/null 2>&1 \\",
        f"  || docker buildx create --name {BUILDER} --driver docker-container >/dev/null",
        f"docker buildx build --builder {BUILDER} --platform {platforms} \\",
        *[f"  {arg} \\" for arg in build_args],
        f"  --file {q(str(dockerfile_path()))} \\",
        '  --tag "$IMAGE" --push \\',
        f"  {q(str(package_dir()))}",
    ]
    if kind == "ecr-name" and path == DEFAULT_REPOSITORY and tag == image_tag(minor):
        lines.append(f'echo "pushed $IMAGE: the stack\'s default image (ImageUri empty, '
                     f'PythonVersion={minor})"')
    else:
        lines.append('echo "pushed $IMAGE: deploy the stack with ImageUri=$IMAGE"')
    return "\n".join(lines)
