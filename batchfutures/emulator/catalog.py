"""Job definitions and job queues: what SubmitJob refers to by name or ARN.

Definitions persist as one file per revision (records.DefinitionStore), created exclusively, so
two processes registering the same name get two revisions, as Batch gives.
`batchfutures-worker` revision 1 (`python -m batchfutures.worker`, 1 vCPU, 2048 MiB) is always
there. Queues are files too (records.QueueStore), so their state is shared by every instance on
the folder: the ones an emulator is made with are created ENABLED when missing, one compute
environment each.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .model import arn_resource, compute_environment_arn, definition_arn, queue_arn
from .records import DefinitionStore, QueueStore

DEFAULT_DEFINITION = "batchfutures-worker"
DEFAULT_BODY: Dict[str, Any] = {
    "type": "container",
    "containerProperties": {
        "image": "batchfutures-local",
        "command": ["python", "-m", "batchfutures.worker"],
        "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "2048"}],
    },
    "platformCapabilities": ["EC2"],
}
NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class Rejected(Exception):
    """A request Batch would refuse: becomes a ClientError (ClientException) for the caller."""

    def __init__(self, message: str, code: str = "ClientException") -> None:
        super().__init__(message)
        self.code = code


class Definitions:
    """Registered job definitions (records.DefinitionStore)."""

    def __init__(self, folder: Path) -> None:
        self.store = DefinitionStore(folder)
        self._lock = threading.Lock()
        if not self.revisions(DEFAULT_DEFINITION):
            self._create(DEFAULT_DEFINITION, 1, DEFAULT_BODY)

    def _create(self, name: str, revision: int, body: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        definition = dict(body)
        definition.update(jobDefinitionName=name, revision=revision, status="ACTIVE",
                          jobDefinitionArn=definition_arn(name, revision),
                          containerOrchestrationType="ECS")
        return definition if self.store.create(name, revision, definition) else None

    def register(self, name: str, body: Dict[str, Any]) -> Dict[str, Any]:
        with self._lock:
            while True:  # another process may take the revision first: take the next one
                revisions = self.revisions(name)
                revision = (revisions[-1]["revision"] if revisions else 0) + 1
                definition = self._create(name, revision, body)
                if definition is not None:
                    return definition

    def names(self) -> List[str]:
        return [n for n in self.store.names() if NAME.fullmatch(n)]

    def revisions(self, name: str) -> List[Dict[str, Any]]:
        return self.store.revisions(name) if NAME.fullmatch(name) else []

    def resolve(self, reference: str, *, active_only: bool = True) -> Optional[Dict[str, Any]]:
        """A definition from `name` (latest ACTIVE revision), `name:revision` or its ARN."""
        name = arn_resource(reference, "job-definition") or reference
        base, _, revision = name.partition(":")
        revisions = self.revisions(base)
        if revision:
            if not revision.isdigit():
                return None
            found = next((d for d in revisions if d["revision"] == int(revision)), None)
            return found if found is None or not active_only or found["status"] == "ACTIVE" else None
        active = [d for d in revisions if d["status"] == "ACTIVE"]
        return active[-1] if active else None

    def set_status(self, definition: Dict[str, Any], status: str) -> None:
        self.store.write(definition["jobDefinitionName"], definition["revision"],
                         dict(definition, status=status))


class Queues:
    """The job queues of a folder (records.QueueStore), shared by every instance on it.

    The queues an emulator is made with are created ENABLED unless they exist already; a
    queue's state, priority and jobStateTimeLimitActions are whatever was last written.
    """

    def __init__(self, store: QueueStore, names: Any, compute_environment: str) -> None:
        self.store = store
        self.compute_environment = compute_environment
        for name in names:
            self.create(name)

    def create(self, name: str, state: str = "ENABLED", priority: int = 1,
               actions: Optional[List[Dict[str, Any]]] = None) -> bool:
        """A new queue; False when one of that name exists."""
        return self.store.create(name, {"state": state, "priority": priority,
                                        "jobStateTimeLimitActions": list(actions or []),
                                        "order": time.time_ns()})

    def resolve(self, reference: str) -> Optional[str]:
        name = arn_resource(reference, "job-queue") or reference
        return name if NAME.fullmatch(name) and self.store.load(name) is not None else None

    def names(self) -> List[str]:
        return self.store.names()

    def _record(self, name: str) -> Dict[str, Any]:
        return self.store.load(name) or {"state": "DISABLED", "priority": 1}

    def state(self, name: str) -> str:
        return self._record(name)["state"]

    def actions(self, name: str) -> List[Dict[str, Any]]:
        return list(self._record(name).get("jobStateTimeLimitActions") or [])

    def update(self, name: str, state: Optional[str], priority: Optional[int],
               actions: Optional[List[Dict[str, Any]]] = None) -> None:
        record = dict(self._record(name))
        if state is not None:
            record["state"] = state
        if priority is not None:
            record["priority"] = priority
        if actions is not None:
            record["jobStateTimeLimitActions"] = list(actions)
        self.store.write(name, record)

    def detail(self, name: str) -> Dict[str, Any]:
        queue = self._record(name)
        detail = {
            "jobQueueName": name, "jobQueueArn": queue_arn(name), "state": queue["state"],
            "status": "VALID", "statusReason": "JobQueue Healthy", "priority": queue["priority"],
            "computeEnvironmentOrder": [{
                "order": 1, "computeEnvironment": compute_environment_arn(self.compute_environment)}],
            "jobQueueType": "ECS", "tags": {},
        }
        if queue.get("jobStateTimeLimitActions"):
            detail["jobStateTimeLimitActions"] = [dict(a) for a in queue["jobStateTimeLimitActions"]]
        return detail


def check_time_limit_actions(actions: Optional[List[Dict[str, Any]]]) -> Optional[str]:
    """The ClientException message for invalid jobStateTimeLimitActions, or None."""
    for action in actions or []:
        if action.get("state") != "RUNNABLE":
            return f"jobStateTimeLimitActions state must be RUNNABLE, got {action.get('state')!r}"
        if action.get("action") != "CANCEL":
            return f"jobStateTimeLimitActions action must be CANCEL, got {action.get('action')!r}"
        seconds = action.get("maxTimeSeconds")
        # AWS takes 600 to 86400; the emulator takes any positive time, so tests need not wait
        if not isinstance(seconds, (int, float)) or not 0 < seconds <= 86400:
            return f"jobStateTimeLimitActions maxTimeSeconds must be 1 to 86400, got {seconds!r}"
    return None


def resolve_resources(properties: Dict[str, Any], overrides: Dict[str, Any]
                      ) -> Tuple[List[Dict[str, str]], float, Optional[int]]:
    """(resourceRequirements, vCPUs, MEMORY MiB) of a job: the definition's, then the overrides'.

    The legacy `vcpus`/`memory` integers count when no resourceRequirements entry names the same
    resource. Raises Rejected for values Batch refuses.
    """
    merged: Dict[str, Dict[str, str]] = {}
    for source in (properties, overrides):
        for key, kind in (("vcpus", "VCPU"), ("memory", "MEMORY")):
            if source.get(key) is not None:
                merged[kind] = {"type": kind, "value": str(source[key])}
        for item in source.get("resourceRequirements") or []:
            kind = item.get("type")
            if kind not in ("VCPU", "MEMORY", "GPU"):
                raise Rejected(f"resourceRequirements type {kind!r} must be VCPU, MEMORY or GPU")
            merged[kind] = {"type": kind, "value": str(item.get("value"))}
    vcpus, memory = 1.0, None
    for kind, item in merged.items():
        value = item["value"]
        try:
            number = float(value)
        except ValueError:
            raise Rejected(f"resourceRequirements {kind} value {value!r} is not a number")
        if kind == "VCPU" and not number > 0:
            raise Rejected(f"resourceRequirements VCPU must be positive, got {value}")
        if kind == "MEMORY" and (number < 4 or number != int(number)):
            raise Rejected(f"resourceRequirements MEMORY must be a whole number of MiB >= 4, got {value}")
        if kind == "GPU" and (number < 0 or number != int(number)):
            raise Rejected(f"resourceRequirements GPU must be a whole number >= 0, got {value}")
        if kind == "VCPU":
            vcpus = number
        elif kind == "MEMORY":
            memory = int(number)
    order = {"VCPU": 0, "MEMORY": 1, "GPU": 2}
    requirements = sorted(merged.values(), key=lambda item: order[item["type"]])
    return requirements, vcpus, memory
