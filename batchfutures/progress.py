"""Progress you can see: Batch's own counts per status, one bar per map, no extra requests.

    poller thread ──DescribeJobs (sent anyway)──> TrackedJob.summary   (an array's statusSummary)
                                                  BatchFuture.status   (each child's last status)
                                                        │ read only: never a Batch or S3 request
                                                        v
    _counts_of(futures) ──> {"RUNNABLE": 3, "RUNNING": 2, "SUCCEEDED": 95, ...}  (children)
                                                        │
                                                        v
    _Display.refresh() ──> tqdm bar (a terminal, tqdm installed): n/total children, counts as postfix
                       ──> one plain line rewritten with "\\r" (a terminal, no tqdm)
                       ──> plain lines on change, at most every LINE_INTERVAL s (not a terminal,
                           progress asked for explicitly); nothing at all with "auto"

Who draws, and when it stops:
- ``progress(futures)`` draws from the caller's thread: it waits on the first unfinished future
  for at most REFRESH_INTERVAL, redraws, and returns the futures once all are done (a blocking
  call, like ``concurrent.futures.wait``; no thread is started).
- ``ex.map(..., progress=True)`` cannot draw from the consumer's thread, which runs the user's
  code between items, so one daemon thread per map ("batchfutures-progress") redraws every
  REFRESH_INTERVAL. It adds each slice's futures as map submits them, drops a slice once all its
  futures are done (keeping only its final counts, so finished results are not held alive), and
  ends when every slice is submitted and done, when map's iterator ends or is closed (its
  ``finally`` calls ``close()``, which joins the thread), or when the iterator is garbage
  collected (a weak reference; the thread holds no strong one).

Units are Batch children (an array job's statusSummary counts children, not items); a warm
pool's calls (keepalive=) count one per call (a map's child) from the pool's own state
(warm_counts); calls still held by the client (the coalescing buffer, ``max_workers``
pacing) are counted one per future as "unsent". Drawing never raises into the user's code: a
failing stream or bar is logged at debug level and the display goes silent.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import logging
import shutil
import sys
import threading
import time
import types
import weakref
from typing import IO, Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, TypeVar, Union

from . import costs, waiting
from .futures import BatchFuture
from .statuses import FINISHED, STATUS_ORDER, JobStatus

__all__ = ["progress", "render_counts", "render_line"]

logger = logging.getLogger("batchfutures")

REFRESH_INTERVAL = 0.25  # seconds between redraws (at most 4 a second)
LINE_INTERVAL = 5.0  # not a terminal: at most one line this often (and only when counts changed)
JOIN_TIMEOUT = 2.0  # close() waits this long for the drawing thread
UNSENT = "unsent"  # calls the client has not sent to Batch yet (not a Batch status)
AUTO = "auto"

Show = Union[bool, str]  # True: always (plain lines when not a terminal); "auto": terminal only
T = TypeVar("T")
F = TypeVar("F", bound=concurrent.futures.Future)  # BatchFutures, or any Future


# -- the one accessor of the poller's data (jobs.py/poller.py may change: adapt here only) ------
def _counts_of(futures: Iterable[Any]) -> Dict[str, int]:
    """Children per Batch status among ``futures`` (`_tally`'s counts)."""
    return _tally(futures)[0]


def _tally(futures: Iterable[Any]) -> Tuple[Dict[str, int], str]:
    """Children per Batch status among ``futures``, from what the poller already recorded, and
    why they wait (`why_of`; "" when no job of theirs has a reason read).

    A job whose every child is among the futures is counted from its ``statusSummary`` (Batch's
    own counts) until every child is settled; a plain job, an array before its first
    DescribeJobs, a settled job, or only some children of a coalesced array are counted child by
    child from ``future.status``. Calls not yet sent count
    as UNSENT, one per future; futures cancelled before they were sent are not counted.
    """
    counts: Dict[str, int] = collections.Counter()
    jobs: Dict[int, Tuple[Any, Dict[Any, Any]]] = {}  # id(job) -> (job, {child index: future})
    warm: Dict[int, Tuple[Any, Dict[int, Any]]] = {}  # id(pool) -> (pool, {id(call): call})
    job: Any = None
    children: Dict[Any, Any] = {}
    for future in futures:
        bound = future._bound() if isinstance(future, BatchFuture) else None
        if bound is None:  # unsent, or a plain Future (another executor's): counted as unsent
            if not future.done():
                counts[UNSENT] += 1
            continue
        owner: Any = bound.job  # a TrackedJob, or a warm call
        if getattr(owner, "pool", None) is not None and not hasattr(owner, "summary"):
            # a warm call (warmpool.WarmCall): counted from its pool's own state
            warm.setdefault(id(owner.pool), (owner.pool, {}))[1][id(owner)] = owner
            continue
        if owner is not job:  # a job's futures mostly come one after another
            job = owner
            children = jobs.setdefault(id(job), (job, {}))[1]
        # map_futures gives one future per item: a child of several items is counted once
        children.setdefault(bound.child, future)
    why = why_of(job.job_id for job, _children in jobs.values()
                 if not getattr(job, "done", False) and getattr(job, "job_id", None))
    for job, children in jobs.values():
        summary = job.summary
        # Batch's counts may lag what the poller settled from results (a child's result is read
        # before Batch says it succeeded): a job with nothing left open is counted from its futures
        if summary and len(children) == job.size and not getattr(job, "done", False):
            for status in STATUS_ORDER:
                counts[status] += summary.get(status, 0)
        else:
            for future in children.values():
                counts[future.status or JobStatus.SUBMITTED] += 1
    for pool, calls in warm.values():
        counts.update(warm_counts([call.default_status for call in calls.values()
                                   if not all(f.cancelled() for f in call.futures)],
                                  list(pool.workers.values())))
    return {status: count for status, count in counts.items() if count}, why


def why_of(job_ids: Iterable[str]) -> str:
    """``"waiting: 12th in queue, 64/64 vCPUs in use"``: the reason its poller last read for the
    job nearest the front of its queue among ``job_ids`` (no request: waiting.reason_of)."""
    found = [reason for reason in map(waiting.reason_of, job_ids) if reason is not None and reason.short]
    if not found:
        return ""
    nearest = min(found, key=lambda reason: reason.position if reason.position is not None
                  else waiting.SNAPSHOT_LIMIT + 1)
    return f"waiting: {nearest.short}"


def cost_of(futures: Iterable[Any]) -> float:
    """The estimated USD of the calls among ``futures`` that ended (future.cost: their measured
    usage, already in memory, priced; no request), each call once."""
    seen: Dict[Tuple[int, Any, Any], float] = {}
    for future in futures:
        bound = future._bound() if isinstance(future, BatchFuture) and future.done() else None
        if bound is None:
            continue
        # map's future of a coalesced child prices all its items: one per child, not per item
        whole_child = getattr(bound.job, "item_counts", None) is not None
        key = (id(bound.job), bound.child, None if whole_child else future._item)
        if key not in seen:
            seen[key] = future.cost or 0.0
    return sum(seen.values())


def _safe_cost(futures: Iterable[Any]) -> float:
    try:
        return cost_of(futures)
    except Exception:  # never into the user's code: no cost shown rather than a failed wait
        logger.debug("batchfutures: could not add up the futures' costs", exc_info=True)
        return 0.0


def with_cost(why: str, usd: float) -> str:
    """What follows the counts: why jobs wait, then the cost so far (``"~$0.0123"``)."""
    return " | ".join(part for part in (why, costs.usd_text(usd)) if part)


def warm_counts(call_statuses: Iterable[str], worker_statuses: Iterable[str]) -> Dict[str, int]:
    """A warm pool's calls by status, from what the pool knows (no request): a call not yet sent
    (SUBMITTED, in the pool's deque) is UNSENT; a sent one (RUNNABLE, on the work queue) is
    RUNNING while a worker RUNNING can hold it (one call per worker: the oldest calls are sent
    first, so these are the ones taken), else RUNNABLE (queued); SUCCEEDED and FAILED as they are.
    """
    counts: Dict[str, int] = collections.Counter()
    sent = 0
    for status in call_statuses:
        if status == JobStatus.SUBMITTED:
            counts[UNSENT] += 1
        elif status == JobStatus.RUNNABLE:
            sent += 1
        else:
            counts[status] += 1
    running = min(sent, sum(status == JobStatus.RUNNING for status in worker_statuses))
    counts[JobStatus.RUNNING.value] += running
    counts[JobStatus.RUNNABLE.value] += sent - running
    return {status: count for status, count in counts.items() if count}


def _safe_counts(futures: Iterable[Any]) -> Dict[str, int]:
    return _safe_tally(futures)[0]


def _safe_tally(futures: Iterable[Any]) -> Tuple[Dict[str, int], str]:
    try:
        return _tally(futures)
    except Exception:  # never into the user's code: show nothing rather than fail their wait
        logger.debug("batchfutures: could not count the futures' statuses", exc_info=True)
        return {}, ""


# -- pure rendering -----------------------------------------------------------------------------
def render_counts(counts: Mapping[str, int]) -> str:
    """``"unsent 2, RUNNABLE 3, RUNNING 2, SUCCEEDED 95"``: non-zero counts in Batch's order."""
    order = (UNSENT,) + tuple(STATUS_ORDER)
    known = [status for status in order if counts.get(status)]
    other = sorted(status for status in counts if status not in order and counts[status])
    return ", ".join(f"{status} {counts[status]}" for status in known + other)


def finished_of(counts: Mapping[str, int]) -> int:
    return sum(counts.get(status, 0) for status in FINISHED)


def render_line(counts: Mapping[str, int], desc: Optional[str] = None, why: str = "") -> str:
    """The plain progress line: ``"square: 95/100 children | RUNNING 2, SUCCEEDED 95, ..."``,
    then why jobs wait when known (``" | waiting: 3rd in queue, 64/64 vCPUs in use"``)."""
    total = sum(counts.values())
    head = f"{finished_of(counts)}/{total} children"
    if desc:
        head = f"{desc}: {head}"
    body = " | ".join(part for part in (render_counts(counts), why) if part)
    return f"{head} | {body}" if body else head


# -- drawing ------------------------------------------------------------------------------------
def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:  # a closed or exotic stream: not a terminal
        return False


def _tqdm_class() -> Optional[type]:
    try:
        # optional: tqdm (the [progress] extra) may be absent; start-up: ~5 ms, only for a bar
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


@functools.lru_cache(maxsize=None)
def _quiet_bar(tqdm: type) -> type:
    """tqdm without its monitor thread (this module redraws on its own schedule)."""
    return type("BatchProgressBar", (tqdm,), {"monitor_interval": 0})


def _check_show(show: Any) -> Show:
    if show is True or show is False or show == AUTO:
        return show
    raise ValueError(f"progress must be True, False or {AUTO!r}, not {show!r}")


class _Display:
    """Draws counts on one stream; every method swallows its own errors (logged at debug)."""

    def __init__(self, stream: IO[str], desc: Optional[str]) -> None:
        self._stream = stream
        self._desc = desc
        self._terminal = _is_terminal(stream)
        self._bar: Any = None
        self._width = 0  # length of the plain line last drawn (to blank its tail)
        self._last_line: Optional[str] = None
        self._last_line_at = 0.0
        self._broken = False
        self._closed = False
        self._bar_class = _tqdm_class() if self._terminal else None

    @staticmethod
    def create(show: Show, desc: Optional[str], stream: Optional[IO[str]]) -> Optional["_Display"]:
        """A display, or None when nothing is to be drawn (off, or "auto" off a terminal)."""
        show = _check_show(show)
        if not show:
            return None
        stream = sys.stderr if stream is None else stream
        if show == AUTO and not _is_terminal(stream):
            return None
        return _Display(stream, desc)

    def _guard(self, action: Callable[[], None]) -> None:
        if self._broken:
            return
        try:
            action()
        except Exception:  # never into the user's code: the display goes silent instead
            self._broken = True
            logger.debug("batchfutures: progress display failed; it stops drawing", exc_info=True)

    def refresh(self, counts: Mapping[str, int], *, final: bool = False, why: str = "") -> None:
        if self._closed or not (counts or final):  # nothing submitted yet: nothing to show
            return
        if self._bar_class is not None:
            self._guard(lambda: self._draw_bar(counts, why))
        elif self._terminal:
            self._guard(lambda: self._draw_line(counts, why))
        else:
            self._guard(lambda: self._write_line(counts, final, why))

    def close(self, counts: Mapping[str, int], why: str = "") -> None:
        """Draw the final counts and leave the cursor on a fresh line."""
        if self._closed:
            return
        self.refresh(counts, final=True, why=why)
        self._closed = True
        if self._bar is not None:
            self._guard(self._bar.close)
        elif self._terminal and self._width:
            self._guard(self._new_line)

    def _new_line(self) -> None:
        self._stream.write("\n")
        self._stream.flush()

    def _draw_bar(self, counts: Mapping[str, int], why: str = "") -> None:
        if self._bar is None:
            self._bar = _quiet_bar(self._bar_class)(
                total=sum(counts.values()), desc=self._desc, unit="child", file=self._stream,
                dynamic_ncols=True, leave=True)
        bar = self._bar
        bar.total = sum(counts.values())
        bar.n = finished_of(counts)
        bar.set_postfix_str("; ".join(part for part in (render_counts(counts), why) if part),
                            refresh=False)
        bar.refresh()

    def _draw_line(self, counts: Mapping[str, int], why: str = "") -> None:
        # longer than the terminal, it would wrap and "\r" would redraw only its last row
        columns = shutil.get_terminal_size().columns
        line = render_line(counts, self._desc, why)[:max(columns - 1, 20)]
        self._stream.write("\r" + line + " " * max(0, self._width - len(line)))
        self._stream.flush()
        self._width = len(line)

    def _write_line(self, counts: Mapping[str, int], final: bool, why: str = "") -> None:
        line = render_line(counts, self._desc, why)
        now = time.monotonic()
        if line == self._last_line or (not final and now - self._last_line_at < LINE_INTERVAL
                                       and self._last_line is not None):
            return
        self._stream.write(line + "\n")
        self._stream.flush()
        self._last_line, self._last_line_at = line, now


class _Pace:
    """The time between redraws: REFRESH_INTERVAL, longer when counting is slow (hundreds of
    thousands of futures), so that counting takes at most about a tenth of a core."""

    def __init__(self) -> None:
        self.interval = REFRESH_INTERVAL

    def timed(self, count: Callable[[], T]) -> T:
        start = time.monotonic()
        value = count()
        self.interval = max(REFRESH_INTERVAL, 10 * (time.monotonic() - start))
        return value


# -- progress(futures): drawn from the caller's thread ------------------------------------------
def progress(futures: Iterable[F], *, file: Optional[IO[str]] = None, desc: Optional[str] = None,
             show: Show = True) -> List[F]:
    """Show Batch's counts for ``futures`` until all are done; return them, in their order.

    ``futures``: BatchFutures, e.g. from ``map_futures``. ``file``: the stream (default
    ``sys.stderr``). ``show=True`` draws a tqdm bar or one plain line on a terminal and plain
    lines (on change, at most every few seconds) elsewhere; ``show="auto"`` draws only on a
    terminal; ``show=False`` only waits. Blocking, like ``concurrent.futures.wait``::

        results = [f.result() for f in batchfutures.progress(ex.map_futures(f, xs))]
    """
    futures = list(futures)
    display = _Display.create(show, desc, file)
    pace = _Pace()
    try:
        position = 0
        while position < len(futures):
            if futures[position].done():
                position += 1
                continue
            concurrent.futures.wait([futures[position]], timeout=pace.interval)
            if display is not None:
                counts, why = pace.timed(lambda: _safe_tally(futures))
                display.refresh(counts, why=with_cost(why, _safe_cost(futures)))
    finally:
        if display is not None:
            display.close(_safe_counts(futures), why=with_cost("", _safe_cost(futures)))
    return futures


# -- map(..., progress=True): drawn from a daemon thread -----------------------------------------
class MapProgress:
    """The display of one map: follows its slices as they are submitted, drawn by a thread."""

    def __init__(self, display: _Display) -> None:
        self._display = display
        self._lock = threading.Lock()
        self._live: List[List[Any]] = []  # slices with futures not done yet
        self._finished: Dict[str, int] = collections.Counter()  # final counts of done slices
        self._finished_usd = 0.0  # their cost
        self.why = ""  # why the live slices' jobs wait (the last counts' tally)
        self._all_submitted = False
        self._stop = threading.Event()
        self._owner: Optional[weakref.ref] = None
        self._thread = threading.Thread(target=self._run, name="batchfutures-progress", daemon=True)
        self._thread.start()

    # used by BatchExecutor.map
    def follow(self, slices: Iterator[List[Any]]) -> Iterator[List[Any]]:
        """``slices``, each one added to the display as map submits it."""
        try:
            for group in slices:
                with self._lock:
                    self._live.append(group)
                yield group
        finally:  # exhausted, failed or closed: no more slices, the thread ends with the last
            self._all_submitted = True

    def watch(self, iterator: T) -> T:
        """Stop drawing once ``iterator`` (map's results) is garbage collected."""
        stop = self._stop
        self._owner = weakref.ref(iterator, lambda _ref: stop.set())
        return iterator

    def close(self) -> None:
        """Stop the thread (it draws the final counts) and wait for it."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT)

    # the thread
    def counts(self) -> Dict[str, int]:
        with self._lock:
            live = list(self._live)
        counts: Dict[str, int] = collections.Counter(self._finished)
        still: List[List[Any]] = []
        reasons: List[str] = []
        live_usd = 0.0
        for group in live:
            group_counts, group_why = _safe_tally(group)
            group_usd = _safe_cost(group)
            counts.update(group_counts)
            if group_why:
                reasons.append(group_why)
            if all(future.done() for future in group):
                self._finished.update(group_counts)  # keep the numbers, not the futures
                self._finished_usd += group_usd
            else:
                still.append(group)
                live_usd += group_usd
        with self._lock:
            self._live = still + self._live[len(live):]
        # why: the earliest slice's (its jobs start first); the cost: every slice's so far
        self.why = with_cost(reasons[0] if reasons else "", self._finished_usd + live_usd)
        return {status: count for status, count in counts.items() if count}

    def _run(self) -> None:
        try:
            pace = _Pace()
            while not self._stop.wait(pace.interval):
                counts = pace.timed(self.counts)
                if self._all_submitted and not self._live:
                    break
                self._display.refresh(counts, why=self.why)
            counts = self.counts()
            self._display.close(counts, why=self.why)
        except Exception:  # the drawing thread must end quietly whatever happens
            logger.debug("batchfutures: progress thread failed", exc_info=True)


def for_map(show: Show, fn: Any) -> Optional[MapProgress]:
    """The progress of one ``map`` call, or None when nothing is to be drawn."""
    desc = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    display = _Display.create(show, desc, None)
    return MapProgress(display) if display is not None else None


class _CallableModule(types.ModuleType):
    """Importing this module makes it the package's ``progress`` attribute (the import system
    sets it), hiding the function of the same name: calling the module calls the function."""

    def __call__(self, futures: Iterable[F], **options: Any) -> List[F]:
        return progress(futures, **options)


sys.modules[__name__].__class__ = _CallableModule
