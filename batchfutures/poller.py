"""The one polling thread that resolves every future of an executor (and its views).

    Session.track(job) ──> Poller._jobs ──┐
                                          v
    every interval (or when the emulator says a job changed):
      DescribeJobs, 100 ids per call, outstanding jobs only ─> status, statusSummary
        plain job  SUCCEEDED ─> GET results/0 ─> settle its futures
        array job  counts changed?
                     STARTING/RUNNING grew ─> ListJobs(arrayJobId, status) ─> futures running
                     SUCCEEDED grew      ─> which children: all waiting ones, or those that left
                                            STARTING/RUNNING, else ListJobs(SUCCEEDED)
                                            ─> GET each new result ─> settle
                     FAILED grew         ─> ListJobs(FAILED) ─> DescribeJobs(children) ─> typed errors
        job FAILED                       ─> typed error from its last attempt (errors.classify_failure)
        job unknown past the grace period ─> results in storage, else JobMetadataExpired

The call budget grows with Batch jobs, not items: one DescribeJobs per 100 outstanding jobs per
poll; listings only when an array's counts changed; one GET per finished child and no storage
listing (storage is listed only for a job Batch has forgotten). The interval is
short right after a change and backs off to a cap while nothing changes. Errors never kill the
thread: a failed poll is logged and tried again at the next tick (batchapi retries throttling).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Set, Tuple

from . import batchapi
from .errors import IntegrityError, JobMetadataExpired, RemoteError, classify_failure
from .jobs import ACTIVE, TERMINAL, TrackedJob

if TYPE_CHECKING:  # pragma: no cover
    from .session import Session

logger = logging.getLogger("batchfutures")

# Failed children whose log tail is fetched for the error message (the rest go without one).
LOG_TAILS_PER_POLL = 20
LOG_TAIL_LINES = 20


class Poller:
    """Resolves the futures of every tracked job from Batch and from storage."""

    def __init__(self, session: "Session", *, min_interval: float, max_interval: float,
                 grace: float) -> None:
        self._session = session
        self._min_interval = min_interval
        self._max_interval = max_interval
        self._grace = grace
        self._jobs: Dict[str, TrackedJob] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._stopping = False
        self.polls = 0  # rounds that described at least one job (for tests and benchmarks)

    # -- control -----------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                self._thread = threading.Thread(target=self._run, name="batchfutures-poller",
                                                daemon=True)
                self._thread.start()

    def track(self, job: TrackedJob) -> None:
        with self._lock:
            self._jobs[job.job_id] = job
        self.start()
        self.wake()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, wait: bool = True) -> None:
        """Stop once no job is outstanding (the thread drains what it tracks first)."""
        self._stopping = True
        self.wake()
        thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    @property
    def outstanding(self) -> List[TrackedJob]:
        with self._lock:
            return list(self._jobs.values())

    # -- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        interval = self._min_interval
        while True:
            self._wake.clear()
            changed = False
            try:
                self._session.flush_due()
                self._session.send_cancellations()
                changed = self.poll_once()
            except Exception:  # never let one bad poll strand every future
                logger.exception("batchfutures poller: poll failed; trying again")
            with self._lock:
                idle = not self._jobs
            if idle and self._stopping and not self._session.has_pending():
                self._session.send_cancellations()
                return
            interval = self._min_interval if changed else min(interval * 2, self._max_interval)
            delay = min(interval, self._session.next_flush_delay())
            self._wake.wait(max(delay, 0.0))

    def poll_once(self) -> bool:
        """One round over every outstanding job; True when anything changed."""
        jobs = self.outstanding
        for job in jobs:
            job.drop_settled()
        self._forget([job for job in jobs if job.done])
        active = [job for job in jobs if not job.done]
        if not active:
            return False
        self.polls += 1
        client = self._session.env.batch
        found = {d["jobId"]: d for d in batchapi.describe_jobs(client, [j.job_id for j in active])}
        changed = False
        for job in active:
            description = found.get(job.job_id)
            try:
                if description is None:
                    changed |= self._missing(job)
                elif job.array:
                    changed |= self._update_array(job, description)
                else:
                    changed |= self._update_plain(job, description)
            except Exception:
                logger.exception("batchfutures poller: could not update job %s", job.job_id)
        self._forget([job for job in active if job.done])
        return changed

    def _forget(self, jobs: Iterable[TrackedJob]) -> None:
        with self._lock:
            for job in jobs:
                self._jobs.pop(job.job_id, None)

    # -- plain jobs --------------------------------------------------------------------------
    def _update_plain(self, job: TrackedJob, description: Dict[str, Any]) -> bool:
        status = description.get("status")
        changed = status != job.status
        job.status = status
        container = _last_container(description)
        job.set_status(0, status, description.get("statusReason"), container.get("exitCode"))
        if status == "SUCCEEDED":
            self._settle_from_results(job, [0])
            changed = True
        elif status == "FAILED":
            self._fail_children(job, {0: description})
            changed = True
        return changed

    # -- array jobs --------------------------------------------------------------------------
    def _update_array(self, job: TrackedJob, description: Dict[str, Any]) -> bool:
        status = description.get("status")
        summary = dict((description.get("arrayProperties") or {}).get("statusSummary") or {})
        previous, previous_status = job.summary, job.status
        if summary == previous and status == previous_status:
            return False
        job.summary, job.status = summary, status
        client = self._session.env.batch

        # When SUCCEEDED grew, every active child is listed (not only changed counts): those that
        # were active and no longer are tell which children finished, without listing SUCCEEDED.
        succeeded_grew = summary.get("SUCCEEDED", 0) > job.succeeded
        listed: Set[int] = set()
        for active in ACTIVE:
            if summary.get(active, 0) and (succeeded_grew or summary.get(active) != previous.get(active)):
                for index in self._list_children(client, job, active):
                    job.set_status(index, active)
                    listed.add(index)
        default = job.default_child_status()
        for index in job.unresolved - listed - job.started:
            job.set_status(index, default)

        terminal = status in TERMINAL
        if summary.get("FAILED", 0) > previous.get("FAILED", 0) or (terminal and job.unresolved):
            failed = [i for i in self._list_children(client, job, "FAILED")
                      if i in job.unresolved and i not in job.failed_seen]
            if failed:
                children = batchapi.describe_jobs(client, [job.child_id(i) for i in failed])
                by_index = {job.child_index(d["jobId"]): d for d in children}
                self._fail_children(job, by_index)
        if succeeded_grew or (terminal and job.unresolved):
            indices, confirmed = self._newly_succeeded(client, job, summary, terminal, listed)
            self._settle_from_results(job, indices, confirmed=confirmed)
        return True

    def _newly_succeeded(self, client: Any, job: TrackedJob, summary: Dict[str, int],
                         terminal: bool, active_now: Set[int]) -> Tuple[List[int], bool]:
        """The waiting children that succeeded, whose result objects are to be read.

        Batch names them, not storage: an S3 LIST per poll would cost requests (and money) that
        grow with polls times children. In order of cost:
        - every child finished (the failed ones were just taken out): the waiting ones succeeded;
        - as many children newly succeeded as are still waiting: every one of them did, most
          likely (unconfirmed, as below);
        - as many newly succeeded as children that were seen active and are no longer (the
          active ones were just listed): those are they, most likely (a child that failed just
          after DescribeJobs looks the same, so a missing result here is not yet a failure:
          ``confirmed`` is False);
        - else ListJobs(SUCCEEDED), whose pages grow with the children that succeeded so far.
        """
        waiting = job.unresolved - job.failed_seen
        succeeded = summary.get("SUCCEEDED", 0)
        if terminal or succeeded + summary.get("FAILED", 0) >= job.size:
            # every child has finished, and the failed ones were taken out just before
            return sorted(waiting), True
        newly = succeeded - job.succeeded
        if newly == len(waiting):
            # unconfirmed: a child whose futures were cancelled may have succeeded too and be
            # counted here in place of one still running
            return sorted(waiting), False
        left = (job.started & waiting) - active_now
        if left and newly == len(left):
            return sorted(left), False
        found = self._list_children(client, job, "SUCCEEDED")
        return sorted(i for i in found if i in waiting), True

    def _list_children(self, client: Any, job: TrackedJob, status: str) -> List[int]:
        indices = []
        for summary in batchapi.list_children(client, job.job_id, status):
            index = (summary.get("arrayProperties") or {}).get("index")
            if index is None:
                index = job.child_index(summary.get("jobId", ""))
            if index is not None and 0 <= index < job.size:
                indices.append(index)
        return indices

    # -- outcomes ----------------------------------------------------------------------------
    def _settle_from_results(self, job: TrackedJob, indices: List[int], *,
                             confirmed: bool = True) -> None:
        """Read the result objects of children that succeeded and settle their futures.

        One GET per child. A child Batch ``confirmed`` succeeded but that wrote no result fails;
        an unconfirmed one without a result is left waiting.
        """
        storage = self._session.storage
        for index in indices:
            if index not in job.unresolved:
                continue
            try:
                data = storage.read_result(job.job_url, index)
            except IntegrityError as refused:  # forged or altered: fail it, unpickling nothing
                job.succeeded += 1
                job.set_status(index, "SUCCEEDED")
                job.fail_child(index, lambda refused=refused: IntegrityError(str(refused)))
                continue
            if data is None and not confirmed:
                continue
            job.succeeded += 1
            job.set_status(index, "SUCCEEDED")
            if data is None:
                child_id = job.child_id(index)
                job.fail_child(index, lambda child_id=child_id: RemoteError(
                    f"Batch job {child_id} succeeded but wrote no result: the process ended before "
                    f"the worker finished (for example os._exit(0) in the function)."))
                continue
            job.settle_child(index, data, self._session.decode_result)

    def _fail_children(self, job: TrackedJob, descriptions: Dict[Optional[int], Dict[str, Any]]) -> None:
        logs_budget = LOG_TAILS_PER_POLL
        for index, description in descriptions.items():
            if index is None or index not in job.unresolved:
                continue
            job.failed_seen.add(index)
            container = _last_container(description)
            job.set_status(index, "FAILED", description.get("statusReason"), container.get("exitCode"))
            log_tail = None
            if logs_budget > 0:
                logs_budget -= 1
                log_tail = self._session.log_tail(description)
            child_id = job.child_id(index)

            job.fail_child(index, lambda description=description, child_id=child_id, log_tail=log_tail:
                           classify_failure(description, job_id=child_id, log_tail=log_tail))

    def _missing(self, job: TrackedJob) -> bool:
        """Batch does not know the job: wait out the grace period, then trust storage."""
        if time.monotonic() - job.submitted_at < self._grace:
            return False
        written = self._session.storage.list_results(job.job_url)  # storage is all that is left
        self._settle_from_results(job, sorted(i for i in written if i in job.unresolved))
        for index in sorted(job.unresolved):
            child_id = job.child_id(index)
            job.fail_child(index, lambda child_id=child_id: JobMetadataExpired(
                f"Batch no longer knows job {child_id} (Batch forgets finished jobs after about "
                f"24 hours) and storage holds no result for it.", job_id=child_id))
        return True


def _last_container(description: Dict[str, Any]) -> Dict[str, Any]:
    attempts = description.get("attempts") or []
    if attempts and attempts[-1].get("container"):
        return attempts[-1]["container"]
    return description.get("container") or {}
