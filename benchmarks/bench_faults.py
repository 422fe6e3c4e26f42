"""Fault soak: does every future end with its result or a typed error under AWS's real faults?

    python benchmarks/bench_faults.py            (a few minutes on 2 cores; needs the test extra)
    python benchmarks/bench_faults.py --quick    (smaller workload, for a first look)

Workload per scenario: a map of 2,000 items at chunksize 1 and at chunksize 10, and 200 submits
(retries=3 everywhere, so host losses are retried). Scenarios, each fault alone and all at once:

    none        the fault-free run every other row is compared with
    throttle    30% of Batch calls answered 429 TooManyRequestsException
    lag         arrays' statusSummary refreshed only every 2 s (statusSummaryLastUpdatedAt)
    host-loss   5% of attempts killed as a lost host ("Host EC2 (instance i-...) terminated.")
    ambiguous   every SubmitJob creates the job and then answers 500 (half of them in "all")
    all         the four above at once
    s3-503      10% of S3 requests answered 503 SlowDown (AWS path: stock boto3 against the
                emulator's HTTP endpoint, S3 on moto behind a failing proxy; chunksize 10 only,
                since each worker builds an S3 client)
    s3-503-2k   the same 10% of S3 requests answered 503, at scale: the map of 2,000 items at
                chunksize 1 (2,000 children, each GETting the same function and inputs objects),
                no submits; each child's S3 calls must ride out the 503s within the storage
                retry budget (storage.STORAGE_RETRY), else the child exits 1 and Batch retries it
    sigkill     the client process SIGKILLed mid-map (AWS path, emulator in its own process);
                a new process attaches by job id and must recover every result

Columns: results correct, typed errors (by type), lost (neither a correct result nor a typed
error), hung (still pending 600 s after the group was submitted, long after its jobs ended),
duplicate jobs (Batch jobs sharing one
submission's name), Batch requests against the fault-free run, wall time against it. (The
s3-503-2k row waits 1,800 s before counting a future as hung: its 2,000 worker processes take
longer than 600 s on 2 cores.)
The bar: 0 lost, 0 hung, 0 duplicates, every result correct or typed.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # the S3 fault proxy lives with the test fixtures

DEADLINE = 600.0  # seconds a group of futures may take before those still pending count as hung


def work(x: int) -> int:
    return 3 * x + 1


class CountingBatch:
    """The environment's Batch client, counting every call by operation (faulted ones too)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if not callable(method) or name.startswith("_"):
            return method

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
            return method(*args, **kwargs)

        return counted


class Row:
    def __init__(self, name: str) -> None:
        self.name = name
        self.correct = self.total = self.lost = self.hung = self.duplicates = 0
        self.errors: collections.Counter = collections.Counter()
        self.requests = 0
        self.seconds = 0.0
        self.note = ""

    def outcomes(self, futures: List[Any], expected: List[int],
                 deadline: float = DEADLINE) -> None:
        from batchfutures import BatchError

        # every job ends long before the deadline; what is still pending then would wait forever
        done, pending = concurrent.futures.wait(futures, timeout=deadline)
        self.hung += len(pending)
        for future, want in zip(futures, expected):
            if future in pending:
                continue
            self.total += 1
            error = future.exception()
            if error is None:
                if future.result() == want:
                    self.correct += 1
                else:
                    self.lost += 1
            elif isinstance(error, (BatchError, SystemExit)):
                self.errors[type(error).__name__] += 1
            else:
                self.lost += 1
        self.total += len(pending)


def workload(executor: Any, quick: bool, chunksizes: List[int],
             submits: bool = True) -> Iterator[tuple]:
    items = 200 if quick else 2000
    for chunksize in chunksizes:
        yield executor.map_futures(work, range(items), chunksize=chunksize), \
            [work(x) for x in range(items)]
    if not submits:
        return
    submits = 20 if quick else 200
    yield [executor.submit(work, x) for x in range(submits)], [work(x) for x in range(submits)]


