"""AWS's harshness on demand (faults.py): each fault through the API and through the HTTP endpoint
with stock boto3, reproducible from a seed."""

import os
import subprocess
import sys
import time
import types
from unittest import mock

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from emulator_harness import QUEUE, py, wait_until

from batchfutures.emulator.faults import FaultProfile
from batchfutures.emulator.model import model_has
from batchfutures.emulator.server import EmulatorServer

HOST_LOST = "Host EC2 (instance i-0123456789abcdef0) terminated."
SLEEP = py("import time; time.sleep(30)")


@pytest.fixture
def http(make_emulator):
    """(emulator harness, boto3 batch client without retries) on one HTTP endpoint."""
    emu = make_emulator()
    # the endpoint serves only requests signed with its pair: the one the clients below use
    with EmulatorServer(emu.emulator, access_key_id="x", secret_access_key="x") as server:
        batch = boto3.client("batch", endpoint_url=server.endpoint_url, region_name="us-east-1",
                             aws_access_key_id="x", aws_secret_access_key="x",
                             config=Config(retries={"total_max_attempts": 1}))
        yield emu, batch, server


def submit(client, name="job", command=("true",), **params):
    return client.submit_job(jobName=name, jobQueue=QUEUE, jobDefinition="batchfutures-worker",
                             containerOverrides={"command": list(command)}, **params)["jobId"]


def error_of(call):
    with pytest.raises(ClientError) as caught:
        call()
    response = caught.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def test_the_default_profile_injects_nothing(emu):
    assert emu.fault_profile == FaultProfile()
    with pytest.raises(ValueError):
        FaultProfile(throttle_rate=1.5)


def test_throttling_is_429_too_many_requests_through_the_api_and_http(http):
    emu, batch, _ = http
    emu.set_faults(FaultProfile(throttle_rate=1.0, operations={"ListJobs"}))
    assert error_of(lambda: emu.list_jobs(jobQueue=QUEUE)) == ("TooManyRequestsException", 429)
    assert error_of(lambda: batch.list_jobs(jobQueue=QUEUE)) == ("TooManyRequestsException", 429)
    assert batch.describe_job_queues()["jobQueues"]  # other operations are untouched


def test_server_errors_are_500_and_do_nothing(http):
    emu, batch, _ = http
    emu.set_faults(FaultProfile(server_error_rate=1.0, operations={"SubmitJob"}))
    assert error_of(lambda: submit(emu, "a")) == ("ServerException", 500)
    assert error_of(lambda: submit(batch, "b")) == ("ServerException", 500)
    filters = [{"name": "JOB_NAME", "values": ["*"]}]
    assert emu.list_jobs(jobQueue=QUEUE, filters=filters)["jobSummaryList"] == []


def test_the_same_seed_fails_the_same_calls():
    def pattern(seed):
        from batchfutures.emulator.faults import FaultInjector

        injector = FaultInjector(FaultProfile(throttle_rate=0.3, server_error_rate=0.2, seed=seed))
        outcome = []
        for _ in range(40):
            try:
                injector.maybe_raise("DescribeJobs")
                outcome.append("ok")
            except ClientError as error:
                outcome.append(error.response["Error"]["Code"])
        return outcome

    assert pattern(11) == pattern(11)
    assert pattern(11) != pattern(12)
    assert {"ok", "TooManyRequestsException", "ServerException"} == set(pattern(11))


@pytest.mark.slow
def test_a_lost_submit_reply_is_a_500_after_the_job_was_created(http):
    emu, batch, _ = http
    emu.set_faults(FaultProfile(lost_reply_rate=1.0))
    for client, name in ((emu, "through-the-api"), (batch, "through-http")):
        assert error_of(lambda c=client, n=name: submit(c, n)) == ("ServerException", 500)
        found = emu.list_jobs(jobQueue=QUEUE, filters=[{"name": "JOB_NAME", "values": [name]}])
        [job] = found["jobSummaryList"]  # it exists: the ambiguous case
        emu.set_faults(None)
        assert emu.wait(job["jobId"])["status"] == "SUCCEEDED"
        emu.set_faults(FaultProfile(lost_reply_rate=1.0))


