"""Shared fixtures: every test runs against real parts (emulator processes, moto's S3 server).

The tiers (issue 21): a test that starts a process (a job, the fork server, a CLI) or uses moto's
server is marked ``slow``; ``python -m pytest -m "not slow"`` runs the rest in under a minute.
Tests using the moto server are marked here; a test not marked slow that starts a process fails
at its teardown, saying so, so the fast tier stays fast as tests are added.
"""

import copyreg
import os
import subprocess

import pytest
import s3server

from batchfutures import BatchExecutor, LocalEnvironment
from batchfutures.storage import Storage


@pytest.fixture(autouse=True, scope="module")
def _copyreg_as_it_was():
    """Importing lithops (tests/clients/test_lithops.py) or dask.multiprocessing (dask.compute)
    runs tblib's pickling_support.install() when tblib is installed: a reducer for every
    exception type in copyreg, process-wide. Each module's tests see copyreg as it was
    (tests/test_serialization.py tests that case in its own process)."""
    before = dict(copyreg.dispatch_table)
    yield
    copyreg.dispatch_table.clear()
    copyreg.dispatch_table.update(before)


@pytest.fixture(autouse=True, scope="session")
def _private_workdir(tmp_path_factory):
    # BatchExecutor() with no environment must not write into the user's real cache folder.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BATCHFUTURES_WORKDIR", str(tmp_path_factory.mktemp("default-workdir")))
        for name in ("BATCHFUTURES_JOB_QUEUE", "BATCHFUTURES_JOB_DEFINITION", "BATCHFUTURES_IO_BUCKET",
                     "BATCHFUTURES_SIGNING_SECRET"):
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


# -- the fast tier's guard -----------------------------------------------------------------------
SERVER_FIXTURES = {"moto_server"}  # what every test using moto's server requests
_started = []  # what the running unmarked test started


def pytest_collection_modifyitems(items):
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if SERVER_FIXTURES & set(item.fixturenames) or params.get("storage") == "s3":
            item.add_marker(pytest.mark.slow)


def _counting(kind, original):
    def start(*args, **kwargs):
        _started.append(kind)
        return original(*args, **kwargs)
    return start


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_process(request, monkeypatch):
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    monkeypatch.setattr(subprocess.Popen, "_execute_child",
                        _counting("a subprocess", subprocess.Popen._execute_child))
    monkeypatch.setattr(os, "fork", _counting("a fork", os.fork))
    del _started[:]
    yield
    started, _started[:] = list(_started), []
    if started and os.environ.get("BATCHFUTURES_RECORD_SLOW"):  # to mark them in bulk
        with open(os.environ["BATCHFUTURES_RECORD_SLOW"], "a") as report:
            report.write(request.node.nodeid + "\n")
    elif started:
        pytest.fail(f"this test started {len(started)} process(es) ({', '.join(sorted(set(started)))}) "
                    "but is not marked slow: add @pytest.mark.slow", pytrace=False)