def duplicates_in(emulator: Any) -> int:
    """Batch jobs that share a submission's unique name: each extra one ran work twice."""
    names: collections.Counter = collections.Counter()
    for status in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED"):
        token = None
        while True:
            page = emulator.list_jobs(jobQueue="batchfutures", jobStatus=status,
                                      **({"nextToken": token} if token else {}))
            names.update(job["jobName"] for job in page["jobSummaryList"])
            token = page.get("nextToken")
            if not token:
                break
    return sum(count - 1 for count in names.values() if count > 1)


# -- the local scenarios: LocalEnvironment with the emulator's fault profile ------------------
def local_scenario(name: str, profile: Any, quick: bool, folder: Path) -> Row:
    from batchfutures import BatchExecutor, LocalEnvironment

    class CountedEnvironment(LocalEnvironment):
        counting: Optional[CountingBatch] = None

        @property
        def batch(self) -> Any:
            if self.counting is None:
                self.counting = CountingBatch(self.emulator)
            return self.counting

    row = Row(name)
    env = CountedEnvironment(folder / name, max_vcpus=2)
    env.emulator.set_faults(profile)
    started = time.perf_counter()
    try:
        with BatchExecutor(env, retries=3) as executor:
            for futures, expected in list(workload(executor, quick, [1, 10])):
                row.outcomes(futures, expected)
        row.seconds = time.perf_counter() - started
        row.requests = sum(env.batch.calls.values())
        faults = env.emulator.faults
        row.note = f"{faults.injected} API faults, {faults.hosts_lost} hosts lost"
        env.emulator.set_faults(None)
        row.duplicates = duplicates_in(env.emulator)
    finally:
        env.emulator.close()
    return row


# -- the AWS-path scenarios ------------------------------------------------------------------
@contextlib.contextmanager
def aws_stack(folder: Path, s3_fault_rate: float, emulator_process: bool) -> Iterator[Dict[str, Any]]:
    """moto S3 behind the fault proxy; the emulator's endpoint in-process or as its own process."""
    import logging

    import boto3
    from bench_requests import REGION, fake_aws_variables, patched_environ
    from moto.server import ThreadedMotoServer
    from s3server import S3FaultProxy

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    proxy = S3FaultProxy(f"http://{host}:{port}", 0.0, seed=7).start()
    emulator = server = process = None
    try:
        values = fake_aws_variables(proxy.endpoint)
        values["BATCHFUTURES_SIGNING_KEY"] = "bench-faults-signing-key-0123456789abcdef"
        if emulator_process:  # its own process: killing the client must not stop the jobs
            process = subprocess.Popen(
                [sys.executable, "-m", "batchfutures.emulator", "--port", "0", "--folder",
                 str(folder / "emulator"), "--max-vcpus", "2",
                 # it serves only requests signed with its pair: the fake keys boto3 signs with
                 # (the secret by variable: never in argv)
                 "--access-key-id", values["AWS_ACCESS_KEY_ID"]],
                env={**os.environ, **values,
                     "BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY": values["AWS_SECRET_ACCESS_KEY"]},
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True)
            endpoint = process.stdout.readline().strip()  # it prints its URL, then serves
        else:
            from batchfutures.emulator import BatchEmulator
            from batchfutures.emulator.server import EmulatorServer

            emulator = BatchEmulator(str(folder / "emulator"), max_vcpus=2)
            server = EmulatorServer(emulator, access_key_id=values["AWS_ACCESS_KEY_ID"],
                                    secret_access_key=values["AWS_SECRET_ACCESS_KEY"]).start()
            endpoint = server.endpoint_url
        values["AWS_ENDPOINT_URL_BATCH"] = endpoint
        values["AWS_ENDPOINT_URL_CLOUDWATCH_LOGS"] = endpoint
        with patched_environ(values, ("AWS_PROFILE", "AWS_DEFAULT_PROFILE",
                                      "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")):
            boto3.client("s3", region_name=REGION).create_bucket(Bucket="bf-bench-faults")
            proxy.set(s3_fault_rate, seed=7)
            yield {"bucket": "bf-bench-faults", "proxy": proxy, "emulator": emulator,
                   "values": values, "region": REGION}
    finally:
        if server is not None:
            server.stop()
        if emulator is not None:
            emulator.close()
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
        proxy.stop()
        moto.stop()


