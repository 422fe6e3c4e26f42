"""A million calls from one client, simulated on this machine: what the client costs at scale.

    python benchmarks/bench_scale.py [--sizes 1000,10000,100000] [--latency-ms 30]
                                     [--account-tps 5] [--attach 400]

Per size (children of 10 items each, `map_futures(..., chunksize=10)`; 100,000 children are 10
arrays of 10,000), one fresh client process against one fresh emulator process:

    client process (measured)                          emulator process (not measured)
    BatchExecutor(ScaleEnvironment)                    python -m batchfutures.emulator
      Batch: stock boto3 ── HTTP 127.0.0.1 ──────────>   --launcher threads (no process per
              (every request counted, before-send)         attempt: the worker's code in
      storage: local files behind LatencyStorage            threads), --account-tps 5 (one
              (every request sleeps --latency-ms,           token bucket for the account:
              as S3's first byte does; counted)             429 above it, as AWS answers)
                                          <── results/<i> ── the workers write them, no latency

It prints, side by side: the time from the last child's result written to the last future
resolved; the client's Batch requests by operation and per second (and how many the account
budget refused); its S3 requests by kind per child; its RSS per outstanding future next to a
plain `concurrent.futures.Future`'s, measured in the same process (the plain futures are made
first and kept alive, so neither reuses the other's memory); its CPU per future (user + system,
the whole client process: submit, poller, reader threads, result decoding). Then one more row:
a fresh executor attaching to a finished job of 400 children, with the same storage latency.

The emulator's poll intervals are AWS's (1 s, doubling to 10 s while nothing changes), and the
client is not woken by the emulator (as on AWS, where nothing wakes it).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import gc
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))

ITEMS_PER_CHILD = 10
PAGE = 1000  # keys per S3 ListObjectsV2 page


def work(x: int) -> int:
    return 3 * x + 1


# -- the client's parts ---------------------------------------------------------------------------
def _storage_class() -> Any:
    from batchfutures.storage import Storage

    class LatencyStorage(Storage):
        """Local files, each request delayed as S3's first byte is, and counted by kind."""

        latency = 0.03
        counts: collections.Counter

        def _request(self, kind: str, pages: int = 1) -> None:
            with self._lock:
                self.counts[kind] += pages
            time.sleep(self.latency * pages)

        def get_bytes(self, url: str, start: Optional[int] = None,
                      end: Optional[int] = None) -> Optional[bytes]:
            self._request("GET")
            return super().get_bytes(url, start, end)

        def put_bytes(self, url: str, data: bytes, *, exclusive: bool = False) -> bool:
            self._request("PUT")
            return super().put_bytes(url, data, exclusive=exclusive)

        def list_results(self, job_url: str, start: int = 0) -> Any:
            found = super().list_results(job_url, start)  # what StartAfter would return
            self._request("LIST", max(1, math.ceil(len(found) / PAGE)))
            return found

        def list_names(self, url: str) -> List[str]:
            names = super().list_names(url)
            self._request("LIST", max(1, math.ceil(len(names) / PAGE)))
            return names

        def _read_verified(self, url: str, make: Any, start: Optional[int] = None,
                           end: Optional[int] = None) -> Any:
            self._request("GET")  # every sealed object (results, pointers) is read here
            return super()._read_verified(url, make, start, end)

        def delete(self, url: str) -> None:
            self._request("DELETE")
            super().delete(url)

        def object_exists(self, url: str) -> bool:
            self._request("GET")
            return super().object_exists(url)

    return LatencyStorage


def scale_environment(endpoint: str, workdir: Path, latency: float) -> Any:
    import boto3

    from batchfutures import signing
    from batchfutures.awsclients import CLIENT_CONFIG
    from batchfutures.environments import BaseEnvironment

    class ScaleEnvironment(BaseEnvironment):
        """The emulator's endpoint through stock boto3, storage on local files with latency."""

        job_queue = "batchfutures"

        def __init__(self) -> None:
            super().__init__()
            # the endpoint serves only requests signed with its pair, which the emulator
            # wrote to <its folder>/endpoint.json (mode 0600) before printing its URL
            found = json.loads((workdir / "emulator" / "endpoint.json").read_text())
            session = boto3.Session(aws_access_key_id=found["aws_access_key_id"],
                                    aws_secret_access_key=found["aws_secret_access_key"],
                                    region_name="us-east-1")
            config = __import__("botocore.config").config.Config(**CLIENT_CONFIG)
            self._batch = session.client("batch", endpoint_url=endpoint, config=config)
            self._logs = session.client("logs", endpoint_url=endpoint, config=config)
            self.requests: collections.Counter = collections.Counter()
            self.throttled = 0
            self._batch.meta.events.register("before-send.batch", self._count)
            self._batch.meta.events.register("needs-retry.batch", self._answer)
            storage_class = _storage_class()
            self._storage = storage_class((workdir / "storage").as_uri(),
                                          signer=signing.local_signer(workdir))
            self._storage.latency = latency
            self._storage.counts = collections.Counter()

        def _count(self, event_name: str = "", **_: Any) -> None:
            self.requests[event_name.rsplit(".", 1)[-1]] += 1  # before-send.batch.<Operation>

        def _answer(self, response: Any = None, **_: Any) -> None:
            if response is not None and response[1].get("Error", {}).get("Code") == \
                    "TooManyRequestsException":
                self.throttled += 1

        @property
        def batch(self) -> Any:
            return self._batch

        @property
        def logs(self) -> Any:
            return self._logs

        @property
        def storage(self) -> Any:
            return self._storage

        @property
        def job_definition(self) -> str:
            return "batchfutures-worker"

    return ScaleEnvironment()


