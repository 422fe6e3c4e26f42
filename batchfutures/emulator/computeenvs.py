"""Compute environments: CreateComputeEnvironment, UpdateComputeEnvironment,
DeleteComputeEnvironment and what DescribeComputeEnvironments shows.

    check_create(params) -> Optional[str]          Batch's refusals of a new environment (pure)
    check_update(record, params) -> Optional[str]  ... of an update (pure)
    settled(status, changed_at, now, delay)        the status a transition has reached (pure):
        CREATING/UPDATING -> VALID, DELETING -> None (gone), after `delay` seconds
    ComputeEnvironments(folder, default, max_vcpus, delay)
        one file per environment (<folder>/computeenvs/<name>.json), shared by every instance
        on the folder; the emulator's own environment (`default`) is always there, VALID and
        ENABLED, with the emulator's vCPUs, and is never stored

An environment's status moves as Batch's does (CREATING -> VALID after creation, UPDATING ->
VALID after an update, DELETING -> gone after DeleteComputeEnvironment), `delay` seconds after
each change (0.5 s by default; AWS takes tens of seconds), applied when it is next read. Jobs of
a queue run on its first environment's vCPUs: at most its `maxvCpus` at once (and never more
than the emulator's own `max_vcpus`); a DISABLED environment starts no job.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..workdir import make_private_dirs
from .model import arn_resource, cluster_arn, compute_environment_arn
from .records import create_exclusively, read_record, record_names, write_atomically
from .schema import Fields, Int, Json, Nullable, Num, Str

NAME_RULE = "up to 128 letters (uppercase and lowercase), numbers, hyphens, and underscores"
SETTLE_SECONDS = 0.5  # CREATING, UPDATING, DELETING last this long (AWS: tens of seconds)
TRANSITIONAL = ("CREATING", "UPDATING", "DELETING")
EC2_TYPES = ("EC2", "SPOT")
FARGATE_TYPES = ("FARGATE", "FARGATE_SPOT")
SPOT_TYPES = ("SPOT", "FARGATE_SPOT")
# members of computeResources Batch refuses for Fargate resources ("This parameter isn't
# applicable to jobs that are running on Fargate resources, and shouldn't be specified.")
NOT_FOR_FARGATE = ("minvCpus", "desiredvCpus", "instanceTypes", "imageId", "ec2KeyPair",
                   "instanceRole", "placementGroup", "bidPercentage", "spotIamFleetRole",
                   "launchTemplate", "ec2Configuration", "allocationStrategy", "tags")
BEING_MODIFIED = "Cannot delete, resource is being modified"
IN_USE = "Cannot delete, found existing JobQueue relationship"

RECORD = Fields({
    "type": Str(choices=frozenset({"MANAGED", "UNMANAGED"})),
    "state": Str(choices=frozenset({"ENABLED", "DISABLED"})),
    "status": Str(choices=frozenset({"CREATING", "UPDATING", "DELETING", "VALID"})),
    "changedAt": Num(0, 1e12),
    "order": Nullable(Int(0, 2 ** 63)),
    "computeResources": Nullable(Json()),
    "serviceRole": Nullable(Str(2048)),
    "unmanagedvCpus": Nullable(Int(0, 2 ** 31)),
    "tags": Nullable(Json()),
    "uuid": Nullable(Str(64)),
}, required=frozenset({"type", "state", "status", "changedAt"}))


def check_create(params: Dict[str, Any]) -> Optional[str]:
    """The ClientException message Batch answers CreateComputeEnvironment with, or None."""
    kind, state = params.get("type"), params.get("state")
    if kind not in ("MANAGED", "UNMANAGED"):
        return f"type must be MANAGED or UNMANAGED, got {kind!r}"
    if state is not None and state not in ("ENABLED", "DISABLED"):
        return f"state must be ENABLED or DISABLED, got {state!r}"
    resources = params.get("computeResources")
    if kind == "UNMANAGED":
        if resources is not None:
            return "computeResources can't be specified for an UNMANAGED compute environment"
        return None
    if params.get("eksConfiguration"):
        return "eksConfiguration: the emulator runs only ECS compute environments"
    if resources is None:
        return "computeResources is required for a MANAGED compute environment"
    return check_resources(resources)


def check_resources(resources: Dict[str, Any]) -> Optional[str]:
    """Batch's refusals of a managed environment's computeResources (pure)."""
    kind = resources.get("type")
    if kind not in EC2_TYPES + FARGATE_TYPES:
        return f"computeResources.type must be one of EC2, SPOT, FARGATE, FARGATE_SPOT, got {kind!r}"
    most = resources.get("maxvCpus")
    if most is None or most < 0:
        return f"maxvCpus must be a non-negative integer, got {most!r}"
    if kind in FARGATE_TYPES:
        given = [key for key in NOT_FOR_FARGATE if resources.get(key) is not None]
        if given:
            return (f"{given[0]} isn't applicable to Fargate resources (computeResources.type "
                    f"{kind}) and shouldn't be specified")
        return None
    least = resources.get("minvCpus") or 0
    desired = resources.get("desiredvCpus")
    if least < 0 or least > most:
        return f"minvCpus {least} must be between 0 and maxvCpus {most}"
    if desired is not None and not least <= desired <= most:
        return f"desiredvCpus {desired} must be between minvCpus {least} and maxvCpus {most}"
    if not resources.get("instanceRole"):
        return f"instanceRole is required for {kind} compute resources"
    if kind == "SPOT" and resources.get("bidPercentage") is not None and not (
            0 <= resources["bidPercentage"] <= 100):
        return f"bidPercentage must be 0 to 100, got {resources['bidPercentage']}"
    return None


def check_update(record: Dict[str, Any], params: Dict[str, Any]) -> Optional[str]:
    """The ClientException message for an UpdateComputeEnvironment of `record`, or None."""
    state = params.get("state")
    if state is not None and state not in ("ENABLED", "DISABLED"):
        return f"state must be ENABLED or DISABLED, got {state!r}"
    if record["status"] in ("CREATING", "DELETING"):
        return "Cannot update, resource is being modified"
    update = params.get("computeResources")
    if update is None:
        return None
    current = record.get("computeResources")
    if current is None:
        return "computeResources can't be specified for an UNMANAGED compute environment"
    if update.get("type") is not None and update["type"] != current.get("type"):
        return "computeResources.type can't be changed"
    return check_resources(merged_resources(current, update))


def merged_resources(current: Dict[str, Any], update: Dict[str, Any]) -> Dict[str, Any]:
    """An update's computeResources over the current ones: only the members it names change."""
    merged = dict(current)
    merged.update({key: value for key, value in update.items()
                   if value is not None and key != "updateToLatestImageVersion"})
    return merged


