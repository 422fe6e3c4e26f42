"""Reading Batch's JobDetail (a DescribeJobs answer): one definition of each thing in it.

    DescribeJobs ──> description ──> attempt_count(d)    how many attempts have ended
                                     last_attempt(d)     the last finished attempt, or {}
                                     last_container(d)   that attempt's container (exitCode,
                                                         reason), else the job's own
                                     log_stream(d)       the current attempt's stream, else
                                                         the latest attempt's that has one
                                     resources(c)        VCPU, MEMORY (MiB) and GPU of a
                                                         container or of container properties

`attempts` lists finished attempts only; `container` describes the attempt that runs now (or,
once the job ended, its last one). So what an ended attempt said (its exit code, its reason) is
read from the last attempt, and where the output goes now from `container` first: while a retry
runs, the last attempt is the previous try.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Optional

__all__ = ["attempt_count", "last_attempt", "last_container", "log_stream", "Resources", "resources"]


def attempt_count(description: Mapping[str, Any]) -> int:
    """How many attempts of the job have ended (the ones `attempts` lists)."""
    attempts = description.get("attempts")
    return len(attempts) if isinstance(attempts, (list, tuple)) else 0


def last_attempt(description: Mapping[str, Any]) -> Mapping[str, Any]:
    """The job's last finished attempt, or {} before any ended."""
    attempts = description.get("attempts") or []
    last = attempts[-1] if attempts else None
    return last if isinstance(last, Mapping) else {}


def last_container(description: Mapping[str, Any]) -> Mapping[str, Any]:
    """The container of the job's last attempt (where exitCode and reason are), else its own."""
    container = last_attempt(description).get("container")
    if isinstance(container, Mapping) and container:
        return container
    own = description.get("container")
    return own if isinstance(own, Mapping) else {}


def log_stream(description: Mapping[str, Any]) -> Optional[str]:
    """The log stream of the current attempt, else of the latest attempt that has one."""
    stream = (description.get("container") or {}).get("logStreamName")
    if stream:
        return str(stream)
    for attempt in reversed(description.get("attempts") or []):
        stream = (attempt.get("container") or {}).get("logStreamName")
        if stream:
            return str(stream)
    return None


class Resources(NamedTuple):
    """What a container asked for; None where it says nothing."""

    vcpus: Optional[float]
    memory_mib: Optional[int]
    gpus: Optional[int]


def _number(value: Any) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def resources(container: Mapping[str, Any]) -> Resources:
    """VCPU, MEMORY and GPU of a container (or a definition's containerProperties): its
    resourceRequirements, else the legacy `vcpus` and `memory` integers, as Batch reads them."""
    found = {}
    for item in container.get("resourceRequirements") or []:
        if isinstance(item, Mapping) and item.get("type") in ("VCPU", "MEMORY", "GPU"):
            found[item["type"]] = _number(item.get("value"))
    vcpus = found.get("VCPU", _number(container.get("vcpus")))
    memory = found.get("MEMORY", _number(container.get("memory")))
    gpus = found.get("GPU")
    return Resources(vcpus=vcpus,
                     memory_mib=int(memory) if memory else None,
                     gpus=int(gpus) if gpus is not None else None)
