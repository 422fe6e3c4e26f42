"""The AWS setup that `batchfutures template` and `batchfutures image` print.

    template_text()   the CloudFormation template (templates/batchfutures.yaml), its
                      PythonVersion default set to this interpreter's minor version
    image_commands()  a POSIX sh script: create the ECR repository if missing, log docker in,
                      build templates/Dockerfile with docker buildx for this host's platform
                      (`host_platform`; `platforms=` more, `parse_platforms`), for the client's
                      Python and its exact cloudpickle, s3fs, fsspec, aiobotocore, botocore and
                      boto3 (`client_versions`), the extra packages at the client's versions too
                      (`pinned_requirements`), with the installed batchfutures package as the
                      build context, and push

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
from ..worker.storagelib import S3FS_MINIMUM, parse_version

__all__ = [
    "DEFAULT_REPOSITORY",
    "IMAGE_PLATFORMS",
    "PINNED",
    "client_versions",
    "dockerfile_path",
    "host_platform",
    "image_commands",
    "image_tag",
    "package_dir",
    "parse_platforms",
    "pinned_requirements",
    "python_minor",
    "template_path",
    "template_text",
]

DEFAULT_REPOSITORY = "batchfutures-worker"  # the template's default image names it too
# the platforms Batch runs: x86 instances (and Fargate's default X86_64) and Graviton ones
IMAGE_PLATFORMS = ("linux/amd64", "linux/arm64")
# platform.machine() (and the short names people type) -> docker's platform
_PLATFORM_NAMES = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "x64": "linux/amd64",
                   "aarch64": "linux/arm64", "arm64": "linux/arm64", "armv8": "linux/arm64",
                   "linux/amd64": "linux/amd64", "linux/arm64": "linux/arm64",
                   "linux/arm64/v8": "linux/arm64"}
BUILDER = "batchfutures"  # the buildx builder the script makes (multi-platform needs one)
# one requirement as pip reads it on a command line: a name, extras, a version specifier
_REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)"
                          r"(?P<extras>\[[A-Za-z0-9._,-]+\])?(?P<specifier>(?:[<>=!~]=?[A-Za-z0-9.*+!_-]+,?)*)$")
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


def host_platform(machine: Optional[str] = None) -> str:
    """Docker's name of this host's platform ("linux/amd64" on x86_64, "linux/arm64" on
    aarch64/arm64: a Mac's too, whose Docker runs Linux), from ``platform.machine()``."""
    found = (machine if machine is not None else platform.machine()).strip().lower()
    if found not in _PLATFORM_NAMES:
        raise ConfigurationError(
            f"this machine is {found or 'of an unknown architecture'}, which AWS Batch does not "
            f"run: give the image's platforms (--platforms linux/amd64 or linux/arm64)")
    return _PLATFORM_NAMES[found]


def parse_platforms(value: Optional[str], machine: Optional[str] = None) -> Tuple[str, ...]:
    """The platforms to build: ``value`` is comma-separated docker platforms or machine names
    ("linux/amd64,linux/arm64", "amd64", "arm64", "x86_64", "all" for both); None or empty:
    this host's alone (``host_platform``). Order kept, repeats dropped."""
    names = [part.strip().lower() for part in (value or "").split(",") if part.strip()]
    if not names:
        return (host_platform(machine),)
    chosen: List[str] = []
    for name in names:
        found = IMAGE_PLATFORMS if name == "all" else (_PLATFORM_NAMES.get(name),)
        if None in found:
            raise ConfigurationError(
                f"platform {name!r}: AWS Batch runs {' and '.join(IMAGE_PLATFORMS)} (or give all)")
        chosen.extend(p for p in found if p is not None and p not in chosen)
    return tuple(chosen)


def pinned_requirements(packages: Optional[str], installed: Optional[Dict[str, str]] = None,
                        pin: bool = True) -> List[str]:
    """The extra packages for the image (comma- or space-separated, pip's requirement syntax),
    each without a version pinned to the version installed here (``installed``: name -> version,
    default importlib.metadata's), so the worker unpickles with the client's numpy, pandas...
    A requirement with a specifier is kept as given; ``pin=False`` (an image for another
    Python) keeps every one as given. ConfigurationError: a bare name not installed here."""
    requirements: List[str] = []
    # a comma before a name separates packages; before an operator it is a specifier's (>=2,<3)
    for text in re.split(r"\s*,\s*(?=[A-Za-z0-9])|\s+", (packages or "").strip()):
        if not text:
            continue
        match = _REQUIREMENT.match(text)
        if not match:
            raise ConfigurationError(
                f"extra package {text!r}: give name, name[extra] or name<specifier> such as "
                f"numpy==2.1.3, without spaces, quotes, URLs or markers")
        if match.group("specifier") or not pin:
            requirements.append(text)
            continue
        name = match.group("name")
        version = (installed.get(name) if installed is not None else _installed_version(name))
        if version is None:
            raise ConfigurationError(
                f"extra package {name!r} is not installed here, so there is no version to pin: "
                f"install it, or give one ({name}==<version>)")
        requirements.append(f"{name}{match.group('extras') or ''}=={version}")
    return requirements


def _installed_version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


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
                   region: str | None = None, platforms: str | None = None,
                   extra_packages: str | None = None, machine: str | None = None) -> str:
    """The shell commands that build the worker image for a Python version and push it.

    ``python_version``: the client's Python (default: this interpreter's); the image gets the
    same minor version, and the tag ``py<X.Y>``. ``repository``: an ECR repository name in your
    account (default ``batchfutures-worker``), an ECR repository URI
    (``<account>.dkr.ecr.<region>.amazonaws.com/<name>[:tag]``), or another registry's
    repository with its host (``ghcr.io/me/worker``, ``docker.io/me/worker``: no ECR steps);
    a name without a host is an ECR repository, slashes included. ``region``: the ECR region
    (default: the URI's, else AWS_REGION, AWS_DEFAULT_REGION or the AWS CLI's configured region,
    looked up when the script runs). ``platforms``: what to build for (``parse_platforms``;
    default this host's, ``machine`` standing for ``platform.machine()``): another one needs
    QEMU. ``extra_packages``: the libraries the functions import, pinned to the versions
    installed here (``pinned_requirements``), passed as EXTRA_PIP_PACKAGES.
    """
    minor = python_minor(python_version)
    own_python = minor == python_minor()
    versions = client_versions() if own_python else {}  # another Python has its own
    chosen = parse_platforms(platforms, machine)
    extras = pinned_requirements(extra_packages, pin=own_python)
    if "s3fs" in versions:
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
        "# The libraries your functions import must be in the image too, at your versions:",
        "#   batchfutures image --extra-packages numpy,pandas   (or build your own image FROM this one)",
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
    if extras:
        build_args.append(f"--build-arg EXTRA_PIP_PACKAGES={q(' '.join(extras))}")
    what = ", ".join([f"Python {minor}", *(f"{n} {v}" for n, v in versions.items()), *extras])
    lines += [f"# build: {what} and this batchfutures (the build context is its package folder)"]
    if not own_python:
        lines.append("#    pin the libraries of that Python's client: add --build-arg "
                     + " --build-arg ".join(f"{arg}=<version>" for arg in PINNED.values()))
    foreign = [p for p in chosen if p != _PLATFORM_NAMES.get((machine or platform.machine()).lower())]
    kinds = {"linux/amd64": "x86", "linux/arm64": "Graviton"}
    lines.append(f"# for {' and '.join(chosen)} ({' and '.join(kinds[p] for p in chosen)}), built "
                 f"by docker buildx and pushed as it is built (--platforms to choose)")
    if not (platforms or "").strip() and chosen != ("linux/amd64",):
        lines += [f"# only this machine's {chosen[0]}: jobs on x86 instances (the stack's default "
                  "InstanceTypes, optimal) need linux/amd64 too: --platforms all"]
    if foreign:
        lines += [f"# {', '.join(foreign)} is not this machine's: building it needs QEMU. Docker "
                  "Desktop has it; elsewhere run once:",
                  "#   docker run --privileged --rm tonistiigi/binfmt --install all"]
    builder = ""
    if len(chosen) > 1:  # one image of several platforms needs a docker-container builder
        builder = f"--builder {BUILDER} "
        lines += [f"docker buildx inspect {BUILDER} >/dev/null 2>&1 \\",
                  f"  || docker buildx create --name {BUILDER} --driver docker-container >/dev/null"]
    lines += [
        f"docker buildx build {builder}--platform {','.join(chosen)} \\",
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
