"""The embedded AWS Batch emulator: the Batch API in process, jobs as local processes.

    BatchEmulator(folder)          boto3-batch-client-shaped service (service.py)
      .logs                        CloudWatch Logs get_log_events (logs.py)
      scheduler thread             lifecycle, vCPUs, memory, timeouts (service.py, launcher.py)
      records                      job records on disk, TTL, orphan recovery (records.py)
    EmulatorServer(emulator)       the same over HTTP on 127.0.0.1 (server.py)

See docs/emulator.md for what is emulated and how it differs from AWS Batch.
"""

from .service import BatchEmulator

__all__ = ["BatchEmulator"]
