"""Job settings: validated once, when an executor or a settings view is made.

A ConfigurationError names the setting (and a variable or tag name) and the type or shape it
expects, never the value given: values may be secrets, environment values or tags. Numbers
out of range (vcpus, retries, priority, nodes, memory in MiB) are shown.

A `JobSettings` is immutable and hashable, so the executor can coalesce calls that share the
same settings into one array job. `submission.build_request` turns it into a SubmitJob request
(container overrides, timeout, retry strategy, tags); the job definition never changes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from .errors import ConfigurationError
from .retrypolicy import Retries, check_nodes

MAX_ATTEMPTS = 10
_UNITS = {
    "": 1, "m": 1, "mb": 1, "mib": 1, "mi": 1,
    "g": 1024, "gb": 1024, "gib": 1024, "gi": 1024,
    "t": 1024 * 1024, "tb": 1024 * 1024, "tib": 1024 * 1024, "ti": 1024 * 1024,
    "k": 1 / 1024, "kb": 1 / 1024, "kib": 1 / 1024, "ki": 1 / 1024,
}
_MEMORY_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")
# Batch forbids overriding its own variables; names must be valid environment names.
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

SETTING_NAMES = ("vcpus", "memory", "gpus", "timeout", "retries", "tags", "share_id", "priority",
                 "environment", "secrets", "retry_on_oom", "nodes", "runnable_timeout", "keepalive",
                 "requirements", "consumes", "spot_attempts", "fallback_queue")
MAX_NODES = 1000  # Batch's numNodes limit for a multi-node parallel job
# A secret's value source: a Secrets Manager secret or an SSM Parameter Store parameter.
_SECRET_ARN_RE = re.compile(
    r"^arn:aws[a-zA-Z-]*:(secretsmanager|ssm):[a-z0-9-]+:[0-9]{12}:(secret:|parameter/).+$")
# AWS credentials belong in `secrets=`: environment= values appear in SubmitJob and DescribeJobs.
_CREDENTIAL_NAME_RE = re.compile(r"^AWS_(ACCESS_KEY_ID|SECRET_ACCESS_KEY|SESSION_TOKEN)$", re.IGNORECASE)
_CREDENTIAL_VALUE_RE = re.compile(r"^(AKIA|ASIA)[A-Z0-9]{16}$")  # an access key id


def _kind(value: Any) -> str:
    """How an error names a value it refuses: its type, never the value (a setting's value may
    be a secret, an environment value or a tag)."""
    if isinstance(value, str) and not value:
        return "an empty str"
    return f"a {type(value).__name__}"


def parse_memory(value: Union[int, float, str]) -> int:
    """MiB from an int (MiB) or a string such as "512MiB", "8GiB", "1.5 GB"."""
    if isinstance(value, bool):
        raise ConfigurationError("memory must be MiB or a string like '8GiB', not a bool")
    if isinstance(value, (int, float)):
        mib = value
    elif isinstance(value, str):
        match = _MEMORY_RE.match(value)
        unit = match.group(2).lower() if match else None
        if not match or unit not in _UNITS:
            raise ConfigurationError(
                "memory (a str) is not a size; use MiB as an int or a string like '512MiB', '8GiB'"
            )
        mib = float(match.group(1)) * _UNITS[unit]
    else:
        raise ConfigurationError(
            f"memory must be MiB or a string like '8GiB', not {_kind(value)}")
    if not math.isfinite(mib) or mib < 4:
        raise ConfigurationError(f"memory must be at least 4 MiB (it is {mib:g} MiB)")
    return int(math.ceil(mib))


@dataclass(frozen=True)
class JobSettings:
    vcpus: float = 1
    memory: Optional[int] = None  # MiB; None means "derive from vcpus, gpus and the definition"
    gpus: int = 0
    timeout: Optional[float] = None
    retries: int = 1
    tags: Tuple[Tuple[str, str], ...] = ()
    share_id: Optional[str] = None
    priority: Optional[int] = None
    environment: Tuple[Tuple[str, str], ...] = field(default=())
    secrets: Tuple[Tuple[str, str], ...] = ()  # variable name -> Secrets Manager / SSM ARN
    retry_on_oom: int = 0  # resubmit OOM-killed children with doubled memory, up to this often
    nodes: int = 1  # > 1: one multi-node parallel job per submit
    runnable_timeout: Optional[float] = None  # seconds RUNNABLE with a MISCONFIGURATION/CAPACITY reason
    keepalive: float = 0  # > 0: calls run on warm workers idle this long before they exit (warmpool.py)
    # None, "auto", requirement strings or a requirements file's path (requirements.py, envbuild.py)
    requirements: Union[None, str, Tuple[str, ...]] = None
    # retries=Retries(n, on=...): the policy (retrypolicy.py); ``retries`` is then its attempts
    retry_policy: Optional[Retries] = None
    consumes: Tuple[Tuple[str, int], ...] = ()  # Batch's consumable resources: name -> quantity
    spot_attempts: int = 0  # > 0: after that many Spot reclaims a call goes on demand (spot.py)
    fallback_queue: Optional[str] = None  # that on-demand queue (none: a reclaimed call fails)

    @classmethod
    def from_kwargs(cls, base: Optional["JobSettings"] = None, **kwargs: Any) -> "JobSettings":
        unknown = set(kwargs) - set(SETTING_NAMES)
        if unknown:
            raise ConfigurationError(
                f"unknown job setting(s) {sorted(unknown)}; the settings are {', '.join(SETTING_NAMES)}"
            )
        values: Dict[str, Any] = {}
        if "vcpus" in kwargs:
            values["vcpus"] = _check_vcpus(kwargs["vcpus"])
        if "memory" in kwargs:
            values["memory"] = None if kwargs["memory"] is None else parse_memory(kwargs["memory"])
        if "gpus" in kwargs:
            values["gpus"] = _check_int("gpus", kwargs["gpus"], minimum=0)
        if "timeout" in kwargs:
            values["timeout"] = _check_timeout(kwargs["timeout"])
        if "retries" in kwargs:
            if isinstance(kwargs["retries"], Retries):
                values["retries"] = kwargs["retries"].attempts
                values["retry_policy"] = kwargs["retries"]
            else:
                values["retries"] = _check_retries(kwargs["retries"])
                values["retry_policy"] = None
        if "tags" in kwargs:
            values["tags"] = _check_pairs("tags", kwargs["tags"])
        if "share_id" in kwargs:
            values["share_id"] = _check_name("share_id", kwargs["share_id"], "a non-empty string")
        if "priority" in kwargs:
            priority = kwargs["priority"]
            if priority is not None:
                priority = _check_int("priority", priority, minimum=0)
                if priority > 9999:
                    raise ConfigurationError(f"priority={priority}: Batch allows 0 to 9999")
            values["priority"] = priority
        if "environment" in kwargs:
            env = _check_pairs("environment", kwargs["environment"])
            for name, value in env:
                if not _ENV_NAME_RE.match(name):
                    raise ConfigurationError(f"environment variable name {name!r} is not valid")
                if name.upper().startswith("AWS_BATCH"):
                    raise ConfigurationError(
                        f"environment variable {name!r}: names starting with AWS_BATCH are reserved by Batch"
                    )
                if _CREDENTIAL_NAME_RE.search(name) or _CREDENTIAL_VALUE_RE.match(value):
                    raise ConfigurationError(
                        f"environment variable {name!r} looks like a credential; values in "
                        f"environment= appear in SubmitJob and DescribeJobs. Store it in Secrets "
                        f"Manager or SSM Parameter Store and pass secrets={{{name!r}: ARN}}")
            values["environment"] = env
        if "secrets" in kwargs:
            values["secrets"] = _check_secrets(kwargs["secrets"])
        if "retry_on_oom" in kwargs:
            values["retry_on_oom"] = _check_int("retry_on_oom", kwargs["retry_on_oom"], minimum=0)
        if "nodes" in kwargs:
            nodes = _check_int("nodes", kwargs["nodes"], minimum=1)
            if nodes > MAX_NODES:
                raise ConfigurationError(
                    f"nodes={nodes}: a Batch multi-node job has at most {MAX_NODES} nodes")
            values["nodes"] = nodes
        if "runnable_timeout" in kwargs:
            values["runnable_timeout"] = _check_timeout(kwargs["runnable_timeout"], name="runnable_timeout")
        if "keepalive" in kwargs:
            keepalive = kwargs["keepalive"]
            values["keepalive"] = 0 if keepalive is None else _check_timeout(
                keepalive, name="keepalive") if keepalive != 0 else 0
        if "requirements" in kwargs:
            # start-up: requirements (pickletools) costs ~1 ms; only requirements= needs it
            from .requirements import check_setting

            values["requirements"] = check_setting(kwargs["requirements"])
        if "consumes" in kwargs:
            values["consumes"] = _check_consumes(kwargs["consumes"])
        if "spot_attempts" in kwargs:
            values["spot_attempts"] = 0 if kwargs["spot_attempts"] is None else _check_int(
                "spot_attempts", kwargs["spot_attempts"], minimum=0)
            if values["spot_attempts"] > MAX_ATTEMPTS:
                raise ConfigurationError(
                    f"spot_attempts={values['spot_attempts']}: a Batch job has at most "
                    f"{MAX_ATTEMPTS} attempts")
        if "fallback_queue" in kwargs:
            values["fallback_queue"] = _check_name("fallback_queue", kwargs["fallback_queue"],
                                                   "a job queue's name or ARN")
        settings = replace(base or cls(), **values)
        check_nodes(settings.retry_policy, settings.nodes)  # never ignored silently
        names = {name for name, _ in settings.environment} & {name for name, _ in settings.secrets}
        if names:
            raise ConfigurationError(f"{sorted(names)} given both in environment= and in secrets=")
        return settings

    def memory_mib(self, definition_memory: Optional[int] = None) -> int:
        """The memory a job gets: the setting, or the contract's default."""
        if self.memory is not None:
            return self.memory
        derived = max(2048, int(math.ceil(1024 * self.vcpus)), 4096 * self.gpus)
        return max(definition_memory or 0, derived)

    def as_dict(self) -> Dict[str, Any]:
        return {
            "vcpus": self.vcpus, "memory": self.memory, "gpus": self.gpus, "timeout": self.timeout,
            "retries": self.retries, "tags": dict(self.tags), "share_id": self.share_id,
            "priority": self.priority, "environment": dict(self.environment),
            "secrets": dict(self.secrets), "retry_on_oom": self.retry_on_oom, "nodes": self.nodes,
            "runnable_timeout": self.runnable_timeout,
            **({"keepalive": self.keepalive} if self.keepalive else {}),
            **({"requirements": self.requirements} if self.requirements is not None else {}),
            **({"retry_on": [kind.__qualname__ for kind in self.retry_policy.on]}
               if self.retry_policy is not None and self.retry_policy.on else {}),
            **({"consumes": dict(self.consumes)} if self.consumes else {}),
            **({"spot_attempts": self.spot_attempts} if self.spot_attempts else {}),
            **({"fallback_queue": self.fallback_queue} if self.fallback_queue else {}),
        }


