"""Spot reclaims: which attempt was one, how often a call was reclaimed, when to fall back (pure).

AWS's reasons (an attempt's statusReason, copied from the task's stoppedReason): Fargate Spot
"Your Spot Task was interrupted.", an EC2 host "Host EC2 (instance i-...) terminated." (the Batch
User Guide's job-retry examples match them with onStatusReason "Host EC2*"), both in
errors.HOST_LOST_PREFIXES. A draining host's task that never started is a start failure instead
(retrypolicy.START_FAILURE_PREFIXES).

    spot_attempts=k, on a Spot queue: the job is sent with at most k attempts; once the call
    was reclaimed k times (`reclaims`), its next attempt goes to the on-demand queue
    (`next_queue`: ``fallback_queue=``, else the environment's ``fallback_queue``: the stack's
    on-demand-only ``<stack>-multinode`` queue when the job queue is its ``<stack>-ec2`` one),
    where its checkpoint (checkpoints.py, kept under the call's first job) is read again.
    spot_attempts with neither is refused when the settings are made (`check_fallback`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

from .errors import HOST_LOST_PREFIXES, ConfigurationError, HostTerminatedError

logger = logging.getLogger("batchfutures")

__all__ = ["is_reclaim", "reclaims", "next_queue", "SPOT_INTERRUPTED_REASON", "SpotFallback",
           "check_fallback"]

SPOT_INTERRUPTED_REASON = "Your Spot Task was interrupted."
_RECLAIMED = tuple(prefix.lower() for prefix in HOST_LOST_PREFIXES)


def is_reclaim(reason: Optional[str]) -> bool:
    """Whether an attempt's statusReason says its host was taken back."""
    return bool(reason) and str(reason).strip().lower().startswith(_RECLAIMED)


def reclaims(attempts: Iterable[Mapping[str, Any]]) -> int:
    """How many of a job's attempts (DescribeJobs' ``attempts``) were reclaimed."""
    return sum(1 for attempt in attempts if is_reclaim(attempt.get("statusReason")))


def check_fallback(spot_attempts: int, fallback_queue: Optional[str],
                   environment_fallback: Optional[str]) -> None:
    """Refuse ``spot_attempts`` when a reclaimed call would have nowhere to go: neither
    ``fallback_queue=`` nor the environment's own on-demand queue."""
    if spot_attempts and not (fallback_queue or environment_fallback):
        raise ConfigurationError(
            f"spot_attempts={spot_attempts} needs an on-demand job queue to send a reclaimed call "
            f"to: pass fallback_queue='<job queue name or ARN>' (the batchfutures stack's "
            f"<stack>-multinode queue is used by itself when the job queue is its <stack>-ec2 "
            f"queue and stack= / BATCHFUTURES_STACK is set)")


def next_queue(reclaimed: int, spot_attempts: Optional[int], queue: str,
               fallback: Optional[str]) -> Optional[str]:
    """The queue of a reclaimed call's next attempt: ``fallback`` once it was reclaimed
    ``spot_attempts`` times (and there is one, and it is another queue), else None (Batch's own
    retries keep it where it is, or it failed)."""
    if not spot_attempts or not fallback or fallback == queue:
        return None
    return fallback if reclaimed >= spot_attempts else None


class SpotFallback:
    """A TrackedJob's ``retry`` when its settings have ``spot_attempts``: a child Batch failed
    after its host was taken back ``spot_attempts`` times goes to ``fallback`` (one new Batch job
    of those children, sent by ``resubmit(job, children, queue, earlier_attempts)``); any other
    failure is ``inner``'s to decide (an oomretry.OomRetry under retry_on_oom), else fails as
    usual. Called on the poller thread only (TrackedJob.apply)."""

    def __init__(self, spot_attempts: int, queue: str, fallback: Optional[str],
                 resubmit: Callable[..., Any], inner: Any = None) -> None:
        self.spot_attempts, self.queue, self.fallback = spot_attempts, queue, fallback
        self._resubmit, self.inner = resubmit, inner

    # what TrackedJob and the poller ask of a job's retry: the inner one's, when there is one
    @property
    def raised(self) -> bool:
        return bool(self.inner is not None and self.inner.raised)

    @property
    def history(self) -> Dict[int, Any]:
        return self.inner.history if self.inner is not None else {}

    def unplaceable_error(self, index: int, memory_mib: Optional[int], reason: str) -> BaseException:
        assert self.inner is not None  # only asked for children in ``history``
        return self.inner.unplaceable_error(index, memory_mib, reason)

    def decide(self, job: Any, errors: Mapping[int, BaseException]) -> Dict[int, Optional[BaseException]]:
        """None for each child sent to the fallback queue (its futures now belong to the new
        job); the inner retry's verdicts for the others."""
        moving: Dict[int, List[Any]] = {}
        for index, error in sorted(errors.items()):
            if not isinstance(error, HostTerminatedError):
                continue
            attempts = job.attempts_of(index)
            reclaimed = sum(1 for attempt in attempts if attempt.reclaimed)
            if next_queue(reclaimed, self.spot_attempts, self.queue, self.fallback):
                moving[index] = attempts
        decided: Dict[int, Optional[BaseException]] = {}
        if self.inner is not None:
            rest = {i: e for i, e in errors.items() if i not in moving}
            decided.update(self.inner.decide(job, rest) if rest else {})
        if moving:
            assert self.fallback is not None
            try:
                self._resubmit(job, sorted(moving), self.fallback,
                               [moving[i] for i in sorted(moving)])
            except Exception as failure:  # they fail as usual, with their reclaim
                logger.warning("batchfutures: could not send %d reclaimed child(ren) of %s to %s: "
                               "%s", len(moving), job.job_id, self.fallback, failure)
            else:
                decided.update({index: None for index in moving})
        return decided
