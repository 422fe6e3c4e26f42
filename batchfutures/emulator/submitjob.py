"""SubmitJob's rules, as Batch applies them, and the JobSpec a valid request becomes (pure)."""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional

from ..batchlimits import MAX_ARRAY_SIZE, MAX_SUBMIT_PAYLOAD, MIN_ARRAY_SIZE
from .catalog import Rejected, resolve_resources
from .consumables import requirements
from .jobstate import MAX_TAGS, JobSpec
from .retries import check_strategy, normalized
from .tagging import check_tags

JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


def check_request(params: Dict[str, Any]) -> None:
    """The request's own limits: its size and its name."""
    size = len(json.dumps(params, separators=(",", ":")).encode())
    if size > MAX_SUBMIT_PAYLOAD:
        raise Rejected(f"SubmitJob request size {size} bytes exceeds the 30 KiB limit "
                       f"({MAX_SUBMIT_PAYLOAD} bytes)")
    name = params["jobName"]
    if not JOB_NAME.fullmatch(name):
        raise Rejected(f"jobName {name!r} is invalid: up to 128 letters (uppercase and "
                       "lowercase), numbers, hyphens and underscores, starting with a letter "
                       "or number")
    # Batch's tag rules for each tag (the count is checked as the job propagates its tags)
    problem = check_tags(params.get("tags"), limit=None)
    if problem:
        raise Rejected(problem)


def check_array_size(params: Dict[str, Any]) -> Optional[int]:
    """arrayProperties.size (None for a plain job), within Batch's 2..10,000."""
    array_size = (params.get("arrayProperties") or {}).get("size")
    if params.get("arrayProperties") is not None and (
            array_size is None or not MIN_ARRAY_SIZE <= array_size <= MAX_ARRAY_SIZE):
        raise Rejected(f"arrayProperties.size must be between {MIN_ARRAY_SIZE} and {MAX_ARRAY_SIZE}, "
                       f"got {array_size}")
    return array_size


def container_settings(properties: Dict[str, Any], overrides: Dict[str, Any],
                       parameters: Dict[str, str]) -> Dict[str, Any]:
    """One container's settings (jobs.NODE_FIELDS): its definition's, then the overrides'."""
    check_environment(overrides.get("environment"))
    requirements, vcpus, memory = resolve_resources(properties, overrides)
    if memory is None:
        raise Rejected("The job needs a MEMORY resource requirement (its definition has none)")
    command = [substitute(arg, parameters)
               for arg in (overrides.get("command") or properties.get("command") or [])]
    environment = {}  # the definition's variables, then the overrides'
    for item in (properties.get("environment") or []) + (overrides.get("environment") or []):
        environment[item["name"]] = item.get("value", "")
    return {"image": properties.get("image") or "batchfutures-local", "command": command,
            "environment": [{"name": k, "value": v} for k, v in environment.items()],
            "resource_requirements": requirements, "vcpus": vcpus, "memory": memory,
            "gpus": sum(int(float(r["value"])) for r in requirements if r["type"] == "GPU"),
            "log_configuration": properties.get("logConfiguration")}


def node_range(target: str, num_nodes: int) -> range:
    """The nodes a `targetNodes` names: "2", "0:3", "1:" or ":3" (inclusive), within the job."""
    text = str(target).strip()
    try:
        if ":" in text:
            start, _, end = text.partition(":")
            first = int(start) if start else 0
            last = int(end) if end else num_nodes - 1
        else:
            first = last = int(text)
    except ValueError:
        raise Rejected(f"targetNodes {target!r} must be N, N:M, N: or :M") from None
    if not 0 <= first <= last:
        raise Rejected(f"targetNodes {target!r} is not a range of node indexes")
    return range(first, min(last, num_nodes - 1) + 1)


def check_node_properties(properties: Optional[Dict[str, Any]]) -> None:
    """A multinode definition's nodeProperties, as RegisterJobDefinition checks them."""
    if not properties:
        raise Rejected("nodeProperties is required for a multinode job definition")
    count, main = properties.get("numNodes"), properties.get("mainNode")
    if not isinstance(count, int) or count < 1:
        raise Rejected(f"nodeProperties.numNodes must be at least 1, got {count!r}")
    if not isinstance(main, int) or not 0 <= main < count:
        raise Rejected(f"nodeProperties.mainNode must be a node index below {count}, got {main!r}")
    for item in properties.get("nodeRangeProperties") or []:
        if item.get("container") is None:
            raise Rejected("each nodeRangeProperties entry needs a container")
        node_range(item["targetNodes"], count)
        resolve_resources(item["container"], {})
        check_environment(item["container"].get("environment"))


