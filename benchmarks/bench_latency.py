"""Time from a child's result being written to its future resolving, on the embedded default.

    python benchmarks/bench_latency.py [--calls 100]

Each call returns time.time() as its last act, so the measured gap covers pickling and writing the
result, the emulator noticing the exit, the poller's wake-up and DescribeJobs, the result read and
the future's callback. Printed: p50, p95 and max, in milliseconds.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import tempfile
import threading
import time


def stamp(_: int) -> float:
    return time.time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    from batchfutures import BatchExecutor, LocalEnvironment

    gaps = []
    lock = threading.Lock()

    def resolved(future):
        now = time.time()
        with lock:
            gaps.append((now - future.result()) * 1000)

    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as folder:
        env = LocalEnvironment(folder)
        with BatchExecutor(env) as executor:
            executor.submit(stamp, 0).result()  # warm up
            futures = executor.map_futures(stamp, range(args.calls))
            for future in futures:
                future.add_done_callback(resolved)
            concurrent.futures.wait(futures)
        env.emulator.close()  # before its folder goes
    gaps.sort()
    p95 = gaps[min(len(gaps) - 1, int(0.95 * len(gaps)))]
    print(f"python {sys.version.split()[0]}; {len(gaps)} calls, result written -> future resolved")
    print(f"  p50 {statistics.median(gaps):8.1f} ms   p95 {p95:8.1f} ms   max {gaps[-1]:8.1f} ms")


if __name__ == "__main__":
    main()
