"""The commands about one job or the queue's jobs: `status` (and --watch), `logs`, `result`,
`cancel` and `jobs`. They observe, except `cancel`; none waits on a job it was not asked to."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import sys
import time
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional

from ..jobdetail import attempt_count
from ..statuses import FINISHED, STATUS_ORDER, JobStatus
from .envargs import environment
from .output import (
    CLIError,
    ExitCode,
    OutputFormat,
    counts_text,
    escape,
    json_text,
    note,
    out,
    print_json,
    render_table,
    span,
    when,
)

if TYPE_CHECKING:
    from ..environments import Environment

logger = logging.getLogger("batchfutures")


# -- status -------------------------------------------------------------------------------------
def _status_exit(info: Any, failures: Any) -> int:
    if info.status == JobStatus.FAILED or (failures is not None and failures.failed):
        return ExitCode.FAILED
    return ExitCode.OK


TEXT_LIST_LIMIT = 20  # failed children / calls the text view lists; table and json list all


def _print_status(info: Any, failures: Any, output: OutputFormat, usage: Any = None,
                  cost: Any = None) -> None:
    from ..costs import cost_text  # start-up: as cmd_status's
    from ..jobview import duration

    if output is OutputFormat.JSON:
        data = info.as_dict()
        if failures is not None:
            data.update(failures.as_dict())
        if usage is not None:
            data["usage"] = usage.as_dict()
        if cost is not None:
            data["cost"] = {"usd": cost.usd, "basis": cost.basis}
        print_json(data)
        return
    if output is OutputFormat.TABLE:
        if info.is_array:
            out(render_table(
                ["INDEX", "STATUS", "EXIT", "STARTED (UTC)", "DURATION", "REASON"],
                [[c.index, c.status, c.exit_code, when(c.started_at),
                  span(duration(c.started_at, c.stopped_at, time.time())),
                  c.status_reason] for c in info.children]))
        else:
            out(render_table(
                ["JOB ID", "NAME", "STATUS", "EXIT", "CREATED (UTC)", "DURATION", "REASON"],
                [[info.job_id, info.name, info.status, info.exit_code, when(info.created_at),
                  span(info.duration(time.time())), info.status_reason]]))
        if failures is not None and failures.failed:
            out("")
            out(render_table(["ITEM", "CHILD", "ERROR", "MESSAGE"],
                              [[f.item, f.child, f.error_type, f.message] for f in failures.failed]))
        if usage is not None:
            out("")
            out(render_table(
                ["CALLS", "CPU S", "WALL S", "PEAK MIB", "VCPU-S", "GIB-S", "MEMORY MIB"],
                [[usage.calls, f"{usage.cpu_s:.2f}", f"{usage.wall_s:.2f}",
                  "-" if usage.peak_memory_mib is None else f"{usage.peak_memory_mib:.0f}",
                  "-" if usage.vcpu_s is None else f"{usage.vcpu_s:.1f}",
                  "-" if usage.gib_s is None else f"{usage.gib_s:.1f}", usage.memory_mib]]))
            if usage.advice:
                out(usage.advice)
        if cost is not None:
            out(f"cost: {cost_text(cost)}")
        return
    rows = [("job", info.job_id), ("name", info.name), ("status", info.status)]
    if info.status_reason:
        rows.append(("reason", info.status_reason))
    waiting = info.waiting  # RUNNABLE: why (its queue's snapshot and state, read now); else None
    if waiting is not None:
        rows.append(("waiting", str(waiting)))
    rows += [("created", when(info.created_at) + " UTC"), ("started", when(info.started_at)),
             ("stopped", when(info.stopped_at)), ("duration", span(info.duration(time.time())))]
    if info.is_array:
        rows.append(("children", f"{info.size}: {counts_text(info.status_counts)}"))
        failed = [child for child in info.children if child.status == JobStatus.FAILED]
        for child in failed[:TEXT_LIST_LIMIT]:
            rows.append((f"  child {child.index}",
                         f"FAILED, exit code {child.exit_code}: {child.status_reason or '-'}"))
        if len(failed) > TEXT_LIST_LIMIT:
            rows.append(("  ...", f"{len(failed) - TEXT_LIST_LIMIT} more failed children "
                                  f"(-o table lists them all)"))
    else:
        rows.append(("exit code", "-" if info.exit_code is None else str(info.exit_code)))
        if info.container_reason:
            rows.append(("container", info.container_reason))
    if failures is not None:
        line = f"{failures.calls_read} read, {len(failures.failed)} raised"
        if failures.results_skipped:
            line += f" ({failures.results_skipped} result objects not read)"
        rows.append(("calls", line))
        for failure in failures.failed[:TEXT_LIST_LIMIT]:
            rows.append((f"  item {failure.item}", f"{failure.error_type}: {failure.message}"))
        if len(failures.failed) > TEXT_LIST_LIMIT:
            rows.append(("  ...", f"{len(failures.failed) - TEXT_LIST_LIMIT} more failed calls "
                                  f"(-o table lists them all)"))
    if usage is not None:  # used, reserved, and the memory setting against the peak
        lines = list(usage.lines())
        rows.append(("usage", lines[0]))
        rows += [("", line) for line in lines[1:]]
    if cost is not None:  # the calls' estimate so far, as future.cost prices them
        rows.append(("cost", cost_text(cost)))
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        out(f"{key.ljust(width)}  {escape(str(value))}")  # a field's newline is no new row


def _watch_line(info: Any) -> str:
    if info.is_array:
        counts = dict(info.status_counts)
        queued = counts.pop(JobStatus.SUBMITTED, 0) + counts.pop(JobStatus.PENDING, 0)
        shown = {JobStatus.PENDING: queued, **counts}
        return f"{info.job_id}  {info.status:<9}  " + "  ".join(
            f"{status} {count}" for status, count in shown.items())
    return f"{info.job_id}  {info.status}"


def _watch(env: Environment, args: argparse.Namespace) -> Any:
    """Refresh Batch's counts per status until the job ends; the final description."""
    from .. import jobview  # start-up: as cmd_status's

    interactive = sys.stdout.isatty() and args.output is OutputFormat.TEXT
    last = None
    while True:
        info = jobview.describe(env.batch, args.job, children=False)
        line = _watch_line(info)
        if interactive:
            print("\r" + escape(line), end="\x1b[K", flush=True)
        elif line != last:
            if args.output is OutputFormat.JSON:
                print(json_text({"jobId": info.job_id, "status": info.status,
                                 "statusCounts": info.status_counts}), flush=True)
            else:
                out(line)
        last = line
        if info.ended:
            break
        time.sleep(args.interval)
    if interactive:
        print(flush=True)
    return info


