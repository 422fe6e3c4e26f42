"""What an emulator record on disk may hold, checked before anything reads it (pure, no I/O).

Records are written by this package, but the folder they sit in may have been written by
anyone who could (an older version, a crashed writer, another user of a shared workdir). A
record read back is therefore checked against a small declarative schema: each field's type,
its bounds (array size 2..10,000, attempts <= 10, string and list lengths) and the shape of
what it nests. `job_problem` and `chunk_problem` return the first field that is wrong (its
path, e.g. ``spec.retry_strategy.attempts``, and why) or None; a caller skips such a record
with one warning (table.py), so one bad file never fails DescribeJobs or ListJobs for the
queue, and nothing is allocated in proportion to a number a record claims.

Log stream names are only bounded here: where a name becomes a path (table.log_files,
logs.stream_path) it must also stay under the logs folder, checked there.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, FrozenSet, Mapping, Optional, Pattern, Sequence, Tuple, Union

from ..batchlimits import MAX_ARRAY_SIZE, MIN_ARRAY_SIZE  # Batch's, as SubmitJob enforces them
from ..statuses import JobStatus
from .jobstate import CHUNK

MAX_RECORD_BYTES = 64 * 1024 * 1024  # a chunk of 500 children of 10 attempts is far below this
MAX_ATTEMPTS = 10
MAX_NODES = 1_000
MAX_DEPENDENCIES = 20
MAX_TEXT = 256 * 1024  # one string (a command argument, an environment value, a reason)
MAX_NAME = 1_024  # names, ARNs, log streams
MAX_ITEMS = 10_000  # a list or mapping without a tighter limit of its own
MAX_MS = 2 ** 53  # epoch milliseconds, exact as a float too
MAX_INT = 2 ** 63
JOB_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
PLAIN_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")  # one file name, never . or ..
QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class RecordProblem(ValueError):
    """A field of a record is not what the schema allows; `where` is its path."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where or 'the record'}: {message}")
        self.where = where


# -- the rules ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Str:
    max_len: int = MAX_TEXT
    pattern: Optional[Pattern[str]] = None
    choices: Optional[FrozenSet[str]] = None


@dataclass(frozen=True)
class Int:
    lo: int = -MAX_INT
    hi: int = MAX_INT


@dataclass(frozen=True)
class Num:
    lo: float = -float(MAX_INT)
    hi: float = float(MAX_INT)


@dataclass(frozen=True)
class Bool:
    pass


@dataclass(frozen=True)
class Const:
    value: Union[int, str]


@dataclass(frozen=True)
class Nullable:
    rule: "Rule"


@dataclass(frozen=True)
class ListOf:
    item: "Rule"
    max_len: int = MAX_ITEMS
    min_len: int = 0


@dataclass(frozen=True)
class MapOf:
    """A mapping of string keys (at most `key_len` characters) to values of one rule."""

    value: "Rule"
    max_len: int = MAX_ITEMS
    key_len: int = MAX_NAME


@dataclass(frozen=True)
class Positional:
    """A list whose items have rules by position (the first `required` of them present)."""

    items: Tuple["Rule", ...]
    required: int = 0


@dataclass(frozen=True)
class Fields:
    """A mapping with named fields; unknown keys are checked against `extra` (None: ignored,
    as the readers ignore them)."""

    fields: Mapping[str, "Rule"]
    required: FrozenSet[str] = frozenset()
    extra: Optional["Rule"] = None


@dataclass(frozen=True)
class Scalar:
    """A string (bounded), number, boolean or null: what an unknown field may hold."""

    max_len: int = MAX_TEXT


@dataclass(frozen=True)
class Json:
    """Any JSON value, copied as it is (never interpreted), its nesting and size bounded."""

    max_depth: int = 16
    max_items: int = MAX_ITEMS


Rule = Union[Str, Int, Num, Bool, Const, Nullable, ListOf, MapOf, Positional, Fields, Scalar, Json]


def _kind(value: Any) -> str:
    return type(value).__name__ if value is not None else "null"


