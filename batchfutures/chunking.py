"""``chunksize="auto"``: how many items each child of a map gets.

    N = the processes a child runs its items on = floor(vcpus), at least 1 (pool.py)

    map(fn, items, chunksize="auto")
      fn timed before by this executor (an earlier "auto" map's sample)?  chunk from that timing
      otherwise: child 0 alone is a sample job of N items (one per process), sent at once;
                 the rest of the map waits until the sample finished (the iterator needs its
                 results first anyway), then chunk from the sample's run time
    map_futures(fn, items, chunksize="auto")
      fn timed before?  chunk from that timing; otherwise N items per child (it returns every
      future at once: there is no sample to wait for)

    chunk = round(TARGET_CHILD_SECONDS x max(sample items, N) / sample seconds),
            within [N, MAX_AUTO_CHUNKSIZE]

The sample's seconds are its run time inside the container (the worker's result metadata,
"started" to "finished"), so queueing and the container's start do not count. A child of c
items on N processes takes about c x (sample seconds / sample items) when the sample had at
least N items, so c = TARGET x items / seconds gives each child about a minute of work. A sample
that failed as a whole (out of memory, a crash) gives no timing: N items per child.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import math
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from . import wire

if TYPE_CHECKING:
    from .session import Session

__all__ = ["AUTO", "TARGET_CHILD_SECONDS", "MAX_AUTO_CHUNKSIZE", "processes_per_child",
           "chunksize_from_timing", "sample_seconds", "AutoChunksize"]

AUTO = "auto"
TARGET_CHILD_SECONDS = 60.0
MAX_AUTO_CHUNKSIZE = 100_000  # a child's items are one blob in memory: keep it bounded

_timings_lock = threading.Lock()
# per executor session: function pickle digest -> (items, seconds) of its last sample
_timings: "weakref.WeakKeyDictionary[Any, Dict[str, Tuple[int, float]]]" = weakref.WeakKeyDictionary()


def processes_per_child(vcpus: float) -> int:
    """The processes a child of ``vcpus`` vCPUs runs its items on (pool.py rounds down too)."""
    return max(1, int(vcpus))


def chunksize_from_timing(processes: int, items: int, seconds: float) -> int:
    """Items per child so that each runs about TARGET_CHILD_SECONDS, at least ``processes``."""
    if items <= 0 or not math.isfinite(seconds) or seconds < 0:
        return processes
    if seconds == 0:
        return max(processes, MAX_AUTO_CHUNKSIZE)
    # fewer items than processes ran side by side: the sample took one item's time
    chunk = round(TARGET_CHILD_SECONDS * max(items, processes) / seconds)
    return max(processes, min(MAX_AUTO_CHUNKSIZE, chunk))


def sample_seconds(resolved: Any) -> Optional[float]:
    """The run time in its container of a map child whose future resolved to ``resolved``.

    A map child's future (``per_child``) resolves to ``functools.partial(decode, result bytes,
    count)`` (jobs.TrackedJob.settle_child); the result's metadata has "started"/"finished".
    """
    if not isinstance(resolved, functools.partial) or not resolved.args:
        return None
    data = resolved.args[0]
    if not isinstance(data, (bytes, bytearray)):
        return None
    try:
        meta, _ = wire.unpack_result(bytes(data))
        return float(meta["finished"]) - float(meta["started"])
    except (ValueError, KeyError, TypeError):
        return None


class AutoChunksize:
    """One map's "auto" layout: ``layout()`` before each Batch job, ``submitted()`` after it."""

    def __init__(self, session: Session, vcpus: float, function_pickle: bytes, *, sample: bool,
                 deadline: Optional[float] = None) -> None:
        self.processes = processes_per_child(vcpus)
        self._session = session
        self._key = hashlib.sha256(function_pickle).hexdigest()
        self._deadline = deadline
        self._sample_future: Optional[concurrent.futures.Future] = None
        self._sample_items = 0
        known = self._known()
        self.chunksize: Optional[int] = known
        self.sampling = known is None and sample  # a sample job goes first
        if known is None and not sample:
            self.chunksize = self.processes

    def _known(self) -> Optional[int]:
        with _timings_lock:
            timing = _timings.get(self._session, {}).get(self._key)
        return None if timing is None else chunksize_from_timing(self.processes, *timing)

    def layout(self) -> Tuple[int, Optional[int]]:
        """(items per child, at most how many children) for the next Batch job of the map.

        After the sample went, this waits for it (within the map's ``timeout``, whose
        concurrent.futures.TimeoutError propagates).
        """
        if self.chunksize is not None:
            return self.chunksize, None
        if self._sample_future is None:
            return self.processes, 1  # the sample: one child, one item per process
        remaining = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
        try:
            resolved = self._sample_future.result(remaining)
        except concurrent.futures.TimeoutError:
            raise
        except Exception:  # the sample's child failed: the iterator raises it when it gets there
            resolved = None
        seconds = sample_seconds(resolved)
        if seconds is None:
            self.chunksize = self.processes
        else:
            with _timings_lock:
                _timings.setdefault(self._session, {})[self._key] = (self._sample_items, seconds)
            self.chunksize = chunksize_from_timing(self.processes, self._sample_items, seconds)
        return self.chunksize, None

    def submitted(self, first_future: concurrent.futures.Future, items: int) -> None:
        """A Batch job of the map was sent (its first future, its items): the sample's?"""
        if self.sampling and self._sample_future is None:
            self._sample_future, self._sample_items = first_future, items
