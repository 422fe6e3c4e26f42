"""Storage's retry budget (STORAGE_RETRY): which errors are retried, how long, and that a burst of
S3 503 SlowDown longer than the old budget (4 attempts in ~1.4 s) is carried end to end.

The policy is tested on a fake clock (tenacity's clock and its ``sleep`` hook), never wall time;
the end-to-end tests go through real s3fs to moto's server behind a loopback proxy.
"""

from __future__ import annotations

import errno
import time
import types
import uuid
from typing import Any, Dict, List, Optional

import aiohttp
import botocore.exceptions
import pytest
import s3fs.errors
import s3server
import tenacity
from loopback_proxy import Answer, Forward, LoopbackProxy, Request
from s3server import SLOW_DOWN

from batchfutures.storage import STORAGE_RETRY, Storage, _retrying, _transient

# moto S3 fixtures (tests/s3server.py), registered for this module
moto_server, aws_env, s3_bucket = s3server.moto_server, s3server.aws_env, s3server.s3_bucket


# -- which errors are transient ----------------------------------------------------------------
def s3_error(status: int, code: str, operation: str = "GetObject", **error: str) -> BaseException:
    """The exception Storage sees from s3fs for an S3 answer (s3fs's own translation)."""
    response: Dict[str, Any] = {"Error": {"Code": code, "Message": code, **error},
                                "ResponseMetadata": {"HTTPStatusCode": status}}
    return s3fs.errors.translate_boto_error(botocore.exceptions.ClientError(response, operation))


TRANSIENT = {
    "503 SlowDown": s3_error(503, "SlowDown"),
    "503 ServiceUnavailable": s3_error(503, "ServiceUnavailable"),
    "500 InternalError": s3_error(500, "InternalError"),
    "502 (a code s3fs does not know)": s3_error(502, "BadGateway"),
    "504 (a code s3fs does not know)": s3_error(504, "GatewayTimeout"),
    "429 throttling": s3_error(429, "TooManyRequests"),
    "400 RequestTimeout": s3_error(400, "RequestTimeout"),
    "409 ConditionalRequestConflict": s3_error(409, "ConditionalRequestConflict", "PutObject"),
    "409 OperationAborted": s3_error(409, "OperationAborted", "PutObject"),
    "TimeoutError": TimeoutError(),
    "ConnectionResetError": ConnectionResetError(),
    "OSError EBUSY without a cause": OSError(errno.EBUSY, "SlowDown"),
    "OSError without errno": OSError("InternalError"),
    "botocore EndpointConnectionError": botocore.exceptions.EndpointConnectionError(
        endpoint_url="http://127.0.0.1:1"),
    "botocore ReadTimeoutError": botocore.exceptions.ReadTimeoutError(endpoint_url="x"),
    "botocore ConnectionClosedError": botocore.exceptions.ConnectionClosedError(
        endpoint_url="x"),
    "botocore ResponseStreamingError": botocore.exceptions.ResponseStreamingError(error="x"),
    "aiohttp ServerDisconnectedError": aiohttp.ServerDisconnectedError(),
    "aiohttp ClientPayloadError": aiohttp.ClientPayloadError("truncated"),
}
PERMANENT = {
    "404 NoSuchKey": s3_error(404, "NoSuchKey"),
    "403 AccessDenied": s3_error(403, "AccessDenied"),
    "400 ExpiredToken": s3_error(400, "ExpiredToken"),
    "412 If-None-Match (a lost conditional write)": s3_error(
        412, "PreconditionFailed", "PutObject", Condition="If-None-Match"),
    "412 PreconditionFailed": s3_error(412, "PreconditionFailed", "PutObject"),
    "416 InvalidRange": s3_error(416, "InvalidRange"),
    "501 NotImplemented": s3_error(501, "NotImplemented", "PutObject"),
    "400 (a code s3fs does not know)": s3_error(400, "InvalidObjectName"),
    "FileNotFoundError": FileNotFoundError(),
    "FileExistsError": FileExistsError(),
    "PermissionError": PermissionError(),
    "OSError EINVAL": OSError(errno.EINVAL, "bad request"),
    "OSError ENOSPC (a local disk)": OSError(errno.ENOSPC, "no space"),
    "ValueError": ValueError("x"),
}


@pytest.mark.parametrize("name", sorted(TRANSIENT))
def test_transient_errors_are_retried(name):
    assert _transient(TRANSIENT[name])


@pytest.mark.parametrize("name", sorted(PERMANENT))
def test_permanent_errors_are_not(name):
    assert not _transient(PERMANENT[name])