def build_spec(params: Dict[str, Any], definition: Dict[str, Any], *, job_id: str, queue: str,
               created: int, seq: int) -> JobSpec:
    """What SubmitJob fixes for the job: the definition's values, overridden by the request's."""
    strategy = params.get("retryStrategy") or definition.get("retryStrategy")
    timeout = params.get("timeout") or definition.get("timeout")
    check_common(strategy, timeout)
    parameters = dict(definition.get("parameters") or {})
    parameters.update(params.get("parameters") or {})
    num_nodes = main_node = nodes = node_ranges = None
    if definition.get("type") == "multinode":
        if params.get("arrayProperties") is not None:
            raise Rejected("Array jobs are not supported for multi-node parallel jobs")
        num_nodes, main_node, nodes, node_ranges = _nodes(definition, params, parameters)
        own = dict(nodes[main_node])
    else:
        own = container_settings(definition.get("containerProperties") or {},
                                 params.get("containerOverrides") or {}, parameters)
    propagate = params.get("propagateTags", definition.get("propagateTags"))
    tags = dict(definition.get("tags") or {}) if propagate else {}
    tags.update(params.get("tags") or {})  # the job's win over its definition's
    return JobSpec(
        job_id=job_id, name=params["jobName"], queue=queue,
        definition_arn=definition["jobDefinitionArn"],
        definition_name=definition["jobDefinitionName"],
        retry_strategy=normalized(strategy),
        timeout=(timeout or {}).get("attemptDurationSeconds"),
        # the job's tags: SubmitJob's, with its definition's when it propagates them (unless
        # there are too many: the job then fails as it leaves SUBMITTED, see too_many_tags)
        tags=tags if len(tags) <= MAX_TAGS else dict(params.get("tags") or {}),
        propagate_tags=propagate,
        share_identifier=params.get("shareIdentifier"),
        scheduling_priority=params.get("schedulingPriorityOverride",
                                       definition.get("schedulingPriority")),
        parameters=parameters or None,
        depends_on=[dict(d) for d in params.get("dependsOn") or []],
        array_size=(params.get("arrayProperties") or {}).get("size"), created=created, seq=seq,
        platform_capabilities=definition.get("platformCapabilities") or ["EC2"],
        tag_total=len(tags), num_nodes=num_nodes, main_node=main_node, nodes=nodes,
        node_ranges=node_ranges,
        consumables=consumables_of(definition.get("consumableResourceProperties"),
                                   params.get("consumableResourcePropertiesOverride")),
        **own)


def consumables_of(defined: Optional[Dict[str, Any]],
                   override: Optional[Dict[str, Any]]) -> Optional[List[List[Any]]]:
    """A job's [name, quantity] pairs: its definition's consumable resources, each resource
    SubmitJob's override names taking the override's quantity."""
    needs = dict(requirements(defined))
    needs.update(requirements(override))
    return [[name, quantity] for name, quantity in sorted(needs.items())] or None


def _nodes(definition: Dict[str, Any], params: Dict[str, Any], parameters: Dict[str, str]) -> Any:
    """(numNodes, mainNode, each node's settings, the ranges shown) of a multi-node job."""
    properties = definition.get("nodeProperties") or {}
    overrides = params.get("nodeOverrides") or {}
    count = overrides.get("numNodes") or properties["numNodes"]
    main = properties["mainNode"]
    if not main < count:
        raise Rejected(f"nodeOverrides.numNodes {count} leaves no main node {main}")
    ranges = properties.get("nodeRangeProperties") or []
    chosen: List[Optional[Dict[str, Any]]] = [None] * count  # each node's range: the last naming it
    for item in ranges:
        for index in node_range(item["targetNodes"], count):
            chosen[index] = item["container"]
    missing = [i for i, c in enumerate(chosen) if c is None]
    if missing:
        raise Rejected(f"nodeRangeProperties do not cover nodes {missing}")
    node_overrides: List[Dict[str, Any]] = [{} for _ in range(count)]
    for item in overrides.get("nodePropertyOverrides") or []:
        for index in node_range(item["targetNodes"], count):
            node_overrides[index] = item.get("containerOverrides") or {}
    nodes = [container_settings(chosen[i] or {}, node_overrides[i], parameters) for i in range(count)]
    return count, main, nodes, [dict(item) for item in ranges]


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
