"""Why a RUNNABLE job waits (pure; the classic "RUNNABLE for a long time" question).

From what Batch describes, read by the caller: the job (DescribeJobs), its queue's snapshot
(GetJobQueueSnapshot: the first 100 RUNNABLE jobs in dispatch order and the capacity in use),
the queue (DescribeJobQueues), its compute environments (DescribeComputeEnvironments) and the
consumable resources it needs (DescribeConsumableResource). `why_waiting` decides, first match:

    queue DISABLED or INVALID                  "queue-disabled"
    no compute environment ENABLED and VALID   "environments-unusable" (each one's state, reason)
    needs more vCPU/memory/GPU than any allows "too-large" (Batch's MISCONFIGURATION reason too)
    a consumable resource not free             "resource-busy" (in use / total)
    the queue's capacity in use at maxvCpus    "capacity-full" (with its place in the queue)
    otherwise                                  "queued": its place among the first 100, or behind
                                               them; Batch is starting capacity or the jobs ahead
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from . import batchapi
from .batchapi import BatchAPI
from .errors import is_too_large_reason

__all__ = ["Waiting", "why_waiting", "needs_of", "place_in_queue", "SNAPSHOT_LIMIT", "look_up",
           "WaitWatcher", "queues_due", "is_waiting", "reason_of"]

logger = logging.getLogger("batchfutures")

SNAPSHOT_LIMIT = 100  # GetJobQueueSnapshot's frontOfQueue: the first 100 RUNNABLE jobs
_FARGATE_MAX_VCPUS = 16.0  # Fargate's largest task (jobdefinitions.FARGATE_MEMORY)
_FARGATE_MAX_MIB = 122880


@dataclass(frozen=True)
class Waiting:
    """Why a job waits: ``reason`` (a short code), ``message`` (for people), its 1-based
    ``position`` among the first 100 RUNNABLE jobs of its queue (None: not among them, or not
    read), and the vCPUs in use and allowed when known."""

    reason: str
    message: str
    position: Optional[int] = None
    vcpus_in_use: Optional[float] = None
    max_vcpus: Optional[float] = None
    short: str = ""  # a few words for the progress bar ("12th in queue, 64/64 vCPUs in use")

    def __str__(self) -> str:
        return self.message


def needs_of(job: Mapping[str, Any]) -> Dict[str, float]:
    """vCPUs, memory (MiB) and GPUs a job asks for (its container's resourceRequirements)."""
    container = job.get("container") or {}
    needs = {"VCPU": float(container.get("vcpus") or 0), "MEMORY": float(container.get("memory") or 0),
             "GPU": 0.0}
    for requirement in container.get("resourceRequirements") or ():
        kind = str(requirement.get("type", "")).upper()
        if kind in needs:
            try:
                needs[kind] = float(requirement.get("value"))
            except (TypeError, ValueError):
                pass
    return needs


def place_in_queue(job: Mapping[str, Any], snapshot: Optional[Mapping[str, Any]]) -> Optional[int]:
    """The job's 1-based place in the snapshot's front of the queue; an array child not listed
    on its own takes its array's place."""
    if not snapshot:
        return None
    job_id = str(job.get("jobId") or "")
    listed = [str(entry.get("jobArn") or "")
              for entry in (snapshot.get("frontOfQueue") or {}).get("jobs") or ()]
    wanted = [job_id] + ([job_id.split(":")[0]] if ":" in job_id else [])
    for name in wanted:  # the child itself first, then its array
        for number, arn in enumerate(listed, 1):
            if name and (arn.endswith("/" + name) or arn == str(job.get("jobArn") or "") == name):
                return number
    if job_id and ":" not in job_id:  # an array job: the place of its first child listed
        for number, arn in enumerate(listed, 1):
            if ("/" + job_id + ":") in arn:
                return number
    return None


def _vcpus_in_use(snapshot: Optional[Mapping[str, Any]]) -> Optional[float]:
    usage = ((snapshot or {}).get("queueUtilization") or {}).get("totalCapacityUsage") or ()
    total = [float(entry.get("quantity") or 0) for entry in usage
             if "CPU" in str(entry.get("capacityUnit", "")).upper()]
    return sum(total) if total else None


def _usable(environment: Mapping[str, Any]) -> bool:
    return environment.get("state") == "ENABLED" and environment.get("status") in ("VALID", "UPDATING")


def _fits(environment: Mapping[str, Any], needs: Mapping[str, float],
          max_memory_mib: Optional[float]) -> bool:
    resources = environment.get("computeResources") or {}
    fargate = str(resources.get("type", "")).upper().startswith("FARGATE")
    max_vcpus = float(resources.get("maxvCpus") or 0)
    if fargate:
        max_vcpus = min(max_vcpus, _FARGATE_MAX_VCPUS) if max_vcpus else _FARGATE_MAX_VCPUS
        max_memory_mib = min(max_memory_mib or _FARGATE_MAX_MIB, _FARGATE_MAX_MIB)
        if needs["GPU"] > 0:
            return False
    if max_vcpus and needs["VCPU"] > max_vcpus:
        return False
    return not (max_memory_mib and needs["MEMORY"] > max_memory_mib)


def _name(environment: Mapping[str, Any]) -> str:
    return str(environment.get("computeEnvironmentName") or environment.get("computeEnvironmentArn"))


def _place_text(position: Optional[int], snapshot: Optional[Mapping[str, Any]]) -> str:
    if position is not None:
        return f"number {position} in its queue ({position - 1} RUNNABLE ahead)"
    if snapshot is not None:
        return f"behind the first {SNAPSHOT_LIMIT} RUNNABLE jobs of its queue"
    return "its place in the queue unknown"


def why_waiting(job: Mapping[str, Any], *, snapshot: Optional[Mapping[str, Any]] = None,
                queue: Optional[Mapping[str, Any]] = None,
                environments: Sequence[Mapping[str, Any]] = (),
                resources: Sequence[Mapping[str, Any]] = (),
                max_memory_mib: Optional[Mapping[str, float]] = None) -> Optional[Waiting]:
    """Why ``job`` (a DescribeJobs entry) waits; None when it is not RUNNABLE.

    ``environments``: its queue's compute environments (DescribeComputeEnvironments entries);
    ``resources``: DescribeConsumableResource answers; ``max_memory_mib``: per compute
    environment ARN or name, the most memory a job may have there, when known."""
    if job.get("status") != "RUNNABLE":
        return None
    position = place_in_queue(job, snapshot)
    in_use = _vcpus_in_use(snapshot)
    if queue is not None and (queue.get("state") != "ENABLED" or queue.get("status") == "INVALID"):
        return Waiting("queue-disabled",
                       f"its job queue {queue.get('jobQueueName')} is {queue.get('state')}/"
                       f"{queue.get('status')}: nothing in it starts"
                       + (f" ({queue['statusReason']})" if queue.get("statusReason") else ""),
                       position, short=f"queue {queue.get('state')}/{queue.get('status')}")
    if environments and not any(_usable(environment) for environment in environments):
        states = "; ".join(f"{_name(e)} {e.get('state')}/{e.get('status')}"
                           + (f" ({e['statusReason']})" if e.get("statusReason") else "")
                           for e in environments)
        return Waiting("environments-unusable",
                       f"no compute environment of its queue can run it: {states}", position,
                       short="no usable compute environment")
    needs = needs_of(job)
    usable = [environment for environment in environments if _usable(environment)]
    limits = max_memory_mib or {}
    too_large = is_too_large_reason(job.get("statusReason")) or (usable and not any(
        _fits(environment, needs, limits.get(str(environment.get("computeEnvironmentArn")))
              or limits.get(_name(environment)))
        for environment in usable))
    if too_large:
        asked = f"{needs['VCPU']:g} vCPU, {needs['MEMORY']:g} MiB" + (
            f", {needs['GPU']:g} GPU" if needs["GPU"] else "")
        return Waiting("too-large",
                       f"it asks for more than any compute environment of its queue allows "
                       f"({asked}); it never starts as it is", position,
                       short=f"too large for its queue ({asked})")
    wanted = {str(entry.get("consumableResource")): int(entry.get("quantity") or 0)
              for entry in (job.get("consumableResourceProperties") or {}).get(
                  "consumableResourceList") or ()}
    for resource in resources:
        names = {str(resource.get("consumableResourceName")), str(resource.get("consumableResourceArn"))}
        quantity = next((wanted[name] for name in names if name in wanted), None)
        available = resource.get("availableQuantity")
        if quantity is not None and available is not None and int(available) < quantity:
            return Waiting("resource-busy",
                           f"the consumable resource {resource.get('consumableResourceName')} is "
                           f"busy: {resource.get('inUseQuantity')} of "
                           f"{resource.get('totalQuantity')} in use, it needs {quantity}; "
                           f"{_place_text(position, snapshot)}", position,
                           short=_join(f"{resource.get('consumableResourceName')} busy "
                                       f"({resource.get('inUseQuantity')}/"
                                       f"{resource.get('totalQuantity')} in use)",
                                       _short_place(position, snapshot)))
    max_vcpus = sum(float((e.get("computeResources") or {}).get("maxvCpus") or 0) for e in usable)
    if in_use is not None and max_vcpus and in_use + needs["VCPU"] > max_vcpus:
        return Waiting("capacity-full",
                       f"its queue's compute environments are at maxvCpus ({in_use:g} of "
                       f"{max_vcpus:g} vCPUs in use); {_place_text(position, snapshot)}",
                       position, in_use, max_vcpus,
                       short=_join(_short_place(position, snapshot),
                                   f"{in_use:g}/{max_vcpus:g} vCPUs in use"))
    reason = str(job.get("statusReason") or "")
    said = f"; Batch says: {reason}" if reason else ""
    use = (f"{in_use:g}/{max_vcpus:g} vCPUs in use" if in_use is not None and max_vcpus
           else f"{in_use:g} vCPUs in use" if in_use is not None else "")
    return Waiting("queued", f"{_place_text(position, snapshot)}{said}", position, in_use,
                   max_vcpus or None, short=_join(_short_place(position, snapshot), use))


def _ordinal(number: int) -> str:
    tail = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{tail}"


def _short_place(position: Optional[int], snapshot: Optional[Mapping[str, Any]]) -> str:
    if position is not None:
        return f"{_ordinal(position)} in queue"
    return f"behind the first {SNAPSHOT_LIMIT} in queue" if snapshot is not None else ""


def _join(*parts: str) -> str:
    return ", ".join(part for part in parts if part)


def look_up(batch: BatchAPI, job: Mapping[str, Any]) -> Optional[Waiting]:
    """`why_waiting` of a DescribeJobs entry, after reading what it needs from Batch (its queue's
    snapshot, the queue, its compute environments, the consumable resources it asks for). A read
    that fails (an older endpoint, a policy without the action) leaves its part unknown."""
    if job.get("status") != "RUNNABLE":
        return None
    def read(method_name: str, **params: Any) -> Optional[Dict[str, Any]]:
        method = getattr(batch, method_name, None)
        if method is None:
            return None
        try:
            return batchapi.call(method, attempts=2, **params)
        except Exception as error:  # what cannot be read is left out of the answer
            logger.debug("waiting: %s failed: %r", method_name, error)
            return None

    queue_name = str(job.get("jobQueue") or "")
    snapshot = read("get_job_queue_snapshot", jobQueue=queue_name) if queue_name else None
    queues = (read("describe_job_queues", jobQueues=[queue_name]) or {}).get("jobQueues") or []
    queue = queues[0] if queues else None
    names = [entry["computeEnvironment"] for entry in (queue or {}).get("computeEnvironmentOrder") or ()]
    environments = (read("describe_compute_environments", computeEnvironments=names) or {}).get(
        "computeEnvironments") or [] if names else []
    resources = []
    for entry in (job.get("consumableResourceProperties") or {}).get("consumableResourceList") or ():
        found = read("describe_consumable_resource", consumableResource=entry.get("consumableResource"))
        if found:
            resources.append(found)
    return why_waiting(job, snapshot=snapshot, queue=queue, environments=environments,
                       resources=resources)


# -- the poller's watch: why tracked jobs wait, within its request budget -------------------------
WAIT_REASON_AFTER = 30.0  # seconds RUNNABLE before the reason is read (BATCHFUTURES_WAIT_REASON_AFTER)
SNAPSHOT_EVERY = 10.0  # a queue's snapshot is read again at most this often
QUEUE_DETAILS_TTL = 300.0  # the queue and its compute environments change rarely: read this often
_REFUSED_CODES = ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation",
                  "UnrecognizedClientException", "UnknownOperationException")

