"""How the emulator stops units: CancelJob, TerminateJob, a main node's end, its own close.

    stop(job, unit, reason, terminate=, finalize=)  CancelJob fails what has not started (through
                                                    `finalize`), what has started goes on;
                                                    TerminateJob also kills what runs
    stop_attempt(unit, why)                         kill a unit's process, or mark it to be
                                                    killed as soon as it exists
    kill_for_shutdown(active, jobs, reason)         the emulator closes: every attempt killed,
                                                    the handles to wait for returned
    wait_for_exits(handles, seconds)                until none runs, or the time is up
    abandon_attempt(unit, reason, now)              record the attempt of a unit that never got
                                                    a process

The caller holds the emulator's lock (wait_for_exits excepted: it must not).
"""

from __future__ import annotations

import time
from typing import Callable, List, Optional

from ...statuses import ACTIVE, FINISHED, QUEUED, JobStatus
from ..jobstate import Job, Unit
from .attempts import AttemptHandle, KillReason


def stop_attempt(unit: Unit, why: KillReason) -> None:
    if unit.handle is not None:
        unit.handle.kill(why)
    else:  # being launched right now: killed as soon as it exists
        unit.kill_pending = why


def stop(job: Job, unit: Optional[Unit], reason: str, *, terminate: bool,
         finalize: Callable[[Unit, JobStatus, Optional[str]], None]) -> None:
    """CancelJob or TerminateJob of a whole job (`unit` None) or of one child or node."""
    flag = "terminated" if terminate else "cancelled"
    if unit is None and job.has_children and job.status not in FINISHED:
        setattr(job, flag, True)
        job.stop_reason = reason
        job.touch()
    for target in ([unit] if unit is not None else job.units):
        if target.status in QUEUED:
            setattr(target, flag, True)
            finalize(target, JobStatus.FAILED, reason)
        elif terminate and target.status in ACTIVE:
            target.terminated, target.stop_reason = True, reason
            job.touch(target)
            stop_attempt(target, KillReason.TERMINATE)


def kill_for_shutdown(active: List[Unit], jobs: List[Job], reason: str) -> List[AttemptHandle]:
    """Kill the attempts of `active` (running or just launched) with `reason`; those of `jobs`
    being launched right now are killed when they exist."""
    handles = []
    for unit in active:
        unit.stop_reason = reason
        if unit.handle is not None:
            unit.handle.kill(KillReason.SHUTDOWN)
            handles.append(unit.handle)
    for job in jobs:
        for unit in job.units:
            if unit.status == JobStatus.STARTING and unit.handle is None:
                unit.stop_reason, unit.kill_pending = reason, KillReason.SHUTDOWN
    return handles


def wait_for_exits(handles: List[AttemptHandle], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(h.running for h in handles) and time.monotonic() < deadline:
        time.sleep(0.01)  # (only `running` is part of the handle interface)


def abandon_attempt(unit: Unit, reason: str, now: int) -> None:
    """The attempt under way of a unit that never got a process ends with `reason`."""
    if unit.current is not None:
        attempt, unit.current = unit.current, None
        attempt.update(stoppedAt=now, statusReason=reason)
        unit.attempts.append(attempt)
