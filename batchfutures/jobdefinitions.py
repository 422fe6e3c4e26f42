"""Job definitions: found, registered from an image, or derived with secrets; checked sizes and tags.

    AWSBatchEnvironment(image=..., job_role_arn=..., mounts=[...]) ──> definition_properties()
        ──> name "batchfutures-<sha256 of the properties>"
        ──> DescribeJobDefinitions(name, ACTIVE): found -> its ARN; else RegisterJobDefinition
    a given definition + secrets={NAME: ARN} ──> definition_with_secrets()
        ──> describe it, copy it with containerProperties.secrets added, and register that copy
            the same way ("batchfutures-<hash>"), so the secrets' ARNs live in the definition
            and their values never appear in SubmitJob (whose containerOverrides take no secrets)
    a container definition used for nodes=N ──> multinode_definition_from()
        ──> described, copied as a multinode definition (its container on every node) and
            registered the same way; a multinode definition is used as it is
    "name", "name:3", an ARN with or without ":3" ──> describe_job_definition()
        ──> with a revision: that revision; without: the highest ACTIVE revision of the name

With ``stack=`` every registration above passes through with_stack_defaults(): the tag
``batchfutures:stack=<stack>`` and, where a container has none, the awslogs configuration of the
stack's log group (/aws/batch/<stack>), as the stack's client policy requires; and in an EC2
definition's containers the hosts' environment cache, as the stack's own EC2 definition has it
(envarchive.with_host_cache: the volume the launch template makes, its mount, its variable).

Per-job settings (vCPUs, memory, GPUs, timeout, attempts, tags...) never go here: they travel in
SubmitJob overrides, so one definition serves every executor with the same image and options.
Options follow TorchX's AWS Batch scheduler: roles, platform, privileged, ulimits
("name:soft:hard"), mounts ("type=bind,src=..,dst=..[,readonly]", "type=volume,src=<efs id>,
dst=..", "type=device,src=/dev/..[,dst=..][,perm=rwm]"), shared memory and log configuration;
nodes=N > 1 makes it a multi-node parallel definition (one node group running the container).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import threading
import weakref
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import batchapi, envarchive
from .errors import ConfigurationError

PLATFORMS = ("EC2", "FARGATE")
MANAGED_TAG = ("batchfutures:managed", "true")
STACK_TAG = "batchfutures:stack"  # what the stack's client policy requires on what it registers
# Fargate's allowed memory (MiB) for each vCPU value: botocore's Batch model, ResourceRequirement
# value ("value = 32: MEMORY = 61440, 122880, or 249856"; 16: 32768 to 122880 in 8192 steps).
FARGATE_MEMORY = {
    0.25: [512, 1024, 2048],
    0.5: list(range(1024, 4097, 1024)),
    1: list(range(2048, 8193, 1024)),
    2: list(range(4096, 16385, 1024)),
    4: list(range(8192, 30721, 1024)),
    8: list(range(16384, 61441, 4096)),
    16: list(range(32768, 122881, 8192)),
    32: [61440, 122880, 249856],
}
# Tags: a job's and its definition's are combined on the ECS task (propagateTags), and Batch fails
# a job whose combined count passes 50; keys starting with "aws:" are reserved for AWS.
MAX_TAGS = 50
_TAG_TEXT = re.compile(r"^[\w\s+\-=.:/@]*$")


def check_fargate(vcpus: float, memory: int, gpus: int) -> None:
    """Refuse a vCPU/memory pair Fargate does not offer, before anything is submitted."""
    if gpus:
        raise ConfigurationError("Fargate offers no GPUs: use an EC2 queue for gpus > 0")
    allowed = FARGATE_MEMORY.get(float(vcpus))
    if allowed is None:
        raise ConfigurationError(
            f"vcpus={vcpus} is not a Fargate size; use one of {sorted(FARGATE_MEMORY)}")
    if memory not in allowed:
        raise ConfigurationError(
            f"memory={memory} MiB does not go with vcpus={vcpus} on Fargate; "
            f"allowed: {', '.join(str(m) for m in allowed)} MiB")


def check_ec2_vcpus(vcpus: float) -> None:
    """Batch requires at least one vCPU for a job on EC2 resources (0.25 and 0.5 are Fargate's)."""
    if vcpus < 1:
        raise ConfigurationError(
            f"vcpus={vcpus}: a job on EC2 resources needs at least 1 vCPU (0.25 and 0.5 are "
            f"Fargate sizes; use a Fargate queue and job definition for them)")


def check_tags(job_tags: Mapping[str, str], definition_tags: Optional[Mapping[str, str]] = None) -> None:
    """Refuse tags Batch would refuse or fail the job for, before anything is uploaded.

    ``job_tags`` are SubmitJob's (batchfutures' own and the user's); ``definition_tags`` the job
    definition's, which propagateTags adds to the same ECS task (a job tag wins a shared key).
    """
    for key, value in job_tags.items():
        if not isinstance(key, str) or not 1 <= len(key) <= 128:
            raise ConfigurationError(f"tag key {key!r} must be 1 to 128 characters")
        if key.lower().startswith("aws:"):
            raise ConfigurationError(f"tag key {key!r}: the aws: prefix is reserved for AWS")
        if not isinstance(value, str) or len(value) > 256:
            raise ConfigurationError(f"tag {key!r}: the value must be a string of at most 256 characters")
        if not _TAG_TEXT.match(key) or not _TAG_TEXT.match(value):
            raise ConfigurationError(
                f"tag {key!r}: keys and values may hold letters, digits, spaces and + - = . _ : / @")
    combined = set(job_tags) | {k for k in (definition_tags or {}) if not k.lower().startswith("aws:")}
    if len(combined) > MAX_TAGS:
        raise ConfigurationError(
            f"{len(combined)} tags: the job's {len(job_tags)} and its job definition's "
            f"{len(definition_tags or {})} (combined on the task, one per key) are more than the "
            f"{MAX_TAGS} Batch allows; Batch would fail the job")


def parse_ulimits(ulimits: Sequence[str]) -> List[Dict[str, Any]]:
    parsed = []
    for text in ulimits or ():
        parts = text.split(":")
        if len(parts) != 3 or not parts[0]:
            raise ConfigurationError(f"ulimit {text!r} must be 'name:soft:hard'")
        try:
            parsed.append({"name": parts[0], "softLimit": int(parts[1]), "hardLimit": int(parts[2])})
        except ValueError:
            raise ConfigurationError(f"ulimit {text!r}: soft and hard must be integers") from None
    return parsed


def parse_mounts(mounts: Sequence[str]) -> Dict[str, List[Dict[str, Any]]]:
    """Volumes, mount points and devices from TorchX-style mount strings."""
    volumes: List[Dict[str, Any]] = []
    points: List[Dict[str, Any]] = []
    devices: List[Dict[str, Any]] = []
    for number, text in enumerate(mounts or ()):
        fields: Dict[str, str] = {}
        flags = set()
        for part in text.split(","):
            key, sep, value = part.partition("=")
            if sep:
                fields[key.strip()] = value.strip()
            elif part.strip():
                flags.add(part.strip())
        kind, src, dst = fields.get("type"), fields.get("src"), fields.get("dst")
        if kind not in ("bind", "volume", "device") or not src:
            raise ConfigurationError(
                f"mount {text!r} must be type=bind|volume|device with src=... (and dst=...)")
        if kind == "device":
            device: Dict[str, Any] = {"hostPath": src, "containerPath": dst or src}
            perm = fields.get("perm", "rwm")
            device["permissions"] = [{"r": "READ", "w": "WRITE", "m": "MKNOD"}[c] for c in perm]
            devices.append(device)
            continue
        if not dst:
            raise ConfigurationError(f"mount {text!r} needs dst=...")
        name = f"mount{number}"
        if kind == "bind":
            volumes.append({"name": name, "host": {"sourcePath": src}})
        else:
            volumes.append({"name": name, "efsVolumeConfiguration": {"fileSystemId": src}})
        points.append({"sourceVolume": name, "containerPath": dst, "readOnly": "readonly" in flags})
    return {"volumes": volumes, "mountPoints": points, "devices": devices}


def definition_properties(image: str, *, job_role_arn: Optional[str] = None,
                          execution_role_arn: Optional[str] = None, platform: str = "EC2",
                          privileged: bool = False, ulimits: Sequence[str] = (),
                          mounts: Sequence[str] = (), shm_size: Optional[int] = None,
                          log_configuration: Optional[Dict[str, Any]] = None,
                          vcpus: float = 1, memory: int = 2048, nodes: int = 1,
                          secrets: Iterable[Tuple[str, str]] = ()) -> Dict[str, Any]:
    """The RegisterJobDefinition request for an image and options (without its name).

    ``nodes > 1``: a multi-node parallel definition (``type: multinode``) whose one node group
    (``0:``, every node) runs the container, node 0 the main node. ``secrets``: (variable name,
    Secrets Manager or SSM parameter ARN) pairs, the container's ``secrets``; ECS resolves them
    with the execution role, so one is required.
    """
    platform = (platform or "EC2").upper()
    if platform not in PLATFORMS:
        raise ConfigurationError(f"platform={platform!r} must be EC2 or FARGATE")
    if not image or not isinstance(image, str):
        raise ConfigurationError("image must name a container image")
    container: Dict[str, Any] = {
        "image": image,
        "command": ["python", "-m", "batchfutures.worker"],
        "resourceRequirements": [{"type": "VCPU", "value": str(vcpus)},
                                 {"type": "MEMORY", "value": str(memory)}],
    }
    if job_role_arn:
        container["jobRoleArn"] = job_role_arn
    if execution_role_arn:
        container["executionRoleArn"] = execution_role_arn
    if platform == "FARGATE":
        if not execution_role_arn:
            raise ConfigurationError("Fargate needs execution_role_arn (to pull the image and write logs)")
        if privileged:
            raise ConfigurationError("Fargate does not run privileged containers")
        container["networkConfiguration"] = {"assignPublicIp": "ENABLED"}
        container["fargatePlatformConfiguration"] = {"platformVersion": "LATEST"}
    elif privileged:
        container["privileged"] = True
    if ulimits:
        container["ulimits"] = parse_ulimits(ulimits)
    mounted = parse_mounts(mounts)
    if mounted["volumes"]:
        container["volumes"] = mounted["volumes"]
        container["mountPoints"] = mounted["mountPoints"]
    linux: Dict[str, Any] = {}
    if mounted["devices"]:
        linux["devices"] = mounted["devices"]
    if shm_size:
        linux["sharedMemorySize"] = int(shm_size)
    if linux:
        container["linuxParameters"] = linux
    if log_configuration:
        container["logConfiguration"] = log_configuration
    secret_list = _secret_list(secrets)
    if secret_list:
        if not execution_role_arn:
            raise ConfigurationError(
                "secrets= needs execution_role_arn: ECS reads the secrets with the execution role")
        container["secrets"] = secret_list
    properties: Dict[str, Any] = {
        "type": "container",
        "containerProperties": container,
        "platformCapabilities": [platform],
        "propagateTags": True,
        "tags": dict([MANAGED_TAG]),
    }
    if nodes > 1:
        if platform == "FARGATE":
            raise ConfigurationError("multi-node parallel jobs (nodes > 1) run on EC2 only, not Fargate")
        del properties["containerProperties"]
        properties["type"] = "multinode"
        properties["nodeProperties"] = {
            "numNodes": int(nodes), "mainNode": 0,
            "nodeRangeProperties": [{"targetNodes": "0:", "container": container}],
        }
    return properties


def _secret_list(secrets: Iterable[Tuple[str, str]]) -> List[Dict[str, str]]:
    pairs = dict(secrets.items() if isinstance(secrets, Mapping) else secrets)
    return [{"name": name, "valueFrom": pairs[name]} for name in sorted(pairs)]


def definition_name(properties: Dict[str, Any], stack: Optional[str] = None) -> str:
    """``batchfutures-<hash>``, or ``<stack>_<hash>`` for a stack's clients: the template's client
    policy may register and submit only ``<stack>_*`` (a stack name has no "_")."""
    digest = hashlib.sha256(json.dumps(properties, sort_keys=True).encode()).hexdigest()
    return f"{stack}_{digest[:24]}" if stack else f"batchfutures-{digest[:24]}"


def ensure_job_definition(batch: batchapi.BatchAPI, image: Optional[str], *, stack: Optional[str] = None,
                          **options: Any) -> str:
    """The ARN of an ACTIVE definition for this content, registered only if none exists."""
    return _ensure(batch, definition_properties(image or "", **options), stack)


def stack_log_group(stack: str) -> str:
    """The stack's log group: the template's LogGroup, the one its roles may write to."""
    return f"/aws/batch/{stack}"


def with_stack_defaults(properties: Dict[str, Any], stack: Optional[str],
                        region: Optional[str] = None) -> Dict[str, Any]:
    """``properties`` as a stack's client registers them: tagged ``batchfutures:stack=<stack>``
    and, in every container without one, the awslogs configuration of the stack's log group.

    The stack's client policy allows RegisterJobDefinition only so: a request that carries tags
    is also authorized as batch:TagResource, which the policy allows only with that tag; and
    its batch:AWSLogsGroup must be the stack's group. Without a logConfiguration Batch logs to
    /aws/batch/job, where the stack's execution role (Fargate writes logs with it) may not.
    Without ``stack``: ``properties`` unchanged.
    """
    if not stack:
        return properties
    made = copy.deepcopy(properties)
    made["tags"] = {**(made.get("tags") or {}), STACK_TAG: stack}
    options = {"awslogs-group": stack_log_group(stack)}
    if region:
        options["awslogs-region"] = region
    groups = (made.get("nodeProperties") or {}).get("nodeRangeProperties") or []
    containers = [made["containerProperties"]] if made.get("containerProperties") else [
        group["container"] for group in groups if group.get("container")]
    for container in containers:
        container.setdefault("logConfiguration", {"logDriver": "awslogs", "options": options})
        if "FARGATE" not in (made.get("platformCapabilities") or ["EC2"]):
            envarchive.with_host_cache(container)  # the stack's EC2 hosts' environment cache
    return made


def _region_of(batch: batchapi.BatchAPI) -> Optional[str]:
    return getattr(getattr(batch, "meta", None), "region_name", None)


def _ensure(batch: batchapi.BatchAPI, properties: Dict[str, Any], stack: Optional[str] = None) -> str:
    properties = with_stack_defaults(properties, stack, _region_of(batch))
    name = definition_name(properties, stack)
    found = _latest_active(batch, name)
    if found is not None:
        return found["jobDefinitionArn"]
    response = batchapi.call(batch.register_job_definition, jobDefinitionName=name, **properties)
    return response["jobDefinitionArn"]


def split_reference(reference: str) -> Tuple[str, Optional[int]]:
    """(name, revision or None) of "name", "name:3", or an ARN with or without ":3"."""
    text = reference.strip()
    if text.startswith("arn:"):
        _, sep, text = text.partition(":job-definition/")
        if not sep or not text:
            raise ConfigurationError(f"{reference!r} is not a job definition ARN "
                                     f"(arn:aws:batch:REGION:ACCOUNT:job-definition/NAME[:REVISION])")
    name, sep, revision = text.partition(":")
    if not name or (sep and not revision.isdigit()):
        raise ConfigurationError(f"{reference!r} is not a job definition name[:revision] or ARN")
    return name, int(revision) if sep else None


def describe_job_definition(batch: batchapi.BatchAPI, reference: str) -> Optional[Dict[str, Any]]:
    """The job definition a name or ARN means, as Batch does for SubmitJob; None if there is none.

    With a revision, that revision (whatever its status). Without one, the highest ACTIVE
    revision of that name: DescribeJobDefinitions' jobDefinitions= takes only name:revision or a
    full ARN with its revision, so a bare name or ARN is looked up by name.
    """
    name, revision = split_reference(reference)
    if revision is None:
        return _latest_active(batch, name)
    target = reference if reference.startswith("arn:") else f"{name}:{revision}"
    response = batchapi.call(batch.describe_job_definitions, jobDefinitions=[target])
    found = [d for d in response.get("jobDefinitions") or [] if d.get("revision") == revision]
    return found[0] if found else None


def _latest_active(batch: batchapi.BatchAPI, name: str) -> Optional[Dict[str, Any]]:
    best: Optional[Dict[str, Any]] = None
    # a name can have more revisions than one page holds (bounded: batchapi.paginate)
    for response in batchapi.paginate(batch.describe_job_definitions, jobDefinitionName=name,
                                      status="ACTIVE"):
        for definition in response.get("jobDefinitions") or []:
            if definition.get("status", "ACTIVE") == "ACTIVE" and (
                    best is None or definition.get("revision", 0) > best.get("revision", 0)):
                best = definition
    return best


# What RegisterJobDefinition takes of a described definition (the rest is Batch's bookkeeping).
_REGISTERED_FIELDS = ("type", "parameters", "schedulingPriority", "containerProperties",
                      "nodeProperties", "retryStrategy", "propagateTags", "timeout", "tags",
                      "platformCapabilities", "eksProperties", "ecsProperties",
                      "consumableResourceProperties")


# definition_with_secrets' answers per Batch client: content-addressed, so they never go stale
_derived: "weakref.WeakKeyDictionary[Any, Dict[Tuple[str, str, str], str]]" = weakref.WeakKeyDictionary()
_derived_lock = threading.Lock()


def definition_with_secrets(batch: batchapi.BatchAPI, definition: str,
                            secrets: Iterable[Tuple[str, str]], stack: Optional[str] = None) -> str:
    """The ARN of ``definition`` (a name or ARN) with the container's ``secrets`` added.

    SubmitJob's containerOverrides cannot carry secrets, so they must be in the job definition:
    this registers a copy of it whose containers (every node group's, for a multi-node
    definition) also get ``secrets`` (name -> Secrets Manager or SSM parameter ARN; a name the
    definition already maps is replaced), named ``batchfutures-<hash of the content>`` and
    registered once (``<stack>_<hash>`` when ``stack`` is given, as for ensure_job_definition):
    the same definition and secrets give the same ARN again. With no secrets it
    returns ``definition`` itself. The copy keeps the definition's execution role, which ECS uses
    to read the secrets (it needs secretsmanager:GetSecretValue or ssm:GetParameters on them).
    The answer is kept per Batch client, so later calls with the same arguments send nothing
    (a definition named without a revision is looked up once per client).
    """
    added = _secret_list(secrets)
    if not added:
        return definition
    key = (definition, json.dumps(added), stack or "")
    with _derived_lock:
        known = _derived.get(batch, {}).get(key)
    if known is not None:
        return known
    arn = _register_with_secrets(batch, definition, added, stack)
    with _derived_lock:
        _derived.setdefault(batch, {})[key] = arn
    return arn


def _register_with_secrets(batch: batchapi.BatchAPI, definition: str, added: List[Dict[str, str]],
                           stack: Optional[str] = None) -> str:
    described = describe_job_definition(batch, definition)
    if described is None:
        raise ConfigurationError(f"job definition {definition} does not exist or has no ACTIVE revision")
    properties = {key: copy.deepcopy(described[key]) for key in _REGISTERED_FIELDS
                  if described.get(key) not in (None, {}, [])}
    containers = [properties["containerProperties"]] if "containerProperties" in properties else [
        group["container"] for group in (properties.get("nodeProperties") or {}).get(
            "nodeRangeProperties", []) if group.get("container")]
    if not containers:
        raise ConfigurationError(
            f"job definition {definition} has no container properties to add secrets to")
    names = {secret["name"] for secret in added}
    for container in containers:
        if not container.get("executionRoleArn"):
            raise ConfigurationError(
                f"secrets= needs an execution role on job definition {definition}: ECS reads the "
                f"secrets with it (the batchfutures template's definitions have one)")
        kept = [s for s in container.get("secrets") or [] if s.get("name") not in names]
        container["secrets"] = sorted(kept + added, key=lambda s: s["name"])
    # tags starting with aws: (CloudFormation's, for one) are AWS's to set, not ours
    tags = {k: v for k, v in (properties.get("tags") or {}).items() if not k.lower().startswith("aws:")}
    properties["tags"] = dict(tags, **dict([MANAGED_TAG]))
    return _ensure(batch, properties, stack)


# multinode_definition_from's answers per Batch client (content-addressed, as _derived's)
_multinode: "weakref.WeakKeyDictionary[Any, Dict[Tuple[str, str], str]]" = weakref.WeakKeyDictionary()


def multinode_definition_from(batch: batchapi.BatchAPI, definition: str, stack: Optional[str] = None) -> str:
    """A definition SubmitJob accepts nodeOverrides for: ``definition`` itself when it is a
    multinode one, else the ARN of a multinode copy of it (its container on every node, node 0
    the main node; SubmitJob's numNodes sets the count), registered once per content as
    ``<stack>_<hash>`` or ``batchfutures-<hash>``. The answer is kept per Batch client."""
    key = (definition, stack or "")
    with _derived_lock:
        known = _multinode.get(batch, {}).get(key)
    if known is not None:
        return known
    described = describe_job_definition(batch, definition)
    if described is None:
        raise ConfigurationError(f"job definition {definition} does not exist or has no ACTIVE revision")
    if described.get("type") == "multinode":
        arn = definition
    else:
        if definition_platform(described) == "FARGATE":
            raise ConfigurationError(
                f"nodes > 1: job definition {definition} is a Fargate one, and multi-node "
                f"parallel jobs run on EC2 only")
        container = copy.deepcopy(described.get("containerProperties") or {})
        if not container:
            raise ConfigurationError(f"job definition {definition} has no container to run on nodes")
        properties = {name: copy.deepcopy(described[name]) for name in _REGISTERED_FIELDS
                      if described.get(name) not in (None, {}, [])
                      and name not in ("containerProperties", "type")}
        properties["type"] = "multinode"
        properties["platformCapabilities"] = ["EC2"]
        # numNodes is SubmitJob's (nodeOverrides); "0:" covers every node of any count
        properties["nodeProperties"] = {"numNodes": 2, "mainNode": 0, "nodeRangeProperties": [
            {"targetNodes": "0:", "container": container}]}
        tags = {k: v for k, v in (properties.get("tags") or {}).items()
                if not k.lower().startswith("aws:")}  # AWS's own, not ours to set
        tags.update(dict([MANAGED_TAG]))
        properties["tags"] = tags  # and the stack's tag: _ensure (with_stack_defaults)
        arn = _ensure(batch, properties, stack)
    with _derived_lock:
        _multinode.setdefault(batch, {})[key] = arn
    return arn


def definition_platform(definition: Optional[Dict[str, Any]]) -> Optional[str]:
    """"EC2" or "FARGATE" for a described definition (Batch's default is EC2); None if unknown."""
    if definition is None:
        return None
    capabilities = definition.get("platformCapabilities") or ["EC2"]
    return str(capabilities[0]).upper()
