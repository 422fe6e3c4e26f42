"""The `batchfutures` command line.

    batchfutures demo                 run a real map on the embedded default (or the env's queue)
    batchfutures status JOB           Batch status of a job (or array child "<id>:<i>")
    batchfutures logs JOB [--follow]  its console output
    batchfutures result JOB           its result(s), printed with repr()
    batchfutures cancel JOB           cancel or terminate it
    batchfutures jobs [--status S]    this library's jobs in the queue
    batchfutures cleanup              remove stored payloads of finished runs
    batchfutures check                verify the environment end to end, one line per part
    batchfutures template             print the CloudFormation template for AWS
    batchfutures image                print the commands that build and push the worker image

The environment comes from the BATCHFUTURES_* variables (an AWS queue), else the local
emulator; `--workdir` picks the emulator's folder.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, List, Optional

from ._version import __version__


def _square(x: int) -> int:
    return x * x


def _environment(args: argparse.Namespace) -> Any:
    from .environments import LocalEnvironment, resolve_environment

    if getattr(args, "workdir", None):
        return LocalEnvironment(args.workdir)
    return resolve_environment(None)


def _describe(env: Any, job_id: str) -> Optional[dict]:
    from . import batchapi

    found = batchapi.describe_jobs(env.batch, [job_id])
    return found[0] if found else None


def cmd_demo(args: argparse.Namespace) -> int:
    from .executor import BatchExecutor

    env = _environment(args)
    count, chunksize = args.items, args.chunksize
    print(f"batchfutures {__version__}: squaring {count} numbers on {env!r} "
          f"(chunksize {chunksize})", flush=True)
    started = time.monotonic()
    with BatchExecutor(env) as executor:
        results = list(executor.map(_square, range(count), chunksize=chunksize))
    print(results)
    print(f"{count} results in {time.monotonic() - started:.2f} s", flush=True)
    return 0 if results == [x * x for x in range(count)] else 1


def cmd_status(args: argparse.Namespace) -> int:
    env = _environment(args)
    job = _describe(env, args.job)
    if job is None:
        print(f"{args.job}: unknown to Batch (never submitted, or its metadata expired)")
        return 1
    summary = {key: job.get(key) for key in ("jobId", "jobName", "status", "statusReason")
               if job.get(key) is not None}
    array = job.get("arrayProperties") or {}
    if array.get("statusSummary"):
        summary["children"] = {k: v for k, v in array["statusSummary"].items() if v}
    attempts = job.get("attempts") or []
    if attempts:
        container = attempts[-1].get("container") or {}
        summary["exitCode"] = container.get("exitCode")
        if container.get("reason"):
            summary["reason"] = container["reason"]
    print(json.dumps(summary, indent=2))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from .executor import BatchExecutor

    with BatchExecutor(_environment(args)) as executor:
        attached = executor.attach(args.job)
        future = attached if not isinstance(attached, list) else attached[0]
        printed = 0
        while True:
            lines = future.log().splitlines()
            for line in lines[printed:]:
                print(line, flush=True)
            printed = max(printed, len(lines))
            if not args.follow or future.done():
                break
            time.sleep(1.0)
        executor.shutdown(wait=False, cancel_futures=False)
    return 0


def cmd_result(args: argparse.Namespace) -> int:
    from .executor import BatchExecutor

    with BatchExecutor(_environment(args)) as executor:
        attached = executor.attach(args.job)
        futures = attached if isinstance(attached, list) else [attached]
        status = 0
        for future in futures:
            try:
                print(repr(future.result(timeout=args.timeout)))
            except Exception as error:  # show every item's outcome, not just the first failure
                print(f"{type(error).__name__}: {error}")
                status = 1
    return status


def cmd_cancel(args: argparse.Namespace) -> int:
    from . import batchapi

    env = _environment(args)
    reason = f"batchfutures: cancelled from the command line ({args.reason})"
    batchapi.call(env.batch.terminate_job, jobId=args.job, reason=reason)
    print(f"{args.job}: terminate requested")
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    from . import batchapi

    env = _environment(args)
    statuses = [args.status] if args.status else list(_STATUSES)
    found = []
    for status in statuses:
        token = None
        while True:
            request = {"jobQueue": env.job_queue, "jobStatus": status, "maxResults": 1000}
            if token:
                request["nextToken"] = token
            response = batchapi.call(env.batch.list_jobs, **request)
            found.extend(j for j in response.get("jobSummaryList", [])
                         if j.get("jobName", "").startswith("bf-"))
            token = response.get("nextToken")
            if not token:
                break
    ours = []
    for job in batchapi.describe_jobs(env.batch, [j["jobId"] for j in found]):
        if "batchfutures:version" in (job.get("tags") or {}):
            ours.append(job)
    for job in sorted(ours, key=lambda j: j.get("createdAt", 0)):
        size = (job.get("arrayProperties") or {}).get("size")
        children = f"  [{size} children]" if size else ""
        print(f"{job['jobId']}  {job['status']:<9}  {job['jobName']}{children}")
    if not ours:
        print(f"no batchfutures jobs in {env.job_queue}")
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    env = _environment(args)
    storage = env.storage
    horizon = time.time() - args.older_than * 3600
    removed = 0
    for run_id, modified in storage.list_runs():
        if modified is not None and modified > horizon and not args.all:
            continue
        print(("would remove " if args.dry_run else "removing ") + storage.run_url(run_id))
        if not args.dry_run:
            storage.delete_run(run_id)
        removed += 1
    print(f"{removed} run(s) {'to remove' if args.dry_run else 'removed'}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from .checks import run_checks

    env = _environment(args)
    failures = 0
    for name, ok, detail in run_checks(env):
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    return 1 if failures else 0


def cmd_template(args: argparse.Namespace) -> int:
    from .setup_resources import template_text

    print(template_text(), end="")
    return 0


def cmd_image(args: argparse.Namespace) -> int:
    from .setup_resources import image_commands

    print(image_commands(python_version=args.python, repository=args.repository, region=args.region))
    return 0


_STATUSES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="batchfutures", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"batchfutures {__version__}")
    parser.add_argument("--workdir", help="use the local emulator with this folder")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run a small map and print its results")
    demo.add_argument("--items", type=int, default=10)
    demo.add_argument("--chunksize", type=int, default=2)
    demo.set_defaults(run=cmd_demo)

    for name, run, text in (("status", cmd_status, "show a job's Batch status"),
                            ("logs", cmd_logs, "print a job's console output"),
                            ("result", cmd_result, "print a job's results"),
                            ("cancel", cmd_cancel, "cancel or terminate a job")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("job", help="Batch job id, or '<array job id>:<index>'")
        sub.set_defaults(run=run)
        if name == "logs":
            sub.add_argument("--follow", action="store_true", help="keep printing until the job ends")
        if name == "result":
            sub.add_argument("--timeout", type=float, default=None)
        if name == "cancel":
            sub.add_argument("--reason", default="no reason given")

    jobs = commands.add_parser("jobs", help="list this library's jobs in the queue")
    jobs.add_argument("--status", choices=_STATUSES)
    jobs.set_defaults(run=cmd_jobs)
    cleanup = commands.add_parser("cleanup", help="remove stored payloads of finished runs")
    cleanup.add_argument("--older-than", type=float, default=24.0, metavar="HOURS",
                         help="remove runs untouched for this long (default 24)")
    cleanup.add_argument("--all", action="store_true", help="remove every run")
    cleanup.add_argument("--dry-run", action="store_true")
    cleanup.set_defaults(run=cmd_cleanup)
    commands.add_parser("check", help="verify the environment end to end").set_defaults(run=cmd_check)
    commands.add_parser("template", help="print the CloudFormation template").set_defaults(
        run=cmd_template)
    image = commands.add_parser("image", help="print the worker image build and push commands")
    image.add_argument("--repository", help="ECR repository URI")
    image.add_argument("--region")
    image.add_argument("--python", help="Python version of the image (default: this interpreter's)")
    image.set_defaults(run=cmd_image)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        from .errors import BatchError

        if isinstance(error, BatchError):
            print(f"batchfutures: {error}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
