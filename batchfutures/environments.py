"""Environments: where jobs run and where their payloads live.

An environment hands the executor four things, and the executor's code path is the same for all:

    batch    an object with the boto3 `batch` client's methods (the emulator, or boto3's client)
    logs     an object with CloudWatch Logs' `get_log_events` (the emulator's, or boto3's)
    storage  a `Storage` over one root URL (file:// locally, s3://bucket/prefix on AWS)
    job_queue, job_definition, worker_command(job_url), log_group

`LocalEnvironment` wires the embedded emulator and local storage. `AWSBatchEnvironment` wires
one boto3 Session (awsclients.AWSClients):

    boto3.Session ──> client("batch"), client("logs"), client("sts"), client(...)  (one lock)
         └─ credentials ──> s3fs (storage_options): the same refreshable credentials, botocore
                            retries off, ExpectedBucketOwner on every request, SSE-KMS on writes

What the user typed is checked when the environment is made (bucket name, queue and definition
names or ARNs, account ids), in the user's words (`BATCHFUTURES_IO_BUCKET` for a variable), and
botocore failures at this boundary become `ConfigurationError`s that say what to do.
`resolve_environment` turns what a user passes (None, a mapping, an environment) into one of them.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
    cast,
    runtime_checkable,
)

from botocore import exceptions as aws

from . import batchapi, jobdefinitions, signing
from .awsclients import (
    CLIENT_CONFIG,
    EXPIRED_TOKEN_CODES,
    KMS_VARIABLE,
    OWNER_VARIABLE,
    AWSClients,
)
from .batchapi import BatchAPI
from .budget import DEFAULT_REQUEST_RATE, RATE_VARIABLE, budgeted_client, parse_rate
from .emulator.runtime import host
from .errors import BatchError, ConfigurationError
from .jobdefinitions import (
    definition_name,
    definition_properties,
    describe_job_definition,
    ensure_job_definition,
    with_stack_defaults,
)
from .jobdetail import resources
from .logs import LogsAPI
from .settings import JobSettings, parse_memory
from .spot import check_fallback
from .storage import Storage
from .workdir import default_workdir, secure_folder

if TYPE_CHECKING:
    from .emulator import BatchEmulator
    from .oomretry import Placement

__all__ = ["Environment", "BaseEnvironment", "LocalEnvironment", "AWSBatchEnvironment", "resolve_environment",
           "default_workdir"]

LOG_GROUP = "/aws/batch/job"
LOCAL_IMAGE = "batchfutures-local"  # the image named in the emulator's multinode definitions
# Options of a job definition registered from `image=` (see jobdefinitions.definition_properties).
DEFINITION_OPTIONS = ("job_role_arn", "execution_role_arn", "platform", "privileged", "ulimits",
                      "mounts", "shm_size", "log_configuration")
# _max_workers on AWS when the queue's compute environments cannot be read: the maxvCpus the
# Batch console proposes for a new compute environment
FALLBACK_MAX_VCPUS = 256.0
logger = logging.getLogger("batchfutures")

ENV_VARS = {
    "job_queue": "BATCHFUTURES_JOB_QUEUE",
    "job_definition": "BATCHFUTURES_JOB_DEFINITION",
    "io_bucket": "BATCHFUTURES_IO_BUCKET",
    "io_prefix": "BATCHFUTURES_IO_PREFIX",
    "image": "BATCHFUTURES_IMAGE",
    "stack": "BATCHFUTURES_STACK",
    "signing_secret": "BATCHFUTURES_SIGNING_SECRET",
}
# The region variables, in the order the AWS CLI v2 and the SDKs' shared settings read them
# (botocore itself reads only AWS_DEFAULT_REGION: Session().region_name ignores AWS_REGION).
REGION_VARIABLES = ("AWS_REGION", "AWS_DEFAULT_REGION")
# a CloudFormation stack name (no "_": the template scopes this stack's definitions to <stack>_*)
STACK_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,127}")
STACK_TAG = "batchfutures:stack"


@runtime_checkable
class Environment(Protocol):
    """The environment seam: every capability the core (the session, submitter, poller, views,
    checks, cleanup, warm pools) asks of an environment, declared. `LocalEnvironment`,
    `AWSBatchEnvironment` (both through `BaseEnvironment`) and `dryrun.DryRunEnvironment`
    implement it; mypy proves each does (`_seams_hold` below, and dryrun.py's), and
    tests/test_seams.py that no `getattr` probe of an environment is left.

    ``isinstance(x, Environment)`` only checks names (and reads each property): to tell an
    environment from a mapping, `resolve_environment` asks `BaseEnvironment`."""

    # -- the parts -------------------------------------------------------------------------
    @property
    def batch(self) -> BatchAPI:
        """The Batch API: the emulator, or boto3's client behind the process's budget."""
        ...

    @property
    def logs(self) -> LogsAPI:
        """CloudWatch Logs' API: the emulator's log service, or boto3's client."""
        ...

    @property
    def storage(self) -> Storage:
        """Where payloads and results live (file:// locally, s3:// on AWS)."""
        ...

    @property
    def job_queue(self) -> str: ...

    @property
    def job_definition(self) -> str:
        """The definition every job of one node uses (registered from ``image=`` on first use)."""
        ...

    @property
    def log_group(self) -> str: ...

    @property
    def poll_intervals(self) -> Tuple[float, float]:
        """The poller's shortest and longest wait between rounds (seconds)."""
        ...

    @property
    def describe_grace(self) -> float:
        """How long DescribeJobs may miss a job after SubmitJob (seconds)."""
        ...

    # -- facts and flags -------------------------------------------------------------------
    @property
    def is_local(self) -> bool:
        """Jobs run on this machine: they end with this process, and `workdir` holds them."""
        ...

    @property
    def workdir(self) -> Optional[Path]:
        """The local workdir (storage, emulator, signing key); None on AWS."""
        ...

    @property
    def gpus(self) -> Optional[int]:
        """The GPUs jobs can use at once; None when the environment cannot say (AWS)."""
        ...

    @property
    def stack(self) -> Optional[str]:
        """The batchfutures CloudFormation stack whose policies the requests must fit; None."""
        ...

    @property
    def fallback_queue(self) -> Optional[str]:
        """The on-demand queue a call Spot reclaimed ``spot_attempts`` times goes to when no
        ``fallback_queue=`` is given (spot.py); None when the environment has none."""
        ...

    @property
    def given_definition(self) -> Optional[str]:
        """The job definition the user named (used as it is), None when it is the library's."""
        ...

    @property
    def image_python(self) -> Optional[str]:
        """The interpreter a local environment's attempts run on (its ``image=``), None where
        the job definition's image decides (AWS) or the attempts run this Python."""
        ...

    @property
    def session(self) -> Any:
        """The boto3 Session the AWS clients come from (boto3 is untyped); None locally."""
        ...

    @property
    def region_name(self) -> Optional[str]: ...

    @property
    def region_source(self) -> str:
        """Where `region_name` came from, in words (`choose_region`); "" locally."""
        ...

    @property
    def signing_secret(self) -> Optional[str]:
        """The Secrets Manager secret of the payload signing key; None."""
        ...

    # -- what it does ----------------------------------------------------------------------
    def worker_command(self, job_url: str) -> List[str]: ...

    def validate_settings(self, settings: JobSettings) -> None:
        """Refuse settings this environment cannot run (before anything is uploaded)."""
        ...

    def max_vcpus_at_once(self) -> float: ...

    def max_memory_mib(self) -> Optional[int]:
        """The most memory (MiB) a job can be placed with; None when unknown."""
        ...

    def job_platform(self) -> Optional[str]:
        """"EC2" or "FARGATE", where the jobs run on AWS; None when unknown (or local)."""
        ...

    def oom_placement(self) -> "Placement":
        """How retry_on_oom sizes a retry here (oomretry.Placement)."""
        ...

    def check_queue(self) -> None: ...

    def definition_memory(self) -> Optional[int]: ...

    def definition_tags(self) -> Dict[str, str]: ...

    def describe_definition(self) -> Optional[Dict[str, Any]]:
        """DescribeJobDefinitions of `job_definition` (highest ACTIVE revision); None: absent."""
        ...

    def multinode_definition(self, nodes: int) -> str:
        """The definition of a ``nodes=N`` job (registered when it is the library's)."""
        ...

    def planned_definition(self, nodes: int = 1) -> str:
        """The definition a job of ``nodes`` would use, named without a request (a dry run's,
        the cache's key)."""
        ...

    def job_tags(self) -> Dict[str, str]:
        """Tags every job must carry (the stack's)."""
        ...

    def worker_environment(self) -> Dict[str, str]:
        """Variables every job needs (the S3 guards on AWS)."""
        ...

    def client(self, service: str) -> Any:
        """boto3's client of an AWS ``service`` (boto3 is untyped); ConfigurationError locally."""
        ...

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when a job changes (the emulator does; AWS says nothing)."""
        ...

    def unsubscribe(self, callback: Callable[[], None]) -> None: ...


class BaseEnvironment:
    """What every environment shares: queue checks and job-definition reads through the Batch
    API, and the defaults of the capabilities an environment may not have (no stack, no AWS
    session, no GPUs known, no change notices)."""

    job_queue: str
    log_group: str = LOG_GROUP
    poll_intervals: Tuple[float, float] = (1.0, 10.0)
    describe_grace: float = 60.0  # DescribeJobs may miss a job this long after SubmitJob
    is_local = False
    workdir: Optional[Path] = None
    stack: Optional[str] = None
    session: Any = None  # a boto3 Session (untyped)
    region_name: Optional[str] = None
    region_source = ""
    signing_secret: Optional[str] = None
    image_python: Optional[str] = None

    def __init__(self) -> None:
        self._definition_memory: Optional[int] = None
        self._definition_tags: Dict[str, str] = {}
        self._definition_read = False
        self._lock = threading.Lock()

    # the parts each environment provides
    @property
    def batch(self) -> BatchAPI:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def logs(self) -> LogsAPI:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def storage(self) -> Storage:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def job_definition(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def gpus(self) -> Optional[int]:
        return None

    @property
    def given_definition(self) -> Optional[str]:
        return None

    def worker_command(self, job_url: str) -> List[str]:
        return ["python", "-m", "batchfutures.worker", job_url]

    def validate_settings(self, settings: JobSettings) -> None:
        """Refuse settings this environment cannot run (before anything is uploaded)."""
        check_fallback(settings.spot_attempts, settings.fallback_queue, self.fallback_queue)

    @property
    def fallback_queue(self) -> Optional[str]:
        return None

    def max_vcpus_at_once(self) -> float:
        """The vCPUs this environment's jobs can use at once (an executor's ``_max_workers``
        divides it by a job's vCPUs)."""
        return float(host.cpu_count())

    def max_memory_mib(self) -> Optional[int]:
        return None

    def job_platform(self) -> Optional[str]:
        return None

    def oom_placement(self) -> "Placement":
        """Sized as on one machine: doubled up to `max_memory_mib` (when known)."""
        # start-up: oomretry costs ~2.5 ms; only retry_on_oom and Fargate's caps need it
        from .oomretry import Placement

        return Placement("LOCAL", self.max_memory_mib())

    def multinode_definition(self, nodes: int) -> str:
        raise ConfigurationError(f"nodes={nodes}: {self!r} cannot run multi-node parallel jobs")

    def planned_definition(self, nodes: int = 1) -> str:
        return self.job_definition if nodes == 1 else self.multinode_definition(nodes)

    def job_tags(self) -> Dict[str, str]:
        return {}

    def worker_environment(self) -> Dict[str, str]:
        return {}

    def client(self, service: str) -> Any:
        raise ConfigurationError(f"{self!r} has no AWS {service} client")

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Nothing to subscribe to: the poller polls."""

    def unsubscribe(self, callback: Callable[[], None]) -> None:
        """Nothing was subscribed."""

    # shared behaviour
    def check_queue(self) -> None:
        """The queue must exist, be ENABLED and VALID; say which and why otherwise."""
        try:
            response = batchapi.call(self.batch.describe_job_queues, jobQueues=[self.job_queue])
        except Exception as error:
            raise ConfigurationError(f"cannot read job queue {self.job_queue!r}: "
                                     f"{explain_aws_error(error)}") from error
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
            definition = self.describe_definition()
        except Exception as error:  # the default memory then ignores the definition
            if batchapi.is_retryable(error):  # throttled or a 5xx: read again next time, not never
                logger.info("batchfutures: the job definition's memory is unread for now (%s)",
                            error)
                return None
            definition = None  # refused or absent: SubmitJob still checks
        tags = dict((definition or {}).get("tags") or {})
        if definition:
            memory = resources(definition.get("containerProperties") or {}).memory_mib
        with self._lock:
            self._definition_memory, self._definition_tags = memory, tags
            self._definition_read = True
        return memory

    def definition_tags(self) -> Dict[str, str]:
        """The job definition's tags (read with its memory, once): they count toward Batch's
        limit of 50 on the job's task."""
        self.definition_memory()
        with self._lock:
            return dict(self._definition_tags)

    def describe_definition(self) -> Optional[Dict[str, Any]]:
        # without a revision: highest ACTIVE
        return describe_job_definition(self.batch, self.job_definition)


class LocalEnvironment(BaseEnvironment):
    """The embedded default: the Batch emulator running jobs as local processes, storage on disk.

    `max_vcpus` (default: the CPU count) bounds the vCPUs of jobs running at once, `gpus` (default:
    the machine's NVIDIA GPUs, detected) is what jobs can ask for, `metadata_ttl` is how long a
    finished job stays describable. Each attempt runs in the container's world (see
    docs/emulator.md): the interpreter's own import path, a fresh working directory, only the job's
    environment. `inherit_client_path=True` is the explicit way back for quick local iteration:
    attempts then get this process's sys.path on their PYTHONPATH and its working directory, so
    functions of modules that exist only here import by reference; a container on AWS has neither.
    `image=PYTHON` (an interpreter's path, e.g. a venv's bin/python holding only the worker's
    dependencies) is the image: attempts run on it instead of this interpreter, so a library
    the client has and that image lacks is missing as on AWS (docs/environments.md).
    Settings of one emulator folder are those of the first environment that started it.
    """

    job_queue = "batchfutures"
    poll_intervals = (0.02, 0.5)  # the emulator also wakes the poller on every change
    describe_grace = 5.0
    is_local = True
    workdir: Path

    def __init__(self, workdir: Union[str, os.PathLike, None] = None, *,
                 max_vcpus: Optional[float] = None, gpus: Optional[int] = None,
                 metadata_ttl: float = 86400, inherit_client_path: bool = False,
                 request_rate: Optional[float] = None,
                 image: Union[str, os.PathLike, None] = None) -> None:
        super().__init__()
        self.image = None if image is None else _interpreter_path(image)
        self.image_python = self.image or sys.executable
        self._image_definition: Optional[str] = None
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
        # no account to share locally: unbudgeted unless asked (budget.py says why)
        self.request_rate = None if request_rate is None else parse_rate(request_rate,
                                                                         "request_rate")
        self._budgeted: Optional[BatchAPI] = None
        self._emulator: Optional["BatchEmulator"] = None
        self._storage: Optional[Storage] = None
        self._multinode: Dict[int, str] = {}
        self._secured = False

    def secure_workdir(self) -> None:
        """The workdir's rules (CONTRACT 9), checked once, when the environment is first used:
        the workdir, storage/, its runs/ and jobs/, and emulator/ are made 0700 or must be real
        folders of this user not writable by group or others, and an existing signing.key must be
        this user's, 0600 and no symlink; ConfigurationError (naming it and the fix) otherwise,
        before anything runs."""
        if self._secured:
            return
        secure_folder(self.workdir, "workdir")
        storage = secure_folder(self.workdir / "storage", "storage folder")
        for name in ("runs", "jobs"):
            secure_folder(storage / name, "storage folder")
        secure_folder(self.workdir / "emulator", "emulator folder")
        key = self.workdir / signing.KEY_FILE_NAME
        if os.path.lexists(key) and not os.environ.get(signing.KEY_VARIABLE):
            signing.read_key_file(key, create=False)  # refuses a symlink, a foreign or open file
        self._secured = True

    @property
    def gpus(self) -> int:
        """GPUs jobs may use: as given, else the machine's (detected once)."""
        if self._gpus is None:
            self._gpus = host.gpu_count()
        return self._gpus

    @property
    def emulator(self) -> "BatchEmulator":
        if self._emulator is None:
            # start-up: the emulator's service (botocore's models, its runtime) costs ~20 ms,
            # which an AWSBatchEnvironment never needs
            from .emulator import BatchEmulator

            self.secure_workdir()
            with self._lock:
                if self._emulator is None:
                    self._emulator = BatchEmulator.shared(
                        self.workdir / "emulator", max_vcpus=self.max_vcpus, gpus=self.gpus,
                        metadata_ttl=self.metadata_ttl,
                        inherit_client_path=self.inherit_client_path)
        return self._emulator

    @property
    def batch(self) -> BatchAPI:
        if self.request_rate is None:
            return self.emulator
        if self._budgeted is None:  # one budget per emulator folder, as one per AWS endpoint
            self._budgeted = budgeted_client(self.emulator, self.request_rate,
                                             key=("local", str(self.workdir / "emulator")))
        return self._budgeted

    @property
    def logs(self) -> LogsAPI:
        return self.emulator.logs

    @property
    def storage(self) -> Storage:
        if self._storage is None:
            self.secure_workdir()
            self._storage = Storage((self.workdir / "storage").as_uri(),
                                    signer=signing.local_signer(self.workdir))
        return self._storage

    @property
    def job_definition(self) -> str:
        """The emulator's own definition; with `image=`, one registered for that interpreter."""
        if self.image is None:
            return "batchfutures-worker"
        if self._image_definition is None:
            batch = self.batch  # before the lock: making the emulator takes it too
            with self._lock:
                if self._image_definition is None:
                    self._image_definition = ensure_job_definition(batch, self.image)
        return self._image_definition

    def multinode_definition(self, nodes: int) -> str:
        """A multinode definition of ``nodes`` nodes running the worker (``nodes=N`` settings):
        registered in the emulator's folder once, found there again (content-addressed)."""
        batch = self.batch  # before the lock: making the emulator takes it too
        with self._lock:
            known = self._multinode.get(nodes)
            if known is None:
                known = self._multinode[nodes] = ensure_job_definition(
                    batch, self.image or LOCAL_IMAGE, nodes=nodes)
        return known

    def planned_definition(self, nodes: int = 1) -> str:
        """The emulator's definition, or the multinode one `multinode_definition` registers
        (named by content), named without a request."""
        if nodes == 1:
            return (self.job_definition if self.image is None else
                    definition_name(definition_properties(self.image)))
        return definition_name(definition_properties(self.image or LOCAL_IMAGE, nodes=nodes))

    def max_memory_mib(self) -> Optional[int]:
        """The most memory a job can be placed with here: the machine's (validate_settings
        refuses more)."""
        return host.memory_mib()

    def validate_settings(self, settings: JobSettings) -> None:
        """Refuse a job this machine can never place (it would wait RUNNABLE forever)."""
        super().validate_settings(settings)  # spot_attempts needs a fallback queue
        if self._emulator is not None and not self._emulator.launcher.in_processes:
            # an emulator made with launcher="threads" (a test's, a benchmark's): image= and
            # requirements= cannot apply in a thread of this process
            # start-up: as the emulator property's (the emulator package loads its service)
            from .emulator.runtime.threads import threads_refusal

            refusal = threads_refusal(self.image, settings.requirements is not None,
                                      sys.executable)
            if refusal is not None:
                raise ConfigurationError(refusal)
        vcpus = self.max_vcpus if self.max_vcpus is not None else host.cpu_count()
        if settings.nodes > 1 and settings.nodes * settings.vcpus > vcpus:  # all nodes at once
            raise ConfigurationError(
                f"nodes={settings.nodes} of vcpus={settings.vcpus:g} can never run here: the "
                f"nodes of a multi-node job run at once and this LocalEnvironment runs at most "
                f"{vcpus:g} vCPUs at once (max_vcpus={self.max_vcpus!r})")
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

    def max_vcpus_at_once(self) -> float:
        """``max_vcpus``, or the machine's CPUs."""
        return float(self.max_vcpus if self.max_vcpus is not None else host.cpu_count())

    def subscribe(self, callback: Callable[[], None]) -> None:
        self.emulator.add_listener(callback)

    def unsubscribe(self, callback: Callable[[], None]) -> None:
        self.emulator.remove_listener(callback)

    def __repr__(self) -> str:
        return (f"LocalEnvironment(workdir={str(self.workdir)!r}, max_vcpus={self.max_vcpus!r}, "
                f"gpus={self._gpus!r}" + (f", image={self.image!r})" if self.image else ")"))


def _interpreter_path(image: Union[str, os.PathLike]) -> str:
    """`LocalEnvironment(image=)`: an interpreter's path, made absolute but never resolved (a
    venv's bin/python links to the interpreter it was made from; resolved, it is not the venv)."""
    path = os.path.abspath(os.fspath(image))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise ConfigurationError(
            f"image={os.fspath(image)!r}: a LocalEnvironment's image is a Python interpreter's "
            f"path (e.g. a venv's bin/python), and no executable file is there")
    return path


class AWSBatchEnvironment(BaseEnvironment):
    """Real AWS Batch through boto3, payloads in S3 through s3fs, all from one boto3 Session.

    ``signing_secret``: the Secrets Manager secret (ARN, or name) of the payload signing key
    (see the signing module; ``BATCHFUTURES_SIGNING_SECRET``). ``kms_key_id``: SSE-KMS with
    this key on every object written. ``expected_bucket_owner``: the account that must own
    ``io_bucket`` (every S3 request carries it); by default the caller's own account, looked up
    once with STS GetCallerIdentity on the first S3 request. The region: ``region_name=``, else
    ``choose_region``'s order (AWS_REGION or AWS_DEFAULT_REGION, the config file, the queue
    ARN's region); ``region_source`` says which.
    ``stack``: the name of the batchfutures CloudFormation stack (its ``Stack`` output,
    ``BATCHFUTURES_STACK``): definitions registered from ``image=`` are named
    ``<stack>_<hash>`` and every job is tagged ``batchfutures:stack=<stack>`` (``job_tags()``),
    which is what the stack's client policy allows.
    ``request_rate``: Batch requests a second this process may send (``BATCHFUTURES_REQUEST_RATE``;
    default 20 of the account's 50), one budget for every environment of the process on the
    same endpoint and Region (budget.py).
    """

    def __init__(self, job_queue: str, io_bucket: str, job_definition: Optional[str] = None, *,
                 io_prefix: str = "batchfutures", image: Optional[str] = None,
                 region_name: Optional[str] = None, profile_name: Optional[str] = None,
                 session: Any = None, signing_secret: Optional[str] = None,
                 kms_key_id: Optional[str] = None, expected_bucket_owner: Optional[str] = None,
                 stack: Optional[str] = None, max_memory: Union[int, str, None] = None,
                 request_rate: Union[float, str, None] = None,
                 **definition_options: Any) -> None:
        super().__init__()
        unknown = set(definition_options) - set(DEFINITION_OPTIONS)
        if unknown:
            raise ConfigurationError(
                f"unknown AWSBatchEnvironment option(s) {sorted(unknown)}; job definition options "
                f"are {', '.join(DEFINITION_OPTIONS)}")
        self.job_queue = check_job_queue(job_queue)
        self.io_bucket = check_bucket_name(io_bucket)
        if not job_definition and not image:
            raise ConfigurationError("give job_definition (name or ARN) or an image to register one from")
        if job_definition:
            check_job_definition(job_definition)
        self.io_prefix = (io_prefix or "").strip("/")
        self.image = image
        self.definition_options = definition_options
        self._fargate_cap: Optional[float] = None  # fargate_vcpu_cap(), read once
        self._fargate_cap_read = False
        self.signing_secret = check_signing_secret(signing_secret)
        self.kms_key_id = _optional_text(kms_key_id, "kms_key_id")
        if expected_bucket_owner is not None and not ACCOUNT_ID.fullmatch(str(expected_bucket_owner)):
            raise ConfigurationError(
                f"expected_bucket_owner={expected_bucket_owner!r} must be a 12-digit AWS account id")
        self._expected_bucket_owner = expected_bucket_owner
        if stack is not None and not (isinstance(stack, str) and STACK_NAME.fullmatch(stack)):
            raise ConfigurationError(f"stack={stack!r} is not a CloudFormation stack name")
        self.stack = stack
        self.max_memory = _max_memory(max_memory)
        self._placement: Optional["Placement"] = None  # learned once
        self._owner_lock = threading.Lock()
        self._given_definition = job_definition
        self._registered_definition: Optional[str] = None
        self._multinode: Dict[int, str] = {}
        # start-up: boto3 costs ~70 ms, which the emulator's path never needs
        import boto3

        try:
            self.session = session or boto3.session.Session(profile_name=profile_name,
                                                            region_name=region_name)
        except aws.ProfileNotFound as error:
            raise ConfigurationError(
                f"AWS profile {profile_name!r} is not configured: run `aws configure --profile "
                f"{profile_name}` or pass another profile_name") from error
        self.profile_name = profile_name
        self.region_name, self.region_source = choose_region(
            region_name, session.region_name if session is not None else None, os.environ,
            self.session.region_name, self.job_queue)
        conflict = queue_region_conflict(self.region_name, self.region_source, self.job_queue)
        if conflict:
            raise ConfigurationError(conflict)
        self._clients = AWSClients(self.session, self.region_name)
        self._storage: Optional[Storage] = None
        # this process's share of the account's Batch budget (budget.py)
        if request_rate is None and os.environ.get(RATE_VARIABLE):
            self.request_rate = parse_rate(os.environ[RATE_VARIABLE], RATE_VARIABLE)
        else:
            self.request_rate = parse_rate(
                DEFAULT_REQUEST_RATE if request_rate is None else request_rate, "request_rate")
        self._budgeted: Optional[BatchAPI] = None

    # -- clients -----------------------------------------------------------------------------
    def client(self, service: str) -> Any:
        """The boto3 client of ``service`` ("batch", "logs", "secretsmanager", "sts", ...).

        Made once per environment from its one boto3 Session, under a lock. Its botocore retries
        are off: call it through ``batchapi.call(client.method, **params)``, which holds the one
        retry budget per call.
        """
        try:
            return self._clients.client(service)
        except Exception as error:
            raise ConfigurationError(f"cannot make the AWS {service} client: "
                                     f"{explain_aws_error(error)}") from error

    @property
    def batch(self) -> BatchAPI:
        """The Batch client behind the process's request budget for its endpoint and Region
        (`budget.budgeted_client`): every Batch request of the process passes it."""
        if self._budgeted is None:
            # boto3's clients are untyped: the one place its Batch client is taken as the seam
            self._budgeted = budgeted_client(cast(BatchAPI, self.client("batch")),
                                             self.request_rate)
        return self._budgeted

    @property
    def logs(self) -> LogsAPI:
        # boto3's clients are untyped: the one place its Logs client is taken as the seam
        return cast(LogsAPI, self.client("logs"))

    @property
    def given_definition(self) -> Optional[str]:
        """``job_definition=`` as given (None: registered from ``image=``)."""
        return self._given_definition

    @property
    def expected_bucket_owner(self) -> str:
        """The account that must own the bucket: as given, else the caller's (STS, once)."""
        if self._expected_bucket_owner is None:
            with self._owner_lock:
                if self._expected_bucket_owner is None:
                    try:
                        identity = batchapi.call(self.client("sts").get_caller_identity)
                    except ConfigurationError:
                        raise
                    except Exception as error:
                        raise ConfigurationError(
                            f"cannot learn which AWS account these credentials belong to (STS "
                            f"GetCallerIdentity: {explain_aws_error(error)}); pass "
                            f"expected_bucket_owner=<account id of {self.io_bucket}>") from error
                    self._expected_bucket_owner = str(identity["Account"])
        return self._expected_bucket_owner

    # -- storage -----------------------------------------------------------------------------
    @property
    def storage(self) -> Storage:
        if self._storage is None:
            root = f"s3://{self.io_bucket}" + (f"/{self.io_prefix}" if self.io_prefix else "")
            with self._lock:
                if self._storage is None:
                    self._storage = Storage(root, storage_options=self.storage_options(),
                                            signer=signing.aws_signer(self))
        return self._storage

    def storage_options(self) -> Dict[str, Any]:
        """s3fs options: this session's credentials, one retry layer, owner check, SSE-KMS."""
        options: Dict[str, Any] = {
            "session": self._clients.aio_session(expected_owner=lambda: self.expected_bucket_owner),
            "config_kwargs": {"retries": dict(CLIENT_CONFIG["retries"])},
            "retries": 1,  # s3fs's own retry loop: off, storage retries transient errors once over
        }
        if self.region_name:
            options["client_kwargs"] = {"region_name": self.region_name}
        if self.kms_key_id:
            # s3fs passes these to each call whose model has them (PutObject, multipart, copy);
            # a bucket key: KMS is asked once per bucket key, not at every object request
            options["s3_additional_kwargs"] = {"ServerSideEncryption": "aws:kms",
                                               "SSEKMSKeyId": self.kms_key_id,
                                               "BucketKeyEnabled": True}
        return options

    def worker_environment(self) -> Dict[str, str]:
        """Variables a job needs to keep the S3 guards (for its containerOverrides.environment);
        the worker turns them into s3fs options with `awsclients.worker_storage_options`."""
        variables = {OWNER_VARIABLE: self.expected_bucket_owner}
        if self.kms_key_id:
            variables[KMS_VARIABLE] = self.kms_key_id
        return variables

    def job_tags(self) -> Dict[str, str]:
        """Tags every job must carry: ``batchfutures:stack=<stack>`` with ``stack=`` (the
        template's client policy submits, cancels and terminates only jobs with it)."""
        return {STACK_TAG: self.stack} if self.stack else {}

    @property
    def job_definition(self) -> str:
        if self._given_definition:
            return self._given_definition
        if self._registered_definition is None:
            with self._lock:
                if self._registered_definition is None:
                    try:
                        self._registered_definition = ensure_job_definition(
                            self.batch, self.image, stack=self.stack, **self.definition_options)
                    except (BatchError, ValueError):
                        raise
                    except Exception as error:
                        raise ConfigurationError(
                            f"cannot register a job definition for image {self.image!r}: "
                            f"{explain_aws_error(error)}") from error
        return self._registered_definition

    @property
    def fallback_queue(self) -> Optional[str]:
        """The stack's on-demand-only queue, ``<stack>-multinode`` (its one compute environment
        is on-demand EC2 with the instance types of the ``-ec2`` queue's), when the job queue is
        the stack's ``<stack>-ec2`` queue (on demand and Spot); None for any other queue."""
        if not self.stack:
            return None
        head, slash, name = self.job_queue.rpartition("/")
        return f"{head}{slash}{self.stack}-multinode" if name == f"{self.stack}-ec2" else None

    def multinode_definition(self, nodes: int) -> str:
        """The definition of a ``nodes=N`` job: with ``image=``, a multinode one registered from
        it (``type: multinode``, once per content); a given ``job_definition`` is used as it is
        and must itself be a multinode definition (Batch refuses nodeOverrides otherwise)."""
        if self._given_definition:
            return self._given_definition
        batch = self.batch  # before the lock: making the client may take it too
        with self._lock:
            known = self._multinode.get(nodes)
            if known is None:
                try:
                    known = self._multinode[nodes] = ensure_job_definition(
                        batch, self.image, nodes=nodes, stack=self.stack,
                        **self.definition_options)
                except (BatchError, ValueError):
                    raise
                except Exception as error:
                    raise ConfigurationError(
                        f"cannot register a multinode job definition for image {self.image!r}: "
                        f"{explain_aws_error(error)}") from error
        return known

    def planned_definition(self, nodes: int = 1) -> str:
        """The definition `job_definition` or `multinode_definition` would use, named without
        a request: the given one, else the content-addressed name of the one registered from
        ``image=`` (with the stack's defaults, as `jobdefinitions.ensure_job_definition`)."""
        if self._given_definition:
            return self._given_definition
        properties = definition_properties(self.image or "", nodes=nodes, **self.definition_options)
        return definition_name(with_stack_defaults(properties, self.stack, self.region_name),
                               self.stack)

    _queue_vcpus: Optional[float] = None

    def max_vcpus_at_once(self) -> float:
        """The maxvCpus of the queue's compute environments, read once (`queue_max_vcpus`);
        FALLBACK_MAX_VCPUS, logged, when they cannot be read."""
        known = self._queue_vcpus
        if known is None:
            try:
                known = queue_max_vcpus(self.batch, self.job_queue)
            except Exception as error:
                known = FALLBACK_MAX_VCPUS
                logger.warning(
                    "batchfutures: cannot read the maxvCpus of job queue %r's compute "
                    "environments (%s); assuming %g vCPUs. Pass max_workers= to say how many "
                    "calls run at once.", self.job_queue,
                    explain_aws_error(error) if not isinstance(error, BatchError) else error,
                    known)
            self._queue_vcpus = known
        return known

    def job_platform(self) -> Optional[str]:
        """"EC2" or "FARGATE": the ``platform=`` of an ``image=``, else the job definition's
        platformCapabilities (read once); None when it cannot be read."""
        if self.image:
            return str(self.definition_options.get("platform", "EC2")).upper()
        try:
            return jobdefinitions.definition_platform(self.describe_definition())
        except Exception:  # unreadable here: SubmitJob still checks
            return None

    def max_memory_mib(self) -> Optional[int]:
        """The most container memory (MiB) a job of this queue can be placed with:
        ``max_memory=``, else learned once from the queue's compute environments (see
        ``oom_placement``); None when unknown."""
        return self.oom_placement().max_mib

    def oom_placement(self) -> "Placement":
        """How retry_on_oom sizes a retry here (an oomretry.Placement), learned once: the job
        definition's platform, and ``max_memory=`` or what the queue's compute environments can
        place (DescribeJobQueues, DescribeComputeEnvironments, then EC2 DescribeInstanceTypes of
        their instanceTypes). What cannot be read leaves the cap unknown, logged once."""
        from .oomretry import Placement  # start-up: as BaseEnvironment.oom_placement's

        if self._placement is None:
            platform = self.job_platform()
            cap = self.max_memory
            learned_platform: Optional[str] = None
            if cap is None:
                try:
                    learned_platform, cap = queue_max_memory(self.batch, self.job_queue,
                                                             lambda: self.client("ec2"))
                except Exception as error:
                    logger.warning(
                        "batchfutures: cannot learn the most memory job queue %r can place (%s); "
                        "retry_on_oom doubles without a cap (a retry no instance can hold fails "
                        "when Batch says so). Pass max_memory= to AWSBatchEnvironment to say it.",
                        self.job_queue,
                        explain_aws_error(error) if not isinstance(error, BatchError) else error)
            kind = platform or learned_platform or "EC2"
            self._placement = Placement("FARGATE" if kind == "FARGATE" else "EC2", cap)
        return self._placement

    def validate_settings(self, settings: JobSettings) -> None:
        super().validate_settings(settings)  # spot_attempts needs a fallback queue
        if settings.timeout is not None and settings.timeout < 60:
            raise ConfigurationError(
                f"timeout={settings.timeout}: AWS Batch requires at least 60 seconds per attempt")
        platform = str(self.definition_options.get("platform", "EC2")).upper() if self.image else None
        if platform is None and settings.vcpus < 1:
            try:  # under 1 vCPU is a Fargate size: only then is the definition read
                platform = jobdefinitions.definition_platform(self.describe_definition())
            except Exception:  # unreadable here: SubmitJob still checks
                platform = None
        if platform == "FARGATE":
            jobdefinitions.check_fargate(settings.vcpus, settings.memory_mib(), settings.gpus)
            if settings.nodes > 1:
                raise ConfigurationError("nodes > 1: multi-node parallel jobs run on EC2, not Fargate")
            cap = self.fargate_vcpu_cap()
            if cap is not None and settings.vcpus > cap:
                # Batch would hold it RUNNABLE for ever, with no statusReason
                raise ConfigurationError(
                    f"vcpus={settings.vcpus:g} can never run on this queue's Fargate compute "
                    f"environments: one job gets at most {cap:g} vCPUs (the account's Fargate vCPU "
                    f"quota, Service Quotas fargate/L-3032A538 on demand or L-36FBB829 Spot, and "
                    f"the compute environments' maxvCpus). Lower vcpus=, or request a quota "
                    f"increase (docs/aws.md, 'Fargate vCPU quota')")
        elif platform == "EC2":
            jobdefinitions.check_ec2_vcpus(settings.vcpus)

    def fargate_vcpu_cap(self) -> Optional[float]:
        """The most vCPUs one job can get on the queue's Fargate compute environments (their
        maxvCpus and the account's Fargate quota), read once; None when unknown."""
        with self._lock:
            if self._fargate_cap_read:
                return self._fargate_cap
        from . import oomretry  # start-up: as BaseEnvironment.oom_placement's

        try:
            cap = oomretry.learn_fargate_vcpus(self.batch, self.job_queue,
                                               lambda: self.client("service-quotas"))
        except Exception as error:  # unreadable: SubmitJob and the queue still decide
            logger.info("batchfutures: the queue's Fargate vCPU cap is unknown (%s)", error)
            return None
        with self._lock:
            self._fargate_cap, self._fargate_cap_read = cap, True
        return cap

    def __repr__(self) -> str:
        return (f"AWSBatchEnvironment(job_queue={self.job_queue!r}, io_bucket={self.io_bucket!r}, "
                f"job_definition={self._given_definition or self.image!r})")


def queue_compute_environments(batch: BatchAPI, job_queue: str) -> List[Dict[str, Any]]:
    """The compute environments of ``job_queue`` as DescribeComputeEnvironments describes them
    (DescribeJobQueues first); ConfigurationError when the queue or its environments are none."""
    queues = batchapi.call(batch.describe_job_queues, jobQueues=[job_queue]).get("jobQueues")
    if not queues:
        raise ConfigurationError(f"job queue {job_queue!r} does not exist")
    names = [entry["computeEnvironment"]
             for entry in queues[0].get("computeEnvironmentOrder") or []]
    if not names:
        raise ConfigurationError(f"job queue {job_queue!r} has no compute environment")
    return list(batchapi.call(batch.describe_compute_environments,
                              computeEnvironments=names).get("computeEnvironments") or [])


def queue_max_vcpus(batch: BatchAPI, job_queue: str) -> float:
    """The sum of ``maxvCpus`` over the ENABLED compute environments of ``job_queue``
    (DescribeJobQueues, then DescribeComputeEnvironments); ConfigurationError when the queue
    has none that says (an unmanaged compute environment has no maxvCpus)."""
    described = queue_compute_environments(batch, job_queue)
    total = sum(float((environment.get("computeResources") or {}).get("maxvCpus") or 0)
                for environment in described if environment.get("state", "ENABLED") == "ENABLED")
    if total <= 0:
        raise ConfigurationError(f"no ENABLED managed compute environment of job queue "
                                 f"{job_queue!r} has maxvCpus")
    return total


def queue_max_memory(batch: BatchAPI, job_queue: str, ec2: Callable[[], Any]
                     ) -> Tuple[str, Optional[int]]:
    """The platform of ``job_queue``'s compute environments and the most container memory one
    of them can place (oomretry.queue_max_memory_mib; None: some cannot say). ``ec2()``: the EC2
    client, made only when an EC2 compute environment names instance types."""
    # start-up: as BaseEnvironment.oom_placement's
    from .oomretry import instance_type_queries, queue_max_memory_mib

    described = queue_compute_environments(batch, job_queue)

    def installed(instance_types: Sequence[str]) -> Optional[int]:
        exact, families = instance_type_queries(instance_types)
        return instance_memory_mib(ec2(), exact, families)

    return queue_max_memory_mib(described, installed)


def instance_memory_mib(ec2: Any, exact: Tuple[str, ...], families: Tuple[str, ...]
                        ) -> Optional[int]:
    """The largest installed memory (MiB) of these instance types and every size of these
    families (EC2 DescribeInstanceTypes); None when one of them is unknown to EC2."""
    found: Dict[str, int] = {}
    requests: List[Dict[str, Any]] = []
    if exact:
        requests.append({"InstanceTypes": list(exact)})
    if families:
        requests.append({"Filters": [{"Name": "instance-type",
                                      "Values": [f"{family}.*" for family in families]}]})
    for request in requests:
        for page in batchapi.paginate(ec2.describe_instance_types, token_name="NextToken", **request):
            for entry in page.get("InstanceTypes") or []:
                found[str(entry["InstanceType"])] = int(entry["MemoryInfo"]["SizeInMiB"])
    named_families = {name.split(".")[0] for name in found}
    if any(name not in found for name in exact) or any(f not in named_families for f in families):
        return None
    return max(found.values(), default=None)


def _max_memory(value: Union[int, str, None]) -> Optional[int]:
    if value is None:
        return None
    try:
        mib = parse_memory(value)
    except (ConfigurationError, TypeError, ValueError) as error:
        raise ConfigurationError(f"max_memory={value!r}: {error}") from error
    if mib <= 0:
        raise ConfigurationError(f"max_memory={value!r} must be positive")
    return mib


# -- checks of what the user typed ---------------------------------------------------------------
# https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html (general purpose)
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IP_ADDRESS = re.compile(r"\d{1,3}(\.\d{1,3}){3}")
_NAME = r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}"  # job queue and job definition names
JOB_QUEUE_ARN = re.compile(rf"arn:aws[a-z-]*:batch:[a-z0-9-]+:\d{{12}}:job-queue/{_NAME}")
JOB_DEFINITION_ARN = re.compile(rf"arn:aws[a-z-]*:batch:[a-z0-9-]+:\d{{12}}:job-definition/{_NAME}(:\d+)?")
JOB_DEFINITION_NAME = re.compile(rf"{_NAME}(:\d+)?")
ACCOUNT_ID = re.compile(r"\d{12}")