def cmd_status(args: argparse.Namespace) -> int:
    # start-up: jobview (botocore, tenacity) adds ~30 ms to the CLI's start; only the job
    # commands use it (so for batchapi, logs, childstops and the executor below)
    from .. import jobview

    env = environment(args)
    if args.watch:
        _watch(env, args)
    info = jobview.describe(env.batch, args.job, log_group=env.log_group)
    try:
        failures = jobview.failed_calls(env.storage, info)
    except Exception as error:  # Batch's answer is still worth showing
        logger.debug("could not read the results of %s", args.job, exc_info=True)
        note(f"could not read the results of {args.job} from {env.storage.root_url}: {error}")
        failures = None
    if args.watch and args.output is OutputFormat.JSON:
        return _status_exit(info, failures)  # the JSON lines were the output
    usage = jobview.job_usage(env.storage, info, calls=failures) if failures is not None else None
    _print_status(info, failures, args.output, usage, _cost(env, usage))
    return _status_exit(info, failures)


def _cost(env: "Environment", usage: Any) -> Any:
    """The job's estimated cost so far (costs.of_usage: future.cost's estimate), None when
    nothing was measured or it cannot be priced."""
    # start-up: as cmd_status's (spending reads the queue's compute environments and prices)
    from ..costs import of_usage
    from ..spending import pricing_of

    if usage is None or not usage.calls:
        return None
    try:
        return of_usage(usage, pricing_of(env))
    except Exception:  # a cost is a note: never fail `status` for it
        logger.debug("could not estimate the cost", exc_info=True)
        return None


# -- logs ---------------------------------------------------------------------------------------
def _stream_lines(client: Any, group: str, stream: str, cursor: Any) -> Iterator[str]:
    """Lines after ``cursor`` (a `logs.Cursor`, moved on as pages are read), yielded as each
    page of GetLogEvents arrives: the log is printed as it is read, never held whole."""
    from .. import batchapi, logs  # start-up: as cmd_status's

    try:
        yield from logs.lines_after(client, group, stream, cursor)
    except Exception as error:
        if batchapi.error_code(error) != "ResourceNotFoundException":
            raise
        # the stream is not there yet


