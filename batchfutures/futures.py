"""`BatchFuture`: a real `concurrent.futures.Future` that knows its Batch job.

One future per call, also inside array jobs: a future is bound to one item of one child of one
Batch job. Its state moves only through the standard `Future` methods, driven by the poller:

    PENDING --(child reaches STARTING/RUNNING: set_running_or_notify_cancel)--> RUNNING
    PENDING | RUNNING --(result object read, or job FAILED)--> FINISHED
    PENDING --(cancel(), before the child starts)--> CANCELLED  (the remote child is cancelled too)

`result()` and `exception()` first flush the executor's coalescing buffer, so a caller waiting on
a call that has not been sent yet does not wait out the coalescing window.

What all the items of a child share (its status, status reason and exit code; the items' usage)
the job keeps once per child: a future holds its job, its child and its position there, and reads
the rest through them. A million futures then pay for no copy of what their child knows.

This module imports nothing of the package: what a future needs of its executor (`FutureCore`)
and of its job (`BoundJob`) are protocols here, so futures <-> jobs is no import cycle.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, List, NamedTuple, Optional, Protocol, Sequence, Tuple

__all__ = ["BatchFuture", "FutureCore", "BoundJob", "Binding", "ShownStatuses"]

# One lock for every future's (job, child) pair: a rebind (an OOM retry moves a call to a new job)
# is rare, and a lock per future would cost ~100 bytes each, times a million futures.
_BIND_LOCK = threading.Lock()


class FutureCore(Protocol):
    """What a future asks of the executor core that made it (the Session)."""

    def flush_for(self, future: "BatchFuture") -> None: ...
    def read_log(self, future: "BatchFuture") -> str: ...
    def abort(self, future: "BatchFuture", reason: str) -> bool: ...
    def on_cancelled(self, future: "BatchFuture") -> None: ...


class ShownStatuses(Protocol):
    """Each child's Batch status, status reason and exit code, as last shown (jobs.ChildStatuses):
    kept once per child, not on each of its futures."""

    def status(self, child: int) -> Optional[str]: ...
    def reason(self, child: int) -> Optional[str]: ...
    def exit_code(self, child: int) -> Optional[int]: ...
    def show(self, child: int, status: Optional[str], reason: Optional[str] = None,
             exit_code: Optional[int] = None) -> None: ...
    def set_reason(self, child: int, reason: Optional[str]) -> None: ...
    def set_exit_code(self, child: int, exit_code: Optional[int]) -> None: ...


class BoundJob(Protocol):
    """What a future asks of the Batch job it belongs to (a jobs.TrackedJob)."""

    def child_id(self, index: Optional[int]) -> str: ...

    @property
    def default_status(self) -> str:
        """The status of its children not known one by one (from Batch's counts)."""
        ...

    @property
    def statuses(self) -> ShownStatuses: ...

    def item_usage(self, child: int, position: int) -> Optional[Any]:
        """A usage.Usage of the item at ``position`` in ``child``, None when not measured."""
        ...

    def log_text(self, position: int) -> Optional[str]:
        """The call's output as its runner kept it (a warm call's); None: read the job's log."""
        ...


class Binding(NamedTuple):
    """Where a future is: its job and the child of that job (read together, under the lock)."""

    job: BoundJob
    child: int


class _Rare:
    """What only some futures have: a cache key and its verdict (cache=True), the futures given
    as arguments (kept while the call waits), what is shown on a future no job holds (one
    resolved from the cache). One slot on every future, this only on those."""

    __slots__ = ("cache_key", "cached", "upstream", "upstream_at", "shown")

    def __init__(self) -> None:
        self.cache_key: Optional[Any] = None
        self.cached = False
        # (status, status reason, exit code) of a future without a job
        self.shown: Tuple[Optional[str], Optional[str], Optional[int]] = (None, None, None)
        self.upstream: Optional[List["BatchFuture"]] = None
        self.upstream_at: Optional[List[Tuple[str, Optional[int]]]] = None


class BatchFuture(concurrent.futures.Future):
    """The future of one call run by AWS Batch (or the local emulator)."""

    def __init__(self, core: Optional[FutureCore] = None) -> None:
        super().__init__()
        # Each attribute costs every future 8 bytes (more past 8 of them), a million futures
        # 8 MB: what a future shares with the other items of its child (status, status reason,
        # exit code, usage) its job keeps once per child, read through (_job, _child).
        # Every attribute set later is made here: an instance whose dict gains a key after the
        # first ones no longer shares its keys with the others (~700 bytes more per future).
        # What few calls have (cache=True, futures as arguments) shares one slot (_Rare).
        self._core = core
        # its binding, set once submitted and moved by a rebind: read and written only through
        # _bound() and _bind(), under _BIND_LOCK
        self._job: Optional[BoundJob] = None
        self._child: Optional[int] = None
        self._item: Optional[int] = None  # its position in its child's items
        self._rare: Optional[_Rare] = None

    # -- what Batch says about the call ---------------------------------------------------
    @property
    def job_id(self) -> Optional[str]:
        """The Batch job id; ``"<array job id>:<index>"`` for an array child; None before submission."""
        bound = self._bound()
        return None if bound is None else bound.job.child_id(bound.child)

    @property
    def status(self) -> Optional[str]:
        """The Batch status of this call's job (child), or None before submission.

        Known for this child (it started, ended, or was listed), else its job's status for the
        children not known one by one: held once per job, not written into every future at
        every poll."""
        bound = self._bound()
        if bound is None:
            return self._unbound_shown()[0]
        known = bound.job.statuses.status(bound.child)
        return known if known is not None else bound.job.default_status

    @property
    def status_reason(self) -> Optional[str]:
        bound = self._bound()
        return bound.job.statuses.reason(bound.child) if bound else self._unbound_shown()[1]

    @property
    def exit_code(self) -> Optional[int]:
        bound = self._bound()
        return bound.job.statuses.exit_code(bound.child) if bound else self._unbound_shown()[2]

    @property
    def cached(self) -> bool:
        """True when the result came from the cache (``cache=True``) instead of a run of its
        own: a call that succeeded before, or an identical call in flight it followed."""
        return self._rare is not None and self._rare.cached

    @property
    def usage(self) -> Optional[Any]:
        """What the call used in its container (a ``usage.Usage``: ``wall_s``, ``cpu_s``,
        ``peak_memory_mib``), measured by the worker; None until the call ended, and for a call
        that left no outcome (its container was killed: out of memory, timeout, terminated),
        did not run (cancelled, its function did not load), came from the cache, or whose
        result object was written before usage was recorded."""
        if not self.done():
            return None
        bound = self._bound()
        if bound is None:
            return None
        return bound.job.item_usage(bound.child, self._item or 0)

    @property
    def cost(self) -> Optional[float]:
        """The call's estimated cost in USD (costs.py: its share of what ran it over its
        measured run time, at the prices read from AWS or else the shipped table; the emulator
        priced as the equivalent Fargate task); None whenever ``usage`` is None."""
        if not self.done():
            return None
        bound = self._bound()
        if bound is None:
            return None
        # a TrackedJob prices its calls; a job without pricing (a warm call) has no cost here
        item_cost = getattr(bound.job, "item_cost", None)
        return item_cost(bound.child, self._item or 0) if item_cost is not None else None

    @property
    def attempts(self) -> List[Any]:
        """The call's ended Batch attempts, oldest first (callattempts.Attempt: ``started``,
        ``stopped``, ``exit_code``, ``reason``, ``job_id``), read from DescribeJobs when asked
        (one request; none once the call ended and was read); [] before submission. Those of the
        job it runs in now: a call resubmitted as a new job (retry_on_oom) starts a new list."""
        bound = self._bound()
        attempts_of = getattr(bound.job, "attempts_of", None) if bound is not None else None
        return [] if bound is None or attempts_of is None else list(attempts_of(bound.child))

    @property
    def reclaims(self) -> int:
        """How many of its attempts lost their host (a Spot reclaim, a lost EC2 instance)."""
        return sum(1 for attempt in self.attempts if attempt.reclaimed)

    def log(self) -> str:
        """The job's console output: CloudWatch Logs on AWS, the attempt's log file locally."""
        core = self._require_core()
        core.flush_for(self)
        return core.read_log(self)

    def abort(self, reason: str = "aborted by the user") -> bool:
        """Terminate the remote job even while it runs; the future then raises JobAbortedError.

        Returns False when the future had already finished.
        """
        return self._require_core().abort(self, reason)

    # -- concurrent.futures.Future ----------------------------------------------------------
    def result(self, timeout: Optional[float] = None) -> Any:
        if self._core is not None and not self.done():
            self._core.flush_for(self)
        return super().result(timeout)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        if self._core is not None and not self.done():
            self._core.flush_for(self)
        return super().exception(timeout)

    def cancel(self) -> bool:
        """Cancel the call if it has not started; its remote child is then cancelled too."""
        cancelled = super().cancel()
        if cancelled and self._core is not None:
            self._core.on_cancelled(self)
        return cancelled

    # -- the binding: the core (jobs, poller, session, warm pools) reads and moves it only here
    def _bind(self, job: BoundJob, child: int) -> None:
        """Bind to ``child`` of ``job`` (submitted, or moved by an OOM retry or a rerun)."""
        with _BIND_LOCK:
            self._job = job
            self._child = child

    def _bound(self) -> Optional[Binding]:
        """Its job and child, read together (a rebind moves both); None before submission."""
        with _BIND_LOCK:
            job, child = self._job, self._child
        return None if job is None else Binding(job, child or 0)

    def _update(self, status: Optional[str], reason: Optional[str] = None,
                exit_code: Optional[int] = None) -> None:
        """Show these on its child (so on every future of the child), or on this future when no
        job holds it (resolved from the cache); None keeps what was."""
        bound = self._bound()
        if bound is not None:
            bound.job.statuses.show(bound.child, status, reason, exit_code)
            return
        rare = self._rare_fields()
        was = rare.shown
        rare.shown = (status if status is not None else was[0],
                      reason if reason is not None else was[1],
                      exit_code if exit_code is not None else was[2])

    def _unbound_shown(self) -> Tuple[Optional[str], Optional[str], Optional[int]]:
        return self._rare.shown if self._rare is not None else (None, None, None)

    # The executor core (session, submission, jobs, cache) records what it learns about the
    # call through these, never by writing the attributes above itself.
    def _set_item(self, position: int) -> None:
        self._item = position

    def _rare_fields(self) -> "_Rare":
        if self._rare is None:
            self._rare = _Rare()
        return self._rare

    def _set_upstream(self, futures: Sequence["BatchFuture"],
                      where: Sequence[Tuple[str, Optional[int]]]) -> None:
        rare = self._rare_fields()
        rare.upstream, rare.upstream_at = list(futures), list(where)

    def _forget_upstream(self) -> None:
        """Done: no finished future keeps other calls' results alive."""
        if self._rare is not None:
            self._rare.upstream = self._rare.upstream_at = None

    def _set_cache_key(self, key: Any) -> None:
        self._rare_fields().cache_key = key

    def _mark_cached(self, cached: bool = True) -> None:
        """The outcome comes from the cache (or from an identical call in flight), not a run."""
        self._rare_fields().cached = cached

    @property
    def _cache_key(self) -> Optional[Any]:
        """cache=True: (function digest, the call digest of each item it covers)."""
        return self._rare.cache_key if self._rare is not None else None

    @property
    def _upstream(self) -> Optional[List["BatchFuture"]]:
        """The futures given to this call as arguments, while it waits."""
        return self._rare.upstream if self._rare is not None else None

    @property
    def _upstream_at(self) -> Optional[List[Tuple[str, Optional[int]]]]:
        """Where each of them was when the call was sent (its job URL and child)."""
        return self._rare.upstream_at if self._rare is not None else None

    def _require_core(self) -> FutureCore:
        if self._core is None:
            raise RuntimeError("this future does not belong to a BatchExecutor")
        return self._core

    def __repr__(self) -> str:
        base = super().__repr__()
        return f"{base[:-1]} job_id={self.job_id!r} batch_status={self.status!r}>"
