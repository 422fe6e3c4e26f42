"""The job table's records: a job, its array children, their attempts, and how each is shown.

    Job   what SubmitJob created: its `spec` (fixed at submission) and, for an array, the
          parent's own status; `units` holds what actually runs: one Unit for a plain job, one
          per child for an array.
    Unit  a plain job or one array child: status, timestamps, attempts, the current attempt.

A Job keeps its own indexes consistent on every status change (`move`): per-status counts and
index sets for an array (so the parent's statusSummary and ListJobs by status cost nothing per
call) and the set of dirty record chunks (so the persister rewrites only what changed). The
`describe`/`summary` functions render Batch's JobDetail and JobSummary shapes; `to_record` and
`from_record` are the on-disk form (see records.py).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from types import EllipsisType
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Set, Tuple, Union

from ..statuses import FINISHED, JobStatus
from .model import consumable_resource_arn, job_arn, queue_arn

if TYPE_CHECKING:  # pragma: no cover
    from .runtime.attempts import AttemptHandle, KillReason


class DependencyKind(enum.Enum):
    """How a job waits for another (Batch's dependsOn types; WHOLE: no type given)."""

    WHOLE = "whole"
    N_TO_N = "N_TO_N"
    SEQUENTIAL = "SEQUENTIAL"


CHUNK = 500  # children per record file

# The strings Batch itself writes.
EXITED = "Essential container in task exited"
OOM_REASON = "OutOfMemoryError: Container killed due to memory usage"
TIMEOUT_REASON = "Job attempt duration exceeded timeout"
DEPENDENCY_FAILED = "Dependent Job failed"
CHILD_FAILED = "Array Child Job failed"
START_FAILED = "Task failed to start"
HOST_TERMINATED = "Host EC2 (instance i-0123456789abcdef0) terminated."
# a Fargate Spot task's stoppedReason when Spot reclaims its capacity (ECS task state change
# events, stopCode TerminationNotice); Batch passes it on as the attempt's and job's statusReason
SPOT_TASK_INTERRUPTED = "Your Spot Task was interrupted."
MAX_TAGS = 50  # tags a job may propagate to its task (its own and its definition's)
MISCONFIGURED = ("MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - The job resource requirement "
                 "(vCPU/memory/GPU) is higher than that can be met by the CE(s) attached to the "
                 "job queue.")
# ... when the queue's compute environments' maxvCpus are smaller than the job needs (AWS Batch
# User Guide, "Jobs stuck in a RUNNABLE status")
CE_MAX_RESOURCE = ("MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE - CE(s) associated with "
                   "the job queue cannot meet the CPU requirement of the job.")

# What each node of a multi-node job may have of its own (JobSpec.nodes[i]).
NODE_FIELDS = ("image", "command", "environment", "resource_requirements", "vcpus", "memory",
               "gpus", "log_configuration")
MAIN_NODE_EXITED = "The main node exited"
# a job its queue's jobStateTimeLimitActions cancelled while RUNNABLE (AWS Batch User Guide,
# "Jobs stuck in a RUNNABLE status"); errors.time_limit_reason reads the reason back
TIME_LIMIT_CANCELLED = "Canceled by JobStateTimeLimit action due to reason: {reason}"


@dataclass(slots=True, eq=False, repr=False, kw_only=True)
class JobSpec:
    """What SubmitJob fixed: shared by an array parent and all of its children.

    The fields are the record's (schema.SPEC): `job_id`, `name`, `queue` and `created` are
    always there; any other may be missing (None) in a record another process wrote. Equality
    is identity, as for any job object; no generated repr (the environment may hold secrets).
    """

    job_id: str
    name: str
    queue: str
    definition_arn: Optional[str] = None
    definition_name: Optional[str] = None
    image: Optional[str] = None
    command: Optional[List[str]] = None
    environment: Optional[List[Dict[str, str]]] = None
    resource_requirements: Optional[List[Dict[str, str]]] = None
    vcpus: Optional[float] = None
    memory: Optional[int] = None
    retry_strategy: Optional[Dict[str, Any]] = None
    timeout: Optional[float] = None  # attemptDurationSeconds
    tags: Optional[Dict[str, str]] = None
    propagate_tags: Optional[bool] = None
    share_identifier: Optional[str] = None
    scheduling_priority: Optional[int] = None
    parameters: Optional[Dict[str, str]] = None
    depends_on: Optional[List[Dict[str, str]]] = None
    array_size: Optional[int] = None
    created: int
    seq: Optional[int] = None  # submission order within this process (own jobs always have one)
    platform_capabilities: Optional[List[str]] = None
    tag_total: Optional[int] = None
    log_configuration: Optional[Dict[str, Any]] = None
    gpus: Optional[int] = None
    num_nodes: Optional[int] = None
    main_node: Optional[int] = None
    nodes: Optional[List[Dict[str, Any]]] = None
    node_ranges: Optional[List[Dict[str, Any]]] = None
    consumables: Optional[List[List[Any]]] = None  # [name, quantity] of each consumable resource

    def to_record(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in SPEC_FIELDS if getattr(self, name) is not None}

    @classmethod
    def from_record(cls, record: Dict[str, Any]) -> "JobSpec":
        return cls(**{k: v for k, v in record.items() if k in SPEC_FIELDS})

    @property
    def max_attempts(self) -> int:
        return int((self.retry_strategy or {}).get("attempts") or 1)

    @property
    def exit_rules(self) -> List[Dict[str, str]]:
        return list((self.retry_strategy or {}).get("evaluateOnExit") or [])

    def node(self, index: Optional[int]) -> Dict[str, Any]:
        """The container settings of node `index` of a multi-node job (else the job's own)."""
        own = {name: getattr(self, name) for name in NODE_FIELDS}
        if self.nodes and index is not None and 0 <= index < len(self.nodes):
            own.update(self.nodes[index])
        return own

    def total_vcpus(self) -> float:
        """vCPUs the job needs at once: a multi-node job's nodes all run together."""
        if self.num_nodes:
            return sum(float(self.node(i)["vcpus"] or 1) for i in range(self.num_nodes))
        return float(self.vcpus or 1)


# The record's field names, in the order a record lists them.
SPEC_FIELDS = tuple(field.name for field in dataclasses.fields(JobSpec))


class Unit:
    """A plain job or one array child: the thing that has attempts and processes."""

    __slots__ = (
        "job", "index", "status", "reason", "created", "started", "stopped", "attempts",
        "current", "cancelled", "terminated",
        # not persisted: the scheduler's working state
        "unmet", "dependents", "handle", "deadline", "tick", "stop_reason", "kill_pending",
        "reserved", "runnable_since", "runnable_at", "host_loss_in", "host_loss_at",
        "lane", "holds", "reclaim_in", "reclaim_at", "spot_platform",
    )

    def __init__(self, job: "Job", index: Optional[int]) -> None:
        self.job = job
        self.index = index
        self.status: JobStatus = JobStatus.SUBMITTED
        self.reason: Optional[str] = None
        self.created: Optional[int] = None
        self.started: Optional[int] = None
        self.stopped: Optional[int] = None
        self.attempts: List[Dict[str, Any]] = []
        self.current: Optional[Dict[str, Any]] = None  # the attempt under way
        self.cancelled = False
        self.terminated = False
        self.unmet = 0
        self.dependents: List[Dependent] = []
        self.handle: Optional[AttemptHandle] = None
        self.deadline: Optional[float] = None
        self.tick = 0
        self.stop_reason: Optional[str] = None
        self.kill_pending: Optional[KillReason] = None  # to apply once the process exists
        self.reserved = 0.0
        self.runnable_since: Optional[float] = None  # held RUNNABLE for a reason, since (monotonic)
        self.runnable_at: Optional[int] = None  # when it last became RUNNABLE (epoch ms)
        self.host_loss_in: Optional[float] = None  # a fault: seconds after RUNNING the host goes
        self.host_loss_at: Optional[float] = None
        self.lane: Optional[str] = None  # the compute environment it queues for (runqueue.py)
        self.holds: Optional[List[Tuple[str, int]]] = None  # consumable resources it holds
        self.reclaim_in: Optional[float] = None  # a fault: seconds after RUNNING Spot reclaims it
        self.reclaim_at: Optional[float] = None
        self.spot_platform: Optional[str] = None  # SPOT or FARGATE_SPOT, once reclaimed

    @property
    def job_id(self) -> str:
        if self.index is None:
            return self.job.job_id
        return f"{self.job.job_id}{'#' if self.job.is_multinode else ':'}{self.index}"

    @property
    def is_main_node(self) -> bool:
        return self.job.is_multinode and self.index == self.job.spec.main_node

    @property
    def attempt_number(self) -> int:
        return len(self.attempts) + (1 if self.current is not None else 0)

    def to_record(self) -> Dict[str, Any]:
        record: Dict[str, Any] = {"status": self.status}
        for key, value in (("statusReason", self.reason), ("createdAt", self.created),
                           ("startedAt", self.started), ("stoppedAt", self.stopped),
                           ("current", self.current)):
            if value is not None:
                record[key] = value
        if self.attempts:
            record["attempts"] = self.attempts
        if self.cancelled:
            record["isCancelled"] = True
        if self.terminated:
            record["isTerminated"] = True
        return record

    def load(self, record: Dict[str, Any]) -> None:
        self.status = JobStatus(record.get("status", JobStatus.SUBMITTED))
        self.reason = record.get("statusReason")
        self.created = record.get("createdAt")
        self.started = record.get("startedAt")
        self.stopped = record.get("stoppedAt")
        self.current = record.get("current")
        self.attempts = list(record.get("attempts") or [])
        self.cancelled = bool(record.get("isCancelled"))
        self.terminated = bool(record.get("isTerminated"))


class Job:
    """One submitted job: a plain job (one unit) or an array parent (one unit per child)."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.job_id: str = spec.job_id
        self.is_array = spec.array_size is not None
        self.is_multinode = spec.num_nodes is not None
        self.has_children = self.is_array or self.is_multinode  # children "id:i" / nodes "id#i"
        self.status: JobStatus = JobStatus.SUBMITTED
        self.reason: Optional[str] = None
        self.started: Optional[int] = None
        self.stopped: Optional[int] = None
        self.cancelled = False
        self.terminated = False
        self.summary_updated: Optional[int] = spec.created
        self.childless = False  # an array failed before it spawned children
        self.shown_summary: Optional[Dict[str, int]] = None  # what a lagging statusSummary shows
        self.shown_summary_at: Optional[int] = None
        if self.has_children:
            self.units = [Unit(self, i) for i in range(spec.array_size or spec.num_nodes or 0)]
        else:
            self.units = [Unit(self, None)]
        self.counts: Dict[JobStatus, int] = {status: 0 for status in JobStatus}
        self.counts[JobStatus.SUBMITTED] = len(self.units)
        # per-status child indexes, for ListJobs(arrayJobId, jobStatus)
        self.by_status: Dict[JobStatus, Set[int]] = {status: set() for status in JobStatus}
        if self.has_children:
            self.by_status[JobStatus.SUBMITTED] = set(range(len(self.units)))
        # the scheduler's working state
        self.owner: Optional[List[Any]] = None  # records.owner_token of the process running it
        self.unmet = 0  # an array's unresolved whole-job dependencies (its "gate")
        self.gate_failed = False
        self.stop_reason: Optional[str] = None  # CancelJob/TerminateJob reason given to the parent
        self.dependents: List[Dependent] = []
        self.targets: List[Target] = []
        self.dirty: Set[int] = set()  # record chunks to rewrite; -1 is the parent file alone
        self.sink: Optional[Set["Job"]] = None  # where a dirty job announces itself

    # -- status changes ----------------------------------------------------------------------
    def touch(self, unit: Optional[Unit] = None) -> None:
        self.dirty.add(-1 if unit is None or unit.index is None else unit.index // CHUNK)
        if self.sink is not None:
            self.sink.add(self)

    def move(self, unit: Unit, status: JobStatus, now: int,
             reason: Union[Optional[str], EllipsisType] = ...) -> None:
        """Set a unit's status (and reason, when given), keeping every index in step."""
        old = unit.status
        if reason is not ...:
            unit.reason = reason
        if old != status:
            unit.status = status
            if status in FINISHED:
                unit.stopped = now
            index = unit.index
            if index is not None:  # a child: the job has_children
                self.counts[old] -= 1
                self.counts[status] += 1
                self.by_status[old].discard(index)
                self.by_status[status].add(index)
                self.summary_updated = now
                if status == JobStatus.RUNNING and self.started is None:
                    self.started = now
                if unit.is_main_node and status not in FINISHED and self.status not in FINISHED:
                    self.status = status  # a multi-node job is where its main node is
            else:
                self.status, self.stopped = status, unit.stopped
        if not self.has_children:
            self.reason, self.started = unit.reason, unit.started
        self.touch(unit)

    def finish_parent(self, status: JobStatus, reason: Optional[str], now: int) -> None:
        self.status, self.reason, self.stopped = status, reason, now
        self.touch()

    def drop_children(self) -> None:
        """An array that failed before spawning children has none to show."""
        self.units = []
        self.reindex()
        self.childless = True
        self.touch()

    @property
    def all_children_done(self) -> bool:
        return self.counts[JobStatus.SUCCEEDED] + self.counts[JobStatus.FAILED] == len(self.units)

    def unit(self, index: Optional[int]) -> Optional[Unit]:
        if index is None:
            return None if self.has_children else self.units[0]
        if not self.has_children or not 0 <= index < len(self.units):
            return None
        return self.units[index]

    # -- records -----------------------------------------------------------------------------
    @property
    def chunk_count(self) -> int:
        return (len(self.units) + CHUNK - 1) // CHUNK if self.has_children else 0

    def parent_record(self, owner: Optional[List[Any]]) -> Dict[str, Any]:
        record: Dict[str, Any] = {"format": 2, "owner": owner, "spec": self.spec.to_record(),
                                  "chunks": self.chunk_count, "chunkSize": CHUNK}
        if self.has_children:
            job: Dict[str, Any] = {"status": self.status}
            for key, value in (("statusReason", self.reason), ("startedAt", self.started),
                               ("stoppedAt", self.stopped),
                               ("statusSummaryLastUpdatedAt", self.summary_updated)):
                if value is not None:
                    job[key] = value
            if self.cancelled:
                job["isCancelled"] = True
            if self.terminated:
                job["isTerminated"] = True
            if self.childless:
                job["childless"] = True
            record["job"] = job
        else:
            record["unit"] = self.units[0].to_record()
        return record

    def chunk_record(self, chunk: int) -> Dict[str, Any]:
        start = chunk * CHUNK
        return {"start": start, "units": [u.to_record() for u in self.units[start:start + CHUNK]]}

    @classmethod
    def from_record(cls, record: Dict[str, Any], chunks: Iterable[Dict[str, Any]]) -> "Job":
        job = cls(JobSpec.from_record(record["spec"]))
        job.owner = record.get("owner")
        if job.has_children:
            parent = record.get("job") or {}
            job.status = JobStatus(parent.get("status", JobStatus.SUBMITTED))
            job.reason = parent.get("statusReason")
            job.started = parent.get("startedAt")
            job.stopped = parent.get("stoppedAt")
            job.summary_updated = parent.get("statusSummaryLastUpdatedAt")
            job.cancelled = bool(parent.get("isCancelled"))
            job.terminated = bool(parent.get("isTerminated"))
            if parent.get("childless"):
                job.units, job.childless = [], True
            for chunk in chunks:
                start = chunk.get("start", 0)
                for offset, unit_record in enumerate(chunk.get("units") or []):
                    if 0 <= start + offset < len(job.units):
                        job.units[start + offset].load(unit_record)
            job.reindex()
        else:
            unit = job.units[0]
            unit.load(record.get("unit") or {})
            job.status, job.reason = unit.status, unit.reason
            job.started, job.stopped = unit.started, unit.stopped
        return job

    def reindex(self) -> None:
        self.counts = {status: 0 for status in JobStatus}
        self.by_status = {status: set() for status in JobStatus}
        for unit in self.units:
            self.counts[unit.status] += 1
            if unit.index is not None:  # a child: the job has_children
                self.by_status[unit.status].add(unit.index)


# Who waits for a job or unit to end: a unit, or a whole array (its gate; dependson.py).
Dependent = Union[Unit, Job]
# What a job waits for (Job.targets): a unit or job of this process, another process's job id
# (polled from its record), or None (SEQUENTIAL: the array's own previous child).
Target = Tuple[DependencyKind, Union[Unit, Job, str, None]]


def too_many_tags(spec: JobSpec) -> bool:
    """More tags than Batch propagates: the job moves to FAILED (see JobSpec.tag_total)."""
    return (spec.tag_total or 0) > MAX_TAGS


# -- rendering: Batch's response shapes ------------------------------------------------------
def _container(job: Job, unit: Optional[Unit]) -> Dict[str, Any]:
    spec = job.spec.node(unit.index if unit is not None and job.is_multinode else None)
    container: Dict[str, Any] = {
        "image": spec["image"] or "batchfutures-local",
        "command": list(spec["command"] or []),
        "environment": [dict(item) for item in spec["environment"] or []],
        "resourceRequirements": [dict(item) for item in spec["resource_requirements"] or []],
        "volumes": [], "mountPoints": [], "ulimits": [],
    }
    if spec["log_configuration"]:
        container["logConfiguration"] = _copy(spec["log_configuration"])
    if unit is not None:
        attempt = unit.current or (unit.attempts[-1] if unit.attempts else None)
        if attempt is not None:
            for key, value in (attempt.get("container") or {}).items():
                container[key] = value
    return container


def _attempt(attempt: Dict[str, Any]) -> Dict[str, Any]:
    shown = {key: value for key, value in attempt.items() if key != "container" and value is not None}
    shown["container"] = dict(attempt.get("container") or {})
    return shown


def _dependencies(job: Job, unit: Optional[Unit]) -> List[Dict[str, str]]:
    declared = [dict(item) for item in job.spec.depends_on or []]
    if unit is None or unit.index is None:
        return declared
    shown = []
    for item in declared:  # a child shows what it waits for itself
        if item.get("type") == "N_TO_N" and item.get("jobId"):
            shown.append({"jobId": f"{item['jobId']}:{unit.index}", "type": "N_TO_N"})
        elif item.get("type") == "SEQUENTIAL":
            if unit.index > 0:
                shown.append({"jobId": f"{job.job_id}:{unit.index - 1}", "type": "SEQUENTIAL"})
    return shown


def status_summary(job: Job, lag_ms: int, now: int) -> Tuple[Dict[str, int], int]:
    """An array's statusSummary and when it was last updated.

    Without lag (0) it is the live count. With a lag, as on AWS, the summary shown is a
    snapshot refreshed at most every `lag_ms`: counts are hints, not the truth.
    """
    live = {status.value: n for status, n in job.counts.items()}
    if lag_ms <= 0:
        return live, job.summary_updated or job.spec.created
    if job.shown_summary is None or now - (job.shown_summary_at or 0) >= lag_ms:
        job.shown_summary, job.shown_summary_at = live, now
    return dict(job.shown_summary), job.shown_summary_at or now


def main_node(job: Job) -> Optional[Unit]:
    """A multi-node job's main node (None for other jobs, or nodes never made)."""
    if not job.is_multinode or not job.units:
        return None
    return job.unit(job.spec.main_node or 0)


class _ParentView:
    """What a multi-node parent shows: as AWS, its startedAt, stoppedAt, statusReason and exit
    information are its main node's; its status and flags stay its own."""

    def __init__(self, job: Job, main: Unit) -> None:
        self.status = job.status
        self.cancelled, self.terminated = job.cancelled, job.terminated
        self.started, self.stopped = main.started, main.stopped if job.status in FINISHED else None
        # the job's final reason came from the main node (or CancelJob, or the shutdown)
        self.reason = job.reason if job.status in FINISHED and job.reason else main.reason
        self.attempts = main.attempts


def _source(job: Job, shown: Optional[Unit]) -> Union[Unit, _ParentView, Job]:
    """Where a JobDetail's status fields come from: the unit, the array parent, or the main node."""
    if shown is not None:
        return shown
    main = main_node(job)
    return _ParentView(job, main) if main is not None else job


def describe(job: Job, unit: Optional[Unit] = None, *, summary_lag_ms: int = 0,
             now: int = 0) -> Dict[str, Any]:
    """The JobDetail of a job (unit None: the job itself; for an array, the parent)."""
    spec = job.spec
    shown = unit if unit is not None else (None if job.has_children else job.units[0])
    job_id = shown.job_id if shown is not None else job.job_id
    source = _source(job, shown)
    attempts = source.attempts if isinstance(source, (Unit, _ParentView)) else []
    detail: Dict[str, Any] = {
        "jobArn": job_arn(job_id), "jobName": spec.name, "jobId": job_id,
        "jobQueue": queue_arn(spec.queue), "jobDefinition": spec.definition_arn,
        "status": source.status,
        "createdAt": (shown.created if shown is not None and shown.created else spec.created),
        "attempts": [_attempt(a) for a in attempts],
        "container": _container(job, shown),
        "dependsOn": _dependencies(job, shown),
        "tags": dict(spec.tags or {}),
        "propagateTags": bool(spec.propagate_tags),
        "platformCapabilities": list(spec.platform_capabilities or ["EC2"]),
    }
    reason = source.reason
    started, stopped = source.started, source.stopped
    if reason:
        detail["statusReason"] = reason
    # botocore's model marks startedAt required; AWS leaves it out before a job starts. The model
    # wins here (clients validate against it): 0 means "not started yet".
    detail["startedAt"] = started if started is not None else 0
    if stopped is not None:
        detail["stoppedAt"] = stopped
    detail["isCancelled"] = bool(source.cancelled)
    detail["isTerminated"] = bool(source.terminated)
    if spec.retry_strategy:
        detail["retryStrategy"] = _copy(spec.retry_strategy)
    if spec.timeout:
        detail["timeout"] = {"attemptDurationSeconds": spec.timeout}
    if spec.parameters:
        detail["parameters"] = dict(spec.parameters)
    if spec.share_identifier is not None:
        detail["shareIdentifier"] = spec.share_identifier
    if spec.scheduling_priority is not None:
        detail["schedulingPriority"] = spec.scheduling_priority
    if spec.consumables:
        detail["consumableResourceProperties"] = consumable_properties(spec.consumables)
    if job.is_multinode:
        if shown is None:  # the parent: its nodes, no container of its own
            detail.pop("container")
            detail["nodeProperties"] = {"numNodes": spec.num_nodes, "mainNode": spec.main_node,
                                        "nodeRangeProperties": _copy(spec.node_ranges or [])}
        else:
            detail["nodeDetails"] = {"nodeIndex": shown.index, "isMainNode": shown.is_main_node}
    if job.is_array:
        if shown is None:
            counts, updated = status_summary(job, summary_lag_ms, now)
            detail["arrayProperties"] = {"statusSummary": counts, "size": spec.array_size,
                                         "statusSummaryLastUpdatedAt": updated}
        else:
            detail["arrayProperties"] = {"index": shown.index}
    return detail


def summary(job: Job, unit: Optional[Unit] = None) -> Dict[str, Any]:
    """The JobSummary (ListJobs) of a job or of one child."""
    spec = job.spec
    shown = unit if unit is not None else (None if job.has_children else job.units[0])
    source = _source(job, shown)
    job_id = shown.job_id if shown is not None else job.job_id
    item: Dict[str, Any] = {
        "jobArn": job_arn(job_id), "jobId": job_id, "jobName": spec.name,
        "createdAt": (shown.created if shown is not None and shown.created else spec.created),
        "status": source.status, "jobDefinition": spec.definition_arn,
    }
    if source.reason:
        item["statusReason"] = source.reason
    if source.started is not None:
        item["startedAt"] = source.started
    if source.stopped is not None:
        item["stoppedAt"] = source.stopped
    ended = shown if shown is not None else main_node(job)  # a multi-node parent: its main node's
    if ended is not None and ended.attempts and ended.current is None:
        last = ended.attempts[-1].get("container") or {}
        container = {key: last[key] for key in ("exitCode", "reason") if key in last}
        if container:
            item["container"] = container
    if job.is_array:
        item["arrayProperties"] = {"size": spec.array_size} if shown is None else {"index": shown.index}
    if job.is_multinode:
        item["nodeProperties"] = ({"numNodes": spec.num_nodes} if shown is None else
                                  {"isMainNode": shown.is_main_node, "numNodes": spec.num_nodes,
                                   "nodeIndex": shown.index})
    if spec.share_identifier is not None:
        item["shareIdentifier"] = spec.share_identifier
    item["isCancelled"] = bool(source.cancelled)
    item["isTerminated"] = bool(source.terminated)
    return item


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def consumable_properties(consumables: List[List[Any]]) -> Dict[str, Any]:
    """A job's consumable resources as botocore's ConsumableResourceProperties."""
    return {"consumableResourceList": [
        {"consumableResource": consumable_resource_arn(str(name)), "quantity": int(quantity)}
        for name, quantity in consumables]}
