"""future.attempts: DescribeJobs' attempts as records (pure)."""

import pytest

from batchfutures.callattempts import Attempt, attempts_from, reclaims_in


@pytest.mark.parametrize("description, expected", [
    ({"jobId": "a:1", "attempts": [
        {"startedAt": 1000, "stoppedAt": 3500, "statusReason": "Your Spot Task was interrupted.",
         "container": {"exitCode": 143}},
        {"startedAt": 4000, "stoppedAt": 5000, "statusReason": "Essential container in task exited",
         "container": {"exitCode": 75}},
        {"statusReason": "CannotPullContainerError: context canceled", "container": {}},
        {"startedAt": 6000, "container": {"reason": "OutOfMemoryError: Container killed"}},
    ]}, [Attempt(1.0, 3.5, 143, "Your Spot Task was interrupted.", "a:1"),
         Attempt(4.0, 5.0, 75, "Essential container in task exited", "a:1"),
         Attempt(None, None, None, "CannotPullContainerError: context canceled", "a:1"),
         Attempt(6.0, None, None, "OutOfMemoryError: Container killed", "a:1")]),
    ({"jobId": "b", "status": "RUNNING"}, []),  # the running attempt is not listed
])
def test_attempts_from_describe_jobs(description, expected):
    assert attempts_from(description) == expected


def test_reclaims_count_the_hosts_taken_back():
    attempts = [Attempt(1, 2, None, "Host EC2 (instance i-1) terminated."),
                Attempt(3, 4, 75, "Essential container in task exited"),
                Attempt(5, 6, 143, "Your Spot Task was interrupted.")]
    assert [a.reclaimed for a in attempts] == [True, False, True] and reclaims_in(attempts) == 2
