"""Dry run: every request and object built exactly as it would be sent, and nothing sent.

    BatchExecutor(env, dry_run=True)
        Session ──> Submitter(DryRunEnvironment(env), RecordingStorage)
                        │ the same uploads and build_request as a real run; the storage records
                        │ each object's key and size, the Batch client records each SubmitJob
                        v
                    every future of the job raises DryRunResult(.requests, .objects)

The queue is not checked and no job definition is registered or read (both are requests); a
definition to be registered from `image=` is named as it would be. TorchX's dry run is the
model: what you see is what `submit` would have sent.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from .batchapi import BatchAPI
from .errors import ConfigurationError, DryRunResult
from .jobs import TrackedJob, settle
from .logs import LogsAPI
from .settings import JobSettings
from .storage import Storage

if TYPE_CHECKING:
    from .environments import Environment
    from .oomretry import Placement


class RecordingStorage(Storage):
    """A Storage that records what it would write (key, size) and writes nothing."""

    def __init__(self, root_url: str) -> None:
        super().__init__(root_url)
        self._recorded: List[Tuple[str, int]] = []
        self._recording_lock = threading.Lock()

    def put_bytes(self, url: str, data: bytes, *, exclusive: bool = False) -> bool:
        with self._recording_lock:
            self._recorded.append((self._path(url), len(data)))
        return True

    def exists(self, url: str) -> bool:
        return False

    def delete(self, url: str) -> None:
        pass

    def take_recorded(self) -> List[Tuple[str, int]]:
        with self._recording_lock:
            recorded, self._recorded = self._recorded, []
        return recorded


class RecordingBatch:
    """The Batch seam of a dry run: the one call a submission makes (SubmitJob) is recorded
    instead of sent; any other operation would be a request, and a dry run sends none."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.requests: List[Dict[str, Any]] = []

    def submit_job(self, **request: Any) -> Dict[str, Any]:
        self.requests.append(request)
        job_id = f"dry-run-{next(self._ids)}"
        return {"jobId": job_id, "jobName": request.get("jobName"), "jobArn": job_id}

    def _not_sent(self, operation: str) -> Dict[str, Any]:
        raise ConfigurationError(f"a dry run sends no {operation} request (only SubmitJob is "
                                 f"built, and recorded)")

    def describe_jobs(self, **params: Any) -> Dict[str, Any]:
        return self._not_sent("DescribeJobs")

    def list_jobs(self, **params: Any) -> Dict[str, Any]:
        return self._not_sent("ListJobs")

    def cancel_job(self, **params: Any) -> Dict[str, Any]:
        return self._not_sent("CancelJob")

    def terminate_job(self, **params: Any) -> Dict[str, Any]:
        return self._not_sent("TerminateJob")

    def cancel_jobs(self, **params: Any) -> Dict[str, Any]:
        return self._not_sent("CancelJobs")

    def terminate_jobs(self, **params: Any) -> Dict[str, Any]:
        return self._not_sent("TerminateJobs")

    def describe_job_queues(self, **params: Any) -> Dict[str, Any]:
        return self._not_sent("DescribeJobQueues")

    def describe_compute_environments(self, **params: Any) -> Dict[str, Any]:
        return self._not_sent("DescribeComputeEnvironments")

    def describe_job_definitions(self, **params: Any) -> Dict[str, Any]:
        return self._not_sent("DescribeJobDefinitions")

    def register_job_definition(self, **params: Any) -> Dict[str, Any]:
        return self._not_sent("RegisterJobDefinition")


class DryRunEnvironment:
    """The environment seam (environments.Environment) of a dry run: ``env``'s own facts and
    names, with nothing reaching Batch (its ``batch`` is a `RecordingBatch`). What would be a
    request is not made: the queue is not checked, the job definition is not read (its memory
    and tags are then unknown: the settings decide) nor registered (it is named as it would
    be), and no STS look-up of the bucket owner is made (no `worker_environment`)."""

    def __init__(self, env: Environment) -> None:
        self._env = env
        self.recorder = RecordingBatch()
        self.job_queue = env.job_queue
        self.job_definition = env.planned_definition()
        self.describe_grace = float(env.describe_grace)  # never waited on
        self.poll_intervals = env.poll_intervals
        self.log_group = env.log_group
        self.is_local = env.is_local
        self.workdir = env.workdir
        self.stack = env.stack
        self.fallback_queue = env.fallback_queue
        self.given_definition = env.given_definition
        self.session = env.session
        self.region_name = env.region_name
        self.region_source = env.region_source
        self.signing_secret = env.signing_secret
        self.image_python = env.image_python

    @property
    def batch(self) -> BatchAPI:
        return self.recorder

    @property
    def logs(self) -> LogsAPI:
        return self._env.logs  # never read by a submission

    @property
    def storage(self) -> Storage:
        return self._env.storage

    @property
    def gpus(self) -> Optional[int]:
        return self._env.gpus

    def check_queue(self) -> None:
        """Not checked: DescribeJobQueues would be a request."""

    def definition_memory(self) -> Optional[int]:
        return None  # reading the definition would be a request; the settings decide

    def definition_tags(self) -> Dict[str, str]:
        return {}  # as its memory: unread

    def describe_definition(self) -> Optional[Dict[str, Any]]:
        return None  # DescribeJobDefinitions would be a request

    def worker_command(self, job_url: str) -> List[str]:
        return self._env.worker_command(job_url)

    def validate_settings(self, settings: JobSettings) -> None:
        self._env.validate_settings(settings)

    def max_vcpus_at_once(self) -> float:
        return self._env.max_vcpus_at_once()

    def max_memory_mib(self) -> Optional[int]:
        return self._env.max_memory_mib()

    def oom_placement(self) -> Placement:
        return self._env.oom_placement()

    def job_platform(self) -> Optional[str]:
        return None  # it may be the definition's: reading it would be a request

    def multinode_definition(self, nodes: int) -> str:
        """The multinode definition a run would register (named by content), not registered."""
        return self._env.planned_definition(nodes)

    def planned_definition(self, nodes: int = 1) -> str:
        return self._env.planned_definition(nodes)

    def job_tags(self) -> Dict[str, str]:
        return self._env.job_tags()

    def worker_environment(self) -> Dict[str, str]:
        return {}  # the bucket owner may need STS GetCallerIdentity: a request

    def client(self, service: str) -> Any:
        raise ConfigurationError(f"a dry run makes no AWS {service} client")

    def subscribe(self, callback: Callable[[], None]) -> None:
        """A dry run's jobs never change."""

    def unsubscribe(self, callback: Callable[[], None]) -> None:
        """Nothing was subscribed."""


if TYPE_CHECKING:
    def _seams_hold(env: DryRunEnvironment, recorder: RecordingBatch) -> None:
        """Never run: mypy proves the dry run's environment and recorder satisfy their seams."""
        environment: Environment = env
        batch: BatchAPI = recorder
        del environment, batch


class DryRunTracker:
    """Stands where the poller would be handed the job: its futures raise DryRunResult."""

    def __init__(self, env: DryRunEnvironment, storage: RecordingStorage) -> None:
        self._env = env
        self._storage = storage
        self._lock = threading.Lock()

    def track(self, job: TrackedJob) -> None:
        with self._lock:
            requests = list(self._env.recorder.requests)
            self._env.recorder.requests.clear()
            objects = self._storage.take_recorded()
        for future in job.futures():
            settle(future, False, DryRunResult(
                f"dry run: {len(requests)} SubmitJob request(s) and {len(objects)} object(s) "
                f"built, nothing sent", requests=requests, objects=objects))
