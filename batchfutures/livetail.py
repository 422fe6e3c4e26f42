"""``BatchExecutor(..., echo_output="live")``: what running calls print, on the client's terminal
while they run, each line prefixed by its call.

    worker  header "live": its stdout and stderr line-buffered (calls.initialize), so each line
            reaches the container's log (CloudWatch Logs; the emulator's log files) as printed
    client  one LiveTail thread per executor, a round every INTERVAL seconds:
              the session's outstanding jobs -> their RUNNING children (ListJobs of at most
              LISTINGS_PER_ROUND array jobs a round, taking turns; DescribeJobs for the plain
              ones, 100 ids a request) -> each new child's log stream
              (DescribeJobs, once) -> GetLogEvents from the child's kept forward token
            at most STREAMS_PER_ROUND streams a round (GetLogEvents' quota is 10 requests a
            second per account and Region): beyond that the children take turns (``choose``) and
            a note says the output is sampled; a child seen ended is read to its end once more,
            then dropped

The lines batchfutures' own worker writes (``batchfutures.``: its notes, the logging records it
keeps for the client) are not shown: a call's records reach the client's handlers when it
resolves, as without "live". What was streamed is not echoed again when the call resolves; a
call's last lines may follow its future's resolution by one round.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from . import batchapi, jobdetail
from .logs import Cursor, lines_after, log_group_of
from .statuses import JobStatus

if TYPE_CHECKING:
    from .environments import Environment

__all__ = ["LIVE", "INTERVAL", "STREAMS_PER_ROUND", "LiveTail", "choose", "shown", "prefixed"]

logger = logging.getLogger("batchfutures")

LIVE = "live"  # echo_output's value
INTERVAL = 1.0
STREAMS_PER_ROUND = 5
LISTINGS_PER_ROUND = 5  # array jobs listed a round (ListJobs): the poller's Batch budget is shared
_OWN_PREFIX = "batchfutures."


def choose(keys: Sequence[str], start: int, budget: int) -> Tuple[List[str], int]:
    """Up to ``budget`` of ``keys``, taking turns from ``start``; (chosen, next start) (pure)."""
    if not keys or budget <= 0:
        return [], 0
    if len(keys) <= budget:
        return list(keys), 0
    start %= len(keys)
    chosen = [keys[(start + i) % len(keys)] for i in range(budget)]
    return chosen, (start + budget) % len(keys)


def shown(line: str) -> bool:
    """Whether a log line is the call's own output (not the worker's notes or kept records)."""
    return not line.startswith(_OWN_PREFIX)


def prefixed(child_id: str, line: str) -> str:
    return f"[{child_id}] {line}"


@dataclass
class _Followed:
    group: str
    stream: str
    cursor: Cursor = field(default_factory=Cursor)
    ended: bool = False


class LiveTail:
    """The thread that streams running calls' output (see the module docstring)."""

    def __init__(self, env: "Environment", outstanding: Callable[[], List[Any]], *,
                 write: Optional[Callable[[str], None]] = None, interval: float = INTERVAL,
                 streams_per_round: int = STREAMS_PER_ROUND) -> None:
        self._env = env
        self._outstanding = outstanding  # () -> the session's TrackedJobs not finished
        self._write = write or _write_stdout
        self._interval = interval
        self._budget = streams_per_round
        self._followed: Dict[str, _Followed] = {}
        self._turn = 0
        self._job_turn = 0
        self._listed: Dict[str, Set[str]] = {}  # array job -> its children RUNNING when last listed
        self._sampled_said = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._streamed: Set[str] = set()  # children followed: not echoed when they resolve
        self._echoed: Set[str] = set()  # children echoed as they resolved: never followed

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="batchfutures-live",
                                                daemon=True)
                self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """Stop after a last round (the ended calls' last lines); ``wait``: until it is done."""
        self._stop.set()
        thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)

    def echo_at_end(self, child_id: str) -> bool:
        """As a call resolves: True when its output was not streamed (the caller echoes it;
        it is then never streamed), False when it was (only its records are replayed)."""
        with self._lock:
            if child_id in self._streamed:
                return False
            self._echoed.add(child_id)
            return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._round_logged(final=False)
            self._stop.wait(self._interval)
        self._round_logged(final=True)  # the calls followed, read to their end

    def _round_logged(self, final: bool) -> None:
        try:
            self.round(final=final)
        except Exception:  # a refused or failed read: the next round tries again
            logger.debug("live output: a round failed", exc_info=True)

    # -- one round ---------------------------------------------------------------------------
    def _running(self) -> Set[str]:
        """The child job ids running now, of the outstanding jobs."""
        batch = self._env.batch
        running: Set[str] = set()
        plain: List[str] = []
        arrays: List[str] = []
        for job in self._outstanding():
            (arrays if getattr(job, "array", False) else plain).append(job.job_id)
        listed, self._job_turn = choose(arrays, self._job_turn, LISTINGS_PER_ROUND)
        for job_id in listed:
            self._listed[job_id] = {
                summary["jobId"] for summary in
                batchapi.list_children(batch, job_id, JobStatus.RUNNING.value)
                if summary.get("jobId")}
        for job_id in list(self._listed):
            if job_id in arrays:  # not listed this round: as it was when last listed
                running |= self._listed[job_id]
            else:
                del self._listed[job_id]
        for description in batchapi.describe_jobs(batch, plain) if plain else []:
            if description.get("status") == JobStatus.RUNNING.value:
                running.add(description.get("jobId", ""))
        return running

    def round(self, final: bool = False) -> None:
        running = self._running() if not final else set()
        with self._lock:
            new = sorted(child for child in running
                         if child and child not in self._followed and child not in self._echoed)
            self._streamed.update(new)  # from now on its output is this thread's to show
        for description in batchapi.describe_jobs(self._env.batch, new) if new else []:
            stream = jobdetail.log_stream(description)
            if stream:
                self._followed[description["jobId"]] = _Followed(
                    log_group_of(description, self._env.log_group), stream)
        for child, followed in self._followed.items():
            followed.ended = child not in running
        ended = [child for child, f in self._followed.items() if f.ended]
        live = [child for child, f in self._followed.items() if not f.ended]
        chosen, self._turn = choose(live, self._turn, max(0, self._budget - len(ended)))
        if len(live) > len(chosen) and not self._sampled_said:
            self._sampled_said = True
            self._write(f"[batchfutures: {len(live)} calls print at once; their live output is "
                        f"sampled, {self._budget} streams a second (future.log() has all of it)]\n")
        for child in ended + chosen:
            self._show(child, self._followed[child])
        for child in ended:
            del self._followed[child]

    def _show(self, child: str, followed: _Followed) -> None:
        text = "".join(prefixed(child, line) + "\n"
                       for line in lines_after(self._env.logs, followed.group, followed.stream,
                                               followed.cursor) if shown(line))
        if text:
            self._write(text)


def _write_stdout(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except Exception:  # a closed terminal: the output stays in the job's log
        pass