@pytest.mark.slow
def test_botocores_own_retries_of_a_lost_submit_reply_run_the_job_twice(http):
    # why a client must send SubmitJob without botocore's retries (issue 11)
    emu, _, server = http
    emu.set_faults(FaultProfile(lost_reply_rate=1.0))
    retrying = boto3.client("batch", endpoint_url=server.endpoint_url, region_name="us-east-1",
                            aws_access_key_id="x", aws_secret_access_key="x",
                            config=Config(retries={"mode": "standard", "total_max_attempts": 2}))
    # botocore's retry sleeps into the next second: one in the same second would carry the same
    # signature, which the endpoint refuses for a change (a replay: 429, issue 29)
    next_second = types.SimpleNamespace(time=time.time, monotonic=time.monotonic,
                                        sleep=lambda _: time.sleep(1.01 - time.time() % 1))
    with mock.patch("botocore.endpoint.time", next_second), pytest.raises(ClientError):
        submit(retrying, "twice")
    found = emu.list_jobs(jobQueue=QUEUE, filters=[{"name": "JOB_NAME", "values": ["twice"]}])
    assert len(found["jobSummaryList"]) == 2


@pytest.mark.slow
def test_a_lost_host_kills_the_attempt_with_batchs_reason_and_is_retried(http):
    emu, batch, _ = http
    emu.set_faults(FaultProfile(host_loss_rate=1.0, host_loss_after=0.0))
    job_id = submit(batch, "lost", SLEEP, retryStrategy={"attempts": 2})
    detail = wait_until(lambda: next((j for j in batch.describe_jobs(jobs=[job_id])["jobs"]
                                      if j["status"] == "FAILED"), None), "the job to fail")
    assert detail["statusReason"] == HOST_LOST
    assert [a["statusReason"] for a in detail["attempts"]] == [HOST_LOST, HOST_LOST]
    assert all("exitCode" not in a["container"] for a in detail["attempts"])
    assert emu.emulator.faults.hosts_lost == 2


def lost_children(make_emulator, seed):
    emu = make_emulator(max_vcpus=10, faults=FaultProfile(host_loss_rate=0.5, host_loss_after=0.0,
                                                          seed=seed))
    array = emu.job(SLEEP, size=8, vcpus=1)
    wait_until(lambda: emu.detail(array)["arrayProperties"]["statusSummary"]["FAILED"]
               == emu.emulator.faults.hosts_lost and emu.emulator.faults.hosts_lost
               and all(emu.detail(f"{array}:{i}")["status"] in ("RUNNING", "FAILED")
                       for i in range(8)), "the lost hosts")
    lost = sorted(i for i in range(8) if emu.detail(f"{array}:{i}")["status"] == "FAILED")
    emu.terminate_job(jobId=array, reason="enough")
    return lost


@pytest.mark.slow
def test_which_attempts_lose_their_host_is_reproducible_from_the_seed(make_emulator, tmp_path):
    first = lost_children(make_emulator, 21)
    second = lost_children(lambda **kw: make_emulator(tmp_path / "again", **kw), 21)
    assert first == second
    assert 0 < len(first) < 8


@pytest.mark.slow
def test_a_lagging_status_summary_is_a_snapshot_with_its_time(http):
    emu, batch, _ = http
    emu.set_faults(FaultProfile(summary_lag=3600))
    array = submit(batch, "lagging", ("true",), arrayProperties={"size": 2})
    first = batch.describe_jobs(jobs=[array])["jobs"][0]["arrayProperties"]
    wait_until(lambda: all(j["status"] == "SUCCEEDED" for j in
                           batch.describe_jobs(jobs=[f"{array}:0", f"{array}:1"])["jobs"]),
               "the children")
    later = batch.describe_jobs(jobs=[array])["jobs"][0]["arrayProperties"]
    assert later["statusSummary"] == first["statusSummary"]  # the counts lag behind the truth
    assert later["statusSummary"]["SUCCEEDED"] == 0
    emu.set_faults(FaultProfile(summary_lag=0.05))
    fresh = wait_until(lambda: (lambda p: p if p["statusSummary"]["SUCCEEDED"] == 2 else None)(
        batch.describe_jobs(jobs=[array])["jobs"][0]["arrayProperties"]), "a refresh")
    if not model_has("ArrayPropertiesDetail", "statusSummaryLastUpdatedAt"):
        # a botocore older than the field (2026): boto3 drops it from AWS's answer, and so here
        assert "statusSummaryLastUpdatedAt" not in first
        return
    assert later["statusSummaryLastUpdatedAt"] == first["statusSummaryLastUpdatedAt"]
    assert fresh["statusSummaryLastUpdatedAt"] > first["statusSummaryLastUpdatedAt"]


def test_the_command_line_sets_the_profile(tmp_path):
    from batchfutures.emulator.__main__ import fault_profile, parse_args

    args = parse_args(["--summary-lag", "2", "--throttle-rate", "0.1", "--server-error-rate",
                       "0.05", "--lost-reply-rate", "0.2", "--host-loss-rate", "0.3",
                       "--fault-operations", "ListJobs,DescribeJobs", "--fault-seed", "4"])
    assert fault_profile(args) == FaultProfile(
        summary_lag=2, throttle_rate=0.1, server_error_rate=0.05, lost_reply_rate=0.2,
        host_loss_rate=0.3, operations=frozenset({"ListJobs", "DescribeJobs"}), seed=4)
    assert fault_profile(parse_args([])) == FaultProfile()