def check_bucket_name(value: Any, label: str = "io_bucket") -> str:
    """The bucket name of ``value`` (``s3://`` allowed), or ConfigurationError saying why not."""
    if not value or not isinstance(value, str):
        raise ConfigurationError(f"{label} must name an S3 bucket")
    name = value[5:] if value.startswith("s3://") else value
    name = name.strip("/")
    if "/" in name:
        raise ConfigurationError(
            f"{label}={value!r} holds a path: give the bucket alone and the folder as io_prefix "
            f"(BATCHFUTURES_IO_PREFIX)")
    if not BUCKET_NAME.fullmatch(name) or ".." in name or _IP_ADDRESS.fullmatch(name) \
            or name.startswith(("xn--", "sthree-")) or name.endswith(("-s3alias", "--ol-s3")):
        raise ConfigurationError(
            f"{label}={value!r} is not a valid S3 bucket name: 3 to 63 lowercase letters, digits, "
            f"'.' and '-', starting and ending with a letter or digit")
    return name


def check_job_queue(value: Any, label: str = "job_queue") -> str:
    if not value or not isinstance(value, str):
        raise ConfigurationError(f"{label} must name a Batch job queue (name or ARN)")
    if value.startswith("arn:"):
        if not JOB_QUEUE_ARN.fullmatch(value):
            raise ConfigurationError(
                f"{label}={value!r} is not a job queue ARN "
                f"(arn:aws:batch:<region>:<account>:job-queue/<name>)")
    elif not re.fullmatch(_NAME, value):
        raise ConfigurationError(
            f"{label}={value!r} is not a job queue name: up to 128 letters, digits, '-' and '_'")
    return value


