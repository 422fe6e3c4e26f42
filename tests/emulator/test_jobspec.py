"""JobSpec: a slotted dataclass whose fields are the record's (issue 21: typed seams)."""

from __future__ import annotations

import dataclasses

import pytest

from batchfutures.emulator import schema
from batchfutures.emulator.jobstate import NODE_FIELDS, SPEC_FIELDS, Job, JobSpec
from batchfutures.statuses import JobStatus


def spec(**fields):
    return JobSpec(**{"job_id": "00000000-0000-0000-0000-000000000000", "name": "j", "queue": "q",
                      "created": 1, **fields})


def test_fields_are_visible_and_slotted():
    assert tuple(f.name for f in dataclasses.fields(JobSpec)) == SPEC_FIELDS
    assert set(SPEC_FIELDS) == set(schema.SPEC.fields)  # one field per record field
    assert set(NODE_FIELDS) <= set(SPEC_FIELDS)
    made = spec(vcpus=2.0)
    assert not hasattr(made, "__dict__")
    with pytest.raises(AttributeError):
        made.not_a_field = 1  # type: ignore[attr-defined]


def test_identity_equality_and_hashable():
    a, b = spec(), spec()
    assert a != b and a == a
    assert len({a, b}) == 2


def test_missing_fields_are_none_and_not_recorded():
    made = spec(array_size=3, seq=7)
    assert made.definition_arn is None and made.tags is None
    record = made.to_record()
    assert list(record) == ["job_id", "name", "queue", "array_size", "created", "seq"]
    again = JobSpec.from_record({**record, "unknown": 1})  # a newer record's extra field is skipped
    assert again.to_record() == record


def test_statuses_are_the_enum():
    job = Job(spec(array_size=2))
    job.move(job.units[0], JobStatus.RUNNING, 5)
    assert job.units[0].status is JobStatus.RUNNING
    assert job.counts[JobStatus.RUNNING] == 1 and job.by_status[JobStatus.RUNNING] == {0}
    assert job.started == 5