def aws_environment(stack: Dict[str, Any]) -> Any:
    from batchfutures import AWSBatchEnvironment

    return AWSBatchEnvironment(job_queue="batchfutures", io_bucket=stack["bucket"],
                               job_definition="batchfutures-worker", region_name=stack["region"],
                               expected_bucket_owner="123456789012")


def failed_attempts(emulator: Any, futures: List[Any]) -> int:
    """Attempts of these futures' Batch jobs that failed (a worker exited 1 and Batch retried)."""
    ids = sorted({f.job_id for f in futures if f.job_id})
    failed = 0
    for start in range(0, len(ids), 100):
        for job in emulator.describe_jobs(jobs=ids[start:start + 100])["jobs"]:
            failed += max(0, len(job.get("attempts") or []) - 1) \
                + (job.get("status") == "FAILED")
    return failed


def s3_scenario(quick: bool, folder: Path, name: str = "s3-503", chunksizes: Sequence[int] = (10,),
                submits: bool = True, deadline: float = DEADLINE) -> Row:
    import s3fs
    from bench_requests import RequestCounter

    from batchfutures import BatchExecutor

    row = Row(name)
    all_futures: List[Any] = []
    with aws_stack(folder / name, 0.10, emulator_process=False) as stack:
        s3fs.S3FileSystem.clear_instance_cache()
        with RequestCounter() as counter:  # every request the client sends, by operation
            env = aws_environment(stack)
            started = time.perf_counter()
            with BatchExecutor(env, retries=3) as executor:
                for futures, expected in list(workload(executor, quick, list(chunksizes), submits)):
                    row.outcomes(futures, expected, deadline)
                    all_futures.extend(futures)
            row.seconds = time.perf_counter() - started
            row.requests = sum(counter.snapshot().service("batch").values())
        row.duplicates = duplicates_in(stack["emulator"])
        children = len({f.job_id for f in all_futures if f.job_id})
        proxy = stack["proxy"]
        row.note = (f"{children} children; {proxy.injected} of "
                    f"{proxy.injected + proxy.forwarded} S3 requests answered 503; "
                    f"{failed_attempts(stack['emulator'], all_futures)} child attempts failed; "
                    f"chunksize {', '.join(map(str, chunksizes))} only")
    return row


CLIENT_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {here!r})
    from bench_faults import aws_environment, work
    from batchfutures import BatchExecutor

    stack = {{"bucket": "bf-bench-faults", "region": {region!r}}}
    executor = BatchExecutor(aws_environment(stack), retries=3)
    futures = executor.map_futures(work, range({items}), chunksize=10)
    with open({ids!r}, "w") as handle:
        handle.write("\\n".join(sorted({{f.job_id.split(":")[0] for f in futures}})))
    while sum(f.done() for f in futures) < len(futures) // 4:
        time.sleep(0.05)
    print("quarter done", flush=True)
    time.sleep(60)
