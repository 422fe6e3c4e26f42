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

Every GetLogEvents goes through `batchapi.call` (one retry budget per call).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import batchapi

logger = logging.getLogger("batchfutures")

__all__ = ["log_stream", "log_group_of", "tail", "read_all", "follow", "follow_job",
           "job_log_tail", "job_log"]

MAX_PAGES = 10_000  # a safety net: GetLogEvents pages of up to 10,000 events each
NOT_FOUND = "ResourceNotFoundException"


# -- where a job's log is --------------------------------------------------------------------
def log_stream(description: Dict[str, Any]) -> Optional[str]:
    """The log stream of a job's last attempt that has one (else of its container)."""
    for attempt in reversed(description.get("attempts") or []):
        stream = (attempt.get("container") or {}).get("logStreamName")
        if stream:
            return stream
    return (description.get("container") or {}).get("logStreamName")


def log_group_of(description: Dict[str, Any], default: str) -> str:
    """A job's log group: the awslogs-group its definition sets, else Batch's default group."""
    config = (description.get("container") or {}).get("logConfiguration") or {}
    if config.get("logDriver", "awslogs") == "awslogs":
        group = (config.get("options") or {}).get("awslogs-group")
        if group:
            return group
    return default


# -- reading a stream ------------------------------------------------------------------------
def _page(logs_client: Any, group: str, stream: str, **params: Any) -> Dict[str, Any]:
    return batchapi.call(logs_client.get_log_events, logGroupName=group, logStreamName=stream,
                         **params)


def _messages(page: Dict[str, Any]) -> List[str]:
    return [event.get("message", "") for event in page.get("events", [])]


def tail(logs_client: Any, group: str, stream: str, *, lines: int = 20) -> List[str]:
    """The last ``lines`` lines of a stream (fewer only when the stream holds fewer)."""
    found: List[str] = []
    token: Optional[str] = None
    for _ in range(MAX_PAGES):
        params: Dict[str, Any] = {"startFromHead": False, "limit": max(1, lines - len(found))}
        if token:
            params["nextToken"] = token
        page = _page(logs_client, group, stream, **params)
        found = _messages(page) + found  # each page is in time order; older pages come later
        backward = page.get("nextBackwardToken")
        if len(found) >= lines or not backward or backward == token:
            break  # enough, or the start of the stream
        token = backward
    return found[-lines:] if lines else []


def read_all(logs_client: Any, group: str, stream: str, *,
             end_time_ms: Optional[int] = None) -> List[str]:
    """Every line of a stream written until now (or ``end_time_ms``), from its start."""
    # The emulator stamps events with its file's time in milliseconds: a second of margin
    # keeps lines written in the same instant as this call.
    end = end_time_ms if end_time_ms is not None else int(time.time() * 1000) + 1000
    return _drain(logs_client, group, stream, None, end_time_ms=end)[0]


def _drain(logs_client: Any, group: str, stream: str, token: Optional[str], *,
           end_time_ms: Optional[int] = None) -> Tuple[List[str], Optional[str]]:
    """What was written after ``token`` (up to ``end_time_ms``), and the token to go on from."""
    found: List[str] = []
    for _ in range(MAX_PAGES):
        params: Dict[str, Any] = {"startFromHead": True}
        if end_time_ms is not None:
            params["endTime"] = end_time_ms
        if token:
            params["nextToken"] = token
        page = _page(logs_client, group, stream, **params)
        found.extend(_messages(page))
        forward = page.get("nextForwardToken")
        if not forward or forward == token:
            break
        token = forward
    return found, token


def follow(logs_client: Any, group: str, stream: str, *, poll: float = 1.0,
           until: Optional[Callable[[], bool]] = None,
           sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """Lines of a stream as they are written, from its start.

    Keeps the forward token between polls, so each line is read once. Stops once ``until()``
    returns true (asked before each read, so what was written before it became true is still
    yielded); without ``until`` it goes on until the caller stops iterating. A stream that does
    not exist yet is waited for.
    """
    token: Optional[str] = None
    while True:
        finished = bool(until()) if until is not None else False
        try:
            lines, token = _drain(logs_client, group, stream, token)
        except Exception as error:
            if batchapi.error_code(error) != NOT_FOUND:
                raise
            lines = []  # the stream is made when the job's first attempt starts
        yield from lines
        if finished:
            return
        sleep(poll)


# -- a job's log -----------------------------------------------------------------------------
FINISHED = ("SUCCEEDED", "FAILED")


def follow_job(batch_client: Any, logs_client: Any, job_id: str, default_group: str, *,
               poll: float = 1.0, sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """Lines of a job's log as they are written, attempt after attempt, until the job ends.

    Waits for the first attempt's stream, follows it (`follow`), and goes on to the next
    attempt's stream when Batch retries the job. Ends when the job has SUCCEEDED or FAILED and
    its last stream is read, or when Batch no longer knows the job. One DescribeJobs per poll.
    """
    followed: set = set()
    while True:
        found = batchapi.describe_jobs(batch_client, [job_id])
        if not found:
            return
        description = found[0]
        stream = log_stream(description)
        if stream and stream not in followed:
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


def job_log_tail(logs_client: Any, description: Dict[str, Any], default_group: str, *,
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


def job_log(logs_client: Any, description: Dict[str, Any], default_group: str) -> str:
    """A job's whole log so far (a note when its first attempt has not started)."""
    stream = log_stream(description)
    if not stream:
        return f"(no log yet: job {description.get('jobId')} is {description.get('status')})"
    return "\n".join(read_all(logs_client, log_group_of(description, default_group), stream))