def _check_vcpus(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"vcpus must be a number, not {_kind(value)}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"vcpus={value!r} must be positive")
    return int(value) if float(value).is_integer() else float(value)


def _check_int(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ConfigurationError(f"{name} must be an integer, not {_kind(value)}")
    if value < minimum:
        raise ConfigurationError(f"{name}={value} must be at least {minimum}")
    return value


def _check_retries(value: Any) -> int:
    """retries counts attempts, as Batch's retryStrategy.attempts does: 1 means no retry."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPTS:
        shown = f"retries={value}" if isinstance(value, int) and not isinstance(value, bool) \
            else f"retries (a {type(value).__name__})"
        raise ConfigurationError(
            f"{shown}: retries counts attempts (Batch's retryStrategy.attempts), from 1 "
            f"(run once, no retry) to {MAX_ATTEMPTS}")
    return value


def _check_consumes(value: Any) -> Tuple[Tuple[str, int], ...]:
    """consumes={"licence": 1}: Batch's consumableResourceList (a resource's name or ARN and a
    quantity of at least 1)."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"consumes must be a mapping of consumable resource names to quantities, not "
            f"{type(value).__name__}")
    pairs = []
    for name, quantity in value.items():
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"consumes: each key must be a resource's name or ARN, not "
                                     f"{_kind(name)}")
        pairs.append((name, _check_int(f"consumes[{name!r}]", quantity, minimum=1)))
    return tuple(sorted(pairs))


