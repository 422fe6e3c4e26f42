"""The scheduler's RUNNABLE queue: who starts next, who is held, the vCPUs in use.

    add(unit) -> bool           queued in submission order (placement.queue_key); False: held,
                                as Batch holds a job that never fits RUNNABLE with a reason
    head_fits()                 whether the head could start now (strict FIFO: only the head can)
    take(tick)                  the head, its vCPUs reserved, when it fits and was not queued
                                in this very tick
    release(unit)               its vCPUs back (its attempt ended)
    front(queue, limit)         GetJobQueueSnapshot's order: held units keep their place
    past_time_limit(...)        held units their queue's jobStateTimeLimitActions cancel now

Placement itself (what fits, the order) is pure, in placement.py; a unit cancelled while
queued stays in the heap until it reaches the head, where it is dropped (no search).
The caller holds the emulator's lock.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable, Dict, List, Optional, Tuple

from ...statuses import JobStatus
from ..jobstate import Unit
from .deadlines import time_limit_cancellation
from .placement import Ask, Host, fits_now, never_fits, queue_key


def ask_of(unit: Unit) -> Ask:
    """What one unit asks of the host (a node's own, in a multi-node job)."""
    spec = unit.job.spec
    node = spec.node(unit.index if unit.job.is_multinode else None)
    vcpus = float(node["vcpus"] or 1) if unit.job.is_multinode else spec.vcpus or 1.0
    return Ask(vcpus=vcpus, total_vcpus=spec.total_vcpus(), memory_mib=node["memory"],
               gpus=node["gpus"] or 0)


class RunQueue:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.used_vcpus = 0.0
        # (seq, place, order, unit): seq is never None for an own job (submission.build_spec)
        self._heap: List[Tuple[Optional[int], int, int, Unit]] = []
        self._order = itertools.count()
        self._held: List[Unit] = []  # RUNNABLE with a reason that keeps them there

    def add(self, unit: Unit, now: float) -> bool:
        """Queue a unit that has just become RUNNABLE; False: it never fits, held since `now`."""
        if never_fits(ask_of(unit), self.host):
            unit.runnable_since = now
            self._held.append(unit)
            return False
        seq, place = queue_key(unit.job.spec.seq, unit.index, unit.is_main_node)
        heapq.heappush(self._heap, (seq, place, next(self._order), unit))
        return True

    def _head(self) -> Optional[Unit]:
        while self._heap and self._heap[0][3].status != JobStatus.RUNNABLE:
            heapq.heappop(self._heap)  # cancelled while queued
        return self._heap[0][3] if self._heap else None

    def head_fits(self) -> bool:
        unit = self._head()
        return unit is not None and fits_now(ask_of(unit), self.used_vcpus, self.host)

    def take(self, tick: int) -> Optional[Unit]:
        """The head, popped with its vCPUs reserved, if it can start in tick `tick`."""
        unit = self._head()
        if unit is None or unit.tick == tick:  # became RUNNABLE in this tick: next tick
            return None
        ask = ask_of(unit)
        if not fits_now(ask, self.used_vcpus, self.host):
            return None
        heapq.heappop(self._heap)
        self.used_vcpus += ask.vcpus
        unit.reserved = ask.vcpus
        return unit

    def release(self, unit: Unit) -> None:
        self.used_vcpus = max(0.0, self.used_vcpus - unit.reserved)
        unit.reserved = 0.0

    def front(self, queue: str, limit: int) -> List[Unit]:
        """The first `limit` RUNNABLE units of `queue`, in the order they would start: submission
        order, a main node first; held units keep their place, as on Batch (where they block the
        queue's head)."""
        units = {id(entry[3]): entry[3] for entry in self._heap}
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
