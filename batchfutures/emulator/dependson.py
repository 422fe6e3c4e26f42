"""Batch's dependsOn as counters: who waits for whom, and what an ending tells them.

    wire(job, units)        at admission: count each unit's unmet dependencies; returns the
                            units that wait for nothing (ready to become RUNNABLE)
    ended(node, ok)         a unit or an array parent reached a final status
    drain()                 tell its dependents, in cascade (iteratively: chains can be long)
    poll_foreign(lock)      dependencies on other processes' jobs, read from their records

A dependent is a Unit (a plain job or a child) or a whole array (its gate: each child holds one
count while the array's whole-job dependencies are unmet). Kinds: WHOLE (the dependency's job or
child), N_TO_N (child i waits for child i of the other array), SEQUENTIAL (child i waits for
child i-1). A dependency that failed, or is unknown, fails its dependents with `Dependent Job
failed` (through `fail`); the caller holds the emulator's lock throughout.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Callable, ContextManager, Deque, List, Optional, Tuple, Union

from ..statuses import FINISHED, JobStatus
from .jobstate import DependencyKind, Dependent, Job, Unit


class Outcome(enum.Enum):
    """What a dependency says about its dependent, looked at now."""

    OK = "ok"            # it succeeded
    FAILED = "failed"    # it failed (or is unknown): the dependent fails
    WAITING = "waiting"  # not yet ended: the dependent hears when it does


class Dependencies:
    def __init__(self, *, foreign_status: Callable[[str], Optional[JobStatus]],
                 ready: Callable[[Unit], None], fail: Callable[[Unit], None]) -> None:
        self._foreign_status = foreign_status
        self._ready = ready
        self._fail = fail
        self._foreign: List[Tuple[Dependent, str]] = []
        self._events: Deque[Tuple[Dependent, bool]] = deque()

    # -- admission ---------------------------------------------------------------------------
    def wire(self, job: Job, live: List[Unit]) -> List[Unit]:
        """Count the dependencies of `live` (the job's units entering PENDING); the free ones."""
        whole = [target for kind, target in job.targets
                 if kind is DependencyKind.WHOLE and target is not None]
        if job.is_array:
            outcomes = [self._watch(target, job) for target in whole]
            if Outcome.FAILED in outcomes:
                job.gate_failed = True
                for unit in live:
                    self._fail(unit)
                return []
            job.unmet = outcomes.count(Outcome.WAITING)
            for unit in live:
                unit.unmet = 1 if job.unmet else 0
            for kind, target in job.targets:
                if kind is not DependencyKind.N_TO_N:
                    continue
                assert isinstance(target, (Job, str))  # another array, own or foreign
                for unit in live:
                    index = unit.index
                    assert index is not None  # an array's units are its children
                    member: Union[Unit, Job, str]
                    if isinstance(target, str):
                        member = f"{target}:{index}"
                    elif index < len(target.units):
                        member = target.units[index]
                    else:  # an array that failed before spawning children
                        member = target
                    self._count(unit, self._watch(member, unit))
            if any(kind is DependencyKind.SEQUENTIAL for kind, _ in job.targets):
                for unit in live:
                    index = unit.index
                    assert index is not None
                    if index > 0:
                        self._count(unit, self._watch(job.units[index - 1], unit))
        else:
            for unit in live:
                for target in whole:
                    self._count(unit, self._watch(target, unit))
        return [u for u in live if u.status == JobStatus.PENDING and u.unmet == 0]

    def _count(self, unit: Unit, outcome: Outcome) -> None:
        if unit.status != JobStatus.PENDING:
            return
        if outcome is Outcome.WAITING:
            unit.unmet += 1
        elif outcome is Outcome.FAILED:
            self._fail(unit)

    def _watch(self, target: Union[Unit, Job, str], dependent: Dependent) -> Outcome:
        """How `target` stands now (WAITING: `dependent` hears when it ends)."""
        if isinstance(target, str):  # a job of another process: polled from its record
            status = self._foreign_status(target)
            if status in FINISHED or status is None:
                return Outcome.OK if status == JobStatus.SUCCEEDED else Outcome.FAILED
            self._foreign.append((dependent, target))
            return Outcome.WAITING
        if target.status in FINISHED:
            return Outcome.OK if target.status == JobStatus.SUCCEEDED else Outcome.FAILED
        target.dependents.append(dependent)
        return Outcome.WAITING

    # -- endings -----------------------------------------------------------------------------
    def ended(self, node: Dependent, succeeded: bool) -> None:
        self._events.append((node, succeeded))

    def drain(self) -> None:
        while self._events:
            node, succeeded = self._events.popleft()
            dependents, node.dependents = node.dependents, []
            for dependent in dependents:
                self._resolve(dependent, succeeded)

    def _resolve(self, dependent: Dependent, succeeded: bool) -> None:
        if isinstance(dependent, Unit):
            if dependent.status != JobStatus.PENDING:
                return
            if not succeeded:
                self._fail(dependent)
                return
            dependent.unmet -= 1
            if dependent.unmet <= 0:
                self._ready(dependent)
            return
        job: Job = dependent  # an array waiting as a whole (its children hold one count each)
        if job.status in FINISHED or job.gate_failed:
            return
        if not succeeded:
            job.gate_failed = True
            for unit in job.units:
                if unit.status == JobStatus.PENDING:
                    self._fail(unit)
            return
        job.unmet -= 1
        if job.unmet == 0:
            for unit in job.units:
                if unit.status == JobStatus.PENDING:
                    unit.unmet -= 1
                    if unit.unmet <= 0:
                        self._ready(unit)

    def poll_foreign(self, lock: ContextManager[object]) -> None:
        """Resolve waits on other processes' jobs (their records are read outside the lock)."""
        with lock:
            waits = list(self._foreign)
        if not waits:
            return
        statuses = {target: self._foreign_status(target) for _, target in waits}
        with lock:
            still = []
            for dependent, target in self._foreign:
                status = statuses.get(target, JobStatus.PENDING)
                if status in FINISHED or status is None:
                    self._resolve(dependent, status == JobStatus.SUCCEEDED)
                else:
                    still.append((dependent, target))
            self._foreign = still
            self.drain()