def cmd_logs(args: argparse.Namespace) -> int:
    from .. import jobview, logs  # start-up: as cmd_status's

    env = environment(args)
    info = jobview.describe(env.batch, args.job, log_group=env.log_group, children=False)
    if info.is_array:
        if not args.all:
            raise CLIError(f"{args.job} is an array job of {info.size} children: name one as "
                           f"{args.job}:<index> (0 to {info.size - 1}), or add --all",
                           ExitCode.USAGE)
        if args.follow:
            raise CLIError("--follow follows one job: name a child as "
                           f"{args.job}:<index> instead of --all", ExitCode.USAGE)
        for index in range(info.size):
            out(f"==> {info.job_id}:{index} <==")
            child = jobview.describe(env.batch, f"{info.job_id}:{index}", children=False,
                                     log_group=env.log_group)
            if child.log_stream:
                for line in _stream_lines(env.logs, child.log_group, child.log_stream, logs.Cursor()):
                    out(line)
        return ExitCode.OK
    if args.follow:
        if not info.log_stream:
            note(f"job {args.job} is {info.status}; waiting for its output")
        def new_stream(description: Dict[str, Any], first: bool) -> None:
            if not first:  # a retry writes a new stream: it is read from its start
                ended = description.get("status") in FINISHED
                number = attempt_count(description) + (0 if ended else 1)
                note(f"job {args.job}: attempt {number} started, a new log stream")

        for line in logs.follow_job(env.batch, env.logs, args.job, env.log_group,
                                         poll=args.interval, on_new_stream=new_stream):
            out(line)
        return ExitCode.OK
    if not info.log_stream:
        note(f"no output yet: job {args.job} is {info.status}")
        return ExitCode.OK
    for line in _stream_lines(env.logs, info.log_group, info.log_stream, logs.Cursor()):
        out(line)  # printed as each page is read
    return ExitCode.OK


