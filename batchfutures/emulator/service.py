"""`BatchEmulator`: the AWS Batch API in process, each job attempt run as a local process
(or, chosen explicitly with ``launcher="threads"``, as a thread of this one: runtime/threads.py).

It has the methods of a boto3 `batch` client (keyword arguments and response dicts as in
botocore's model), validates each request as botocore does (`ParamValidationError`) and as Batch
does (`ClientError` with code ClientException), and hands jobs to the scheduler:

    submit_job ─> Job (jobstate.py) ─> JobTable (table.py) ─> records (records.py): <folder>/jobs
                       └────────────> Scheduler (runtime/scheduler.py) ─> ProcessLauncher
                                         │  (runtime/launcher.py); runtime/cgroups.py (or
                                         │  monitor.py), runtime/container.py
                                         └─ launcher="threads": ThreadLauncher (runtime/threads.py)
    describe_jobs, list_jobs <─ JobTable.find / in_queue <─ jobstate.describe / summary
    cancel_jobs, terminate_jobs: CancelJob/TerminateJob per job, one answer per job
    *_compute_environment(s) ─> computeenvs.py; *_job_queue(s) ─> catalog.Queues (a queue's
        jobs run in its first environment's lane of the run queue: runtime/runqueue.py)
    *_consumable_resource(s), list_jobs_by_consumable_resource ─> consumables.py
    *_scheduling_policies ─> catalog.py
    list_tags_for_resource, tag_resource, untag_resource ─> the job's record (its owner writes
        it), the definition's or queue's file; tag rules in tagging.py
    get_job_queue_snapshot <─ Scheduler.front_of_queue (+ other instances' RUNNABLE jobs)
    logs.get_log_events, filter_log_events, describe_log_streams, describe_log_groups
        ─> LogsService (logservice.py): <folder>/logs/...

This module is the API facade: botocore's validation, Batch's own checks, rendering, and the
fault profile (faults.py). What a job id means, own or foreign, alive, recovered or forgotten,
is the job table's business (table.py).
"""

from __future__ import annotations

import atexit
import enum
import functools
import itertools
import json
import logging
import os
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from ..batchlimits import MAX_BULK_STOP, MAX_DESCRIBE_JOBS
from ..statuses import FINISHED, STATUS_ORDER, JobStatus
from ..workdir import secure_emulator_folder
from . import computeenvs
from .catalog import (
    DEFAULT_DEFINITION,
    NAME,
    SHARE,
    Definitions,
    Queues,
    Rejected,
    SchedulingPolicies,
    check_scheduling_policy,
    check_time_limit_actions,
    resolve_resources,
)
from .computeenvs import SETTLE_SECONDS, ComputeEnvironments
from .consumables import ConsumableResources, check_create, requirements, updated_total
from .faults import FaultInjector, FaultProfile
from .jobstate import (
    DependencyKind,
    Job,
    Target,
    Unit,
    consumable_properties,
    describe,
    summary,
)
from .listing import job_filter, name_filter, offset_page, token, untoken
from .logservice import LogsService
from .model import (
    arn_resource,
    as_boto3_returns,
    client_error,
    compute_environment_arn,
    consumable_resource_arn,
    job_arn,
    queue_arn,
    scheduling_policy_arn,
    validate_request,
)
from .records import QueueStore, owner_token, process_alive
from .retries import normalized
from .runtime import cgroups as cgroups_module
from .runtime import host
from .runtime.attempts import AttemptLauncher, AttemptMonitor
from .runtime.container import ImageEntryPoints, Scratch, image_entry_points
from .runtime.launcher import ProcessLauncher
from .runtime.monitor import MemoryMonitor
from .runtime.scheduler import Scheduler, now_ms
from .runtime.threads import NullMonitor, ThreadLauncher
from .submitjob import (
    build_spec,
    check_array_size,
    check_common,
    check_environment,
    check_node_properties,
    check_request,
)
from .table import EXIT_REASON, JobTable
from .tagging import MAX_TAGS, check_keys, check_tags, tagged, untagged

logger = logging.getLogger("batchfutures")

__all__ = ["BatchEmulator", "client_error", "DEFAULT_DEFINITION"]

MAX_REASON = 1024  # characters of a CancelJob/TerminateJob reason
MAX_DEPENDENCIES = 20
SHUTDOWN_REASON = "batchfutures emulator: shut down (pid {pid}) before the job finished"
FRONT_OF_QUEUE = 100  # GetJobQueueSnapshot: the first 100 RUNNABLE jobs
MAX_QUEUE_ENVIRONMENTS = 3  # compute environments of one job queue
QUEUE_DELETED = "Job queue {queue} was deleted"  # the reason its remaining jobs are terminated
LOGS_OPERATIONS = {"GetLogEvents": "get_log_events", "FilterLogEvents": "filter_log_events",
                   "DescribeLogStreams": "describe_log_streams",
                   "DescribeLogGroups": "describe_log_groups"}


class Isolation(enum.Enum):
    """How an attempt's memory and CPU are limited."""

    AUTO = "auto"        # cgroups where this process may create them, else RLIMIT
    CGROUPS = "cgroups"  # cgroups, or ValueError when they cannot be made
    RLIMIT = "rlimit"    # RLIMIT_DATA and /proc sampling (the fallback), even where cgroups work


class Launcher(enum.Enum):
    """How an attempt runs."""

    PROCESS = "process"  # a fresh process per attempt, as a container (the default)
    THREADS = "threads"  # the worker's code in a thread of this process: no process, no limits


class StopAction(enum.Enum):
    CANCEL = "cancel"
    TERMINATE = "terminate"


def _api(operation: str) -> Callable[[Callable[..., Dict[str, Any]]], Callable[..., Dict[str, Any]]]:
    """Validate like botocore, inject faults, and turn Rejected into Batch's ClientError."""

    def decorate(method: Callable[..., Dict[str, Any]]) -> Callable[..., Dict[str, Any]]:
        @functools.wraps(method)
        def call(self: "BatchEmulator", **params: Any) -> Dict[str, Any]:
            validate_request(operation, params)
            self.faults.maybe_raise(operation, params)
            try:
                response = method(self, params)
            except Rejected as error:
                raise client_error(str(error), error.code, operation=operation) from None
            response = self.faults.hide_new(operation, response)  # describe_lag, list_lag
            if operation == "SubmitJob" and self.faults.reply_lost(operation):
                raise self.faults.lost_reply_error(operation)  # the job exists all the same
            return as_boto3_returns(operation, response)

        call.operation = operation  # type: ignore[attr-defined]
        return call

    return decorate