@pytest.mark.slow
def test_the_endpoint_started_with_fault_flags_throttles_stock_boto3(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "batchfutures.emulator", "--folder", str(tmp_path / "e"),
         "--throttle-rate", "1", "--fault-operations", "ListJobs", "--fault-seed", "1",
         "--access-key-id", "x"],
        stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY="x"))  # never in argv
    try:
        url = process.stdout.readline().strip()
        batch = boto3.client("batch", endpoint_url=url, region_name="us-east-1",
                             aws_access_key_id="x", aws_secret_access_key="x",
                             config=Config(retries={"total_max_attempts": 1}))
        assert error_of(lambda: batch.list_jobs(jobQueue=QUEUE)) == ("TooManyRequestsException", 429)
        assert batch.describe_job_queues()["jobQueues"]
    finally:
        process.terminate()
        process.wait(timeout=30)


# -- the account's API budget (a token bucket per emulator) ------------------------------------
@pytest.mark.parametrize("rate, burst, times, expected", [
    # a full bucket at the start, then one token a second
    (1.0, 1, [0, 0, 0.5, 1.0, 1.0], [True, False, False, True, False]),
    # a burst of 3, refilled at 2 a second
    (2.0, 3, [0, 0, 0, 0, 0.5, 1.0, 1.0, 1.0], [True, True, True, False, True, True, False, False]),
    # a long idle time refills up to the burst, never more
    (10.0, 2, [0, 10, 10, 10], [True, True, True, False]),
    # a refused call takes nothing: the fraction of a token keeps growing
    (0.5, 1, [0, 1, 1.5, 2.0], [True, False, False, True]),
])
def test_the_token_bucket_decides_which_calls_pass(rate, burst, times, expected):
    from batchfutures.emulator.faults import admitted

    assert admitted(rate, burst, times) == expected


def test_the_budget_is_validated():
    with pytest.raises(ValueError):
        FaultProfile(account_tps=-1)
    with pytest.raises(ValueError):
        FaultProfile(account_tps=5, account_burst=0.5)


@pytest.mark.slow
def test_calls_over_the_account_budget_get_429_whatever_the_operation_and_client(http):
    emu, batch, _ = http
    # a burst of 5 and (within this test) no refill: the first 5 calls pass, the rest are refused
    emu.set_faults(FaultProfile(account_tps=0.001, account_burst=5))
    calls = [lambda: submit(emu, "a"), lambda: emu.describe_job_queues(),
             lambda: batch.list_jobs(jobQueue=QUEUE), lambda: submit(batch, "b"),
             lambda: emu.list_jobs(jobQueue=QUEUE), lambda: batch.describe_job_queues(),
             lambda: submit(emu, "c"), lambda: emu.describe_jobs(jobs=["x"]),
             lambda: batch.describe_jobs(jobs=["x"])]
    outcomes = []
    for call in calls:
        try:
            call()
            outcomes.append("ok")
        except ClientError as error:
            response = error.response
            outcomes.append((response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]))
    assert outcomes == ["ok"] * 5 + [("TooManyRequestsException", 429)] * 4
    assert emu.faults.over_budget == 4
    filters = [{"name": "JOB_NAME", "values": ["*"]}]
    emu.set_faults(None)  # a new profile: no budget
    listed = emu.list_jobs(jobQueue=QUEUE, filters=filters)["jobSummaryList"]
    assert {j["jobName"] for j in listed} == {"a", "b"}


def test_the_command_line_sets_the_account_budget():
    from batchfutures.emulator.__main__ import fault_profile, parse_args

    args = parse_args(["--account-tps", "50", "--account-burst", "100"])
    assert fault_profile(args) == FaultProfile(account_tps=50, account_burst=100)


def test_the_command_line_sets_bulk_stop_throttling_and_refused_child_stops():
    from batchfutures.emulator.__main__ import fault_profile, parse_args

    args = parse_args(["--item-throttle-rate", "0.5", "--child-stops-refused",
                       "CancelJob, TerminateJob"])
    assert fault_profile(args) == FaultProfile(
        item_throttle_rate=0.5, child_stops_refused=frozenset({"CancelJob", "TerminateJob"}))
    with pytest.raises(ValueError, match="child_stops_refused"):
        fault_profile(parse_args(["--child-stops-refused", "SubmitJob"]))
