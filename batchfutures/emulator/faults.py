"""AWS's harshness on demand: lag, throttling, server errors, lost replies and lost hosts.

    FaultProfile(...)                  what to inject; all off by default (the kind emulator)
    FaultInjector(profile)             decides call by call and attempt by attempt, from seeded
                                       random streams (one per kind of fault), so a test with a
                                       seed sees the same faults every run
      .maybe_raise(operation, params)  raise 429 TooManyRequestsException or 500 ServerException
                                       (first the account budget: one TokenBucket per injector,
                                       i.e. per emulator, shared by every Batch operation and
                                       every client; `over_budget` counts the calls it refused)
      .item_fault(operation, job)      None, or (code, message) for one entry of a bulk
                                       CancelJobs / TerminateJobs: that job is left as it is and
                                       the answer's `errors` names it (item_throttle_rate; an
                                       array child's AccessDenied: child_stops_refused, which
                                       also makes maybe_raise refuse CancelJob/TerminateJob of
                                       a child: 403 AccessDeniedException)
      .reply_lost(operation)           True: act on the call (SubmitJob did create the job),
                                       then answer 500, as when AWS's reply is lost
      .host_loss_delay()               None, or seconds after RUNNING at which the attempt's host
                                       goes: killed, reason `Host EC2 (instance i-...) terminated.`
      .spot_reclaim(queue, ...)        None, or (seconds after RUNNING, platform) at which Spot
                                       reclaims the attempt: SIGTERM, SIGKILL `spot_notice` s
                                       later, reason `Your Spot Task was interrupted.` (Fargate
                                       Spot) or `Host EC2 (instance i-...) terminated.` (EC2 Spot)
      .summary_lag_ms                  an array parent's statusSummary is refreshed at most this
                                       often (statusSummaryLastUpdatedAt says when it was)
      .hide_new(operation, response)   DescribeJobs / ListJobs leave out jobs created less than
                                       describe_lag / list_lag seconds ago (AWS's eventual
                                       consistency after SubmitJob)

`BatchEmulator(folder, faults=FaultProfile(...))` sets a profile per instance;
`emulator.set_faults(profile)` changes it; `emulator.inject_faults(rate, code=..., operations=...,
seed=...)` is the older one-code form (it sets `throttle_rate` or `server_error_rate`). The
HTTP endpoint takes the same as flags of `python -m batchfutures.emulator` (see __main__.py).
"""

from __future__ import annotations

import dataclasses
import math
import random
import threading
import time
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from ..budget import TokenBucket  # one definition: the client's request budget is one too
from .model import client_error

THROTTLED = "TooManyRequestsException"
SERVER_ERROR = "ServerException"
ITEM_THROTTLED = "ThrottlingException"  # the code of a bulk stop call's entry (botocore's model)
# the IAM action each stop operation is authorized as (the SAR: CancelJobs is batch:CancelJob)
_STOP_ACTION_OF = {"CancelJob": "CancelJob", "CancelJobs": "CancelJob",
                   "TerminateJob": "TerminateJob", "TerminateJobs": "TerminateJob"}
_STOP_ACTIONS = frozenset(_STOP_ACTION_OF.values())
SPOT_NOTICE = 120.0  # seconds between Spot's interruption notice (SIGTERM) and the end
SPOT_PLATFORMS = ("SPOT", "FARGATE_SPOT")
CHILD_REFUSED = "AccessDeniedException"  # one call refused by IAM
ITEM_REFUSED = "AccessDenied"  # one entry of a bulk stop call (botocore's *JobsErrorDetail)
# CloudWatch Logs is another service, with its own quotas: not Batch's account budget
_NOT_BATCH = frozenset({"GetLogEvents", "FilterLogEvents", "DescribeLogStreams", "DescribeLogGroups"})


