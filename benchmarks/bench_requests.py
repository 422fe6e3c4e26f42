"""Every request the client process sends on the AWS path, by API operation, per map.

    python benchmarks/bench_requests.py [--sizes 1000,10000,100000] [--chunksizes 1,10,100]
                                        [--budget 1500 | --full] [--max-vcpus 8]

The AWS path with nothing of batchfutures mocked: `AWSBatchEnvironment(job_queue, io_bucket,
job_definition)` whose stock boto3 `batch` and `logs` clients go to an in-process
`EmulatorServer` (AWS_ENDPOINT_URL_BATCH / AWS_ENDPOINT_URL_CLOUDWATCH_LOGS) and whose s3fs
storage, like the workers', goes to moto's `ThreadedMotoServer`; fake credentials, all traffic to
127.0.0.1. Each case is one `list(ex.map(trivial, range(items), chunksize=...))` on a fresh
executor, from its creation to the end of its shutdown.

Counting: every botocore client made while the counter is installed (boto3's `batch` and `logs`,
and the aiobotocore `s3` client inside s3fs: aiobotocore's clients subclass botocore's
`BaseClient`, and its async event emitter awaits plain handlers too) gets a `before-send`
handler, which botocore emits once per HTTP request actually sent, retries included, with the
operation in the event name. fsspec's cache of S3FileSystem instances is cleared first, so no
s3 client from before the counter escapes it. A `socket.connect` audit hook checks that nothing
in the process connects anywhere but 127.0.0.1. The workers run in other processes: their
requests are not the client's and are not counted.

The targets (the issue's, client side): at most 1.05 S3 GETs per child; at most 5 other S3
requests (PUT, LIST, HEAD, ...) per Batch job; one SubmitJob per 10,000 children (exactly
ceil(children / 10,000)); DescribeJobs at most poller rounds x ceil(jobs / 100).

Why the big cases are skipped by default: every child is a real worker process that creates an
S3 client and reads its inputs from and writes its result to moto, ~0.25 s of CPU each (most of
it botocore loading the S3 model and endpoint rules and an SSL context in every new process), so
this 2-core machine runs ~6 children a second: 1,000 children take ~2.5 minutes, 10,000 ~27
minutes and the 100,000-item chunksize-1 map (100,000 children) ~4.5 hours. By default the cases
run smallest first while their children fit in a budget of 1,500 (~4 minutes: 10, 100, 100 and
one 1,000-child case); `--budget N` changes it, `--full` runs every case. The other 1,000-child
cases differ from the one that runs only in items per child, which changes no request count
except through timing (poller rounds).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import math
import os
import socket
import sys
import tempfile
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import urlsplit

REGION = "us-east-1"
LOOPBACK = ("127.0.0.1", "::1", "localhost")
CHILDREN_BUDGET = 1_500  # children run by default, smallest cases first (~6 a second)
CHILDREN_PER_SECOND = 6  # measured here; for the estimates of skipped cases
S3_CATEGORY = {
    "GetObject": "GET",
    "PutObject": "PUT", "CreateMultipartUpload": "PUT", "UploadPart": "PUT",
    "CompleteMultipartUpload": "PUT",
    "ListObjectsV2": "LIST", "ListObjects": "LIST",
    "HeadObject": "HEAD", "HeadBucket": "HEAD",
}


# -- the request counter ----------------------------------------------------------------------
class RequestCounter:
    """Counts every HTTP request botocore clients of this process send, by (service, operation).

    ``install()`` wraps ``botocore.client.BaseClient.__init__`` (aiobotocore's clients inherit
    it) so each new client registers a ``before-send`` handler; ``uninstall()`` restores it.
    Clients made before ``install()`` are not seen: make them afterwards.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.operations: collections.Counter = collections.Counter()  # (service, operation)
        self.hosts: collections.Counter = collections.Counter()
        self.foreign_connects: List[Any] = []  # socket.connect to anything but loopback
        self._original: Any = None

    # install / uninstall
    def install(self) -> "RequestCounter":
        import botocore.client

        if self._original is not None:
            return self
        original = botocore.client.BaseClient.__init__
        counter = self

        @functools.wraps(original)
        def __init__(client: Any, *args: Any, **kwargs: Any) -> None:
            original(client, *args, **kwargs)
            client.meta.events.register("before-send", counter._before_send)

        botocore.client.BaseClient.__init__ = __init__  # type: ignore[method-assign]
        self._original = original
        _watch_connects(self)
        return self

    def uninstall(self) -> None:
        import botocore.client

        if self._original is not None:
            botocore.client.BaseClient.__init__ = self._original  # type: ignore[method-assign]
            self._original = None
        _unwatch_connects(self)

    def __enter__(self) -> "RequestCounter":
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    # the hook (must return None: a non-None answer would replace the HTTP response)
    def _before_send(self, request: Any = None, event_name: str = "", **_: Any) -> None:
        _, service, operation = (event_name.split(".", 2) + ["", ""])[:3]
        host = urlsplit(getattr(request, "url", "") or "").hostname or "?"
        with self._lock:
            self.operations[(service, operation)] += 1
            self.hosts[host] += 1

    def _connect(self, address: Any) -> None:
        if isinstance(address, tuple) and address and str(address[0]) not in LOOPBACK:
            with self._lock:
                self.foreign_connects.append(address)

    # reading
    def reset(self) -> None:
        with self._lock:
            self.operations.clear()
            self.hosts.clear()
            self.foreign_connects.clear()

    def snapshot(self) -> "Counts":
        with self._lock:
            return Counts(collections.Counter(self.operations), collections.Counter(self.hosts),
                          list(self.foreign_connects))