class RssSampler:
    """This process's resident memory, sampled every 20 ms; `peak` since start."""

    def __init__(self) -> None:
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, rss_bytes())


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def last_result_written(storage_root: Path) -> float:
    latest = 0.0
    for folder, _, files in os.walk(storage_root):
        if os.path.basename(folder) == "results":
            for name in files:
                latest = max(latest, os.stat(os.path.join(folder, name)).st_mtime)
    return latest


# -- one size, in its own client process ----------------------------------------------------------
def run_one(children: int, endpoint: str, workdir: Path, latency: float) -> Dict[str, Any]:
    from batchfutures import BatchExecutor

    items = children * ITEMS_PER_CHILD
    gc.collect()
    before_plain = rss_bytes()
    plain = [concurrent.futures.Future() for _ in range(items)]  # kept alive: see the docstring
    plain_bytes = (rss_bytes() - before_plain) / items
    for future in plain:  # as the run's futures will be: resolved, holding an int
        future.set_result(1)
    env = scale_environment(endpoint, workdir, latency)
    gc.collect()
    rss0, cpu0, wall0 = rss_bytes(), cpu_seconds(), time.time()
    sampler = RssSampler()
    with BatchExecutor(env, vcpus=1, memory=512) as executor:
        futures = executor.map_futures(work, range(items), chunksize=ITEMS_PER_CHILD)
        submitted = time.time()
        for index, future in enumerate(futures):
            assert future.result() == 3 * index + 1
        resolved = time.time()
        cpu1 = cpu_seconds()
        peak = sampler.stop()
        jobs = len({future.job_id.rpartition(":")[0] for future in futures[::ITEMS_PER_CHILD]})
    written = last_result_written(workdir / "storage")
    wall = resolved - wall0
    s3 = dict(env.storage.counts)
    return {
        "children": children, "futures": items, "arrays": jobs,
        "last_result_to_last_future_s": resolved - written,
        "submit_s": submitted - wall0, "wall_s": wall,
        "batch_requests": dict(env.requests), "batch_total": sum(env.requests.values()),
        "batch_per_s": sum(env.requests.values()) / wall, "throttled": env.throttled,
        "s3_per_child": {kind: count / children for kind, count in s3.items()},
        "rss_per_future": (peak - rss0) / items, "plain_future_bytes": plain_bytes,
        "cpu_us_per_future": (cpu1 - cpu0) / items * 1e6,
        "plain_kept": len(plain),
    }


def run_iterated(children: int, endpoint: str, workdir: Path, latency: float) -> Dict[str, Any]:
    """``map`` consumed as it yields: results go with the caller, the look-ahead is bounded."""
    from batchfutures import BatchExecutor

    items = children * ITEMS_PER_CHILD
    env = scale_environment(endpoint, workdir, latency)
    gc.collect()
    rss0 = rss_bytes()
    sampler = RssSampler()
    with BatchExecutor(env, vcpus=1, memory=512) as executor:
        for index, value in enumerate(executor.map(work, range(items), chunksize=ITEMS_PER_CHILD)):
            assert value == 3 * index + 1
    peak = sampler.stop()
    return {"children": children, "items": items, "peak_mib": (peak - rss0) / 2**20,
            "bytes_per_item": (peak - rss0) / items}


def run_attach(children: int, endpoint: str, workdir: Path, latency: float) -> Dict[str, Any]:
    """A finished job of ``children`` (one item each), attached to by a fresh executor."""
    from batchfutures import BatchExecutor

    env = scale_environment(endpoint, workdir, 0.0)  # submitting is not what is measured
    with BatchExecutor(env, vcpus=1, memory=512) as executor:
        futures = executor.map_futures(work, range(children))
        job_id = futures[0].job_id.rpartition(":")[0]
        assert [f.result() for f in futures] == [work(i) for i in range(children)]
    env = scale_environment(endpoint, workdir, latency)
    started = time.time()
    with BatchExecutor(env, vcpus=1, memory=512) as fresh:
        attached = fresh.attach(job_id)
        values = [f.result() for f in attached]
    took = time.time() - started
    assert values == [work(i) for i in range(children)]
    return {"children": children, "attach_s": took,
            "s3": dict(env.storage.counts), "batch_requests": dict(env.requests)}


