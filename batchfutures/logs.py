"""Reading a job's console output from CloudWatch Logs (or the emulator's logs, same API).

    DescribeJobs description ──> log_stream(description), log_group_of(description, default)
                                        │ group, stream
                                        v
    tail(logs, group, stream, lines=N)   GetLogEvents from the end (startFromHead=False),
                                         following nextBackwardToken: a page may be empty or
                                         partly full, so pages are read until N lines are
                                         found or the start of the stream is reached
    read_all(logs, group, stream)        GetLogEvents from the head with an endTime (now), so a
                                         stream still being written does not keep the read going;
                                         ends when nextForwardToken comes back unchanged
    follow(logs, group, stream, ...)     a generator of lines as they are written: keeps its
                                         forward token between polls (never re-reads the stream)
                                         and stops once ``until()`` is true and what was written
                                         before has been read
    follow_job(batch, logs, job_id, ...) follow, stream after stream (one per attempt), until the
                                         job has ended (`batchfutures logs --follow`)

Every GetLogEvents goes through `batchapi.call` (one retry budget per call). Every read is
bounded by `batchapi.Pages`: a token that comes back as it was sent is the end (or, backwards,
the start) of the stream, as CloudWatch signals it; an earlier token coming back again is a
loop, and more than `batchapi.MAX_PAGES` pages in one read is too many: both raise
`batchapi.PaginationError` (after yielding what was read). `lines_after`/`iter_all` yield lines
page by page (the CLI prints them as they come).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, runtime_checkable

from . import batchapi, jobdetail
from .logforward import readable_line
from .statuses import FINISHED

logger = logging.getLogger("batchfutures")

__all__ = ["LogsAPI", "LiveTailAPI", "log_stream", "log_group_of", "tail", "read_all", "iter_all",
           "lines_after", "events_after", "Cursor", "follow", "follow_job", "job_log_tail", "job_log"]

NOT_FOUND = "ResourceNotFoundException"


@runtime_checkable
class LogsAPI(Protocol):
    """The CloudWatch Logs seam: boto3's ``logs`` client as far as batchfutures calls it.
    Implemented by boto3's client (AWSBatchEnvironment) and the emulator's
    `emulator.logservice.LogsService` (LocalEnvironment); mypy checks both against it."""

    def get_log_events(self, **params: Any) -> Dict[str, Any]: ...

    def filter_log_events(self, **params: Any) -> Dict[str, Any]: ...  # ex.logs(search=)


@runtime_checkable
class LiveTailAPI(LogsAPI, Protocol):
    """CloudWatch Logs with StartLiveTail (``echo_output="live"`` on AWS, livetail.py): boto3's
    ``logs`` client only. The emulator's LogsService does not serve it, so it is a Protocol of
    its own rather than a member of `LogsAPI`; livetail takes an AWS environment's client as one
    (``env.is_local`` false: boto3's). ``meta``: boto3's client facts (endpoint, config)."""

    meta: Any

    def start_live_tail(self, **params: Any) -> Dict[str, Any]: ...


# -- where a job's log is --------------------------------------------------------------------
log_stream = jobdetail.log_stream  # the one definition: the current attempt's, else the latest's


def log_group_of(description: Dict[str, Any], default: str) -> str:
    """A job's log group: the awslogs-group its definition sets, else Batch's default group."""
    config = (description.get("container") or {}).get("logConfiguration") or {}
    if config.get("logDriver", "awslogs") == "awslogs":
        group = (config.get("options") or {}).get("awslogs-group")
        if group:
            return group
    return default


# -- reading a stream ------------------------------------------------------------------------
def _page(logs_client: LogsAPI, group: str, stream: str, **params: Any) -> Dict[str, Any]:
    return batchapi.call(logs_client.get_log_events, logGroupName=group, logStreamName=stream,
                         **params)


def _messages(page: Dict[str, Any]) -> List[str]:
    return [readable_line(event.get("message", "")) for event in page.get("events", [])]


def tail(logs_client: LogsAPI, group: str, stream: str, *, lines: int = 20) -> List[str]:
    """The last ``lines`` lines of a stream (fewer only when the stream holds fewer)."""
    found: List[str] = []
    token: Optional[str] = None
    # the start of the stream: nextBackwardToken comes back as it was sent
    pages = batchapi.Pages("GetLogEvents (backwards)", same_token_ends=True)
    while True:
        params: Dict[str, Any] = {"startFromHead": False, "limit": max(1, lines - len(found))}
        if token:
            params["nextToken"] = token
        page = _page(logs_client, group, stream, **params)
        found = _messages(page) + found  # each page is in time order; older pages come later
        if len(found) >= lines:
            break
        token = pages.next(page.get("nextBackwardToken"))
        if token is None:
            break  # the start of the stream
    return found[-lines:] if lines else []


class Cursor:
    """A place in a stream read forwards: the nextForwardToken to go on from (None: its start)."""

    def __init__(self, token: Optional[str] = None) -> None:
        self.token = token


def lines_after(logs_client: LogsAPI, group: str, stream: str, cursor: Optional[Cursor] = None, *,
                end_time_ms: Optional[int] = None) -> Iterator[str]:
    """The lines written after ``cursor`` (up to ``end_time_ms``), yielded page by page as they
    are read (one page is held at a time, never the stream); ``cursor`` moves past each page.

    Ends when nextForwardToken comes back as it was sent (GetLogEvents' end of the stream);
    raises `batchapi.PaginationError` on an earlier token coming back (a loop) or past
    `batchapi.MAX_PAGES` pages in one read.
    """
    for event in events_after(logs_client, group, stream, cursor, end_time_ms=end_time_ms):
        yield readable_line(event.get("message", ""))  # a record's JSON line as logging writes it


def events_after(logs_client: LogsAPI, group: str, stream: str, cursor: Optional[Cursor] = None, *,
                 start_time_ms: Optional[int] = None,
                 end_time_ms: Optional[int] = None) -> Iterator[Dict[str, Any]]:
    """`lines_after`'s events (message, timestamp, ingestionTime). ``start_time_ms``: from the
    first event at or after that time when the cursor has no token yet (GetLogEvents' startTime;
    a token, once there is one, says where to go on)."""
    cursor = cursor if cursor is not None else Cursor()
    pages = batchapi.Pages("GetLogEvents", start=cursor.token, same_token_ends=True)
    while True:
        params: Dict[str, Any] = {"startFromHead": True}
        if end_time_ms is not None:
            params["endTime"] = end_time_ms
        if cursor.token:
            params["nextToken"] = cursor.token
        elif start_time_ms is not None:
            params["startTime"] = start_time_ms
        page = _page(logs_client, group, stream, **params)
        events, forward = page.get("events") or [], page.get("nextForwardToken")
        del page
        yield from events
        events = []  # this page is let go before the next one is read
        forward = pages.next(forward)
        if forward is None:
            return
        cursor.token = forward


def read_all(logs_client: LogsAPI, group: str, stream: str, *,
             end_time_ms: Optional[int] = None) -> List[str]:
    """Every line of a stream written until now (or ``end_time_ms``), from its start."""
    return list(iter_all(logs_client, group, stream, end_time_ms=end_time_ms))


def iter_all(logs_client: LogsAPI, group: str, stream: str, *,
             end_time_ms: Optional[int] = None) -> Iterator[str]:
    """`read_all` as a generator: lines as their pages are read."""
    # The emulator stamps events with its file's time in milliseconds: a second of margin
    # keeps lines written in the same instant as this call.
    end = end_time_ms if end_time_ms is not None else int(time.time() * 1000) + 1000
    return lines_after(logs_client, group, stream, Cursor(), end_time_ms=end)


# CloudWatch Logs may show a job's last lines a little after the job ended: once following
# should stop, reads go on until one brings nothing new, at most this many.
SETTLE_READS = 5


def follow(logs_client: LogsAPI, group: str, stream: str, *, poll: float = 1.0,
           until: Optional[Callable[[], bool]] = None,
           sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """Lines of a stream as they are written, from its start.

    Keeps the forward token between polls, so each line is read once. Once ``until()`` returns
    true (asked before each read, so what was written before it became true is still yielded)
    it reads on until a read brings nothing new (at most SETTLE_READS: the service's lag);
    without ``until`` it goes on until the caller stops iterating. A stream that does not exist
    yet is waited for.
    """
    cursor = Cursor()
    settling = 0
    while True:
        finished = bool(until()) if until is not None else False
        got = 0
        try:
            for line in lines_after(logs_client, group, stream, cursor):
                got += 1
                yield line
        except Exception as error:
            if batchapi.error_code(error) != NOT_FOUND:
                raise
            # the stream is made when the job's first attempt starts
        if finished:
            settling += 1
            if not got or settling >= SETTLE_READS:
                return
        sleep(poll)


# -- a job's log -----------------------------------------------------------------------------


def follow_job(batch_client: batchapi.BatchAPI, logs_client: LogsAPI, job_id: str, default_group: str, *,
               poll: float = 1.0, sleep: Callable[[float], None] = time.sleep,
               on_new_stream: Optional[Callable[[Dict[str, Any], bool], None]] = None
               ) -> Iterator[str]:
    """Lines of a job's log as they are written, attempt after attempt, until the job ends.

    Waits for the first attempt's stream, follows it (`follow`), and goes on to the next
    attempt's stream, from its start, when Batch retries the job (``on_new_stream(description,
    first)`` is told of each). Ends when the job has SUCCEEDED or FAILED and its last stream is
    read, or when Batch no longer knows the job. One DescribeJobs per poll.
    """
    followed: set = set()
    while True:
        found = batchapi.describe_jobs(batch_client, [job_id])
        if not found:
            return
        description = found[0]
        stream = log_stream(description)
        if stream and stream not in followed:
            if on_new_stream is not None:
                on_new_stream(description, not followed)
            followed.add(stream)

            def moved_on(stream: str = stream) -> bool:
                latest = batchapi.describe_jobs(batch_client, [job_id])
                return not latest or latest[0].get("status") in FINISHED \
                    or log_stream(latest[0]) != stream

            yield from follow(logs_client, log_group_of(description, default_group), stream,
                              poll=poll, until=moved_on, sleep=sleep)
            continue
        if description.get("status") in FINISHED:
            return
        sleep(poll)


def job_log_tail(logs_client: LogsAPI, description: Dict[str, Any], default_group: str, *,
                 lines: int = 20) -> Optional[str]:
    """The last lines of a job's log for an error message; None when there is none."""
    stream = log_stream(description)
    if not stream:
        return None
    try:
        found = tail(logs_client, log_group_of(description, default_group), stream, lines=lines)
    except Exception as error:  # a missing log must not hide the job's failure
        logger.debug("no log tail for %s: %s", description.get("jobId"), error)
        return None
    return "\n".join(found) or None


def job_log(logs_client: LogsAPI, description: Dict[str, Any], default_group: str) -> str:
    """A job's whole log so far (a note when its first attempt has not started)."""
    stream = log_stream(description)
    if not stream:
        return f"(no log yet: job {description.get('jobId')} is {description.get('status')})"
    return "\n".join(read_all(logs_client, log_group_of(description, default_group), stream))