def check(rule: Rule, value: Any, where: str = "") -> None:
    """Raise `RecordProblem` naming the first field of `value` that `rule` does not allow."""
    if isinstance(rule, Nullable):
        if value is not None:
            check(rule.rule, value, where)
    elif isinstance(rule, Str):
        if not isinstance(value, str):
            raise RecordProblem(where, f"a string was expected, not {_kind(value)}")
        if len(value) > rule.max_len:
            raise RecordProblem(where, f"{len(value)} characters, more than {rule.max_len}")
        if "\x00" in value:
            raise RecordProblem(where, "holds a NUL character")
        if rule.pattern is not None and not rule.pattern.fullmatch(value):
            raise RecordProblem(where, f"{value[:80]!r} is not of the form {rule.pattern.pattern}")
        if rule.choices is not None and value not in rule.choices:
            raise RecordProblem(where, f"{value[:80]!r} is not one of {sorted(rule.choices)}")
    elif isinstance(rule, Int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordProblem(where, f"an integer was expected, not {_kind(value)}")
        if not rule.lo <= value <= rule.hi:
            raise RecordProblem(where, f"{value} is outside {rule.lo}..{rule.hi}")
    elif isinstance(rule, Num):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecordProblem(where, f"a number was expected, not {_kind(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise RecordProblem(where, f"{value} is not a finite number")
        if not rule.lo <= value <= rule.hi:
            raise RecordProblem(where, f"{value} is outside {rule.lo:g}..{rule.hi:g}")
    elif isinstance(rule, Bool):
        if not isinstance(value, bool):
            raise RecordProblem(where, f"true or false was expected, not {_kind(value)}")
    elif isinstance(rule, Const):
        if type(value) is not type(rule.value) or value != rule.value:
            raise RecordProblem(where, f"{rule.value!r} was expected")
    elif isinstance(rule, ListOf):
        _check_list(value, where, rule.min_len, rule.max_len)
        for index, item in enumerate(value):
            check(rule.item, item, f"{where}[{index}]")
    elif isinstance(rule, Positional):
        _check_list(value, where, rule.required, len(rule.items))
        for index, item in enumerate(value):
            check(rule.items[index], item, f"{where}[{index}]")
    elif isinstance(rule, MapOf):
        _check_map(value, where, rule.max_len)
        for key, item in value.items():
            if len(key) > rule.key_len:
                raise RecordProblem(where, f"a key of {len(key)} characters, more than {rule.key_len}")
            check(rule.value, item, _join(where, key))
    elif isinstance(rule, Fields):
        _check_map(value, where, MAX_ITEMS)
        missing = sorted(rule.required - value.keys())
        if missing:
            raise RecordProblem(_join(where, missing[0]), "is missing")
        for key, item in value.items():
            inner = rule.fields.get(key, rule.extra)
            if inner is not None:
                check(inner, item, _join(where, key))
    elif isinstance(rule, Scalar):
        if isinstance(value, (dict, list)):
            raise RecordProblem(where, f"a plain value was expected, not {_kind(value)}")
        check(Nullable(Str(rule.max_len)) if isinstance(value, str) or value is None
              else Bool() if isinstance(value, bool) else Num(), value, where)
    elif isinstance(rule, Json):
        _check_json(rule, value, where, 0)
    else:  # pragma: no cover - a rule type added without its check
        raise TypeError(f"unknown rule {rule!r}")


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _check_list(value: Any, where: str, min_len: int, max_len: int) -> None:
    if not isinstance(value, list):
        raise RecordProblem(where, f"a list was expected, not {_kind(value)}")
    if not min_len <= len(value) <= max_len:
        raise RecordProblem(where, f"{len(value)} items, not {min_len}..{max_len}")


def _check_map(value: Any, where: str, max_len: int) -> None:
    if not isinstance(value, dict):
        raise RecordProblem(where, f"an object was expected, not {_kind(value)}")
    if len(value) > max_len:
        raise RecordProblem(where, f"{len(value)} keys, more than {max_len}")


def _check_json(rule: Json, value: Any, where: str, depth: int) -> None:
    if depth > rule.max_depth:
        raise RecordProblem(where, f"nested deeper than {rule.max_depth}")
    if isinstance(value, dict):
        _check_map(value, where, rule.max_items)
        for key, item in value.items():
            _check_json(rule, item, _join(where, key), depth + 1)
    elif isinstance(value, list):
        _check_list(value, where, 0, rule.max_items)
        for index, item in enumerate(value):
            _check_json(rule, item, f"{where}[{index}]", depth + 1)
    else:
        check(Scalar(), value, where)


# -- the records -------------------------------------------------------------------------------
NAME = Str(MAX_NAME)
TEXT = Str(MAX_TEXT)
MILLIS = Nullable(Int(0, MAX_MS))
STRINGS = MapOf(TEXT)
STATUS = Str(choices=frozenset(status.value for status in JobStatus))

CONTAINER = Fields({
    "logStreamName": NAME,  # a path only through logs.stream_path, which keeps it in its folder
    "taskArn": NAME,
    "exitCode": Nullable(Int(-MAX_INT, MAX_INT)),
    "reason": Nullable(TEXT),
}, extra=Scalar())
ATTEMPT = Fields({
    "container": Nullable(CONTAINER),
    "startedAt": MILLIS,
    "stoppedAt": MILLIS,
    "statusReason": Nullable(TEXT),
}, extra=Scalar())
UNIT = Fields({
    "status": STATUS,
    "statusReason": Nullable(TEXT),
    "createdAt": MILLIS,
    "startedAt": MILLIS,
    "stoppedAt": MILLIS,
    "current": Nullable(ATTEMPT),
    "attempts": Nullable(ListOf(ATTEMPT, MAX_ATTEMPTS)),
    "isCancelled": Nullable(Bool()),
    "isTerminated": Nullable(Bool()),
})
PARENT = Fields({
    "status": STATUS,
    "statusReason": Nullable(TEXT),
    "startedAt": MILLIS,
    "stoppedAt": MILLIS,
    "statusSummaryLastUpdatedAt": MILLIS,
    "isCancelled": Nullable(Bool()),
    "isTerminated": Nullable(Bool()),
    "childless": Nullable(Bool()),
})
NAME_VALUE = Fields({"name": NAME, "value": TEXT}, required=frozenset({"name"}))
REQUIREMENT = Fields({"type": NAME, "value": NAME}, required=frozenset({"type", "value"}))
LOG_CONFIGURATION = Fields({
    "logDriver": NAME,
    "options": Nullable(STRINGS),
    "secretOptions": Nullable(ListOf(Fields({"name": NAME, "valueFrom": TEXT}), 100)),
})
CONTAINER_SETTINGS = {  # of the job, or of one node of a multi-node job
    "image": Nullable(TEXT),
    "command": Nullable(ListOf(TEXT)),
    "environment": Nullable(ListOf(NAME_VALUE, 1_000)),
    "resource_requirements": Nullable(ListOf(REQUIREMENT, 16)),
    "vcpus": Nullable(Num(0, 1e6)),
    "memory": Nullable(Int(0, MAX_INT)),
    "gpus": Nullable(Int(0, 1_024)),
    "log_configuration": Nullable(LOG_CONFIGURATION),
}
SPEC = Fields({
    **CONTAINER_SETTINGS,
    "job_id": Str(pattern=JOB_ID),
    "name": NAME,
    "queue": Str(pattern=QUEUE_NAME),
    "definition_arn": Nullable(NAME),
    "definition_name": Nullable(NAME),
    "retry_strategy": Nullable(Fields({
        "attempts": Nullable(Int(1, MAX_ATTEMPTS)),
        "evaluateOnExit": Nullable(ListOf(Fields({
            "onStatusReason": Nullable(Str(512)), "onReason": Nullable(Str(512)),
            "onExitCode": Nullable(Str(512)), "action": Str(16),
        }), 5)),
    })),
    "timeout": Nullable(Num(0, 1e12)),
    "tags": Nullable(MapOf(TEXT)),
    "propagate_tags": Nullable(Bool()),
    "share_identifier": Nullable(NAME),
    "scheduling_priority": Nullable(Int(-MAX_INT, MAX_INT)),
    "parameters": Nullable(STRINGS),
    "depends_on": Nullable(ListOf(Fields({"jobId": NAME, "type": Nullable(Str(32))}),
                                  MAX_DEPENDENCIES)),
    "array_size": Nullable(Int(MIN_ARRAY_SIZE, MAX_ARRAY_SIZE)),
    "created": Int(0, MAX_MS),
    "seq": Nullable(Int(0, MAX_INT)),
    "platform_capabilities": Nullable(ListOf(Str(16), 4)),
    "tag_total": Nullable(Int(0, MAX_INT)),
    "num_nodes": Nullable(Int(1, MAX_NODES)),
    "main_node": Nullable(Int(0, MAX_NODES - 1)),
    "nodes": Nullable(ListOf(Fields(CONTAINER_SETTINGS), MAX_NODES)),
    "node_ranges": Nullable(ListOf(Json(), MAX_NODES)),
    "consumables": Nullable(ListOf(Positional((Str(128, pattern=QUEUE_NAME), Int(0, MAX_INT)), 2),
                                   MAX_ITEMS)),
}, required=frozenset({"job_id", "name", "queue", "created"}))
OWNER = Positional((Int(1, 2 ** 31), Nullable(Str(32)), Nullable(Str(128, pattern=PLAIN_NAME))))
JOB_RECORD = Fields({
    "format": Const(2),
    "owner": Nullable(OWNER),
    "spec": SPEC,
    "chunks": Int(0, (max(MAX_ARRAY_SIZE, MAX_NODES) + CHUNK - 1) // CHUNK),
    "chunkSize": Const(CHUNK),
    "job": Nullable(PARENT),
    "unit": Nullable(UNIT),
}, required=frozenset({"format", "spec", "chunks"}))
CHUNK_RECORD = Fields({
    "start": Int(0, MAX_ARRAY_SIZE),
    "units": ListOf(UNIT, CHUNK),
}, required=frozenset({"start", "units"}))
CONTROL_REQUEST = Fields({"jobId": NAME, "action": Str(32), "reason": Nullable(TEXT),
                          "tags": Nullable(MapOf(Str(256), 50))},
                         required=frozenset({"jobId", "action"}))
QUEUE_RECORD = Fields({
    "state": Str(choices=frozenset({"ENABLED", "DISABLED"})),
    "priority": Int(-MAX_INT, MAX_INT),
    "jobStateTimeLimitActions": Nullable(ListOf(Json(), 5)),
    "order": Nullable(Int(0, MAX_INT)),
    "tags": Nullable(MapOf(Str(256), 50)),
    "status": Nullable(Str(choices=frozenset({"CREATING", "UPDATING", "DELETING", "VALID"}))),
    "changedAt": Nullable(Num(0, 1e12)),
    "computeEnvironmentOrder": Nullable(ListOf(Str(128, pattern=QUEUE_NAME), 3)),
}, required=frozenset({"state"}))
DEFINITION_RECORD = Fields({
    "jobDefinitionName": Str(128, pattern=QUEUE_NAME),
    "jobDefinitionArn": NAME,
    "revision": Int(1, MAX_INT),
    "status": Nullable(Str(32)),
    "type": Nullable(Str(32)),
}, required=frozenset({"jobDefinitionName", "jobDefinitionArn", "revision"}), extra=Json())


def children_of(spec: Mapping[str, Any]) -> int:
    """How many children (array) or nodes (multi-node) a checked spec declares; 0 for neither."""
    return int(spec.get("array_size") or spec.get("num_nodes") or 0)


def problem(rule: Rule, value: Any) -> Optional[RecordProblem]:
    try:
        check(rule, value)
    except RecordProblem as error:
        return error
    except RecursionError:  # json never builds deeper values than it could parse; belt and braces
        return RecordProblem("", "nested too deeply")
    return None


def job_problem(record: Any, job_id: str) -> Optional[RecordProblem]:
    """What is wrong with the parent record of `job_id` (the file's own name), or None."""
    found = problem(JOB_RECORD, record)
    if found is not None:
        return found
    spec = record["spec"]
    if spec["job_id"] != job_id:
        return RecordProblem("spec.job_id", f"{spec['job_id']!r} is not the file's job id {job_id!r}")
    if spec.get("array_size") is not None and spec.get("num_nodes") is not None:
        return RecordProblem("spec.num_nodes", "an array job cannot have nodes")
    if spec.get("num_nodes") is not None:
        main, nodes = spec.get("main_node"), spec.get("nodes")
        if main is None or main >= spec["num_nodes"]:
            return RecordProblem("spec.main_node", f"{main!r} is not a node below {spec['num_nodes']}")
        if nodes is not None and len(nodes) != spec["num_nodes"]:
            return RecordProblem("spec.nodes", f"{len(nodes)} nodes, not {spec['num_nodes']}")
    children = children_of(spec)
    expected = (children + CHUNK - 1) // CHUNK
    if record["chunks"] != expected:
        return RecordProblem("chunks", f"{record['chunks']}, not {expected} for {children} children")
    if children and record.get("unit") is not None:
        return RecordProblem("unit", "a job with children has no unit of its own")
    if not children and record.get("job") is not None:
        return RecordProblem("job", "a job without children has no parent status")
    return attempts_problem([record["unit"]] if record.get("unit") else [], "unit")


def chunk_problem(chunk: Any, number: int, children: int) -> Optional[RecordProblem]:
    """What is wrong with chunk file `number` of a job with `children` children, or None."""
    found = problem(CHUNK_RECORD, chunk)
    if found is not None:
        return found
    start = number * CHUNK
    if chunk["start"] != start:
        return RecordProblem("start", f"{chunk['start']}, not {start} for chunk {number}")
    if len(chunk["units"]) > children - start:
        return RecordProblem("units", f"{len(chunk['units'])} children past the job's {children}")
    return attempts_problem(chunk["units"], "units")


def attempts_problem(units: Sequence[Mapping[str, Any]], where: str) -> Optional[RecordProblem]:
    """A unit whose finished and current attempts together exceed Batch's 10."""
    for index, unit in enumerate(units):
        count = len(unit.get("attempts") or []) + (1 if unit.get("current") is not None else 0)
        if count > MAX_ATTEMPTS:
            path = f"{where}.attempts" if where == "unit" else f"{where}[{index}].attempts"
            return RecordProblem(path, f"{count} attempts, more than {MAX_ATTEMPTS}")
    return None