def settled(status: str, changed_at: float, now: float, delay: float) -> Optional[str]:
    """The status an environment (or queue) has reached: a transition ends `delay` seconds
    after it began; None: deleted."""
    if status not in TRANSITIONAL or now - changed_at < delay:
        return status
    return None if status == "DELETING" else "VALID"


class ComputeEnvironments:
    """The compute environments of a folder (see the module doc)."""

    def __init__(self, folder: Path, default: str, max_vcpus: float,
                 delay: float = SETTLE_SECONDS) -> None:
        self.folder = Path(folder) / "computeenvs"
        make_private_dirs(self.folder)
        self.default = default
        self.max_vcpus = max_vcpus
        self.delay = delay
        self._warned: Dict[Path, Any] = {}

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}.json"

    def create(self, name: str, params: Dict[str, Any]) -> bool:
        """A new environment, CREATING; False when one of that name exists."""
        if name == self.default:
            return False
        record = {key: params[key] for key in ("type", "computeResources", "serviceRole",
                                               "unmanagedvCpus", "tags")
                  if params.get(key) is not None}
        record.update(state=params.get("state") or "ENABLED", status="CREATING",
                      changedAt=time.time(), order=time.time_ns(), uuid=str(uuid.uuid4()))
        return create_exclusively(self._path(name), record)

    def load(self, name: str) -> Optional[Dict[str, Any]]:
        """A stored environment with its transition applied; None: none (or gone)."""
        path = self._path(name)
        record = read_record(path, RECORD, self._warned)
        if record is None:
            return None
        status = settled(record["status"], record["changedAt"], time.time(), self.delay)
        if status is None:
            try:
                path.unlink()
            except OSError:
                pass
            return None
        if status != record["status"]:
            record = dict(record, status=status)
            write_atomically(path, json.dumps(record, separators=(",", ":")))
        return record

    def write(self, name: str, record: Dict[str, Any]) -> None:
        write_atomically(self._path(name), json.dumps(record, separators=(",", ":")))

    def resolve(self, reference: str) -> Optional[str]:
        """An environment's name from its name or ARN, if it exists."""
        name = arn_resource(reference, "compute-environment") or reference
        if name == self.default:
            return name
        return name if self.load(name) is not None else None

    def names(self) -> List[str]:
        found = [(record.get("order") or 0, n) for n in record_names(self.folder)
                 if (record := self.load(n)) is not None]
        return [self.default] + [n for _, n in sorted(found)]

    def capacity(self, name: str) -> Tuple[Optional[float], bool]:
        """(its maxvCpus, whether it starts jobs now) of an environment: (None, True) for the
        emulator's own (no limit but the emulator's); a DISABLED environment, one not VALID
        (or UPDATING) or one gone starts none."""
        if name == self.default:
            return None, True
        record = self.load(name)
        if record is None:
            return 0.0, False
        if record["type"] == "UNMANAGED":
            most = float(record.get("unmanagedvCpus") or 0)
        else:
            most = float((record.get("computeResources") or {}).get("maxvCpus") or 0)
        return most, record["state"] == "ENABLED" and record["status"] in ("VALID", "UPDATING")

    def spot_type(self, name: str) -> Optional[str]:
        """SPOT or FARGATE_SPOT when the environment runs on Spot capacity, else None."""
        record = self.load(name) if name != self.default else None
        kind = ((record or {}).get("computeResources") or {}).get("type")
        return kind if kind in SPOT_TYPES else None

    def detail(self, name: str) -> Dict[str, Any]:
        """Its ComputeEnvironmentDetail (botocore's shape)."""
        arn = compute_environment_arn(name)
        if name == self.default:
            return default_detail(name, self.max_vcpus)
        record = self.load(name) or {}
        detail: Dict[str, Any] = {
            "computeEnvironmentName": name, "computeEnvironmentArn": arn,
            "ecsClusterArn": cluster_arn(f"{name}_Batch_{record.get('uuid', '')}"),
            "tags": dict(record.get("tags") or {}), "type": record.get("type", "MANAGED"),
            "state": record.get("state", "ENABLED"), "status": record.get("status", "VALID"),
            "statusReason": STATUS_REASONS.get(record.get("status", "VALID"), ""),
            "containerOrchestrationType": "ECS", "uuid": record.get("uuid", ""),
        }
        if record.get("computeResources") is not None:
            detail["computeResources"] = json.loads(json.dumps(record["computeResources"]))
        for key in ("serviceRole", "unmanagedvCpus"):
            if record.get(key) not in (None, ""):
                detail[key] = record[key]
        return detail

    def delete(self, name: str, record: Dict[str, Any]) -> None:
        self.write(name, dict(record, status="DELETING", changedAt=time.time()))


