"""``future.attempts`` and ``future.reclaims``: a call's Batch attempts as records (pure).

Read from DescribeJobs of the call's job (its array child): ``attempts`` lists the attempts that
ended, each with its container's exit code and reason and the attempt's statusReason; an attempt
running now is not among them (Batch lists it once it ended). A call resubmitted as a new Batch
job (an out-of-memory retry, a Spot fallback) keeps the attempts of its earlier jobs first.
"""

from __future__ import annotations

from typing import Any, List, Mapping, NamedTuple, Optional, Sequence

from .spot import is_reclaim

__all__ = ["Attempt", "attempts_from", "reclaims_in"]


class Attempt(NamedTuple):
    """One ended attempt: ``started``/``stopped`` (epoch seconds, None when Batch gave none),
    ``exit_code`` (None: the container never ran or its code is unknown), ``reason`` (the
    attempt's statusReason, else its container's reason), ``job_id`` (the Batch job it ran as)."""

    started: Optional[float]
    stopped: Optional[float]
    exit_code: Optional[int]
    reason: Optional[str]
    job_id: Optional[str] = None

    @property
    def reclaimed(self) -> bool:
        """Its host was taken back (a Spot reclaim, a lost EC2 host)."""
        return is_reclaim(self.reason)


def _seconds(milliseconds: Any) -> Optional[float]:
    return milliseconds / 1000.0 if isinstance(milliseconds, (int, float)) and milliseconds else None


def attempts_from(description: Mapping[str, Any]) -> List[Attempt]:
    """The ended attempts of one DescribeJobs entry, oldest first."""
    found = []
    for attempt in description.get("attempts") or ():
        container = attempt.get("container") or {}
        code = container.get("exitCode")
        found.append(Attempt(_seconds(attempt.get("startedAt")), _seconds(attempt.get("stoppedAt")),
                             code if isinstance(code, int) else None,
                             attempt.get("statusReason") or container.get("reason"),
                             description.get("jobId")))
    return found


def reclaims_in(attempts: Sequence[Attempt]) -> int:
    return sum(1 for attempt in attempts if attempt.reclaimed)
