"""Check the emulator's answers against botocore's service models, as a strict client would.

    check_output("batch", "DescribeJobs", response)   AssertionError listing every problem:
                                                      unknown keys, wrong types, missing
                                                      required members, values outside an enum
    Checked(emulator)                                 the emulator, every answer checked

botocore itself never validates responses (it parses whatever the service sends), so a field the
model does not have would pass unnoticed through boto3; this validator is what notices it.
"""

from __future__ import annotations

import datetime
import functools
import re
from typing import Any, Dict, List

import botocore.session

_LOADED: Dict[str, Any] = {}

# Members the model marks required that the emulator may leave out: none (startedAt is 0 before
# a job starts, where AWS omits it). Anything missing is a problem.
OMITTED_BY_BATCH: set = set()


def service_model(service: str) -> Any:
    if service not in _LOADED:
        _LOADED[service] = botocore.session.get_session().get_service_model(service)
    return _LOADED[service]


def problems(value: Any, shape: Any, path: str = "$") -> List[str]:
    """Every way ``value`` does not fit ``shape`` (a botocore Shape), as readable lines."""
    kind = shape.type_name
    if kind == "structure":
        if not isinstance(value, dict):
            return [f"{path}: expected an object ({shape.name}), got {type(value).__name__}"]
        found = []
        for key in value:
            if key not in shape.members:
                found.append(f"{path}: unknown key {key!r} (not a member of {shape.name})")
        for key in shape.required_members:
            if key not in value and (shape.name, key) not in OMITTED_BY_BATCH:
                found.append(f"{path}: required member {key!r} of {shape.name} is missing")
        for key, item in value.items():
            if key in shape.members:
                found.extend(problems(item, shape.members[key], f"{path}.{key}"))
        return found
    if kind == "list":
        if not isinstance(value, list):
            return [f"{path}: expected a list ({shape.name}), got {type(value).__name__}"]
        found = []
        for index, item in enumerate(value):
            found.extend(problems(item, shape.member, f"{path}[{index}]"))
        return found
    if kind == "map":
        if not isinstance(value, dict):
            return [f"{path}: expected a map ({shape.name}), got {type(value).__name__}"]
        found = []
        for key, item in value.items():
            found.extend(problems(key, shape.key, f"{path}<key {key!r}>"))
            found.extend(problems(item, shape.value, f"{path}[{key!r}]"))
        return found
    if kind == "string":
        if not isinstance(value, str):
            return [f"{path}: expected a string ({shape.name}), got {type(value).__name__} {value!r}"]
        if shape.enum and value not in shape.enum:
            return [f"{path}: {value!r} is not one of {shape.name}'s values {shape.enum}"]
        return []
    if kind in ("integer", "long"):
        if isinstance(value, bool) or not isinstance(value, int):
            return [f"{path}: expected an integer ({shape.name}), got {type(value).__name__} {value!r}"]
        return []
    if kind in ("float", "double"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return [f"{path}: expected a number ({shape.name}), got {type(value).__name__} {value!r}"]
        return []
    if kind == "boolean":
        if not isinstance(value, bool):
            return [f"{path}: expected a boolean ({shape.name}), got {type(value).__name__} {value!r}"]
        return []
    if kind == "timestamp":
        if isinstance(value, bool) or not isinstance(value, (int, float, datetime.datetime)):
            return [f"{path}: expected a timestamp ({shape.name}), got {type(value).__name__}"]
        return []
    if kind == "blob":
        if not isinstance(value, (bytes, bytearray)):
            return [f"{path}: expected bytes ({shape.name}), got {type(value).__name__}"]
        return []
    return [f"{path}: the checker does not know shape type {kind!r}"]


def check_output(service: str, operation: str, response: Any) -> Any:
    """Raise AssertionError unless ``response`` fits the operation's output shape; return it."""
    shape = service_model(service).operation_model(operation).output_shape
    body = dict(response)
    body.pop("ResponseMetadata", None)  # what boto3 adds to every answer
    if shape is None:
        assert body == {}, f"{operation} has no output shape, got {body!r}"
        return response
    found = problems(body, shape)
    assert not found, f"{operation} answer does not fit botocore's model:\n  " + "\n  ".join(found)
    return response


def operation_name(method: str) -> str:
    return "".join(part.capitalize() for part in method.split("_"))


_SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")


class _CheckedService:
    def __init__(self, target: Any, service: str) -> None:
        self._target = target
        self._service = service
        self._operations = set(service_model(service).operation_names)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        operation = operation_name(name) if _SNAKE.match(name) else None
        if operation not in self._operations or not callable(attribute):
            return attribute

        @functools.wraps(attribute)
        def call(**params: Any) -> Any:
            return check_output(self._service, operation, attribute(**params))

        return call


class Checked(_CheckedService):
    """The emulator with every Batch answer, and every ``logs`` answer, checked against the model."""

    def __init__(self, emulator: Any) -> None:
        super().__init__(emulator, "batch")
        self.emulator = emulator
        self.logs = _CheckedService(emulator.logs, "logs")
