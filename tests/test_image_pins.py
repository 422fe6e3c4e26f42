"""The worker image matches the client: its libraries pinned to the client's, two architectures,
and a worker that refuses an s3fs too old for conditional writes.

The Dockerfile's pip line is expanded by sh with the build arguments `batchfutures image` passes
(as docker's RUN would), so what pip is asked for is checked, not only the text.
"""

import re
import subprocess
from importlib import metadata

import pytest

from batchfutures.cli.setup_resources import (
    IMAGE_PLATFORMS,
    PINNED,
    client_versions,
    dockerfile_path,
    image_commands,
)
from batchfutures.errors import EnvironmentMismatchError
from batchfutures.worker.storagelib import S3FS_MINIMUM, check_storage_library, parse_version


def pip_script():
    """The Dockerfile's pip step as sh runs it, with printf in place of pip: each requirement
    pip would be given, one a line."""
    text = dockerfile_path().read_text().replace("\\\n", " ")
    (run,) = [line for line in text.splitlines() if "python -m pip install" in line]
    step = run.removeprefix("RUN ").split("&& if")[0]  # up to the extra packages
    return step.replace("python -m pip install", "printf '%s\\n'")


def expanded(build_args):
    """What pip is asked for with these build arguments (unset ones are empty, as docker's)."""
    script = "".join(f'{name}="${{{name}:-}}"; ' for name in PINNED.values()) + pip_script()
    done = subprocess.run(["sh", "-c", script], env={**build_args, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_image_commands_pin_the_clients_libraries():
    versions = client_versions()
    assert {"cloudpickle", "s3fs", "aiobotocore", "boto3"} <= set(versions)
    for name, version in versions.items():
        assert version == metadata.version(name)
    text = image_commands(region="us-east-1")
    for name, version in versions.items():
        assert f"--build-arg {PINNED[name]}={version} \\" in text


def test_image_commands_build_both_architectures_with_buildx():
    text = image_commands(region="us-east-1")
    assert IMAGE_PLATFORMS == ("linux/amd64", "linux/arm64")
    (build,) = [line for line in text.splitlines() if line.startswith("docker buildx build")]
    assert "--platform linux/amd64,linux/arm64" in build
    assert '--tag "$IMAGE" --push' in text  # a multi-platform image goes straight to the registry
    assert "docker build " not in text and "docker push" not in text


def test_the_dockerfile_takes_every_pin_as_a_build_argument():
    text = dockerfile_path().read_text()
    for argument in PINNED.values():
        assert re.search(rf'^ARG {argument}=""$', text, re.MULTILINE), argument
        assert f"${{{argument}:+==${{{argument}}}}}" in text  # name==<version> when given


@pytest.mark.slow  # runs sh
def test_the_pip_line_asks_for_exactly_the_clients_versions():
    versions = client_versions()
    build_args = {PINNED[name]: version for name, version in versions.items()}
    asked = expanded(build_args)
    for name, version in versions.items():
        assert f"{name}=={version}" in asked
    # without the arguments (an image built by hand): at least the conditional-write s3fs
    bare = expanded({})
    minimum = ".".join(map(str, S3FS_MINIMUM))
    assert f"s3fs>={minimum}" in bare and f"fsspec>={minimum}" in bare
    assert "cloudpickle" in bare


@pytest.mark.parametrize("text, parsed", [
    ("2024.12.0", (2024, 12, 0)), ("2025.3.0rc1", (2025, 3, 0)), ("2023.1", (2023, 1)),
    ("2024.12.0+local", (2024, 12, 0)), ("1.43.117", (1, 43, 117)), ("dev", ()),
])
def test_versions_are_read_as_numbers(text, parsed):
    assert parse_version(text) == parsed


@pytest.mark.parametrize("version", ["2023.1.0", "2024.10.0", "2024.9.2"])
def test_the_worker_refuses_an_s3fs_without_conditional_writes(version):
    with pytest.raises(EnvironmentMismatchError, match=f"s3fs {version}.*s3fs>=2024.12.0"):
        check_storage_library("s3://bucket/batchfutures/runs/r/jobs/j", version)


def test_the_worker_accepts_a_new_enough_s3fs_or_local_storage():
    check_storage_library("s3://bucket/prefix/job", "2024.12.0")
    check_storage_library("s3://bucket/prefix/job", "2026.1.0")
    check_storage_library("s3://bucket/prefix/job")  # this environment's own s3fs
    check_storage_library("file:///tmp/work/runs/r/jobs/j", "2023.1.0")  # no S3: no s3fs needed
