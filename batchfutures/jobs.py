"""`TrackedJob`: what the client knows of one submitted Batch job and the futures it carries.

A Batch job has one child (a plain job) or 2..10,000 children (an array job); each child runs a
chunk of consecutive items, one future per item (or one per child for map's iterator).

    poller thread:  TrackedJob.view(now) ──> reconcile (pure) ──> Actions ──> TrackedJob.apply
    user threads:   read futures; never change a TrackedJob (cancel/abort are queued to the
                    poller, see poller.Poller.request_cancel / request_abort)

Each child's `ChildState` changes only on the poller thread, and only in `apply` (after every
read a decision depended on succeeded), `drop_settled`, or for a child WAITING on a retried
upstream (reruns.py) in `ready_reruns` and `rerun_sent`.
"""

from __future__ import annotations

import concurrent.futures
import enum
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import (
    AbstractSet,
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from . import reruns, signing, wire
from .errors import BatchError, IntegrityError, RemoteError, add_note
from .futures import BatchFuture
from .statuses import JobStatus
from .usage import ItemUsage, Usage

logger = logging.getLogger("batchfutures")


# a result object as read: its bytes, None (no object), or the IntegrityError its seal raised
StoredResult = Union[bytes, bytearray, None, IntegrityError]

# a settled child's futures (none kept): one list for every such child, never appended to
_NO_FUTURES: List[BatchFuture] = []


class ChildState(enum.Enum):
    """What the poller knows of one child; changed on the poller thread only."""

    QUEUED = "queued"      # not seen starting yet (SUBMITTED, PENDING, RUNNABLE)
    STARTED = "started"    # seen STARTING or RUNNING: its futures are running
    WAITING = "waiting"    # failed for a dependency being retried: runs again after it (reruns)
    SETTLED = "settled"    # every future of it is done (result, failure, cancel, abort)


_Shown = TypeVar("_Shown", str, int)


class ChildStatuses:
    """Each child's Batch status, status reason and exit code, as last shown: one entry per child,
    read by its futures (futures.BatchFuture.status), not three attributes on each of them (a
    chunk of items shares one child). None: not known for this child (its futures then show the
    job's default status). The reason and exit code lists are made when the first one is shown."""

    __slots__ = ("_statuses", "_reasons", "_exit_codes")

    def __init__(self, size: int) -> None:
        self._statuses: List[Optional[str]] = [None] * size
        self._reasons: Optional[List[Optional[str]]] = None
        self._exit_codes: Optional[List[Optional[int]]] = None

    def status(self, child: int) -> Optional[str]:
        return self._statuses[child] if 0 <= child < len(self._statuses) else None

    def reason(self, child: int) -> Optional[str]:
        known = self._reasons
        return known[child] if known is not None and 0 <= child < len(known) else None

    def exit_code(self, child: int) -> Optional[int]:
        known = self._exit_codes
        return known[child] if known is not None and 0 <= child < len(known) else None

    def show(self, child: int, status: Optional[str], reason: Optional[str] = None,
             exit_code: Optional[int] = None) -> None:
        """What Batch says of the child now; a None keeps what was shown before."""
        if not 0 <= child < len(self._statuses):
            return
        if status is not None:
            self._statuses[child] = status
        if reason is not None:
            self.set_reason(child, reason)
        if exit_code is not None:
            self.set_exit_code(child, exit_code)

    def set_reason(self, child: int, reason: Optional[str]) -> None:
        self._reasons = self._with(self._reasons, child, reason)

    def set_exit_code(self, child: int, exit_code: Optional[int]) -> None:
        self._exit_codes = self._with(self._exit_codes, child, exit_code)

    def _with(self, known: Optional[List[Optional[_Shown]]], child: int,
              value: Optional[_Shown]) -> Optional[List[Optional[_Shown]]]:
        """``known`` with ``value`` for ``child``: the list is made when the first value comes."""
        if known is None:
            if value is None:
                return None
            known = [None] * len(self._statuses)
        if 0 <= child < len(known):
            known[child] = value
        return known

    def forget_ending(self, child: int) -> None:
        """A child sent again (an OOM retry): the killed try's reason and exit code are not
        the retry's."""
        self.set_reason(child, None)
        self.set_exit_code(child, None)

    def wait_again(self, child: int) -> None:
        """The child waits to run again (a rerun after a dependency's retry): PENDING, as Batch
        shows a job waiting for its dependencies, without the failed try's reason or exit code."""
        self.show(child, JobStatus.PENDING.value)
        self.set_reason(child, None)
        self.set_exit_code(child, None)


def _same(error: BaseException) -> BaseException:
    """The one error every future of a child gets (an error_for_each that always gives it)."""
    return error


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


def decode_result(data: Union[bytes, bytearray, IntegrityError], count: int) -> List[Tuple[bool, Any]]:
    """A child's result object as ``count`` ``(ok, value_or_exception)`` pairs.

    Nothing raised while loading one item escapes, BaseException included: a value whose
    unpickling raises SystemExit becomes that item's exception, and the other items load.
    """
    if isinstance(data, BaseException):  # storage refused the object (IntegrityError)
        return [(False, data)] * count
    try:
        meta, outcomes = wire.unpack_result(data)
    except BaseException as error:  # truncated or foreign: every item of the child fails
        failure = RemoteError(f"the result object could not be read: {error}")
        return [(False, failure)] * count
    refused = meta.get(signing.REFUSED)  # JSON, not a pickle: nothing of it is unpickled
    if refused:
        return [(False, IntegrityError(f"the worker refused its job: {refused}"))
                for _ in range(count)]
    decoded: List[Tuple[bool, Any]] = []
    for outcome in outcomes[:count]:
        try:
            decoded.append(wire.outcome_result(outcome))
        except BaseException as error:  # outcome_result catches Exception; this is the rest
            decoded.append((False, error))
    if len(decoded) < count:  # a truncated result never passes for a complete one
        decoded += [(False, BatchError("the worker recorded no outcome for this item"))] * (
            count - len(decoded))
    return decoded


# -- what reconcile decides, applied by TrackedJob.apply ------------------------------------
@dataclass(frozen=True)
class Shown:
    """What to show on a child's futures (`status`, `status_reason`, `exit_code`)."""

    status: Optional[JobStatus]
    reason: Optional[str] = None
    exit_code: Optional[int] = None


@dataclass
class Actions:
    """One reconcile step's decisions for one job; empty means nothing to do."""

    shown: Dict[int, Shown] = field(default_factory=dict)
    default_shown: Optional[JobStatus] = None   # for open children not in ``shown``
    started: FrozenSet[int] = frozenset()        # children to mark running
    # settle from these (an IntegrityError: the object's seal did not check, its items fail)
    results: Dict[int, Union[bytes, bytearray, IntegrityError]] = field(default_factory=dict)
    # a multi-node job's child: every node's result object (None: that node wrote none)
    node_results: Dict[int, Tuple[StoredResult, ...]] = field(default_factory=dict)
    failed: Dict[int, Mapping[str, Any]] = field(default_factory=dict)  # FAILED descriptions
    no_result: Tuple[int, ...] = ()              # Batch says SUCCEEDED, storage holds nothing
    expired: Tuple[int, ...] = ()                # Batch forgot the job, storage holds nothing
    unplaceable: Dict[int, str] = field(default_factory=dict)  # child -> Batch's reason
    requested: str = ""                          # what the unplaceable job asked for
    read: Tuple[int, ...] = ()                   # results to read in the background (results.py)
    read_done: Tuple[int, ...] = ()              # background reads that came back without one
    reread: Tuple[int, ...] = ()                 # ...of these because storage failed: read again
    missing: Tuple[int, ...] = ()                # ...of these because there was no object yet
    cancel: Tuple[Tuple[str, str], ...] = ()     # (job id, reason) CancelJob calls to send
    terminate: Tuple[Tuple[str, str], ...] = ()  # (job id, reason) TerminateJob calls to send
    # the committed facts the next step starts from
    status: Optional[JobStatus] = None
    summary: Optional[Mapping[str, int]] = None
    stuck_since: Optional[float] = None
    stuck_reason: Optional[str] = None
    checked_at: Optional[float] = None  # last periodic check (RUNNABLE children, failed nodes)
    changed: bool = False

    @property
    def settles(self) -> int:
        return (len(self.results) + len(self.node_results) + len(self.failed)
                + len(self.no_result) + len(self.expired) + len(self.unplaceable))


@dataclass(frozen=True)
class JobFacts:
    """A TrackedJob's committed facts, read-only, for one reconcile step."""

    job_id: str
    array: bool
    size: int
    open: FrozenSet[int]            # children with a future still waiting
    started: FrozenSet[int]         # open children seen STARTING/RUNNING
    status: Optional[JobStatus]
    summary: Mapping[str, int]
    submitted_at: float
    now: float
    grace: float = 60.0
    runnable_timeout: Optional[float] = None
    check_interval: float = 30.0
    stuck_since: Optional[float] = None
    stuck_reason: Optional[str] = None
    checked_at: Optional[float] = None
    nodes: int = 1                  # > 1: a multi-node parallel job (one child, N results)
    memory_raised: bool = False     # a retry_on_oom retry: its memory is more than was asked
    reading: FrozenSet[int] = frozenset()  # open children whose result is being read
    reread: FrozenSet[int] = frozenset()   # open children whose result read failed: again
    missing: FrozenSet[int] = frozenset()  # open children whose result was not there when read

    def child_id(self, index: int) -> str:
        return f"{self.job_id}:{index}" if self.array else self.job_id

    def child_index(self, child_job_id: str) -> Optional[int]:
        if not self.array:
            return 0
        _, _, tail = child_job_id.rpartition(":")
        return int(tail) if tail.isdigit() else None


class TrackedJob:
    """One Batch job (plain or array) and the futures of its children's items."""

    def __init__(self, job_id: str, job_url: str, children: Sequence[List[BatchFuture]], *,
                 array: bool, memory_mib: Optional[int] = None,
                 submitted_at: Optional[float] = None,
                 item_counts: Optional[Sequence[int]] = None,
                 runnable_timeout: Optional[float] = None,
                 follow: Optional[Iterable[int]] = None, nodes: int = 1) -> None:
        """``follow``: the children to resolve (default all; attach of one child gives one).
        ``nodes > 1``: a multi-node parallel job, one child whose future gets every node's value."""
        self.job_id = job_id
        self.job_url = job_url
        self.children = list(children)
        # None: one future per item. Otherwise one future per child (map's iterator), resolved
        # with a callable that decodes the child's (ok, value) outcomes, so a large map holds no
        # per-item futures (see _settle_child).
        self.item_counts = list(item_counts) if item_counts is not None else None
        self.array = array
        self.memory_mib = memory_mib
        self.runnable_timeout = runnable_timeout
        self.nodes = nodes
        self.submitted_at = time.monotonic() if submitted_at is None else submitted_at
        self.status: Optional[JobStatus] = JobStatus.SUBMITTED
        self.default_status = JobStatus.SUBMITTED.value  # of children not known one by one
        self.summary: Mapping[str, int] = {}
        self.stuck_since: Optional[float] = None
        self.stuck_reason: Optional[str] = None
        self.checked_at: Optional[float] = None
        followed = set(range(len(self.children))) if follow is None else set(follow)
        self.states = [ChildState.QUEUED if i in followed else ChildState.SETTLED
                       for i in range(len(self.children))]
        self._open = {i for i in range(len(self.children)) if i in followed}
        self._started: set = set()
        self._reading: set = set()  # results requested from the ResultReader, not yet arrived
        self._reread: set = set()   # reads that failed: asked for again by the next step
        self._missing: set = set()  # read and not there: only a listing names them again
        # retry_on_oom > 0: an oomretry.OomRetry that may resubmit children killed for memory
        self.retry: Optional[Any] = None
        # a job with dependsOn: Submitter.rerun(job, children), for children Batch failed for a
        # dependency that is being retried (reruns.py); they wait in _waiting until then
        self.rerun: Optional[Callable[["TrackedJob", List[int]], Any]] = None
        self._waiting: set = set()
        # BatchExecutor(echo_output=True): what each call printed is written to this process's
        # sys.stdout/sys.stderr as its future resolves (_settle_child)
        self.echo_output = False
        # echo_output="live": livetail.LiveTail.echo_at_end(child id), False when the child's
        # output and records were streamed while it ran (nothing echoed again); None: not live
        self.echo_at_end: Optional[Callable[[str], bool]] = None
        # future.attempts and future.cost (set by Submitter.submit_now): a
        # callattempts.AttemptsReader, and a costs.CallPricing of its calls
        self.attempts_reader: Optional[Callable[[int], List[Any]]] = None
        self.pricing: Optional[Any] = None
        # what its futures show and used, once per child (futures.BatchFuture reads them)
        self.statuses = ChildStatuses(len(self.children))
        self.usage = ItemUsage(len(futures) for futures in self.children)
        for index, futures in enumerate(self.children):
            for future in futures:
                future._bind(self, index)

    # -- identity ----------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.children)

    @property
    def done(self) -> bool:
        return not self._open and not self._waiting

    @property
    def waiting(self) -> bool:
        """Some child waits for a retried upstream before it runs again."""
        return bool(self._waiting)

    @property
    def open_children(self) -> AbstractSet[int]:
        """The children still to be settled, live (read it on the poller thread only)."""
        return self._open

    def _echo(self, printed: Sequence[Any], index: int) -> None:
        """Echo what child ``index``'s call printed and logged as it resolves, unless it was
        streamed live (echo_output="live": its prints and records were shown as read)."""
        if self.echo_at_end is None or self.echo_at_end(self.child_id(index)):
            wire.echo_output(printed)

    @property
    def unresolved(self) -> FrozenSet[int]:
        """The children still to be settled (a snapshot; change them through apply)."""
        return frozenset(self._open)

    def child_id(self, index: Optional[int]) -> str:
        if self.array and index is not None:
            return f"{self.job_id}:{index}"
        return self.job_id

    def child_index(self, child_job_id: str) -> Optional[int]:
        if not self.array:
            return 0
        _, _, tail = child_job_id.rpartition(":")
        return int(tail) if tail.isdigit() else None

    def item_usage(self, child: int, position: int) -> Optional[Usage]:
        """What the item at ``position`` of ``child`` used (future.usage); None if not measured."""
        return self.usage.at(child, position)

    def attempts_of(self, child: int) -> List[Any]:
        """``child``'s ended Batch attempts (future.attempts): DescribeJobs when asked."""
        return self.attempts_reader(child) if self.attempts_reader is not None else []

    def item_cost(self, child: int, position: int) -> Optional[float]:
        """USD of the item at ``position`` of ``child`` (future.cost), of all its items for
        map's one future per child; None if not measured."""
        if self.pricing is None:
            return None
        if self.item_counts is None:
            return self.pricing.cost(self.usage.at(child, position))
        costs = [self.pricing.cost(self.usage.at(child, i)) for i in range(self.items_in(child))]
        measured = [cost for cost in costs if cost is not None]
        return sum(measured) if measured else None

    def log_text(self, position: int) -> Optional[str]:
        """None: a Batch job's output is its log (CloudWatch Logs, the emulator's files)."""
        return None

    def futures(self) -> List[BatchFuture]:
        return [future for futures in self.children for future in futures]

    def items_in(self, index: int) -> int:
        if self.item_counts is not None:
            return self.item_counts[index]
        return len(self.children[index])

    # -- the poller thread's side ------------------------------------------------------------
    def view(self, now: float, *, grace: float = 60.0,
             check_interval: float = 30.0) -> JobFacts:
        return JobFacts(
            job_id=self.job_id, array=self.array, size=self.size, open=frozenset(self._open),
            started=frozenset(self._started & self._open), status=self.status,
            summary=dict(self.summary), submitted_at=self.submitted_at, now=now, grace=grace,
            runnable_timeout=self.runnable_timeout,
            check_interval=check_interval, stuck_since=self.stuck_since,
            stuck_reason=self.stuck_reason, checked_at=self.checked_at,
            nodes=self.nodes, memory_raised=self.retry is not None and self.retry.raised,
            reading=frozenset(self._reading), reread=frozenset(self._reread),
            missing=frozenset(self._missing))

    def drop_settled(self, indices: Iterable[int]) -> None:
        """These children (named by a cancel or abort request) need no polling once every future
        of theirs is done. Only those are looked at: a scan of every child's futures each poll
        cost O(items) per round, a million done() calls at scale."""
        for index in indices:
            if index in self._open and all(f.done() for f in self.children[index]):
                self._settled(index)

    def apply(self, actions: Actions, *, failure_for: Callable[[int, Mapping[str, Any]], BaseException],
              no_result_error: Callable[[int], BaseException],
              expired_error: Callable[[int], BaseException],
              unplaceable_error: Callable[[int, str], BaseException]) -> List[int]:
        """Commit one reconcile step: show statuses, settle futures, keep the new facts.

        Returns the children whose results the caller is to read now (in the background).

        Each settlement is guarded on its own: whatever one child's decoding or error building
        raises (BaseException included) fails that child's futures, and the rest go on.
        """
        if actions.default_shown is not None:  # a hint from the counts: it starts nothing
            self.default_status = actions.default_shown.value  # futures read it (status)
        for index, shown in actions.shown.items():
            if index in self._open:
                self._show(index, shown)
        for index in actions.started:
            if index in self._open:
                self._start(index)
        self._retry_failed(actions.failed, failure_for)  # those it decides are settled below
        self._wait_for_retried_upstream(actions.failed, failure_for)  # and these wait
        for index, data in actions.results.items():
            self._guarded(index, functools.partial(self._settle_child, index, data))
        for index, node_data in actions.node_results.items():
            self._guarded(index, functools.partial(self._settle_nodes, index, node_data))
        for index, description in actions.failed.items():
            self._guarded(index, functools.partial(self._fail_child, index,
                                                   functools.partial(failure_for, index, description)))
        for index in actions.no_result:
            self._guarded(index, functools.partial(self._fail_child, index,
                                                   functools.partial(no_result_error, index)))
        for index in actions.expired:
            self._guarded(index, functools.partial(self._fail_child, index,
                                                   functools.partial(expired_error, index)))
        for index, reason in actions.unplaceable.items():
            self._guarded(index, functools.partial(
                self._fail_child, index, functools.partial(unplaceable_error, index, reason)))
        self._reading.difference_update(actions.read_done)
        self._reread.update(i for i in actions.reread if i in self._open)
        self._missing.update(i for i in actions.missing if i in self._open)
        wanted = [i for i in actions.read if i in self._open]
        self._reading.update(wanted)
        self._reread.difference_update(wanted)
        self._missing.difference_update(wanted)
        if actions.status is not None:
            self.status = actions.status
        if actions.summary is not None:
            self.summary = dict(actions.summary)
        if actions.stuck_reason and self.stuck_reason is None:  # once, when it starts
            then = ("it is cancelled after runnable_timeout=%gs" % self.runnable_timeout
                    if self.runnable_timeout is not None else
                    "it may never start: set runnable_timeout= to give up after a while")
            logger.warning("batchfutures: Batch job %s waits RUNNABLE: %s; %s", self.job_id,
                           actions.stuck_reason, then)
        self.stuck_since, self.stuck_reason = actions.stuck_since, actions.stuck_reason
        if actions.checked_at is not None:
            self.checked_at = actions.checked_at
        return wanted

    def read_lost(self, indices: Iterable[int]) -> None:
        """Results read but not settled (settling them failed): read them again."""
        lost = self._reading.intersection(indices)
        self._reading -= lost
        self._reread |= lost

    def fail_all(self, error_for_each: Callable[[], BaseException]) -> None:
        """Fail every open child (the poller is going away and nothing else will settle them)."""
        self._open.update(self._waiting)
        self._waiting.clear()
        for index in list(self._open):
            self._guarded(index, functools.partial(self._fail_child, index, error_for_each))

    def _wait_for_retried_upstream(self, failed: Mapping[int, Mapping[str, Any]],
                                   failure_for: Callable[[int, Mapping[str, Any]], BaseException]
                                   ) -> None:
        """Children Batch failed for a dependency whose upstream was resubmitted: they wait."""
        if self.rerun is None:
            return
        for index, description in failed.items():
            if index not in self._open:
                continue
            try:
                wanted = reruns.wants_rerun(failure_for(index, description), self.children[index])
            except BaseException:  # noqa: B036 - then it fails as usual
                continue
            if wanted:
                self._open.discard(index)
                self._waiting.add(index)
                self.states[index] = ChildState.WAITING
                self.statuses.wait_again(index)

    def ready_reruns(self) -> List[int]:
        """On the poller thread: the waiting children whose upstreams are all done, to run again.

        Items whose upstream failed after all fail here (DependencyFailedError with that cause);
        a child with nothing left to run is settled. The caller reruns the returned children
        (Submitter.rerun) and then calls ``rerun_sent``.
        """
        ready: List[int] = []
        for index in sorted(self._waiting):
            waiting = [f for f in self.children[index] if not f.done()]
            step = reruns.plan([getattr(f, "_upstream", None) or () for f in waiting])
            if step.wait:
                continue
            for position, upstream in step.failed.items():
                settle(waiting[position], False,
                       reruns.dependency_error(upstream, self.child_id(index)))
            if step.rerun:
                ready.append(index)
            else:
                self._waiting.discard(index)
                self._settled(index)
        return ready

    def rerun_sent(self, indices: Iterable[int], error: Optional[BaseException] = None) -> None:
        """The children were submitted again (their futures now belong to the new job), or
        could not be (``error``: their futures fail with it)."""
        for index in indices:
            if index not in self._waiting:
                continue
            self._waiting.discard(index)
            if error is not None:
                for future in self.children[index]:
                    settle(future, False, error)
            self._settled(index)

    def _retry_failed(self, failed: Mapping[int, Mapping[str, Any]],
                      failure_for: Callable[[int, Mapping[str, Any]], BaseException]) -> None:
        """Let ``self.retry`` (retry_on_oom) decide failed children first: one it resubmitted
        leaves this job with its futures open, one it gave up on fails with its error; both are
        then settled here, so apply's usual failure path passes them by."""
        if self.retry is None or not failed:
            return
        errors: Dict[int, BaseException] = {}
        for index, description in failed.items():
            if index in self._open:
                try:
                    errors[index] = failure_for(index, description)
                except BaseException:  # noqa: B036 - the usual path fails it
                    continue
        try:
            decided = dict(self.retry.decide(self, errors))
        except BaseException as error:  # noqa: B036 - then they fail as usual
            logger.warning("batchfutures: could not retry children of %s: %r", self.job_id, error)
            return
        for index, final in decided.items():
            if index not in self._open:
                continue
            if final is None:  # resubmitted: the new job (its futures are bound to it) settles them
                self._settled(index)
            else:
                self._guarded(index, functools.partial(self._fail_child, index,
                                                       functools.partial(_same, final)))

    # -- internals -----------------------------------------------------------------------------
    def _show(self, index: int, shown: Shown) -> None:
        status = shown.status.value if shown.status is not None else None
        self.statuses.show(index, status, shown.reason, shown.exit_code)  # its futures read it
        if shown.status is not None and (shown.status.active or shown.status.finished):
            self._start(index)

    def _start(self, index: int) -> None:
        self._started.add(index)
        if self.states[index] is ChildState.QUEUED:
            self.states[index] = ChildState.STARTED
        for future in self.children[index]:
            if not future.running() and not future.done():
                future.set_running_or_notify_cancel()

    def _settled(self, index: int) -> None:
        self.states[index] = ChildState.SETTLED
        self._open.discard(index)
        self._reading.discard(index)
        self._reread.discard(index)
        self._missing.discard(index)
        # nothing polls this child again: let its futures (and their results) go with the
        # caller, not with a job that may run for hours more
        self.children[index] = _NO_FUTURES

    def _guarded(self, index: int, settle_it: Callable[[], None]) -> None:
        if index not in self._open:
            return
        try:
            settle_it()
        except BaseException as error:  # the poller survives anything one child does
            logger.warning("batchfutures: could not settle %s: %r", self.child_id(index), error)
            for future in self.children[index]:
                settle(future, False, error)
        self._settled(index)

    def _settle_child(self, index: int, data: Union[bytes, bytearray, IntegrityError]) -> None:
        """Settle a child's futures from its result object.

        With one future per item, each gets its ``(ok, value_or_exception)`` now. With one
        future per child (map's iterator), the future gets a callable that decodes the child's
        outcomes when the iterator reaches it: until then it holds only the compact result
        bytes, and the decoding runs on the consumer's thread, not the poller's.
        """
        # the worker writes its result last and exits 0: Batch's SUCCEEDED may not be seen yet
        self._show(index, Shown(JobStatus.SUCCEEDED, exit_code=0))
        count = self.items_in(index)
        # echo_output: each call's output is written just before its future resolves (here,
        # on the poller thread, for map's per-child futures too: as a ProcessPoolExecutor's
        # workers print whether or not their results are read); only the output section is read
        printed = wire.result_output(data) if self.echo_output else {}
        if self.item_counts is not None:
            if printed and not self.children[index][0].done():
                for position in sorted(printed):
                    self._echo(printed[position], index)
            if not self.children[index][0].done():  # its items' usage: the child's cost
                for position, entry in enumerate(wire.result_usage(data) or ()):
                    self.usage.record(index, position, entry)
            settle(self.children[index][0], True, functools.partial(decode_result, data, count))
        else:
            # future.usage: each item's entry from the meta, recorded before its
            # future resolves (a done callback sees it), not for a future already done (its
            # outcome is not this result's); None for objects whose meta has no usage
            entries = wire.result_usage(data) or ()
            for position, (future, (ok, value)) in enumerate(
                    zip(self.children[index], decode_result(data, count))):
                if position in printed and not future.done():
                    self._echo(printed[position], index)
                if position < len(entries) and not future.done():
                    self.usage.record(index, position, entries[position])
                settle(future, ok, value)

    def _settle_nodes(self, index: int, node_data: Sequence[StoredResult]) -> None:
        self._show(index, Shown(JobStatus.SUCCEEDED))
        if self.echo_output and not all(f.done() for f in self.children[index]):
            for data in node_data:  # what the call printed on each node, in node order
                for _, printed in sorted(wire.result_output(data).items()):
                    self._echo(printed, index)
        ok, value = combine_node_results(node_data, self.job_id)
        used = node_usage(node_data)
        for position, future in enumerate(self.children[index]):
            if used is not None and not future.done():
                self.usage.record(index, position, used)
            settle(future, ok, value)

    def _fail_child(self, index: int, error_for_each: Callable[[], BaseException]) -> None:
        for future in self.children[index]:
            settle(future, False, error_for_each())


def combine_node_results(node_data: Sequence[StoredResult], job_id: str) -> Tuple[bool, Any]:
    """A multi-node call's outcome: the list of each node's value in node order, or the
    exception of the first node (by index) whose call raised or that wrote no result."""
    values = []
    for index, data in enumerate(node_data):
        if data is None:
            return False, RemoteError(
                f"node {index} of Batch job {job_id} wrote no result: it ended before its worker "
                f"finished (or the main node stopped waiting for it, BATCHFUTURES_NODE_WAIT)")
        (ok, value), = decode_result(data, 1)
        if not ok:
            if isinstance(value, BaseException):
                add_note(value, f"raised on node {index} of the {len(node_data)} nodes of Batch "
                                f"job {job_id}")
            return False, value
        values.append(value)
    return True, values


def node_usage(node_data: Sequence[StoredResult]) -> Optional[List[Any]]:
    """A multi-node call's usage: the longest node's wall time, every node's CPU, the largest
    node's peak; None when no node's was measured."""
    entries = []
    for data in node_data:
        used = wire.result_usage(data) if isinstance(data, (bytes, bytearray)) else None
        if used and isinstance(used[0], list) and len(used[0]) == 3:
            entries.append(used[0])
    if not entries:
        return None
    peaks = [entry[2] for entry in entries if isinstance(entry[2], (int, float))]
    return [max(float(entry[0]) for entry in entries), sum(float(entry[1]) for entry in entries),
            max(peaks) if peaks else None]


def default_child_status(status: Optional[JobStatus], summary: Mapping[str, int]) -> JobStatus:
    """The status to show for children not listed one by one, from the parent's summary."""
    if status in (JobStatus.SUBMITTED, None):
        return JobStatus.SUBMITTED
    for candidate in (JobStatus.RUNNABLE, JobStatus.PENDING, JobStatus.SUBMITTED):
        if summary.get(candidate.value):
            return candidate
    return JobStatus.RUNNABLE if status is JobStatus.PENDING else status
