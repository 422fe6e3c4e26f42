"""`ex.map` on the embedded default against its local peers, side by side in one run.

    python benchmarks/bench_local.py [--repeats 3] [--cases abcd]

Cases: (a) 200 trivial calls, chunksize 1; (b) 2,000 trivial calls, chunksize 100;
(c) 8 calls of about 0.5 s CPU each; (d) 64 calls of about 0.25 s CPU, chunksize 32, where
batchfutures runs children of 2 vCPUs, each running its 32 items on 2 processes (pool.py).
Peers without a chunksize get the same layout: one call per chunk of items (so in (d) each of
their 2 calls runs 32 items one after the other: they have no inner pool). Peers:
ProcessPoolExecutor(2), submitit's LocalExecutor (map_array) and Lithops' localhost
FunctionExecutor.map, each skipped with a line saying so when it is not installed
(pip install -e '.[bench]'). ``--cases d`` runs only case (d).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# The peers' workers import the benchmark functions by module name: let them find this folder.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)

import functools  # noqa: E402

from _common import (  # noqa: E402
    chunks,
    half_second_of_cpu,
    median_seconds,
    quarter_second_of_cpu,
    run_chunk,
    table,
    trivial,
)

from batchfutures import BatchExecutor, LocalEnvironment  # noqa: E402

# title: (function, items, chunksize, batchfutures job settings)
CASES = {
    "(a) 200 trivial calls, chunksize 1": (trivial, 200, 1, {}),
    "(b) 2,000 trivial calls, chunksize 100": (trivial, 2000, 100, {}),
    "(c) 8 calls of ~0.5 s CPU": (half_second_of_cpu, 8, 1, {}),
    # BATCHFUTURES_VCPUS is set by hand until the client derives it from vcpus
    "(d) 64 calls of ~0.25 s CPU, chunksize 32, vcpus=2": (
        quarter_second_of_cpu, 64, 32, {"vcpus": 2, "environment": {"BATCHFUTURES_VCPUS": "2"}}),
}


def run_batchfutures(executor, fn, n, chunksize):
    results = list(executor.map(fn, range(n), chunksize=chunksize))
    assert len(results) == n


def run_process_pool(pool, fn, n, chunksize):
    assert len(list(pool.map(fn, range(n), chunksize=chunksize))) == n


def interleaved_medians(runs, repeats):
    """Median seconds of each run, the runs taking turns: on a shared, noisy machine the load
    then changes under both alike rather than under whichever ran second."""
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(median_seconds(run, 1))
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def submitit_runner(folder):
    try:
        import submitit
    except ImportError:
        return None
    executor = submitit.LocalExecutor(folder=folder)
    executor.update_parameters(timeout_min=10)

    def run(fn, n, chunksize):
        jobs = executor.map_array(functools.partial(run_chunk, fn), chunks(n, chunksize))
        assert sum(len(job.result()) for job in jobs) == n
    return run


def lithops_runner():
    try:
        import lithops
    except ImportError:
        return None
    config = {"lithops": {"backend": "localhost", "storage": "localhost", "log_level": "ERROR"}}

    def run(fn, n, chunksize):
        executor = lithops.FunctionExecutor(config=config)
        executor.map(functools.partial(run_chunk, fn), [(c,) for c in chunks(n, chunksize)])
        assert sum(len(r) for r in executor.get_result()) == n
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peer-repeats", type=int, default=1,
                        help="repetitions for submitit and Lithops, which are slow")
    parser.add_argument("--cases", default="abcd", help="which cases to run, by letter")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; median of {args.repeats} runs")
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as folder:
        env = LocalEnvironment(os.path.join(folder, "bf"))
        executor = BatchExecutor(env)
        run_batchfutures(executor, trivial, 4, 1)  # warm: emulator started, modules imported
        pool = concurrent.futures.ProcessPoolExecutor(2)
        run_process_pool(pool, trivial, 4, 1)
        submitit_run = submitit_runner(os.path.join(folder, "submitit"))
        lithops_run = lithops_runner()
        for title, (fn, n, chunksize, settings) in CASES.items():
            if title[1] not in args.cases:
                continue
            case = (fn, n, chunksize)
            view = executor.with_settings(**settings) if settings else executor
            rows = interleaved_medians({
                "batchfutures (emulator)": lambda case=case, view=view: run_batchfutures(view, *case),
                "ProcessPoolExecutor(2)": lambda case=case: run_process_pool(pool, *case),
            }, args.repeats)
            rows["submitit LocalExecutor"] = None if submitit_run is None else median_seconds(
                lambda case=case: submitit_run(*case), args.peer_repeats)
            rows["lithops localhost"] = None if lithops_run is None else median_seconds(
                lambda case=case: lithops_run(*case), args.peer_repeats)
            print(table(title, rows, baseline="ProcessPoolExecutor(2)"), flush=True)
        if submitit_run is None:
            print("submitit is not installed: skipped (pip install submitit)")
        if lithops_run is None:
            print("lithops is not installed: skipped (pip install lithops)")
        pool.shutdown()
        executor.shutdown()


if __name__ == "__main__":
    main()