# -- result -------------------------------------------------------------------------------------
def _value_json(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return None


def cmd_result(args: argparse.Namespace) -> int:
    from ..executor import BatchExecutor  # start-up: as cmd_status's (the executor: ~100 ms)

    env = environment(args)
    executor = BatchExecutor(env)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    collected: List[Dict[str, Any]] = []  # for json and table, printed at the end
    failed = 0
    streaming = args.output is OutputFormat.TEXT

    def emit(index: int, ok: bool, value: Any) -> None:
        if streaming:
            out(repr(value) if ok else f"{type(value).__name__}: {escape(str(value))}")
        elif ok:
            collected.append({"index": index, "ok": True, "repr": repr(value),
                              "value": _value_json(value)})
        else:
            collected.append({"index": index, "ok": False, "error": type(value).__name__,
                              "message": str(value)})

    def flush_collected() -> None:
        if args.output is OutputFormat.JSON:
            print_json(collected)
        elif args.output is OutputFormat.TABLE:
            out(render_table(["INDEX", "OUTCOME", "VALUE"], [
                [row["index"], "ok" if row["ok"] else row["error"],
                 row["repr"] if row["ok"] else row["message"]] for row in collected]))

    try:
        try:
            attached = executor.attach(args.job)
        except FileNotFoundError:
            raise CLIError(f"the payload of job {args.job} is no longer in storage (removed by "
                           f"cleanup?): its results cannot be read", ExitCode.NOT_FOUND)
        futures = attached if isinstance(attached, list) else [attached]
        for index, future in enumerate(futures):
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                value, ok = future.result(timeout=remaining), True
            except concurrent.futures.CancelledError:
                value, ok = concurrent.futures.CancelledError("the call was cancelled"), False
            except Exception as error:
                if not future.done():  # the wait timed out, not the call
                    flush_collected()
                    raise CLIError(
                        f"timed out after {args.timeout:g} s waiting for {args.job}: {index} of "
                        f"{len(futures)} result(s) printed; the job goes on "
                        f"({future.status or 'unknown status'})", ExitCode.TIMEOUT)
                value, ok = error, False
            failed += not ok
            emit(index, ok, value)  # outside the try: a closed stdout is not an item's outcome
        flush_collected()
    finally:
        # only observing: leave the job running, wait for nothing
        executor.shutdown(wait=False, cancel_futures=False)
    if failed:
        note(f"{failed} of {len(futures)} call(s) of {args.job} failed")
        return ExitCode.FAILED
    return ExitCode.OK


# -- cancel -------------------------------------------------------------------------------------
def cmd_cancel(args: argparse.Namespace) -> int:
    from .. import batchapi, childstops, jobview  # start-up: as cmd_status's

    env = environment(args)
    info = jobview.describe(env.batch, args.job, children=False)
    if info.ended:
        raise CLIError(f"job {args.job} already {info.status}: nothing to cancel", ExitCode.FAILED)
    reason = f"batchfutures: cancelled from the command line ({args.reason})"
    try:
        batchapi.call(env.batch.terminate_job, jobId=args.job, reason=reason)
    except Exception as error:
        why = batchapi.StopFailed.of(error)
        if not childstops.refused_alone(args.job, why.code, why.message):
            raise
        # an array child is not a taggable resource: the stack's client policy may stop only
        # the whole job (docs/aws.md, "IAM, role by role")
        raise CLIError(f"{args.job}: you may not stop one child of an array alone here "
                       f"({why.code}); stop the whole job with `batchfutures cancel "
                       f"{childstops.parent_of(args.job)}`", ExitCode.FAILED) from error
    out(f"{args.job}: termination requested (it was {info.status})")
    return ExitCode.OK


# -- jobs ---------------------------------------------------------------------------------------
def _our_jobs(env: Environment) -> List[Dict[str, Any]]:
    from .. import batchapi  # start-up: as cmd_status's

    found: List[Dict[str, Any]] = []
    for status in STATUS_ORDER:
        for response in batchapi.paginate(env.batch.list_jobs, jobQueue=env.job_queue,
                                          jobStatus=status, maxResults=1000):
            found.extend(j for j in response.get("jobSummaryList", [])
                         if j.get("jobName", "").startswith("bf-"))
    described = batchapi.describe_jobs(env.batch, [j["jobId"] for j in found])
    ours = [job for job in described if "batchfutures:version" in (job.get("tags") or {})]
    return sorted(ours, key=lambda j: j.get("createdAt", 0))


def job_matches(job: Dict[str, Any], status: Optional[str]) -> bool:
    """A job matches a status when it has it, or (an array) when one of its children has it."""
    if status is None or job.get("status") == status:
        return True
    summary = (job.get("arrayProperties") or {}).get("statusSummary") or {}
    return bool(summary.get(status))


def cmd_jobs(args: argparse.Namespace) -> int:
    env = environment(args)
    jobs = [job for job in _our_jobs(env) if job_matches(job, args.status)]
    now = time.time()
    rows = []
    for job in jobs:
        array = job.get("arrayProperties") or {}
        summary = {s: int((array.get("statusSummary") or {}).get(s, 0)) for s in STATUS_ORDER}
        created = (job.get("createdAt") or 0) / 1000 or None
        started = (job.get("startedAt") or 0) / 1000 or None
        stopped = (job.get("stoppedAt") or 0) / 1000 or None
        rows.append({"jobId": job["jobId"], "jobName": job.get("jobName"), "status": job.get("status"),
                     "size": array.get("size") or 0,
                     "statusCounts": summary if array.get("size") else {},
                     "createdAt": created, "startedAt": started, "stoppedAt": stopped,
                     "duration": None if started is None else (stopped or now) - started})
    if args.output is OutputFormat.JSON:
        print_json(rows)
        return ExitCode.OK
    if not rows:
        which = f" with status {args.status} (or children in it)" if args.status else ""
        note(f"no batchfutures jobs{which} in {env.job_queue}")
        return ExitCode.OK
    if args.output is OutputFormat.TABLE:
        out(render_table(["JOB ID", "NAME", "STATUS", "CHILDREN", "CREATED (UTC)", "DURATION"], [
            [r["jobId"], r["jobName"], r["status"],
             f"{r['size']}: {counts_text(r['statusCounts'])}" if r["size"] else "-",
             when(r["createdAt"]), span(r["duration"])] for r in rows]))
        return ExitCode.OK
    for r in rows:
        children = f"  [{r['size']} children: {counts_text(r['statusCounts'])}]" if r["size"] else ""
        out(f"{r['jobId']}  {r['status']:<9}  {r['jobName']}{children}")
    return ExitCode.OK
