"""Batch's job statuses: one definition for the client (jobs.py, reconcile.py) and the emulator.

    SUBMITTED -> PENDING -> RUNNABLE -> STARTING -> RUNNING -> SUCCEEDED | FAILED

Equal to, and shown as, the strings Batch sends (botocore's `JobStatus`), so they key dicts
read from DescribeJobs and print as Batch does.
"""

from __future__ import annotations

import enum
from typing import Any, Optional

__all__ = ["JobStatus"]


class JobStatus(str, enum.Enum):
    """A Batch job status, in lifecycle order."""

    SUBMITTED = "SUBMITTED"
    PENDING = "PENDING"
    RUNNABLE = "RUNNABLE"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    __str__ = str.__str__
    __format__ = str.__format__

    @classmethod
    def of(cls, value: Any) -> "Optional[JobStatus]":
        """The status Batch gave, or None for a missing or unknown one (a newer API's)."""
        try:
            return cls(value)
        except ValueError:
            return None

    @property
    def active(self) -> bool:
        return self in (JobStatus.STARTING, JobStatus.RUNNING)

    @property
    def finished(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED)
