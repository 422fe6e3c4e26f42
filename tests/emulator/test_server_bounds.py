"""Issue 29, point 3: before a request is authenticated, nothing it sends is unbounded (chunk
sizes and lengths parsed strictly, one deadline for headers and body, a cap on connections),
and a signed change is single-use, dated at most 5 minutes ahead, checked over the request's own
path. Each attack is sent as a stranger on the port would send it, on a raw socket."""

from __future__ import annotations

import datetime
import json
import socket
import time
from unittest import mock

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from emulator_harness import wait_until

from batchfutures.emulator import BatchEmulator
from batchfutures.emulator.auth import (
    FUTURE_SKEW,
    MAX_CLOCK_SKEW,
    Refused,
    ReplayGuard,
    check_signature,
    is_read_only,
)
from batchfutures.emulator.server import REQUEST_DEADLINE, EmulatorServer

QUEUE, DEFINITION, REGION = "batchfutures", "batchfutures-worker", "us-east-1"
NO_RETRIES = Config(retries={"mode": "standard", "max_attempts": 0})


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    service = BatchEmulator(tmp_path_factory.mktemp("bounds-emulator"), max_vcpus=1)
    yield service
    service.close()


@pytest.fixture
def server(emulator):
    with EmulatorServer(emulator, request_deadline=1.0, max_connections=4) as running:
        yield running


def client(server):
    return boto3.client("batch", endpoint_url=server.endpoint_url, region_name=REGION,
                        config=NO_RETRIES, **server.credentials)


