"""Shared fixtures: every test runs against real parts (emulator processes, moto's S3 server)."""

import pytest
import s3server

from batchfutures import BatchExecutor, LocalEnvironment
from batchfutures.storage import Storage


@pytest.fixture(autouse=True, scope="session")
def _private_workdir(tmp_path_factory):
    # BatchExecutor() with no environment must not write into the user's real cache folder.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BATCHFUTURES_WORKDIR", str(tmp_path_factory.mktemp("default-workdir")))
        for name in ("BATCHFUTURES_JOB_QUEUE", "BATCHFUTURES_JOB_DEFINITION", "BATCHFUTURES_IO_BUCKET"):
            patch.delenv(name, raising=False)
        yield


@pytest.fixture
def local_env(tmp_path):
    env = LocalEnvironment(tmp_path / "work", max_vcpus=2)
    yield env
    env.emulator.close()  # its scheduler thread and fork server end with the test


@pytest.fixture
def executor(local_env):
    ex = BatchExecutor(local_env)
    yield ex
    ex.shutdown(wait=False, cancel_futures=True)


# moto's S3 server on 127.0.0.1 (tests/s3server.py), shared by every test module.
s3_endpoint = s3server.s3_endpoint
moto_server = s3server.moto_server
s3_bucket = s3server.s3_bucket
s3_root = s3server.s3_root


@pytest.fixture(params=["file", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path) -> Storage:
    """The same Storage tests on a local folder and on moto's S3."""
    if request.param == "file":
        return Storage((tmp_path / "storage").as_uri())
    return Storage(request.getfixturevalue("s3_root"))


@pytest.fixture
def local(tmp_path) -> Storage:
    return Storage((tmp_path / "storage").as_uri())
