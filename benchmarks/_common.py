"""Shared helpers for the benchmarks: repeated timing and a plain-text table."""

from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Optional


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def table(title: str, rows: Dict[str, Optional[float]], baseline: str) -> str:
    """Seconds per system, with the ratio to ``baseline`` (skipped systems say so)."""
    base = rows.get(baseline)
    lines = [title, f"  {'system':<34} {'median s':>10} {'x ' + baseline:>28}"]
    for name, seconds in rows.items():
        if seconds is None:
            lines.append(f"  {name:<34} {'skipped':>10}")
            continue
        ratio = f"{seconds / base:.2f}" if base else "-"
        lines.append(f"  {name:<34} {seconds:>10.3f} {ratio:>28}")
    return "\n".join(lines)


def trivial(x: int) -> int:
    return x + 1


def chunks(n: int, chunksize: int) -> list:
    """Peers without a chunksize get the same layout: one call per chunk of items."""
    return [list(range(i, min(n, i + chunksize))) for i in range(0, n, chunksize)]


def run_chunk(fn, items: list) -> list:
    return [fn(x) for x in items]


def half_second_of_cpu(x: int) -> int:
    """About 0.5 s of pure-Python CPU work on this machine."""
    total = 0
    for i in range(6_000_000):
        total += i ^ x
    return total


def quarter_second_of_cpu(x: int) -> int:
    """About 0.25 s of pure-Python CPU work on this machine."""
    total = 0
    for i in range(3_000_000):
        total += i ^ x
    return total


def note(lines: List[str], text: str) -> None:
    print(text, flush=True)
    lines.append(text)