class Counts:
    """A frozen view of the counter, with the groupings the targets use."""

    def __init__(self, operations: collections.Counter, hosts: collections.Counter,
                 foreign_connects: List[Any]) -> None:
        self.operations = operations
        self.hosts = hosts
        self.foreign_connects = foreign_connects

    def op(self, service: str, operation: str) -> int:
        return self.operations.get((service, operation), 0)

    def service(self, service: str) -> Dict[str, int]:
        return {op: n for (svc, op), n in self.operations.items() if svc == service}

    def s3(self, category: str) -> int:
        """S3 requests of one category: GET, PUT, LIST, HEAD, or OTHER."""
        return sum(n for op, n in self.service("s3").items()
                   if S3_CATEGORY.get(op, "OTHER") == category)

    @property
    def s3_not_get(self) -> int:
        return sum(n for op, n in self.service("s3").items() if S3_CATEGORY.get(op) != "GET")

    @property
    def other_batch_logs(self) -> int:
        main = ("SubmitJob", "DescribeJobs", "ListJobs")
        return sum(n for (svc, op), n in self.operations.items()
                   if (svc == "batch" and op not in main) or svc == "cloudwatch-logs")

    @property
    def foreign_hosts(self) -> List[str]:
        return sorted(h for h in self.hosts if h not in LOOPBACK)


# sys.addaudithook cannot be removed: one hook for the process, forwarding to installed counters
_watchers: List[RequestCounter] = []
_hooked = False


def _watch_connects(counter: RequestCounter) -> None:
    global _hooked
    if not _hooked:
        def audit(event: str, args: Tuple[Any, ...]) -> None:
            if event == "socket.connect" and _watchers:
                sock, address = args[0], args[1]
                if getattr(sock, "family", None) in (socket.AF_INET, socket.AF_INET6):
                    for watcher in list(_watchers):
                        watcher._connect(address)
        sys.addaudithook(audit)
        _hooked = True
    if counter not in _watchers:
        _watchers.append(counter)


def _unwatch_connects(counter: RequestCounter) -> None:
    if counter in _watchers:
        _watchers.remove(counter)


# -- the local AWS stack ----------------------------------------------------------------------
def fake_aws_variables(s3_endpoint: str) -> Dict[str, str]:
    """Fake credentials and endpoints (as tests/s3server.py): everything to 127.0.0.1."""
    no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY", ""), "127.0.0.1", "localhost"]))
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "AWS_ENDPOINT_URL_S3": s3_endpoint,
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
    }


