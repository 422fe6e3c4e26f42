"""Batch API calls with retries, the same for the emulator and AWS.

Both raise `botocore.exceptions.ClientError`, so one tenacity policy covers them: throttling
(`TooManyRequestsException`, HTTP 429) and server errors (5xx) are retried with exponential
backoff and jitter; client errors are not. SubmitJob is retried only when the request surely was
not processed (throttled, or the connection never opened), so a retry never submits twice.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Iterator, List

from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    ReadTimeoutError,
)
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

logger = logging.getLogger("batchfutures")

THROTTLING_CODES = frozenset({
    "TooManyRequestsException", "ThrottlingException", "Throttling", "RequestLimitExceeded",
    "ThrottledException", "SlowDown",
})


def error_code(error: BaseException) -> str:
    if isinstance(error, ClientError):
        return str(error.response.get("Error", {}).get("Code", ""))
    return ""


def http_status(error: BaseException) -> int:
    if isinstance(error, ClientError):
        return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return 0


def is_retryable(error: BaseException) -> bool:
    """Throttling, a server error, or a broken connection: worth another try."""
    if isinstance(error, (EndpointConnectionError, ConnectionClosedError, ReadTimeoutError)):
        return True
    if isinstance(error, ClientError):
        return error_code(error) in THROTTLING_CODES or http_status(error) in (429, 500, 502, 503, 504) \
            or error_code(error) == "ServerException"
    return False


def is_safe_to_resubmit(error: BaseException) -> bool:
    """The request was certainly not processed, so sending it again cannot duplicate a job."""
    if isinstance(error, EndpointConnectionError):
        return True
    return isinstance(error, ClientError) and (
        error_code(error) in THROTTLING_CODES or http_status(error) == 429
    )


def _log_retry(state) -> None:
    logger.debug("retrying %s after %s (attempt %d)", getattr(state.fn, "__name__", "call"),
                 state.outcome.exception(), state.attempt_number)


def call(method: Callable[..., Dict[str, Any]], *, attempts: int = 8, max_delay: float = 120.0,
         safe_to_retry: Callable[[BaseException], bool] = is_retryable,
         **kwargs: Any) -> Dict[str, Any]:
    """Call a Batch (or Logs) client method with backoff on throttling and server errors."""
    retrying = Retrying(
        retry=retry_if_exception(safe_to_retry),
        wait=wait_random_exponential(multiplier=0.1, max=10),
        stop=stop_after_attempt(attempts) | stop_after_delay(max_delay),
        before_sleep=_log_retry,
        reraise=True,
    )
    return retrying(method, **kwargs)


def submit_job(client: Any, request: Dict[str, Any]) -> Dict[str, Any]:
    return call(client.submit_job, safe_to_retry=is_safe_to_resubmit, **request)


def describe_jobs(client: Any, job_ids: List[str]) -> List[Dict[str, Any]]:
    """DescribeJobs in batches of 100 (Batch's limit); ids Batch no longer knows are left out."""
    found: List[Dict[str, Any]] = []
    for start in range(0, len(job_ids), 100):
        response = call(client.describe_jobs, jobs=job_ids[start:start + 100])
        found.extend(response.get("jobs", []))
    return found


def list_children(client: Any, array_job_id: str, status: str) -> Iterator[Dict[str, Any]]:
    """Every child of an array job in one status, following nextToken."""
    token = None
    while True:
        request: Dict[str, Any] = {"arrayJobId": array_job_id, "jobStatus": status, "maxResults": 1000}
        if token:
            request["nextToken"] = token
        response = call(client.list_jobs, **request)
        yield from response.get("jobSummaryList", [])
        token = response.get("nextToken")
        if not token:
            return


def read_log(logs_client: Any, group: str, stream: str, *, limit_events: int = 0) -> List[str]:
    """Lines of a log stream from its start, following nextForwardToken until it repeats.

    With ``limit_events`` only the last that many lines are read (one request).
    """
    if limit_events:
        response = call(logs_client.get_log_events, logGroupName=group, logStreamName=stream,
                        startFromHead=False, limit=limit_events)
        return [event.get("message", "") for event in response.get("events", [])]
    lines: List[str] = []
    token = None
    while True:
        request: Dict[str, Any] = {"logGroupName": group, "logStreamName": stream, "startFromHead": True}
        if token:
            request["nextToken"] = token
        response = call(logs_client.get_log_events, **request)
        lines.extend(event.get("message", "") for event in response.get("events", []))
        next_token = response.get("nextForwardToken")
        if not next_token or next_token == token:
            return lines
        token = next_token
