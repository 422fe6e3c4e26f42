"""`BatchEmulator`: the AWS Batch API, in process, running each attempt as a local process.

    submit_job ─> Job(SUBMITTED) ─┐          scheduler thread (every tick, or when woken)
                                  v
       SUBMITTED -> PENDING -> RUNNABLE -> STARTING -> RUNNING -> SUCCEEDED | FAILED
                   (dependsOn)  (vCPUs free)  (process  (exit, timeout,
                                               started)  memory, terminate)
       array parent: SUBMITTED -> PENDING while children run -> SUCCEEDED | FAILED

Requests are validated against botocore's Batch model and Batch's own limits; errors are
`botocore.exceptions.ClientError`s shaped as boto3 raises them, so a client cannot tell this
object from a boto3 `batch` client. Records persist under the folder (see `records`), so another
instance can describe what this one ran; finished jobs are forgotten after `metadata_ttl`.
"""

from __future__ import annotations

import atexit
import fnmatch
import json
import logging
import os
import re
import threading
import time
import uuid
import weakref
from collections import deque
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional

from botocore.exceptions import ClientError, ParamValidationError
from botocore.validate import ParamValidator

from .faults import FaultInjector
from .launcher import AttemptProcess, container_argv, python_path_for_children
from .logs import LogsService, stream_path
from .records import RecordStore, owner_token

logger = logging.getLogger("batchfutures")

ACCOUNT, REGION = "123456789012", "us-east-1"
STATUSES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")
TERMINAL = ("SUCCEEDED", "FAILED")
BEFORE_START = ("SUBMITTED", "PENDING", "RUNNABLE")
OOM_REASON = "OutOfMemoryError: Container killed due to memory usage"
EXITED = "Essential container in task exited"
TIMEOUT_REASON = "Job attempt duration exceeded timeout"
DEPENDENCY_FAILED = "Dependent Job failed"
TOO_BIG = ("MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - The job resource requirement "
           "(vCPU/memory/GPU) is higher than that can be met by the CE(s) attached to the job queue.")
MAX_REQUEST_BYTES = 30 * 1024
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
DEFAULT_DEFINITION = "batchfutures-worker"
TICK = 0.01
MEMORY_SAMPLE_EVERY = 0.05


def now_ms() -> int:
    return int(time.time() * 1000)


def client_error(message: str, code: str = "ClientException", status: int = 400,
                 operation: str = "Batch") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, operation)


def _model():
    import botocore.session

    return botocore.session.get_session().get_service_model("batch")


_MODEL = None
_MODEL_LOCK = threading.Lock()


def batch_model():
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is None:
            _MODEL = _model()
    return _MODEL


