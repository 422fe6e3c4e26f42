"""Spot reclaims: which attempts were, and when a call falls back to on-demand (pure)."""

import pytest

from batchfutures import spot
from batchfutures.callattempts import Attempt


@pytest.mark.parametrize("reason, reclaimed", [
    ("Your Spot Task was interrupted.", True),
    ("Host EC2 (instance i-0a1b2c3d4e5f) terminated.", True),
    ("host ec2 (instance i-0a1b2c3d4e5f) terminated.", True),
    ("Essential container in task exited", False),
    ("Task stopped during instance draining", False),  # never started: a start failure
    ("OutOfMemoryError: Container killed due to memory usage", False),
    ("", False), (None, False),
])
def test_reclaim_reasons(reason, reclaimed):
    assert spot.is_reclaim(reason) is reclaimed


def test_reclaims_counts_the_attempts_that_were():
    attempts = [{"statusReason": "Your Spot Task was interrupted."},
                {"statusReason": "Essential container in task exited"},
                {"statusReason": "Host EC2 (instance i-1) terminated."}, {}]
    assert spot.reclaims(attempts) == 2 and spot.reclaims([]) == 0


@pytest.mark.parametrize("reclaimed, spot_attempts, queue, fallback, expected", [
    (2, 2, "spot-q", "od-q", "od-q"),
    (3, 2, "spot-q", "od-q", "od-q"),
    (1, 2, "spot-q", "od-q", None),  # Batch retries it on Spot still
    (2, None, "spot-q", "od-q", None),  # no spot_attempts: never moves
    (2, 2, "spot-q", None, None),  # nowhere to go
    (2, 2, "od-q", "od-q", None),  # already there
])
def test_next_queue(reclaimed, spot_attempts, queue, fallback, expected):
    assert spot.next_queue(reclaimed, spot_attempts, queue, fallback) == expected


SPOT = "Your Spot Task was interrupted."
EXITED = "Essential container in task exited"


def _job(attempts_by_child):
    from batchfutures.futures import BatchFuture
    from batchfutures.jobs import TrackedJob

    job = TrackedJob("j", "file:///r/runs/x/jobs/k", [[BatchFuture()] for _ in attempts_by_child],
                     array=True)
    job.attempts_reader = lambda child: [Attempt(1, 2, None, reason) for reason in
                                         attempts_by_child[child]]
    return job


@pytest.mark.parametrize("attempts_by_child, errors, moved", [
    # child 0: reclaimed twice, Batch failed it: on demand next; child 1: once only
    ([[SPOT, SPOT], [EXITED, SPOT]], {0: "host", 1: "host"}, [0]),
    ([[SPOT, SPOT], [SPOT, SPOT]], {0: "host", 1: "host"}, [0, 1]),  # one new job for both
    ([[SPOT, SPOT]], {0: "crash"}, []),  # not a lost host: fails as usual
    ([[SPOT]], {0: "host"}, []),
])
def test_spot_fallback_moves_the_children_reclaimed_k_times(attempts_by_child, errors, moved):
    from batchfutures.errors import HostTerminatedError, JobFailedError

    sent = []
    fallback = spot.SpotFallback(2, "spot-q", "od-q",
                                 lambda job, children, queue, earlier: sent.append(
                                     (children, queue, [len(a) for a in earlier])))
    failures = {i: HostTerminatedError("lost", job_id="j") if kind == "host"
                else JobFailedError("crashed", job_id="j") for i, kind in errors.items()}
    decided = fallback.decide(_job(attempts_by_child), failures)
    assert decided == {i: None for i in moved}  # the others fail as usual
    assert sent == ([(moved, "od-q", [2] * len(moved))] if moved else [])
    assert not fallback.raised and fallback.history == {}


def test_spot_fallback_without_a_fallback_queue_moves_nothing():
    from batchfutures.errors import HostTerminatedError

    fallback = spot.SpotFallback(1, "spot-q", None, lambda *a: pytest.fail("sent"))
    assert fallback.decide(_job([[SPOT]]), {0: HostTerminatedError("lost", job_id="j")}) == {}
