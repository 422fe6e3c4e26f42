"""Shared fixtures: every test runs against real parts (emulator processes, moto's S3 server)."""

import os

import pytest
import s3server

from batchfutures import BatchExecutor, LocalEnvironment


@pytest.fixture(autouse=True, scope="session")
def _private_workdir(tmp_path_factory):
    # BatchExecutor() with no environment must not write into the user's real cache folder.
    previous = os.environ.get("BATCHFUTURES_WORKDIR")
    os.environ["BATCHFUTURES_WORKDIR"] = str(tmp_path_factory.mktemp("default-workdir"))
    for name in ("BATCHFUTURES_JOB_QUEUE", "BATCHFUTURES_JOB_DEFINITION", "BATCHFUTURES_IO_BUCKET"):
        os.environ.pop(name, None)
    yield
    if previous is None:
        os.environ.pop("BATCHFUTURES_WORKDIR", None)
    else:
        os.environ["BATCHFUTURES_WORKDIR"] = previous


@pytest.fixture
def local_env(tmp_path):
    return LocalEnvironment(tmp_path / "work", max_vcpus=2)


@pytest.fixture
def executor(local_env):
    ex = BatchExecutor(local_env)
    yield ex
    ex.shutdown(wait=False, cancel_futures=True)


# moto's S3 server on 127.0.0.1 (tests/s3server.py), shared by every test module.
s3_endpoint = s3server.s3_endpoint
moto_server = s3server.moto_server