def test_the_table_reads_s3fs_translations():
    # what the rows above stand for: s3fs's own exception types, the ClientError kept as cause
    assert isinstance(PERMANENT["412 If-None-Match (a lost conditional write)"], FileExistsError)
    assert isinstance(TRANSIENT["400 RequestTimeout"], TimeoutError)
    assert TRANSIENT["503 SlowDown"].errno == errno.EBUSY
    assert TRANSIENT["502 (a code s3fs does not know)"].errno == errno.EIO
    assert isinstance(TRANSIENT["503 SlowDown"].__cause__, botocore.exceptions.ClientError)


# -- the budget, on a fake clock -----------------------------------------------------------------
class FakeClock:
    """tenacity's clock: ``sleep`` (the Retrying hook) moves it; attempts take ``per_call`` s."""

    def __init__(self, per_call: float = 0.0) -> None:
        self.now = 1000.0
        self.per_call = per_call
        self.sleeps: List[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(tenacity, "time", types.SimpleNamespace(monotonic=fake.monotonic))
    return fake


def failing(clock: FakeClock, error: BaseException, succeed_on: Optional[int] = None):
    calls: List[float] = []

    def call() -> str:
        calls.append(clock.now)
        clock.now += clock.per_call
        if succeed_on is not None and len(calls) >= succeed_on:
            return "ok"
        raise error

    return call, calls


def test_the_budget_is_about_ten_attempts_over_about_twenty_seconds():
    assert STORAGE_RETRY.attempts == 10
    assert STORAGE_RETRY.seconds == 20.0
    assert STORAGE_RETRY.first_wait <= 1.0 and STORAGE_RETRY.max_wait <= 5.0
    policy = _retrying()
    assert isinstance(policy.wait, tenacity.wait_random_exponential)  # full jitter
    assert policy.reraise  # the caller sees S3's error, not tenacity's RetryError


def test_short_waits_get_all_ten_attempts(clock, monkeypatch):
    monkeypatch.setattr(tenacity.wait.random, "uniform", lambda low, high: low)
    call, calls = failing(clock, s3_error(503, "SlowDown"))
    with pytest.raises(OSError, match="SlowDown"):
        _retrying(sleep=clock.sleep)(call)
    assert len(calls) == STORAGE_RETRY.attempts == 10


def test_the_longest_waits_stop_before_the_seconds_run_out(clock, monkeypatch):
    monkeypatch.setattr(tenacity.wait.random, "uniform", lambda low, high: high)
    call, calls = failing(clock, s3_error(503, "SlowDown"))
    with pytest.raises(OSError):
        _retrying(sleep=clock.sleep)(call)
    # the widest windows: 0.5, 1, 2, 4, then the 5 s cap; a wait ending past 20 s never starts
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert len(calls) == 7 and clock.now - calls[0] <= STORAGE_RETRY.seconds


def test_slow_attempts_count_against_the_seconds(clock):
    clock.per_call = 3.0  # e.g. connect timeouts: each attempt takes 3 s before it fails
    call, calls = failing(clock, TimeoutError())
    with pytest.raises(TimeoutError):
        _retrying(sleep=clock.sleep)(call)
    assert len(calls) < STORAGE_RETRY.attempts
    assert calls[-1] + clock.per_call - calls[0] <= STORAGE_RETRY.seconds + clock.per_call


def test_waits_are_jittered_within_their_windows(clock):
    runs = []
    for _ in range(50):
        clock.sleeps = []
        call, _calls = failing(clock, s3_error(503, "SlowDown"))
        with pytest.raises(OSError):
            _retrying(sleep=clock.sleep)(call)
        for n, wait in enumerate(clock.sleeps):
            assert 0 <= wait <= min(STORAGE_RETRY.max_wait, STORAGE_RETRY.first_wait * 2 ** n)
        assert sum(clock.sleeps) <= STORAGE_RETRY.seconds
        runs.append(tuple(clock.sleeps))
    assert len(set(runs)) == len(runs)  # no two runs wait alike: children do not come back together
    firsts = [run[0] for run in runs]
    assert min(firsts) < STORAGE_RETRY.first_wait / 4 and max(firsts) > STORAGE_RETRY.first_wait / 2


def test_a_transient_error_then_success_returns_the_value(clock):
    call, calls = failing(clock, s3_error(503, "SlowDown"), succeed_on=6)
    assert _retrying(sleep=clock.sleep)(call) == "ok"
    assert len(calls) == 6 and len(clock.sleeps) == 5


@pytest.mark.parametrize("name", sorted(PERMANENT))
def test_a_permanent_error_fails_at_once(clock, name):
    call, calls = failing(clock, PERMANENT[name])
    with pytest.raises(type(PERMANENT[name])):
        _retrying(sleep=clock.sleep)(call)
    assert len(calls) == 1 and clock.sleeps == []


# -- one retry layer: s3fs's loop and botocore's retries are off ----------------------------------
def test_s3_storage_has_one_retry_layer(aws_env):
    given = {"config_kwargs": {"read_timeout": 5}}
    storage = Storage("s3://bucket/prefix", storage_options=given)
    assert given == {"config_kwargs": {"read_timeout": 5}}  # the caller's dict untouched
    assert storage.fs.retries == 1
    assert storage.fs.config_kwargs == {
        "read_timeout": 5, "retries": {"mode": "standard", "total_max_attempts": 1}}
    # the worker's Storage (Storage.from_url, no options) is the same
    worker = Storage.from_url("s3://bucket/prefix/runs/r/jobs/k")
    assert worker.fs.retries == 1
    assert worker.fs.config_kwargs["retries"]["total_max_attempts"] == 1


def test_a_callers_own_retries_are_kept(aws_env):
    storage = Storage("s3://bucket/other", storage_options={
        "retries": 3, "config_kwargs": {"retries": {"mode": "adaptive", "max_attempts": 2}},
        "skip_instance_cache": True})
    assert storage.fs.retries == 3
    assert storage.fs.config_kwargs["retries"] == {"mode": "adaptive", "max_attempts": 2}


def test_local_errors_are_never_retried(tmp_path):
    storage = Storage((tmp_path / "storage").as_uri())
    calls = []

    def fail() -> None:
        calls.append(1)
        raise OSError(errno.EIO, "disk")

    with pytest.raises(OSError):
        storage._retried(fail)
    assert calls == [1]


# -- end to end: real s3fs, moto, a proxy answering 503 SlowDown ---------------------------------
class SlowDownBurst:
    """A proxy rule: every request answered 503 SlowDown for ``seconds`` once armed."""

    def __init__(self) -> None:
        self.until = 0.0
        self.slowed: List[str] = []
        self.refused: Dict[str, int] = {}  # path -> status, answered always

    def arm(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds

    def __call__(self, request: Request) -> Any:
        for path, status in self.refused.items():
            if request.path.split("?")[0].endswith(path):
                return Answer(status, b"<Error><Code>AccessDenied</Code><Message>no</Message>"
                                      b"</Error>", {"Content-Type": "application/xml"})
        if time.monotonic() < self.until:
            self.slowed.append(f"{request.method} {request.path}")
            body = SLOW_DOWN.format(request_id=uuid.uuid4().hex[:16], host_id="h").encode()
            return Answer(503, body, {"Content-Type": "application/xml"})
        return Forward()


@pytest.fixture
def burst(moto_server, aws_env, s3_bucket, monkeypatch):
    rule = SlowDownBurst()
    with LoopbackProxy(moto_server, rule) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        storage = Storage(f"s3://{s3_bucket}/prefix",
                          storage_options={"skip_instance_cache": True})
        yield rule, proxy, storage


OLD_BUDGET = 1.4  # seconds: 4 attempts, waits of at most 0.2, 0.4 and 0.8 s
BURST = 2.5


def test_a_slowdown_burst_longer_than_the_old_budget_is_carried(burst):
    rule, proxy, storage = burst
    url = storage.url("runs/r/functions/f.pkl")  # what every child of a run GETs
    storage.put_bytes(url, b"function")
    rule.arm(BURST)  # every request refused for longer than the old budget's ~1.4 s
    assert BURST > OLD_BUDGET
    assert storage.get_bytes(url) == b"function"
    assert len(rule.slowed) >= 2
    rule.arm(BURST)
    storage.put_bytes(storage.url("runs/r/jobs/k/results/0"), b"result")  # writes too
    rule.arm(0)
    assert storage.get_bytes(storage.url("runs/r/jobs/k/results/0")) == b"result"


def test_permanent_answers_fail_at_once_through_s3fs(burst):
    rule, proxy, storage = burst
    url = storage.url("runs/r/jobs/k/results/0")
    assert storage.put_bytes(url, b"first", exclusive=True)
    sent = len(proxy.requests)
    assert storage.get_bytes(storage.url("missing")) is None  # 404
    assert not storage.put_bytes(url, b"second", exclusive=True)  # 412: the first write stays
    rule.refused["/forbidden"] = 403
    with pytest.raises(PermissionError):
        storage.get_bytes(storage.url("forbidden"))
    assert len(proxy.requests) - sent == 3  # one request each, no retry (and no wait)
    assert storage.get_bytes(url) == b"first"
