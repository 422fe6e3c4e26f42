"""`batchfutures demo`: a small map of squares on the environment, with the commands that
inspect its job, or (--dry-run) the requests and objects it would send, sending nothing."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING

from .._version import __version__
from ..errors import DryRunResult
from .envargs import command_prefix, environment
from .output import CLIError, ExitCode, out

if TYPE_CHECKING:
    from ..environments import BaseEnvironment


def _square(x: int) -> int:  # module level: the workers import it by name
    return x * x


def cmd_demo(args: argparse.Namespace) -> int:
    # start-up: the executor adds ~100 ms to the CLI's start, which parses every command
    from ..executor import BatchExecutor

    env = environment(args)
    count, chunksize = args.items, args.chunksize
    out(f"batchfutures {__version__}: squaring {count} numbers on {env!r} (chunksize {chunksize})")
    started = time.monotonic()
    if args.dry_run:
        return _demo_dry_run(env, count, chunksize)
    with BatchExecutor(env) as executor:
        futures = executor.map_futures(_square, range(count), chunksize=chunksize)
        job_ids = sorted({f.job_id.partition(":")[0] for f in futures if f.job_id})
        children = -(-count // chunksize)
        prefix = command_prefix(args)
        for job_id in job_ids:
            one = f"{job_id}:0" if children > 1 else job_id
            out(f"job {job_id} ({children} {'children' if children > 1 else 'child'}); inspect it with:")
            out(f"  {prefix} status {job_id}")
            out(f"  {prefix} logs {one}")
            out(f"  {prefix} result {job_id}")
        results = [future.result() for future in futures]
    out(repr(results))
    out(f"{count} results in {time.monotonic() - started:.2f} s")
    if results != [x * x for x in range(count)]:
        raise CLIError("the demo's results are wrong", ExitCode.FAILED)
    return ExitCode.OK


def _demo_dry_run(env: BaseEnvironment, count: int, chunksize: int) -> int:
    """What the demo would send: its SubmitJob request and the objects, nothing sent."""
    from ..executor import BatchExecutor  # start-up: as cmd_demo's

    with BatchExecutor(env, dry_run=True) as executor:
        error = executor.map_futures(_square, range(count), chunksize=chunksize)[0].exception()
    if not isinstance(error, DryRunResult):
        raise CLIError(f"the dry run did not produce its requests: {error!r}", ExitCode.FAILED)
    out("dry run: nothing was sent. SubmitJob request(s):")
    for request in error.requests:
        out(json.dumps(request, indent=2, sort_keys=True))
    out("objects that would be written (key, bytes):")
    for key, size in error.objects:
        out(f"  {key}  {size}")
    return ExitCode.OK
