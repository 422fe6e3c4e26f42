"""The `batchfutures` command line.

    batchfutures demo                 run a small map on the embedded default (or the env's queue)
    batchfutures status JOB [--watch] a job as a whole: status, times, children, failed calls, usage
    batchfutures logs JOB [--follow]  its console output (an array: JOB:<index>, or --all)
    batchfutures result JOB           its result(s), one line per call
    batchfutures cancel JOB           cancel or terminate it
    batchfutures jobs [--status S]    this library's jobs in the queue
    batchfutures cleanup              remove the stored payloads of finished runs
    batchfutures check                verify the environment end to end, one line per part
    batchfutures template             print the CloudFormation template for AWS
    batchfutures image                print the commands that build and push the worker image

The environment comes from the BATCHFUTURES_* variables (an AWS queue), else the local
emulator; `--workdir` picks the emulator's folder. Global options (--workdir, --create,
--output, --debug) go before or after the command.

Every command ends: `logs` prints what is there and exits unless --follow, `result --timeout`
stops waiting at the timeout, and the commands that only observe a job leave it running.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import enum
import json
import logging
import os
import shlex
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from .._version import __version__

logger = logging.getLogger("batchfutures")


class ExitCode(enum.IntEnum):
    """One table for every command."""

    OK = 0
    FAILED = 1  # the job, a call, or a request failed
    USAGE = 2  # a usage or configuration error (bad option, bad --workdir, missing settings)
    NOT_FOUND = 3  # Batch (and storage) do not know the job
    TIMEOUT = 4  # --timeout passed before the job finished (the job goes on)
    INTERRUPTED = 130  # Ctrl-C
    BROKEN_PIPE = 141  # the output was closed (e.g. `| head`); nothing more is printed


EXIT_CODES_HELP = """exit codes:
  0    ok
  1    the job, one of its calls, or a request failed
  2    usage or configuration error
  3    job not found (never submitted, or Batch and storage forgot it)
  4    timed out (--timeout); the job goes on
  130  interrupted (Ctrl-C)
  141  output closed early (e.g. piped into head)
"""


class OutputFormat(str, enum.Enum):
    TEXT = "text"
    TABLE = "table"
    JSON = "json"


class CLIError(Exception):
    """A one-line message for stderr and the exit code that goes with it."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.code = code


# -- small output helpers -----------------------------------------------------------------------
def _out(text: str = "") -> None:
    print(text, flush=True)


def _note(text: str) -> None:
    print(f"batchfutures: {text}", file=sys.stderr, flush=True)


def _when(epoch: Optional[float]) -> str:
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch))


def _span(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns under upper-case headers, two spaces apart."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip()
                     for row in cells)


def _json(value: Any) -> None:
    _out(json.dumps(value, indent=2, default=str))


def _counts_text(counts: Dict[str, int]) -> str:
    return ", ".join(f"{status} {count}" for status, count in counts.items() if count) or "none"


# -- the environment ----------------------------------------------------------------------------
def _square(x: int) -> int:
    return x * x


def _environment(args: argparse.Namespace) -> Any:
    from ..environments import LocalEnvironment, resolve_environment

    if args.workdir is None:
        return resolve_environment(None)
    path = Path(args.workdir).expanduser()
    if path.exists() and not path.is_dir():
        raise CLIError(f"--workdir {args.workdir}: not a folder", ExitCode.USAGE)
    if not path.exists():
        if not args.create:
            raise CLIError(f"--workdir {args.workdir} does not exist (add --create to start a new "
                           f"local emulator there)", ExitCode.USAGE)
        try:
            path.mkdir(parents=True)
        except OSError as error:
            raise CLIError(f"--workdir {args.workdir}: cannot create it ({error.strerror})",
                           ExitCode.USAGE)
    return LocalEnvironment(path)


def _command_prefix(args: argparse.Namespace) -> str:
    if args.workdir is None:
        return "batchfutures"
    return f"batchfutures --workdir {shlex.quote(str(args.workdir))}"


