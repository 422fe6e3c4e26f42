"""Shared fixtures: every test runs against real parts (emulator processes, moto's S3 server)."""

import os

import pytest

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


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server on 127.0.0.1, with fake credentials, for the AWS-path tests."""
    import socket

    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    values = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
              "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1",
              "AWS_ENDPOINT_URL_S3": url}
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    yield url
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()
