"""Batch (and Logs) API calls with one retry budget each, the same for the emulator and AWS.

    caller ── call(client.method, **params) ──> tenacity: attempts and total seconds bounded,
                                                full jitter; botocore's own retries are off
                                                (environments.client_config), so budgets
                                                never multiply
    caller ── submit_exactly_once(client, request, grace=describe grace) ──> exactly-once SubmitJob:

        request + unique jobName suffix + tag batchfutures:submission=<uuid>
           │
           v
        SubmitJob, sent once ──ok──> {"jobId": ...}
           │ failed
           v
        submit_verdict(error):
           RESUBMIT   certainly not processed (throttled 429, the connection never opened)
                      ─> wait (jitter) and send again; a throttle with ``keep_waiting`` (the
                         submitter's) is outside the retry budget: sent again, backing off
                         (`throttle_wait`), while the executor wants the job
           LOOK_UP    may have been processed (5xx, read timeout, connection closed mid-call)
                      ─> ListJobs(jobQueue, JOB_NAME = the unique name) for up to the grace
                         (the poller's allowance for DescribeJobs to show a new job; a listed
                         job DescribeJobs does not show yet counts, one whose tag is another
                         submission's does not); found ─> its id (of several: the oldest, the
                         others terminated); none ─> send again, then look again at once and
                         after the grace, terminating every other job of the name
           GIVE_UP    a client error (4xx): raise

Every request here goes through the client it is given: the environments give
`budget.BudgetedClient`s, so each try (retries included) takes a token of the process's request
budget first. The bulk CancelJobs/TerminateJobs answer 200 with per-job `errors`; the throttled
and 5xx entries are sent again (`split_stop_errors`).

Both the emulator and botocore raise `botocore.exceptions.ClientError`, so one policy covers
them: `is_retryable` says a call is worth another try, `is_safe_to_resubmit` that a SubmitJob
surely did not create a job (only then is it sent again without a look-up first).

Pagination is bounded (`Pages`, `paginate`; also GetLogEvents' tokens in `logs`): a token that
was already followed in the same read, or more than `MAX_PAGES` pages (10,000: ten million
ListJobs summaries at 1,000 a page, far past any one queue's or array's jobs), raises
`PaginationError` instead of following the loop forever. An error rather than a quiet stop:
the callers decide from a complete listing (the poller's failed children, the exactly-once
look-up, `batchfutures jobs`), and a silently partial one would be a wrong answer; the poller
treats the error like any failed read and tries again at its next tick.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Protocol, runtime_checkable

from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
)
from botocore.exceptions import ConnectionError as BotocoreConnectionError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from .batchlimits import MAX_BULK_STOP, MAX_DESCRIBE_JOBS
from .errors import ABORT_REASON_PREFIX, BatchError

logger = logging.getLogger("batchfutures")

THROTTLING_CODES = frozenset({
    "TooManyRequestsException", "ThrottlingException", "Throttling", "RequestLimitExceeded",
    "ThrottledException", "SlowDown",
})
SERVER_STATUSES = frozenset({500, 502, 503, 504})
SUBMISSION_TAG = "batchfutures:submission"  # one unique value per submission (exactly-once)
JOB_NAME_LIMIT = 128
_NAME_SUFFIX = 9  # "-" and 8 hex digits of the submission token


@runtime_checkable
class BatchAPI(Protocol):
    """The Batch seam: boto3's ``batch`` client as far as batchfutures calls it (keyword
    arguments and answers as boto3's). Implemented by boto3's client (environments, through
    `budget.BudgetedClient`), the emulator (`emulator.BatchEmulator`) and the dry run's recorder
    (`dryrun.RecordingBatch`); mypy checks each against this list."""

    def submit_job(self, **params: Any) -> Dict[str, Any]: ...
    def describe_jobs(self, **params: Any) -> Dict[str, Any]: ...
    def list_jobs(self, **params: Any) -> Dict[str, Any]: ...
    def cancel_job(self, **params: Any) -> Dict[str, Any]: ...
    def terminate_job(self, **params: Any) -> Dict[str, Any]: ...
    def cancel_jobs(self, **params: Any) -> Dict[str, Any]: ...
    def terminate_jobs(self, **params: Any) -> Dict[str, Any]: ...
    def describe_job_queues(self, **params: Any) -> Dict[str, Any]: ...
    def describe_compute_environments(self, **params: Any) -> Dict[str, Any]: ...
    def describe_job_definitions(self, **params: Any) -> Dict[str, Any]: ...
    def register_job_definition(self, **params: Any) -> Dict[str, Any]: ...


@dataclass(frozen=True)
class RetryBudget:
    """How long one API call may keep trying: attempts and seconds, whichever ends first."""

    attempts: int = 6
    seconds: float = 30.0
    first_wait: float = 0.2  # full jitter: each wait is uniform in [0, min(max_wait, first * 2^n)]
    max_wait: float = 5.0


DEFAULT_BUDGET = RetryBudget()
# SubmitJob: a failed submission fails its futures, so it tries longer (its waits stay short).
SUBMIT_BUDGET = RetryBudget(attempts=10, seconds=60.0)
# For the poller: a failed poll is tried again at the next tick, so it gives up early and
# goes on serving the other jobs.
POLL_BUDGET = RetryBudget(attempts=3, seconds=10.0)


MAX_PAGES = 10_000  # pages of one paginated read (documented above)


class PaginationError(BatchError):
    """A paginated read went wrong: a token came back that was already followed, or the read
    went past its page limit. What was read before is not a complete answer."""


class Pages:
    """The tokens of one paginated read: `next` says which token to send next, or None when the
    read is complete, and raises `PaginationError` on a token already seen or past
    ``max_pages`` pages.

    ``same_token_ends``: GetLogEvents signals the end of a stream (or its start, reading
    backwards) by returning the token it was sent; that is the end, not a loop. Any other
    token seen before is a loop. ``start``: the token the read begins from (a kept forward
    token), counted as seen.
    """

    def __init__(self, what: str, *, start: Optional[str] = None, max_pages: Optional[int] = None,
                 same_token_ends: bool = False) -> None:
        self.what = what
        self.max_pages = MAX_PAGES if max_pages is None else max_pages
        self.same_token_ends = same_token_ends
        self.pages = 0
        self._last = start
        self._seen = {start} if start else set()

    def next(self, token: Optional[str]) -> Optional[str]:
        """After one more page: the token to ask for the next one with, or None at the end."""
        self.pages += 1
        if not token:
            return None
        if self.same_token_ends and token == self._last:
            return None
        if token in self._seen:
            raise PaginationError(
                f"{self.what}: page {self.pages} returned a token already followed in this read; "
                f"stopped instead of reading the same pages again (a fault in the service or a "
                f"proxy)")
        if self.pages >= self.max_pages:
            raise PaginationError(
                f"{self.what}: stopped after {self.pages} pages (the limit is {self.max_pages}) "
                f"and the service still had more; the read is incomplete")
        self._seen.add(token)
        self._last = token
        return token


def paginate(method: Callable[..., Dict[str, Any]], *, budget: RetryBudget = DEFAULT_BUDGET,
             max_pages: Optional[int] = None, token_name: str = "nextToken",
             **request: Any) -> Iterator[Dict[str, Any]]:
    """Each response of a nextToken-paginated call (ListJobs, DescribeJobDefinitions, ...), each
    page through `call` (its own retry budget), bounded by `Pages`. ``token_name``: the token's
    key in request and response ("NextToken" for EC2's DescribeInstanceTypes)."""
    pages = Pages(getattr(method, "__name__", "a paginated call"), max_pages=max_pages)
    while True:
        response = call(method, budget=budget, **request)
        yield response
        token = pages.next(response.get(token_name))
        if token is None:
            return
        request = {**request, token_name: token}


def error_code(error: BaseException) -> str:
    if isinstance(error, ClientError):
        return str(error.response.get("Error", {}).get("Code", ""))
    return ""


def http_status(error: BaseException) -> int:
    if isinstance(error, ClientError):
        return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return 0


def is_throttling(error: BaseException) -> bool:
    return isinstance(error, ClientError) and (
        error_code(error) in THROTTLING_CODES or http_status(error) == 429)


def is_retryable(error: BaseException) -> bool:
    """Throttling, a server error, or a broken connection: worth another try (reads, cancels)."""
    if isinstance(error, (BotocoreConnectionError, HTTPClientError)):
        return True  # connect / read timeouts, closed connections, endpoint unreachable
    if isinstance(error, ClientError):
        return is_throttling(error) or http_status(error) in SERVER_STATUSES \
            or error_code(error) == "ServerException"
    return False


def is_safe_to_resubmit(error: BaseException) -> bool:
    """The request was certainly not processed, so sending it again cannot duplicate a job."""
    if isinstance(error, (EndpointConnectionError, ConnectTimeoutError)):
        return True  # the connection never opened: nothing was sent
    return is_throttling(error)  # Batch throttles before it processes anything


class SubmitVerdict(enum.Enum):
    """What to do after a SubmitJob failed."""

    RESUBMIT = "resubmit"  # certainly not created: send it again
    LOOK_UP = "look up"  # perhaps created: look for it before anything else
    GIVE_UP = "give up"  # refused (4xx) or not an API failure: raise


def submit_verdict(error: BaseException) -> SubmitVerdict:
    if is_safe_to_resubmit(error):
        return SubmitVerdict.RESUBMIT
    if is_retryable(error):
        return SubmitVerdict.LOOK_UP
    return SubmitVerdict.GIVE_UP


def _log_retry(state: Any) -> None:
    logger.debug("retrying %s after %s (attempt %d)", getattr(state.fn, "__name__", "call"),
                 state.outcome.exception(), state.attempt_number)


def _retrying(budget: RetryBudget, safe_to_retry: Callable[[BaseException], bool]) -> Retrying:
    return Retrying(
        retry=retry_if_exception(safe_to_retry),
        wait=wait_random_exponential(multiplier=budget.first_wait, max=budget.max_wait),
        stop=stop_after_attempt(budget.attempts) | stop_after_delay(budget.seconds),
        before_sleep=_log_retry,
        reraise=True,
    )


def call(method: Callable[..., Dict[str, Any]], *, budget: RetryBudget = DEFAULT_BUDGET,
         safe_to_retry: Callable[[BaseException], bool] = is_retryable,
         attempts: Optional[int] = None, max_delay: Optional[float] = None,
         **kwargs: Any) -> Dict[str, Any]:
    """Call a Batch, Logs, STS or Secrets Manager client method within one retry budget.

    ``attempts`` and ``max_delay`` (seconds) narrow the budget for one call.
    """
    if attempts is not None or max_delay is not None:
        budget = replace(budget, attempts=attempts if attempts is not None else budget.attempts,
                         seconds=max_delay if max_delay is not None else budget.seconds)
    return _retrying(budget, safe_to_retry)(method, **kwargs)


# -- exactly-once SubmitJob -------------------------------------------------------------------
def with_submission_token(request: Dict[str, Any], token: str) -> Dict[str, Any]:
    """The request with its unique marks: a jobName suffix (for ListJobs) and a tag (to confirm)."""
    name = str(request.get("jobName") or "bf-call")
    marked = dict(request)
    marked["jobName"] = f"{name[:JOB_NAME_LIMIT - _NAME_SUFFIX]}-{token[:8]}"
    marked["tags"] = {**(request.get("tags") or {}), SUBMISSION_TAG: token}
    return marked


# The look-up after an ambiguous SubmitJob lasts the environment's describe_grace (the poller's
# allowance for DescribeJobs to show a new job): one definition for both.
LOOKUP_MAX_WAIT = 8.0  # seconds between two ListJobs of the look-up, at most
DUPLICATE_REASON = f"{ABORT_REASON_PREFIX} duplicate of an ambiguous SubmitJob"


def submit_exactly_once(client: BatchAPI, request: Dict[str, Any], *, grace: float,
                        budget: RetryBudget = SUBMIT_BUDGET,
                        token: Optional[str] = None,
                        keep_waiting: Optional[Callable[[], bool]] = None) -> Dict[str, Any]:
    """SubmitJob so that one job results: the response of the job kept.

    The request gets a unique name suffix and tag (`with_submission_token`). A failure
    that may have created the job is followed by a look-up for up to ``grace`` seconds
    (`look_up`); only when it finds nothing is the request sent again, and after such a
    resubmission the name is looked up again, at once and ``grace`` seconds later, and every
    other job of that name is terminated (`remove_duplicates`).

    ``keep_waiting``: given (the submitter's: its executor is open and the job's futures are
    wanted), a throttled SubmitJob is sent again for as long as it says True, outside
    ``budget`` (`throttle_wait`: backing off up to ``budget.max_wait``, each try a request of
    the process's budget), so throttling alone never fails the job; other failures keep the
    budget. Without it, throttles count as any failure.
    """
    marked = with_submission_token(request, token or uuid.uuid4().hex)
    deadline = time.monotonic() + budget.seconds
    wait = wait_random_exponential(multiplier=budget.first_wait, max=budget.max_wait)
    resent = False  # sent again after a look-up found nothing: an earlier job may show later
    attempt = throttled = 0
    while attempt < budget.attempts:
        try:
            response = client.submit_job(**marked)
        except Exception as error:
            verdict = submit_verdict(error)
            logger.debug("SubmitJob of %s failed (%s): %s", marked["jobName"], error, verdict.value)
            if verdict is SubmitVerdict.GIVE_UP:
                raise
            if keep_waiting is not None and is_throttling(error):
                if not keep_waiting():
                    raise
                throttled += 1
                pause = throttle_wait(throttled, budget, random.random())
                if throttled in (1, 10) or throttled % 100 == 0:
                    logger.info("batchfutures: SubmitJob of %s throttled %d time(s); trying "
                                "again in %.1f s", marked["jobName"], throttled, pause)
                deadline += pause  # waiting for the account's budget is not a failure's time
                time.sleep(pause)
                continue
            attempt += 1
            if verdict is SubmitVerdict.LOOK_UP:
                started = time.monotonic()
                found = look_up(client, marked, grace)
                deadline += time.monotonic() - started  # the look-up is not the retry budget's
                if found is not None:
                    logger.info("batchfutures: SubmitJob answered %s but had created job %s",
                                error_code(error) or type(error).__name__,
                                found["jobId"])
                    if resent:
                        _look_again_later(client, marked, found["jobId"], grace)
                    return found
            if attempt >= budget.attempts or time.monotonic() >= deadline:
                raise
            resent = resent or verdict is SubmitVerdict.LOOK_UP
            time.sleep(wait(_retry_state(attempt)))  # full jitter, as `call`'s retries
            continue
        if resent:  # a job of an earlier try may still show up: keep this one only
            remove_duplicates(client, marked, keep=response["jobId"])
            _look_again_later(client, marked, response["jobId"], grace)
        return response
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def throttle_wait(throttled: int, budget: RetryBudget, draw: float) -> float:
    """Seconds before SubmitJob is sent again after the ``throttled``-th throttled answer of one
    submission: "equal jitter" (``draw`` uniform in [0, 1)) over ``first_wait * 2^(n-1)`` capped at
    ``max_wait``: at least half of it (a throttled client must slow down), the rest spread so
    that throttled callers do not come back together."""
    ceiling = min(budget.max_wait, budget.first_wait * 2 ** min(max(throttled, 1) - 1, 30))
    return ceiling / 2 + ceiling / 2 * draw


def _retry_state(attempt: int) -> RetryCallState:
    """What tenacity's wait strategies read: the attempt's number."""
    state = RetryCallState(retry_object=Retrying(), fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    return state


def _look_again_later(client: BatchAPI, request: Dict[str, Any], keep: str, grace: float) -> None:
    """`remove_duplicates` once more after ``grace``: an earlier try's job, listed late."""
    timer = threading.Timer(grace, remove_duplicates, (client, request), {"keep": keep})
    timer.daemon = True
    timer.start()


def submission_jobs(client: BatchAPI, request: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The summaries of the jobs this marked request created, oldest first.

    A ListJobs hit of the exact name is accepted even when DescribeJobs does not show the job
    yet (the name's suffix is the submission's own); a described job whose submission tag is
    another's is left out.
    """
    name = request["jobName"]
    token = (request.get("tags") or {}).get(SUBMISSION_TAG)
    listing = {"jobQueue": request["jobQueue"],
               "filters": [{"name": "JOB_NAME", "values": [name]}]}
    hits: List[Dict[str, Any]] = []
    for page in paginate(client.list_jobs, **listing):
        hits += [s for s in page.get("jobSummaryList", []) if s.get("jobName") == name]
    described = {d["jobId"]: d for d in describe_jobs(client, [s["jobId"] for s in hits])}
    ours = [s for s in hits if s["jobId"] not in described
            or (described[s["jobId"]].get("tags") or {}).get(SUBMISSION_TAG) == token]
    return sorted(ours, key=lambda s: (s.get("createdAt") or 0, s["jobId"]))


def look_up(client: BatchAPI, request: Dict[str, Any], grace: float) -> Optional[Dict[str, Any]]:
    """The job an ambiguous SubmitJob of ``request`` created, looked for during ``grace``
    seconds; None when none showed. Of several (an earlier resubmission's), the oldest is
    kept and the others are terminated."""
    give_up_at = time.monotonic() + grace
    pause = 0.0
    while True:
        try:
            found = submission_jobs(client, request)
        except Exception as error:  # without the answer a resubmit could duplicate the job
            raise BatchError(
                f"SubmitJob of {request['jobName']!r} may have created a job, and looking for it "
                f"failed ({error}); look for the tag {SUBMISSION_TAG}="
                f"{request['tags'][SUBMISSION_TAG]} in queue {request['jobQueue']} "
                f"before submitting again") from error
        if found:
            kept = found[0]
            _terminate(client, [s["jobId"] for s in found[1:]], kept["jobId"])
            return {"jobId": kept["jobId"], "jobName": kept.get("jobName"),
                    "jobArn": kept.get("jobArn")}
        left = give_up_at - time.monotonic()
        if left <= 0:
            return None
        pause = min(left, LOOKUP_MAX_WAIT, max(0.5, pause * 2))
        time.sleep(pause)


def remove_duplicates(client: BatchAPI, request: Dict[str, Any], *, keep: str) -> List[str]:
    """Terminate every job of this marked request but ``keep``; the ids terminated."""
    try:
        extras = [s["jobId"] for s in submission_jobs(client, request) if s["jobId"] != keep]
    except Exception as error:
        logger.warning("batchfutures: could not look for duplicates of job %s (%s): %s", keep,
                       request["jobName"], error)
        return []
    return _terminate(client, extras, keep)


def _terminate(client: BatchAPI, job_ids: List[str], kept: str) -> List[str]:
    done = []
    for job_id in job_ids:
        logger.warning("batchfutures: job %s duplicates job %s (an ambiguous SubmitJob was sent "
                       "again); terminating it", job_id, kept)
        try:
            call(client.terminate_job, jobId=job_id, reason=f"{DUPLICATE_REASON} {kept}")
            done.append(job_id)
        except Exception as error:
            logger.warning("batchfutures: could not terminate duplicate job %s: %s", job_id, error)
    return done


# -- reads --------------------------------------------------------------------------------------
# -- stopping jobs -------------------------------------------------------------------------------


class Stop(enum.Enum):
    """How a job is stopped: the client method of one job, and of up to 50 (its value, bulk)."""

    CANCEL = "cancel_job"        # what has not started fails; what runs goes on
    TERMINATE = "terminate_job"  # what runs is killed too

    @property
    def bulk(self) -> str:
        return self.value + "s"

    @property
    def verb(self) -> str:
        return self.name.lower()


class StopFailed(str):
    """Why a job was not stopped: the text callers log ("<code>: <message>"), with the error's
    ``code`` and ``message`` apart for those who decide on them (childstops.refused_alone)."""

    code: str
    message: str

    def __new__(cls, code: str, message: str) -> "StopFailed":
        text = super().__new__(cls, f"{code}: {message}" if code else message)
        text.code, text.message = code, message
        return text

    @classmethod
    def of(cls, error: BaseException) -> "StopFailed":
        """A whole call's failure (a ClientError's code and message; else the exception)."""
        if isinstance(error, ClientError):
            return cls(error_code(error), str(error.response.get("Error", {}).get("Message")
                                              or error))
        return cls("", str(error))


def stop_jobs(client: BatchAPI, how: Stop, job_ids: List[str], reason: str,
              **narrower: Any) -> Dict[str, StopFailed]:
    """CancelJob or TerminateJob (``how``) for each job,
    in calls of up to 50 jobs (CancelJobs / TerminateJobs) where the client has them,
    else one call per job; {job id: why} for the jobs that could not be stopped.

    The bulk calls answer 200 even when some jobs fail: their ``errors`` say which, and the
    jobs answered ThrottlingException or ServerException (`split_stop_errors`) are sent again,
    in one call, within the same retry budget as a whole call (`DEFAULT_BUDGET`).
    ``narrower``: `call`'s ``attempts``/``max_delay`` for each call (a Ctrl-C must not wait)."""
    failed: Dict[str, StopFailed] = {}
    # a boto3 client has a method for each operation of its botocore model (an older botocore:
    # none for the bulk calls); the emulator has them
    if hasattr(client, how.bulk):
        for start in range(0, len(job_ids), MAX_BULK_STOP):
            failed.update(_stop_chunk(getattr(client, how.bulk), job_ids[start:start + MAX_BULK_STOP],
                                      reason, **narrower))
        return failed
    for job_id in job_ids:
        try:
            call(getattr(client, how.value), jobId=job_id, reason=reason, **narrower)
        except Exception as error:
            failed[job_id] = StopFailed.of(error)
    return failed


# the codes of a bulk stop call's entries worth sending again (botocore's CancelJobsErrorDetail
# and TerminateJobsErrorDetail list ValidationException, ClientException, ThrottlingException,
# ServerException; TooManyRequestsException is the HTTP 429 code of the same condition)
RESEND_ITEM_CODES = THROTTLING_CODES | {"ServerException"}


def split_stop_errors(errors: List[Mapping[str, Any]]
                      ) -> "tuple[Dict[str, StopFailed], Dict[str, StopFailed]]":
    """The ``errors`` of a CancelJobs/TerminateJobs answer: ({job: why} to send again, in the
    answer's order; {job: why} refused for good)."""
    resend: Dict[str, StopFailed] = {}
    refused: Dict[str, StopFailed] = {}
    for item in errors:
        job, code = str(item.get("job")), str(item.get("code") or "")
        why = StopFailed(code, str(item.get("message")))
        if code in RESEND_ITEM_CODES:
            resend[job] = why
        else:
            refused[job] = why
    return resend, refused


def _stop_chunk(method: Callable[..., Dict[str, Any]], jobs: List[str], reason: str,
                **narrower: Any) -> Dict[str, StopFailed]:
    """One bulk stop call of up to 50 jobs, its throttled entries sent again; {job: why} of
    those not stopped."""
    budget = DEFAULT_BUDGET
    if narrower:
        budget = replace(budget, attempts=narrower.get("attempts", budget.attempts),
                         seconds=narrower.get("max_delay", budget.seconds))
    wait = wait_random_exponential(multiplier=budget.first_wait, max=budget.max_wait)
    deadline = time.monotonic() + budget.seconds
    failed: Dict[str, StopFailed] = {}
    pending = list(jobs)
    for attempt in range(1, budget.attempts + 1):
        try:
            answer = call(method, jobs=pending, reason=reason, **narrower)
        except Exception as error:
            failed.update((job_id, StopFailed.of(error)) for job_id in pending)
            return failed
        resend, refused = split_stop_errors(answer.get("errors") or [])
        failed.update(refused)
        if not resend:
            return failed
        pause = wait(_retry_state(attempt))
        if attempt == budget.attempts or time.monotonic() + pause > deadline:
            failed.update((job_id, StopFailed(why.code, f"{why.message} (sent {attempt} times)"))
                          for job_id, why in resend.items())
            return failed
        logger.debug("%s: %d job(s) answered throttled; sending them again", method.__name__,
                     len(resend))
        time.sleep(pause)
        pending = list(resend)
    return failed


def describe_jobs(client: BatchAPI, job_ids: List[str], *,
                  budget: RetryBudget = DEFAULT_BUDGET) -> List[Dict[str, Any]]:
    """DescribeJobs in batches of 100 (Batch's limit); ids Batch no longer knows are left out."""
    found: List[Dict[str, Any]] = []
    for start in range(0, len(job_ids), MAX_DESCRIBE_JOBS):
        response = call(client.describe_jobs, budget=budget,
                        jobs=job_ids[start:start + MAX_DESCRIBE_JOBS])
        found.extend(response.get("jobs", []))
    return found


def list_children(client: BatchAPI, job_id: str, status: str, *, multinode: bool = False,
                  budget: RetryBudget = DEFAULT_BUDGET,
                  max_pages: Optional[int] = None) -> Iterator[Dict[str, Any]]:
    """Every child of an array job (or node of a multi-node job) in one status, following
    nextToken (bounded: `paginate`, `PaginationError`)."""
    scope = "multiNodeJobId" if multinode else "arrayJobId"
    listing: Dict[str, Any] = {scope: job_id, "jobStatus": status, "maxResults": 1000}
    for response in paginate(client.list_jobs, budget=budget, max_pages=max_pages, **listing):
        yield from response.get("jobSummaryList", [])


def node_id(job_id: str, index: int) -> str:
    """Batch's id of node ``index`` of a multi-node parallel job."""
    return f"{job_id}#{index}"


def node_index(summary: Mapping[str, Any]) -> Optional[int]:
    """The node index of a node's JobSummary or JobDetail (nodeProperties, else its "#k" id)."""
    properties = summary.get("nodeProperties") or summary.get("nodeDetails") or {}
    if isinstance(properties.get("nodeIndex"), int):
        return properties["nodeIndex"]
    _, mark, tail = str(summary.get("jobId", "")).rpartition("#")
    return int(tail) if mark and tail.isdigit() else None
