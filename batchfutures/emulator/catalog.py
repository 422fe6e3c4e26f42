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
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..statuses import JobStatus
from ..workdir import make_private_dirs
from .computeenvs import SETTLE_SECONDS, settled
from .model import (
    arn_resource,
    compute_environment_arn,
    definition_arn,
    queue_arn,
    scheduling_policy_arn,
)
from .records import DefinitionStore, QueueStore, create_exclusively, read_checked
from .schema import Fields, Json, Nullable, Str
from .tagging import check_tags

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
SHARE = re.compile(r"^[A-Za-z0-9]{1,255}\*?$")  # a share identifier, or a prefix ending in *


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

    def set_tags(self, definition: Dict[str, Any], tags: Dict[str, str]) -> None:
        """A revision's tags (TagResource, UntagResource): written into its record."""
        with self._lock:
            current = self.resolve(definition["jobDefinitionArn"], active_only=False) or definition
            updated = dict(current, tags=dict(tags))
            if not tags:
                del updated["tags"]
            self.store.write(definition["jobDefinitionName"], definition["revision"], updated)


class Queues:
    """The job queues of a folder (records.QueueStore), shared by every instance on it.

    The queues an emulator is made with are created ENABLED and VALID unless they exist
    already; a queue's state, priority, compute environments and jobStateTimeLimitActions are
    whatever was last written. Its status moves as Batch's does (CREATING -> VALID, UPDATING ->
    VALID, DELETING -> gone: computeenvs.settled), `delay` seconds after each change.
    """

    def __init__(self, store: QueueStore, names: Iterable[str], compute_environment: str,
                 delay: float = SETTLE_SECONDS) -> None:
        self.store = store
        self.compute_environment = compute_environment
        self.delay = delay
        for name in names:
            self.create(name, status="VALID")

    def create(self, name: str, state: str = "ENABLED", priority: int = 1,
               actions: Optional[List[Dict[str, Any]]] = None,
               policy: Optional[str] = None, tags: Optional[Dict[str, str]] = None,
               environments: Optional[List[str]] = None, status: str = "CREATING") -> bool:
        """A new queue; False when one of that name exists. `environments`: the names of its
        compute environments in order (none: the emulator's own)."""
        record: Dict[str, Any] = {"state": state, "priority": priority,
                                  "jobStateTimeLimitActions": list(actions or []),
                                  "order": time.time_ns(), "status": status,
                                  "changedAt": time.time()}
        if environments:
            record["computeEnvironmentOrder"] = list(environments)
        if policy:
            record["schedulingPolicyArn"] = policy
        if tags:
            record["tags"] = dict(tags)
        return self.store.create(name, record)

    def _load(self, name: str) -> Optional[Dict[str, Any]]:
        """The queue's record with its transition applied; None: none, or deleted."""
        if not NAME.fullmatch(name):
            return None
        record = self.store.load(name)
        if record is None:
            return None
        before = record.get("status") or "VALID"
        status = settled(before, record.get("changedAt") or 0.0, time.time(), self.delay)
        if status is None:
            self.store.remove(name)
            return None
        if status != before:
            record = dict(record, status=status)
            self.store.write(name, record)
        return record

    def resolve(self, reference: str) -> Optional[str]:
        name = arn_resource(reference, "job-queue") or reference
        return name if self._load(name) is not None else None

    def names(self) -> List[str]:
        return [n for n in self.store.names() if self._load(n) is not None]

    def _record(self, name: str) -> Dict[str, Any]:
        return self._load(name) or {"state": "DISABLED", "priority": 1}

    def state(self, name: str) -> str:
        return self._record(name)["state"]

    def status(self, name: str) -> str:
        return self._record(name).get("status") or "VALID"

    def environments(self, name: str) -> List[str]:
        """The names of the queue's compute environments, in order (the emulator's own when
        it names none)."""
        return list(self._record(name).get("computeEnvironmentOrder") or [self.compute_environment])

    def actions(self, name: str) -> List[Dict[str, Any]]:
        return list(self._record(name).get("jobStateTimeLimitActions") or [])

    def policy(self, name: str) -> Optional[str]:
        """The queue's fair-share scheduling policy ARN, or None (a FIFO queue)."""
        policy = self._record(name).get("schedulingPolicyArn")
        return policy if isinstance(policy, str) and policy else None  # (the schema lets it pass)

    def tags(self, name: str) -> Dict[str, str]:
        tags = self._record(name).get("tags")
        return dict(tags) if isinstance(tags, dict) else {}

    def set_tags(self, name: str, tags: Dict[str, str]) -> None:
        self.store.write(name, dict(self._record(name), tags=dict(tags)))

    def update(self, name: str, state: Optional[str], priority: Optional[int],
               actions: Optional[List[Dict[str, Any]]] = None, policy: Optional[str] = None,
               environments: Optional[List[str]] = None) -> None:
        record = dict(self._record(name))
        if state is not None:
            record["state"] = state
        if priority is not None:
            record["priority"] = priority
        if actions is not None:
            record["jobStateTimeLimitActions"] = list(actions)
        if policy is not None:
            record["schedulingPolicyArn"] = policy
        if environments is not None:
            record["computeEnvironmentOrder"] = list(environments)
        record.update(status="UPDATING", changedAt=time.time())
        self.store.write(name, record)

    def delete(self, name: str) -> None:
        self.store.write(name, dict(self._record(name), status="DELETING", changedAt=time.time()))

    def detail(self, name: str) -> Dict[str, Any]:
        queue = self._record(name)
        status = queue.get("status") or "VALID"
        detail = {
            "jobQueueName": name, "jobQueueArn": queue_arn(name), "state": queue["state"],
            "status": status, "statusReason": QUEUE_STATUS_REASONS[status],
            "priority": queue["priority"],
            "computeEnvironmentOrder": [
                {"order": i + 1, "computeEnvironment": compute_environment_arn(environment)}
                for i, environment in enumerate(self.environments(name))],
            "jobQueueType": "ECS", "tags": self.tags(name),
        }
        if queue.get("jobStateTimeLimitActions"):
            detail["jobStateTimeLimitActions"] = [dict(a) for a in queue["jobStateTimeLimitActions"]]
        policy = self.policy(name)
        if policy:
            detail["schedulingPolicyArn"] = policy
        return detail


