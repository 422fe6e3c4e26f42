"""The embedded AWS Batch emulator: the Batch API in process, jobs as local processes.

The API side (this folder):

    BatchEmulator(folder)        the API facade: validation, rendering, faults   service.py
      request rules, JobSpec     SubmitJob's checks, what a request becomes      submitjob.py
      listing                    ListJobs filters, pagination tokens             listing.py
      .logs                      CloudWatch Logs get_log_events                  logservice.py
      job table                  own and foreign jobs, recovery, TTL             table.py
      jobs, children, shapes     Job / Unit, JobDetail and JobSummary shapes     jobstate.py
      dependencies               dependsOn counters and cascades                 dependson.py
      records                    every file: jobs, queues, control; persister    records.py
      records' schema            every record read checked, with bounds (pure)   schema.py
      definitions and queues                                                     catalog.py
      tags                       TagResource and friends' rules                  tagging.py
      botocore models, errors                                                    model.py
      faults on demand, retry rules                                              faults.py, retries.py
      credentials                the endpoint's SigV4 check                      auth.py
    EmulatorServer(emulator)     the same over HTTP on 127.0.0.1                 server.py

Where attempts run (runtime/, its docstring lists it): the scheduler thread, placement, attempt
outcomes, the container's world, the process and thread launchers, the fork server, cgroups
and the memory monitor, this machine's CPUs, memory and GPUs.

See docs/emulator.md for what is emulated and how it differs from AWS Batch. Importing this
package is cheap: the service (and botocore) load on first use of `BatchEmulator`.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .service import BatchEmulator

__all__ = ["BatchEmulator"]


def __getattr__(name: str) -> Any:
    if name == "BatchEmulator":
        # start-up: the service (botocore, the runtime) costs ~50 ms; `import batchfutures`
        # and the runtime's modules import this package without it
        from .service import BatchEmulator

        return BatchEmulator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
