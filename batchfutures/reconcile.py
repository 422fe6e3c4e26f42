"""The poller's reasoning, as a pure function: what Batch and storage said -> what to do.

    JobFacts (committed facts) + Reads (what was read so far this poll)
        └─> reconcile ─> Step(needs=...)   more reads wanted: the poller makes them, adds them
                                           to Reads and calls again (a failed read ends the
                                           poll for this job with nothing committed)
                     └─> Step(actions=...) the decisions, committed by TrackedJob.apply

Nothing here does I/O, reads a clock or changes its arguments, so every case is a table test.

The rules: counts are hints, never the truth.
- ``statusSummary`` lags (``statusSummaryLastUpdatedAt``): it only decides when to look. Which
  children finished, and how, comes from ListJobs, DescribeJobs and the result objects.
- A result object is the truth that a child succeeded. A child with no result fails as
  "succeeded but wrote no result" only when ListJobs/DescribeJobs says SUCCEEDED.
- A child fails only when ListJobs(FAILED) names it; DescribeJobs of it gives the type. A
  failed child whose last attempt exited 137 with no reason (errors.wants_oom_marker) has its
  out-of-memory marker read from storage (``Needs.markers``, one GET each): the worker writes one
  before it exits on a MemoryError, which ECS reports with no OutOfMemoryError reason; a marker
  found goes into the description (``with_marker``) and classify_failure makes it
  MemoryLimitExceeded, so retry_on_oom acts on it as on the kernel's kill.
- A finished job with open children is examined on every poll until each is settled.
- An array job that FAILED before any child existed (the summary is empty and no listing names a
  child) fails each future from the parent's own description.
- A multi-node parallel job (``view.nodes > 1``) is one child: SUCCEEDED reads the result of
  every node (results/0..N-1), FAILED fails it from the parent's own description. RUNNING lists
  its FAILED nodes now and then: Batch ignores a non-main node's death, so the first one fails
  the call (typed from that node's description) and the job is terminated.
- A job held RUNNABLE with a MISCONFIGURATION:/CAPACITY: reason shows it on its futures; after
  ``runnable_timeout`` it is cancelled and its futures fail as unplaceable. Batch gives the reason
  to the head of the queue only: a retry_on_oom retry too large for every compute environment is
  cancelled whole (all its children ask the same) as soon as one child shows it.

Request budget per job and poll: no Batch read when its counts did not move; ListJobs(FAILED)
only when the FAILED count grew (or the job finished with children unsettled), DescribeJobs only
of failed children, ListJobs(RUNNABLE) now and then while nothing runs. Running children are
never listed: which children finished is what storage holds (one listing of the results written
since the lowest child still waiting, when SUCCEEDED grew), and each result is read once, in the
background (``Actions.read``; ``arrived`` settles what the reader brought back).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

from .batchapi import node_index
from .errors import (
    ABORT_REASON_PREFIX,
    OOM_MARKER_FIELD,
    IntegrityError,
    is_too_large_reason,
    is_unplaceable_reason,
    wants_oom_marker,
)
from .jobdetail import last_container, resources
from .jobs import Actions, JobFacts, Shown, default_child_status
from .results import Arrival, ReadFailed
from .statuses import ACTIVE, FINISHED, QUEUED, JobStatus

__all__ = ["Reads", "Needs", "Step", "reconcile", "with_marker"]

MAX_REASON = 250  # CancelJob's reason is free text; keep ours short
# Listings read only in part: RUNNABLE children are listed for their reasons, which every child
# of an array shares (one resource request): a sample says it without a page per 1,000 children.
LISTING_LIMIT = {JobStatus.RUNNABLE: 100}


@dataclass
class Reads:
    """What was read for one job during one poll."""

    description: Optional[Mapping[str, Any]]  # DescribeJobs of the job; None: Batch does not know it
    listings: Dict[JobStatus, List[Mapping[str, Any]]] = field(default_factory=dict)  # ListJobs
    children: Dict[int, Mapping[str, Any]] = field(default_factory=dict)  # DescribeJobs of children
    # GET; None: no object; an IntegrityError: its seal did not check (its items fail)
    results: Dict[int, Union[bytes, bytearray, None, IntegrityError]] = field(default_factory=dict)
    stored: Optional[FrozenSet[int]] = None   # storage listing of written results (from stored_from)
    failed_nodes: Optional[List[Mapping[str, Any]]] = None  # ListJobs(multiNodeJobId, FAILED)
    nodes: Dict[int, Mapping[str, Any]] = field(default_factory=dict)  # DescribeJobs of "<id>#<k>"
    # storage.oom_markers: a failed child's out-of-memory marker, None when it wrote none
    markers: Dict[int, Optional[Mapping[str, Any]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Needs:
    """Reads to make before reconcile can decide."""

    listings: Tuple[JobStatus, ...] = ()  # ListJobs(arrayJobId, status), every page
    children: Tuple[int, ...] = ()        # DescribeJobs of these children
    results: Tuple[int, ...] = ()         # GET results/<index>
    stored: bool = False                  # list the results in storage...
    stored_from: int = 0                  # ...of the children from this index on
    failed_nodes: bool = False            # ListJobs(multiNodeJobId, FAILED), every page
    nodes: Tuple[int, ...] = ()           # DescribeJobs of these nodes of a multi-node job
    markers: Tuple[int, ...] = ()         # GET oom/<index>: failed children's out-of-memory markers

    def __bool__(self) -> bool:
        return bool(self.listings or self.children or self.results or self.stored
                    or self.failed_nodes or self.nodes or self.markers)


@dataclass(frozen=True)
class Step:
    needs: Needs = Needs()
    actions: Actions = field(default_factory=Actions)


def arrived(arrivals: Mapping[int, Arrival], *, array: bool, open_: AbstractSet[int]) -> Actions:
    """Results the ResultReader brought back: settle the children whose result is there.

    No object: a plain job is read only once Batch said SUCCEEDED, so it succeeded without
    writing one; an array child is `missing` until a listing of storage names it (a finished job
    then asks ListJobs whether it succeeded). A read that failed is made again by the next step.
    ``open_``: the job's open children (only read; a JobFacts's copy would cost O(children) at
    every arrival).
    """
    actions = Actions(read_done=tuple(arrivals))
    reread, missing = [], []
    for index, data in arrivals.items():
        if index not in open_:
            continue  # settled meanwhile (cancelled, aborted, moved to a retry)
        if isinstance(data, ReadFailed):
            reread.append(index)
        elif data is not None:
            actions.results[index] = data
        elif not array:
            actions.no_result += (index,)
        else:
            missing.append(index)
    actions.reread, actions.missing = tuple(reread), tuple(missing)
    actions.changed = bool(actions.settles)
    return actions


def reconcile(view: JobFacts, reads: Reads) -> Step:
    """The next reads to make for one job, or, once none is wanted, the actions to take."""
    if not view.open:
        return Step()
    if reads.description is None:
        return _forgotten(view, reads)
    if not view.array:
        return _plain(view, reads)
    return _array(view, reads)


# -- a job Batch does not know ----------------------------------------------------------------
def _forgotten(view: JobFacts, reads: Reads) -> Step:
    """DescribeJobs may miss a job for a while after SubmitJob; after that, storage decides."""
    if view.now - view.submitted_at < view.grace:
        return Step()
    if reads.stored is None:
        return Step(Needs(stored=True))
    wanted = set(range(view.nodes)) if view.nodes > 1 else view.open  # nodes: every node's
    written = sorted(i for i in reads.stored if i in wanted)
    unread = tuple(i for i in written if i not in reads.results)
    if unread:
        return Step(Needs(results=unread))
    if view.nodes > 1:
        if written != list(range(view.nodes)):
            return Step(actions=Actions(expired=(0,), changed=True))
        node_results = {0: tuple(reads.results[i] for i in written)}
        return Step(actions=Actions(node_results=node_results, changed=True))
    results = {i: reads.results[i] for i in written}
    expired = tuple(sorted(i for i in view.open if results.get(i) is None))
    found = {i: data for i, data in results.items() if data is not None}
    return Step(actions=Actions(results=found, expired=expired, changed=True))


# -- a plain job ---------------------------------------------------------------------------------
def _plain(view: JobFacts, reads: Reads) -> Step:
    description = reads.description or {}
    status = JobStatus.of(description.get("status"))
    reason = description.get("statusReason")
    shown = Shown(status, reason, last_container(description).get("exitCode"))
    actions = Actions(shown={0: shown}, status=status, changed=status != view.status)
    if status is JobStatus.SUCCEEDED and view.nodes > 1:  # every node's result, in node order
        unread = tuple(i for i in range(view.nodes) if i not in reads.results)
        if unread:
            return Step(Needs(results=unread))
        actions.node_results[0] = tuple(reads.results[i] for i in range(view.nodes))
        actions.changed = True
    elif status is JobStatus.SUCCEEDED:
        if 0 not in view.reading:  # read in the background; `arrived` settles it
            actions.read = (0,)
            actions.changed = True
    elif status is JobStatus.FAILED:
        if view.nodes <= 1:
            unread = _markers_wanted(reads, {0: description})
            if unread:
                return Step(Needs(markers=unread))
        else:
            main = (description.get("nodeProperties") or {}).get("mainNode", 0)
            if _no_outcome(description):  # the parent without its main node's outcome
                if main not in reads.nodes:
                    return Step(Needs(nodes=(main,)))
                description = _as_main_node(description, reads.nodes[main])
        actions.failed[0] = with_marker(description, reads.markers.get(0))
        actions.changed = True
    elif status is JobStatus.RUNNABLE and is_unplaceable_reason(reason):
        _stuck(view, actions, {0: str(reason)}, description)
    elif status is JobStatus.RUNNING and view.nodes > 1:
        return _failed_node(view, reads, actions, description)
    else:
        actions.stuck_since = actions.stuck_reason = None
    return Step(actions=actions)


def _no_outcome(description: Mapping[str, Any]) -> bool:
    """Whether a description says nothing of how its container ended (no exit code, no reason)."""
    container = last_container(description)
    return container.get("exitCode") is None and not container.get("reason")


def _as_main_node(parent: Mapping[str, Any], main: Mapping[str, Any]) -> Mapping[str, Any]:
    """A failed multi-node job, typed by its main node: Batch takes the job's end from the main
    node, but a parent described without it (no attempts, no container) would read as a plain
    failure where the main node was, say, killed for memory."""
    if not main:  # Batch did not describe the node: the parent as it is
        return parent
    return {**parent, "attempts": main.get("attempts") or [],
            "container": main.get("container") or parent.get("container") or {}}


def _failed_node(view: JobFacts, reads: Reads, actions: Actions,
                 description: Mapping[str, Any]) -> Step:
    """A running multi-node job whose non-main node FAILED: fail the call and end the job.

    Batch does nothing when a node other than the main one dies, and the main node would wait
    for that node's result until the job's timeout; so every ``check_interval`` the FAILED nodes
    are listed, and the first (by index) fails the future, typed from its own description, and
    the job is terminated.
    """
    if view.checked_at is not None and view.now - view.checked_at < view.check_interval:
        return Step(actions=actions)
    if reads.failed_nodes is None:
        return Step(Needs(failed_nodes=True))
    actions.checked_at = view.now
    main = (description.get("nodeProperties") or {}).get("mainNode", 0)
    dead = sorted({i for i in map(node_index, reads.failed_nodes) if i is not None and i != main})
    if not dead:
        return Step(actions=actions)
    first = dead[0]
    if first not in reads.nodes:
        return Step(Needs(nodes=(first,)))
    listed = next(s for s in reads.failed_nodes if node_index(s) == first)
    node = reads.nodes[first] or listed  # {}: Batch did not describe it; type it from its listing
    node_reason = node.get("statusReason") or last_container(node).get("reason") or "it failed"
    actions.failed[0] = node
    actions.shown[0] = Shown(JobStatus.FAILED, node.get("statusReason"),
                             last_container(node).get("exitCode"))
    text = f"{ABORT_REASON_PREFIX} node {first} of {view.nodes} failed: {node_reason}"
    actions.terminate = ((view.job_id, text[:MAX_REASON]),)
    actions.changed = True
    return Step(actions=actions)


# -- an array job --------------------------------------------------------------------------------
def _array(view: JobFacts, reads: Reads) -> Step:
    description = reads.description or {}
    status = JobStatus.of(description.get("status"))
    summary = _summary(description)
    before = view.summary
    finished = status is not None and status.finished
    moved = summary != dict(before) or status != view.status
    check_runnable = _runnable_check_due(view, summary, finished)
    unknown = view.open - view.reading  # open children whose result is not being read
    actions = Actions(status=status, summary=summary, stuck_since=view.stuck_since,
                      stuck_reason=view.stuck_reason, changed=moved)
    if not (moved or check_runnable or view.reread or (finished and unknown)):
        return Step(actions=actions)  # nothing to look at: no reads at all

    succeeded_grew = _count(summary, JobStatus.SUCCEEDED) > _count(before, JobStatus.SUCCEEDED)
    failed_grew = _count(summary, JobStatus.FAILED) > _count(before, JobStatus.FAILED)
    # Parent FAILED and the summary names no child: perhaps no child ever existed.
    childless = status is JobStatus.FAILED and not any(summary.values())

    # 1. the listings this step depends on, all at once; never the running children (their
    # pages would grow with them, every round): finished ones are found in storage
    wanted: List[JobStatus] = []
    if failed_grew or (status is JobStatus.FAILED and unknown):  # SUCCEEDED: no child failed
        wanted.append(JobStatus.FAILED)
    if childless:
        wanted.append(JobStatus.SUCCEEDED)
    if check_runnable:
        wanted.append(JobStatus.RUNNABLE)
    missing = tuple(s for s in wanted if s not in reads.listings)
    if missing:
        return Step(Needs(listings=missing))
    failed_listed = dict(_listed(view, reads, JobStatus.FAILED))

    # 2. a parent that failed before any child existed: its own description says why
    if childless and not failed_listed and not dict(_listed(view, reads, JobStatus.SUCCEEDED)):
        actions.failed = {index: description for index in sorted(view.open)}
        actions.changed = True
        return Step(actions=actions)

    # 3. failed children, typed from their own descriptions
    undescribed = tuple(sorted(i for i in failed_listed if i not in reads.children))
    if undescribed:
        return Step(Needs(children=undescribed))
    unread = _markers_wanted(reads, {index: reads.children.get(index) or item
                                     for index, item in failed_listed.items()})
    if unread:  # exit 137 with no reason: the worker's marker says whether it ran out of memory
        return Step(Needs(markers=unread))
    for index, item in failed_listed.items():
        failed = actions.failed[index] = with_marker(reads.children.get(index) or item,
                                                     reads.markers.get(index))
        actions.shown[index] = Shown(JobStatus.FAILED, failed.get("statusReason"),
                                     last_container(failed).get("exitCode"))

    # 4. children that finished: read their results in the background
    waiting = unknown - set(failed_listed)
    to_read, list_from = results_to_read(view, reads, status, summary, succeeded_grew, waiting)
    if to_read is None:
        return Step(Needs(stored=True, stored_from=list_from))
    actions.read = tuple(sorted(to_read))

    # 5. a finished job's children with neither a result nor a failure: ListJobs says whether
    # they succeeded (then the result is truly missing) or are still to be seen (lag: next poll)
    without = waiting - to_read if finished else frozenset()
    if without:
        if JobStatus.SUCCEEDED not in reads.listings:
            return Step(Needs(listings=(JobStatus.SUCCEEDED,)))
        succeeded = dict(_listed(view, reads, JobStatus.SUCCEEDED))
        actions.no_result = tuple(sorted(i for i in without if i in succeeded))
        for index in actions.no_result:
            actions.shown[index] = Shown(JobStatus.SUCCEEDED)

    # 6. which children run: those that ended did; once none waits to start, all of them did
    started = set(to_read) | set(failed_listed)
    if _none_queued(summary):
        for index in view.open - view.started - started:
            actions.shown[index] = Shown(JobStatus.RUNNING)
        started |= view.open
    actions.started = frozenset(started - view.started)

    # 7. children Batch cannot place
    if check_runnable:
        actions.checked_at = view.now
        stuck: Dict[int, str] = {}
        for index, item in _listed(view, reads, JobStatus.RUNNABLE):
            reason = item.get("statusReason")
            actions.shown.setdefault(index, Shown(JobStatus.RUNNABLE, reason))
            if is_unplaceable_reason(reason):
                stuck[index] = str(reason)
        if stuck:
            # none runs and every unfinished child waits RUNNABLE: the reason is the whole job's
            runnable = _count(summary, JobStatus.RUNNABLE)
            unfinished = sum(summary.values()) - sum(_count(summary, s) for s in FINISHED)
            reason = next(iter(stuck.values()))
            if view.memory_raised and is_too_large_reason(reason):
                # a retry's children ask alike, and Batch names only the head of the queue:
                # one child too large means every child not yet started is
                stuck = {index: stuck.get(index, reason) for index in view.open - view.started}
            elif not view.started and runnable and runnable >= unfinished:
                stuck = {index: stuck.get(index, reason) for index in view.open}
            _stuck(view, actions, stuck, description)
        else:
            actions.stuck_since = actions.stuck_reason = None
    elif _progressed(summary, before):
        actions.stuck_since = actions.stuck_reason = None

    if moved:
        actions.default_shown = default_child_status(status, summary)
    if actions.settles or actions.read:
        actions.changed = True
    return Step(actions=actions)


def results_to_read(view: JobFacts, reads: Reads, status: Optional[JobStatus],
                    summary: Mapping[str, int], succeeded_grew: bool, waiting: FrozenSet[int]
                    ) -> Tuple[Optional[FrozenSet[int]], int]:
    """The open children whose result objects to read now, or (None, k): list the results
    storage holds from child k on first.

    A written result is the truth that a child succeeded, so storage, not Batch, says which did:
    Batch's counts only say when to look. In order of cost:
    - reads that failed before are made again;
    - the job SUCCEEDED (every child did), or as many newly succeeded as children still
      waiting: all of them, without a listing (but those read before and found `missing`);
    - SUCCEEDED grew, or the job FAILED: the written results, listed from the lowest child
      still waiting (S3's StartAfter: the pages grow with the results new since, not with every
      child of the job nor with the children running).
    """
    again = view.reread & waiting
    fresh = waiting - view.missing
    finished = status is not None and status.finished
    if not waiting or not (finished or succeeded_grew):
        return again, 0
    newly = _count(summary, JobStatus.SUCCEEDED) - _count(view.summary, JobStatus.SUCCEEDED)
    if fresh == waiting and (status is JobStatus.SUCCEEDED
                             or (not finished and newly >= len(waiting))):
        return waiting, 0
    if reads.stored is None:
        return None, min(waiting)
    return frozenset(i for i in waiting if i in reads.stored) | again, 0


def _none_queued(summary: Mapping[str, int]) -> bool:
    """The counts name children and none of them waits to start (SUBMITTED..RUNNABLE)."""
    return any(summary.values()) and not any(_count(summary, s) for s in QUEUED)


def _runnable_check_due(view: JobFacts, summary: Mapping[str, int], finished: bool) -> bool:
    """List RUNNABLE children (for their reasons) when some wait and none runs, now and then."""
    if finished or not _count(summary, JobStatus.RUNNABLE):
        return False
    if any(_count(summary, s) for s in ACTIVE):
        return False
    interval = view.check_interval
    if view.runnable_timeout is not None:
        interval = min(interval, max(view.runnable_timeout / 2, 0.0))
    return view.checked_at is None or view.now - view.checked_at >= interval


def _stuck(view: JobFacts, actions: Actions, stuck: Dict[int, str],
           description: Mapping[str, Any]) -> None:
    """Children RUNNABLE with an unplaceable reason: start (or keep) their clock; time them out.

    A retry_on_oom retry that no compute environment can hold is ended at once: its memory was
    raised by this library, the reason is definitive, and waiting would hang its futures
    (unless runnable_timeout was set); the poller fails it as MemoryLimitExceeded.
    """
    since = view.stuck_since if view.stuck_since is not None else view.now
    reason = next(iter(stuck.values()))
    actions.stuck_since, actions.stuck_reason = since, reason
    timeout = view.runnable_timeout
    too_large = view.memory_raised and is_too_large_reason(reason)
    if too_large:
        timeout = 0.0
    if timeout is None or view.now - since < timeout:
        return
    actions.requested = requested_resources(description)
    for index, child_reason in stuck.items():
        actions.unplaceable[index] = child_reason
        actions.shown[index] = Shown(JobStatus.RUNNABLE, child_reason)
    text = (f"{ABORT_REASON_PREFIX} the retry_on_oom memory cannot be placed: {reason}" if too_large
            else f"{ABORT_REASON_PREFIX} not placed within runnable_timeout={timeout:g}s: {reason}")
    text = text[:MAX_REASON]
    whole = not view.array or (set(stuck) >= view.open and not view.started)
    if whole:
        actions.cancel = ((view.job_id, text),)
    else:
        actions.cancel = tuple((view.child_id(i), text) for i in sorted(stuck))
    actions.stuck_since = actions.stuck_reason = None
    actions.changed = True


def requested_resources(description: Mapping[str, Any]) -> str:
    """What the job asked for, as Batch holds it: "4 vCPUs, 8192 MiB memory, 1 GPUs"."""
    asked = resources(description.get("container") or {})
    parts = []
    if asked.vcpus is not None:
        parts.append(f"{asked.vcpus:g} vCPUs")
    if asked.memory_mib is not None:
        parts.append(f"{asked.memory_mib} MiB memory")
    if asked.gpus:
        parts.append(f"{asked.gpus} GPUs")
    return ", ".join(parts)


# -- out-of-memory markers -----------------------------------------------------------------------
def _markers_wanted(reads: Reads, failed: Mapping[int, Mapping[str, Any]]) -> Tuple[int, ...]:
    """The failed children whose marker to read: exit 137 with no reason (wants_oom_marker),
    not read yet this poll. One GET each, only for such children."""
    return tuple(sorted(index for index, description in failed.items()
                        if index not in reads.markers and wants_oom_marker(description)))


def with_marker(description: Mapping[str, Any],
                marker: Optional[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The failed description to classify: with the worker's out-of-memory marker, when one was
    read, under errors.OOM_MARKER_FIELD (classify_failure then makes it MemoryLimitExceeded)."""
    if marker is None:
        return description
    return {**description, OOM_MARKER_FIELD: dict(marker)}


# -- small readers of Batch's shapes -------------------------------------------------------------
def _summary(description: Mapping[str, Any]) -> Dict[str, int]:
    summary = (description.get("arrayProperties") or {}).get("statusSummary") or {}
    return {str(k): int(v) for k, v in summary.items() if v}


def _count(summary: Mapping[str, int], status: JobStatus) -> int:
    return int(summary.get(status.value, 0) or 0)


def _progressed(summary: Mapping[str, int], before: Mapping[str, int]) -> bool:
    moving = (JobStatus.STARTING, JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED)
    return any(_count(summary, s) != _count(before, s) for s in moving)


def _listed(view: JobFacts, reads: Reads, status: JobStatus) -> Sequence[Tuple[int, Mapping[str, Any]]]:
    """The open children a listing names, as (index, JobSummary)."""
    found = []
    for item in reads.listings.get(status, ()):
        index = (item.get("arrayProperties") or {}).get("index")
        if index is None:
            index = view.child_index(str(item.get("jobId", "")))
        if index is not None and index in view.open:
            found.append((int(index), item))
    return found


