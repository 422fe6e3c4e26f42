"""Environments: where jobs run and where their payloads live.

An environment hands the executor four things, and the executor's code path is the same for all:

    batch    an object with the boto3 `batch` client's methods (the emulator, or boto3's client)
    logs     an object with CloudWatch Logs' `get_log_events` (the emulator's, or boto3's)
    storage  a `Storage` over one root URL (file:// locally, s3://bucket/prefix on AWS)
    job_queue, job_definition, worker_command(job_url), log_group

`LocalEnvironment` wires the embedded emulator and local storage; `AWSBatchEnvironment` wires
boto3 clients and s3fs. `resolve_environment` turns what a user passes (None, a mapping, an
environment) into one of them.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from . import batchapi, signing
from .errors import ConfigurationError
from .settings import JobSettings
from .storage import Storage

__all__ = ["Environment", "LocalEnvironment", "AWSBatchEnvironment", "resolve_environment",
           "default_workdir"]

LOG_GROUP = "/aws/batch/job"
# Options of a job definition registered from `image=` (see jobdefinitions.definition_properties).
DEFINITION_OPTIONS = ("job_role_arn", "execution_role_arn", "platform", "privileged", "ulimits",
                      "mounts", "shm_size", "log_configuration")
ENV_VARS = {
    "job_queue": "BATCHFUTURES_JOB_QUEUE",
    "job_definition": "BATCHFUTURES_JOB_DEFINITION",
    "io_bucket": "BATCHFUTURES_IO_BUCKET",
    "io_prefix": "BATCHFUTURES_IO_PREFIX",
    "image": "BATCHFUTURES_IMAGE",
}


def default_workdir() -> Path:
    """A per-user cache folder: $BATCHFUTURES_WORKDIR, else $XDG_CACHE_HOME/batchfutures."""
    explicit = os.environ.get("BATCHFUTURES_WORKDIR")
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "batchfutures"


class Environment:
    """What every environment shares: queue checks and job-definition reads through the Batch API."""

    job_queue: str
    log_group: str = LOG_GROUP
    poll_intervals: Tuple[float, float] = (1.0, 10.0)
    describe_grace: float = 60.0  # DescribeJobs may miss a job this long after SubmitJob

    def __init__(self) -> None:
        self._definition_memory: Optional[int] = None
        self._definition_read = False
        self._lock = threading.Lock()

    # the parts each environment provides
    @property
    def batch(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def logs(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def storage(self) -> Storage:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def job_definition(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def worker_command(self, job_url: str) -> List[str]:
        return ["python", "-m", "batchfutures.worker", job_url]

    def validate_settings(self, settings: JobSettings) -> None:
        """Refuse settings this environment cannot run (before anything is uploaded)."""

    # shared behaviour
    def check_queue(self) -> None:
        """The queue must exist, be ENABLED and VALID; say which and why otherwise."""
        try:
            response = batchapi.call(self.batch.describe_job_queues, jobQueues=[self.job_queue])
        except Exception as error:
            raise ConfigurationError(f"cannot read job queue {self.job_queue!r}: {error}") from error
        queues = response.get("jobQueues") or []
        if not queues:
            raise ConfigurationError(f"job queue {self.job_queue!r} does not exist")
        queue = queues[0]
        state, status = queue.get("state"), queue.get("status")
        if state != "ENABLED" or status not in ("VALID", "UPDATING"):
            reason = queue.get("statusReason")
            raise ConfigurationError(
                f"job queue {self.job_queue!r} is {state} and {status}"
                + (f" ({reason})" if reason else "") + ": it cannot take jobs")

    def definition_memory(self) -> Optional[int]:
        """MEMORY of the job definition (MiB), read once; None when it sets none."""
        with self._lock:
            if self._definition_read:
                return self._definition_memory
        memory = None
        try:
            definition = self._describe_definition()
        except Exception:  # the default memory then ignores the definition; SubmitJob still checks
            definition = None
        if definition:
            props = definition.get("containerProperties") or {}
            for requirement in props.get("resourceRequirements") or []:
                if requirement.get("type") == "MEMORY":
                    memory = int(float(requirement["value"]))
            memory = memory or props.get("memory")
        with self._lock:
            self._definition_memory, self._definition_read = memory, True
        return memory

    def _describe_definition(self) -> Optional[Dict[str, Any]]:
        name = self.job_definition
        if name.startswith("arn:") or ":" in name:
            response = batchapi.call(self.batch.describe_job_definitions, jobDefinitions=[name])
        else:
            response = batchapi.call(self.batch.describe_job_definitions, jobDefinitionName=name,
                                     status="ACTIVE")
        definitions = sorted(response.get("jobDefinitions") or [], key=lambda d: d.get("revision", 0))
        return definitions[-1] if definitions else None


class LocalEnvironment(Environment):
    """The embedded default: the Batch emulator running jobs as local processes, storage on disk.

    `max_vcpus` (default: the CPU count) bounds the vCPUs of jobs running at once, `gpus` (default:
    the machine's NVIDIA GPUs, detected) is what jobs can ask for, `metadata_ttl` is how long a
    finished job stays describable. Each attempt runs in the container's world (see
    docs/emulator.md): the interpreter's own import path, a fresh working directory, only the job's
    environment. `inherit_client_path=True` is the explicit way back for quick local iteration:
    attempts then get this process's sys.path on their PYTHONPATH and its working directory, so
    functions of modules that exist only here import by reference; a container on AWS has neither.
    Settings of one emulator folder are those of the first environment that started it.
    """

    job_queue = "batchfutures"
    poll_intervals = (0.02, 0.5)  # the emulator also wakes the poller on every change
    describe_grace = 5.0

    def __init__(self, workdir: Union[str, os.PathLike, None] = None, *,
                 max_vcpus: Optional[float] = None, gpus: Optional[int] = None,
                 metadata_ttl: float = 86400, inherit_client_path: bool = False) -> None:
        super().__init__()
        if max_vcpus is not None and (isinstance(max_vcpus, bool) or not max_vcpus > 0):
            raise ConfigurationError(f"max_vcpus={max_vcpus!r} must be positive")
        if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0):
            raise ConfigurationError(f"gpus={gpus!r} must be a whole number >= 0")
        if not metadata_ttl > 0:
            raise ConfigurationError(f"metadata_ttl={metadata_ttl!r} must be positive")
        self.workdir = Path(workdir).expanduser() if workdir is not None else default_workdir()
        self.workdir = self.workdir.resolve()
        self.max_vcpus = max_vcpus
        self._gpus = gpus
        self._gpus_given = gpus is not None
        self.metadata_ttl = metadata_ttl
        self.inherit_client_path = bool(inherit_client_path)
        self._emulator: Any = None
        self._storage: Optional[Storage] = None

    @property
    def gpus(self) -> int:
        """GPUs jobs may use: as given, else the machine's (detected once)."""
        if self._gpus is None:
            from .emulator.host import gpu_count

            self._gpus = gpu_count()
        return self._gpus

    @property
    def emulator(self) -> Any:
        if self._emulator is None:
            from .emulator import BatchEmulator  # the emulator starts threads: only when used

            with self._lock:
                if self._emulator is None:
                    self._emulator = BatchEmulator.shared(
                        self.workdir / "emulator", max_vcpus=self.max_vcpus, gpus=self.gpus,
                        metadata_ttl=self.metadata_ttl,
                        inherit_client_path=self.inherit_client_path)
        return self._emulator

    @property
    def batch(self) -> Any:
        return self.emulator

    @property
    def logs(self) -> Any:
        return self.emulator.logs

    @property
    def storage(self) -> Storage:
        if self._storage is None:
            self._storage = Storage((self.workdir / "storage").as_uri(),
                                    signer=signing.local_signer(self.workdir))
        return self._storage

    @property
    def job_definition(self) -> str:
        return "batchfutures-worker"

    def validate_settings(self, settings: JobSettings) -> None:
        """Refuse a job this machine can never place (it would wait RUNNABLE forever)."""
        from .emulator import host

        vcpus = self.max_vcpus if self.max_vcpus is not None else host.cpu_count()
        if settings.vcpus > vcpus:
            raise ConfigurationError(
                f"vcpus={settings.vcpus:g} can never run here: this LocalEnvironment runs at most "
                f"{vcpus:g} vCPUs at once (max_vcpus={self.max_vcpus!r}; the machine has "
                f"{host.cpu_count()} CPUs)")
        if settings.gpus > self.gpus:
            raise ConfigurationError(
                f"gpus={settings.gpus} can never run here: this LocalEnvironment has "
                f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"
                + (" (none detected; pass gpus= to LocalEnvironment to say otherwise)"
                   if not self._gpus_given else ""))
        memory = host.memory_mib()
        wanted = settings.memory_mib(self.definition_memory())
        if memory is not None and wanted > memory:
            raise ConfigurationError(
                f"memory={wanted} MiB can never run here: this machine has {memory} MiB")

    def subscribe(self, callback: Callable[[], None]) -> None:
        self.emulator.add_listener(callback)

    def __repr__(self) -> str:
        return (f"LocalEnvironment(workdir={str(self.workdir)!r}, max_vcpus={self.max_vcpus!r}, "
                f"gpus={self._gpus!r})")


