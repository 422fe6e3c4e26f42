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
endpoint with boto3 pointed at it, signing with the endpoint's credentials (for module-scoped
fixtures of the AWS-path tests).

S3's harshness on demand: `S3FaultProxy(upstream, rate=..., seed=...)`, a loopback HTTP proxy in
front of the moto server that answers a chosen fraction of requests with S3's `503 SlowDown`
(its XML error body) and forwards the rest unchanged; `.endpoint`, `.set(rate, seed=...,
methods=...)`, `.injected`, `.forwarded`, `.start()`, `.stop()` (also a context manager).

    s3_faults     (function)  a proxy (rate 0 until `.set`) in front of moto_server, with
                              AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL pointing at it for the test

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
import http.client
import logging
import os
import random
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, FrozenSet, Iterable, Iterator, Optional
from urllib.parse import urlsplit

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


def new_bucket() -> str:
    """A fresh bucket on the moto server boto3 is pointed at (s3_endpoint); its name."""
    import boto3

    name = f"bf-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=name)
    return name


def emulator_environment(bucket: str, **settings):
    """The AWSBatchEnvironment of the queue and worker definition behind emulator_endpoint."""
    from batchfutures import AWSBatchEnvironment

    if "image" not in settings:
        settings.setdefault("job_definition", "batchfutures-worker")
    return AWSBatchEnvironment(job_queue="batchfutures", io_bucket=bucket, region_name=REGION,
                               **settings)


@contextlib.contextmanager
def private_moto_server() -> Iterator[str]:
    """A moto server of one test module's own (its IAM enforcement and CloudFormation state are
    that module's alone); yields its endpoint URL on 127.0.0.1."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def admin_clients(endpoint: str):
    """A client factory, ``clients("iam")``, for the test account of the moto server at
    ``endpoint``."""
    import boto3

    session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                    region_name=REGION)
    return lambda service: session.client(service, endpoint_url=endpoint)


EMULATOR_KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@contextlib.contextmanager
def emulator_endpoint(folder, max_vcpus: int, **settings) -> Iterator[object]:
    """An emulator behind its HTTP endpoint, with boto3's batch and logs clients pointed at it
    (AWS_ENDPOINT_URL_BATCH / _CLOUDWATCH_LOGS, as a user would point them at any compatible
    endpoint); yields the emulator, and stops both afterwards. ``settings``: BatchEmulator's.
    The server serves requests signed with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (the fake
    "testing" pair of s3_endpoint; EMULATOR_KEYS when unset), which are set for the block."""
    from batchfutures.emulator import BatchEmulator
    from batchfutures.emulator.server import EmulatorServer

    # the endpoint serves only requests signed with its pair: the process's (fake) credentials,
    # which boto3, the CLI and the workers sign with, as they would with real ones on AWS
    key_id = os.environ.get("AWS_ACCESS_KEY_ID") or EMULATOR_KEYS["aws_access_key_id"]
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY") or EMULATOR_KEYS["aws_secret_access_key"]
    emulator = BatchEmulator(folder, max_vcpus=max_vcpus, **settings)
    server = EmulatorServer(emulator, access_key_id=key_id, secret_access_key=secret).start()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("AWS_ENDPOINT_URL_BATCH", server.endpoint_url)
            patch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH_LOGS", server.endpoint_url)
            patch.setenv("AWS_ACCESS_KEY_ID", key_id)
            patch.setenv("AWS_SECRET_ACCESS_KEY", secret)
            # AWSBatchEnvironment signs payloads with a key the bucket does not hold (signing.py);
            # the workers, local processes here, inherit it as a container would get it
            patch.setenv("BATCHFUTURES_SIGNING_KEY", "aws-path-tests-" + "k" * 32)
            yield emulator
    finally:
        server.stop()
        emulator.close()


SLOW_DOWN = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             '<Message>Please reduce your request rate.</Message>'
             '<RequestId>{request_id}</RequestId><HostId>{host_id}</HostId></Error>')
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
               "proxy-connection", "content-length"}


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_ProxyServer"

    def log_message(self, format: str, *args: object) -> None:  # no line per request
        pass

    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        body = self._body()
        proxy = self.server.proxy
        if proxy.should_fail(self.command):
            request_id = uuid.uuid4().hex[:16].upper()
            answer = SLOW_DOWN.format(request_id=request_id, host_id=uuid.uuid4().hex).encode()
            self.send_response(503, "Slow Down")
            self.send_header("Content-Type", "application/xml")
            self.send_header("x-amz-request-id", request_id)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(answer)
            return
        upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            self.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in _HOP_BY_HOP:
                    self.send_header(key, value)
            length = response.getheader("Content-Length")
            self.send_header("Content-Length", length if self.command == "HEAD" and length
                             else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            upstream.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, proxy: "S3FaultProxy") -> None:
        self.proxy = proxy
        super().__init__(("127.0.0.1", 0), _ProxyHandler)


class S3FaultProxy:
    """A loopback proxy in front of an S3 endpoint answering `rate` of requests 503 SlowDown."""

    def __init__(self, upstream: str, rate: float = 0.0, *, seed: Optional[int] = None,
                 methods: Optional[Iterable[str]] = None) -> None:
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname or "127.0.0.1", parts.port or 80
        self.injected = 0
        self.forwarded = 0
        self._lock = threading.Lock()
        self._server: Optional[_ProxyServer] = None
        self._thread: Optional[threading.Thread] = None
        self.set(rate, seed=seed, methods=methods)

    def set(self, rate: float, *, seed: Optional[int] = None,
            methods: Optional[Iterable[str]] = None) -> None:
        """Fail `rate` of the requests (of `methods` only, e.g. {"GET"}), seeded for repeatability."""
        if not 0 <= rate <= 1:
            raise ValueError(f"rate {rate!r} must be between 0 and 1")
        with self._lock:
            self.rate = rate
            self.methods: Optional[FrozenSet[str]] = frozenset(methods) if methods else None
            self._random = random.Random(seed)

    def should_fail(self, method: str) -> bool:
        with self._lock:
            if self.rate and (self.methods is None or method in self.methods) \
                    and self._random.random() < self.rate:
                self.injected += 1
                return True
            self.forwarded += 1
            return False

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "the proxy is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "S3FaultProxy":
        if self._server is None:
            self._server = _ProxyServer(self)
            self._thread = threading.Thread(target=self._server.serve_forever,
                                            kwargs={"poll_interval": 0.05}, daemon=True,
                                            name="s3-fault-proxy")
            self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            if self._thread is not None:
                self._thread.join()

    def __enter__(self) -> "S3FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def s3_faults(moto_server: str, aws_env: Dict[str, str],
              monkeypatch: pytest.MonkeyPatch) -> Iterator[S3FaultProxy]:
    """A fault proxy in front of the moto server (no faults until `.set`), S3 pointed at it."""
    with S3FaultProxy(moto_server) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        aws_env.update(AWS_ENDPOINT_URL_S3=proxy.endpoint, AWS_ENDPOINT_URL=proxy.endpoint)
        yield proxy
