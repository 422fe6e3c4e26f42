"""ListJobs' and the Describe operations' pagination tokens and ListJobs' filters."""

from __future__ import annotations

import base64
import json
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from .catalog import Rejected
from .jobstate import Job, Unit


def token(position: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(position).encode()).decode()


def untoken(token: Optional[str]) -> Any:
    if not token:
        return None
    try:
        return json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, TypeError):
        raise Rejected("The nextToken is not valid")


T = TypeVar("T")


def offset_page(items: List[T], next_token: Optional[str], size: int) -> Tuple[List[T], Dict[str, str]]:
    """The page of `items` a Describe or List call's nextToken (an offset) asks for, and the
    response's nextToken entry ({} on the last page)."""
    start = int(untoken(next_token) or 0)
    more = {"nextToken": token(start + size)} if start + size < len(items) else {}
    return items[start:start + size], more


def glob(pattern: str, value: str) -> bool:
    pattern, value = pattern.lower(), value.lower()
    return value.startswith(pattern[:-1]) if pattern.endswith("*") else value == pattern


def job_filter(filters: List[Dict[str, Any]]) -> Callable[[Job, Optional[Unit]], bool]:
    """ListJobs' filters as one predicate (Batch matches a trailing `*` as a prefix)."""
    checks: List[Callable[[Job, Optional[Unit]], bool]] = []
    for item in filters:
        name, values = item.get("name"), item.get("values") or []
        if not values:
            raise Rejected(f"filter {name} needs a value")
        value = values[0]
        if name == "JOB_NAME":
            def by_name(job: Job, unit: Optional[Unit], v: str = value) -> bool:
                return glob(v, job.spec.name)
            checks.append(by_name)
        elif name == "JOB_DEFINITION":
            def by_definition(job: Job, unit: Optional[Unit], v: str = value) -> bool:
                arn = job.spec.definition_arn
                if arn is None:  # another process's record may lack it: no definition matches
                    return False
                short = arn.split("job-definition/", 1)[1]
                return any(glob(v, candidate) for candidate in
                           (arn, short, job.spec.definition_name) if candidate is not None)
            checks.append(by_definition)
        elif name in ("BEFORE_CREATED_AT", "AFTER_CREATED_AT"):
            try:
                stamp = int(value)
            except ValueError:
                raise Rejected(f"filter {name} needs a time in epoch milliseconds")
            if name == "BEFORE_CREATED_AT":
                def before(job: Job, unit: Optional[Unit], t: int = stamp) -> bool:
                    return job.spec.created < t
                checks.append(before)
            else:
                def after(job: Job, unit: Optional[Unit], t: int = stamp) -> bool:
                    return job.spec.created > t
                checks.append(after)
        else:
            raise Rejected(f"unknown filter {name!r}: use JOB_NAME, JOB_DEFINITION, "
                           "BEFORE_CREATED_AT or AFTER_CREATED_AT")
    return lambda job, unit: all(check(job, unit) for check in checks)


def name_filter(filters: Optional[List[Dict[str, Any]]], key: str) -> Callable[[str], bool]:
    """The name filter (`key`: CONSUMABLE_RESOURCE_NAME, JOB_NAME) of a consumable-resource
    listing as a predicate: case-insensitive, a trailing `*` a prefix; no filter matches all."""
    patterns = [v for item in filters or [] if item.get("name") == key
                for v in item.get("values") or []]
    return lambda name: not patterns or any(glob(p, name) for p in patterns)
