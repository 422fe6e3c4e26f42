"""One request budget per process (issue 28, point 3), and SubmitJob's size limits (point 4).

The decisions are tabled: the bucket (`budget.refill`, `token_delay`, `TokenBucket.reserve`), the
rate's validation, the poller's spread (`poller.pages_this_round`, `jobs_to_describe`), the
throttled SubmitJob's wait (`batchapi.throttle_wait`), which bulk-stop entries are sent again
(`batchapi.split_stop_errors`) and the request's size (`submission.request_size_problem`). Then
the real parts: the emulator (in process, threads launcher) with an account budget, a bulk
TerminateJobs whose entries it answers ThrottlingException, and executors whose every call
succeeds under throttling.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from batchfutures import BatchExecutor, ConfigurationError, LocalEnvironment, batchapi, budget
from batchfutures.batchapi import RetryBudget, Stop
from batchfutures.batchlimits import MAX_SUBMIT_PAYLOAD
from batchfutures.emulator.faults import FaultProfile
from batchfutures.emulator.service import BatchEmulator
from batchfutures.poller import jobs_to_describe, pages_this_round
from batchfutures.submission import (
    ECS_OVERRIDES_LIMIT,
    OVERRIDES_RESERVE,
    request_size_problem,
)


# -- the bucket ----------------------------------------------------------------------------------
@pytest.mark.parametrize("tokens, burst, rate, elapsed, expected", [
    (0.0, 5.0, 2.0, 1.0, 2.0),      # two a second
    (4.5, 5.0, 2.0, 1.0, 5.0),      # never past the burst
    (-3.0, 5.0, 2.0, 1.0, -1.0),    # a debt of reservations is paid back first
    (1.0, 5.0, 2.0, 0.0, 1.0),      # no time, no token
    (1.0, 5.0, 2.0, -1.0, 1.0),     # a clock that went back changes nothing
])
def test_refill(tokens, burst, rate, elapsed, expected):
    assert budget.refill(tokens, burst, rate, elapsed) == pytest.approx(expected)


@pytest.mark.parametrize("tokens, rate, expected", [
    (1.0, 4.0, 0.0),
    (3.5, 4.0, 0.0),
    (0.5, 4.0, 0.125),
    (0.0, 4.0, 0.25),
    (-2.0, 4.0, 0.75),  # two callers reserved ahead: the third token is 0.75 s away
])
def test_token_delay(tokens, rate, expected):
    assert budget.token_delay(tokens, rate) == pytest.approx(expected)


@pytest.mark.parametrize("rate, burst, times, delays", [
    (4.0, 2.0, [0, 0, 0, 0], [0, 0, 0.25, 0.5]),          # a burst, then one per 1/rate
    (4.0, 1.0, [0, 1, 2], [0, 0, 0]),                     # spaced calls never wait
    (2.0, 1.0, [0, 0, 0.5, 0.5], [0, 0.5, 0.5, 1.0]),    # the waiters queue up in order
])
def test_reservations_are_first_come_first_served(rate, burst, times, delays):
    bucket = budget.TokenBucket(rate, burst, times[0])
    assert [bucket.reserve(t) for t in times] == pytest.approx(delays)


def test_take_refuses_without_debt():
    bucket = budget.TokenBucket(1.0, 1.0, 0.0)
    assert [bucket.take(t) for t in (0.0, 0.1, 0.5, 1.0)] == [True, False, False, True]


@pytest.mark.parametrize("value, expected", [
    (20, 20.0), ("4", 4.0), ("0.5", 0.5), (1e3, 1000.0),
])
def test_rate_accepted(value, expected):
    assert budget.parse_rate(value, "request_rate") == expected


@pytest.mark.parametrize("value", [0, -1, "0", "", "fast", "nan", "inf", float("inf"), None,
                                   True, [5]])
def test_rate_refused_naming_its_source(value):
    with pytest.raises(ConfigurationError, match="BATCHFUTURES_REQUEST_RATE="):
        budget.parse_rate(value, "BATCHFUTURES_REQUEST_RATE")


def test_shared_budget_takes_the_smallest_rate():
    key = ("http://shared.test", "eu-west-1", os.getpid(), time.monotonic())
    first = budget.shared_budget(key, 20)
    assert budget.shared_budget(key, 50) is first and first.rate == 20
    assert budget.shared_budget(key, 5) is first and first.rate == 5
    assert budget.shared_budget(("elsewhere", time.monotonic()), 50).rate == 50


def test_budget_acquire_sleeps_for_its_token():
    now = [0.0]
    slept: List[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)

    shared = budget.RequestBudget(2.0, 1.0, clock=lambda: now[0], sleep=sleep)
    assert [shared.acquire() for _ in range(3)] == pytest.approx([0.0, 0.5, 1.0])
    assert slept == pytest.approx([0.5, 1.0]) and shared.requests == 3
    assert shared.tokens() == pytest.approx(-2.0)


# -- environments -------------------------------------------------------------------------------
def test_aws_environment_rate_from_argument_variable_and_default(monkeypatch):
    from batchfutures import AWSBatchEnvironment

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv(budget.RATE_VARIABLE, raising=False)
    make = lambda **kw: AWSBatchEnvironment("q", "bucket-name", "d", **kw)  # noqa: E731
    assert make().request_rate == budget.DEFAULT_REQUEST_RATE == 20
    assert make(request_rate=7).request_rate == 7
    monkeypatch.setenv(budget.RATE_VARIABLE, "3.5")
    assert make().request_rate == 3.5
    assert make(request_rate=9).request_rate == 9  # the argument wins
    monkeypatch.setenv(budget.RATE_VARIABLE, "-2")
    with pytest.raises(ConfigurationError, match="BATCHFUTURES_REQUEST_RATE='-2'"):
        make()
    with pytest.raises(ConfigurationError, match="request_rate=0"):
        make(request_rate=0)


def test_mapping_key(monkeypatch):
    from batchfutures.environments import resolve_environment

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    env = resolve_environment({"job_queue": "q", "io_bucket": "bucket-name",
                               "job_definition": "d", "request_rate": 6})
    assert env.request_rate == 6


def test_local_environment_is_unbudgeted_unless_asked(tmp_path):
    plain = LocalEnvironment(tmp_path / "a")
    assert plain.request_rate is None
    budgeted = LocalEnvironment(tmp_path / "c", request_rate=50)
    try:
        assert plain.batch is plain.emulator  # the local default: as fast as the emulator
        assert budgeted.batch.unbudgeted is budgeted.emulator
        assert budgeted.batch.request_budget.rate == 50
    finally:
        plain.emulator.close()
        budgeted.emulator.close()
    with pytest.raises(ConfigurationError, match="request_rate"):
        LocalEnvironment(tmp_path / "b", request_rate=-1)


# -- the budgeted client, on the emulator -------------------------------------------------------
@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[BatchEmulator]:
    emu = BatchEmulator(tmp_path / "emulator", launcher="threads", max_vcpus=1)
    try:
        yield emu
    finally:
        emu.close()


def test_only_api_operations_take_tokens(emulator):
    shared = budget.RequestBudget(1000.0)
    client = budget.BudgetedClient(emulator, shared)
    client.describe_jobs(jobs=["nothing-here"])
    client.describe_job_queues(jobQueues=["batchfutures"])
    assert shared.requests == 2
    assert client.faults is emulator.faults and client.unbudgeted is emulator
    client.add_listener(lambda: None)  # not an API operation: no token
    assert shared.requests == 2
    assert hasattr(client, "terminate_jobs") and not hasattr(client, "no_such_operation")


def test_a_boto3_client_is_budgeted_by_its_operations():
    import boto3

    raw = boto3.session.Session(aws_access_key_id="k", aws_secret_access_key="s",
                                region_name="us-east-1").client(
        "batch", endpoint_url="http://127.0.0.1:9")
    client = budget.budgeted_client(raw, 10)
    assert client.request_budget is budget.shared_budget(("http://127.0.0.1:9", "us-east-1"), 10)
    assert client.meta is raw.meta  # not an operation: the client's own
    assert client.describe_jobs is client.describe_jobs  # wrapped once


def stuck_jobs(emu: BatchEmulator, count: int) -> List[str]:
    """Jobs that stay RUNNABLE (more vCPUs than the emulator has), so they can be stopped."""
    overrides = {"command": ["true"], "resourceRequirements": [{"type": "VCPU", "value": "4"}]}
    return [emu.submit_job(jobName=f"stuck-{i}", jobQueue="batchfutures",
                           jobDefinition="batchfutures-worker",
                           containerOverrides=overrides)["jobId"] for i in range(count)]


def test_throttled_bulk_entries_are_sent_again(emulator):
    jobs = stuck_jobs(emulator, 20)
    emulator.set_faults(FaultProfile(item_throttle_rate=0.5, seed=7))
    failed = batchapi.stop_jobs(emulator, Stop.TERMINATE, jobs, "stopped by test_budget")
    assert failed == {}
    assert emulator.faults.injected >= 5  # entries were answered ThrottlingException
    described = emulator.describe_jobs(jobs=jobs)["jobs"]
    assert {d["status"] for d in described} == {"FAILED"}
    assert {d["statusReason"] for d in described} == {"stopped by test_budget"}


def test_throttled_entries_left_after_the_budget_are_reported(emulator):
    jobs = stuck_jobs(emulator, 5)
    emulator.set_faults(FaultProfile(item_throttle_rate=1.0, seed=1))
    failed = batchapi.stop_jobs(emulator, Stop.CANCEL, jobs, "never", attempts=2, max_delay=5.0)
    assert sorted(failed) == sorted(jobs)
    assert all(why.startswith("ThrottlingException") for why in failed.values())
    assert emulator.faults.injected == 10  # each job answered twice, then given up on


@pytest.mark.parametrize("errors, resend, refused", [
    ([], [], []),
    ([{"job": "a", "code": "ThrottlingException", "message": "slow"},
      {"job": "b", "code": "ServerException", "message": "oops"},
      {"job": "c", "code": "TooManyRequestsException", "message": "429"}], ["a", "b", "c"], []),
    ([{"job": "a", "code": "ClientException", "message": "no"},
      {"job": "b", "code": "ValidationException", "message": "bad id"},
      {"job": "c", "code": "ThrottlingException", "message": "slow"}], ["c"], ["a", "b"]),
])
def test_split_stop_errors(errors, resend, refused):
    again, kept = batchapi.split_stop_errors(errors)
    assert list(again) == resend and sorted(kept) == refused


# -- a throttled SubmitJob keeps waiting --------------------------------------------------------
FAST = RetryBudget(attempts=2, seconds=1.0, first_wait=0.001, max_wait=0.004)
REQUEST = {"jobName": "bf-test", "jobQueue": "batchfutures", "jobDefinition": "batchfutures-worker",
           "containerOverrides": {"command": ["true"]}}


@pytest.mark.parametrize("throttled, draw, expected", [
    (1, 0.0, 0.1), (1, 1.0, 0.2), (2, 0.5, 0.3), (5, 0.0, 1.6), (6, 0.0, 2.5), (60, 1.0, 5.0),
])
def test_throttle_wait(throttled, draw, expected):
    assert batchapi.throttle_wait(throttled, batchapi.SUBMIT_BUDGET, draw) == pytest.approx(expected)


def test_submit_waits_out_throttling_past_its_retry_budget(emulator):
    emulator.set_faults(FaultProfile(throttle_rate=1.0, operations=frozenset({"SubmitJob"})))
    asked = []

    def keep_waiting() -> bool:  # the account's budget frees up after five throttled tries
        asked.append(1)
        if len(asked) == 5:
            emulator.set_faults(FaultProfile())
        return True

    response = batchapi.submit_exactly_once(emulator, dict(REQUEST), grace=0.1, budget=FAST,
                                            keep_waiting=keep_waiting)
    assert emulator.faults.injected == len(asked) == 5 > FAST.attempts
    assert emulator.describe_jobs(jobs=[response["jobId"]])["jobs"]


def test_submit_stops_waiting_when_told(emulator):
    emulator.set_faults(FaultProfile(throttle_rate=1.0, operations=frozenset({"SubmitJob"})))
    answers = iter([True, True, False])
    with pytest.raises(Exception) as raised:
        batchapi.submit_exactly_once(emulator, dict(REQUEST), grace=0.1, budget=FAST,
                                     keep_waiting=lambda: next(answers))
    assert batchapi.is_throttling(raised.value) and emulator.faults.injected == 3


def test_without_keep_waiting_throttles_count_as_failures(emulator):
    emulator.set_faults(FaultProfile(throttle_rate=1.0, operations=frozenset({"SubmitJob"})))
    with pytest.raises(Exception) as raised:
        batchapi.submit_exactly_once(emulator, dict(REQUEST), grace=0.1, budget=FAST)
    assert batchapi.is_throttling(raised.value) and emulator.faults.injected == FAST.attempts


# -- the poller spreads its DescribeJobs ---------------------------------------------------------
@pytest.mark.parametrize("needed, tokens, expected", [
    (0, 10.0, 0),
    (3, math.inf, 3),   # no budget: every page
    (3, 10.0, 3),
    (5, 2.7, 2),        # as many as the tokens there
    (5, 0.3, 1),        # one at least: every round moves
    (5, -4.0, 1),       # others wait for tokens already
])
def test_pages_this_round(needed, tokens, expected):
    assert pages_this_round(needed, tokens) == expected


def test_jobs_to_describe_oldest_first_in_tracking_order():
    ids = [f"j{i}" for i in range(250)]
    described = {job: 5 for job in ids}
    described.update({"j10": 2, "j200": 1, "j7": 3})
    chosen = jobs_to_describe(ids, described, 1)
    assert len(chosen) == 100 and chosen == sorted(chosen, key=ids.index)
    assert {"j200", "j10", "j7"} <= set(chosen)
    assert jobs_to_describe(ids, described, 3) == ids


def test_every_job_is_described_within_a_bounded_number_of_rounds():
    ids = [f"j{i}" for i in range(450)]
    described = {job: 0 for job in ids}
    last_seen = {job: 0 for job in ids}
    for round_ in range(1, 11):
        if round_ == 4:  # more jobs come: they never push the older ones back
            ids += [f"n{i}" for i in range(300)]
            described.update({f"n{i}": round_ for i in range(300)})
            last_seen.update({f"n{i}": round_ for i in range(300)})
        for job in jobs_to_describe(ids, described, 2):
            described[job] = last_seen[job] = round_
        assert all(round_ - last_seen[job] < math.ceil(len(ids) / 200) + 1 for job in ids)


# -- SubmitJob's size, checked before any upload -------------------------------------------------
def request_with(environment: int = 0, tags: int = 0, nodes: bool = False) -> dict:
    overrides = {"command": ["python", "-m", "batchfutures.worker", "s3://b/p/runs/r/jobs/k"],
                 "environment": [{"name": f"V{i}", "value": "x" * 90} for i in range(environment)]}
    request = {"jobName": "bf-f", "jobQueue": "q", "jobDefinition": "d",
               "tags": {f"t{i}": "y" * 200 for i in range(tags)}}
    if nodes:
        request["nodeOverrides"] = {"numNodes": 2, "nodePropertyOverrides": [
            {"targetNodes": "0:", "containerOverrides": overrides}]}
    else:
        request["containerOverrides"] = overrides
    return request


@pytest.mark.parametrize("request_, problem", [
    (request_with(), None),
    (request_with(environment=50), None),                        # ~6.1 K characters: fits
    (request_with(environment=62), "container overrides"),       # ~7.5 K: no room for Batch's
    (request_with(environment=80), "container overrides"),       # ~8.6 KB: over ECS's 8,192
    (request_with(environment=80, nodes=True), "container overrides"),
    (request_with(tags=50), None),                               # ~11 KB of tags
    (request_with(tags=160), "30 KiB"),                          # ~36 KB of tags
])
def test_request_size_problem(request_, problem):
    found = request_size_problem(request_)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_the_message_says_how_big_and_what_to_do():
    message = request_size_problem(request_with(tags=160)) or ""
    size = len(json.dumps(request_with(tags=160)).encode())
    assert f"{size:,} bytes" in message and f"{MAX_SUBMIT_PAYLOAD:,}" in message
    assert "tags" in message and "storage" in message
    message = request_size_problem(request_with(environment=80)) or ""
    assert f"{ECS_OVERRIDES_LIMIT - OVERRIDES_RESERVE:,}" in message and "environment" in message


# -- executors on the emulator: throttled, every call succeeds -----------------------------------
class ThreadsEnvironment(LocalEnvironment):
    """A local environment whose emulator runs attempts in threads of this process."""

    def __init__(self, workdir: Path, vcpus: int = 4, **kwargs: Any) -> None:
        super().__init__(workdir, max_vcpus=vcpus, **kwargs)
        self._emulator = BatchEmulator(self.workdir / "emulator", launcher="threads",
                                       max_vcpus=vcpus)


@pytest.fixture
def make_env(tmp_path: Path) -> Iterator[Any]:
    made: List[ThreadsEnvironment] = []

    def make(**kwargs: Any) -> ThreadsEnvironment:
        made.append(ThreadsEnvironment(tmp_path / f"work{len(made)}", **kwargs))
        return made[-1]

    yield make
    for env in made:
        env.emulator.close()


def square(x: int) -> int:
    return x * x


def separate_calls(executor: BatchExecutor, count: int) -> list:
    """``count`` calls of distinct settings: one SubmitJob each, never coalesced."""
    return [executor.with_settings(tags={"call": str(i)}).submit(square, i) for i in range(count)]


def test_a_burst_of_separate_calls_on_a_small_account_budget_all_succeed(make_env):
    env = make_env()  # unbudgeted: the account's 429s are what it meets
    # a busy account: its budget is small and neighbours take half of SubmitJob's turns
    env.emulator.set_faults(FaultProfile(account_tps=8, account_burst=4, throttle_rate=0.5,
                                         operations=frozenset({"SubmitJob"}), seed=3))
    with BatchExecutor(env) as executor:
        # three tries at most for any other failure: 3 throttles in a row would fail a call
        # that counted them (30 calls: ~98% that one does); backing off fast for the test
        executor._session.submitter.submit_budget = RetryBudget(
            attempts=3, seconds=60.0, first_wait=0.01, max_wait=0.05)
        futures = separate_calls(executor, 30)
        results = [f.result(timeout=120) for f in futures]
    assert results == [i * i for i in range(30)]
    assert env.emulator.faults.over_budget > 0  # the account's budget throttled it too
    assert env.emulator.faults.injected - env.emulator.faults.over_budget >= 15


def test_a_client_within_its_share_is_never_throttled(make_env):
    env = make_env(request_rate=4)
    env.emulator.set_faults(FaultProfile(account_tps=5))
    with BatchExecutor(env) as executor:
        futures = separate_calls(executor, 12)
        assert [f.result(timeout=120) for f in futures] == [i * i for i in range(12)]
    assert env.emulator.faults.over_budget == 0
    assert env.batch.request_budget.requests >= 12


def test_shutdown_with_cancel_stops_a_throttled_submission(make_env):
    env = make_env()
    env.emulator.set_faults(FaultProfile(throttle_rate=1.0, operations=frozenset({"SubmitJob"})))
    executor = BatchExecutor(env)
    future = executor.submit(square, 3)
    deadline = time.monotonic() + 30
    while env.emulator.faults.injected < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert env.emulator.faults.injected >= 3 and not future.done()
    stopper = threading.Thread(target=executor.shutdown, kwargs={"cancel_futures": True})
    stopper.start()
    stopper.join(timeout=30)
    assert not stopper.is_alive() and future.cancelled()


def test_a_throttled_queue_check_is_made_again(make_env):
    env = make_env()
    env.emulator.set_faults(FaultProfile(throttle_rate=1.0,
                                         operations=frozenset({"DescribeJobQueues"})))
    with BatchExecutor(env) as executor:
        executor._session.submitter.submit_budget = FAST
        future = executor.submit(square, 4)
        deadline = time.monotonic() + 60
        while env.emulator.faults.injected < 12 and time.monotonic() < deadline:
            time.sleep(0.01)  # past DEFAULT_BUDGET's 6 tries, twice
        env.emulator.set_faults(FaultProfile())
        assert future.result(timeout=60) == 16


def test_too_big_a_request_is_refused_before_any_upload(make_env):
    env = make_env()
    with BatchExecutor(env, environment={"BIG": "x" * 9000}) as executor:
        error = executor.submit(square, 2).exception(timeout=60)
    assert isinstance(error, ConfigurationError) and "8,192" in str(error)
    stored = [path for path in (env.workdir / "storage").rglob("*") if path.is_file()]
    assert stored == []
    assert env.emulator.list_jobs(jobQueue="batchfutures", jobStatus="SUBMITTED")[
        "jobSummaryList"] == []