def check_job_definition(value: Any, label: str = "job_definition") -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"{label} must name a Batch job definition (name or ARN)")
    pattern, shape = (JOB_DEFINITION_ARN, "arn:aws:batch:<region>:<account>:job-definition/"
                      "<name>[:<revision>]") if value.startswith("arn:") else (
                          JOB_DEFINITION_NAME, "<name>[:<revision>]")
    if not pattern.fullmatch(value):
        raise ConfigurationError(f"{label}={value!r} is not a job definition ({shape})")
    return value


# https://docs.aws.amazon.com/secretsmanager/latest/apireference/API_CreateSecret.html (Name)
SECRET_NAME = re.compile(r"[A-Za-z0-9/_+=.@-]{1,512}")
SECRET_ARN = re.compile(r"arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:[A-Za-z0-9/_+=.@-]+")


def check_signing_secret(value: Any, label: str = "signing_secret") -> Optional[str]:
    """The Secrets Manager secret (ARN or name) of the signing key, or ConfigurationError."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"{label} must name a Secrets Manager secret (ARN or name)")
    pattern = SECRET_ARN if value.startswith("arn:") else SECRET_NAME
    if not pattern.fullmatch(value):
        raise ConfigurationError(
            f"{label}={value!r} is not a Secrets Manager secret ARN "
            f"(arn:aws:secretsmanager:<region>:<account>:secret:<name>) or name")
    return value


def arn_region(value: Optional[str]) -> Optional[str]:
    """The region field of an ARN (``arn:<partition>:<service>:<region>:...``), else None."""
    parts = (value or "").split(":")
    return (parts[3] or None) if len(parts) > 5 and parts[0] == "arn" else None


def choose_region(given: Optional[str], session_region: Optional[str], environ: Mapping[str, str],
                  config_region: Optional[str], job_queue: str) -> Tuple[Optional[str], str]:
    """The region of an AWSBatchEnvironment and where it came from, the first that says:
    ``region_name=``; the region of a ``session=`` the caller made; AWS_REGION, then
    AWS_DEFAULT_REGION (REGION_VARIABLES); the AWS config file's region for the profile
    (``config_region``, boto3's Session().region_name); else the region of the job queue's ARN.
    (None, "") when none does: botocore then raises NoRegionError."""
    if given:
        return given, "region_name="
    if session_region:
        return session_region, "the session"
    for variable in REGION_VARIABLES:
        if environ.get(variable):
            return environ[variable], variable
    if config_region:
        return config_region, "the AWS config file"
    queue_region = arn_region(job_queue)
    if queue_region:
        return queue_region, "the job queue ARN"
    return None, ""


def queue_region_conflict(region: Optional[str], source: str, job_queue: str) -> Optional[str]:
    """Why a job queue ARN cannot be used from ``region`` (Batch is regional: another region's
    endpoint answers that the queue does not exist), or None."""
    queue_region = arn_region(job_queue)
    if not region or not queue_region or queue_region == region:
        return None
    if source in REGION_VARIABLES:
        fix = f"set {source}={queue_region}"
    elif source == "the AWS config file":
        fix = f"set AWS_DEFAULT_REGION={queue_region} or pass region_name={queue_region!r}"
    else:
        fix = f"pass region_name={queue_region!r}"
    return (f"job queue {job_queue} is in {queue_region} but the region is {region} (from "
            f"{source}): {fix}")


def _optional_text(value: Any, label: str) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"{label} must be a non-empty string")
    return value


def explain_aws_error(error: BaseException) -> str:
    """One line about a botocore failure, saying what to do where it is clear."""
    if isinstance(error, aws.NoCredentialsError):
        return ("no AWS credentials found: set AWS_PROFILE (or profile_name=), environment "
                "variables, or run where a role is attached")
    if isinstance(error, aws.NoRegionError):
        return "no AWS region: pass region_name= or set AWS_DEFAULT_REGION"
    if isinstance(error, aws.ParamValidationError):
        return f"a parameter AWS would refuse: {error}"
    if isinstance(error, (aws.TokenRetrievalError, aws.SSOTokenLoadError, aws.UnauthorizedSSOTokenError)):
        return f"the SSO session has ended: run `aws sso login` ({error})"
    if isinstance(error, aws.ClientError):
        code = batchapi.error_code(error)
        message = error.response.get("Error", {}).get("Message") or str(error)
        if code in EXPIRED_TOKEN_CODES:
            return f"the AWS credentials have expired and could not be refreshed ({message})"
        if code in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation"):
            return f"not allowed by IAM: {message}"
        return f"{code}: {message}"
    return str(error) or type(error).__name__


EnvironmentLike = Union[BaseEnvironment, Mapping[str, Any], None]


def resolve_environment(env: EnvironmentLike) -> BaseEnvironment:
    """An environment from what the user passed: itself, a mapping, or None (the process env)."""
    if isinstance(env, BaseEnvironment):
        return env
    if env is None:
        values = {key: os.environ[var] for key, var in ENV_VARS.items() if os.environ.get(var)}
        if not values:
            return LocalEnvironment()
        return _aws_from_mapping(values, source="the BATCHFUTURES_* environment variables",
                                 names=ENV_VARS)
    if isinstance(env, Mapping):
        return _aws_from_mapping(dict(env), source="the mapping")
    raise ConfigurationError(
        f"BatchExecutor needs an environment (LocalEnvironment, AWSBatchEnvironment, a mapping "
        f"or None), not {type(env).__name__}")


def _aws_from_mapping(values: Dict[str, Any], *, source: str,
                     names: Optional[Mapping[str, str]] = None) -> BaseEnvironment:
    """An AWSBatchEnvironment from keys (or variables: ``names`` maps a key to its variable)."""
    label = (lambda key: names.get(key, key)) if names else (lambda key: key)
    missing = [label(key) for key in ("job_queue", "io_bucket") if not values.get(key)]
    if not values.get("job_definition") and not values.get("image"):
        missing.append(f"{label('job_definition')} (or {label('image')})")
    if missing:
        raise ConfigurationError(f"{source} lack{'s' if names is None else ''} "
                                 f"{', '.join(missing)}: AWS Batch needs a job queue, an I/O "
                                 f"bucket and a job definition or image")
    if names:  # refused in the words the user typed them
        check_job_queue(values["job_queue"], label("job_queue"))
        check_bucket_name(values["io_bucket"], label("io_bucket"))
        if values.get("job_definition"):
            check_job_definition(values["job_definition"], label("job_definition"))
        check_signing_secret(values.get("signing_secret"), label("signing_secret"))
    try:
        return AWSBatchEnvironment(**values)
    except TypeError as error:
        raise ConfigurationError(f"{source} has an unknown key: {error}") from error


if TYPE_CHECKING:
    from .budget import BudgetedClient
    from .emulator.logservice import LogsService

    def _seams_hold(local: LocalEnvironment, aws: AWSBatchEnvironment, emulator: BatchEmulator,
                    budgeted: BudgetedClient, emulator_logs: LogsService) -> None:
        """Never run: mypy proves here that each implementation satisfies its seam (boto3's
        clients are untyped: they are taken as the seam by a cast, in AWSBatchEnvironment)."""
        environments: List[Environment] = [local, aws]
        batches: List[BatchAPI] = [emulator, budgeted]
        logs: LogsAPI = emulator_logs
        del environments, batches, logs