# job id -> why it waits now, for the progress bar (written by the pollers' watchers, which hold
# the values: a watcher gone takes its entries with it)
_shown: "weakref.WeakValueDictionary[str, Waiting]" = weakref.WeakValueDictionary()


def reason_of(job_id: str) -> Optional[Waiting]:
    """Why the tracked job ``job_id`` waits, as its poller last read it (None: not waiting long
    enough, not read, or the read was refused). No request."""
    return _shown.get(job_id)


def is_waiting(description: Mapping[str, Any]) -> bool:
    """A DescribeJobs entry that waits to start: RUNNABLE itself, or an array job with RUNNABLE
    children."""
    if description.get("status") == "RUNNABLE":
        return True
    summary = (description.get("arrayProperties") or {}).get("statusSummary") or {}
    return description.get("status") not in ("SUCCEEDED", "FAILED") and bool(summary.get("RUNNABLE"))


def queues_due(waiting_since: Mapping[str, Tuple[str, float]], now: float, *, after: float,
               last_read: Mapping[str, float], every: float = SNAPSHOT_EVERY,
               refused: Collection[str] = ()) -> List[str]:
    """The queues whose snapshot this round reads, each once, in the order first met: those of a
    job waiting for ``after`` seconds or more (``waiting_since``: job id -> (queue, since)), not
    read within ``every`` seconds, and not refused before (an old stack's policy)."""
    due: List[str] = []
    for queue, since in waiting_since.values():
        if (queue and queue not in due and queue not in refused and now - since >= after
                and now - last_read.get(queue, -float("inf")) >= every):
            due.append(queue)
    return due


