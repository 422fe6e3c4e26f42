"""Client-side cost of submitting 1,000,000 small items with chunksize 1,000.

    python benchmarks/bench_client.py [--items 1000000] [--chunksize 1000]

Measures the `ex.map(...)` call itself (pickling, building the inputs object, uploading,
SubmitJob) on the embedded default, with the emulator sized so no child runs (a job of 1 vCPU on
a 0.5 vCPU emulator waits in RUNNABLE): wall time, peak RSS above the interpreter's baseline,
bytes uploaded; against the floor, `pickle.dumps` of the same list.
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import sys
import tempfile
import time


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--chunksize", type=int, default=1000)
    args = parser.parse_args()
    from batchfutures import BatchExecutor, LocalEnvironment

    items = range(args.items)
    started = time.perf_counter()
    floor_bytes = len(pickle.dumps(list(items), protocol=pickle.HIGHEST_PROTOCOL))
    floor = time.perf_counter() - started

    with tempfile.TemporaryDirectory() as folder:
        env = LocalEnvironment(folder, max_vcpus=0.5)  # children wait in RUNNABLE: client cost only
        executor = BatchExecutor(env)
        executor.submit(abs, 1).cancel()
        baseline = peak_rss_mib()
        started = time.perf_counter()
        results = executor.map(abs, items, chunksize=args.chunksize)
        submit = time.perf_counter() - started
        peak = peak_rss_mib() - baseline
        uploaded = folder_bytes(os.path.join(folder, "storage"))
        jobs = len(executor._session.submitted_jobs)
        del results
        executor.shutdown(wait=False, cancel_futures=True)
        env.emulator.close()

    print(f"python {sys.version.split()[0]}; {args.items:,} items, chunksize {args.chunksize}")
    print(f"  {'':<34} {'seconds':>9} {'x floor':>9} {'peak RSS MiB':>13} {'bytes':>12}")
    print(f"  {'pickle.dumps(list) (floor)':<34} {floor:>9.3f} {1:>9.2f} {'':>13} {floor_bytes:>12,}")
    print(f"  {'batchfutures map() submit':<34} {submit:>9.3f} {submit / floor:>9.2f} "
          f"{peak:>13.1f} {uploaded:>12,}")
    print(f"  Batch jobs submitted: {jobs}")


if __name__ == "__main__":
    main()
