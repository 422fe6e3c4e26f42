"""Batch's job statuses: one definition for the client (jobs.py, reconcile.py) and the emulator.

    SUBMITTED -> PENDING -> RUNNABLE -> STARTING -> RUNNING -> SUCCEEDED | FAILED

Equal to, and shown as, the strings Batch sends (botocore's `JobStatus`), so they key dicts
read from DescribeJobs and print as Batch does.
"""

from __future__ import annotations

import enum
from typing import Any, Optional

__all__ = ["JobStatus", "QUEUED", "ACTIVE", "FINISHED", "STATUS_ORDER"]


class JobStatus(str, enum.Enum):
    """A Batch job status, in lifecycle order."""

    SUBMITTED = "SUBMITTED"
    PENDING = "PENDING"
    RUNNABLE = "RUNNABLE"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    def __str__(self) -> str:  # "RUNNING", as Batch prints it (not "JobStatus.RUNNING")
        return self.value

    def __format__(self, format_spec: str) -> str:
        return format(self.value, format_spec)

    @classmethod
    def of(cls, value: Any) -> "Optional[JobStatus]":
        """The status Batch gave, or None for a missing or unknown one (a newer API's)."""
        try:
            return cls(value)
        except ValueError:
            return None

    @property
    def active(self) -> bool:
        return self in ACTIVE

    @property
    def finished(self) -> bool:
        return self in FINISHED


# The groups, as members (equal to Batch's strings, so `"FAILED" in FINISHED` holds too).
QUEUED = (JobStatus.SUBMITTED, JobStatus.PENDING, JobStatus.RUNNABLE)  # not started yet
ACTIVE = (JobStatus.STARTING, JobStatus.RUNNING)  # holds a container
FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED)  # ended: Batch never changes it again
# Batch's names in lifecycle order, as plain strings: for what prints or keys dicts by them
STATUS_ORDER = tuple(status.value for status in JobStatus)
