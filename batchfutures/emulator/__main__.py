"""`python -m batchfutures.emulator`: the AWS Batch emulator as a local HTTP endpoint.

    python -m batchfutures.emulator [--port N] [--host H] [--folder DIR] [--max-vcpus N]
                                    [--metadata-ttl S]

Prints one line, the endpoint URL, then serves until SIGINT or SIGTERM; jobs still running then
are ended and recorded FAILED. Point a stock boto3 client at it:

    boto3.client("batch", endpoint_url=URL, region_name="us-east-1",
                 aws_access_key_id="x", aws_secret_access_key="x")
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import List, Optional


def default_folder() -> Path:
    """The folder `LocalEnvironment()` uses: $BATCHFUTURES_WORKDIR/emulator, else
    $XDG_CACHE_HOME/batchfutures/emulator (~/.cache/batchfutures/emulator)."""
    explicit = os.environ.get("BATCHFUTURES_WORKDIR")
    if explicit:
        return Path(explicit).expanduser() / "emulator"
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "batchfutures" / "emulator"


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m batchfutures.emulator",
        description="Serve the batchfutures AWS Batch emulator (Batch and CloudWatch Logs APIs) "
                    "on 127.0.0.1; prints the endpoint URL, then serves until SIGINT/SIGTERM.")
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 (default) picks a free one")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--folder", type=Path, default=None,
                        help=f"where job records and logs live (default {default_folder()})")
    parser.add_argument("--max-vcpus", type=float, default=None,
                        help="vCPUs of running jobs at once (default: this machine's CPU count)")
    parser.add_argument("--metadata-ttl", type=float, default=None,
                        help="seconds a finished job stays describable (default: one day)")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from . import BatchEmulator  # lazily: the service (and botocore) load only now
    from .server import EmulatorServer

    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    options = {}
    if args.max_vcpus is not None:
        options["max_vcpus"] = args.max_vcpus
    if args.metadata_ttl is not None:
        options["metadata_ttl"] = args.metadata_ttl
    try:
        emulator = BatchEmulator(args.folder or default_folder(), **options)
    except (ValueError, TypeError, OSError) as error:  # a bad option or an unusable folder
        print(f"batchfutures emulator: {error}", file=sys.stderr)
        return 2
    server = EmulatorServer(emulator, host=args.host, port=args.port)
    try:
        try:
            server.start()
        except OSError as error:  # the port is taken, or not ours to bind
            print(f"batchfutures emulator: cannot listen on {args.host}:{args.port}: {error}",
                  file=sys.stderr)
            return 2
        print(server.endpoint_url, flush=True)
        while not stop.wait(0.5):  # a timed wait, so signals are handled promptly everywhere
            pass
    finally:
        server.stop()
        emulator.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