def _check_name(name: str, value: Any, what: str) -> Optional[str]:
    """None, or a non-empty string (`what` says what it names, in the error)."""
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigurationError(f"{name} must be {what}, not {_kind(value)}")
    return value


def _check_timeout(value: Any, *, name: str = "timeout") -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigurationError(f"{name} must be a finite number of seconds, not {_kind(value)}")
    if value <= 0:
        raise ConfigurationError(f"{name}={value!r} must be positive")
    return value


def _check_secrets(value: Any) -> Tuple[Tuple[str, str], ...]:
    pairs = _check_pairs("secrets", value)
    for name, arn in pairs:
        if not _ENV_NAME_RE.match(name) or name.upper().startswith("AWS_BATCH"):
            raise ConfigurationError(f"secrets: {name!r} is not a usable environment variable name")
        if not _SECRET_ARN_RE.match(arn):
            raise ConfigurationError(
                f"secrets[{name!r}] must be the ARN of a Secrets Manager secret "
                f"(arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME) or of an SSM parameter "
                f"(arn:aws:ssm:REGION:ACCOUNT:parameter/NAME); the value given (a "
                f"{type(arn).__name__} of {len(arn)} characters) is not one")
    return pairs


def _check_pairs(name: str, value: Any) -> Tuple[Tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"{name} must be a mapping of strings, not {type(value).__name__}")
    pairs = []
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise ConfigurationError(
                f"{name}: each key must be a non-empty string, not {_kind(key)}")
        if not isinstance(item, (str, int, float)) or isinstance(item, bool):
            raise ConfigurationError(
                f"{name}[{key!r}] must be a string (or a number), not {_kind(item)}")
        pairs.append((key, str(item)))
    return tuple(sorted(pairs))
