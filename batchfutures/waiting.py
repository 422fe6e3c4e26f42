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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence

from .errors import is_too_large_reason

if TYPE_CHECKING:
    from .batchapi import BatchAPI

__all__ = ["Waiting", "why_waiting", "needs_of", "place_in_queue", "SNAPSHOT_LIMIT", "look_up"]

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
                       position)
    if environments and not any(_usable(environment) for environment in environments):
        states = "; ".join(f"{_name(e)} {e.get('state')}/{e.get('status')}"
                           + (f" ({e['statusReason']})" if e.get("statusReason") else "")
                           for e in environments)
        return Waiting("environments-unusable",
                       f"no compute environment of its queue can run it: {states}", position)
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
                       f"({asked}); it never starts as it is", position)
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
                           f"{_place_text(position, snapshot)}", position)
    max_vcpus = sum(float((e.get("computeResources") or {}).get("maxvCpus") or 0) for e in usable)
    if in_use is not None and max_vcpus and in_use + needs["VCPU"] > max_vcpus:
        return Waiting("capacity-full",
                       f"its queue's compute environments are at maxvCpus ({in_use:g} of "
                       f"{max_vcpus:g} vCPUs in use); {_place_text(position, snapshot)}",
                       position, in_use, max_vcpus)
    reason = str(job.get("statusReason") or "")
    said = f"; Batch says: {reason}" if reason else ""
    return Waiting("queued", f"{_place_text(position, snapshot)}{said}", position, in_use,
                   max_vcpus or None)


def look_up(batch: BatchAPI, job: Mapping[str, Any]) -> Optional[Waiting]:
    """`why_waiting` of a DescribeJobs entry, after reading what it needs from Batch (its queue's
    snapshot, the queue, its compute environments, the consumable resources it asks for). A read
    that fails (an older endpoint, a policy without the action) leaves its part unknown."""
    if job.get("status") != "RUNNABLE":
        return None
    from . import batchapi

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