def _threshold() -> float:
    try:
        return max(0.0, float(os.environ.get("BATCHFUTURES_WAIT_REASON_AFTER", WAIT_REASON_AFTER)))
    except ValueError:
        return WAIT_REASON_AFTER


class WaitWatcher:
    """Why the poller's jobs wait. `observe` is called once a round with the descriptions that
    round read; for the queues `queues_due` names it sends one GetJobQueueSnapshot each (the
    queue and its compute environments every QUEUE_DETAILS_TTL, the consumable resources the
    waiting jobs hold with the snapshot) and decides with `why_waiting`. A read that fails
    never reaches a future: it is logged once at DEBUG, and a refused snapshot (an old stack's
    policy) is not asked for again and shows nothing."""

    def __init__(self, after: Optional[float] = None) -> None:
        self.after = _threshold() if after is None else after
        self._since: Dict[str, Tuple[str, float]] = {}  # job id -> (queue, first seen waiting)
        self._described: Dict[str, Mapping[str, Any]] = {}  # job id -> its last description
        self._snapshots: Dict[str, Optional[Mapping[str, Any]]] = {}
        self._read_at: Dict[str, float] = {}
        self._details: Dict[str, Tuple[float, Optional[Mapping[str, Any]], List[Mapping[str, Any]]]] = {}
        self._refused: Set[str] = set()
        self._logged: Set[Tuple[str, str]] = set()
        self._reasons: Dict[str, Waiting] = {}
        self._lock = threading.Lock()
        self.snapshots_read = 0  # GetJobQueueSnapshot requests sent (tests, benchmarks)

    def reason(self, job_id: str) -> Optional[Waiting]:
        return self._reasons.get(job_id)

    def observe(self, batch: BatchAPI, descriptions: Mapping[str, Mapping[str, Any]],
                tracked: Collection[str], now: float) -> None:
        """One round: ``descriptions`` read this round (job id -> DescribeJobs entry),
        ``tracked`` the job ids still outstanding."""
        with self._lock:
            for job_id in [j for j in self._since if j not in tracked]:
                self._drop(job_id)
            for job_id, description in descriptions.items():
                if is_waiting(description):
                    queue = str(description.get("jobQueue") or "")
                    self._since.setdefault(job_id, (queue, now))
                    self._described[job_id] = description
                else:
                    self._drop(job_id)
            due = queues_due(self._since, now, after=self.after, last_read=self._read_at,
                             refused=self._refused)
            if not due:
                return
            for queue in due:
                self._read_at[queue] = now
                self._snapshots[queue] = self._read(batch, "get_job_queue_snapshot", queue,
                                                    jobQueue=queue)
                self.snapshots_read += 1
            resources = self._resources(batch, due)
            for job_id, (queue, since) in self._since.items():
                if queue not in due or now - since < self.after:
                    continue
                snapshot = self._snapshots.get(queue)
                if snapshot is None:  # unread or refused: nothing to show
                    self._reasons.pop(job_id, None)
                    _shown.pop(job_id, None)
                    continue
                found = self._decide(batch, job_id, queue, snapshot, resources, now)
                if found is not None:
                    self._reasons[job_id] = found
                    _shown[job_id] = found

    def _decide(self, batch: BatchAPI, job_id: str, queue: str, snapshot: Mapping[str, Any],
                resources: Mapping[str, Mapping[str, Any]], now: float) -> Optional[Waiting]:
        description = dict(self._described.get(job_id) or {})
        description["status"] = "RUNNABLE"  # an array with children waiting: as its first one
        details = self._queue_details(batch, queue, now)
        wanted = [str(entry.get("consumableResource"))
                  for entry in (description.get("consumableResourceProperties") or {}).get(
                      "consumableResourceList") or ()]
        return why_waiting(description, snapshot=snapshot, queue=details[1],
                           environments=details[2],
                           resources=[resources[name] for name in wanted if name in resources])

    def _queue_details(self, batch: BatchAPI, queue: str, now: float
                       ) -> Tuple[float, Optional[Mapping[str, Any]], List[Mapping[str, Any]]]:
        cached = self._details.get(queue)
        if cached is not None and now - cached[0] < QUEUE_DETAILS_TTL:
            return cached
        queues = (self._read(batch, "describe_job_queues", queue, jobQueues=[queue]) or {}).get(
            "jobQueues") or []
        described = queues[0] if queues else None
        names = [entry["computeEnvironment"]
                 for entry in (described or {}).get("computeEnvironmentOrder") or ()]
        environments = ((self._read(batch, "describe_compute_environments", queue,
                                    computeEnvironments=names) or {}).get("computeEnvironments")
                        or []) if names else []
        self._details[queue] = (now, described, list(environments))
        return self._details[queue]

    def _resources(self, batch: BatchAPI, queues: Collection[str]) -> Dict[str, Mapping[str, Any]]:
        names: List[str] = []
        for job_id, (queue, _since) in self._since.items():
            if queue in queues:
                for entry in (self._described[job_id].get("consumableResourceProperties") or {}).get(
                        "consumableResourceList") or ():
                    name = str(entry.get("consumableResource"))
                    if name not in names:
                        names.append(name)
        found: Dict[str, Mapping[str, Any]] = {}
        for name in names:
            answer = self._read(batch, "describe_consumable_resource", name, consumableResource=name)
            if answer:
                found[name] = answer
        return found

    def _read(self, batch: BatchAPI, method_name: str, target: str,
              **params: Any) -> Optional[Dict[str, Any]]:
        method = getattr(batch, method_name, None)  # an older client without the operation
        try:
            if method is None:
                raise NotImplementedError(f"this Batch client has no {method_name}")
            return batchapi.call(method, budget=batchapi.POLL_BUDGET, attempts=1, **params)
        except Exception as error:  # never into a future: this part is left unknown
            code = batchapi.error_code(error)
            if method_name == "get_job_queue_snapshot" and (
                    method is None or code in _REFUSED_CODES):
                self._refused.add(target)  # an old stack's policy: not asked again
            if (method_name, target) not in self._logged:
                self._logged.add((method_name, target))
                logger.debug("batchfutures: why jobs wait: %s(%s) failed, left out: %r",
                             method_name, target, error)
            return None

    def _drop(self, job_id: str) -> None:
        self._since.pop(job_id, None)
        self._described.pop(job_id, None)
        self._reasons.pop(job_id, None)
        _shown.pop(job_id, None)
