"""One account's Batch budget shared with a neighbour: every call ends, none fails, the client
keeps to its share (its figures: docs/performance.md).

    python benchmarks/bench_budget.py [--jobs 300] [--account-tps 10] [--neighbour-rate 6]
                                      [--request-rate 4]

The account: `python -m batchfutures.emulator --account-tps 10 --launcher threads`, the
emulator's HTTP endpoint in a process of its own, answering 429 TooManyRequestsException to
every Batch request past 10 a second (its clients together: the budget AWS Batch keeps per
account and Region). Storage: moto's S3 server on 127.0.0.1 (in this process). Fake credentials,
everything on 127.0.0.1.

Two clients of that account, in this process:
- the neighbour: a plain boto3 `batch` client (botocore's retries off) sending DescribeJobs at
  6 a second on a fixed schedule, whatever it is answered;
- the client: `AWSBatchEnvironment(..., request_rate=4)` (its share: 10 - 6), running JOBS
  separately submitted calls (`with_settings(tags={"call": i})` each: distinct settings are never
  coalesced, so one SubmitJob per call) to completion.

Counted from botocore's own events on each client (`before-send`: a request sent;
`after-call` with HTTP 429: a throttled answer). The client's mean rate is its requests over the
run's wall time (from the executor's creation to its shutdown's end).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import note  # noqa: E402
from bench_requests import fake_aws_variables, patched_environ  # noqa: E402

REGION = "us-east-1"
KEYS = {"aws_access_key_id": "bench-budget", "aws_secret_access_key": "bench-budget-secret-0000"}


def call(i: int) -> int:
    return i * i + 1


class Tally:
    """Requests a botocore client sent, and the answers that were 429, from its events."""

    def __init__(self, client: Any) -> None:
        self.sent = 0
        self.throttled = 0
        self._lock = threading.Lock()
        client.meta.events.register("before-send.batch", self._before_send)
        client.meta.events.register("after-call.batch", self._after_call)

    def _before_send(self, **_: Any) -> None:
        with self._lock:
            self.sent += 1

    def _after_call(self, http_response: Any = None, **_: Any) -> None:
        if http_response is not None and http_response.status_code == 429:
            with self._lock:
                self.throttled += 1


def neighbour(endpoint: str, rate: float, stop: threading.Event, tally: Dict[str, Any]) -> None:
    """DescribeJobs at ``rate`` a second on a fixed schedule until ``stop``."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    client = boto3.session.Session(region_name=REGION, **KEYS).client(
        "batch", endpoint_url=endpoint, config=Config(retries={"total_max_attempts": 1}))
    counter = Tally(client)
    tally["counter"] = counter
    started = time.monotonic()
    sent = 0
    while not stop.is_set():
        due = started + sent / rate
        if stop.wait(max(0.0, due - time.monotonic())):
            break
        sent += 1
        try:
            client.describe_jobs(jobs=["neighbour-looks"])
        except ClientError:
            pass  # a throttled neighbour goes on at its own pace, as a script in a loop would
    tally["seconds"] = time.monotonic() - started