def _pascal(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _requirement(requirements: List[Dict[str, str]], kind: str) -> Optional[float]:
    for item in requirements or []:
        if item.get("type") == kind:
            return float(item["value"])
    return None


def _glob(pattern: Optional[str], value: Optional[str]) -> bool:
    """Batch's evaluateOnExit match: exact, or a prefix with a trailing '*', case-insensitive."""
    if pattern is None:
        return True
    value = (value or "").lower()
    pattern = pattern.lower()
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    return value == pattern


class Job:
    """One job (plain, array parent or array child) and its attempts."""

    def __init__(self, **fields: Any) -> None:
        self.id: str = fields["id"]
        self.name: str = fields["name"]
        self.queue: str = fields["queue"]
        self.definition: Dict[str, Any] = fields["definition"]
        self.request: Dict[str, Any] = fields["request"]
        self.parent: Optional["Job"] = fields.get("parent")
        self.index: Optional[int] = fields.get("index")
        self.size: Optional[int] = fields.get("size")
        self.status: str = fields.get("status", "SUBMITTED")
        self.status_reason: Optional[str] = fields.get("status_reason")
        self.created_at: int = fields.get("created_at") or now_ms()
        self.started_at: Optional[int] = fields.get("started_at")
        self.stopped_at: Optional[int] = fields.get("stopped_at")
        self.attempts: List[Dict[str, Any]] = fields.get("attempts") or []
        self.depends_on: List["Job"] = []
        self.children: List["Job"] = []
        self.counts: Dict[str, int] = {s: 0 for s in STATUSES}
        self.process: Optional[AttemptProcess] = None
        self.running_since: Optional[float] = None
        self.log_stream: Optional[str] = None
        self.cancel_requested: Optional[str] = None
        self.is_cancelled = False
        self.is_terminated = False

    # settings, overrides first
    @property
    def overrides(self) -> Dict[str, Any]:
        return self.request.get("containerOverrides") or {}

    @property
    def container_props(self) -> Dict[str, Any]:
        return self.definition.get("containerProperties") or {}

    def resources(self) -> List[Dict[str, str]]:
        merged = {r["type"]: r for r in self.container_props.get("resourceRequirements") or []}
        props = self.container_props
        if "VCPU" not in merged and props.get("vcpus"):
            merged["VCPU"] = {"type": "VCPU", "value": str(props["vcpus"])}
        if "MEMORY" not in merged and props.get("memory"):
            merged["MEMORY"] = {"type": "MEMORY", "value": str(props["memory"])}
        for item in self.overrides.get("resourceRequirements") or []:
            merged[item["type"]] = item
        return list(merged.values())

    @property
    def vcpus(self) -> float:
        return _requirement(self.resources(), "VCPU") or 1.0

    @property
    def memory_mib(self) -> Optional[int]:
        memory = _requirement(self.resources(), "MEMORY")
        return int(memory) if memory else None

    @property
    def command(self) -> List[str]:
        return list(self.overrides.get("command") or self.container_props.get("command") or [])

    @property
    def max_attempts(self) -> int:
        strategy = self.request.get("retryStrategy") or self.definition.get("retryStrategy") or {}
        return int(strategy.get("attempts") or 1)

    @property
    def evaluate_on_exit(self) -> List[Dict[str, str]]:
        strategy = self.request.get("retryStrategy") or self.definition.get("retryStrategy") or {}
        return list(strategy.get("evaluateOnExit") or [])

    @property
    def timeout(self) -> Optional[int]:
        timeout = self.request.get("timeout") or self.definition.get("timeout") or {}
        return timeout.get("attemptDurationSeconds")

    @property
    def is_array(self) -> bool:
        return self.size is not None


class BatchEmulator:
    """An in-process AWS Batch service whose jobs are local processes."""

    _shared: Dict[str, "BatchEmulator"] = {}
    _shared_lock = threading.Lock()

    def __init__(self, folder: "os.PathLike[str] | str", *, max_vcpus: Optional[float] = None,
                 metadata_ttl: float = 86400, job_queues: tuple = ("batchfutures",),
                 compute_environment: str = "batchfutures-local") -> None:
        self.folder = Path(folder).expanduser().resolve()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_vcpus = float(max_vcpus or os.cpu_count() or 1)
        self.metadata_ttl = float(metadata_ttl)
        self.compute_environment = compute_environment
        self.records = RecordStore(self.folder / "jobs")
        self.logs = LogsService(self.folder / "logs", self)
        self.faults = FaultInjector()
        self._validator = ParamValidator()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._listeners: List[Callable[[], None]] = []
        self._jobs: Dict[str, Job] = {}
        self._queue_states: Dict[str, str] = {name: "ENABLED" for name in job_queues}
        self._definitions: Dict[str, List[Dict[str, Any]]] = {}
        self._register_default_definition()
        self._submitted: Deque[Job] = deque()
        self._pending: List[Job] = []
        self._runnable: Deque[Job] = deque()
        self._active: List[Job] = []  # STARTING or RUNNING
        self._used_vcpus = 0.0
        self._dirty: set = set()
        self._changed = False
        self._closed = False
        self._owner = owner_token()
        self._thread = threading.Thread(target=self._run, name="bf-emulator", daemon=True)
        self._thread.start()
        atexit.register(_close_at_exit, weakref.ref(self))

    @classmethod
    def shared(cls, folder: "os.PathLike[str] | str", **kwargs: Any) -> "BatchEmulator":
        """One emulator per folder per process, so its vCPU limit holds for every user."""
        key = str(Path(folder).expanduser().resolve())
        with cls._shared_lock:
            emulator = cls._shared.get(key)
            if emulator is None or emulator._closed:
                emulator = cls._shared[key] = cls(key, **kwargs)
            return emulator

    # -- plumbing ----------------------------------------------------------------------------
    def add_listener(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(callback)

    def inject_faults(self, rate: float, *, code: str = "TooManyRequestsException",
                      operations: Optional[set] = None, seed: Optional[int] = None) -> None:
        """Answer ``rate`` of calls (optionally only ``operations``) with ``code``, HTTP 429."""
        self.faults.configure(rate, code=code, operations=operations, seed=seed)

    def _enter(self, operation: str, params: Dict[str, Any]) -> None:
        if self._closed:
            raise client_error("the emulator is closed", "ServerException", 500, operation)
        self.faults.maybe_raise(operation)
        shape = batch_model().operation_model(operation).input_shape
        report = self._validator.validate(params, shape)
        if report.has_errors():
            raise ParamValidationError(report=report.generate_report())

    def _notify(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for callback in listeners:
            try:
                callback()
            except Exception:  # a listener's bug must not stop the scheduler
                logger.exception("batchfutures emulator: listener failed")

    def _touch(self, job: Job) -> None:
        self._dirty.add(job.parent or job)
        self._changed = True

    def _set_status(self, job: Job, status: str, reason: Optional[str] = None) -> None:
        old = job.status
        if old == status:
            return
        job.status = status
        if reason is not None:
            job.status_reason = reason
        if status in TERMINAL:
            job.stopped_at = now_ms()
        parent = job.parent
        if parent is not None:
            parent.counts[old] -= 1
            parent.counts[status] += 1
            if status in ("STARTING", "RUNNING") and parent.started_at is None:
                parent.started_at = now_ms()
        self._touch(job)

    # -- job definitions and queues ----------------------------------------------------------
    def _register_default_definition(self) -> None:
        self._store_definition(DEFAULT_DEFINITION, {
            "type": "container",
            "containerProperties": {
                "image": "batchfutures-local",
                "command": ["python", "-m", "batchfutures.worker"],
                "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                         {"type": "MEMORY", "value": "2048"}],
            },
        })

    def _store_definition(self, name: str, body: Dict[str, Any]) -> Dict[str, Any]:
        revisions = self._definitions.setdefault(name, [])
        revision = len(revisions) + 1
        definition = dict(body)
        definition.update(
            jobDefinitionName=name, revision=revision, status="ACTIVE",
            jobDefinitionArn=f"arn:aws:batch:{REGION}:{ACCOUNT}:job-definition/{name}:{revision}")
        revisions.append(definition)
        return definition

    def _find_definition(self, reference: str) -> Optional[Dict[str, Any]]:
        name = reference.rpartition("job-definition/")[2] if reference.startswith("arn:") else reference
        base, _, revision = name.partition(":")
        revisions = [d for d in self._definitions.get(base, []) if d["status"] == "ACTIVE"]
        if not revisions:
            return None
        if revision:
            return next((d for d in revisions if str(d["revision"]) == revision), None)
        return revisions[-1]

    def _queue_name(self, reference: str) -> str:
        return reference.rpartition("job-queue/")[2] if reference.startswith("arn:") else reference

    def _queue_detail(self, name: str) -> Dict[str, Any]:
        return {
            "jobQueueName": name,
            "jobQueueArn": f"arn:aws:batch:{REGION}:{ACCOUNT}:job-queue/{name}",
            "state": self._queue_states[name], "status": "VALID", "priority": 1,
            "computeEnvironmentOrder": [{
                "order": 1,
                "computeEnvironment": f"arn:aws:batch:{REGION}:{ACCOUNT}:compute-environment/"
                                      f"{self.compute_environment}"}],
        }

    def describe_job_queues(self, **params: Any) -> Dict[str, Any]:
        self._enter("DescribeJobQueues", params)
        with self._lock:
            wanted = params.get("jobQueues")
            names = [self._queue_name(q) for q in wanted] if wanted else list(self._queue_states)
            return {"jobQueues": [self._queue_detail(n) for n in names if n in self._queue_states]}

    def create_job_queue(self, **params: Any) -> Dict[str, Any]:
        self._enter("CreateJobQueue", params)
        with self._lock:
            name = params["jobQueueName"]
            self._queue_states[name] = params.get("state", "ENABLED")
            detail = self._queue_detail(name)
            return {"jobQueueName": name, "jobQueueArn": detail["jobQueueArn"]}

    def update_job_queue(self, **params: Any) -> Dict[str, Any]:
        self._enter("UpdateJobQueue", params)
        with self._lock:
            name = self._queue_name(params["jobQueue"])
            if name not in self._queue_states:
                raise client_error(f"job queue {params['jobQueue']} does not exist",
                                   operation="UpdateJobQueue")
            if "state" in params:
                self._queue_states[name] = params["state"]
            detail = self._queue_detail(name)
            return {"jobQueueName": name, "jobQueueArn": detail["jobQueueArn"]}

    def register_job_definition(self, **params: Any) -> Dict[str, Any]:
        self._enter("RegisterJobDefinition", params)
        with self._lock:
            body = {k: v for k, v in params.items() if k != "jobDefinitionName"}
            definition = self._store_definition(params["jobDefinitionName"], body)
            return {key: definition[key] for key in ("jobDefinitionName", "jobDefinitionArn", "revision")}

    def describe_job_definitions(self, **params: Any) -> Dict[str, Any]:
        self._enter("DescribeJobDefinitions", params)
        with self._lock:
            found = []
            if params.get("jobDefinitions"):
                for reference in params["jobDefinitions"]:
                    definition = self._find_definition(reference)
                    if definition and (":" in reference.rpartition("/")[2] or reference.startswith("arn:")):
                        found.append(definition)
                    elif definition is not None:
                        found.extend(d for d in self._definitions[definition["jobDefinitionName"]])
            else:
                name = params.get("jobDefinitionName")
                for key, revisions in self._definitions.items():
                    if name is None or key == name:
                        found.extend(revisions)
            status = params.get("status")
            if status:
                found = [d for d in found if d["status"] == status]
            return {"jobDefinitions": [json.loads(json.dumps(d)) for d in found]}

    def deregister_job_definition(self, **params: Any) -> Dict[str, Any]:
        self._enter("DeregisterJobDefinition", params)
        with self._lock:
            definition = self._find_definition(params["jobDefinition"])
            if definition is None:
                raise client_error("job definition not found", operation="DeregisterJobDefinition")
            definition["status"] = "INACTIVE"
            return {}

    # -- SubmitJob ---------------------------------------------------------------------------
    def submit_job(self, **params: Any) -> Dict[str, Any]:
        self._enter("SubmitJob", params)
        op = "SubmitJob"
        size = len(json.dumps(params, separators=(",", ":")).encode())
        if size > MAX_REQUEST_BYTES:
            raise client_error(f"SubmitJob request is {size} bytes; the limit is 30 KiB", operation=op)
        name = params["jobName"]
        if not JOB_NAME.match(name):
            raise client_error(
                f"jobName {name!r} must be 1-128 letters, digits, hyphens and underscores, "
                "starting with a letter or digit", operation=op)
        array = params.get("arrayProperties") or {}
        array_size = array.get("size")
        if array and (array_size is None or not 2 <= array_size <= 10_000):
            raise client_error(f"array size {array_size} must be between 2 and 10000", operation=op)
        for variable in (params.get("containerOverrides") or {}).get("environment") or []:
            if variable.get("name", "").upper().startswith("AWS_BATCH"):
                raise client_error(f"environment variable {variable['name']}: names starting with "
                                   "AWS_BATCH are reserved", operation=op)
        attempts = (params.get("retryStrategy") or {}).get("attempts")
        if attempts is not None and not 1 <= attempts <= 10:
            raise client_error(f"retryStrategy.attempts {attempts} must be between 1 and 10",
                               operation=op)
        timeout = (params.get("timeout") or {}).get("attemptDurationSeconds")
        if timeout is not None and timeout < 1:
            raise client_error("timeout.attemptDurationSeconds must be positive", operation=op)
        with self._lock:
            queue = self._queue_name(params["jobQueue"])
            if queue not in self._queue_states:
                raise client_error(f"job queue {params['jobQueue']} does not exist", operation=op)
            if self._queue_states[queue] != "ENABLED":
                raise client_error(f"job queue {params['jobQueue']} is {self._queue_states[queue]}",
                                   operation=op)
            definition = self._find_definition(params["jobDefinition"])
            if definition is None:
                raise client_error(f"job definition {params['jobDefinition']} does not exist",
                                   operation=op)
            dependencies = []
            for dependency in params.get("dependsOn") or []:
                if dependency.get("jobId") is None:
                    continue
                target = self._job(dependency["jobId"])
                if target is None:
                    raise client_error(f"dependency {dependency['jobId']} does not exist", operation=op)
                dependencies.append((target, dependency.get("type")))
            job = Job(id=str(uuid.uuid4()), name=name, queue=queue, definition=definition,
                      request=json.loads(json.dumps(params)), size=array_size)
            job.depends_on_spec = dependencies
            job.sequential = any(d.get("type") == "SEQUENTIAL" and not d.get("jobId")
                                 for d in params.get("dependsOn") or [])
            self._jobs[job.id] = job
            self._submitted.append(job)
            self._touch(job)
        self._wake.set()
        return {"jobArn": self._arn(job.id), "jobName": name, "jobId": job.id}

    def _arn(self, job_id: str) -> str:
        return f"arn:aws:batch:{REGION}:{ACCOUNT}:job/{job_id}"

    def _job(self, job_id: str) -> Optional[Job]:
        parent_id, _, index = job_id.partition(":")
        job = self._jobs.get(parent_id)
        if job is None:
            return None
        if index:
            if not index.isdigit() or not job.children or int(index) >= len(job.children):
                return None
            return job.children[int(index)]
        return job

    # -- DescribeJobs, ListJobs --------------------------------------------------------------
    def describe_jobs(self, **params: Any) -> Dict[str, Any]:
        self._enter("DescribeJobs", params)
        ids = params["jobs"]
        if len(ids) > 100:
            raise client_error("DescribeJobs takes at most 100 job ids", operation="DescribeJobs")
        found = []
        horizon = now_ms() - self.metadata_ttl * 1000
        with self._lock:
            for job_id in ids:
                job = self._job(job_id)
                if job is not None:
                    top = job.parent or job
                    if top.status in TERMINAL and top.stopped_at and top.stopped_at < horizon:
                        continue
                    found.append(self._detail(job))
        for job_id in ids:  # jobs another instance ran, from their records
            if self._jobs.get(job_id.partition(":")[0]) is None:
                detail = self.records.describe(job_id, horizon)
                if detail is not None:
                    found.append(detail)
        return {"jobs": found}

    def _attempt_detail(self, attempt: Dict[str, Any]) -> Dict[str, Any]:
        return {k: v for k, v in attempt.items() if v is not None}

    def _detail(self, job: Job) -> Dict[str, Any]:
        top = job.parent or job
        request = top.request
        container: Dict[str, Any] = {
            "image": job.container_props.get("image", "batchfutures-local"),
            "command": job.command,
            "resourceRequirements": job.resources(),
            "environment": list(job.overrides.get("environment") or []),
        }
        if job.attempts:
            last = job.attempts[-1].get("container") or {}
            for key in ("exitCode", "reason", "logStreamName", "taskArn"):
                if last.get(key) is not None:
                    container[key] = last[key]
        elif job.log_stream:
            container["logStreamName"] = job.log_stream
        if job.log_stream and job.status in ("STARTING", "RUNNING"):
            container["logStreamName"] = job.log_stream
        detail: Dict[str, Any] = {
            "jobArn": self._arn(job.id), "jobName": top.name, "jobId": job.id,
            "jobQueue": f"arn:aws:batch:{REGION}:{ACCOUNT}:job-queue/{top.queue}",
            "status": job.status, "createdAt": job.created_at,
            "startedAt": job.started_at or 0,
            "jobDefinition": top.definition["jobDefinitionArn"],
            "attempts": [self._attempt_detail(a) for a in job.attempts],
            "container": container,
            "dependsOn": list(request.get("dependsOn") or []),
            "tags": dict(request.get("tags") or {}),
            "propagateTags": bool(request.get("propagateTags", False)),
            "platformCapabilities": ["EC2"],
            "isCancelled": job.is_cancelled, "isTerminated": job.is_terminated,
        }
        if job.status_reason:
            detail["statusReason"] = job.status_reason
        if job.stopped_at:
            detail["stoppedAt"] = job.stopped_at
        strategy = request.get("retryStrategy")
        detail["retryStrategy"] = strategy or {"attempts": 1}
        if job.timeout:
            detail["timeout"] = {"attemptDurationSeconds": job.timeout}
        if request.get("shareIdentifier"):
            detail["shareIdentifier"] = request["shareIdentifier"]
        if request.get("schedulingPriorityOverride") is not None:
            detail["schedulingPriority"] = request["schedulingPriorityOverride"]
        if request.get("parameters"):
            detail["parameters"] = request["parameters"]
        if job.is_array:
            detail["arrayProperties"] = {"size": job.size, "statusSummary": dict(job.counts),
                                         "statusSummaryLastUpdatedAt": now_ms()}
        elif job.parent is not None:
            detail["arrayProperties"] = {"index": job.index}
        return detail

    def _summary(self, job: Job) -> Dict[str, Any]:
        top = job.parent or job
        summary: Dict[str, Any] = {
            "jobArn": self._arn(job.id), "jobId": job.id, "jobName": top.name,
            "createdAt": job.created_at, "status": job.status,
            "jobDefinition": top.definition["jobDefinitionArn"],
        }
        if job.status_reason:
            summary["statusReason"] = job.status_reason
        if job.started_at:
            summary["startedAt"] = job.started_at
        if job.stopped_at:
            summary["stoppedAt"] = job.stopped_at
        if job.attempts:
            last = job.attempts[-1].get("container") or {}
            container = {k: last[k] for k in ("exitCode", "reason") if last.get(k) is not None}
            if container:
                summary["container"] = container
        if job.is_array:
            summary["arrayProperties"] = {"size": job.size}
        elif job.parent is not None:
            summary["arrayProperties"] = {"index": job.index}
        return summary

    def list_jobs(self, **params: Any) -> Dict[str, Any]:
        self._enter("ListJobs", params)
        status = params.get("jobStatus") or "RUNNING"  # as AWS: no status means RUNNING
        horizon = now_ms() - self.metadata_ttl * 1000
        with self._lock:
            if params.get("arrayJobId"):
                parent = self._jobs.get(params["arrayJobId"])
                candidates = parent.children if parent is not None else []
            elif params.get("jobQueue"):
                queue = self._queue_name(params["jobQueue"])
                if queue not in self._queue_states:
                    raise client_error(f"job queue {params['jobQueue']} does not exist",
                                       operation="ListJobs")
                candidates = [j for j in self._jobs.values() if j.queue == queue]
            else:
                raise client_error("ListJobs needs jobQueue or arrayJobId", operation="ListJobs")
            filters = params.get("filters") or []
            if filters:
                matched = [j for j in candidates if all(self._filter(j, f) for f in filters)]
            else:
                matched = [j for j in candidates if j.status == status]
            matched = [j for j in matched if not ((j.parent or j).stopped_at or 0) or
                       (j.parent or j).status not in TERMINAL or (j.parent or j).stopped_at >= horizon]
            start = int(params.get("nextToken") or 0)
            limit = min(int(params.get("maxResults") or 1000), 1000)
            page = matched[start:start + limit]
            response: Dict[str, Any] = {"jobSummaryList": [self._summary(j) for j in page]}
            if start + limit < len(matched):
                response["nextToken"] = str(start + limit)
            return response

    @staticmethod
    def _filter(job: Job, spec: Dict[str, Any]) -> bool:
        name, values = spec.get("name"), spec.get("values") or []
        if name == "JOB_NAME":
            return any(fnmatch.fnmatchcase(job.name, v) for v in values)
        if name == "JOB_DEFINITION":
            return any(v in (job.definition["jobDefinitionName"], job.definition["jobDefinitionArn"])
                       for v in values)
        return True

    # -- CancelJob, TerminateJob -------------------------------------------------------------
    def cancel_job(self, **params: Any) -> Dict[str, Any]:
        self._enter("CancelJob", params)
        self._stop(params["jobId"], params["reason"], terminate=False, operation="CancelJob")
        return {}

    def terminate_job(self, **params: Any) -> Dict[str, Any]:
        self._enter("TerminateJob", params)
        self._stop(params["jobId"], params["reason"], terminate=True, operation="TerminateJob")
        return {}

    def _stop(self, job_id: str, reason: str, *, terminate: bool, operation: str) -> None:
        with self._lock:
            job = self._job(job_id)
            if job is None:
                raise client_error(f"job {job_id} does not exist", operation=operation)
            targets = job.children if job.children else [job]
            if job.is_array and not job.children:  # not expanded yet
                targets = [job]
            for target in targets:
                if target.status in BEFORE_START:
                    target.cancel_requested = reason
                    if terminate:
                        target.is_terminated = True
                    else:
                        target.is_cancelled = True
                elif terminate and target.status in ("STARTING", "RUNNING"):
                    target.cancel_requested = reason
                    target.is_terminated = True
                    if target.process is not None:
                        target.process.kill(reason)
        self._wake.set()

    # -- the scheduler -----------------------------------------------------------------------
    def _run(self) -> None:
        last_sample = last_persist = last_purge = 0.0
        while not self._closed:
            self._wake.wait(TICK)
            self._wake.clear()
            try:
                with self._lock:
                    self._advance()
                    now = time.monotonic()
                    if now - last_sample >= MEMORY_SAMPLE_EVERY:
                        last_sample = now
                        self._enforce_limits()
                    changed, self._changed = self._changed, False
                if now - last_persist >= 0.2:
                    last_persist = now
                    self._persist()
                if now - last_purge >= 5:
                    last_purge = now
                    self._purge()
            except Exception:
                logger.exception("batchfutures emulator: scheduler step failed")
                changed = True
            if changed:
                self._notify()

    def _advance(self) -> None:
        # SUBMITTED -> PENDING; arrays expand into children
        while self._submitted:
            job = self._submitted.popleft()
            if job.cancel_requested:
                self._finish_cancelled(job)
                continue
            self._set_status(job, "PENDING")
            if job.is_array:
                self._expand(job)
            else:
                job.depends_on = [target for target, _ in job.depends_on_spec]
                self._pending.append(job)
        # PENDING -> RUNNABLE once dependencies succeeded (FAILED when one failed)
        still = []
        for job in self._pending:
            if job.cancel_requested:
                self._finish_cancelled(job)
                continue
            states = [dep.status for dep in job.depends_on]
            if any(s == "FAILED" for s in states):
                self._fail_before_start(job, DEPENDENCY_FAILED)
            elif all(s == "SUCCEEDED" for s in states):
                self._set_status(job, "RUNNABLE")
                self._runnable.append(job)
            else:
                still.append(job)
        self._pending = still
        # RUNNABLE -> STARTING when vCPUs are free, in submission order
        blocked = deque()
        while self._runnable:
            job = self._runnable.popleft()
            if job.cancel_requested:
                self._finish_cancelled(job)
                continue
            if job.vcpus > self.max_vcpus:
                if job.status_reason != TOO_BIG:
                    job.status_reason = TOO_BIG
                    self._touch(job)
                blocked.append(job)
                continue
            if self._used_vcpus + job.vcpus > self.max_vcpus + 1e-9:
                blocked.append(job)
                blocked.extend(self._runnable)
                self._runnable.clear()
                break
            self._start(job)
        self._runnable = blocked
        # STARTING -> RUNNING (the process exists: the container started)
        for job in self._active:
            if job.status == "STARTING" and job.process is not None:
                self._set_status(job, "RUNNING")
                job.running_since = time.monotonic()
                if job.started_at is None:
                    job.started_at = now_ms()
                if job.attempts and job.attempts[-1].get("startedAt") is None:
                    job.attempts[-1]["startedAt"] = now_ms()
        # array parents follow their children
        for job in list(self._jobs.values()):
            if job.is_array and job.status == "PENDING" and job.children:
                done = job.counts["SUCCEEDED"] + job.counts["FAILED"]
                if done == job.size:
                    if job.counts["FAILED"]:
                        self._set_status(job, "FAILED", "Array Child Job failed")
                    else:
                        self._set_status(job, "SUCCEEDED")

    def _expand(self, parent: Job) -> None:
        parent.counts = {s: 0 for s in STATUSES}
        parent.counts["PENDING"] = parent.size
        specs = parent.depends_on_spec
        for index in range(parent.size):
            child = Job(id=f"{parent.id}:{index}", name=parent.name, queue=parent.queue,
                        definition=parent.definition, request=parent.request, parent=parent,
                        index=index, status="PENDING", created_at=parent.created_at)
            for target, kind in specs:
                if kind == "N_TO_N" and target.is_array and target.children:
                    if index < len(target.children):
                        child.depends_on.append(target.children[index])
                else:
                    child.depends_on.append(target)
            if parent.sequential and index > 0:
                child.depends_on.append(parent.children[index - 1])
            parent.children.append(child)
            self._pending.append(child)

    def _finish_cancelled(self, job: Job) -> None:
        if job.is_array and not job.children:
            self._set_status(job, "FAILED", job.cancel_requested)
            return
        self._fail_before_start(job, job.cancel_requested)

    def _fail_before_start(self, job: Job, reason: str) -> None:
        if job.is_array and not job.children:
            self._expand(job)
        if job.children:
            for child in job.children:
                if child.status in BEFORE_START:
                    self._fail_before_start(child, reason)
            return
        self._set_status(job, "FAILED", reason)

    def _start(self, job: Job) -> None:
        top = job.parent or job
        attempt_number = len(job.attempts) + 1
        stream = f"{top.definition['jobDefinitionName']}/default/{uuid.uuid4().hex}"
        job.log_stream = stream
        self._set_status(job, "STARTING", None)
        env = dict(os.environ)
        pythonpath = python_path_for_children()
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        for variable in (job.container_props.get("environment") or []) + \
                (job.overrides.get("environment") or []):
            env[variable["name"]] = variable.get("value", "")
        env.update(AWS_BATCH_JOB_ID=job.id, AWS_BATCH_JOB_ATTEMPT=str(attempt_number),
                   AWS_BATCH_JQ_NAME=top.queue, AWS_BATCH_CE_NAME=self.compute_environment)
        if job.parent is not None:
            env["AWS_BATCH_JOB_ARRAY_INDEX"] = str(job.index)
            env["AWS_BATCH_JOB_ARRAY_SIZE"] = str(job.parent.size)
        else:
            env.pop("AWS_BATCH_JOB_ARRAY_INDEX", None)
            env.pop("AWS_BATCH_JOB_ARRAY_SIZE", None)
        job.attempts.append({"container": {"logStreamName": stream,
                                           "taskArn": f"arn:aws:ecs:{REGION}:{ACCOUNT}:task/local/"
                                                      f"{uuid.uuid4().hex}"},
                             "startedAt": None, "stoppedAt": None, "statusReason": None})
        self._used_vcpus += job.vcpus
        self._active.append(job)
        try:
            job.process = AttemptProcess(container_argv(job.command), env,
                                         str(stream_path(self.folder / "logs", stream)),
                                         job.memory_mib, lambda _p, job=job: self._wake.set())
        except OSError as error:  # the "image" cannot run this command
            job.process = None
            self._end_attempt(job, exit_code=None, container_reason=f"CannotStartContainerError: {error}",
                              status_reason="Task failed to start")

    def _enforce_limits(self) -> None:
        for job in list(self._active):
            process = job.process
            if process is None:
                continue
            if not process.running:
                self._collect(job)
                continue
            if job.timeout and job.running_since is not None and \
                    time.monotonic() - job.running_since >= job.timeout:
                process.kill("timeout")
            elif job.memory_mib and process.resident_mib() > job.memory_mib:
                process.kill("memory")

    def _collect(self, job: Job) -> None:
        process = job.process
        exit_code = process.exit_code()
        killed = process.kill_reason
        if killed == "timeout":
            self._end_attempt(job, exit_code=137, status_reason=TIMEOUT_REASON)
        elif killed == "memory" or (job.memory_mib and killed is None and exit_code == 137):
            self._end_attempt(job, exit_code=137, container_reason=OOM_REASON, status_reason=EXITED)
        elif killed is not None:  # terminated on request
            self._end_attempt(job, exit_code=exit_code, status_reason=job.cancel_requested or killed)
        else:
            self._end_attempt(job, exit_code=exit_code, status_reason=EXITED)

    def _end_attempt(self, job: Job, *, exit_code: Optional[int], status_reason: str,
                     container_reason: Optional[str] = None) -> None:
        attempt = job.attempts[-1]
        container = attempt["container"]
        if exit_code is not None:
            container["exitCode"] = exit_code
        if container_reason:
            container["reason"] = container_reason
        attempt["statusReason"] = status_reason
        attempt["stoppedAt"] = now_ms()
        if attempt.get("startedAt") is None:
            attempt["startedAt"] = attempt["stoppedAt"]
        if job in self._active:
            self._active.remove(job)
            self._used_vcpus = max(0.0, self._used_vcpus - job.vcpus)
        job.process = None
        job.running_since = None
        if exit_code == 0 and not job.cancel_requested:
            self._set_status(job, "SUCCEEDED", status_reason)
        elif not job.cancel_requested and self._should_retry(job, exit_code, status_reason,
                                                             container_reason):
            job.status_reason = status_reason
            self._set_status(job, "RUNNABLE")
            self._runnable.append(job)
        else:
            self._set_status(job, "FAILED", job.cancel_requested or status_reason)
        self._touch(job)

    def _should_retry(self, job: Job, exit_code: Optional[int], status_reason: str,
                      reason: Optional[str]) -> bool:
        if len(job.attempts) >= job.max_attempts:
            return False
        for rule in job.evaluate_on_exit:
            if (_glob(rule.get("onStatusReason"), status_reason)
                    and _glob(rule.get("onReason"), reason)
                    and _glob(rule.get("onExitCode"), None if exit_code is None else str(exit_code))):
                return rule["action"].upper() == "RETRY"
        return True  # as Batch: no matching rule means retry

    # -- persistence, expiry, shutdown -------------------------------------------------------
    def _persist(self) -> None:
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            snapshots = [(job.id, self._record(job)) for job in dirty if job.id in self._jobs]
        for job_id, record in snapshots:
            self.records.write(job_id, record)

    def _record(self, job: Job) -> Dict[str, Any]:
        children = [[c.status, c.status_reason, c.started_at, c.stopped_at,
                     [self._attempt_detail(a) for a in c.attempts],
                     {"logStreamName": c.log_stream} if c.log_stream else {}]
                    for c in job.children]
        return {"owner": self._owner, "detail": self._detail(job), "children": children}

    def _purge(self) -> None:
        horizon = now_ms() - self.metadata_ttl * 1000
        with self._lock:
            expired = [job for job in self._jobs.values()
                       if job.status in TERMINAL and job.stopped_at and job.stopped_at < horizon]
            for job in expired:
                del self._jobs[job.id]
        self.records.purge(horizon, {job.id for job in expired})

    def close(self, reason: str = "batchfutures emulator: shut down before the job finished") -> None:
        """End every running attempt and record unfinished jobs FAILED with ``reason``."""
        if self._closed:
            return
        with self._lock:
            self._closed = True
            for job in list(self._jobs.values()):
                for item in (job.children or [job]):
                    if item.status not in TERMINAL:
                        if item.process is not None:
                            item.process.kill("shutdown")
                        if item.attempts and item.attempts[-1].get("stoppedAt") is None:
                            item.attempts[-1]["stoppedAt"] = now_ms()
                            item.attempts[-1]["statusReason"] = reason
                            item.attempts[-1]["container"].setdefault("exitCode", 137)
                        self._set_status(item, "FAILED", reason)
                if job.status not in TERMINAL:
                    self._set_status(job, "FAILED", reason)
        self._wake.set()
        self._persist()
        with BatchEmulator._shared_lock:
            for key, emulator in list(BatchEmulator._shared.items()):
                if emulator is self:
                    del BatchEmulator._shared[key]
        self._notify()

    def __enter__(self) -> "BatchEmulator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _close_at_exit(ref: "weakref.ref[BatchEmulator]") -> None:
    emulator = ref()
    if emulator is not None:
        emulator.close("batchfutures emulator: the process that ran this job exited before it finished")


__all__ = ["BatchEmulator", "client_error"]
