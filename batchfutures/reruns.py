"""A dependent call whose upstream was retried runs again, reading the retry's result.

    upstream child killed for memory ─> retry_on_oom resubmits it (a new Batch job; its futures
    (or reclaimed spot_attempts times:  are re-bound to it and resolve from it)
     spot.SpotFallback, on demand)
    Batch: the dependent child, dependsOn the killed one, FAILS "Dependent Job failed"
      └─> TrackedJob.apply: a DependencyFailedError while an upstream future has not failed
          (`wants_rerun`) ─> the child WAITS: not polled, its futures open, its job tracked
    each poll, TrackedJob.ready_reruns() ─> `plan(each open item's upstream futures)` (pure):
          wait           an upstream future is still pending (its retry runs)
          failed items   an upstream failed after all: DependencyFailedError, __cause__ its error
          rerun          the rest: Submitter.rerun ─> one new Batch job of those children with
                         no dependsOn (every upstream is done); its header names the first job's
                         inputs ("sources", nothing is uploaded again) and "redirects": each
                         upstream child's first location ─> where its result is now, which the
                         worker's dependencies.Resolver follows.

A rerun has no dependsOn, so Batch cannot fail it for a dependency again: one rerun per upstream
retry at most. Without retry_on_oom or spot_attempts upstream, a failed dependency fails the
dependents as before. (Batch's own retries of an attempt, `retries=` and `Retries`, keep the job:
its dependents just wait.)
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from .errors import DependencyFailedError

__all__ = ["Plan", "plan", "wants_rerun", "redirects_of", "dependency_error"]


@dataclass(frozen=True)
class Plan:
    """What to do now with a waiting child's open items (by their position among them)."""

    wait: bool = False
    failed: Mapping[int, BaseException] = field(default_factory=dict)  # position -> upstream error
    rerun: bool = False  # run the child again (its items not in ``failed``)


def _failure(future: concurrent.futures.Future) -> Any:
    if future.cancelled():
        return concurrent.futures.CancelledError(f"an upstream call was cancelled: {future!r}")
    return future.exception()


def plan(upstreams: Sequence[Sequence[concurrent.futures.Future]]) -> Plan:
    """``upstreams``: per open item of the child, the futures it was given as arguments."""
    if any(not u.done() for ups in upstreams for u in ups):
        return Plan(wait=True)
    failed: Dict[int, BaseException] = {}
    for position, ups in enumerate(upstreams):
        for upstream in ups:
            error = _failure(upstream)
            if error is not None:
                failed[position] = error
                break
    return Plan(failed=failed, rerun=len(failed) < len(upstreams))


def wants_rerun(error: BaseException, futures: Sequence[Any]) -> bool:
    """A child failed with ``error``: is it a dependency failure that a rerun may cure?

    Yes when Batch failed it for a dependency while one of its open items' upstream futures has
    not failed: that upstream was resubmitted (retry_on_oom) and may yet succeed.
    """
    if not isinstance(error, DependencyFailedError):
        return False
    for future in futures:
        if future.done():
            continue
        for upstream in getattr(future, "_upstream", None) or ():
            if not upstream.done() or _failure(upstream) is None:
                return True
    return False


def dependency_error(upstream: BaseException, job_id: str) -> DependencyFailedError:
    """The error of a waiting item whose upstream finally failed."""
    error = DependencyFailedError(
        f"Batch job {job_id} did not run: a future passed to it as an argument failed: "
        f"{upstream!r}", job_id=job_id, status_reason="a dependency failed")
    error.__cause__ = upstream
    return error


def redirects_of(futures: Sequence[Any]) -> List[Tuple[str, int, str, int]]:
    """(first job_url, child, current job_url, child) of every upstream of these futures that
    moved (resubmitted since its FutureRef was made), sorted and without repeats."""
    moved = set()
    for future in futures:
        pairs = zip(getattr(future, "_upstream", None) or (),
                    getattr(future, "_upstream_at", None) or ())
        for upstream, (first_url, first_child) in pairs:
            bound = upstream._bound()
            if bound is None:
                continue
            now = (bound.job.job_url, bound.child)
            if now != (first_url, first_child):
                moved.add((first_url, first_child) + now)
    return sorted(moved)
