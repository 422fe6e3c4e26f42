"""The worker image matches the client: its libraries (and the extra packages) pinned to the
client's, built for this machine's platform unless told more, and a worker that refuses an s3fs
too old for conditional writes.

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
    host_platform,
    image_commands,
    parse_platforms,
    pinned_requirements,
)
from batchfutures.errors import ConfigurationError, EnvironmentMismatchError
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
    names = [*PINNED.values(), "EXTRA_PIP_PACKAGES"]
    script = "".join(f'{name}="${{{name}:-}}"; ' for name in names) + pip_script()
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


# -- platforms: this machine's unless --platforms says more -------------------------------------
@pytest.mark.parametrize("machine, docker", [
    ("x86_64", "linux/amd64"), ("AMD64", "linux/amd64"),   # Linux; Windows
    ("aarch64", "linux/arm64"), ("arm64", "linux/arm64"),  # Linux on Graviton; a Mac
])
def test_the_hosts_platform_is_dockers_name_of_its_machine(machine, docker):
    assert host_platform(machine) == docker


@pytest.mark.parametrize("machine", ["ppc64le", "s390x", "riscv64", ""])
def test_a_machine_batch_does_not_run_must_name_the_platforms(machine):
    with pytest.raises(ConfigurationError, match="--platforms"):
        host_platform(machine)
    assert parse_platforms("linux/amd64", machine) == ("linux/amd64",)  # named: fine


@pytest.mark.parametrize("value, machine, platforms", [
    (None, "x86_64", ("linux/amd64",)),
    ("", "aarch64", ("linux/arm64",)),
    ("linux/arm64", "x86_64", ("linux/arm64",)),
    ("amd64,arm64", "x86_64", ("linux/amd64", "linux/arm64")),
    ("linux/arm64, linux/amd64", "x86_64", ("linux/arm64", "linux/amd64")),
    ("all", "aarch64", IMAGE_PLATFORMS),
    ("x86_64,linux/amd64,AMD64", "aarch64", ("linux/amd64",)),
])
def test_platforms_are_read_as_dockers_names(value, machine, platforms):
    assert parse_platforms(value, machine) == platforms


@pytest.mark.parametrize("value", ["linux/386", "windows/amd64", "arm", "amd64,mips"])
def test_platforms_batch_does_not_run_are_refused(value):
    with pytest.raises(ConfigurationError, match="linux/amd64 and linux/arm64"):
        parse_platforms(value, "x86_64")


def _build_line(text):
    (build,) = [line for line in text.splitlines() if line.startswith("docker buildx build")]
    return build


@pytest.mark.parametrize("platforms, machine, built, builder, qemu", [
    (None, "x86_64", "linux/amd64", False, False),    # a Linux host without QEMU can run it
    (None, "aarch64", "linux/arm64", False, False),
    ("linux/amd64", "arm64", "linux/amd64", False, True),  # a Mac building for x86 instances
    ("all", "x86_64", "linux/amd64,linux/arm64", True, True),
    ("arm64,amd64", "aarch64", "linux/arm64,linux/amd64", True, True),
])
def test_the_image_is_built_for_this_machine_unless_told_more(platforms, machine, built, builder,
                                                              qemu):
    text = image_commands(region="us-east-1", platforms=platforms, machine=machine)
    build = _build_line(text)
    assert f"--platform {built} " in build
    assert ("--builder batchfutures" in build) is builder  # several platforms need one
    assert ("docker buildx create --name batchfutures" in text) is builder
    assert ("tonistiigi/binfmt" in text) is qemu  # QEMU only for a platform not this machine's
    assert '--tag "$IMAGE" --push' in text  # straight to the registry
    assert "docker build " not in text and "docker push" not in text


def test_an_arm_machines_default_says_x86_instances_need_more():
    assert "--platforms all" in image_commands(region="us-east-1", machine="arm64")
    assert "--platforms all" not in image_commands(region="us-east-1", machine="x86_64")


# -- extra packages: the client's versions ------------------------------------------------------
INSTALLED = {"numpy": "2.1.3", "pandas": "2.2.3", "dask": "2025.1.0", "scikit-learn": "1.6.1"}


@pytest.mark.parametrize("packages, pin, requirements", [
    (None, True, []),
    ("", True, []),
    ("numpy,pandas", True, ["numpy==2.1.3", "pandas==2.2.3"]),
    ("numpy pandas", True, ["numpy==2.1.3", "pandas==2.2.3"]),   # EXTRA_PIP_PACKAGES' spelling
    (" numpy , scikit-learn ", True, ["numpy==2.1.3", "scikit-learn==1.6.1"]),
    ("dask[distributed]", True, ["dask[distributed]==2025.1.0"]),
    ("numpy>=2,<3 pandas==2.0.0", True, ["numpy>=2,<3", "pandas==2.0.0"]),  # kept as given
    ("numpy>=2,<3,pandas", True, ["numpy>=2,<3", "pandas==2.2.3"]),
    ("torch~=2.5", True, ["torch~=2.5"]),                         # not installed, but versioned
    ("numpy,pandas", False, ["numpy", "pandas"]),                  # an image for another Python
])
def test_extra_packages_are_pinned_to_the_clients_versions(packages, pin, requirements):
    assert pinned_requirements(packages, INSTALLED, pin=pin) == requirements


@pytest.mark.parametrize("packages, message", [
    ("torch", "not installed here"),
    ("numpy;python_version>'3'", "without spaces"),
    ("git+https://github.com/x/y", "without spaces"),
    ("'numpy'", "without spaces"),
])
def test_extra_packages_without_a_version_to_pin_are_refused(packages, message):
    with pytest.raises(ConfigurationError, match=message):
        pinned_requirements(packages, INSTALLED)


def test_the_extra_packages_reach_the_build_pinned():
    import cloudpickle  # installed here, as any library the functions import would be

    text = image_commands(region="us-east-1", extra_packages="cloudpickle,boto3[crt]")
    pins = f"cloudpickle=={cloudpickle.__version__} boto3[crt]=={metadata.version('boto3')}"
    assert f"--build-arg EXTRA_PIP_PACKAGES='{pins}' \\" in text
    assert "EXTRA_PIP_PACKAGES" not in image_commands(region="us-east-1")


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
    # the extra packages go to the same pip command: the pins above hold them
    with_extras = expanded(dict(build_args, EXTRA_PIP_PACKAGES="numpy==2.1.3 dask[array]==2025.1.0"))
    assert with_extras == asked + ["numpy==2.1.3", "dask[array]==2025.1.0"]
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


def test_the_image_command_takes_platforms_and_extra_packages(capsys, monkeypatch):
    import cloudpickle

    from batchfutures.cli.app import main

    assert main(["image", "--region", "us-east-1", "--platforms", "all",
                 "--extra-packages", "cloudpickle"]) == 0
    text = capsys.readouterr().out
    assert "--platform linux/amd64,linux/arm64 " in _build_line(text)
    assert f"EXTRA_PIP_PACKAGES=cloudpickle=={cloudpickle.__version__} " in text
    # the Dockerfile's build argument, set in the shell, is read (and pinned) the same way
    monkeypatch.setenv("EXTRA_PIP_PACKAGES", "cloudpickle")
    assert main(["image", "--region", "us-east-1"]) == 0
    assert f"EXTRA_PIP_PACKAGES=cloudpickle=={cloudpickle.__version__} " in capsys.readouterr().out
    monkeypatch.setenv("EXTRA_PIP_PACKAGES", "not-installed-here")
    assert main(["image", "--region", "us-east-1"]) != 0
    assert "not installed here" in capsys.readouterr().err