@contextlib.contextmanager
def patched_environ(values: Dict[str, str], removed: Tuple[str, ...] = ()) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in (*values, *removed)}
    for key in removed:
        os.environ.pop(key, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def local_aws(folder: str, max_vcpus: float) -> Iterator[str]:
    """moto S3 and the emulator's HTTP endpoint on 127.0.0.1, the variables set; yields a bucket."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    from batchfutures.emulator import BatchEmulator
    from batchfutures.emulator.server import EmulatorServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    emulator = server = None
    try:
        host, port = moto.get_host_and_port()
        s3_endpoint = f"http://{host}:{port}"
        emulator = BatchEmulator(os.path.join(folder, "emulator"), max_vcpus=max_vcpus)
        values = fake_aws_variables(s3_endpoint)
        # the endpoint serves only requests signed with its pair: the fake keys boto3 signs with
        server = EmulatorServer(emulator, access_key_id=values["AWS_ACCESS_KEY_ID"],
                                secret_access_key=values["AWS_SECRET_ACCESS_KEY"]).start()
        values["AWS_ENDPOINT_URL_BATCH"] = server.endpoint_url
        values["AWS_ENDPOINT_URL_CLOUDWATCH_LOGS"] = server.endpoint_url
        with patched_environ(values, ("AWS_PROFILE", "AWS_DEFAULT_PROFILE",
                                      "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")):
            bucket = "bf-bench-requests"
            boto3.client("s3", region_name=REGION).create_bucket(Bucket=bucket)
            yield bucket
    finally:
        if server is not None:
            server.stop()
        if emulator is not None:
            emulator.close()
        moto.stop()


def trivial(x: int) -> int:
    return x + 1


# -- one case ---------------------------------------------------------------------------------
class Case:
    def __init__(self, items: int, chunksize: int) -> None:
        self.items = items
        self.chunksize = chunksize
        self.children = math.ceil(items / chunksize)
        self.jobs = 0
        self.polls = 0
        self.seconds = 0.0
        self.cpu_seconds = 0.0  # this process: client, moto and the emulator (not the workers)
        self.correct = False
        self.counts: Optional[Counts] = None

    @property
    def name(self) -> str:
        return f"{self.items:,} items, chunksize {self.chunksize}"


def run_case(case: Case, bucket: str, counter: RequestCounter) -> Case:
    import s3fs

    from batchfutures import AWSBatchEnvironment, BatchExecutor

    s3fs.S3FileSystem.clear_instance_cache()  # the s3 client is made anew, with the hook
    env = AWSBatchEnvironment(job_queue="batchfutures", io_bucket=bucket,
                              job_definition="batchfutures-worker", region_name=REGION)
    counter.reset()
    started, cpu = time.perf_counter(), time.process_time()
    with BatchExecutor(env) as executor:
        results = list(executor.map(trivial, range(case.items), chunksize=case.chunksize))
    case.seconds = time.perf_counter() - started
    case.cpu_seconds = time.process_time() - cpu
    case.counts = counter.snapshot()
    case.polls = executor._session.poller.polls
    case.jobs = len(executor._session.submitted_jobs)
    case.correct = results == [trivial(x) for x in range(case.items)]
    return case


def select(cases: List[Case], budget: Optional[int]) -> Tuple[List[Case], List[Case]]:
    """(to run, skipped): smallest first while the children fit in ``budget`` (None: all)."""
    chosen, skipped, used = [], [], 0
    for case in sorted(cases, key=lambda c: (c.children, c.items)):
        if budget is None or used + case.children <= budget:
            chosen.append(case)
            used += case.children
        else:
            skipped.append(case)
    return chosen, skipped


# -- report -----------------------------------------------------------------------------------
def _ratio(value: int, base: int) -> str:
    return f"{value / base:.3f}" if base else "-"


def targets(case: Case) -> List[Tuple[str, str, bool]]:
    """(target, measured, met) for each of the issue's bounds."""
    counts = case.counts
    assert counts is not None
    submits = counts.op("batch", "SubmitJob")
    expected_submits = math.ceil(case.children / 10_000)
    gets = counts.s3("GET")
    not_get = counts.s3_not_get - counts.s3("LIST")
    lists = counts.s3("LIST")
    list_bound = case.polls * case.jobs * math.ceil(case.children / max(case.jobs, 1) / 1000)
    describes = counts.op("batch", "DescribeJobs")
    describe_bound = case.polls * math.ceil(case.jobs / 100)
    foreign = counts.foreign_hosts + [str(a) for a in counts.foreign_connects]
    return [
        ("S3 GET per child <= 1.05", f"{gets / case.children:.3f} ({gets:,} / {case.children:,})",
         gets <= 1.05 * case.children),
        ("S3 LIST <= rounds x jobs x pages", f"{lists:,} <= {list_bound:,}",
         lists <= list_bound),
        ("other S3 per Batch job <= 5",
         f"{not_get / max(case.jobs, 1):.1f} ({not_get:,} / {case.jobs})",
         not_get <= 5 * case.jobs),
        (f"SubmitJob = ceil(children/10,000) = {expected_submits}", f"{submits}",
         submits == expected_submits),
        ("DescribeJobs <= polls x ceil(jobs/100)", f"{describes:,} <= {describe_bound:,}",
         describes <= describe_bound),
        ("only 127.0.0.1", ", ".join(foreign) or "yes", not foreign),
        ("the hook saw Batch and S3 (s3fs) requests", f"{submits} SubmitJob, {counts.s3('PUT')} PUT",
         submits > 0 and counts.s3("PUT") > 0),
    ]


def report(case: Case) -> str:
    counts = case.counts
    assert counts is not None
    rows = [
        ("children", case.children),
        ("Batch jobs", case.jobs),
        ("SubmitJob", counts.op("batch", "SubmitJob")),
        ("DescribeJobs", counts.op("batch", "DescribeJobs")),
        ("ListJobs", counts.op("batch", "ListJobs")),
        ("other Batch/Logs", counts.other_batch_logs),
        ("S3 PUT", counts.s3("PUT")),
        ("S3 GET", counts.s3("GET")),
        ("S3 LIST", counts.s3("LIST")),
        ("S3 HEAD", counts.s3("HEAD")),
        ("S3 other", counts.s3("OTHER")),
    ]
    lines = [f"({case.name}): {case.children:,} child{'' if case.children == 1 else 'ren'}, "
             f"{case.seconds:.1f} s "
             f"({case.cpu_seconds:.1f} s CPU in this process), results "
             f"{'correct' if case.correct else 'WRONG'}",
             f"  {'':<20} {'total':>10} {'per job':>10} {'per child':>10} {'per item':>10}"]
    for label, value in rows:
        per_item = _ratio(value, case.items) if label not in ("children", "Batch jobs") else ""
        lines.append(f"  {label:<20} {value:>10,} {_ratio(value, case.jobs):>10} "
                     f"{_ratio(value, case.children):>10} {per_item:>10}")
    describes = counts.op("batch", "DescribeJobs")
    lists = counts.op("batch", "ListJobs")
    lines.append(f"  poller rounds {case.polls:,}: DescribeJobs per round {_ratio(describes, case.polls)}"
                 f" vs ceil(jobs/100) = {math.ceil(case.jobs / 100)}; ListJobs per round "
                 f"{_ratio(lists, case.polls)}")
    by_operation = ", ".join(f"{op} {n:,}" for (_, op), n in sorted(counts.operations.items()))
    lines.append(f"  by operation: {by_operation}")
    lines.append("  targets:")
    for target, measured, met in targets(case):
        lines.append(f"    {'ok  ' if met else 'FAIL'} {target:<42} {measured}")
    return "\n".join(lines)


def _estimate(children: int) -> str:
    seconds = children / CHILDREN_PER_SECOND
    return f"~{seconds / 60:.0f} min" if seconds < 5400 else f"~{seconds / 3600:.1f} h"


def summary(cases: List[Case], skipped: List[Case]) -> str:
    lines = ["summary", f"  {'case':<34} {'children':>9} {'seconds':>8}  targets"]
    for case in cases:
        failed = [t for t, _, met in targets(case) if not met]
        verdict = "all met" if not failed and case.correct else "FAIL: " + "; ".join(
            failed + ([] if case.correct else ["wrong results"]))
        lines.append(f"  {case.name:<34} {case.children:>9,} {case.seconds:>8.1f}  {verdict}")
    for case in skipped:
        lines.append(f"  {case.name:<34} {case.children:>9,} {'skipped':>8}  "
                     f"over the children budget ({_estimate(case.children)} here): --full runs it")
    return "\n".join(lines)


def _numbers(text: str) -> List[int]:
    return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=_numbers, default=[1000, 10_000, 100_000],
                        help="map sizes, comma-separated (default 1000,10000,100000)")
    parser.add_argument("--chunksizes", type=_numbers, default=[1, 10, 100],
                        help="chunksizes, comma-separated (default 1,10,100)")
    parser.add_argument("--budget", type=int, default=CHILDREN_BUDGET,
                        help=f"children to run, smallest cases first (default {CHILDREN_BUDGET:,})")
    parser.add_argument("--full", action="store_true", help="run every case, whatever it costs")
    parser.add_argument("--max-vcpus", type=float, default=8,
                        help="the emulator's vCPUs: concurrent worker processes (default 8)")
    args = parser.parse_args()

    grid = [Case(items, chunksize) for items in args.sizes for chunksize in args.chunksizes]
    cases, skipped = select(grid, None if args.full else args.budget)

    print(f"python {sys.version.split()[0]}; {os.cpu_count()} cores; emulator max_vcpus "
          f"{args.max_vcpus:g}; requests sent by the client process per map (the workers' are "
          f"not counted)", flush=True)
    for case in skipped:
        print(f"skipped ({case.name}): {case.children:,} children, each a worker process on moto "
              f"S3 at ~{CHILDREN_PER_SECOND} a second here ({_estimate(case.children)}), over the "
              f"budget of {args.budget:,} children; --full runs it", flush=True)
    counter = RequestCounter().install()
    try:
        with tempfile.TemporaryDirectory() as folder, local_aws(folder, args.max_vcpus) as bucket:
            for case in cases:
                run_case(case, bucket, counter)
                print("\n" + report(case), flush=True)
    finally:
        counter.uninstall()
    print("\n" + summary(cases, skipped), flush=True)


if __name__ == "__main__":
    main()
