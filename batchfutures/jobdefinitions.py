"""Job definitions registered from an image, named from a hash of their content and reused.

    AWSBatchEnvironment(image=..., job_role_arn=..., mounts=[...]) ──> definition_properties()
        ──> name "batchfutures-<sha256 of the properties>"
        ──> DescribeJobDefinitions(name, ACTIVE): found -> its ARN; else RegisterJobDefinition

Per-job settings (vCPUs, memory, GPUs, timeout, attempts, tags...) never go here: they travel in
SubmitJob overrides, so one definition serves every executor with the same image and options.
Options follow TorchX's AWS Batch scheduler: roles, platform, privileged, ulimits
("name:soft:hard"), mounts ("type=bind,src=..,dst=..[,readonly]", "type=volume,src=<efs id>,
dst=..", "type=device,src=/dev/..[,dst=..][,perm=rwm]"), shared memory and log configuration.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Optional, Sequence

from . import batchapi
from .errors import ConfigurationError

PLATFORMS = ("EC2", "FARGATE")
# Fargate's allowed memory (MiB) for each vCPU value.
FARGATE_MEMORY = {
    0.25: [512, 1024, 2048],
    0.5: list(range(1024, 4097, 1024)),
    1: list(range(2048, 8193, 1024)),
    2: list(range(4096, 16385, 1024)),
    4: list(range(8192, 30721, 1024)),
    8: list(range(16384, 61441, 4096)),
    16: list(range(32768, 122881, 8192)),
}


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
                          vcpus: float = 1, memory: int = 2048) -> Dict[str, Any]:
    """The RegisterJobDefinition request for an image and options (without its name)."""
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
    return {
        "type": "container",
        "containerProperties": container,
        "platformCapabilities": [platform],
        "propagateTags": True,
        "tags": {"batchfutures:managed": "true"},
    }


def definition_name(properties: Dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(properties, sort_keys=True).encode()).hexdigest()
    return f"batchfutures-{digest[:24]}"


def ensure_job_definition(batch: Any, image: Optional[str], **options: Any) -> str:
    """The ARN of an ACTIVE definition for this content, registered only if none exists."""
    properties = definition_properties(image or "", **options)
    name = definition_name(properties)
    found = batchapi.call(batch.describe_job_definitions, jobDefinitionName=name, status="ACTIVE")
    definitions = sorted(found.get("jobDefinitions") or [], key=lambda d: d.get("revision", 0))
    if definitions:
        return definitions[-1]["jobDefinitionArn"]
    response = batchapi.call(batch.register_job_definition, jobDefinitionName=name, **properties)
    return response["jobDefinitionArn"]