# -- the driver -----------------------------------------------------------------------------------
def start_emulator(folder: Path, account_tps: float, max_vcpus: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "batchfutures.emulator", "--folder", str(folder),
               "--launcher", "threads", "--max-vcpus", str(max_vcpus)]
    if account_tps:
        command += ["--account-tps", str(account_tps)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    process.endpoint = process.stdout.readline().strip()  # type: ignore[attr-defined]
    if not process.endpoint.startswith("http://127.0.0.1:"):  # type: ignore[attr-defined]
        raise SystemExit(f"the emulator did not start: {process.endpoint!r}")  # type: ignore
    return process


def measure(kind: str, size: int, args: argparse.Namespace, root: Path) -> Dict[str, Any]:
    workdir = root / f"{kind}-{size}"
    workdir.mkdir(mode=0o700)
    emulator = start_emulator(workdir / "emulator", args.account_tps, args.max_vcpus)
    try:
        output = subprocess.run(
            [sys.executable, __file__, "--one", kind, "--size", str(size), "--endpoint",
             emulator.endpoint, "--workdir", str(workdir),  # type: ignore[attr-defined]
             "--latency-ms", str(args.latency_ms)],
            check=True, stdout=subprocess.PIPE, text=True).stdout
    finally:
        emulator.terminate()
        emulator.wait(timeout=60)
    return json.loads(output.strip().splitlines()[-1])


def table(rows: List[Dict[str, Any]]) -> str:
    def line(label: str, values: List[str]) -> str:
        return f"  {label:<44}" + "".join(f"{v:>14}" for v in values)

    operations = sorted({op for row in rows for op in row["batch_requests"]})
    kinds = sorted({kind for row in rows for kind in row["s3_per_child"]})
    out = [line("children (10 items each)", [f"{r['children']:,}" for r in rows]),
           line("futures", [f"{r['futures']:,}" for r in rows]),
           line("array jobs", [str(r["arrays"]) for r in rows]),
           line("last result written -> last future (s)",
                [f"{r['last_result_to_last_future_s']:.2f}" for r in rows]),
           line("submit (s) / whole run (s)",
                [f"{r['submit_s']:.1f} / {r['wall_s']:.1f}" for r in rows]),
           line("Batch requests, all", [str(r["batch_total"]) for r in rows]),
           line("  per second (whole run)", [f"{r['batch_per_s']:.2f}" for r in rows])]
    out += [line(f"  {op}", [str(r["batch_requests"].get(op, 0)) for r in rows])
            for op in operations]
    out += [line("  refused by the account budget (429)", [str(r["throttled"]) for r in rows])]
    out += [line("S3 requests per child", ["" for _ in rows])]
    out += [line(f"  {kind}", [f"{r['s3_per_child'].get(kind, 0):.3f}" for r in rows])
            for kind in kinds]
    out += [line("RSS per outstanding future (bytes)", [f"{r['rss_per_future']:.0f}" for r in rows]),
            line("  plain concurrent.futures.Future (bytes)",
                 [f"{r['plain_future_bytes']:.0f}" for r in rows]),
            line("  ratio", [f"{r['rss_per_future'] / r['plain_future_bytes']:.2f}x" for r in rows]),
            line("client CPU per future (us)", [f"{r['cpu_us_per_future']:.1f}" for r in rows])]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--latency-ms", type=float, default=30.0)
    parser.add_argument("--account-tps", type=float, default=5.0)
    parser.add_argument("--max-vcpus", type=int, default=16)
    parser.add_argument("--attach", type=int, default=400)
    parser.add_argument("--iterated", type=int, default=100_000,
                        help="children of a map() consumed as it yields (0: skip)")
    parser.add_argument("--one", choices=["map", "attach", "iterated"])
    parser.add_argument("--size", type=int)
    parser.add_argument("--endpoint")
    parser.add_argument("--workdir")
    args = parser.parse_args()
    if args.one:
        run = {"map": run_one, "attach": run_attach, "iterated": run_iterated}[args.one]
        result = run(args.size, args.endpoint, Path(args.workdir), args.latency_ms / 1000)
        print(json.dumps(result), flush=True)
        return
    sizes = [int(s) for s in args.sizes.split(",") if s]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; storage latency "
          f"{args.latency_ms:g} ms per client request; account budget {args.account_tps:g} "
          f"Batch requests/s; emulator: threads, max_vcpus {args.max_vcpus}", flush=True)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bf-scale-") as tmp:
        root = Path(tmp)
        rows = []
        for size in sizes:
            rows.append(measure("map", size, args, root))
            print(f"  ... {size:,} children done after {time.time() - started:.0f} s", flush=True)
        print(table(rows))
        if args.iterated:
            it = measure("iterated", args.iterated, args, root)
            print(f"map() of {it['items']:,} items ({it['children']:,} children) consumed as it "
                  f"yields: peak RSS {it['peak_mib']:.0f} MiB above the start, "
                  f"{it['bytes_per_item']:.0f} bytes per item (map_futures above holds every "
                  f"future)", flush=True)
        if args.attach:
            attach = measure("attach", args.attach, args, root)
            print(f"attach to a finished job of {attach['children']} children: all resolved in "
                  f"{attach['attach_s']:.2f} s (S3 {attach['s3']}, Batch {attach['batch_requests']})")
    print(f"whole benchmark: {time.time() - started:.0f} s")


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main()
