"""Client-side cost of submitting 1,000,000 small items with chunksize 1,000.

    python benchmarks/bench_client.py [--items 1000000] [--chunksize 1000]

Measures the `ex.map(...)` call itself (pickling, building the inputs object, uploading,
SubmitJob) on the embedded default, with the emulator sized so no child runs (a job of 1 vCPU on
a 0.5 vCPU emulator waits in RUNNABLE): wall time of a first map and of later ones in the same
process (the median of --repeats), peak RSS above the interpreter's baseline, bytes uploaded;
against the floor, `pickle.dumps` of the same list (median of --repeats).

    python benchmarks/bench_client.py --cache [--items 100000]

counts instead the storage requests (LIST, GET, PUT) each map() call makes with cache=False and
cache=True (docs/caching.md): the look-up adds none when the cache is off, and per map one
LIST, one GET per earlier index object and per earlier child holding a candidate.
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import statistics
import sys
import tempfile
import threading
import time

from _common import median_seconds


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def submit_once(executor, items, chunksize):
    """Seconds for the map() call (pickling, upload, SubmitJob) and the Batch jobs it made."""
    before = len(executor._session.submitted_jobs)
    started = time.perf_counter()
    results = executor.map(abs, items, chunksize=chunksize)
    seconds = time.perf_counter() - started
    jobs = len(executor._session.submitted_jobs) - before
    del results
    return seconds, jobs


class RequestCounter:
    """Counts Storage's primitive requests (every LIST, GET and PUT goes through these) made
    on the calling thread: map() submits there; the poller's result reads are not counted."""

    METHODS = {"list_names": "LIST", "_names_after": "LIST", "get_bytes": "GET",
               "_read_verified": "GET", "put_bytes": "PUT"}

    def __init__(self) -> None:
        from batchfutures.storage import Storage

        self.counts = {"LIST": 0, "GET": 0, "PUT": 0}
        self._originals = {name: getattr(Storage, name) for name in self.METHODS}
        for name, kind in self.METHODS.items():
            setattr(Storage, name, self._counted(self._originals[name], kind))

    def _counted(self, method, kind):
        def counted(storage, *args, **kwargs):
            if threading.current_thread() is threading.main_thread():
                self.counts[kind] += 1
            return method(storage, *args, **kwargs)
        return counted

    def take(self):
        taken = dict(self.counts)
        self.counts.update(LIST=0, GET=0, PUT=0)
        return taken


def count_requests(args) -> None:
    """Storage requests per map() with and without the cache (the second map's children may
    have run: its look-up then finds their results)."""
    from batchfutures import BatchExecutor, LocalEnvironment

    items = range(args.items)
    counter = RequestCounter()
    with tempfile.TemporaryDirectory() as folder:
        env = LocalEnvironment(folder, max_vcpus=1)
        rows = []
        for cache in (False, True):
            executor = BatchExecutor(env, cache=cache)
            executor.submit(abs, 1).cancel()
            counter.take()
            for label in ("first map", "second map (same items)"):
                seconds, jobs = submit_once(executor, items, args.chunksize)
                rows.append((f"cache={cache}, {label}", jobs, counter.take(), seconds))
            executor.shutdown(wait=False, cancel_futures=True)
        env.emulator.close()
    children = -(-args.items // args.chunksize)
    print(f"{args.items:,} items, chunksize {args.chunksize} ({children:,} children per map); "
          f"storage requests made by each map() call")
    print(f"  {'':<38} {'jobs':>5} {'LIST':>6} {'GET':>6} {'PUT':>6} {'seconds':>8}")
    for label, jobs, counts, seconds in rows:
        print(f"  {label:<38} {jobs:>5} {counts['LIST']:>6} {counts['GET']:>6} "
              f"{counts['PUT']:>6} {seconds:>8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--chunksize", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5, help="maps after the first (median)")
    parser.add_argument("--cache", action="store_true",
                        help="count storage requests per map with cache=False and cache=True")
    args = parser.parse_args()
    if args.cache:
        count_requests(args)
        return
    from batchfutures import BatchExecutor, LocalEnvironment

    items = range(args.items)
    with tempfile.TemporaryDirectory() as folder:
        env = LocalEnvironment(folder, max_vcpus=0.5)  # children wait in RUNNABLE: client cost only
        executor = BatchExecutor(env)
        executor.submit(abs, 1).cancel()
        storage = os.path.join(folder, "storage")
        baseline = peak_rss_mib()  # the interpreter with batchfutures imported, before any map
        first, jobs = submit_once(executor, items, args.chunksize)
        peak = peak_rss_mib() - baseline
        uploaded = folder_bytes(storage)
        second = statistics.median(submit_once(executor, items, args.chunksize)[0]
                                   for _ in range(args.repeats))
        executor.shutdown(wait=False, cancel_futures=True)
        env.emulator.close()

    # the floor last, so its own peak does not hide the map's
    floor_bytes = len(pickle.dumps(list(items), protocol=pickle.HIGHEST_PROTOCOL))
    floor = median_seconds(lambda: pickle.dumps(list(items), protocol=pickle.HIGHEST_PROTOCOL),
                           args.repeats)

    print(f"python {sys.version.split()[0]}; {args.items:,} items, chunksize {args.chunksize}")
    print(f"  {'':<40} {'seconds':>9} {'x floor':>9} {'peak RSS MiB':>13} {'bytes':>12}")
    print(f"  {'pickle.dumps(list) (floor)':<40} {floor:>9.3f} {1:>9.2f} {'':>13} {floor_bytes:>12,}")
    print(f"  {'batchfutures map() submit, first':<40} {first:>9.3f} {first / floor:>9.2f} "
          f"{peak:>13.1f} {uploaded:>12,}")
    print(f"  {'batchfutures map() submit, later (median)':<41} {second:>9.3f} "
          f"{second / floor:>9.2f}")
    print(f"  Batch jobs per map: {jobs}. The first map also pays one-time set-up (the emulator "
          f"loads botocore's Batch model to validate requests; the queue is checked once).")


if __name__ == "__main__":
    main()