QUEUE_STATUS_REASONS = {"VALID": "JobQueue Healthy", "CREATING": "Creating job queue",
                        "UPDATING": "Updating job queue", "DELETING": "Deleting job queue"}


POLICY_RECORD = Fields({"name": Str(128, pattern=NAME), "arn": Str(2048),
                        "fairsharePolicy": Nullable(Json()), "quotaSharePolicy": Nullable(Json()),
                        "tags": Nullable(Json())}, required=frozenset({"name", "arn"}))


class SchedulingPolicies:
    """Scheduling policies, one file each (<folder>/policies/<name>.json), shared by every
    instance on the folder: recorded and shown; they do not change the order jobs run in."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder) / "policies"  # made with the first policy
        self._warned: Dict[Path, Any] = {}

    def create(self, name: str, body: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """The new policy's record; None when one of that name exists."""
        record = dict(body, name=name, arn=scheduling_policy_arn(name))
        make_private_dirs(self.folder)
        if not create_exclusively(self.folder / f"{name}.json", record):
            return None
        return record

    def resolve(self, reference: str) -> Optional[Dict[str, Any]]:
        """A policy from its ARN (what every API takes), else None."""
        name = arn_resource(reference, "scheduling-policy")
        if name is None or not NAME.fullmatch(name):
            return None
        path = self.folder / f"{name}.json"
        try:
            version: Any = path.stat().st_mtime_ns
        except OSError:
            return None
        found = read_checked(path, POLICY_RECORD, self._warned, version)
        return found if isinstance(found, dict) and found.get("arn") == reference else None

    def names(self) -> List[str]:
        try:
            files = sorted(self.folder.iterdir())
        except OSError:
            return []
        return [f.stem for f in files if f.suffix == ".json" and NAME.fullmatch(f.stem)]


def check_time_limit_actions(actions: Optional[List[Dict[str, Any]]]) -> Optional[str]:
    """The ClientException message for invalid jobStateTimeLimitActions, or None."""
    for action in actions or []:
        if action.get("state") != JobStatus.RUNNABLE:
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


def check_scheduling_policy(fairshare: Optional[Dict[str, Any]],
                            tags: Optional[Dict[str, str]]) -> Optional[str]:
    """The ClientException message for a fair-share policy Batch refuses, or None."""
    problem = check_tags(tags)
    if problem:
        return problem
    if not fairshare:
        return None
    decay = fairshare.get("shareDecaySeconds")
    if decay is not None and not 0 <= decay <= 604800:
        return f"shareDecaySeconds must be 0 to 604800, got {decay}"
    reservation = fairshare.get("computeReservation")
    if reservation is not None and not 0 <= reservation <= 99:
        return f"computeReservation must be 0 to 99, got {reservation}"
    shares = fairshare.get("shareDistribution") or []
    if len(shares) > 500:
        return f"shareDistribution takes at most 500 share identifiers, got {len(shares)}"
    seen: List[str] = []
    for share in shares:
        identifier = share["shareIdentifier"]
        if not SHARE.fullmatch(identifier):
            return (f"shareIdentifier {identifier!r} must be 1-255 letters and digits, "
                    "optionally followed by *")
        weight = share.get("weightFactor")
        if weight is not None and not 0.0001 <= weight <= 999.9999:
            return f"weightFactor must be 0.0001 to 999.9999, got {weight}"
        stem = identifier.rstrip("*")
        for other in seen:  # as Batch: no identifier may fall under another's prefix
            other_stem = other.rstrip("*")
            if (other == identifier or (other.endswith("*") and stem.startswith(other_stem))
                    or (identifier.endswith("*") and other_stem.startswith(stem))):
                return f"shareDistribution entries {other!r} and {identifier!r} overlap"
        seen.append(identifier)
    return None
