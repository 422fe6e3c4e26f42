"""When time runs out: pure decisions the scheduler applies, table-tested.

    attempt_deadlines(timeout, host_loss_in, now)
        when a RUNNING attempt is killed: its attemptDurationSeconds, a fault's lost host
    kill_due(deadline, host_loss_at, now)
        which of the two is due now (the timeout first)
    time_limit_cancellation(actions, reason, held_for)
        a queue's jobStateTimeLimitActions: the statusReason to cancel a job held RUNNABLE with
    sleep_for(step_due, deadlines, now)
        how long the scheduler's thread may sleep

Every time here is time.monotonic() seconds; the records' epoch milliseconds are not.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple

from ...statuses import JobStatus
from ..jobstate import TIME_LIMIT_CANCELLED
from .attempts import KillReason

TICK = 0.002  # while a step is due: each status lasts at least one tick, listeners see it
IDLE = 0.25   # otherwise, at most (housekeeping runs on this thread)


def attempt_deadlines(timeout: Optional[float], host_loss_in: Optional[float],
                      now: float) -> Tuple[Optional[float], Optional[float]]:
    """(deadline, host_loss_at) of an attempt that starts RUNNING at `now`; None: never."""
    return (now + timeout if timeout else None,
            now + host_loss_in if host_loss_in is not None else None)


def kill_due(deadline: Optional[float], host_loss_at: Optional[float],
             now: float) -> Optional[KillReason]:
    """Why a RUNNING attempt is to be killed now, if it is: the timeout wins a tie."""
    if deadline is not None and now >= deadline:
        return KillReason.TIMEOUT
    if host_loss_at is not None and now >= host_loss_at:
        return KillReason.HOST_LOST
    return None


def time_limit_cancellation(actions: Sequence[Mapping[str, Any]], reason: Optional[str],
                      held_for: float) -> Optional[str]:
    """The statusReason to cancel a job held RUNNABLE for `reason` since `held_for` seconds
    with, per its queue's first CANCEL action for RUNNABLE whose reason starts `reason`; None:
    none applies, or not yet."""
    action = next((a for a in actions
                   if a.get("state") == JobStatus.RUNNABLE and a.get("action") == "CANCEL"
                   and (reason or "").startswith(str(a.get("reason") or ""))), None)
    if action is not None and held_for >= action["maxTimeSeconds"]:
        return TIME_LIMIT_CANCELLED.format(reason=action["reason"])
    return None


def sleep_for(step_due: bool, deadlines: Iterable[float], now: float) -> float:
    """TICK while a step is due, else until the nearest deadline, at most IDLE."""
    if step_due:
        return TICK
    nearest = min(deadlines, default=None)
    if nearest is None:
        return IDLE
    return min(IDLE, max(0.0, nearest - now))
