"""Consumable resources (Batch's resource-aware scheduling, 2025): licences, connections, any
limit outside the compute environment that jobs hold while they run.

    check_create(name, total, kind) -> Optional[str]     Batch's refusals (pure)
    updated_total(total, operation, quantity)             UpdateConsumableResource's new total,
        -> (total, problem)                                SET / ADD / REMOVE (pure)
    requirements(properties) -> [(name, quantity)]        a job's, from consumableResourceProperties
    fits(needs, available) -> bool                        all of a job's resources free now (pure)
    ConsumableResources(folder)                           one file per resource
        (<folder>/consumables/<name>.json), shared by every instance on the folder; what is in
        use is counted by the instance whose jobs hold it

As Batch does (User Guide, "Resource-aware scheduling"): a job whose resources are not all free
when it reaches the head of its queue waits RUNNABLE; they are locked when it moves to STARTING
and unlocked when it ends. A REPLENISHABLE resource's units come back then; a NON_REPLENISHABLE
resource's are taken from its total for good. The emulator unlocks them when each attempt ends
(a retried job locks them again as it starts again).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..workdir import make_private_dirs
from .catalog import NAME  # one name rule for every Batch resource of the emulator
from .model import arn_resource, consumable_resource_arn
from .records import create_exclusively, read_record, record_names, write_atomically
from .schema import Fields, Int, Json, Nullable, Str

KINDS = ("REPLENISHABLE", "NON_REPLENISHABLE")
OPERATIONS = ("SET", "ADD", "REMOVE")
MAX_QUANTITY = 2 ** 63 - 1

RECORD = Fields({
    "totalQuantity": Int(0, MAX_QUANTITY),
    "resourceType": Str(choices=frozenset(KINDS)),
    "createdAt": Int(0, 2 ** 53),
    "tags": Nullable(Json()),
}, required=frozenset({"totalQuantity", "resourceType", "createdAt"}))

Needs = List[Tuple[str, int]]


def check_create(name: str, total: Optional[int], kind: Optional[str]) -> Optional[str]:
    """The ClientException message for a CreateConsumableResource, or None."""
    if not NAME.fullmatch(name):
        return (f"consumableResourceName {name!r} must be 1-128 letters, digits, hyphens and "
                "underscores")
    if total is not None and total < 0:
        return f"totalQuantity must be non-negative, got {total}"
    if kind is not None and kind not in KINDS:
        return f"resourceType must be REPLENISHABLE or NON_REPLENISHABLE, got {kind!r}"
    return None


def updated_total(total: int, operation: Optional[str],
                  quantity: Optional[int]) -> Tuple[int, Optional[str]]:
    """(the new total, None) of an UpdateConsumableResource, or (total, the refusal)."""
    operation = operation or "SET"
    if operation not in OPERATIONS:
        return total, f"operation must be SET, ADD or REMOVE, got {operation!r}"
    if quantity is None:
        return total, "quantity is required"
    if quantity < 0:
        return total, f"quantity must be non-negative, got {quantity}"
    if operation == "SET":
        return quantity, None
    if operation == "ADD":
        return total + quantity, None
    if quantity > total:
        return total, f"Cannot remove {quantity}: the resource's total quantity is {total}"
    return total - quantity, None


def requirements(properties: Optional[Dict[str, Any]]) -> Needs:
    """(name, quantity) of each resource in a consumableResourceProperties (names or ARNs)."""
    needs: Dict[str, int] = {}
    for item in (properties or {}).get("consumableResourceList") or []:
        reference = str(item.get("consumableResource") or "")
        name = arn_resource(reference, "consumable-resource") or reference
        needs[name] = needs.get(name, 0) + int(item.get("quantity") or 0)
    return sorted(needs.items())


def fits(needs: Needs, available: Dict[str, int]) -> bool:
    """Whether every resource a job needs has that many units free now."""
    return all(available.get(name, 0) >= quantity for name, quantity in needs)


class ConsumableResources:
    """The consumable resources of a folder and what this instance's jobs hold of them."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder) / "consumables"
        make_private_dirs(self.folder)
        self._warned: Dict[Path, Any] = {}
        self._lock = threading.Lock()
        self.in_use: Dict[str, int] = {}  # units held by this instance's running jobs

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}.json"

    def create(self, name: str, total: int, kind: str, tags: Optional[Dict[str, str]]) -> bool:
        record: Dict[str, Any] = {"totalQuantity": total, "resourceType": kind,
                                  "createdAt": int(time.time() * 1000)}
        if tags:
            record["tags"] = dict(tags)
        return create_exclusively(self._path(name), record)

    def load(self, name: str) -> Optional[Dict[str, Any]]:
        return read_record(self._path(name), RECORD, self._warned)

    def write(self, name: str, record: Dict[str, Any]) -> None:
        write_atomically(self._path(name), json.dumps(record, separators=(",", ":")))

    def delete(self, name: str) -> None:
        try:
            self._path(name).unlink()
        except OSError:
            pass

    def resolve(self, reference: str) -> Optional[str]:
        name = arn_resource(reference, "consumable-resource") or reference
        return name if NAME.fullmatch(name) and self.load(name) is not None else None

    def names(self) -> List[str]:
        return sorted(n for n in record_names(self.folder) if self.load(n) is not None)

    def available(self, names: List[str]) -> Dict[str, int]:
        """Units free now of each named resource (a missing resource has none)."""
        free: Dict[str, int] = {}
        for name in names:
            record = self.load(name)
            total = record["totalQuantity"] if record else 0
            held = self.in_use.get(name, 0) if record and record["resourceType"] == "REPLENISHABLE" else 0
            free[name] = max(0, total - held)
        return free

    def acquire(self, needs: Needs) -> bool:
        """Lock a job's resources as it moves to STARTING; False (nothing taken): not all free."""
        with self._lock:
            if not fits(needs, self.available([name for name, _ in needs])):
                return False
            for name, quantity in needs:
                record = self.load(name)
                if record is not None and record["resourceType"] == "NON_REPLENISHABLE":
                    # consumed for good: taken from the total, never given back
                    self.write(name, dict(record, totalQuantity=record["totalQuantity"] - quantity))
                else:
                    self.in_use[name] = self.in_use.get(name, 0) + quantity
            return True

    def release(self, needs: Needs) -> None:
        """Unlock what a job held (its attempt ended): replenishable units come back."""
        with self._lock:
            for name, quantity in needs:
                if name in self.in_use:
                    self.in_use[name] = max(0, self.in_use[name] - quantity)

    def summary(self, name: str) -> Optional[Dict[str, Any]]:
        """DescribeConsumableResource's answer (without tags), or None."""
        record = self.load(name)
        if record is None:
            return None
        total = record["totalQuantity"]
        used = self.in_use.get(name, 0) if record["resourceType"] == "REPLENISHABLE" else 0
        return {"consumableResourceName": name, "consumableResourceArn": consumable_resource_arn(name),
                "totalQuantity": total, "inUseQuantity": used,
                "availableQuantity": max(0, total - used), "resourceType": record["resourceType"],
                "createdAt": record["createdAt"], "tags": dict(record.get("tags") or {})}
