"""The order of a call's prints and logging records, read back on the client (pure).

A ProcessPoolExecutor's worker writes to its parent's terminal as it goes: a print, a record, a
print to stderr, a warning interleave in time. Our worker keeps each call's stdout, stderr and
records apart (calls.Capture) and, with them, their order: runs of ``[source, count]`` in the
order they happened, a new run only when the source changes (``count``: characters for STDOUT
and STDERR, records for RECORDS). The runs describe the END of what was kept of each source:
what was kept before them (characters and records cut from the runs' front, the note on records
cut) comes first, grouped as without an order.

``steps`` turns (stdout, stderr, records, runs) into the writes and replays that reproduce that
order. The runs come from the wire: anything malformed (not a list, too long, a wrong source or
count, runs that claim more than was kept) falls back to the grouping: stdout, then stderr, then
the records. It never raises, and its work is bounded by MAX_RUNS.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

__all__ = ["STDOUT", "STDERR", "RECORDS", "MAX_RUNS", "grouped", "steps"]

STDOUT, STDERR, RECORDS = 0, 1, 2
# runs kept per call (the worker keeps the last ones): each costs ~8 bytes in the result object
# and a write on the client; 2048 covers a call that alternates a print with each of the 1,000
# records kept (logrecords.MAX_RECORDS); a call that switches more often has its earlier part
# grouped
MAX_RUNS = 2048

Step = Tuple[int, Any]  # (STDOUT or STDERR, text) or (RECORDS, list of record dicts)


def grouped(out: Any, err: Any, records: Any) -> List[Step]:
    """stdout, then stderr, then the records (each only when there is some)."""
    parts: List[Step] = []
    if isinstance(out, str) and out:
        parts.append((STDOUT, out))
    if isinstance(err, str) and err:
        parts.append((STDERR, err))
    if isinstance(records, list) and records:
        parts.append((RECORDS, records))
    return parts


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _valid_runs(order: Any, kept: Sequence[int]) -> Optional[List[Tuple[int, int]]]:
    """The runs, when well formed and within what was kept; None otherwise."""
    if not isinstance(order, list) or not order or len(order) > MAX_RUNS:
        return None
    runs: List[Tuple[int, int]] = []
    totals = [0, 0, 0]
    for run in order:
        if not isinstance(run, (list, tuple)) or len(run) != 2:
            return None
        source, count = run
        if not isinstance(source, int) or isinstance(source, bool) \
                or source not in (STDOUT, STDERR, RECORDS) or not _count(count):
            return None
        totals[source] += count
        if totals[source] > kept[source]:
            return None
        runs.append((source, count))
    return runs


def steps(out: Any, err: Any, records: Any, order: Any) -> List[Step]:
    """The writes and replays, in the order the call made them (see the module docstring)."""
    sources: Tuple[Any, Any, Any] = (out if isinstance(out, str) else "",
                                     err if isinstance(err, str) else "",
                                     records if isinstance(records, list) else [])
    kept = [len(source) for source in sources]
    runs = _valid_runs(order, kept)
    if runs is None:
        return grouped(*sources)
    done = [kept[source] - sum(count for s, count in runs if s == source)
            for source in (STDOUT, STDERR, RECORDS)]
    parts: List[Step] = [(source, sources[source][:done[source]])
                         for source in (STDOUT, STDERR, RECORDS) if done[source]]
    for source, count in runs:
        piece = sources[source][done[source]:done[source] + count]
        done[source] += count
        if parts and parts[-1][0] == source:  # (a malformed order may repeat a source)
            parts[-1] = (source, parts[-1][1] + piece)
        else:
            parts.append((source, piece))
    return parts