def start_endpoint(folder: str, account_tps: float, variables: Dict[str, str]) -> Any:
    env = dict(os.environ, **variables)  # the workers' S3 credentials and signing key
    env.update(BATCHFUTURES_EMULATOR_ACCESS_KEY_ID=KEYS["aws_access_key_id"],
               BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY=KEYS["aws_secret_access_key"])
    process = subprocess.Popen(
        [sys.executable, "-m", "batchfutures.emulator", "--folder", folder, "--account-tps",
         str(account_tps), "--launcher", "threads", "--max-vcpus", "8"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    endpoint = process.stdout.readline().strip()
    if not endpoint.startswith("http://"):
        process.kill()
        raise RuntimeError(f"the emulator endpoint did not start: {endpoint!r}")
    return process, endpoint


def run(args: argparse.Namespace) -> List[str]:
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    from batchfutures import AWSBatchEnvironment, BatchExecutor

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    lines: List[str] = []
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    folder = tempfile.mkdtemp(prefix="bf-bench-budget-")
    process = None
    try:
        host, port = moto.get_host_and_port()
        variables = fake_aws_variables(f"http://{host}:{port}")
        variables.update(AWS_ACCESS_KEY_ID=KEYS["aws_access_key_id"],
                         AWS_SECRET_ACCESS_KEY=KEYS["aws_secret_access_key"])
        variables.pop("AWS_SESSION_TOKEN", None)
        # the workers (threads of the endpoint's process) read the key as a container would
        variables["BATCHFUTURES_SIGNING_KEY"] = "bench-budget-signing-key-" + "k" * 32
        process, endpoint = start_endpoint(os.path.join(folder, "emulator"), args.account_tps,
                                           variables)
        variables["AWS_ENDPOINT_URL_BATCH"] = endpoint
        variables["AWS_ENDPOINT_URL_CLOUDWATCH_LOGS"] = endpoint
        with patched_environ(variables, ("AWS_SESSION_TOKEN", "AWS_PROFILE", "BATCHFUTURES_REQUEST_RATE")):
            bucket = "bf-bench-budget"
            boto3.client("s3", region_name=REGION).create_bucket(Bucket=bucket)
            stop = threading.Event()
            theirs: Dict[str, Any] = {}
            thread = threading.Thread(target=neighbour,
                                      args=(endpoint, args.neighbour_rate, stop, theirs),
                                      daemon=True)
            thread.start()
            time.sleep(1.0)  # the neighbour is at its pace before the client starts
            env = AWSBatchEnvironment(job_queue="batchfutures", io_bucket=bucket,
                                      job_definition="batchfutures-worker", region_name=REGION,
                                      request_rate=args.request_rate)
            ours = Tally(env.batch.unbudgeted)
            note(lines, f"{args.jobs} separately submitted calls; account budget "
                        f"{args.account_tps:g} requests/s; neighbour {args.neighbour_rate:g}/s; "
                        f"client request_rate={args.request_rate:g}")
            started = time.monotonic()
            failed: List[BaseException] = []
            correct = 0
            with BatchExecutor(env) as executor:
                futures = [executor.with_settings(tags={"call": str(i)}).submit(call, i)
                           for i in range(args.jobs)]
                for i, future in enumerate(futures):
                    error = future.exception()
                    if error is not None:
                        failed.append(error)
                    elif future.result() == call(i):
                        correct += 1
                submitted = len(executor._session.submitted_jobs)
                polls = executor._session.poller.polls
            wall = time.monotonic() - started
            stop.set()
            thread.join()
            neighbours = theirs["counter"]
            rows = [
                ("results correct", f"{correct} / {args.jobs}"),
                ("futures failed", f"{len(failed)}"),
                ("SubmitJob calls that made a job", f"{submitted}"),
                ("poller rounds", f"{polls}"),
                ("client requests sent", f"{ours.sent}"),
                ("client throttled answers (429)", f"{ours.throttled}"),
                ("client mean rate", f"{ours.sent / wall:.2f} requests/s "
                                     f"(share {args.request_rate:g})"),
                ("client waited for tokens", f"{env.batch.request_budget.waited:.1f} s"),
                ("neighbour requests sent", f"{neighbours.sent}"),
                ("neighbour throttled answers (429)", f"{neighbours.throttled}"),
                ("neighbour mean rate", f"{neighbours.sent / theirs['seconds']:.2f} requests/s"),
                ("wall time", f"{wall:.1f} s"),
            ]
            note(lines, "\n".join(f"  {name:<36} {value}" for name, value in rows))
            for error in failed[:3]:
                note(lines, f"  a failure: {type(error).__name__}: {error}")
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        moto.stop()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--account-tps", type=float, default=10.0)
    parser.add_argument("--neighbour-rate", type=float, default=6.0)
    parser.add_argument("--request-rate", type=float, default=4.0)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