def admitted(rate: float, burst: float, times: Sequence[float]) -> List[bool]:
    """Which of the calls made at `times` (seconds, ascending) a fresh bucket lets through."""
    bucket = TokenBucket(rate, burst, times[0] if times else 0.0)
    return [bucket.take(t) for t in times]


@dataclasses.dataclass(frozen=True)
class FaultProfile:
    """What the emulator does to its callers and jobs; the defaults inject nothing."""

    summary_lag: float = 0.0         # seconds between refreshes of an array's statusSummary
    throttle_rate: float = 0.0       # fraction of API calls answered 429 TooManyRequestsException
    server_error_rate: float = 0.0   # fraction answered 500 ServerException (nothing done)
    lost_reply_rate: float = 0.0     # fraction of SubmitJob calls that create the job, then 500
    host_loss_rate: float = 0.0      # fraction of attempts whose host is lost while RUNNING
    host_loss_after: float = 0.5     # at most this many seconds after RUNNING (uniform)
    operations: Optional[FrozenSet[str]] = None  # throttle/5xx only these ("DescribeJobs"...)
    seed: Optional[int] = None
    # the account's API budget (AWS: 50 calls a second per account and Region, every Batch
    # operation together): calls over it get 429; 0 is no budget. The burst defaults to a
    # second's worth (at least 1 call).
    account_tps: float = 0.0
    account_burst: Optional[float] = None
    # seconds a new job stays out of DescribeJobs / ListJobs answers (AWS is eventually
    # consistent after SubmitJob)
    describe_lag: float = 0.0
    list_lag: float = 0.0
    # fraction of the jobs of a bulk CancelJobs / TerminateJobs answered, in the 200 answer's
    # `errors`, ThrottlingException (the job is not stopped; Batch reports each job apart)
    item_throttle_rate: float = 0.0
    # IAM actions ("CancelJob", "TerminateJob") refused on an array child (`<id>:<index>`), as a
    # policy that allows them only on tagged jobs may on AWS (a child has no tags of its own:
    # childstops.py): CancelJob/TerminateJob answer 403 AccessDeniedException, an entry of
    # CancelJobs/TerminateJobs (authorized as the same action) code AccessDenied; the child is
    # left as it is. The whole job (the parent) is stopped as usual. The emulator checks no IAM
    # otherwise: by default every caller may stop anything.
    child_stops_refused: FrozenSet[str] = frozenset()
    # Spot reclaims: fraction of attempts (of the queues in `spot_queues`, None: every queue,
    # and never on a created on-demand compute environment) whose capacity Spot takes back
    # `spot_reclaim_after` seconds after RUNNING: SIGTERM, then SIGKILL `spot_notice`
    # seconds later (AWS: the two-minute interruption notice), the attempt ending with the
    # reason of `spot_platform` (SPOT: "Host EC2 (instance i-...) terminated.", FARGATE_SPOT:
    # "Your Spot Task was interrupted."; a created Spot environment's own type wins)
    spot_reclaim_rate: float = 0.0
    spot_reclaim_after: float = 1.0
    spot_notice: float = SPOT_NOTICE
    spot_platform: str = "FARGATE_SPOT"
    spot_queues: Optional[FrozenSet[str]] = None

    def __post_init__(self) -> None:
        if self.spot_platform not in SPOT_PLATFORMS:
            raise ValueError(f"spot_platform={self.spot_platform!r} must be one of {SPOT_PLATFORMS}")
        if self.spot_queues is not None and not isinstance(self.spot_queues, frozenset):
            object.__setattr__(self, "spot_queues", frozenset(self.spot_queues))
        for name in ("throttle_rate", "server_error_rate", "lost_reply_rate", "host_loss_rate",
                     "item_throttle_rate", "spot_reclaim_rate"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"{name}={value!r} must be between 0 and 1")
        for name in ("summary_lag", "host_loss_after", "account_tps", "describe_lag", "list_lag",
                     "spot_reclaim_after", "spot_notice"):
            if not getattr(self, name) >= 0 or math.isinf(getattr(self, name)):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a finite number >= 0")
        if self.account_burst is not None and not 1 <= self.account_burst < math.inf:
            raise ValueError(f"account_burst={self.account_burst!r} must be at least 1")
        if self.operations is not None and not isinstance(self.operations, frozenset):
            object.__setattr__(self, "operations", frozenset(self.operations))
        refused = frozenset(self.child_stops_refused)
        if not refused <= _STOP_ACTIONS:
            raise ValueError(f"child_stops_refused={sorted(refused)!r}: only "
                             f"{sorted(_STOP_ACTIONS)} are stop actions")
        object.__setattr__(self, "child_stops_refused", refused)


