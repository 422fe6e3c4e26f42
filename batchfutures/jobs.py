"""`TrackedJob`: what the client knows of one submitted Batch job and the futures it carries.

A Batch job has one child (a plain job) or 2..10,000 children (an array job); each child runs a
chunk of consecutive items, one future per item. The poller updates a TrackedJob from
DescribeJobs, ListJobs and the result objects in storage, and settles its futures.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from .futures import BatchFuture

TERMINAL = ("SUCCEEDED", "FAILED")
ACTIVE = ("STARTING", "RUNNING")
STATUS_ORDER = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")


def settle(future: BatchFuture, ok: bool, value: Any) -> bool:
    """Set a future's outcome unless it is already done (cancelled, aborted, or resolved)."""
    if future.done():
        return False
    try:
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
    except concurrent.futures.InvalidStateError:  # cancelled between the check and the set
        return False
    return True


class TrackedJob:
    """One Batch job (plain or array) and the futures of its children's items."""

    def __init__(self, job_id: str, job_url: str, children: Sequence[List[BatchFuture]], *,
                 array: bool, memory_mib: Optional[int] = None,
                 submitted_at: Optional[float] = None,
                 item_counts: Optional[Sequence[int]] = None) -> None:
        self.job_id = job_id
        self.job_url = job_url
        self.children = list(children)
        # None: one future per item. Otherwise one future per child (map's iterator), resolved
        # with a callable that decodes the child's (ok, value) outcomes, so a large map holds no
        # per-item futures (see settle_child).
        self.item_counts = list(item_counts) if item_counts is not None else None
        self.array = array
        self.memory_mib = memory_mib
        self.submitted_at = time.monotonic() if submitted_at is None else submitted_at
        self.status: Optional[str] = "SUBMITTED"
        self.summary: Dict[str, int] = {}
        self.unresolved = set(range(len(self.children)))
        self.started: set = set()  # children seen in STARTING/RUNNING
        self.failed_seen: set = set()
        self.succeeded = 0  # children settled from their result objects
        self.lock = threading.Lock()
        for index, futures in enumerate(self.children):
            for future in futures:
                future._bind(self, index)

    @property
    def size(self) -> int:
        return len(self.children)

    @property
    def done(self) -> bool:
        return not self.unresolved

    def child_id(self, index: Optional[int]) -> str:
        if self.array and index is not None:
            return f"{self.job_id}:{index}"
        return self.job_id

    def child_index(self, child_job_id: str) -> Optional[int]:
        if not self.array:
            return 0
        _, _, tail = child_job_id.rpartition(":")
        return int(tail) if tail.isdigit() else None

    def futures(self) -> List[BatchFuture]:
        return [future for futures in self.children for future in futures]

    def set_status(self, index: int, status: Optional[str], reason: Optional[str] = None,
                   exit_code: Optional[int] = None) -> None:
        """Record a child's status on its futures, and mark them running once it started."""
        for future in self.children[index]:
            future._update(status, reason, exit_code)
        if status in ACTIVE or status in TERMINAL:
            self.started.add(index)
            if status in ACTIVE:
                for future in self.children[index]:
                    if not future.running() and not future.done():
                        future.set_running_or_notify_cancel()

    def items_in(self, index: int) -> int:
        if self.item_counts is not None:
            return self.item_counts[index]
        return len(self.children[index])

    def settle_child(self, index: int, data: bytes, decode: Callable[[bytes, int], List[tuple]]) -> None:
        """Settle a child's futures from its result object.

        With one future per item, each gets its ``(ok, value_or_exception)`` from ``decode`` now.
        With one future per child (map's iterator), the future gets a callable that decodes the
        child's outcomes when the iterator reaches it: until then it holds only the compact
        result bytes, not a decoded object per item, and the decoding runs on the consumer's
        thread, not the poller's.
        """
        count = self.items_in(index)
        if self.item_counts is not None:
            settle(self.children[index][0], True, functools.partial(decode, data, count))
        else:
            for future, (ok, value) in zip(self.children[index], decode(data, count)):
                settle(future, ok, value)
        self.unresolved.discard(index)

    def fail_child(self, index: int, error_for_each: Any) -> None:
        """Fail every future of a child; ``error_for_each()`` builds one exception per future."""
        for future in self.children[index]:
            settle(future, False, error_for_each())
        self.unresolved.discard(index)

    def drop_settled(self) -> None:
        """Children whose every future is already done (cancelled, aborted) need no polling."""
        for index in list(self.unresolved):
            if all(future.done() for future in self.children[index]):
                self.unresolved.discard(index)

    def default_child_status(self) -> Optional[str]:
        """The status to show for children not listed individually, from the parent's summary."""
        if self.status in ("SUBMITTED", None):
            return "SUBMITTED"
        summary = self.summary
        for status in ("RUNNABLE", "PENDING", "SUBMITTED"):
            if summary.get(status):
                return status
        return "RUNNABLE" if self.status == "PENDING" else self.status
