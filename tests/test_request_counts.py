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
    S3 non-GET requests  <= 5 x Batch jobs        (PUT, LIST, HEAD, ...)
    DescribeJobs         <= poller rounds x ceil(Batch jobs / 100)   (no child fails here)
    hosts                127.0.0.1 only

The workers bound the size: each child is a worker process that makes its own S3 client and
talks to moto, ~0.25 s of CPU, so a 2-core machine runs ~6 children a second; 120 children in
all keep the file near 30 s. `benchmarks/bench_requests.py` measures bigger maps.
"""

from __future__ import annotations

import collections
import functools
import math
import socket
import sys
import threading
import uuid
from typing import Any, Dict, List
from urllib.parse import urlsplit

import boto3
import pytest
from s3server import emulator_endpoint

from batchfutures import AWSBatchEnvironment, BatchExecutor

REGION = "us-east-1"
LOOPBACK = ("127.0.0.1", "::1", "localhost")
S3_GET = ("GetObject",)

# (items, chunksize): 60 children at chunksize 10, 60 children at chunksize 1
CASES = [(600, 10), (60, 1)]


def plus_one(x):
    return x + 1


# -- a small copy of benchmarks/bench_requests.py's RequestCounter ------------------------------
class RequestCounter:
    """Counts the HTTP requests of every botocore client made while installed, by operation."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.operations: collections.Counter = collections.Counter()  # (service, operation)
        self.hosts: collections.Counter = collections.Counter()
        self.connects: List[Any] = []  # non-loopback socket.connect addresses
        self._original: Any = None

    def install(self) -> None:
        import botocore.client

        original = botocore.client.BaseClient.__init__  # aiobotocore's clients inherit it

        @functools.wraps(original)
        def __init__(client: Any, *args: Any, **kwargs: Any) -> None:
            original(client, *args, **kwargs)
            client.meta.events.register("before-send", self._before_send)

        botocore.client.BaseClient.__init__ = __init__
        self._original = original
        _watch_connects()
        _watchers.append(self)

    def uninstall(self) -> None:
        import botocore.client

        botocore.client.BaseClient.__init__ = self._original
        _watchers.remove(self)

    def _before_send(self, request: Any = None, event_name: str = "", **_: Any) -> None:
        _, service, operation = (event_name.split(".", 2) + ["", ""])[:3]
        host = urlsplit(getattr(request, "url", "") or "").hostname or "?"
        with self.lock:
            self.operations[(service, operation)] += 1
            self.hosts[host] += 1
        # None: a handler's answer would replace the HTTP response

    def count(self, service: str, operation: str) -> int:
        return self.operations.get((service, operation), 0)

    def s3(self, get: bool) -> Dict[str, int]:
        return {op: n for (svc, op), n in self.operations.items()
                if svc == "s3" and (op in S3_GET) == get}


_watchers: List[RequestCounter] = []
_audit_hooked: List[bool] = []


def _audit(event: str, args: Any) -> None:
    if event == "socket.connect" and _watchers:
        sock, address = args[0], args[1]
        if getattr(sock, "family", None) in (socket.AF_INET, socket.AF_INET6) and \
                str(address[0]) not in LOOPBACK:
            for watcher in list(_watchers):
                with watcher.lock:
                    watcher.connects.append(address)


def _watch_connects() -> None:
    """One audit hook for the process (it cannot be removed; idle while no counter is installed)."""
    if not _audit_hooked:
        sys.addaudithook(_audit)
        _audit_hooked.append(True)


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
    return result


def _breakdown(counter: RequestCounter) -> str:
    return ", ".join(f"{svc}:{op} {n}" for (svc, op), n in sorted(counter.operations.items()))


# -- the bounds -------------------------------------------------------------------------------
def test_results_are_correct_and_every_client_was_counted(run):
    assert run.results == [plus_one(x) for x in range(run.items)]
    counter = run.counter
    # the hook reached both kinds of client: boto3's batch and s3fs's aiobotocore s3
    assert counter.count("batch", "SubmitJob") >= 1, _breakdown(counter)
    assert counter.count("s3", "PutObject") >= 1, _breakdown(counter)


def test_one_submit_job_per_10000_children(run):
    submits = run.counter.count("batch", "SubmitJob")
    assert submits == math.ceil(run.children / 10_000) == run.jobs, _breakdown(run.counter)


def test_s3_gets_per_child(run):
    gets = sum(run.counter.s3(get=True).values())
    assert gets <= 1.05 * run.children, (
        f"{run}: {gets} S3 GETs for {run.children} children = {gets / run.children:.3f} per "
        f"child > 1.05; {_breakdown(run.counter)}")


def test_other_s3_requests_per_batch_job(run):
    others = run.counter.s3(get=False)
    total = sum(others.values())
    assert total <= 5 * run.jobs, (
        f"{run}: {total} non-GET S3 requests for {run.jobs} Batch job(s) = "
        f"{total / max(run.jobs, 1):.1f} per job > 5 ({others}; {run.polls} poller rounds)")


def test_describe_jobs_per_poll(run):
    describes = run.counter.count("batch", "DescribeJobs")
    bound = run.polls * math.ceil(run.jobs / 100)
    assert run.polls >= 1
    assert describes <= bound, (
        f"{run}: {describes} DescribeJobs > {run.polls} poller rounds x ceil({run.jobs} jobs / 100)"
        f"; {_breakdown(run.counter)}")


def test_only_loopback_is_contacted(run):
    hosts = set(run.counter.hosts)
    assert hosts and hosts <= set(LOOPBACK), hosts
    assert not run.counter.connects, run.counter.connects
