"""Request budget of the AWS path: what the client process sends for a fixed map, counted.

Nothing of ours is mocked (as in tests/test_aws.py): stock boto3 `batch`/`logs` clients against
the emulator's HTTP endpoint, s3fs against moto's S3 server, workers as real processes. Every
botocore client made during the map (boto3's, and the aiobotocore `s3` client inside s3fs) gets
a `before-send` handler, emitted once per HTTP request sent (retries included), so each request
is counted by operation; a `socket.connect` audit hook sees any connection the process opens.
Each map runs once per module; each bound is its own test, so a report names every bound
exceeded. Counts only, never timings. The bounds (client side):

    SubmitJob            == ceil(children / 10,000)
    S3 GET               <= 1.05 x children
    S3 LIST pages        <= poller rounds x sum over jobs of ceil(children / 1,000)
                            (finished children are found in storage: one listing per job and
                            round at most, of the results written since its lowest waiting child)
    S3 other requests    <= 5 x Batch jobs        (PUT, HEAD, ...)
    DescribeJobs         <= poller rounds x ceil(Batch jobs / 100)   (no child fails here)
    ListJobs             <= 2 x Batch jobs        (running children are never listed; only a
                                                   RUNNABLE sample while none runs, every 30 s)
    hosts                127.0.0.1 only

The workers bound the size: each child is a worker process that makes its own S3 client and
talks to moto, ~0.25 s of CPU, so a 2-core machine runs ~6 children a second; 120 children in
all keep the file near 30 s. `benchmarks/bench_requests.py` measures bigger maps.
"""

from __future__ import annotations

import collections
import math
import pathlib
import sys
import uuid
from typing import Any, List

import boto3
import pytest
from s3server import emulator_endpoint

from batchfutures import AWSBatchEnvironment, BatchExecutor

REGION = "us-east-1"

# (items, chunksize): 60 children at chunksize 10, 60 children at chunksize 1
CASES = [(600, 10), (60, 1)]


def plus_one(x):
    return x + 1


# The counter is the benchmark's own (benchmarks/bench_requests.py), so both count the same way.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_requests import LOOPBACK, Counts, RequestCounter  # noqa: E402


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def aws(tmp_path_factory, s3_endpoint):
    """The emulator behind its HTTP endpoint (boto3 pointed at it) and a fresh bucket on moto."""
    with emulator_endpoint(tmp_path_factory.mktemp("requests-emulator"), max_vcpus=4):
        bucket = f"bf-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=bucket)
        yield bucket


class Run:
    def __init__(self, items: int, chunksize: int) -> None:
        self.items, self.chunksize = items, chunksize
        self.children = math.ceil(items / chunksize)
        self.counter = RequestCounter()
        self.counts = Counts(collections.Counter(), collections.Counter(), [])
        self.results: List[Any] = []
        self.polls = self.jobs = 0

    def __repr__(self) -> str:
        return f"{self.items} items at chunksize {self.chunksize}"


@pytest.fixture(scope="module", params=CASES, ids=[f"{n}-items-chunksize-{c}" for n, c in CASES])
def run(request, aws):
    """One map on a fresh executor, every request it sent counted (once per module and case)."""
    import s3fs

    items, chunksize = request.param
    result = Run(items, chunksize)
    s3fs.S3FileSystem.clear_instance_cache()  # a cached filesystem's client would escape the hook
    result.counter.install()
    try:
        env = AWSBatchEnvironment(job_queue="batchfutures", io_bucket=aws,
                                  job_definition="batchfutures-worker", region_name=REGION)
        with BatchExecutor(env) as executor:
            result.results = list(executor.map(plus_one, range(items), chunksize=chunksize))
        result.polls = executor._session.poller.polls
        result.jobs = len(executor._session.submitted_jobs)
    finally:
        result.counter.uninstall()
    result.counts = result.counter.snapshot()
    return result


def _breakdown(counts: Counts) -> str:
    return ", ".join(f"{svc}:{op} {n}" for (svc, op), n in sorted(counts.operations.items()))


# -- the bounds -------------------------------------------------------------------------------
def test_results_are_correct_and_every_client_was_counted(run):
    assert run.results == [plus_one(x) for x in range(run.items)]
    counts = run.counts
    # the hook reached both kinds of client: boto3's batch and s3fs's aiobotocore s3
    assert counts.op("batch", "SubmitJob") >= 1, _breakdown(counts)
    assert counts.op("s3", "PutObject") >= 1, _breakdown(counts)


def test_one_submit_job_per_10000_children(run):
    submits = run.counts.op("batch", "SubmitJob")
    assert submits == math.ceil(run.children / 10_000) == run.jobs, _breakdown(run.counts)


def test_s3_gets_per_child(run):
    gets = run.counts.s3("GET")
    assert gets <= 1.05 * run.children, (
        f"{run}: {gets} S3 GETs for {run.children} children = {gets / run.children:.3f} per "
        f"child > 1.05; {_breakdown(run.counts)}")


def test_s3_listings_per_poll(run):
    lists = run.counts.s3("LIST")
    bound = run.polls * run.jobs * math.ceil(run.children / run.jobs / 1000)
    assert lists <= bound, (
        f"{run}: {lists} S3 LIST requests > {run.polls} poller rounds x {run.jobs} job(s); "
        f"{_breakdown(run.counts)}")


def test_no_listing_of_running_children(run):
    lists = run.counts.op("batch", "ListJobs")
    assert lists <= 2 * run.jobs, (
        f"{run}: {lists} ListJobs for {run.jobs} Batch job(s) and {run.polls} poller rounds; "
        f"{_breakdown(run.counts)}")


def test_other_s3_requests_per_batch_job(run):
    total = run.counts.s3_not_get - run.counts.s3("LIST")
    assert total <= 5 * run.jobs, (
        f"{run}: {total} non-GET S3 requests for {run.jobs} Batch job(s) = "
        f"{total / max(run.jobs, 1):.1f} per job > 5 ({run.counts.service('s3')}; "
        f"{run.polls} poller rounds)")


def test_describe_jobs_per_poll(run):
    describes = run.counts.op("batch", "DescribeJobs")
    bound = run.polls * math.ceil(run.jobs / 100)
    assert run.polls >= 1
    assert describes <= bound, (
        f"{run}: {describes} DescribeJobs > {run.polls} poller rounds x ceil({run.jobs} jobs / 100)"
        f"; {_breakdown(run.counts)}")


def test_only_loopback_is_contacted(run):
    hosts = set(run.counts.hosts)
    assert hosts and hosts <= set(LOOPBACK), hosts
    assert not run.counts.foreign_connects, run.counts.foreign_connects
