"""``future.attempts`` and ``future.reclaims``: a call's Batch attempts as records (pure).

Read from DescribeJobs of the call's job (its array child): ``attempts`` lists the attempts that
ended, each with its container's exit code and reason and the attempt's statusReason; an attempt
running now is not among them (Batch lists it once it ended). A call resubmitted as a new Batch
job (an out-of-memory retry, a Spot fallback) keeps the attempts of its earlier jobs first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Mapping, NamedTuple, Optional, Sequence

from .spot import is_reclaim

if TYPE_CHECKING:
    from .batchapi import BatchAPI

__all__ = ["Attempt", "attempts_from", "reclaims_in", "AttemptsReader"]


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


_ENDED = ("SUCCEEDED", "FAILED")


class AttemptsReader:
    """``future.attempts`` of one Batch job's children: DescribeJobs of the child when asked,
    kept once the child ended (its attempts no longer change)."""

    def __init__(self, batch: BatchAPI, job_id: str, array: bool,
                 earlier: Optional[Sequence[Sequence[Attempt]]] = None) -> None:
        """``earlier``: per child, its attempts in the jobs it ran in before this one (a Spot
        fallback's), listed first."""
        self._batch, self._job_id, self._array = batch, job_id, array
        self._earlier = [list(attempts) for attempts in earlier or ()]
        self._ended: Dict[int, List[Attempt]] = {}

    def __call__(self, child: int) -> List[Attempt]:
        before = self._earlier[child] if child < len(self._earlier) else []
        return before + self._read(child)

    def _read(self, child: int) -> List[Attempt]:
        if child in self._ended:
            return list(self._ended[child])
        # start-up: batchapi costs ~5 ms on a warm worker's start (warmwire imports this module
        # for Attempt), which never reads attempts from Batch
        from . import batchapi

        job_id = f"{self._job_id}:{child}" if self._array else self._job_id
        described = batchapi.call(self._batch.describe_jobs, jobs=[job_id]).get("jobs") or []
        if not described:
            return []
        attempts = attempts_from(described[0])
        if described[0].get("status") in _ENDED:
            self._ended[child] = attempts
        return list(attempts)