def signed_bytes(server, method, path, body=b"", *, when=None, extra=None):
    """The exact bytes of a request botocore would sign (what an eavesdropper captures)."""
    host = f"127.0.0.1:{server.port}"
    headers = {"Content-Type": "application/json", **(extra or {})}
    request = AWSRequest(method=method, url=f"http://{host}{path}", data=body, headers=headers)
    signer = SigV4Auth(Credentials(server.access_key_id, server.secret_access_key), "batch", REGION)
    if when is None:
        signer.add_auth(request)
    else:
        with mock.patch("botocore.auth.get_current_datetime", return_value=when):
            signer.add_auth(request)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v.decode() if isinstance(v, bytes) else v}"
              for k, v in request.headers.items() if k.lower() != "host"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def exchange(server, data: bytes, timeout=10.0) -> bytes:
    """Send `data` on a new connection; everything the server answers until it closes or
    stops answering."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as connection:
        try:
            connection.sendall(data)
            connection.shutdown(socket.SHUT_WR)
        except OSError:  # answered and closed before taking it all: read the answer
            pass
        received = b""
        try:
            while chunk := connection.recv(65536):
                received += chunk
        except (socket.timeout, ConnectionResetError):
            pass
        return received


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def jobs_named(server, name):
    batch = client(server)
    return [j for status in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING",
                             "SUCCEEDED", "FAILED")
            for j in batch.list_jobs(jobQueue=QUEUE, jobStatus=status)["jobSummaryList"]
            if j["jobName"] == name]


def submit_body(name):
    return json.dumps({"jobName": name, "jobQueue": QUEUE, "jobDefinition": DEFINITION,
                       "containerOverrides": {"command": ["true"]}}).encode()


# -- lengths and chunks ----------------------------------------------------------------------
def unsigned_head(server, framing: str) -> bytes:
    return (f"POST /v1/submitjob HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Content-Type: application/json\r\n{framing}\r\n").encode()


@pytest.mark.parametrize("size_line", [b"-1", b"+10", b" 10", b"0x10", b"1_0", b"123456789",
                                       b"", b"zz", b"10 ; x", b"10\x00"])
def test_a_chunk_size_that_is_not_hex_digits_is_400(server, size_line):
    head = unsigned_head(server, "Transfer-Encoding: chunked\r\n")
    answer = exchange(server, head + size_line + b"\r\n" + b"x" * 65536)
    assert status_of(answer) == 400, answer[:200]
    assert b"chunk" in answer


def test_the_issues_chunk_of_minus_one_is_refused_before_reading_what_follows(server):
    """The issue's attack: `-1` made the server read to EOF (400 MiB in its memory). Now the
    server answers 400 and closes while the sender still has most of it to send."""
    head = unsigned_head(server, "Transfer-Encoding: chunked\r\n")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(head + b"-1\r\n")
        sent, refused = 0, False
        block = b"x" * (1 << 20)
        try:
            for _ in range(64):  # up to 64 MiB
                connection.sendall(block)
                sent += len(block)
        except (BrokenPipeError, ConnectionResetError):
            refused = True
        if not refused:  # the kernel's buffers took it all: the answer is waiting
            assert status_of(connection.recv(4096)) == 400
    assert refused or sent <= 64 << 20


def test_chunks_over_the_limit_are_413_and_good_chunks_are_read(emulator):
    with EmulatorServer(emulator, max_body=4096) as small:
        head = unsigned_head(small, "Transfer-Encoding: chunked\r\n")
        assert status_of(exchange(small, head + b"ffffffff\r\n")) == 413
        assert status_of(exchange(small, head + b"800\r\n" + b"x" * 2048 + b"\r\n"
                                  + b"801\r\n")) == 413
        # well-formed chunks are read whole: then refused for the missing signature only
        answer = exchange(small, head + b"2\r\n{}\r\n0\r\n\r\n")
        assert status_of(answer) == 403 and b"MissingAuthenticationToken" in answer


@pytest.mark.parametrize("framing", [
    "Content-Length: -1\r\n", "Content-Length: +5\r\n", "Content-Length: 5_0\r\n",
    "Content-Length: 0x10\r\n", "Content-Length: 2\r\nContent-Length: 2\r\n",
    "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n", "Transfer-Encoding: gzip, chunked\r\n",
])
def test_a_length_that_is_not_one_decimal_number_is_400(server, framing):
    answer = exchange(server, unsigned_head(server, framing) + b"{}")
    assert status_of(answer) == 400, answer[:200]


# -- time and connections ----------------------------------------------------------------------
def test_a_slow_request_is_cut_at_its_deadline(server):
    """Slowloris: a header byte every 0.2 s (the issue's every 20 s, faster) would hold the
    thread forever; with a 1 s deadline the connection is closed about 1 s after its first byte."""
    request = unsigned_head(server, "Content-Length: 2\r\n") + b"{}"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        started = time.monotonic()
        closed_after = None
        for byte in request:
            try:
                connection.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
            time.sleep(0.2)
            connection.setblocking(False)
            try:
                if connection.recv(4096) == b"":
                    closed_after = time.monotonic() - started
                    break
            except BlockingIOError:
                pass
            finally:
                connection.setblocking(True)
        assert closed_after is not None, "the whole slow request was taken"
    assert REQUEST_DEADLINE <= 30  # the default: a byte every 20 s gets two bytes in


def test_a_slow_body_is_cut_at_its_deadline_too(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(unsigned_head(server, "Content-Length: 100\r\n") + b"{")
        # the server gives up on the body, answers and closes (recv's 10 s timeout otherwise)
        answer = connection.recv(4096)
        assert status_of(answer) == 400


def test_connections_over_the_cap_are_closed_and_the_endpoint_still_serves(server):
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(4)]
    try:
        wait_until(lambda: len(server._httpd._connections) == 4, "4 connections served")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as extra:
            extra.sendall(b"GET / HTTP/1.1\r\n")
            assert extra.recv(4096) == b""  # closed at once, no thread for it
    finally:
        for connection in idle:
            connection.close()
    # the slots come back as those connections end
    wait_until(lambda: len(server._httpd._connections) == 0, "the idle connections to end")
    assert client(server).describe_job_queues()["jobQueues"]


# -- signatures -----------------------------------------------------------------------------
@pytest.mark.slow
def test_a_captured_submit_job_replayed_runs_nothing_more(server):
    """An eavesdropper resends the exact bytes of a signed SubmitJob inside the window."""
    captured = signed_bytes(server, "POST", "/v1/submitjob", submit_body("replayed"))
    assert status_of(exchange(server, captured)) == 200
    for _ in range(3):
        answer = exchange(server, captured)
        assert status_of(answer) == 429 and b"already used" in answer
    assert len(jobs_named(server, "replayed")) == 1


def test_a_repeated_read_is_served_and_botocore_is_not_refused(server):
    captured = signed_bytes(server, "POST", "/v1/describejobqueues", b"{}")
    assert status_of(exchange(server, captured)) == 200
    assert status_of(exchange(server, captured)) == 200  # a read changes nothing
    batch = client(server)
    for _ in range(5):  # equal calls in one second: one signature, all served
        assert batch.describe_job_queues()["jobQueues"]


@pytest.mark.parametrize("ahead, served", [
    (datetime.timedelta(minutes=4), True),
    (datetime.timedelta(minutes=6), False),   # the issue: 14 minutes ahead was accepted
    (datetime.timedelta(minutes=14), False),
    (-datetime.timedelta(minutes=14), True),  # AWS's 15 minutes back
    (-datetime.timedelta(minutes=16), False),
])
def test_a_request_dated_ahead_is_refused_past_5_minutes(server, ahead, served):
    when = datetime.datetime.now(datetime.timezone.utc) + ahead
    answer = exchange(server, signed_bytes(server, "POST", "/v1/describejobqueues", b"{}",
                                           when=when))
    assert (status_of(answer) == 200) is served, answer[:300]
    if not served:
        assert status_of(answer) == 403
    assert FUTURE_SKEW == datetime.timedelta(minutes=5) and MAX_CLOCK_SKEW.seconds == 900


def test_the_signature_is_over_the_request_lines_own_path():
    """The signed path is the path routed, whatever the Host header holds."""
    def headers_for(host, signed_path):
        request = AWSRequest(method="POST", url=f"http://{host}{signed_path}", data=b"{}",
                             headers={"Host": host, "Content-Type": "application/json"})
        SigV4Auth(Credentials("AKID", "secret"), "batch", REGION).add_auth(request)
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in request.headers.items()}

    class Headers(dict):
        def get_all(self, name):
            found = [v for k, v in self.items() if k.lower() == name.lower()]
            return found or None

        def get(self, name, default=None):
            found = self.get_all(name)
            return found[0] if found else default

    good = Headers(headers_for("127.0.0.1:1", "/v1/describejobqueues"))
    check_signature("POST", "/v1/describejobqueues", good, b"{}", "AKID", "secret")
    with pytest.raises(Refused) as other_path:
        check_signature("POST", "/v1/submitjob", good, b"{}", "AKID", "secret")
    assert other_path.value.status == 403
    with pytest.raises(Refused) as absolute:  # an absolute-form target is not a path
        check_signature("POST", "http://127.0.0.1:1/v1/describejobqueues", good, b"{}", "AKID",
                        "secret")
    assert absolute.value.status == 400
    # a Host with a path in it no longer moves the signed path (the URL was Host + path)
    odd = Headers(headers_for("127.0.0.1:1", "/v1/describejobqueues"))
    odd["Host"] = "127.0.0.1:1/v1"
    with pytest.raises(Refused):
        check_signature("POST", "/describejobqueues", odd, b"{}", "AKID", "secret")


def test_a_host_header_with_a_path_in_it_is_400(server):
    answer = exchange(server, (f"POST /v1/describejobqueues HTTP/1.1\r\n"
                               f"Host: 127.0.0.1:{server.port}/v1\r\nContent-Length: 0\r\n\r\n"
                               ).encode())
    assert status_of(answer) == 400 and b"InvalidHostHeader" in answer


@pytest.mark.parametrize("operation, read_only", [
    ("DescribeJobs", True), ("ListJobs", True), ("GetLogEvents", True), ("FilterLogEvents", True),
    ("SubmitJob", False), ("CancelJob", False), ("TerminateJob", False), ("TagResource", False),
    ("RegisterJobDefinition", False), ("CreateJobQueue", False), ("Listen", False),
])
def test_which_operations_a_repeated_signature_may_call(operation, read_only):
    assert is_read_only(operation) is read_only


def test_the_seen_signatures_are_bounded_and_expire_with_the_window():
    guard = ReplayGuard(limit=3)
    now = datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc)
    for signature in ("a1", "b2", "c3"):
        guard.admit(signature, now, now)
    with pytest.raises(Refused) as repeated:
        guard.admit("a1", now, now)
    assert repeated.value.status == 429
    with pytest.raises(Refused) as full:  # a fourth while all three are inside the window
        guard.admit("d4", now, now)
    assert full.value.status == 429 and len(guard) == 3
    later = now + MAX_CLOCK_SKEW + datetime.timedelta(seconds=1)
    guard.admit("d4", later, later)  # the first three expired with their window
    assert len(guard) == 1
    guard.admit("a1", later, later)  # (refused by its date anyway, by then)


def test_an_attacker_without_the_key_is_still_refused_fast(server, emulator):
    with pytest.raises(ClientError) as refused:
        boto3.client("batch", endpoint_url=server.endpoint_url, region_name=REGION,
                     aws_access_key_id=server.access_key_id, aws_secret_access_key="guess",
                     config=NO_RETRIES).submit_job(jobName="guess", jobQueue=QUEUE,
                                                   jobDefinition=DEFINITION,
                                                   containerOverrides={"command": ["true"]})
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert jobs_named(server, "guess") == []