class FaultInjector:
    """Applies a FaultProfile; `injected` counts the API faults so far (tests read it), of which
    `over_budget` were calls over the account budget."""

    def __init__(self, profile: Optional[FaultProfile] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self.injected = 0
        self.over_budget = 0
        self.hosts_lost = 0
        self.spot_reclaims = 0
        self.refused = 0  # child stops refused (child_stops_refused), not counted in injected
        self._code: Optional[str] = None  # a throttling code other than Batch's (inject_faults)
        self.set(profile or FaultProfile())

    def set(self, profile: FaultProfile) -> None:
        with self._lock:
            self.profile = profile
            seed = profile.seed
            # one stream per kind: how many calls were made does not shift which attempts fail
            self._calls = random.Random(None if seed is None else f"{seed}/calls")
            self._replies = random.Random(None if seed is None else f"{seed}/replies")
            self._hosts = random.Random(None if seed is None else f"{seed}/hosts")
            self._items = random.Random(None if seed is None else f"{seed}/items")
            self._spot = random.Random(None if seed is None else f"{seed}/spot")
            self._budget: Optional[TokenBucket] = None
            if profile.account_tps:
                burst = profile.account_burst or max(1.0, profile.account_tps)
                self._budget = TokenBucket(profile.account_tps, burst, self._clock())

    # the older form: one error code at one rate
    def configure(self, rate: float, *, code: str = THROTTLED,
                  operations: Optional[Iterable[str]] = None, seed: Optional[int] = None) -> None:
        throttle = code != SERVER_ERROR
        base = self.profile
        self.set(dataclasses.replace(
            base, throttle_rate=rate if throttle else 0.0,
            server_error_rate=0.0 if throttle else rate,
            operations=frozenset(operations) if operations is not None else None,
            seed=seed if seed is not None else base.seed))
        self._code = code if throttle and code != THROTTLED else None

    @property
    def summary_lag_ms(self) -> int:
        return int(self.profile.summary_lag * 1000)

    def _applies(self, operation: str) -> bool:
        operations = self.profile.operations
        return operations is None or operation in operations

    def maybe_raise(self, operation: str, params: Optional[Dict[str, Any]] = None) -> None:
        """Raise the ClientError of a throttled, failed or refused call of `operation` (its
        request ``params``: a child's CancelJob/TerminateJob, `child_stops_refused`), or return."""
        job_id = str((params or {}).get("jobId") or "")
        if operation in ("CancelJob", "TerminateJob") and self._child_stop_refused(operation,
                                                                                   job_id):
            raise client_error(self._refusal(operation, job_id), CHILD_REFUSED, 403, operation)
        with self._lock:
            profile = self.profile
            if (self._budget is not None and operation not in _NOT_BATCH
                    and not self._budget.take(self._clock())):
                self.injected += 1
                self.over_budget += 1
                raise client_error(f"Too Many Requests (over the account's API budget of "
                                   f"{profile.account_tps:g} calls a second, in {operation})",
                                   THROTTLED, 429, operation)
            if not (profile.throttle_rate or profile.server_error_rate) or not self._applies(operation):
                return
            draw = self._calls.random()
            if draw < profile.throttle_rate:
                code, status, message = self._code or THROTTLED, 429, "Too Many Requests"
            elif draw < profile.throttle_rate + profile.server_error_rate:
                code, status, message = SERVER_ERROR, 500, "Internal Server Error"
            else:
                return
            self.injected += 1
        if code not in (THROTTLED, SERVER_ERROR):  # a code given to inject_faults
            status = {"ClientException": 400}.get(code, 429)
        raise client_error(f"{message} (fault injected into {operation})", code, status, operation)

    def _child_stop_refused(self, operation: str, job_id: str) -> bool:
        action = _STOP_ACTION_OF.get(operation)
        if ":" not in job_id or action not in self.profile.child_stops_refused:
            return False
        with self._lock:
            self.refused += 1
        return True

    @staticmethod
    def _refusal(operation: str, job_id: str) -> str:
        action = _STOP_ACTION_OF[operation]
        return (f"User is not authorized to perform: batch:{action} on resource: job {job_id} "
                f"(fault injected: child_stops_refused; an array child carries no tags)")

    def item_fault(self, operation: str, job_id: str = "") -> Optional[Tuple[str, str]]:
        """(code, message) for one job of a bulk stop call that is left undone, or None."""
        if self._child_stop_refused(operation, job_id):
            return ITEM_REFUSED, self._refusal(operation, job_id)
        with self._lock:
            rate = self.profile.item_throttle_rate
            if not rate or not self._applies(operation) or self._items.random() >= rate:
                return None
            self.injected += 1
        return ITEM_THROTTLED, f"Rate exceeded (fault injected into {operation})"

    def reply_lost(self, operation: str) -> bool:
        """Whether this call, already done, answers 500 as if its reply had been lost."""
        with self._lock:
            if not self.profile.lost_reply_rate or self._replies.random() >= self.profile.lost_reply_rate:
                return False
            self.injected += 1
            return True

    def lost_reply_error(self, operation: str) -> Exception:
        return client_error(f"Internal Server Error (fault injected into {operation}: the call "
                            "took effect, its reply was lost)", SERVER_ERROR, 500, operation)

    def hide_new(self, operation: str, response: Dict[str, Any]) -> Dict[str, Any]:
        """``response`` without the jobs too new to be seen yet (describe_lag, list_lag)."""
        lag, key = {"DescribeJobs": (self.profile.describe_lag, "jobs"),
                    "ListJobs": (self.profile.list_lag, "jobSummaryList")}.get(operation, (0.0, ""))
        if not lag:
            return response
        newest = time.time() * 1000 - lag * 1000  # createdAt is in epoch milliseconds
        shown = [job for job in response.get(key) or [] if (job.get("createdAt") or 0) <= newest]
        return {**response, key: shown}

    def host_loss_delay(self) -> Optional[float]:
        with self._lock:
            profile = self.profile
            if not profile.host_loss_rate or self._hosts.random() >= profile.host_loss_rate:
                return None
            self.hosts_lost += 1
            return self._hosts.uniform(0, profile.host_loss_after)

    def spot_reclaim(self, queue: str, spot_type: Optional[str],
                     on_demand: bool) -> Optional[Tuple[float, str]]:
        """(seconds after RUNNING, SPOT or FARGATE_SPOT) when Spot reclaims this attempt, or
        None. `spot_type`: its compute environment's Spot type (None: not a Spot environment);
        `on_demand`: a created environment of on-demand capacity, which is never reclaimed."""
        with self._lock:
            profile = self.profile
            if not profile.spot_reclaim_rate or on_demand:
                return None
            if profile.spot_queues is not None and queue not in profile.spot_queues:
                return None
            if self._spot.random() >= profile.spot_reclaim_rate:
                return None
            self.spot_reclaims += 1
            return profile.spot_reclaim_after, spot_type or profile.spot_platform

    @property
    def spot_notice(self) -> float:
        return self.profile.spot_notice
