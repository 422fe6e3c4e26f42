"""pytest fixtures: moto's real S3 server on 127.0.0.1, fake credentials, fresh buckets.

Fixture names (import the ones you use *and* the ones they depend on):

    moto_server   (session)   endpoint URL "http://127.0.0.1:<port>" of one ThreadedMotoServer,
                              shared by every module of the process, stopped at session end
    s3_endpoint   (session)   the same URL, with the fake credentials, AWS_DEFAULT_REGION and
                              AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL set in os.environ for the
                              rest of the session (restored at its end); a drop-in for the
                              fixture of the same name in tests/conftest.py
    aws_env       (function)  the same variables set with monkeypatch for one test (restored
                              after it); returns them as a dict, e.g. for a subprocess's env
    s3_bucket     (function)  a fresh bucket created with boto3 on the server (aws_env applied)
    s3_root       (function)  "s3://<fresh bucket>/prefix" (aws_env applied)

And `emulator_endpoint(folder, max_vcpus)`, a context manager: an emulator behind its HTTP
endpoint with boto3 pointed at it (for module-scoped fixtures of the AWS-path tests).

    from s3server import aws_env, moto_server, s3_bucket, s3_root  # noqa: F401  (fixtures)

tests/ has no __init__.py; pytest puts it on sys.path (rootdir-relative "prepend" import mode),
so the module is imported as ``s3server``. Importing the fixtures in a test module registers them
for that module only; the server itself is one per process however often it is registered.

All traffic goes to 127.0.0.1: fake keys, no profile, no config or credentials files, no instance
metadata lookups, and 127.0.0.1 exempt from any proxy. (botocore >= 1.31 and hence s3fs read
AWS_ENDPOINT_URL_S3 by themselves; batchfutures.storage also passes it to s3fs explicitly.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from typing import Dict, Iterator, Optional

import pytest

REGION = "us-east-1"
PREFIX = "prefix"

_lock = threading.Lock()
_server: Optional[object] = None
_endpoint: Optional[str] = None
_users = 0


def _acquire() -> str:
    """Start the shared server on first use, on a free port (port 0: the OS picks one)."""
    global _server, _endpoint, _users
    with _lock:
        if _server is None:
            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
            server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            server.start()
            host, port = server.get_host_and_port()
            _server, _endpoint = server, f"http://{host}:{port}"
        _users += 1
        assert _endpoint is not None
        return _endpoint


def _release() -> None:
    global _server, _endpoint, _users
    with _lock:
        _users -= 1
        if _users == 0 and _server is not None:
            _server.stop()  # type: ignore[attr-defined]
            _server = _endpoint = None


def fake_aws_variables(endpoint: str) -> Dict[str, str]:
    """What points boto3, s3fs and a worker subprocess at the server, with fake credentials."""
    no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY", ""), "127.0.0.1", "localhost"]))
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
    }


_REMOVED = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """The endpoint URL of moto's threaded server (started once, stopped after the session)."""
    endpoint = _acquire()
    yield endpoint
    _release()


@pytest.fixture(scope="session")
def s3_endpoint(moto_server: str) -> Iterator[str]:
    """The endpoint, with fake credentials and endpoint variables set for the whole session."""
    values = fake_aws_variables(moto_server)
    saved = {key: os.environ.get(key) for key in (*values, *_REMOVED)}
    for key in _REMOVED:
        os.environ.pop(key, None)
    os.environ.update(values)
    yield moto_server
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def aws_env(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> Dict[str, str]:
    """Fake credentials and endpoint variables in os.environ for this test; returns them."""
    values = fake_aws_variables(moto_server)
    for key in _REMOVED:
        monkeypatch.delenv(key, raising=False)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


@pytest.fixture
def s3_bucket(aws_env: Dict[str, str]) -> str:
    """A fresh, empty bucket on the server, created with boto3 (explicit endpoint and keys)."""
    import boto3

    name = f"bf-test-{uuid.uuid4().hex[:16]}"
    client = boto3.client("s3", endpoint_url=aws_env["AWS_ENDPOINT_URL_S3"], region_name=REGION,
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_root(s3_bucket: str) -> str:
    """``s3://<fresh bucket>/prefix`` for this test, with the endpoint variables set."""
    return f"s3://{s3_bucket}/{PREFIX}"


@contextlib.contextmanager
def emulator_endpoint(folder, max_vcpus: int) -> Iterator[object]:
    """An emulator behind its HTTP endpoint, with boto3's batch and logs clients pointed at it
    (AWS_ENDPOINT_URL_BATCH / _CLOUDWATCH_LOGS, as a user would point them at any compatible
    endpoint); yields the emulator, and stops both afterwards."""
    from batchfutures.emulator import BatchEmulator
    from batchfutures.emulator.server import EmulatorServer

    emulator = BatchEmulator(folder, max_vcpus=max_vcpus)
    server = EmulatorServer(emulator).start()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("AWS_ENDPOINT_URL_BATCH", server.endpoint_url)
            patch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH_LOGS", server.endpoint_url)
            # AWSBatchEnvironment signs payloads with a key the bucket does not hold (signing.py);
            # the workers, local processes here, inherit it as a container would get it
            patch.setenv("BATCHFUTURES_SIGNING_KEY", "aws-path-tests-" + "k" * 32)
            yield emulator
    finally:
        server.stop()
        emulator.close()
