"""When time runs out (emulator/runtime/deadlines.py): pure decisions, one table each."""

import pytest

from batchfutures.emulator.runtime.attempts import KillReason
from batchfutures.emulator.runtime.deadlines import (
    IDLE,
    TICK,
    attempt_deadlines,
    kill_due,
    sleep_for,
    time_limit_cancellation,
)

NOW = 1000.0


@pytest.mark.parametrize("timeout, host_loss_in, expected", [
    (None, None, (None, None)),
    (0, None, (None, None)),              # attemptDurationSeconds 0: no timeout
    (60, None, (NOW + 60, None)),
    (None, 2.5, (None, NOW + 2.5)),       # a fault: the host goes 2.5 s after RUNNING
    (None, 0.0, (None, NOW)),             # at once (0 is a delay, not "none")
    (60, 2.5, (NOW + 60, NOW + 2.5)),
])
def test_attempt_deadlines(timeout, host_loss_in, expected):
    assert attempt_deadlines(timeout, host_loss_in, NOW) == expected


@pytest.mark.parametrize("deadline, host_loss_at, killed", [
    (None, None, None),
    (NOW + 1, None, None),                   # not yet
    (NOW, None, KillReason.TIMEOUT),         # exactly due
    (NOW - 1, None, KillReason.TIMEOUT),
    (None, NOW, KillReason.HOST_LOST),
    (None, NOW + 1, None),
    (NOW, NOW, KillReason.TIMEOUT),          # both due: the timeout wins
    (NOW + 1, NOW - 1, KillReason.HOST_LOST),
])
def test_kill_due(deadline, host_loss_at, killed):
    assert kill_due(deadline, host_loss_at, NOW) is killed


MISCONFIGURED = "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - too big"
CANCEL = {"state": "RUNNABLE", "action": "CANCEL", "reason": "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT",
          "maxTimeSeconds": 600}
WORDING = ("Canceled by JobStateTimeLimit action due to reason: "
           "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT")


@pytest.mark.parametrize("actions, reason, held_for, expected", [
    ([], MISCONFIGURED, 10**6, None),                            # no action: held for ever
    ([CANCEL], MISCONFIGURED, 599.9, None),                      # not yet
    ([CANCEL], MISCONFIGURED, 600, WORDING),                     # AWS's wording
    ([CANCEL], "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY", 10**6, None),  # another reason
    ([CANCEL], None, 10**6, None),
    ([dict(CANCEL, state="STARTING")], MISCONFIGURED, 10**6, None),
    ([dict(CANCEL, action="TERMINATE")], MISCONFIGURED, 10**6, None),
    ([dict(CANCEL, reason="MISCONFIGURATION:")], MISCONFIGURED, 600,  # a prefix matches
     "Canceled by JobStateTimeLimit action due to reason: MISCONFIGURATION:"),
    ([dict(CANCEL, maxTimeSeconds=10**6), dict(CANCEL, maxTimeSeconds=1)], MISCONFIGURED, 10,
     None),                                                      # the first matching action rules
])
def test_time_limit_cancellation(actions, reason, held_for, expected):
    assert time_limit_cancellation(actions, reason, held_for) == expected


@pytest.mark.parametrize("step_due, deadlines, expected", [
    (True, [NOW + 10], TICK),         # a step is due: next tick
    (True, [], TICK),
    (False, [], IDLE),                # nothing to wait for: housekeeping's pace
    (False, [NOW + 10], IDLE),        # far: at most IDLE
    (False, [NOW + 0.1, NOW + 0.05], pytest.approx(0.05)),  # the nearest deadline
    (False, [NOW - 1], 0.0),          # overdue: no sleep at all
])
def test_sleep_for(step_due, deadlines, expected):
    assert sleep_for(step_due, iter(deadlines), NOW) == expected