class AWSBatchEnvironment(Environment):
    """Real AWS Batch through boto3, payloads in S3 through s3fs."""

    def __init__(self, job_queue: str, io_bucket: str, job_definition: Optional[str] = None, *,
                 io_prefix: str = "batchfutures", image: Optional[str] = None,
                 region_name: Optional[str] = None, profile_name: Optional[str] = None,
                 session: Any = None, **definition_options: Any) -> None:
        super().__init__()
        if not job_queue or not isinstance(job_queue, str):
            raise ConfigurationError("job_queue must name a Batch job queue (name or ARN)")
        if not io_bucket or not isinstance(io_bucket, str):
            raise ConfigurationError("io_bucket must name an S3 bucket")
        if not job_definition and not image:
            raise ConfigurationError("give job_definition (name or ARN) or an image to register one from")
        unknown = set(definition_options) - set(DEFINITION_OPTIONS)
        if unknown:
            raise ConfigurationError(
                f"unknown AWSBatchEnvironment option(s) {sorted(unknown)}; job definition options "
                f"are {', '.join(DEFINITION_OPTIONS)}")
        bucket = io_bucket[5:] if io_bucket.startswith("s3://") else io_bucket
        self.job_queue = job_queue
        self.io_bucket = bucket.strip("/")
        self.io_prefix = (io_prefix or "").strip("/")
        self.image = image
        self.definition_options = definition_options
        self._given_definition = job_definition
        self._registered_definition: Optional[str] = None
        import boto3  # boto3 is heavy to import; only the AWS path needs it

        self.session = session or boto3.session.Session(profile_name=profile_name,
                                                        region_name=region_name)
        self.profile_name = profile_name
        self.region_name = region_name or self.session.region_name
        self._batch: Any = None
        self._logs: Any = None
        self._storage: Optional[Storage] = None

    def _client(self, service: str) -> Any:
        from botocore.config import Config

        config = Config(retries={"mode": "standard", "max_attempts": 8})
        return self.session.client(service, region_name=self.region_name, config=config)

    @property
    def batch(self) -> Any:
        if self._batch is None:
            self._batch = self._client("batch")
        return self._batch

    @property
    def logs(self) -> Any:
        if self._logs is None:
            self._logs = self._client("logs")
        return self._logs

    @property
    def storage(self) -> Storage:
        if self._storage is None:
            root = f"s3://{self.io_bucket}" + (f"/{self.io_prefix}" if self.io_prefix else "")
            self._storage = Storage(root, storage_options=self._s3_options(),
                                    signer=signing.aws_signer(self))
        return self._storage

    def _s3_options(self) -> Dict[str, Any]:
        options: Dict[str, Any] = {}
        client_kwargs: Dict[str, Any] = {}
        if self.region_name:
            client_kwargs["region_name"] = self.region_name
        if self.profile_name:
            options["profile"] = self.profile_name
        elif self.session is not None:
            credentials = self.session.get_credentials()
            if credentials is not None:
                frozen = credentials.get_frozen_credentials()
                options.update(key=frozen.access_key, secret=frozen.secret_key)
                if frozen.token:
                    options["token"] = frozen.token
        if client_kwargs:
            options["client_kwargs"] = client_kwargs
        return options

    @property
    def job_definition(self) -> str:
        if self._given_definition:
            return self._given_definition
        if self._registered_definition is None:
            from .jobdefinitions import ensure_job_definition

            with self._lock:
                if self._registered_definition is None:
                    self._registered_definition = ensure_job_definition(
                        self.batch, self.image, **self.definition_options)
        return self._registered_definition

    def validate_settings(self, settings: JobSettings) -> None:
        if settings.timeout is not None and settings.timeout < 60:
            raise ConfigurationError(
                f"timeout={settings.timeout}: AWS Batch requires at least 60 seconds per attempt")
        if str(self.definition_options.get("platform", "EC2")).upper() == "FARGATE":
            from .jobdefinitions import check_fargate

            check_fargate(settings.vcpus, settings.memory_mib(), settings.gpus)

    def __repr__(self) -> str:
        return (f"AWSBatchEnvironment(job_queue={self.job_queue!r}, io_bucket={self.io_bucket!r}, "
                f"job_definition={self._given_definition or self.image!r})")


EnvironmentLike = Union[Environment, Mapping[str, Any], None]


def resolve_environment(env: EnvironmentLike) -> Environment:
    """An environment from what the user passed: itself, a mapping, or None (the process env)."""
    if isinstance(env, Environment):
        return env
    if env is None:
        values = {key: os.environ[var] for key, var in ENV_VARS.items() if os.environ.get(var)}
        if not values:
            return LocalEnvironment()
        return _aws_from_mapping(values, source="the BATCHFUTURES_* environment variables")
    if isinstance(env, Mapping):
        return _aws_from_mapping(dict(env), source="the mapping")
    raise ConfigurationError(
        f"BatchExecutor needs an environment (LocalEnvironment, AWSBatchEnvironment, a mapping "
        f"or None), not {type(env).__name__}")


def _aws_from_mapping(values: Dict[str, Any], *, source: str) -> Environment:
    missing = [key for key in ("job_queue", "io_bucket") if not values.get(key)]
    if missing:
        raise ConfigurationError(f"{source} lacks {', '.join(missing)} for AWS Batch")
    try:
        return AWSBatchEnvironment(**values)
    except TypeError as error:
        raise ConfigurationError(f"{source} has an unknown key: {error}") from error
