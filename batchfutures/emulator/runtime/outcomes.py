"""What the end of an attempt means, as Batch reports it: a pure function, table-tested.

    attempt_outcome(AttemptEnd) -> AttemptOutcome
        container fields (exitCode, reason), the attempt's statusReason, whether it succeeded
        and whether Batch would consider retrying it (the retry strategy decides the rest)

The order matters: a start failure, then the emulator's own kills (terminate and shutdown keep
the caller's reason, a timeout is never retried, a Spot reclaim says which Spot took it back
(spot_outcome), a lost host has no exit code), then the
kernel's OOM kill (only when the limit was hit: `memory_exceeded`), then the exit status as it
is, a SIGKILL from anyone else included (137 without a reason).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from ...batchlimits import SIGKILL_EXIT_STATUS
from ..jobstate import (
    EXITED,
    HOST_TERMINATED,
    OOM_REASON,
    SPOT_TASK_INTERRUPTED,
    START_FAILED,
    TIMEOUT_REASON,
)
from .attempts import KillReason


@dataclass(frozen=True)
class AttemptEnd:
    """What is known when an attempt's process has ended (or could not start)."""

    exit_code: Optional[int] = None        # Docker's code (128+N for signal N); None: no process
    killed: Optional[KillReason] = None    # why the emulator killed it, if it did
    memory_exceeded: bool = False          # the kernel's (or the fallback's) OOM verdict
    start_error: Optional[str] = None      # why the command could not be started
    stop_reason: Optional[str] = None      # the reason given to TerminateJob / the shutdown
    spot_platform: Optional[str] = None    # SPOT or FARGATE_SPOT: where a Spot reclaim hit it


@dataclass(frozen=True)
class AttemptOutcome:
    container: Dict[str, Any] = field(default_factory=dict)  # exitCode and reason, as shown
    status_reason: str = EXITED
    succeeded: bool = False
    retryable: bool = True  # before the retry strategy and the attempts left are consulted


def attempt_outcome(end: AttemptEnd) -> AttemptOutcome:
    if end.start_error is not None:
        return AttemptOutcome({"reason": f"CannotStartContainerError: {end.start_error}"},
                              START_FAILED)
    if end.killed in (KillReason.TERMINATE, KillReason.SHUTDOWN):
        return AttemptOutcome({"exitCode": end.exit_code}, end.stop_reason or EXITED,
                              retryable=False)
    if end.killed is KillReason.TIMEOUT:  # as Batch: a timed-out attempt is not retried
        return AttemptOutcome({"exitCode": SIGKILL_EXIT_STATUS}, TIMEOUT_REASON, retryable=False)
    if end.killed is KillReason.SPOT_RECLAIM:
        return spot_outcome(end.exit_code, end.spot_platform)
    if end.killed is KillReason.HOST_LOST:  # the instance is gone: no exit code
        return AttemptOutcome({}, HOST_TERMINATED)
    if end.exit_code != 0 and end.memory_exceeded:
        return AttemptOutcome({"exitCode": end.exit_code, "reason": OOM_REASON}, EXITED)
    succeeded = end.killed is None and end.exit_code == 0
    return AttemptOutcome({"exitCode": end.exit_code}, EXITED, succeeded=succeeded)


def spot_outcome(exit_code: Optional[int], platform: Optional[str]) -> AttemptOutcome:
    """A Spot reclaim's end. A container that exits 0 within the notice succeeded (Batch
    records an essential container's exit 0 whatever stopped it). Otherwise Fargate Spot shows
    the container's exit code (137 once killed at the notice's end) with `Your Spot Task was
    interrupted.`; EC2 Spot shows `Host EC2 (instance ...) terminated.` with the exit code of a
    container that ended within the notice and none for one still there when the host went."""
    if exit_code == 0:
        return AttemptOutcome({"exitCode": 0}, EXITED, succeeded=True)
    if platform == "FARGATE_SPOT":
        return AttemptOutcome({"exitCode": exit_code}, SPOT_TASK_INTERRUPTED)
    if exit_code is None or exit_code == SIGKILL_EXIT_STATUS:
        return AttemptOutcome({}, HOST_TERMINATED)
    return AttemptOutcome({"exitCode": exit_code}, HOST_TERMINATED)
