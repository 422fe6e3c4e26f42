"""batchfutures: AWS Batch as a concurrent.futures Executor.

    with BatchExecutor(env) as ex:
        results = list(ex.map(f, xs, chunksize=100))

With no environment the jobs run on the embedded emulator of the AWS Batch API, as local
processes; with an `AWSBatchEnvironment` they run on AWS Batch. See docs/architecture.md.
"""

from ._version import __version__
from .environments import AWSBatchEnvironment, LocalEnvironment
from .errors import (
    BatchError,
    ConfigurationError,
    EnvironmentMismatchError,
    HostTerminatedError,
    JobAbortedError,
    JobFailedError,
    JobMetadataExpired,
    JobTimeoutError,
    MemoryLimitExceeded,
    RemoteError,
    SerializationError,
)
from .executor import BatchExecutor
from .futures import BatchFuture
from .settings import JobSettings, parse_memory

__all__ = [
    "__version__",
    "BatchExecutor",
    "BatchFuture",
    "LocalEnvironment",
    "AWSBatchEnvironment",
    "JobSettings",
    "parse_memory",
    "BatchError",
    "ConfigurationError",
    "SerializationError",
    "EnvironmentMismatchError",
    "RemoteError",
    "JobMetadataExpired",
    "JobFailedError",
    "MemoryLimitExceeded",
    "JobTimeoutError",
    "JobAbortedError",
    "HostTerminatedError",
]
