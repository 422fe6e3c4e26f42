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
from typing import Any, Dict, List, Optional, Tuple

from .errors import DryRunResult
from .jobs import TrackedJob, settle
from .storage import Storage


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
    """The one Batch call a submission makes, recorded instead of sent."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.requests: List[Dict[str, Any]] = []

    def submit_job(self, **request: Any) -> Dict[str, Any]:
        self.requests.append(request)
        job_id = f"dry-run-{next(self._ids)}"
        return {"jobId": job_id, "jobName": request.get("jobName"), "jobArn": job_id}


class DryRunEnvironment:
    """What the Submitter needs of an environment, with nothing reaching Batch."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self.batch = RecordingBatch()
        self.job_queue = env.job_queue
        self.job_definition = planned_definition(env)
        self.describe_grace = float(getattr(env, "describe_grace", 0.0))  # never waited on

    def check_queue(self) -> None:
        """Not checked: DescribeJobQueues would be a request."""

    def definition_memory(self) -> Optional[int]:
        return None  # reading the definition would be a request; the settings decide

    def worker_command(self, job_url: str) -> List[str]:
        return self._env.worker_command(job_url)

    def multinode_definition(self, nodes: int) -> str:
        """The multinode definition a run would register (named by content), not registered."""
        given = getattr(self._env, "_given_definition", None)
        if given:
            return given
        from .jobdefinitions import definition_name, definition_properties

        image = getattr(self._env, "image", None) or "batchfutures-local"
        options = getattr(self._env, "definition_options", {})
        return definition_name(definition_properties(image, nodes=nodes, **options))


def planned_definition(env: Any) -> str:
    """The job definition a run would use, without registering or reading one."""
    given = getattr(env, "_given_definition", None)
    if given:
        return given
    image = getattr(env, "image", None)
    if image:
        from .jobdefinitions import definition_name, definition_properties

        return definition_name(definition_properties(image, **getattr(env, "definition_options", {})))
    return env.job_definition  # the emulator's: a constant


class DryRunTracker:
    """Stands where the poller would be handed the job: its futures raise DryRunResult."""

    def __init__(self, env: DryRunEnvironment, storage: RecordingStorage) -> None:
        self._env = env
        self._storage = storage
        self._lock = threading.Lock()

    def track(self, job: TrackedJob) -> None:
        with self._lock:
            requests = list(self._env.batch.requests)
            self._env.batch.requests.clear()
            objects = self._storage.take_recorded()
        for future in job.futures():
            settle(future, False, DryRunResult(
                f"dry run: {len(requests)} SubmitJob request(s) and {len(objects)} object(s) "
                f"built, nothing sent", requests=requests, objects=objects))
