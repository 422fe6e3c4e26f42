"""Warm workers (keepalive=) side by side with ProcessPoolExecutor(2), in one run.

    python benchmarks/bench_warm.py [--rounds 30] [--calls 10000] [--workdir-in /dev/shm]

On the embedded default with 2 warm workers (``BatchExecutor(keepalive=60, max_workers=2)``):

  round       the median round of ``map`` of 8 calls that use numpy (target <= 15 ms)
  emcee-like  40 maps of 8 such calls in a row, total (target within 10x of PPE(2))

  The two are measured interleaved (--repeats times: PPE's rounds, the warm rounds, PPE's
  emcee-like loop, the warm one, ...) on executors kept open side by side, so a machine busy
  with something else slows both alike; each figure is the median over the repeats, and the
  ratio printed is the median of the repeats' own ratios.
  throughput  10,000 trivial calls, chunksize 1 (target >= 500 calls/s)
  requests    per call: SQS (the client's, counted by its pool, plus the workers', from the
              line each worker logs at its exit), storage (the workers' GET/PUT/HEAD; the
              client's puts: the function and the config, once), Batch (target 0 per call)

  --workdir-in where the executors' workdirs (their storage: each call's result is a file
              created there) are made; the system's temporary folder by default. On this
              project's machine creating a file on the ext4 disk costs ~0.3-0.6 ms of CPU, on
              /dev/shm ~0.03 ms: a round is about twice as fast there (docs/performance.md)

  aws-latency the median round again with AWS's latencies injected: 10 ms per SQS request (the
              emulator's, client and workers) and 30 ms per storage request of a worker
              (warmpool.INJECTED_LATENCY; target <= 150 ms)
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))

from batchfutures import BatchExecutor, LocalEnvironment, warmpool  # noqa: E402
from batchfutures.logs import job_log  # noqa: E402

ROUND = 8
MAPS = 40


def numpy_call(x: int) -> float:
    import numpy

    return float(numpy.linalg.norm(numpy.arange(64, dtype=float) * x))


def trivial(x: int) -> int:
    return x + 1


def rounds_ms(map_fn: Callable[..., Any], rounds: int) -> List[float]:
    times = []
    for r in range(rounds):
        started = time.perf_counter()
        list(map_fn(numpy_call, range(r, r + ROUND)))
        times.append((time.perf_counter() - started) * 1000)
    return times


def emcee_like(map_fn: Callable[..., Any]) -> float:
    started = time.perf_counter()
    state = 1
    for step in range(MAPS):
        state = int(sum(map_fn(numpy_call, range(state % 5, state % 5 + ROUND)))) + step
    return time.perf_counter() - started


def throughput(map_fn: Callable[..., Any], calls: int) -> float:
    started = time.perf_counter()
    results = list(map_fn(trivial, range(calls)))
    assert results[-1] == calls
    return calls / (time.perf_counter() - started)


def worker_requests(env: LocalEnvironment, ids: List[str]) -> Dict[str, int]:
    """The requests each worker logged at its exit, summed."""
    totals: Dict[str, int] = collections.Counter()
    for job in env.batch.describe_jobs(jobs=ids)["jobs"]:
        text = job_log(env.logs, job, env.log_group)
        for line in text.splitlines():
            found = re.search(r"warm worker: (\d+) calls; requests: (.*)", line)
            if found:
                totals["calls"] += int(found.group(1))
                for pair in found.group(2).split(", "):
                    name, _, count = pair.partition("=")
                    if count:
                        totals[name] += int(count)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5,
                        help="interleaved repeats of the round and emcee-like measures")
    parser.add_argument("--workdir-in", default=None,
                        help="folder the workdirs are made in (default: the temporary folder)")
    args = parser.parse_args()

    results: Dict[str, Dict[str, float]] = {}
    ratios: Dict[str, List[float]] = {"round": [], "emcee": []}
    with concurrent.futures.ProcessPoolExecutor(2) as ppe, \
            tempfile.TemporaryDirectory(dir=args.workdir_in) as folder:
        env = LocalEnvironment(Path(folder) / "work", max_vcpus=2)
        ex = BatchExecutor(env, keepalive=60, max_workers=2, echo_output=False)
        rounds_ms(ppe.map, 3)  # the workers started, numpy imported
        started = time.perf_counter()
        list(ex.map(numpy_call, range(ROUND)))
        first = time.perf_counter() - started
        rounds_ms(ex.map, 3)
        measured: Dict[str, Dict[str, List[float]]] = {
            "ppe": {"round": [], "emcee": []}, "warm": {"round": [], "emcee": []}}
        per_repeat = max(1, args.rounds // args.repeats)
        for _ in range(args.repeats):  # interleaved: PPE, warm, PPE, warm
            for name, map_fn in (("ppe", ppe.map), ("warm", ex.map)):
                measured[name]["round"].append(statistics.median(rounds_ms(map_fn,
                                                                           per_repeat)))
            for name, map_fn in (("ppe", ppe.map), ("warm", ex.map)):
                measured[name]["emcee"].append(emcee_like(map_fn))
            for key in ratios:
                ratios[key].append(measured["warm"][key][-1] / measured["ppe"][key][-1])
        for name, label in (("ppe", "ProcessPoolExecutor(2)"),
                            ("warm", "BatchExecutor(keepalive=60)")):
            results[label] = {key: statistics.median(values)
                              for key, values in measured[name].items()}
        results["ProcessPoolExecutor(2)"]["throughput"] = throughput(ppe.map, args.calls)
        results["BatchExecutor(keepalive=60)"]["throughput"] = throughput(ex.map, args.calls)
        pool = next(iter(ex._session.warm_pools.values()))
        workers = list(pool.workers)
        client_sqs = dict(pool.sqs_requests)
        batch = dict(pool.requests)
        ex.shutdown()
        calls = ROUND * (1 + 3 + per_repeat * args.repeats + MAPS * args.repeats) + args.calls
        worker = worker_requests(env, workers)
        env.emulator.close()

    warmpool.INJECTED_LATENCY.update({"sqs": 0.010, "storage": 0.030})
    with tempfile.TemporaryDirectory(dir=args.workdir_in) as folder:
        env = LocalEnvironment(Path(folder) / "work", max_vcpus=2)
        with BatchExecutor(env, keepalive=60, max_workers=2, echo_output=False) as ex:
            rounds_ms(ex.map, 3)
            latency_round = statistics.median(rounds_ms(ex.map, max(5, args.rounds // 3)))
        env.emulator.close()
    warmpool.INJECTED_LATENCY.clear()

    ppe, warm = results["ProcessPoolExecutor(2)"], results["BatchExecutor(keepalive=60)"]
    print(f"warm workers vs ProcessPoolExecutor(2), 2 workers each ({args.repeats} interleaved "
          f"repeats of {per_repeat} rounds and of the emcee-like loop, {args.calls:,} trivial "
          f"calls)")
    print(f"  {'measure':<44} {'PPE(2)':>12} {'warm':>12} {'ratio':>8} target")
    rows = [
        ("median round, map of 8 numpy calls (ms)", "round", "<= 15 ms"),
        (f"emcee-like, {MAPS} maps of 8 calls (s)", "emcee", "within 10x"),
        ("trivial calls per second, chunksize 1", "throughput", ">= 500/s"),
    ]
    for label, key, target in rows:
        ratio = statistics.median(ratios[key]) if key in ratios else \
            warm[key] / ppe[key] if ppe[key] else float("nan")
        print(f"  {label:<44} {ppe[key]:>12.3f} {warm[key]:>12.3f} {ratio:>8.2f} {target}")
    print(f"  {'median round with AWS latencies (ms)':<44} {'':>12} {latency_round:>12.3f} "
          f"{'':>8} <= 150 ms")
    print(f"  first map (workers started, numpy imported): {first:.2f} s")
    print("  emcee-like ratios by repeat: " + " ".join(f"{r:.1f}x" for r in ratios["emcee"]))
    print(f"requests over {calls:,} calls on {len(workers)} workers "
          f"(the workers logged {worker.get('calls', 0):,} calls):")
    client_total = sum(client_sqs.values())
    worker_sqs = sum(v for k, v in worker.items() if k.startswith("sqs:"))
    worker_storage = sum(v for k, v in worker.items() if k.startswith("storage:"))
    batch_total = sum(batch.values())
    print(f"  SQS, client  {client_total:>8,}  {client_total / calls:.3f}/call  {client_sqs}")
    print(f"  SQS, workers {worker_sqs:>8,}  {worker_sqs / calls:.3f}/call  "
          f"{ {k: v for k, v in worker.items() if k.startswith('sqs:')} }")
    print(f"  storage, workers {worker_storage:>4,}  {worker_storage / calls:.3f}/call  "
          f"{ {k: v for k, v in worker.items() if k.startswith('storage:')} } "
          f"(client: the function and the config, once)")
    print(f"  Batch, client {batch_total:>7,}  {batch_total / calls:.4f}/call  {batch} "
          f"(SubmitJob per worker, DescribeJobs per {1.0:g} s of the pool's life; "
          f"target 0 per call)")


if __name__ == "__main__":
    main()
