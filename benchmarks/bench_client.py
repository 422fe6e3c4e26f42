"""Client-side cost of submitting 1,000,000 small items with chunksize 1,000.

    python benchmarks/bench_client.py [--items 1000000] [--chunksize 1000]

Measures the `ex.map(...)` call itself (pickling, building the inputs object, uploading,
SubmitJob) on the embedded default, with the emulator sized so no child runs (a job of 1 vCPU on
a 0.5 vCPU emulator waits in RUNNABLE): wall time of a first map and of later ones in the same
process (the median of --repeats), peak RSS above the interpreter's baseline, bytes uploaded;
against the floor, `pickle.dumps` of the same list (median of --repeats).
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import statistics
import sys
import tempfile
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--chunksize", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5, help="maps after the first (median)")
    args = parser.parse_args()
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