# -- demo ---------------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from ..executor import BatchExecutor

    env = _environment(args)
    count, chunksize = args.items, args.chunksize
    _out(f"batchfutures {__version__}: squaring {count} numbers on {env!r} (chunksize {chunksize})")
    started = time.monotonic()
    if args.dry_run:
        return _demo_dry_run(env, count, chunksize)
    with BatchExecutor(env) as executor:
        futures = executor.map_futures(_square, range(count), chunksize=chunksize)
        job_ids = sorted({f.job_id.partition(":")[0] for f in futures if f.job_id})
        children = -(-count // chunksize)
        prefix = _command_prefix(args)
        for job_id in job_ids:
            one = f"{job_id}:0" if children > 1 else job_id
            _out(f"job {job_id} ({children} {'children' if children > 1 else 'child'}); inspect it with:")
            _out(f"  {prefix} status {job_id}")
            _out(f"  {prefix} logs {one}")
            _out(f"  {prefix} result {job_id}")
        results = [future.result() for future in futures]
    _out(repr(results))
    _out(f"{count} results in {time.monotonic() - started:.2f} s")
    if results != [x * x for x in range(count)]:
        raise CLIError("the demo's results are wrong", ExitCode.FAILED)
    return ExitCode.OK


def _demo_dry_run(env: Any, count: int, chunksize: int) -> int:
    """What the demo would send: its SubmitJob request and the objects, nothing sent."""
    import json

    from ..errors import DryRunResult
    from ..executor import BatchExecutor

    with BatchExecutor(env, dry_run=True) as executor:
        error = executor.map_futures(_square, range(count), chunksize=chunksize)[0].exception()
    if not isinstance(error, DryRunResult):
        raise CLIError(f"the dry run did not produce its requests: {error!r}", ExitCode.FAILED)
    _out("dry run: nothing was sent. SubmitJob request(s):")
    for request in error.requests:
        _out(json.dumps(request, indent=2, sort_keys=True))
    _out("objects that would be written (key, bytes):")
    for key, size in error.objects:
        _out(f"  {key}  {size}")
    return ExitCode.OK


# -- status -------------------------------------------------------------------------------------
def _status_exit(info: Any, failures: Any) -> int:
    if info.status == "FAILED" or (failures is not None and failures.failed):
        return ExitCode.FAILED
    return ExitCode.OK


TEXT_LIST_LIMIT = 20  # failed children / calls the text view lists; table and json list all


def _print_status(info: Any, failures: Any, output: OutputFormat, usage: Any = None) -> None:
    from ..jobview import duration

    if output is OutputFormat.JSON:
        data = info.as_dict()
        if failures is not None:
            data.update(failures.as_dict())
        if usage is not None:
            data["usage"] = usage.as_dict()
        _json(data)
        return
    if output is OutputFormat.TABLE:
        if info.is_array:
            _out(render_table(
                ["INDEX", "STATUS", "EXIT", "STARTED (UTC)", "DURATION", "REASON"],
                [[c.index, c.status, c.exit_code, _when(c.started_at),
                  _span(duration(c.started_at, c.stopped_at, time.time())),
                  c.status_reason] for c in info.children]))
        else:
            _out(render_table(
                ["JOB ID", "NAME", "STATUS", "EXIT", "CREATED (UTC)", "DURATION", "REASON"],
                [[info.job_id, info.name, info.status, info.exit_code, _when(info.created_at),
                  _span(info.duration(time.time())), info.status_reason]]))
        if failures is not None and failures.failed:
            _out("")
            _out(render_table(["ITEM", "CHILD", "ERROR", "MESSAGE"],
                              [[f.item, f.child, f.error_type, f.message] for f in failures.failed]))
        if usage is not None:
            _out("")
            _out(render_table(
                ["CALLS", "CPU S", "WALL S", "PEAK MIB", "VCPU-S", "GIB-S", "MEMORY MIB"],
                [[usage.calls, f"{usage.cpu_s:.2f}", f"{usage.wall_s:.2f}",
                  "-" if usage.peak_memory_mib is None else f"{usage.peak_memory_mib:.0f}",
                  "-" if usage.vcpu_s is None else f"{usage.vcpu_s:.1f}",
                  "-" if usage.gib_s is None else f"{usage.gib_s:.1f}", usage.memory_mib]]))
            if usage.advice:
                _out(usage.advice)
        return
    rows = [("job", info.job_id), ("name", info.name), ("status", info.status)]
    if info.status_reason:
        rows.append(("reason", info.status_reason))
    rows += [("created", _when(info.created_at) + " UTC"), ("started", _when(info.started_at)),
             ("stopped", _when(info.stopped_at)), ("duration", _span(info.duration(time.time())))]
    if info.is_array:
        rows.append(("children", f"{info.size}: {_counts_text(info.status_counts)}"))
        failed = [child for child in info.children if child.status == "FAILED"]
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
    if usage is not None:  # issue 22: used, reserved, and the memory setting against the peak
        lines = list(usage.lines())
        rows.append(("usage", lines[0]))
        rows += [("", line) for line in lines[1:]]
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        _out(f"{key.ljust(width)}  {value}")


def _watch_line(info: Any) -> str:
    if info.is_array:
        counts = dict(info.status_counts)
        queued = counts.pop("SUBMITTED", 0) + counts.pop("PENDING", 0)
        shown = {"PENDING": queued, **counts}
        return f"{info.job_id}  {info.status:<9}  " + "  ".join(
            f"{status} {count}" for status, count in shown.items())
    return f"{info.job_id}  {info.status}"


def _watch(env: Any, args: argparse.Namespace) -> Any:
    """Refresh Batch's counts per status until the job ends; the final description."""
    from .. import jobview

    interactive = sys.stdout.isatty() and args.output is OutputFormat.TEXT
    last = None
    while True:
        info = jobview.describe(env.batch, args.job, children=False)
        line = _watch_line(info)
        if interactive:
            print("\r" + line, end="\x1b[K", flush=True)
        elif line != last:
            if args.output is OutputFormat.JSON:
                print(json.dumps({"jobId": info.job_id, "status": info.status,
                                  "statusCounts": info.status_counts}), flush=True)
            else:
                _out(line)
        last = line
        if info.ended:
            break
        time.sleep(args.interval)
    if interactive:
        print(flush=True)
    return info


def cmd_status(args: argparse.Namespace) -> int:
    from .. import jobview

    env = _environment(args)
    if args.watch:
        _watch(env, args)
    info = jobview.describe(env.batch, args.job, log_group=env.log_group)
    try:
        failures = jobview.failed_calls(env.storage, info)
    except Exception as error:  # Batch's answer is still worth showing
        logger.debug("could not read the results of %s", args.job, exc_info=True)
        _note(f"could not read the results of {args.job} from {env.storage.root_url}: {error}")
        failures = None
    if args.watch and args.output is OutputFormat.JSON:
        return _status_exit(info, failures)  # the JSON lines were the output
    usage = jobview.job_usage(env.storage, info, calls=failures) if failures is not None else None
    _print_status(info, failures, args.output, usage)
    return _status_exit(info, failures)


# -- logs ---------------------------------------------------------------------------------------
def _stream_lines(logs: Any, group: str, stream: str, cursor: Any) -> Iterator[str]:
    """Lines after ``cursor`` (a `logs.Cursor`, moved on as pages are read), yielded as each
    page of GetLogEvents arrives: the log is printed as it is read, never held whole."""
    from .. import batchapi
    from .. import logs as logreader

    try:
        yield from logreader.lines_after(logs, group, stream, cursor)
    except Exception as error:
        if batchapi.error_code(error) != "ResourceNotFoundException":
            raise
        # the stream is not there yet


def cmd_logs(args: argparse.Namespace) -> int:
    from .. import jobview
    from .. import logs as logreader
    from ..logs import Cursor

    env = _environment(args)
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
            _out(f"==> {info.job_id}:{index} <==")
            child = jobview.describe(env.batch, f"{info.job_id}:{index}", children=False,
                                     log_group=env.log_group)
            if child.log_stream:
                for line in _stream_lines(env.logs, child.log_group, child.log_stream, Cursor()):
                    _out(line)
        return ExitCode.OK
    if args.follow:
        if not info.log_stream:
            _note(f"job {args.job} is {info.status}; waiting for its output")
        def new_stream(description: Dict[str, Any], first: bool) -> None:
            if not first:  # a retry writes a new stream: it is read from its start
                ended = description.get("status") in logreader.FINISHED
                number = len(description.get("attempts") or []) + (0 if ended else 1)
                _note(f"job {args.job}: attempt {number} started, a new log stream")

        for line in logreader.follow_job(env.batch, env.logs, args.job, env.log_group,
                                         poll=args.interval, on_new_stream=new_stream):
            _out(line)
        return ExitCode.OK
    if not info.log_stream:
        _note(f"no output yet: job {args.job} is {info.status}")
        return ExitCode.OK
    for line in _stream_lines(env.logs, info.log_group, info.log_stream, Cursor()):
        _out(line)  # printed as each page is read
    return ExitCode.OK


# -- result -------------------------------------------------------------------------------------
def _value_json(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return None


def cmd_result(args: argparse.Namespace) -> int:
    from ..executor import BatchExecutor

    env = _environment(args)
    executor = BatchExecutor(env)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    collected: List[Dict[str, Any]] = []  # for json and table, printed at the end
    failed = 0
    streaming = args.output is OutputFormat.TEXT

    def emit(index: int, ok: bool, value: Any) -> None:
        if streaming:
            _out(repr(value) if ok else f"{type(value).__name__}: {value}")
        elif ok:
            collected.append({"index": index, "ok": True, "repr": repr(value),
                              "value": _value_json(value)})
        else:
            collected.append({"index": index, "ok": False, "error": type(value).__name__,
                              "message": str(value)})

    def flush_collected() -> None:
        if args.output is OutputFormat.JSON:
            _json(collected)
        elif args.output is OutputFormat.TABLE:
            _out(render_table(["INDEX", "OUTCOME", "VALUE"], [
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
        _note(f"{failed} of {len(futures)} call(s) of {args.job} failed")
        return ExitCode.FAILED
    return ExitCode.OK


# -- cancel -------------------------------------------------------------------------------------
def cmd_cancel(args: argparse.Namespace) -> int:
    from .. import batchapi, jobview

    env = _environment(args)
    info = jobview.describe(env.batch, args.job, children=False)
    if info.ended:
        raise CLIError(f"job {args.job} already {info.status}: nothing to cancel", ExitCode.FAILED)
    reason = f"batchfutures: cancelled from the command line ({args.reason})"
    batchapi.call(env.batch.terminate_job, jobId=args.job, reason=reason)
    _out(f"{args.job}: termination requested (it was {info.status})")
    return ExitCode.OK


# -- jobs ---------------------------------------------------------------------------------------
def _our_jobs(env: Any) -> List[Dict[str, Any]]:
    from .. import batchapi
    from ..statuses import STATUS_ORDER

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
    from ..statuses import STATUS_ORDER

    env = _environment(args)
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
        _json(rows)
        return ExitCode.OK
    if not rows:
        which = f" with status {args.status} (or children in it)" if args.status else ""
        _note(f"no batchfutures jobs{which} in {env.job_queue}")
        return ExitCode.OK
    if args.output is OutputFormat.TABLE:
        _out(render_table(["JOB ID", "NAME", "STATUS", "CHILDREN", "CREATED (UTC)", "DURATION"], [
            [r["jobId"], r["jobName"], r["status"],
             f"{r['size']}: {_counts_text(r['statusCounts'])}" if r["size"] else "-",
             _when(r["createdAt"]), _span(r["duration"])] for r in rows]))
        return ExitCode.OK
    for r in rows:
        children = f"  [{r['size']} children: {_counts_text(r['statusCounts'])}]" if r["size"] else ""
        _out(f"{r['jobId']}  {r['status']:<9}  {r['jobName']}{children}")
    return ExitCode.OK


# -- cleanup ------------------------------------------------------------------------------------
def cmd_cleanup(args: argparse.Namespace) -> int:
    from .. import cleanup

    env = _environment(args)
    storage = env.storage
    reports = cleanup.survey(storage, env.batch, horizon_seconds=args.older_than * 3600,
                             all_finished=args.all)
    chosen = [r for r in reports if r.decision.remove]
    if args.output is OutputFormat.JSON:
        _json([r.as_dict() for r in reports])
    else:
        for report in reports:
            verb = ("would remove" if args.dry_run else "removing") if report.decision.remove \
                else "keeping"
            _out(f"{verb} {report.url}: {report.decision.reason}")
    if not args.dry_run:
        cleanup.remove(storage, chosen)
    if args.output is not OutputFormat.JSON:
        _out(f"{len(chosen)} run(s) {'to remove' if args.dry_run else 'removed'}")
    return ExitCode.OK


# -- check, template, image ---------------------------------------------------------------------
def cmd_check(args: argparse.Namespace) -> int:
    from .checks import run_checks

    env = _environment(args)
    failures = 0
    for name, ok, detail in run_checks(env):
        failures += not ok
        _out(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    return ExitCode.FAILED if failures else ExitCode.OK


def cmd_template(args: argparse.Namespace) -> int:
    from .setup_resources import template_text

    print(template_text(), end="", flush=True)
    return ExitCode.OK


def cmd_image(args: argparse.Namespace) -> int:
    from .setup_resources import image_commands

    _out(image_commands(python_version=args.python, repository=args.repository, region=args.region))
    return ExitCode.OK


# -- the parser ---------------------------------------------------------------------------------
_GLOBAL_DEFAULTS = {"workdir": None, "create": False, "debug": False, "output": OutputFormat.TEXT}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def _float_at_least(minimum: float, *, inclusive: bool, wording: str) -> Callable[[str], float]:
    """An argparse type: a number, more than (or with ``inclusive`` at least) ``minimum``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number")
        if not (value >= minimum if inclusive else value > minimum):
            raise argparse.ArgumentTypeError(f"{text} must be {wording}")
        return value

    return parse


_positive_float = _float_at_least(0, inclusive=False, wording="more than 0")
_non_negative_float = _float_at_least(0, inclusive=True, wording="0 or more")


def _output_format(text: str) -> OutputFormat:
    try:
        return OutputFormat(text.lower())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not one of {', '.join(f.value for f in OutputFormat)}")


def _global_options() -> argparse.ArgumentParser:
    """The options every command takes, before or after its name (defaults filled in later,
    so a value given before the command is not overwritten by the command's default)."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("global options")
    group.add_argument("--workdir", default=argparse.SUPPRESS, metavar="FOLDER",
                       help="use the local emulator with this folder (it must exist, see --create)")
    group.add_argument("--create", action="store_true", default=argparse.SUPPRESS,
                       help="create the --workdir folder if it does not exist")
    group.add_argument("--output", "-o", type=_output_format, default=argparse.SUPPRESS,
                       metavar="{json,table,text}",
                       help="output format of status, jobs, result and cleanup (default text)")
    group.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks and the library's debug log on stderr")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _global_options()
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="batchfutures", description=__doc__, epilog=EXIT_CODES_HELP,
                                     formatter_class=formatter, parents=[common])
    parser.add_argument("--version", action="version", version=f"batchfutures {__version__}",
                        help="print the version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     help="what to do (`batchfutures COMMAND --help` for its options)")

    def command(name: str, text: str, run: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=text, description=text, epilog=EXIT_CODES_HELP,
                                  formatter_class=formatter, parents=[common])
        sub.set_defaults(run=run)
        return sub

    def job_argument(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("job", metavar="JOB", help="Batch job id, or '<array job id>:<index>'")

    demo = command("demo", "run a small map, print its job id, how to inspect it, and its results",
                   cmd_demo)
    demo.add_argument("--items", type=_positive_int, default=10, help="how many numbers to square (10)")
    demo.add_argument("--chunksize", type=_positive_int, default=2,
                      help="items per array child (2)")
    demo.add_argument("--dry-run", action="store_true",
                      help="print the SubmitJob request and the objects it would write; send nothing")

    status = command("status", "show a job as a whole: status, times, children, failed calls; "
                     "exit 1 when it or one of its calls failed", cmd_status)
    job_argument(status)
    status.add_argument("--watch", action="store_true",
                        help="refresh Batch's counts per status until the job ends")
    status.add_argument("--interval", type=_positive_float, default=2.0, metavar="SECONDS",
                        help="seconds between refreshes with --watch (2)")

    logs = command("logs", "print a job's console output so far (its latest attempt)", cmd_logs)
    job_argument(logs)
    logs.add_argument("--follow", "-f", action="store_true",
                      help="keep printing new output until the job ends")
    logs.add_argument("--all", action="store_true",
                      help="for an array job: print every child's output, one after the other")
    logs.add_argument("--interval", type=_positive_float, default=1.0, metavar="SECONDS",
                      help="seconds between reads with --follow (1)")

    result = command("result", "print a job's results in order, one per call; exit 1 when a "
                     "call failed", cmd_result)
    job_argument(result)
    result.add_argument("--timeout", type=_positive_float, default=None, metavar="SECONDS",
                        help="stop waiting after this many seconds (exit 4; the job goes on)")

    cancel = command("cancel", "cancel a queued job or terminate a running one", cmd_cancel)
    job_argument(cancel)
    cancel.add_argument("--reason", default="no reason given",
                        help="why, recorded in the job's status reason")

    from ..statuses import STATUS_ORDER

    jobs = command("jobs", "list this library's jobs in the queue", cmd_jobs)
    jobs.add_argument("--status", choices=STATUS_ORDER, type=str.upper,
                      help="only jobs in this status, or array jobs with children in it")

    cleanup = command("cleanup", "remove the stored payloads and results of finished runs "
                      "(never a run in progress)", cmd_cleanup)
    cleanup.add_argument("--older-than", type=_non_negative_float, default=24.0, metavar="HOURS",
                         help="remove finished runs untouched for this long (default 24)")
    cleanup.add_argument("--all", action="store_true",
                         help="remove every finished run, whatever its age")
    cleanup.add_argument("--dry-run", action="store_true",
                         help="say what would be removed, remove nothing")

    command("check", "verify the environment end to end", cmd_check)
    command("template", "print the CloudFormation template", cmd_template)
    image = command("image", "print the worker image build and push commands", cmd_image)
    image.add_argument("--repository", help="ECR repository URI")
    image.add_argument("--region", help="AWS region of the repository")
    image.add_argument("--python", help="Python version of the image (default: this interpreter's)")
    return parser


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    for name, default in _GLOBAL_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, default)
    return args


# -- errors -------------------------------------------------------------------------------------
def classify(error: BaseException) -> "tuple[ExitCode, str]":
    """The exit code and the one-line message for an error a command raised."""
    from ..errors import BatchError, ConfigurationError, JobMetadataExpired

    if isinstance(error, CLIError):
        return error.code, str(error)
    if isinstance(error, JobMetadataExpired):
        return ExitCode.NOT_FOUND, str(error)
    if isinstance(error, ConfigurationError):
        return ExitCode.USAGE, str(error)
    if isinstance(error, BatchError):
        return ExitCode.FAILED, f"{type(error).__name__}: {error}"
    try:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, ParamValidationError
    except ImportError:  # pragma: no cover - botocore is a dependency
        BotoCoreError = ClientError = NoCredentialsError = ParamValidationError = ()  # type: ignore
    if isinstance(error, ClientError):
        details = error.response.get("Error", {})
        message = details.get("Message") or str(error)
        operation = getattr(error, "operation_name", "") or "AWS"
        code = ExitCode.NOT_FOUND if "does not exist" in message or "NotFound" in details.get(
            "Code", "") else ExitCode.FAILED
        return code, f"{operation}: {message}"
    if isinstance(error, (NoCredentialsError, ParamValidationError)):
        return ExitCode.USAGE, f"AWS: {error}"
    if isinstance(error, BotoCoreError):
        return ExitCode.FAILED, f"AWS: {error}"
    if isinstance(error, OSError) and error.filename:
        return ExitCode.FAILED, f"{error.filename}: {error.strerror or error}"
    return ExitCode.FAILED, f"{type(error).__name__}: {error} (--debug shows the traceback)"


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the exit flush does not complain."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.debug:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        _note("interrupted")
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return ExitCode.BROKEN_PIPE
    except Exception as error:
        code, message = classify(error)
        if args.debug:
            traceback.print_exc()
        try:
            _note(message.splitlines()[0] if message else type(error).__name__)
        except BrokenPipeError:  # stderr closed too
            pass
        return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
