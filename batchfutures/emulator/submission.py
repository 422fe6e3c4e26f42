"""SubmitJob's rules, as Batch applies them, and the JobSpec a valid request becomes (pure)."""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional

from .catalog import Rejected, resolve_resources
from .jobs import JobSpec
from .retries import check_strategy, normalized

MAX_REQUEST_BYTES = 30 * 1024
MAX_ARRAY_SIZE = 10_000
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


def check_request(params: Dict[str, Any]) -> None:
    """The request's own limits: its size and its name."""
    size = len(json.dumps(params, separators=(",", ":")).encode())
    if size > MAX_REQUEST_BYTES:
        raise Rejected(f"SubmitJob request size {size} bytes exceeds the 30 KiB limit "
                       f"({MAX_REQUEST_BYTES} bytes)")
    name = params["jobName"]
    if not JOB_NAME.fullmatch(name):
        raise Rejected(f"jobName {name!r} is invalid: up to 128 letters (uppercase and "
                       "lowercase), numbers, hyphens and underscores, starting with a letter "
                       "or number")


def check_array_size(params: Dict[str, Any]) -> Optional[int]:
    """arrayProperties.size (None for a plain job), within Batch's 2..10,000."""
    array_size = (params.get("arrayProperties") or {}).get("size")
    if params.get("arrayProperties") is not None and (
            array_size is None or not 2 <= array_size <= MAX_ARRAY_SIZE):
        raise Rejected(f"arrayProperties.size must be between 2 and {MAX_ARRAY_SIZE}, "
                       f"got {array_size}")
    return array_size


def build_spec(params: Dict[str, Any], definition: Dict[str, Any], *, job_id: str, queue: str,
               created: int, seq: int) -> JobSpec:
    """What SubmitJob fixes for the job: the definition's values, overridden by the request's."""
    strategy = params.get("retryStrategy") or definition.get("retryStrategy")
    timeout = params.get("timeout") or definition.get("timeout")
    check_common(strategy, timeout)
    overrides = params.get("containerOverrides") or {}
    check_environment(overrides.get("environment"))
    properties = definition.get("containerProperties") or {}
    requirements, vcpus, memory = resolve_resources(properties, overrides)
    if memory is None:
        raise Rejected("The job needs a MEMORY resource requirement (its definition has none)")
    parameters = dict(definition.get("parameters") or {})
    parameters.update(params.get("parameters") or {})
    command = [substitute(arg, parameters)
               for arg in (overrides.get("command") or properties.get("command") or [])]
    environment = {}  # the definition's variables, then the overrides'
    for item in (properties.get("environment") or []) + (overrides.get("environment") or []):
        environment[item["name"]] = item.get("value", "")
    propagate = params.get("propagateTags", definition.get("propagateTags"))
    tags = dict(definition.get("tags") or {}) if propagate else {}
    tags.update(params.get("tags") or {})  # the job's win over its definition's
    return JobSpec(
        job_id=job_id, name=params["jobName"], queue=queue, definition_arn=definition["jobDefinitionArn"],
        definition_name=definition["jobDefinitionName"],
        image=properties.get("image") or "batchfutures-local", command=command,
        environment=[{"name": k, "value": v} for k, v in environment.items()],
        resource_requirements=requirements, vcpus=vcpus, memory=memory,
        retry_strategy=normalized(strategy),
        timeout=(timeout or {}).get("attemptDurationSeconds"),
        tags=dict(params.get("tags") or {}),
        propagate_tags=propagate,
        share_identifier=params.get("shareIdentifier"),
        scheduling_priority=params.get("schedulingPriorityOverride",
                                       definition.get("schedulingPriority")),
        parameters=parameters or None,
        depends_on=[dict(d) for d in params.get("dependsOn") or []],
        array_size=(params.get("arrayProperties") or {}).get("size"), created=created, seq=seq,
        platform_capabilities=definition.get("platformCapabilities") or ["EC2"],
        tag_total=len(tags), log_configuration=properties.get("logConfiguration"),
        gpus=sum(int(float(r["value"])) for r in requirements if r["type"] == "GPU"))


def check_environment(environment: Optional[List[Dict[str, Any]]]) -> None:
    for item in environment or []:
        if str(item.get("name", "")).upper().startswith("AWS_BATCH"):
            raise Rejected(f"Environment variable {item['name']}: names starting with AWS_BATCH "
                           "are reserved for variables that Batch sets")


def check_common(strategy: Optional[Dict[str, Any]], timeout: Optional[Dict[str, Any]]) -> None:
    problem = check_strategy(strategy)
    if problem:
        raise Rejected(problem)
    seconds = (timeout or {}).get("attemptDurationSeconds")
    if seconds is not None and seconds < 1:
        raise Rejected(f"timeout.attemptDurationSeconds must be positive, got {seconds}")


def substitute(argument: str, parameters: Dict[str, str]) -> str:
    """Batch's parameter substitution: `Ref::name` in the command becomes the value."""
    if "Ref::" not in argument:
        return argument
    for name, value in parameters.items():
        argument = argument.replace(f"Ref::{name}", value)
    return argument
