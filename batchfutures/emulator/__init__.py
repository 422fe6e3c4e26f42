"""The embedded AWS Batch emulator: the Batch API in process, jobs as local processes.

    BatchEmulator(folder)        the API facade: validation, rendering, faults   service.py
      request rules, JobSpec     SubmitJob's checks, what a request becomes      submission.py
      listing                    ListJobs filters, pagination tokens             listing.py
      .logs                      CloudWatch Logs get_log_events                  logs.py
      job table                  own and foreign jobs, recovery, TTL             table.py
      jobs, children, shapes     Job / Unit, statuses (enum), JobDetail          jobs.py
      records                    every file: jobs, queues, control; persister    records.py
      definitions and queues                                                     catalog.py
      scheduler thread           lifecycle, vCPUs, retries, time limits          scheduler.py
      dependencies               dependsOn counters and cascades                 dependencies.py
      attempt outcomes           what an attempt's end means (pure)              outcomes.py
      the container's world      command, environment, path, scratch directory   container.py
      attempt handles            the protocol both launchers implement           attempts.py
      processes                  exec'd attempts / the preloaded fork server     launcher.py, forkserver.py
      memory and CPU             cgroups (v1/v2), else RLIMIT + sampling         cgroups.py, monitor.py
      this machine               CPUs, memory, GPUs                              host.py
      botocore models, errors                                                    model.py
      faults on demand, retry rules                                              faults.py, retries.py
    EmulatorServer(emulator)     the same over HTTP on 127.0.0.1                 server.py

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