STATUS_REASONS = {"VALID": "ComputeEnvironment Healthy", "CREATING": "Creating compute environment",
                  "UPDATING": "Updating compute environment",
                  "DELETING": "Deleting compute environment"}


def default_detail(name: str, max_vcpus: float) -> Dict[str, Any]:
    """The ComputeEnvironmentDetail of the emulator's own environment: MANAGED and VALID, EC2,
    as many vCPUs as the emulator runs at once (whole: the model's maxvCpus is an integer;
    rounded down, so a client sizing by it never asks for more than runs)."""
    vcpus = max(1, int(max_vcpus))
    return {
        "computeEnvironmentName": name, "computeEnvironmentArn": compute_environment_arn(name),
        "ecsClusterArn": cluster_arn(name), "tags": {}, "type": "MANAGED", "state": "ENABLED",
        "status": "VALID", "statusReason": "ComputeEnvironment Healthy",
        "computeResources": {"type": "EC2", "allocationStrategy": "BEST_FIT_PROGRESSIVE",
                             "minvCpus": 0, "maxvCpus": vcpus, "desiredvCpus": 0,
                             "instanceTypes": ["optimal"], "subnets": [], "securityGroupIds": [],
                             "tags": {}},
        "containerOrchestrationType": "ECS",
        "uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, compute_environment_arn(name))),
    }
