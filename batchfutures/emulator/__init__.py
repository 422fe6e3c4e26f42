"""The embedded AWS Batch emulator: the Batch API in process, jobs as local processes.

    BatchEmulator(folder)        boto3-batch-client-shaped service          service.py
      .logs                      CloudWatch Logs get_log_events             logs.py
      job table                  jobs, array children, attempts, shapes     jobs.py
      scheduler thread           lifecycle, dependencies, vCPUs, retries    scheduler.py
      processes                  launching, RLIMIT_DATA, kill               launcher.py
      memory monitor             /proc sampling, kill over the limit        monitor.py
      records                    job records on disk, owners, persister     records.py
      definitions and queues                                                catalog.py
      botocore models, errors                                               model.py
      faults on demand, retry rules                                         faults.py, retries.py
    EmulatorServer(emulator)     the same over HTTP on 127.0.0.1            server.py

See docs/emulator.md for what is emulated and how it differs from AWS Batch. Importing this
package is cheap: the service (and botocore) load on first use of `BatchEmulator`.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .service import BatchEmulator

__all__ = ["BatchEmulator"]


def __getattr__(name: str) -> Any:
    if name == "BatchEmulator":
        from .service import BatchEmulator

        return BatchEmulator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
