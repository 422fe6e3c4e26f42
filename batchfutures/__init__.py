"""batchfutures: AWS Batch as a concurrent.futures Executor.

    with BatchExecutor(env) as ex:
        results = list(ex.map(f, xs, chunksize=100))

With no environment the jobs run on the embedded emulator of the AWS Batch API, as local
processes; with an `AWSBatchEnvironment` they run on AWS Batch. See docs/architecture.md.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

# Names are imported on first use, so `python -m batchfutures.worker` (the container command)
# does not pay for the executor's imports (boto3, botocore) when it starts.
_EXPORTS = {
    "BatchExecutor": "executor",
    "BatchFuture": "futures",
    "LocalEnvironment": "environments",
    "AWSBatchEnvironment": "environments",
    "JobSettings": "settings",
    "parse_memory": "settings",
    "BatchError": "errors",
    "ConfigurationError": "errors",
    "SerializationError": "errors",
    "EnvironmentMismatchError": "errors",
    "EnvironmentBuildError": "errors",
    "RemoteError": "errors",
    "JobMetadataExpired": "errors",
    "JobFailedError": "errors",
    "MemoryLimitExceeded": "errors",
    "JobTimeoutError": "errors",
    "JobAbortedError": "errors",
    "HostTerminatedError": "errors",
    "InitializerFailedError": "errors",
    "DryRunResult": "errors",
    "DependencyFailedError": "errors",
    "IntegrityError": "errors",
    "progress": "progress",
    "node": "worker.nodes",
    "NodeInfo": "worker.nodes",
    "Retries": "retrypolicy",
    "checkpoint": "checkpoints",
    "restored": "checkpoints",
    "interrupted": "checkpoints",
    "BudgetExceededError": "errors",
}

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
    "EnvironmentBuildError",
    "RemoteError",
    "JobMetadataExpired",
    "JobFailedError",
    "MemoryLimitExceeded",
    "JobTimeoutError",
    "JobAbortedError",
    "HostTerminatedError",
    "InitializerFailedError",
    "DryRunResult",
    "DependencyFailedError",
    "IntegrityError",
    "progress",
    "node",
    "NodeInfo",
    "register_joblib",
    "Retries",
    "checkpoint",
    "restored",
    "interrupted",
    "BudgetExceededError",
]

if TYPE_CHECKING:  # pragma: no cover
    from .checkpoints import checkpoint, interrupted, restored
    from .environments import AWSBatchEnvironment, LocalEnvironment
    from .errors import (
        BatchError,
        BudgetExceededError,
        ConfigurationError,
        DependencyFailedError,
        DryRunResult,
        EnvironmentBuildError,
        EnvironmentMismatchError,
        HostTerminatedError,
        InitializerFailedError,
        IntegrityError,
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
    from .progress import progress
    from .retrypolicy import Retries
    from .settings import JobSettings, parse_memory
    from .worker.nodes import NodeInfo, node


def register_joblib() -> None:
    """Register the joblib backend ``"batchfutures"`` (batchfutures.joblib_backend):
    ``with joblib.parallel_config(backend="batchfutures", executor=ex): ...``. Needs joblib
    (``pip install 'batchfutures[joblib]'``), imported only now."""
    # optional: joblib (the [joblib] extra) may be absent, and costs ~100 ms to import
    from .joblib_backend import register_joblib as register

    register()


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'batchfutures' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(__all__)
