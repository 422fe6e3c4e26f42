"""Coalescing: `submit` calls sent close together, with equal settings, become one array job.

    submit(fn, *args) ──> Coalescer.add(key, ...) ──> buffer[key]: calls + their pickles
                          (key: the settings and the jobs the calls depend on)
                                                               │ closed by
                              50 ms with no new call, 0.5 s after its first call (due()),
                              10,000 calls (add returns True), result()/log() of one of its
                              futures (holding()), shutdown or interpreter exit (all())
                                                               v
                                                  take(key) -> CallBuffer, or None

A buffer holds its calls' pickles (one per function and buffer) and is dropped when taken, so
nothing keeps a callable or its arguments alive once its calls were sent; a later buffer pickles
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
# calls share a buffer when their settings and the jobs they depend on (dependsOn) are equal
Key = Tuple[JobSettings, Tuple[str, ...]]


@dataclass
class CallBuffer:
    """Calls with the same settings and dependencies, buffered to be sent together as one
    array job (a buffer of calls, not an AWS Batch object)."""

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
        self._buffers: Dict[Key, CallBuffer] = {}

    def known_pickle(self, key: Key, fn: Callable) -> Optional[bytes]:
        """The pickle of ``fn`` made for the open buffer of ``key``, if any."""
        with self._lock:
            buffer = self._buffers.get(key)
            known = buffer.pickles.get(id(fn)) if buffer is not None else None
        return known[1] if known is not None and known[0] is fn else None

    def add(self, key: Key, call: Call, pickled: bytes) -> bool:
        """Buffer a call; True when its buffer is full and must be taken now."""
        now = time.monotonic()
        with self._lock:
            buffer = self._buffers.get(key)
            if buffer is None:
                buffer = self._buffers[key] = CallBuffer(first_at=now)
            buffer.pickles.setdefault(id(call[1]), (call[1], pickled))
            buffer.calls.append(call)
            buffer.last_at = now
            return len(buffer.calls) >= self._max_calls

    def take(self, key: Key) -> Optional[CallBuffer]:
        with self._lock:
            return self._buffers.pop(key, None)

    def due(self) -> List[Key]:
        now = time.monotonic()
        with self._lock:
            return [key for key, buffer in self._buffers.items() if now >= buffer.due_at()]

    def all(self) -> List[Key]:
        with self._lock:
            return list(self._buffers)

    def holding(self, future: Any) -> Optional[Key]:
        """The key whose open buffer holds ``future`` (its caller is waiting for it)."""
        with self._lock:
            return next((key for key, buffer in self._buffers.items()
                         if any(call[0] is future for call in buffer.calls)), None)

    def next_delay(self) -> float:
        """Seconds until the next buffer is due (inf when none is open)."""
        with self._lock:
            if not self._buffers:
                return math.inf
            return min(buffer.due_at() for buffer in self._buffers.values()) - time.monotonic()

    def futures(self) -> List[Any]:
        with self._lock:
            return [call[0] for buffer in self._buffers.values() for call in buffer.calls]

    def pending(self) -> bool:
        with self._lock:
            return any(buffer.calls for buffer in self._buffers.values())

    def clear(self) -> List[Any]:
        """Drop every open buffer; their futures (for the caller to cancel)."""
        with self._lock:
            futures = [call[0] for buffer in self._buffers.values() for call in buffer.calls]
            self._buffers.clear()
        return futures