class BatchEmulator:
    """An in-process AWS Batch service whose jobs are local processes (see the module doc)."""

    _shared: Dict[str, "BatchEmulator"] = {}
    _shared_lock = threading.Lock()
    _live: "weakref.WeakValueDictionary[str, BatchEmulator]" = weakref.WeakValueDictionary()

    def __init__(self, folder: Union[str, "os.PathLike[str]"], *, max_vcpus: Optional[float] = None,
                 metadata_ttl: float = 86400, job_queues: Sequence[str] = ("batchfutures",),
                 compute_environment: str = "batchfutures-local",
                 isolation: Union[Isolation, str, None] = None, inherit_client_path: bool = False,
                 faults: Optional[FaultProfile] = None, gpus: Optional[int] = None,
                 max_memory_mib: Optional[int] = None,
                 launcher: Union[Launcher, str] = Launcher.PROCESS,
                 control_plane_delay: float = SETTLE_SECONDS,
                 images: Optional[ImageEntryPoints] = None) -> None:
        """``max_memory_mib``: the most memory a job may ask for, as the largest instance of
        a compute environment (default: this machine's); a job asking for more waits RUNNABLE
        with Batch's MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT reason. ``launcher="threads"``
        runs each attempt of the worker's command in a thread of this process (runtime/threads.py; no
        memory limits, no other commands); never chosen by default. ``control_plane_delay``:
        seconds a compute environment or queue stays CREATING, UPDATING or DELETING.
        ``images``: what an image runs when its job gives no command, {fnmatch pattern of the
        definition's ``image``: argv} (runtime/container.py's ``entry_point``)."""
        images = image_entry_points(images)  # ValueError before anything starts
        if max_vcpus is not None and not max_vcpus > 0:
            raise ValueError(f"max_vcpus={max_vcpus!r} must be positive")
        if max_memory_mib is not None and not max_memory_mib > 0:
            raise ValueError(f"max_memory_mib={max_memory_mib!r} must be positive")
        if not metadata_ttl > 0:
            raise ValueError(f"metadata_ttl={metadata_ttl!r} must be positive")
        try:
            self.launcher_kind = Launcher(launcher)
        except ValueError:
            raise ValueError(f"launcher={launcher!r} must be 'process' or 'threads'") from None
        threads = self.launcher_kind is Launcher.THREADS
        if threads and isolation is not None and Isolation(isolation) is Isolation.CGROUPS:
            raise ValueError("isolation='cgroups' needs launcher='process': threads have no cgroup")
        isolation = Isolation(isolation or os.environ.get("BATCHFUTURES_EMULATOR_ISOLATION") or "auto")
        found = None if isolation is Isolation.RLIMIT or threads else cgroups_module.detect()
        if isolation is Isolation.CGROUPS and found is None:
            raise ValueError("isolation='cgroups': this process cannot create cgroups here "
                             "(it needs Linux and a writable cgroup v1 memory or v2 hierarchy)")
        self.folder = secure_emulator_folder(folder)  # the user's own, 0700, no link (CONTRACT 9)
        self.instance_id = uuid.uuid4().hex
        self.max_vcpus = float(max_vcpus) if max_vcpus else float(host.cpu_count())
        self.gpus = host.gpu_count() if gpus is None else int(gpus)
        self.metadata_ttl = float(metadata_ttl)
        self.compute_environment = compute_environment
        self.cgroups = found  # None: RLIMIT_DATA and sampling
        self.inherit_client_path = bool(inherit_client_path)
        self.faults = FaultInjector(faults)
        self.logs = LogsService(self.folder / "logs", self)
        self.definitions = Definitions(self.folder)
        if not control_plane_delay >= 0:
            raise ValueError(f"control_plane_delay={control_plane_delay!r} must be >= 0")
        self.computeenvs = ComputeEnvironments(self.folder, compute_environment, self.max_vcpus,
                                               control_plane_delay)
        self.consumables = ConsumableResources(self.folder)
        self.queues = Queues(QueueStore(self.folder), job_queues, compute_environment,
                             control_plane_delay)
        self._lanes: Dict[str, Tuple[float, Any]] = {}  # cached queue -> environment, limits
        self.policies = SchedulingPolicies(self.folder)
        self._lock = threading.RLock()
        self._owner = owner_token(self.instance_id)
        self.table = JobTable(self.folder, self._lock, self._owner, self.metadata_ttl)
        self.store = self.table.store
        self._listeners: List[Callable[[], None]] = []
        self._seq = itertools.count()
        self._closed = False
        self.scratch = Scratch(self.folder, self._owner)
        self.monitor: AttemptMonitor = NullMonitor() if threads else MemoryMonitor()
        self.launcher: AttemptLauncher = ThreadLauncher() if threads else ProcessLauncher()
        self.scheduler = Scheduler(
            lock=self._lock, launcher=self.launcher, monitor=self.monitor, max_vcpus=self.max_vcpus,
            host_memory_mib=int(max_memory_mib) if max_memory_mib else host.memory_mib(),
            host_gpus=self.gpus,
            compute_environment=compute_environment,
            logs_folder=self.folder / "logs", on_change=self._notify,
            housekeeping=self._housekeeping, foreign_status=self.table.status_of,
            cgroups=self.cgroups, scratch=None if threads else self.scratch,  # a thread has no cwd
            inherit_client_path=self.inherit_client_path, faults=self.faults,
            queue_actions=self.queues.actions, lane_of=self._lane_of, lane_limit=self._lane_limit,
            gate=self.consumables, spot_type=self._spot_type, images=images)
        self.scheduler.start()
        BatchEmulator._live[self.instance_id] = self
        atexit.register(_close_at_exit, weakref.ref(self))
        # leftovers of dead processes (records, cgroups, scratch folders) go in the background
        threading.Thread(target=self._sweep, name="bf-emulator-sweep", daemon=True).start()

    @classmethod
    def shared(cls, folder: Union[str, "os.PathLike[str]"], **kwargs: Any) -> "BatchEmulator":
        """One emulator per folder per process, so its vCPU limit holds for all its users.

        The first call's settings win; later calls get the same instance until it is closed.
        """
        key = os.path.abspath(Path(folder).expanduser())  # not resolved: a link is refused
        with cls._shared_lock:
            emulator = cls._shared.get(key)
            if emulator is None or emulator._closed:
                emulator = cls._shared[key] = cls(key, **kwargs)
            return emulator

    # -- plumbing ----------------------------------------------------------------------------
    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call `callback()` (from the emulator's thread) whenever any job changes status."""
        with self._lock:
            self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._listeners:
                self._listeners.remove(callback)

    def inject_faults(self, rate: float, *, code: str = "TooManyRequestsException",
                      operations: Optional[Any] = None, seed: Optional[int] = None) -> None:
        """Answer `rate` of the calls (of `operations` only, e.g. {"DescribeJobs"}) with `code`
        (429 for throttling codes, 500 for ServerException); the rest of the profile stays."""
        self.faults.configure(rate, code=code, operations=operations, seed=seed)

    def set_faults(self, profile: Optional[FaultProfile]) -> None:
        """Replace the fault profile (None: no faults); random streams restart from its seed."""
        self.faults.set(profile or FaultProfile())

    @property
    def fault_profile(self) -> FaultProfile:
        return self.faults.profile

    def invoke(self, operation: str, params: Dict[str, Any]) -> Dict[str, Any]:
        """Call an operation by its API name ("SubmitJob", "GetLogEvents"), as a server would."""
        if operation in LOGS_OPERATIONS:
            return getattr(self.logs, LOGS_OPERATIONS[operation])(**params)
        method = _OPERATIONS.get(operation)
        if method is None:
            raise client_error(f"The emulator does not implement {operation}", operation=operation)
        return method(self, **params)

    def _notify(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for callback in listeners:
            try:
                callback()
            except Exception:  # a listener's bug must not stop the scheduler
                logger.exception("batchfutures emulator: listener failed")

    # -- where a queue's jobs run: its first compute environment (cached briefly) ------------
    LANE_TTL = 0.5  # seconds: another process's control-plane change is seen this late

    def _cached(self, key: str, compute: Callable[[], Any]) -> Any:
        now = time.monotonic()
        found = self._lanes.get(key)
        if found is None or now - found[0] > self.LANE_TTL:
            found = self._lanes[key] = (now, compute())
        return found[1]

    def _control_plane_changed(self) -> None:
        self._lanes.clear()
        self.scheduler.wake()

    def _lane_of(self, unit: Unit) -> str:
        queue = unit.job.spec.queue
        return self._cached(f"q/{queue}", lambda: self.queues.environments(queue)[0])

    def _lane_limit(self, lane: str) -> Tuple[Optional[float], bool]:
        return self._cached(f"ce/{lane}", lambda: self.computeenvs.capacity(lane))

    def _spot_type(self, lane: str) -> Optional[str]:
        return self._cached(f"spot/{lane}", lambda: self.computeenvs.spot_type(lane))

    # -- job queues --------------------------------------------------------------------------
    @_api("DescribeJobQueues")
    def describe_job_queues(self, params: Dict[str, Any]) -> Dict[str, Any]:
        with self._lock:
            wanted = params.get("jobQueues")
            names = [self.queues.resolve(q) for q in wanted] if wanted else self.queues.names()
            names = [n for n in names if n is not None]
            page, more = offset_page(names, params.get("nextToken"), int(params.get("maxResults") or 100))
            return {"jobQueues": [self.queues.detail(n) for n in page], **more}

    def _environment_order(self, order: List[Dict[str, Any]]) -> List[str]:
        """The names of a queue's compute environments, in their `order`; Rejected as Batch
        refuses them: more than 3, one that does not exist or is not VALID, repeated orders,
        EC2 and Fargate environments mixed."""
        if len(order) > MAX_QUEUE_ENVIRONMENTS:
            raise Rejected(f"computeEnvironmentOrder takes at most {MAX_QUEUE_ENVIRONMENTS} "
                           f"compute environments, got {len(order)}")
        if len({item["order"] for item in order}) != len(order):
            raise Rejected("computeEnvironmentOrder: each compute environment needs its own order")
        names: List[str] = []
        platforms = set()
        for item in sorted(order, key=lambda item: item["order"]):
            reference = item["computeEnvironment"]
            name = self.computeenvs.resolve(reference)
            if name is None:
                raise Rejected(_missing_environment(reference))
            status = "VALID" if name == self.compute_environment else (
                self.computeenvs.load(name) or {}).get("status")
            if status != "VALID":
                raise Rejected(f"Compute environment {compute_environment_arn(name)} is {status}: "
                               "compute environments must be VALID before they are attached to "
                               "a job queue")
            kind = ("EC2" if name == self.compute_environment else
                    ((self.computeenvs.load(name) or {}).get("computeResources") or {}).get("type", "EC2"))
            platforms.add("FARGATE" if kind in computeenvs.FARGATE_TYPES else "EC2")
            names.append(name)
        if len(platforms) > 1:
            raise Rejected("All of the compute environments must be either EC2 (EC2 or SPOT) or "
                           "Fargate (FARGATE or FARGATE_SPOT). EC2 and Fargate compute "
                           "environments can't be mixed.")
        return names

    @_api("CreateJobQueue")
    def create_job_queue(self, params: Dict[str, Any]) -> Dict[str, Any]:
        name = params["jobQueueName"]
        if not NAME.fullmatch(name):
            raise Rejected(f"jobQueueName {name!r} must be 1-128 letters, digits, hyphens and underscores")
        state = params.get("state")
        if state is not None and state not in ("ENABLED", "DISABLED"):
            raise Rejected(f"state must be ENABLED or DISABLED, got {state!r}")
        if params.get("serviceEnvironmentOrder"):
            raise Rejected("serviceEnvironmentOrder: the emulator runs only ECS job queues")
        policy = params.get("schedulingPolicyArn")
        if policy is not None and self.policies.resolve(policy) is None:
            raise Rejected(f"Scheduling policy {policy} does not exist")
        problem = check_tags(params.get("tags"))
        if problem:
            raise Rejected(problem)
        with self._lock:
            problem = check_time_limit_actions(params.get("jobStateTimeLimitActions"))
            if problem:
                raise Rejected(problem)
            environments = self._environment_order(params.get("computeEnvironmentOrder") or [])
            if not self.queues.create(name, state or "ENABLED", params.get("priority") or 1,
                                      params.get("jobStateTimeLimitActions"), policy,
                                      params.get("tags"), environments):
                raise Rejected(f"Object already exists: job queue {name}")
            self._control_plane_changed()
        return {"jobQueueName": name, "jobQueueArn": queue_arn(name)}

    @_api("UpdateJobQueue")
    def update_job_queue(self, params: Dict[str, Any]) -> Dict[str, Any]:
        state = params.get("state")
        if state is not None and state not in ("ENABLED", "DISABLED"):
            raise Rejected(f"state must be ENABLED or DISABLED, got {state!r}")
        with self._lock:
            name = self.queues.resolve(params["jobQueue"])
            if name is None:
                raise Rejected(f"Job queue {params['jobQueue']} does not exist")
            if self.queues.status(name) == "DELETING":
                raise Rejected(f"Cannot update, job queue {name} is being deleted")
            problem = check_time_limit_actions(params.get("jobStateTimeLimitActions"))
            if problem:
                raise Rejected(problem)
            policy = params.get("schedulingPolicyArn")
            if policy is not None:
                if self.queues.policy(name) is None:  # as Batch: a FIFO queue stays FIFO
                    raise Rejected(f"Job queue {name} has no scheduling policy: one cannot be "
                                   "added after the queue was created")
                if self.policies.resolve(policy) is None:
                    raise Rejected(f"Scheduling policy {policy} does not exist")
            order = params.get("computeEnvironmentOrder")
            environments = self._environment_order(order) if order is not None else None
            self.queues.update(name, state, params.get("priority"), params.get("jobStateTimeLimitActions"),
                               policy, environments)
            self._control_plane_changed()
        return {"jobQueueName": name, "jobQueueArn": queue_arn(name)}

    @_api("DeleteJobQueue")
    def delete_job_queue(self, params: Dict[str, Any]) -> Dict[str, Any]:
        """As Batch: the queue must be DISABLED first; it is DELETING, then gone, and the jobs
        still in it are terminated."""
        with self._lock:
            name = self.queues.resolve(params["jobQueue"])
            if name is None:
                raise Rejected(f"Job queue {params['jobQueue']} does not exist")
            status = self.queues.status(name)
            if status == "DELETING":
                return {}
            if self.queues.state(name) != "DISABLED":
                raise Rejected(f"Cannot delete, job queue {name} is ENABLED: disable it with "
                               "UpdateJobQueue first")
            if status != "VALID":
                raise Rejected("Cannot delete, resource is being modified")
            self.queues.delete(name)
            self._control_plane_changed()
            for job in self.table.in_queue(name):
                if self.table.is_own(job) and job.status not in FINISHED:
                    self.scheduler.terminate(job, None, QUEUE_DELETED.format(queue=name))
        return {}

    # -- compute environments ----------------------------------------------------------------
    @_api("DescribeComputeEnvironments")
    def describe_compute_environments(self, params: Dict[str, Any]) -> Dict[str, Any]:
        """The emulator's own environment and those created here; names and ARNs it does not
        know are left out of the answer, as Batch leaves them out."""
        wanted = params.get("computeEnvironments")
        if wanted is not None and len(wanted) > 100:
            raise Rejected("computeEnvironments takes at most 100 entries")
        size = _page_size(params.get("maxResults"))
        if wanted:
            names = [n for n in dict.fromkeys(self.computeenvs.resolve(w) for w in wanted) if n]
        else:
            names = self.computeenvs.names()
        page, more = offset_page(names, params.get("nextToken"), size)
        return {"computeEnvironments": [self.computeenvs.detail(n) for n in page], **more}

    @_api("CreateComputeEnvironment")
    def create_compute_environment(self, params: Dict[str, Any]) -> Dict[str, Any]:
        name = params["computeEnvironmentName"]
        if not NAME.fullmatch(name):
            raise Rejected(f"computeEnvironmentName {name!r}: {computeenvs.NAME_RULE}")
        problem = computeenvs.check_create(params) or check_tags(params.get("tags"))
        if problem:
            raise Rejected(problem)
        body = json.loads(json.dumps({k: v for k, v in params.items() if v is not None}))
        with self._lock:
            if not self.computeenvs.create(name, body):
                raise Rejected(f"Object already exists: compute environment {name}")
            self._control_plane_changed()
        return {"computeEnvironmentName": name,
                "computeEnvironmentArn": compute_environment_arn(name)}

    def _own_environment(self, reference: str) -> Tuple[str, Dict[str, Any]]:
        """A created environment's name and record; Rejected when there is none (or it is the
        emulator's own, which is not changed through the API)."""
        name = self.computeenvs.resolve(reference)
        if name is None:
            raise Rejected(_missing_environment(reference))
        if name == self.compute_environment:
            raise Rejected(f"Compute environment {name} is the emulator's own: it is sized by "
                           "BatchEmulator(max_vcpus=...) and cannot be changed or deleted")
        record = self.computeenvs.load(name)
        if record is None:
            raise Rejected(f"{compute_environment_arn(name)} does not exist")
        return name, record

    @_api("UpdateComputeEnvironment")
    def update_compute_environment(self, params: Dict[str, Any]) -> Dict[str, Any]:
        with self._lock:
            name, record = self._own_environment(params["computeEnvironment"])
            problem = computeenvs.check_update(record, params)
            if problem:
                raise Rejected(problem)
            updated = dict(record, status="UPDATING", changedAt=time.time())
            for key in ("state", "serviceRole", "unmanagedvCpus"):
                if params.get(key) is not None:
                    updated[key] = params[key]
            if params.get("computeResources") is not None:
                updated["computeResources"] = computeenvs.merged_resources(
                    record["computeResources"], json.loads(json.dumps(params["computeResources"])))
            self.computeenvs.write(name, updated)
            self._control_plane_changed()
        return {"computeEnvironmentName": name,
                "computeEnvironmentArn": compute_environment_arn(name)}

    @_api("DeleteComputeEnvironment")
    def delete_compute_environment(self, params: Dict[str, Any]) -> Dict[str, Any]:
        """As Batch: DISABLED first, attached to no job queue (even one being deleted)."""
        with self._lock:
            name, record = self._own_environment(params["computeEnvironment"])
            if record["status"] == "DELETING":
                return {}
            if record["status"] != "VALID":
                raise Rejected(computeenvs.BEING_MODIFIED)
            if record["state"] != "DISABLED":
                raise Rejected(f"Cannot delete, compute environment {name} is ENABLED: disable "
                               "it with UpdateComputeEnvironment first")
            if any(name in self.queues.environments(q) for q in self.queues.names()):
                raise Rejected(computeenvs.IN_USE)
            self.computeenvs.delete(name, record)
            self._control_plane_changed()
        return {}

    # -- scheduling policies -----------------------------------------------------------------
    @_api("CreateSchedulingPolicy")
    def create_scheduling_policy(self, params: Dict[str, Any]) -> Dict[str, Any]:
        name = params["name"]
        if not NAME.fullmatch(name):
            raise Rejected(f"name {name!r} must be 1-128 letters, digits, hyphens and underscores")
        problem = check_scheduling_policy(params.get("fairsharePolicy"), params.get("tags"))
        if problem:
            raise Rejected(problem)
        body = {key: params[key] for key in ("fairsharePolicy", "quotaSharePolicy", "tags")
                if params.get(key) is not None}
        created = self.policies.create(name, json.loads(json.dumps(body)))
        if created is None:
            raise Rejected(f"Object already exists: scheduling policy {name}")
        return {"name": name, "arn": created["arn"]}

    @_api("DescribeSchedulingPolicies")
    def describe_scheduling_policies(self, params: Dict[str, Any]) -> Dict[str, Any]:
        arns = params["arns"]
        if len(arns) > 100:
            raise Rejected("arns takes at most 100 entries")
        found = [self.policies.resolve(arn) for arn in arns]
        return {"schedulingPolicies": [_policy_detail(p) for p in found if p is not None]}

    @_api("ListSchedulingPolicies")
    def list_scheduling_policies(self, params: Dict[str, Any]) -> Dict[str, Any]:
        size = _page_size(params.get("maxResults"), 1000)
        names = self.policies.names()
        shown, more = offset_page(names, params.get("nextToken"), size)
        page = [self.policies.resolve(scheduling_policy_arn(n)) for n in shown]
        return {"schedulingPolicies": [{"arn": p["arn"]} for p in page if p], **more}

    # -- job definitions ---------------------------------------------------------------------
    @_api("RegisterJobDefinition")
    def register_job_definition(self, params: Dict[str, Any]) -> Dict[str, Any]:
        name = params["jobDefinitionName"]
        if not NAME.fullmatch(name):
            raise Rejected(f"jobDefinitionName {name!r} must be 1-128 letters, digits, hyphens "
                           "and underscores")
        if params["type"] not in ("container", "multinode"):
            raise Rejected(f"job definition type {params['type']!r}: the emulator runs "
                           "'container' and 'multinode' jobs")
        for unsupported in ("eksProperties", "ecsProperties"):
            if params.get(unsupported):
                raise Rejected(f"{unsupported}: the emulator runs only container jobs")
        if params["type"] == "multinode":
            if params.get("containerProperties"):
                raise Rejected("a multinode job definition takes nodeProperties, not "
                               "containerProperties")
            check_node_properties(params.get("nodeProperties"))
        else:
            if params.get("nodeProperties"):
                raise Rejected("nodeProperties needs a job definition of type multinode")
            properties = params.get("containerProperties")
            if properties is None:
                raise Rejected("containerProperties is required for a container job definition")
            check_environment(properties.get("environment"))
            resolve_resources(properties, {})
        check_common(params.get("retryStrategy"), params.get("timeout"))
        self._check_consumables(params.get("consumableResourceProperties"))
        problem = check_tags(params.get("tags"))
        if problem:
            raise Rejected(problem)
        body = {key: value for key, value in params.items() if key != "jobDefinitionName"}
        if body.get("retryStrategy"):
            body["retryStrategy"] = normalized(body["retryStrategy"])
        definition = self.definitions.register(name, json.loads(json.dumps(body)))
        return {key: definition[key] for key in ("jobDefinitionName", "jobDefinitionArn", "revision")}

    @_api("DescribeJobDefinitions")
    def describe_job_definitions(self, params: Dict[str, Any]) -> Dict[str, Any]:
        found: List[Dict[str, Any]] = []
        references = params.get("jobDefinitions")
        if references:
            if len(references) > 100:
                raise Rejected("jobDefinitions takes at most 100 entries")
            for reference in references:
                name = arn_resource(reference, "job-definition") or reference
                if ":" in name:
                    definition = self.definitions.resolve(name, active_only=False)
                    found.extend([definition] if definition else [])
                else:
                    found.extend(self.definitions.revisions(name))
        else:
            wanted = params.get("jobDefinitionName")
            for name in ([wanted] if wanted else self.definitions.names()):
                found.extend(self.definitions.revisions(name))
        status = params.get("status")
        if status:
            found = [d for d in found if d.get("status") == status]
        found.sort(key=lambda d: (d["jobDefinitionName"], d["revision"]))
        page, more = offset_page(found, params.get("nextToken"), int(params.get("maxResults") or 100))
        return {"jobDefinitions": [json.loads(json.dumps(d)) for d in page], **more}

    @_api("DeregisterJobDefinition")
    def deregister_job_definition(self, params: Dict[str, Any]) -> Dict[str, Any]:
        definition = self.definitions.resolve(params["jobDefinition"], active_only=False)
        if definition is None:
            raise Rejected(f"Job definition {params['jobDefinition']} does not exist")
        self.definitions.set_status(definition, "INACTIVE")
        return {}

    # -- tags: ListTagsForResource, TagResource, UntagResource --------------------------------
    @_api("ListTagsForResource")
    def list_tags_for_resource(self, params: Dict[str, Any]) -> Dict[str, Any]:
        return {"tags": self._resource(params["resourceArn"]).tags()}

    @_api("TagResource")
    def tag_resource(self, params: Dict[str, Any]) -> Dict[str, Any]:
        added = params["tags"]
        problem = check_tags(added)
        if problem:
            raise Rejected(problem)
        resource = self._resource(params["resourceArn"])
        with self._lock:
            tags = tagged(resource.tags(), added)
            if len(tags) > MAX_TAGS:
                raise Rejected(f"tags: a resource takes at most {MAX_TAGS} tags; it would have "
                               f"{len(tags)}")
            resource.set(tags)
        return {}

    @_api("UntagResource")
    def untag_resource(self, params: Dict[str, Any]) -> Dict[str, Any]:
        keys = params["tagKeys"]
        problem = check_keys(keys)
        if problem:
            raise Rejected(problem)
        resource = self._resource(params["resourceArn"])
        with self._lock:
            resource.set(untagged(resource.tags(), keys))
        return {}

    def _resource(self, arn: str) -> "_Tagged":
        """The taggable resource an ARN names: a job (not a child or node), a job definition
        revision, a job queue; ClientException for any other ARN."""
        job_id = arn_resource(arn, "job")
        if job_id is not None:
            found = self.table.find(job_id) if ":" not in job_id and "#" not in job_id else None
            if found is None or job_arn(found[0].job_id) != arn:
                raise Rejected(f"Resource {arn} not found")
            return _JobTags(self, found[0])
        name = arn_resource(arn, "job-definition")
        if name is not None:
            definition = (self.definitions.resolve(name, active_only=False)
                          if ":" in name else None)
            if definition is None or definition["jobDefinitionArn"] != arn:
                raise Rejected(f"Resource {arn} not found")
            return _DefinitionTags(self, definition)
        queue = arn_resource(arn, "job-queue")
        if queue is not None:
            if self.queues.resolve(queue) != queue or queue_arn(queue) != arn:
                raise Rejected(f"Resource {arn} not found")
            return _QueueTags(self, queue)
        environment = arn_resource(arn, "compute-environment")
        if environment is not None:
            named = self.computeenvs.resolve(environment)
            if named is None or named == self.compute_environment or compute_environment_arn(named) != arn:
                raise Rejected(f"Resource {arn} not found")
            return _StoredTags(self.computeenvs.load, self.computeenvs.write, named)
        resource = arn_resource(arn, "consumable-resource")
        if resource is not None:
            if self.consumables.resolve(resource) != resource or consumable_resource_arn(resource) != arn:
                raise Rejected(f"Resource {arn} not found")
            return _StoredTags(self.consumables.load, self.consumables.write, resource)
        raise Rejected(f"Resource {arn} is not a job, job definition, job queue, compute "
                       "environment or consumable resource ARN of this account and Region")

    def _set_job_tags(self, job: Job, tags: Dict[str, str]) -> None:
        """A job's tags, in its record: written by its owner (this instance, another of this
        process, or, through <folder>/control, another process); the record itself when its
        owner is gone."""
        if self.table.is_own(job):
            with self._lock:
                job.spec.tags = dict(tags)
                job.touch()
            return
        owner = job.owner or []
        instance = owner[2] if len(owner) > 2 else None
        if instance is not None and process_alive(owner):
            other = BatchEmulator._live.get(instance)
            if other is not None and not other._closed:  # another instance of this process
                own = other.table.own.get(job.job_id)
                if own is not None:
                    other._set_job_tags(own, tags)
                    return
            elif int(owner[0]) != os.getpid():  # another process: its owner writes the record
                self.store.send_control(instance, {"action": "tag", "jobId": job.job_id,
                                                   "tags": dict(tags)})
                return
        self.table.retag(job.job_id, tags)  # its owner is gone (or closed): nobody writes it

    # -- consumable resources ----------------------------------------------------------------
    def _consumable(self, reference: str) -> str:
        name = self.consumables.resolve(reference)
        if name is None:
            raise Rejected(f"Consumable resource {reference} does not exist")
        return name

    def _check_consumables(self, properties: Optional[Dict[str, Any]]) -> None:
        """Rejected when a job (definition) names a consumable resource that does not exist or
        asks for less than one unit of it."""
        for item in (properties or {}).get("consumableResourceList") or []:
            quantity = item.get("quantity")
            if quantity is None or quantity < 1:
                raise Rejected(f"consumableResource {item.get('consumableResource')}: quantity "
                               f"must be at least 1, got {quantity}")
        for name, _ in requirements(properties):
            self._consumable(name)

    @_api("CreateConsumableResource")
    def create_consumable_resource(self, params: Dict[str, Any]) -> Dict[str, Any]:
        name = params["consumableResourceName"]
        problem = (check_create(name, params.get("totalQuantity"), params.get("resourceType"))
                   or check_tags(params.get("tags")))
        if problem:
            raise Rejected(problem)
        if not self.consumables.create(name, int(params.get("totalQuantity") or 0),
                                       params.get("resourceType") or "REPLENISHABLE",
                                       params.get("tags")):
            raise Rejected(f"Object already exists: consumable resource {name}")
        return {"consumableResourceName": name,
                "consumableResourceArn": consumable_resource_arn(name)}

    @_api("DescribeConsumableResource")
    def describe_consumable_resource(self, params: Dict[str, Any]) -> Dict[str, Any]:
        with self._lock:
            found = self.consumables.summary(self._consumable(params["consumableResource"]))
        assert found is not None  # it was just resolved
        return found

    @_api("ListConsumableResources")
    def list_consumable_resources(self, params: Dict[str, Any]) -> Dict[str, Any]:
        size = _page_size(params.get("maxResults"))
        match = name_filter(params.get("filters"), "CONSUMABLE_RESOURCE_NAME")
        names = [n for n in self.consumables.names() if match(n)]
        shown, more = offset_page(names, params.get("nextToken"), size)
        page: List[Dict[str, Any]] = []
        with self._lock:
            for name in shown:
                found = self.consumables.summary(name)
                if found is not None:
                    page.append({key: found[key] for key in (
                        "consumableResourceArn", "consumableResourceName", "totalQuantity",
                        "inUseQuantity", "resourceType")})
        return {"consumableResources": page, **more}

    @_api("UpdateConsumableResource")
    def update_consumable_resource(self, params: Dict[str, Any]) -> Dict[str, Any]:
        with self._lock:
            name = self._consumable(params["consumableResource"])
            record = self.consumables.load(name)
            assert record is not None
            total, problem = updated_total(record["totalQuantity"], params.get("operation"),
                                           params.get("quantity"))
            if problem:
                raise Rejected(problem)
            self.consumables.write(name, dict(record, totalQuantity=total))
            self.scheduler.wake()  # a job waiting for more units may start now
        return {"consumableResourceName": name, "consumableResourceArn": consumable_resource_arn(name),
                "totalQuantity": total}

    @_api("DeleteConsumableResource")
    def delete_consumable_resource(self, params: Dict[str, Any]) -> Dict[str, Any]:
        with self._lock:
            self.consumables.delete(self._consumable(params["consumableResource"]))
        return {}

    @_api("ListJobsByConsumableResource")
    def list_jobs_by_consumable_resource(self, params: Dict[str, Any]) -> Dict[str, Any]:
        """This folder's jobs (plain jobs and array parents) that need the resource, oldest
        first, with the quantity each needs."""
        name = self._consumable(params["consumableResource"])
        size = _page_size(params.get("maxResults"))
        statuses: Optional[Set[str]] = None
        names_match = name_filter(params.get("filters"), "JOB_NAME")
        for item in params.get("filters") or []:
            if item.get("name") == "JOB_STATUS":
                statuses = set(item.get("values") or [])
        found: List[Tuple[Tuple[int, str], Dict[str, Any]]] = []
        for queue in self.queues.names():
            for job in self.table.in_queue(queue):
                with self._lock:
                    needs = dict(job.spec.consumables or [])
                    if name not in needs or not names_match(job.spec.name):
                        continue
                    if statuses is not None and job.status not in statuses:
                        continue
                    entry: Dict[str, Any] = {
                        "jobArn": job_arn(job.job_id), "jobQueueArn": queue_arn(queue),
                        "jobName": job.spec.name, "jobStatus": str(job.status),
                        "quantity": int(needs[name]), "createdAt": job.spec.created,
                        "consumableResourceProperties": consumable_properties(job.spec.consumables or []),
                    }
                    if job.spec.definition_arn:
                        entry["jobDefinitionArn"] = job.spec.definition_arn
                    if job.spec.share_identifier:
                        entry["shareIdentifier"] = job.spec.share_identifier
                    shown = describe(job, None)
                    if shown.get("statusReason"):
                        entry["statusReason"] = shown["statusReason"]
                    if shown.get("startedAt"):
                        entry["startedAt"] = shown["startedAt"]
                    found.append(((job.spec.created, job.job_id), entry))
        found.sort(key=lambda item: item[0])
        page, more = offset_page(found, params.get("nextToken"), size)
        return {"jobs": [entry for _, entry in page], **more}

    # -- GetJobQueueSnapshot -----------------------------------------------------------------
    @_api("GetJobQueueSnapshot")
    def get_job_queue_snapshot(self, params: Dict[str, Any]) -> Dict[str, Any]:
        """The queue's first RUNNABLE jobs in the order they would start: this instance's (in
        its scheduler's order), then other instances' (in submission order)."""
        queue = self.queues.resolve(params["jobQueue"])
        if queue is None:
            raise Rejected(f"Job queue {params['jobQueue']} does not exist")
        now = now_ms()
        with self._lock:
            front = [(u.job_id, u.runnable_at or u.created or u.job.spec.created)
                     for u in self.scheduler.front_of_queue(queue, FRONT_OF_QUEUE)]
        if len(front) < FRONT_OF_QUEUE:
            others: List[Tuple[Tuple[int, str, int], str, int]] = []
            for job in self.table.in_queue(queue):
                if self.table.is_own(job):
                    continue
                with self._lock:
                    units = ([job.units[i] for i in sorted(job.by_status[JobStatus.RUNNABLE])]
                             if job.has_children else
                             [u for u in job.units if u.status == JobStatus.RUNNABLE])
                    for unit in units[:FRONT_OF_QUEUE]:
                        others.append(((job.spec.created, job.job_id, unit.index or 0),
                                       unit.job_id, unit.created or job.spec.created))
            others.sort(key=lambda item: item[0])
            front += [(job_id, since) for _, job_id, since in others[:FRONT_OF_QUEUE - len(front)]]
        with self._lock:
            usage = self.scheduler.runnable.usage(queue)
            fair_share = self.queues.policy(queue) is not None
        return {"frontOfQueue": {
            "jobs": [{"jobArn": job_arn(job_id), "earliestTimeAtPosition": since}
                     for job_id, since in front],
            "lastUpdatedAt": now}, "queueUtilization": queue_utilization(usage, fair_share, now)}

    # -- SubmitJob ---------------------------------------------------------------------------
    @_api("SubmitJob")
    def submit_job(self, params: Dict[str, Any]) -> Dict[str, Any]:
        if self._closed:
            raise Rejected("The batchfutures emulator is closed", "ServerException")
        check_request(params)
        name = params["jobName"]
        with self._lock:
            queue = self.queues.resolve(params["jobQueue"])
            if queue is None:
                raise Rejected(f"Job queue {params['jobQueue']} does not exist")
            if self.queues.state(queue) != "ENABLED":
                raise Rejected(f"Job queue {queue} is DISABLED: it does not accept jobs")
            fair_share = self.queues.policy(queue) is not None
        share = params.get("shareIdentifier")
        if share is not None and not SHARE.fullmatch(share):
            raise Rejected(f"shareIdentifier {share!r} must be 1-255 letters and digits, "
                           "optionally followed by *")
        if share is not None and not fair_share:  # as Batch: only a fair-share queue takes one
            raise Rejected(f"shareIdentifier {share!r}: job queue {queue} has no scheduling policy "
                           "(a share identifier needs a fair-share queue)")
        if share is None and fair_share:
            raise Rejected(f"Job queue {queue} has a fair-share scheduling policy: a job "
                           "submitted to it needs a shareIdentifier")
        definition = self.definitions.resolve(params["jobDefinition"])
        if definition is None:
            raise Rejected(f"Job definition {params['jobDefinition']} does not exist or is not ACTIVE")
        array_size = check_array_size(params)
        self._check_consumables(params.get("consumableResourcePropertiesOverride"))
        targets = self._dependency_targets(params.get("dependsOn") or [], array_size)
        job_id = str(uuid.uuid4())
        spec = build_spec(params, definition, job_id=job_id, queue=queue, created=now_ms(),
                          seq=next(self._seq))
        job = Job(spec)
        job.targets = targets
        with self._lock:
            if self._closed:
                raise Rejected("The batchfutures emulator is closed", "ServerException")
            self.table.add(job)
            self.scheduler.add(job)
        return {"jobArn": job_arn(job_id), "jobName": name, "jobId": job_id}

    def _dependency_targets(self, depends_on: List[Dict[str, Any]],
                            array_size: Optional[int]) -> List[Target]:
        if len(depends_on) > MAX_DEPENDENCIES:
            raise Rejected(f"dependsOn takes at most {MAX_DEPENDENCIES} jobs")
        targets: List[Target] = []
        for dependency in depends_on:
            kind, job_id = dependency.get("type"), dependency.get("jobId")
            if kind not in (None, "N_TO_N", "SEQUENTIAL"):
                raise Rejected(f"dependsOn type must be N_TO_N or SEQUENTIAL, got {kind!r}")
            if kind == "SEQUENTIAL":
                if array_size is None:
                    raise Rejected("A SEQUENTIAL dependency is only valid for an array job")
                targets.append((DependencyKind.SEQUENTIAL, None))
                if not job_id:
                    continue
            if not job_id:
                raise Rejected("A dependsOn entry needs a jobId (except type SEQUENTIAL)")
            found = self.table.find(job_id)
            if found is None:
                raise Rejected(f"Dependency job {job_id} does not exist")
            job, unit = found
            own = self.table.is_own(job)
            if kind == "N_TO_N":
                if array_size is None or unit is not None or not job.is_array:
                    raise Rejected("An N_TO_N dependency needs an array job depending on an array job")
                if job.spec.array_size != array_size:
                    raise Rejected(f"An N_TO_N dependency needs arrays of the same size: {job_id} "
                                   f"has {job.spec.array_size} children, this job {array_size}")
                targets.append((DependencyKind.N_TO_N, job if own else job.job_id))
                continue
            if own:
                target: Union[Unit, Job, str] = (
                    unit if unit is not None else (job if job.has_children else job.units[0]))
            else:
                target = unit.job_id if unit is not None else job.job_id
            targets.append((DependencyKind.WHOLE, target))
        return targets

    # -- DescribeJobs, ListJobs --------------------------------------------------------------
    @_api("DescribeJobs")
    def describe_jobs(self, params: Dict[str, Any]) -> Dict[str, Any]:
        ids = params["jobs"]
        if len(ids) > MAX_DESCRIBE_JOBS:
            raise Rejected(f"DescribeJobs takes at most {MAX_DESCRIBE_JOBS} job IDs, got {len(ids)}")
        found, seen = [], set()
        for raw in ids:
            item = self.table.find(raw)
            if item is None:
                continue  # unknown or forgotten: left out, as Batch does
            key = (item[0].job_id, item[1].index if item[1] is not None else None)
            if key not in seen:
                seen.add(key)
                found.append(item)
        lag, now = self.faults.summary_lag_ms, now_ms()
        with self._lock:  # one consistent snapshot of every job asked for
            details = [describe(job, unit, summary_lag_ms=lag, now=now) for job, unit in found]
        return {"jobs": details}

    @_api("ListJobs")
    def list_jobs(self, params: Dict[str, Any]) -> Dict[str, Any]:
        scopes = [key for key in ("jobQueue", "arrayJobId", "multiNodeJobId") if params.get(key)]
        if len(scopes) != 1:
            raise Rejected("Specify exactly one of jobQueue, arrayJobId and multiNodeJobId")
        filters = params.get("filters") or []
        if params.get("jobStatus") is not None and params["jobStatus"] not in STATUS_ORDER:
            raise Rejected(f"jobStatus must be one of {', '.join(STATUS_ORDER)}")
        # As Batch: with filters every status is listed; with neither, RUNNING jobs only.
        statuses: Set[JobStatus] = (set(JobStatus) if filters
                                    else {JobStatus(params.get("jobStatus") or JobStatus.RUNNING)})
        match = job_filter(filters)
        size = int(params.get("maxResults") or 1000)
        if not 1 <= size:
            raise Rejected("maxResults must be at least 1")
        size = min(size, 1000)
        after = untoken(params.get("nextToken"))
        items: List[Tuple[Any, Job, Optional[Unit]]] = []
        if scopes[0] in ("arrayJobId", "multiNodeJobId"):
            kind = "is_array" if scopes[0] == "arrayJobId" else "is_multinode"
            found = self.table.find(params[scopes[0]])
            if found is not None and found[1] is None and getattr(found[0], kind):
                job = found[0]
                with self._lock:
                    indices = sorted(i for s in statuses for i in job.by_status[s])
                    if after is not None:
                        indices = [i for i in indices if i > after]
                    units = [job.units[i] for i in indices]
                    items = [(u.index, job, u) for u in units if match(job, u)]
        else:
            queue = self.queues.resolve(params["jobQueue"])
            if queue is None:
                raise Rejected(f"Job queue {params['jobQueue']} does not exist")
            jobs = self.table.in_queue(queue)
            with self._lock:
                for job in jobs:
                    if job.status in statuses and match(job, None):
                        position = [job.spec.created, job.job_id]
                        if after is None or position > after:
                            items.append((position, job, None))
            items.sort(key=lambda item: item[0])
        page = items[:size]
        with self._lock:
            response: Dict[str, Any] = {"jobSummaryList": [summary(job, unit) for _, job, unit in page]}
        if len(items) > size:
            response["nextToken"] = token(page[-1][0])
        return response

    # -- CancelJob, TerminateJob -------------------------------------------------------------
    @_api("CancelJob")
    def cancel_job(self, params: Dict[str, Any]) -> Dict[str, Any]:
        self._stop(StopAction.CANCEL, params["jobId"], params["reason"])
        return {}

    @_api("TerminateJob")
    def terminate_job(self, params: Dict[str, Any]) -> Dict[str, Any]:
        self._stop(StopAction.TERMINATE, params["jobId"], params["reason"])
        return {}

    @_api("CancelJobs")
    def cancel_jobs(self, params: Dict[str, Any]) -> Dict[str, Any]:
        return self._stop_many(StopAction.CANCEL, params["jobs"], params["reason"])

    @_api("TerminateJobs")
    def terminate_jobs(self, params: Dict[str, Any]) -> Dict[str, Any]:
        return self._stop_many(StopAction.TERMINATE, params["jobs"], params["reason"])

    def _stop_many(self, action: StopAction, job_ids: List[str], reason: str) -> Dict[str, Any]:
        """The bulk calls: each job on its own; an unknown job counts as done, as in Batch."""
        if not 1 <= len(job_ids) <= MAX_BULK_STOP:
            raise Rejected(f"jobs takes 1 to {MAX_BULK_STOP} job IDs, got {len(job_ids)}")
        _check_reason(reason)
        successful: List[str] = []
        errors: List[Dict[str, str]] = []
        operation = "CancelJobs" if action is StopAction.CANCEL else "TerminateJobs"
        for job_id in job_ids:
            fault = self.faults.item_fault(operation, job_id)  # left undone, reported apart
            if fault is not None:
                errors.append({"job": job_id, "code": fault[0], "message": fault[1]})
                continue
            try:
                self._stop(action, job_id, reason, missing_ok=True)
            except Rejected as error:
                errors.append({"job": job_id, "code": error.code, "message": str(error)})
            else:
                successful.append(job_id)
        return {"successful": successful, "errors": errors}

    def _stop(self, action: StopAction, job_id: str, reason: str, missing_ok: bool = False) -> None:
        _check_reason(reason)
        found = self.table.find(job_id)
        if found is None:
            if missing_ok:
                return
            raise Rejected(f"Job {job_id} does not exist")
        job, unit = found
        if self.table.is_own(job):
            self._stop_own(action, job, unit, reason)
            return
        if job.status in FINISHED and (unit is None or unit.status in FINISHED):
            return
        owner = job.owner or []
        instance = owner[2] if len(owner) > 2 else None
        if instance is None or not process_alive(owner):
            return  # its owner is gone: the record was recovered as FAILED
        other = BatchEmulator._live.get(instance)
        if other is not None and not other._closed:  # another instance of this process
            other._stop_own(action, job, unit, reason, job_id=job_id)
        else:
            self.store.send_control(instance, {"action": action.value, "jobId": job_id,
                                               "reason": reason})

    def _stop_own(self, action: StopAction, job: Job, unit: Optional[Unit], reason: str,
                  job_id: Optional[str] = None) -> None:
        with self._lock:
            if job_id is not None:  # a request naming the job by id: find our own object
                own = self.table.own.get(job.job_id)
                if own is None:
                    return
                job, unit = own, (own.unit(unit.index) if unit is not None else None)
            if action is StopAction.CANCEL:
                self.scheduler.cancel(job, unit, reason)
            else:
                self.scheduler.terminate(job, unit, reason)

    # -- background work ---------------------------------------------------------------------
    def _housekeeping(self) -> None:
        """Every 0.25 s on the scheduler's thread: requests from other processes, TTL, waits."""
        for request in self.store.take_control(self.instance_id):
            found = self.table.find(str(request.get("jobId", "")))
            if request.get("action") == "tag":  # TagResource/UntagResource of another process
                if found is not None and self.table.is_own(found[0]) and found[1] is None:
                    self._set_job_tags(found[0], dict(request.get("tags") or {}))
                continue
            try:
                action = StopAction(request.get("action"))
            except ValueError:
                continue
            if found is not None and self.table.is_own(found[0]):
                self._stop_own(action, found[0], found[1], str(request.get("reason", "")))
        self.table.forget_expired(self.scheduler.finished)
        self.scheduler.check_time_limits()
        self.scheduler.poll_foreign()

    def _sweep(self) -> None:
        """At start: what dead processes left (records, cgroups, scratch folders)."""
        try:
            if self.cgroups is not None:
                removed = self.cgroups.sweep()
                if removed:
                    logger.info("batchfutures emulator: removed %d cgroups of dead emulators", removed)
            self.scratch.sweep(process_alive)
        except Exception:
            logger.exception("batchfutures emulator: sweeping leftovers failed")
        self.table.sweep(lambda: self._closed)

    # -- shutdown ----------------------------------------------------------------------------
    def close(self, reason: Optional[str] = None) -> None:
        """Kill running attempts; record every unfinished job FAILED with a reason saying why."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            jobs = list(self.table.own.values())
        self.scheduler.shutdown(jobs, reason or SHUTDOWN_REASON.format(pid=os.getpid()))
        self.monitor.close()
        self.launcher.close()
        self.table.close()
        self.store.drop_control(self.instance_id)
        with BatchEmulator._shared_lock:
            for key, emulator in list(BatchEmulator._shared.items()):
                if emulator is self:
                    del BatchEmulator._shared[key]
        self._notify()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "BatchEmulator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        threads = ", launcher='threads'" if self.launcher_kind is Launcher.THREADS else ""
        return f"BatchEmulator({str(self.folder)!r}, max_vcpus={self.max_vcpus:g}{threads})"


def _page_size(value: Optional[int], most: int = 100) -> int:
    """A maxResults as Batch takes it: 1 to `most`, `most` when not given."""
    if value is None:
        return most
    if not 1 <= value <= most:
        raise Rejected(f"maxResults must be between 1 and {most}, got {value}")
    return value


def _missing_environment(reference: str) -> str:
    """Batch's refusal of a compute environment that does not exist: its ARN ... does not exist."""
    name = arn_resource(reference, "compute-environment") or reference
    return f"{compute_environment_arn(name)} does not exist"


def queue_utilization(usage: Dict[Optional[str], float], fair_share: bool,
                      now: int) -> Dict[str, Any]:
    """GetJobQueueSnapshot's queueUtilization: the vCPUs the queue's starting and running jobs
    hold (this instance's), and on a fair-share queue the top 20 shares by use."""
    total = float(sum(usage.values()))
    detail: Dict[str, Any] = {"totalCapacityUsage": [{"capacityUnit": "VCPU", "quantity": total}],
                              "lastUpdatedAt": now}
    if fair_share:
        shares = sorted(((share, used) for share, used in usage.items() if share and used > 0),
                        key=lambda item: (-item[1], item[0]))
        detail["fairshareUtilization"] = {
            "activeShareCount": len(shares),
            "topCapacityUtilization": [
                {"shareIdentifier": share, "capacityUsage": [{"capacityUnit": "VCPU", "quantity": used}]}
                for share, used in shares[:20]]}
    return detail


def _check_reason(reason: str) -> None:
    if len(reason) > MAX_REASON:
        raise Rejected(f"reason has a limit of {MAX_REASON} characters, got {len(reason)}")


def _policy_detail(record: Dict[str, Any]) -> Dict[str, Any]:
    detail = {"name": record["name"], "arn": record["arn"]}
    for key in ("fairsharePolicy", "quotaSharePolicy", "tags"):
        if isinstance(record.get(key), dict):
            detail[key] = record[key]
    return detail


class _Tagged:
    """A taggable resource: its tags, and how to replace them."""

    def tags(self) -> Dict[str, str]:
        raise NotImplementedError

    def set(self, tags: Dict[str, str]) -> None:
        raise NotImplementedError


class _JobTags(_Tagged):
    def __init__(self, emulator: BatchEmulator, job: Job) -> None:
        self.emulator, self.job = emulator, job

    def tags(self) -> Dict[str, str]:
        return dict(self.job.spec.tags or {})

    def set(self, tags: Dict[str, str]) -> None:
        self.emulator._set_job_tags(self.job, tags)


class _DefinitionTags(_Tagged):
    def __init__(self, emulator: BatchEmulator, definition: Dict[str, Any]) -> None:
        self.emulator, self.definition = emulator, definition

    def tags(self) -> Dict[str, str]:
        return dict(self.definition.get("tags") or {})

    def set(self, tags: Dict[str, str]) -> None:
        self.emulator.definitions.set_tags(self.definition, tags)


class _StoredTags(_Tagged):
    """A compute environment's or consumable resource's tags, in its file."""

    def __init__(self, load: Callable[[str], Optional[Dict[str, Any]]],
                 write: Callable[[str, Dict[str, Any]], None], name: str) -> None:
        self._load, self._write, self.name = load, write, name

    def tags(self) -> Dict[str, str]:
        return dict((self._load(self.name) or {}).get("tags") or {})

    def set(self, tags: Dict[str, str]) -> None:
        record = self._load(self.name)
        if record is not None:
            self._write(self.name, dict(record, tags=dict(tags)))


class _QueueTags(_Tagged):
    def __init__(self, emulator: BatchEmulator, name: str) -> None:
        self.emulator, self.name = emulator, name

    def tags(self) -> Dict[str, str]:
        return self.emulator.queues.tags(self.name)

    def set(self, tags: Dict[str, str]) -> None:
        self.emulator.queues.set_tags(self.name, tags)


def _close_at_exit(ref: "weakref.ref[BatchEmulator]") -> None:
    emulator = ref()
    if emulator is not None:
        emulator.close(EXIT_REASON.format(pid=os.getpid()))


_OPERATIONS: Dict[str, Callable[..., Dict[str, Any]]] = {
    method.operation: method
    for method in vars(BatchEmulator).values() if hasattr(method, "operation")
}
