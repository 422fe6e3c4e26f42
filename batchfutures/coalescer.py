"""Coalescing: `submit` calls sent close together, with equal settings, become one array job.

    submit(fn, *args) ──> Coalescer.add(key, ...) ──> buffer[key]: calls + their pickles
                          (key: the settings and the jobs the calls depend on)
                                                               │ closed by
                              50 ms with no new call, 0.5 s after its first call (due()),
                              10,000 calls (add returns True), result()/log() of one of its
                              futures (holding()), shutdown or interpreter exit (all())
                                                               v
                                                  take(key) -> Batch, or None

A buffer holds its calls' pickles (one per function and batch) and is dropped when taken, so
nothing keeps a callable or its arguments alive once its calls were sent; a later batch pickles
a function again and so sees its globals as they are then, as ProcessPoolExecutor does.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from .settings import JobSettings

QUIET = 0.05  # a buffer is due once no call was added for this long...
MAX_AGE = 0.5  # ...or once its oldest call waited this long
Call = Tuple[Any, Callable, tuple, dict]  # (future, fn, args, kwargs)
# calls share a batch when their settings and the jobs they depend on (dependsOn) are equal
Key = Tuple[JobSettings, Tuple[str, ...]]


@dataclass
class Batch:
    """Calls with the same settings, to be sent together as one array job."""

    calls: List[Call] = field(default_factory=list)
    pickles: Dict[int, Tuple[Callable, bytes]] = field(default_factory=dict)  # id(fn) -> fn, pickle
    first_at: float = 0.0
    last_at: float = 0.0

    def due_at(self) -> float:
        return min(self.last_at + QUIET, self.first_at + MAX_AGE)


class Coalescer:
    """The coalescing buffers of one session, keyed by settings and dependencies (thread-safe)."""

    def __init__(self, max_calls: int) -> None:
        self._max_calls = max_calls
        self._lock = threading.Lock()
        self._batches: Dict[Key, Batch] = {}

    def known_pickle(self, key: Key, fn: Callable) -> Optional[bytes]:
        """The pickle of ``fn`` made for the open batch of ``key``, if any."""
        with self._lock:
            batch = self._batches.get(key)
            known = batch.pickles.get(id(fn)) if batch is not None else None
        return known[1] if known is not None and known[0] is fn else None

    def add(self, key: Key, call: Call, pickled: bytes) -> bool:
        """Buffer a call; True when its batch is full and must be taken now."""
        now = time.monotonic()
        with self._lock:
            batch = self._batches.get(key)
            if batch is None:
                batch = self._batches[key] = Batch(first_at=now)
            batch.pickles.setdefault(id(call[1]), (call[1], pickled))
            batch.calls.append(call)
            batch.last_at = now
            return len(batch.calls) >= self._max_calls

    def take(self, key: Key) -> Optional[Batch]:
        with self._lock:
            return self._batches.pop(key, None)

    def due(self) -> List[Key]:
        now = time.monotonic()
        with self._lock:
            return [key for key, batch in self._batches.items() if now >= batch.due_at()]

    def all(self) -> List[Key]:
        with self._lock:
            return list(self._batches)

    def holding(self, future: Any) -> Optional[Key]:
        """The key whose open batch holds ``future`` (its caller is waiting for it)."""
        with self._lock:
            return next((key for key, batch in self._batches.items()
                         if any(call[0] is future for call in batch.calls)), None)

    def next_delay(self) -> float:
        """Seconds until the next batch is due (inf when none is open)."""
        with self._lock:
            if not self._batches:
                return math.inf
            return min(batch.due_at() for batch in self._batches.values()) - time.monotonic()

    def futures(self) -> List[Any]:
        with self._lock:
            return [call[0] for batch in self._batches.values() for call in batch.calls]

    def pending(self) -> bool:
        with self._lock:
            return any(batch.calls for batch in self._batches.values())

    def clear(self) -> List[Any]:
        """Drop every open batch; their futures (for the caller to cancel)."""
        with self._lock:
            futures = [call[0] for batch in self._batches.values() for call in batch.calls]
            self._batches.clear()
        return futures
