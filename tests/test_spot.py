"""Spot reclaims: which attempts were, and when a call falls back to on-demand (pure)."""

import pytest

from batchfutures import spot


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