""")


def sigkill_scenario(quick: bool, folder: Path) -> Row:
    """The client dies mid-map; a fresh client attaches by job id and collects every result."""
    from batchfutures import BatchExecutor

    row = Row("sigkill")
    items = 200 if quick else 2000
    with aws_stack(folder / "sigkill", 0.0, emulator_process=True) as stack:
        ids = folder / "job-ids"
        script = CLIENT_SCRIPT.format(here=str(HERE), region=stack["region"], items=items,
                                      ids=str(ids))
        started = time.perf_counter()
        client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, env=os.environ.copy())
        client.stdout.readline()  # a quarter of the results are in
        client.send_signal(signal.SIGKILL)
        client.wait()
        env = aws_environment(stack)
        with BatchExecutor(env) as executor:
            futures: List[Any] = []
            for job_id in ids.read_text().split():
                attached = executor.attach(job_id)
                futures.extend(attached if isinstance(attached, list) else [attached])
            row.outcomes(futures, [work(x) for x in range(items)])
        row.seconds = time.perf_counter() - started
        row.note = "client SIGKILLed at 1/4, results collected by attach"
    return row


def table(rows: List[Row], baseline: Optional[Row]) -> str:
    lines = [f"{'scenario':<10} {'correct':>13} {'typed errors':<28} {'lost':>4} {'hung':>4} "
             f"{'dup':>3} {'requests':>9} {'time':>6}  notes"]
    for row in rows:
        errors = ", ".join(f"{n} {k}" for k, n in sorted(row.errors.items())) or "0"
        comparable = not row.name.startswith(("s3-503", "sigkill"))
        requests = f"{row.requests / baseline.requests:.2f}x" if comparable and baseline \
            and baseline.requests and row.requests else "-"
        wall = f"{row.seconds / baseline.seconds:.2f}x" if comparable and baseline \
            and baseline.seconds else "-"
        lines.append(f"{row.name:<10} {row.correct:>6}/{row.total:<6} {errors:<28} {row.lost:>4} "
                     f"{row.hung:>4} {row.duplicates:>3} {requests:>9} {wall:>6}  "
                     f"{row.seconds:.1f} s; {row.note}")
    return "\n".join(lines)


def main() -> None:
    from batchfutures.emulator.faults import FaultProfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 items and 20 submits")
    parser.add_argument("--only", help="comma-separated scenarios to run")
    args = parser.parse_args()
    seed = 11
    profiles = {
        "none": FaultProfile(),
        "throttle": FaultProfile(throttle_rate=0.3, seed=seed),
        "lag": FaultProfile(summary_lag=2.0, seed=seed),
        "host-loss": FaultProfile(host_loss_rate=0.05, seed=seed),
        # every SubmitJob creates its job and then answers 500: the client must find it, not resend
        "ambiguous": FaultProfile(lost_reply_rate=1.0, seed=seed),
        "all": FaultProfile(throttle_rate=0.3, summary_lag=2.0, host_loss_rate=0.05,
                            lost_reply_rate=0.5, seed=seed),
    }
    wanted = set(args.only.split(",")) if args.only else None
    rows: List[Row] = []
    with tempfile.TemporaryDirectory(prefix="bf-faults-") as tmp:
        folder = Path(tmp)
        for name, profile in profiles.items():
            if wanted is None or name in wanted or name == "none":
                rows.append(local_scenario(name, profile, args.quick, folder))
                print(f"  {name}: {rows[-1].seconds:.1f} s", file=sys.stderr, flush=True)
        if wanted is None or "s3-503" in wanted:
            rows.append(s3_scenario(args.quick, folder))
            print(f"  s3-503: {rows[-1].seconds:.1f} s", file=sys.stderr, flush=True)
        if wanted is None or "s3-503-2k" in wanted:
            rows.append(s3_scenario(args.quick, folder, "s3-503-2k", (1,), submits=False,
                                    deadline=3 * DEADLINE))
            print(f"  s3-503-2k: {rows[-1].seconds:.1f} s", file=sys.stderr, flush=True)
        if wanted is None or "sigkill" in wanted:
            rows.append(sigkill_scenario(args.quick, folder))
    print(f"python {sys.version.split()[0]}; map of {200 if args.quick else 2000} items at "
          f"chunksize 1 and 10 + {20 if args.quick else 200} submits, retries=3")
    print(table(rows, rows[0]))
    bad = [row.name for row in rows if row.lost or row.hung or row.duplicates
           or row.correct + sum(row.errors.values()) != row.total]
    print("bar met: 0 lost, 0 hung, 0 duplicates" if not bad else f"bar NOT met in: {', '.join(bad)}")


if __name__ == "__main__":
    main()
