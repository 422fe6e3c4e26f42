"""Spot reclaims: which attempt was one, how often a call was reclaimed, when to fall back (pure).

AWS's reasons (an attempt's statusReason, copied from the task's stoppedReason): Fargate Spot
"Your Spot Task was interrupted.", an EC2 host "Host EC2 (instance i-...) terminated." (the Batch
User Guide's job-retry examples match them with onStatusReason "Host EC2*"), both in
errors.HOST_LOST_PREFIXES. A draining host's task that never started is a start failure instead
(retrypolicy.START_FAILURE_PREFIXES).

    spot_attempts=k, on a Spot queue: the job is sent with at most k attempts; once the call
    was reclaimed k times (`reclaims`), its next attempt goes to the on-demand queue
    (`next_queue`: ``fallback_queue=``, else the stack's on-demand one), where its checkpoint
    (checkpoints.py, kept under the call's first job) is read again.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from .errors import HOST_LOST_PREFIXES

__all__ = ["is_reclaim", "reclaims", "next_queue", "SPOT_INTERRUPTED_REASON"]

SPOT_INTERRUPTED_REASON = "Your Spot Task was interrupted."
_RECLAIMED = tuple(prefix.lower() for prefix in HOST_LOST_PREFIXES)


def is_reclaim(reason: Optional[str]) -> bool:
    """Whether an attempt's statusReason says its host was taken back."""
    return bool(reason) and str(reason).strip().lower().startswith(_RECLAIMED)


def reclaims(attempts: Iterable[Mapping[str, Any]]) -> int:
    """How many of a job's attempts (DescribeJobs' ``attempts``) were reclaimed."""
    return sum(1 for attempt in attempts if is_reclaim(attempt.get("statusReason")))


def next_queue(reclaimed: int, spot_attempts: Optional[int], queue: str,
               fallback: Optional[str]) -> Optional[str]:
    """The queue of a reclaimed call's next attempt: ``fallback`` once it was reclaimed
    ``spot_attempts`` times (and there is one, and it is another queue), else None (Batch's own
    retries keep it where it is, or it failed)."""
    if not spot_attempts or not fallback or fallback == queue:
        return None
    return fallback if reclaimed >= spot_attempts else None
