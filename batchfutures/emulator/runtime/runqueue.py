"""The scheduler's RUNNABLE queue: who starts next, who is held, the vCPUs in use.

    add(unit) -> bool           queued in submission order (placement.queue_key) in its lane
                                (its queue's compute environment); False: held, as Batch holds
                                a job that never fits RUNNABLE with a reason
    head_fits()                 whether a lane's head could start now (strict FIFO in a lane)
    take(tick)                  a lane's head, its vCPUs (and consumable resources) reserved,
                                when it fits and was not queued in this very tick
    release(unit)               its vCPUs and resources back (its attempt ended)
    front(queue, limit)         GetJobQueueSnapshot's order: held units keep their place
    past_time_limit(...)        held units their queue's jobStateTimeLimitActions cancel now

Placement itself (what fits, the order) is pure, in placement.py; a unit cancelled while
queued stays in the heap until it reaches the head, where it is dropped (no search).
The caller holds the emulator's lock.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

from ...statuses import JobStatus
from ..consumables import Needs, fits
from ..jobstate import CE_MAX_RESOURCE, MISCONFIGURED, Unit
from .deadlines import time_limit_cancellation
from .placement import EPSILON, Ask, Host, fits_now, never_fits, queue_key


def ask_of(unit: Unit) -> Ask:
    """What one unit asks of the host (a node's own, in a multi-node job)."""
    spec = unit.job.spec
    node = spec.node(unit.index if unit.job.is_multinode else None)
    vcpus = float(node["vcpus"] or 1) if unit.job.is_multinode else spec.vcpus or 1.0
    return Ask(vcpus=vcpus, total_vcpus=spec.total_vcpus(), memory_mib=node["memory"],
               gpus=node["gpus"] or 0)


class Gate(Protocol):
    """What a unit needs beyond vCPUs before it may start: its consumable resources
    (consumables.ConsumableResources)."""

    def available(self, names: List[str]) -> Dict[str, int]: ...

    def acquire(self, needs: Needs) -> bool: ...

    def release(self, needs: Needs) -> None: ...


def needs_of(unit: Unit) -> Needs:
    return [(str(name), int(quantity)) for name, quantity in unit.job.spec.consumables or []]


class RunQueue:
    """RUNNABLE units in lanes, one per compute environment: strict FIFO within a lane (its head
    blocks it: vCPUs of its environment, consumable resources), and the host's vCPUs shared in
    submission order across lanes (a head that does not fit the host stops every lane)."""

    def __init__(self, host: Host, *, lane_of: Callable[[Unit], str] = lambda unit: "",
                 lane_limit: Callable[[str], Tuple[Optional[float], bool]] = lambda lane: (None, True),
                 gate: Optional[Gate] = None) -> None:
        self.host = host
        self.used_vcpus = 0.0
        self.used_by_lane: Dict[str, float] = {}
        self._lane_of = lane_of
        self._lane_limit = lane_limit  # (the environment's maxvCpus or None, whether it starts jobs)
        self._gate = gate
        # per lane: (seq, place, order, unit): seq is never None for an own job (build_spec)
        self._heaps: Dict[str, List[Tuple[Optional[int], int, int, Unit]]] = {}
        self._order = itertools.count()
        self._held: List[Unit] = []  # RUNNABLE with a reason that keeps them there
        self._taken: Dict[int, Unit] = {}  # units holding vCPUs (STARTING, RUNNING)

    def add(self, unit: Unit, now: float) -> bool:
        """Queue a unit that has just become RUNNABLE; False: it never fits, held since `now`
        (`held_reason` says why)."""
        unit.lane = lane = self._lane_of(unit)
        if self.held_reason(unit) is not None:
            unit.runnable_since = now
            self._held.append(unit)
            return False
        seq, place = queue_key(unit.job.spec.seq, unit.index, unit.is_main_node)
        heapq.heappush(self._heaps.setdefault(lane, []), (seq, place, next(self._order), unit))
        return True

    def held_reason(self, unit: Unit) -> Optional[str]:
        """Batch's statusReason for a unit that can never start where it is queued, or None:
        more than this machine has (JOB_RESOURCE_REQUIREMENT), or more vCPUs than its compute
        environment's maxvCpus (COMPUTE_ENVIRONMENT_MAX_RESOURCE)."""
        ask = ask_of(unit)
        if never_fits(ask, self.host):
            return MISCONFIGURED
        most, _ = self._lane_limit(unit.lane or "")
        if most is not None and never_fits(ask, self.host._replace(max_vcpus=most)):
            return CE_MAX_RESOURCE
        return None

    def _head(self, lane: str) -> Optional[Unit]:
        heap = self._heaps.get(lane) or []
        while heap and heap[0][3].status != JobStatus.RUNNABLE:
            heapq.heappop(heap)  # cancelled while queued
        return heap[0][3] if heap else None

    def _heads(self) -> List[Tuple[str, Unit]]:
        """Each lane's head, in submission order."""
        heads = [(lane, head) for lane in list(self._heaps) if (head := self._head(lane)) is not None]
        return sorted(heads, key=lambda item: queue_key(item[1].job.spec.seq, item[1].index,
                                                        item[1].is_main_node))

    def _lane_fits(self, lane: str, ask: Ask) -> bool:
        most, enabled = self._lane_limit(lane)
        if not enabled:
            return False
        return most is None or self.used_by_lane.get(lane, 0.0) + ask.vcpus <= most + EPSILON

    def _gate_fits(self, unit: Unit) -> bool:
        needs = needs_of(unit)
        if not needs or self._gate is None:
            return True
        return fits(needs, self._gate.available([name for name, _ in needs]))

    def head_fits(self) -> bool:
        for lane, unit in self._heads():
            ask = ask_of(unit)
            if not fits_now(ask, self.used_vcpus, self.host):
                return False
            if self._lane_fits(lane, ask) and self._gate_fits(unit):
                return True
        return False

    def take(self, tick: int) -> Optional[Unit]:
        """The first lane head that can start in tick `tick`, popped with its vCPUs (and its
        consumable resources) reserved."""
        for lane, unit in self._heads():
            if unit.tick == tick:  # became RUNNABLE in this tick: next tick
                continue
            ask = ask_of(unit)
            if not fits_now(ask, self.used_vcpus, self.host):
                return None  # the host is full for the oldest head: nobody jumps it
            if not self._lane_fits(lane, ask):
                continue
            needs = needs_of(unit)
            if needs and self._gate is not None and not self._gate.acquire(needs):
                continue  # waits RUNNABLE at its lane's head until its resources are free
            unit.holds = needs or None
            heapq.heappop(self._heaps[lane])
            self.used_vcpus += ask.vcpus
            self.used_by_lane[lane] = self.used_by_lane.get(lane, 0.0) + ask.vcpus
            unit.reserved = ask.vcpus
            self._taken[id(unit)] = unit
            return unit
        return None

    def usage(self, queue: str) -> Dict[Optional[str], float]:
        """vCPUs held by `queue`'s starting and running units, by share identifier."""
        used: Dict[Optional[str], float] = {}
        for unit in self._taken.values():
            if unit.job.spec.queue == queue:
                share = unit.job.spec.share_identifier
                used[share] = used.get(share, 0.0) + unit.reserved
        return used

    def release(self, unit: Unit) -> None:
        self._taken.pop(id(unit), None)
        self.used_vcpus = max(0.0, self.used_vcpus - unit.reserved)
        lane = unit.lane or ""
        if lane in self.used_by_lane:
            self.used_by_lane[lane] = max(0.0, self.used_by_lane[lane] - unit.reserved)
        unit.reserved = 0.0
        if unit.holds and self._gate is not None:
            self._gate.release(unit.holds)
        unit.holds = None

    def front(self, queue: str, limit: int) -> List[Unit]:
        """The first `limit` RUNNABLE units of `queue`, in the order they would start: submission
        order, a main node first; held units keep their place, as on Batch (where they block the
        queue's head)."""
        units = {id(entry[3]): entry[3] for heap in self._heaps.values() for entry in heap}
        units.update((id(unit), unit) for unit in self._held)
        found = [u for u in units.values()
                 if u.status == JobStatus.RUNNABLE and u.job.spec.queue == queue]
        return heapq.nsmallest(limit, found, key=lambda unit: queue_key(
            unit.job.spec.seq, unit.index, unit.is_main_node))

    def past_time_limit(self, actions_of: Callable[[str], List[Dict[str, Any]]],
                        now: float) -> List[Tuple[Unit, str]]:
        """Held units to cancel now, each with its statusReason; they leave the queue, and so
        do held units that are no longer RUNNABLE."""
        due: List[Tuple[Unit, str]] = []
        still = []
        for unit in self._held:
            if unit.status != JobStatus.RUNNABLE or unit.runnable_since is None:
                continue
            reason = time_limit_cancellation(actions_of(unit.job.spec.queue), unit.reason,
                                       now - unit.runnable_since)
            if reason is None:
                still.append(unit)
            else:
                due.append((unit, reason))
        self._held = still
        return due
