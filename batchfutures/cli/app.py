"""The `batchfutures` command line.

    batchfutures demo                 run a small map on the embedded default (or the env's queue)
    batchfutures status JOB [--watch] a job as a whole: status, times, children, failed calls, usage
    batchfutures logs JOB [--follow]  its console output (an array: JOB:<index>, or --all)
    batchfutures result JOB           its result(s), one line per call
    batchfutures cancel JOB           cancel or terminate it
    batchfutures jobs [--status S]    this library's jobs in the queue
    batchfutures report JOB -o F.html one self-contained HTML page: timeline, states, usage, failures
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
import logging
import os
import sys
import traceback
from typing import Callable, List, Optional

from .._version import __version__
from ..errors import BatchError, ConfigurationError, JobMetadataExpired
from ..statuses import STATUS_ORDER
from .admin import cmd_check, cmd_cleanup, cmd_image, cmd_template
from .demo import cmd_demo
from .envargs import environment
from .jobcommands import cmd_cancel, cmd_jobs, cmd_logs, cmd_result, cmd_status
from .output import EXIT_CODES_HELP, CLIError, ExitCode, OutputFormat, note

logger = logging.getLogger("batchfutures")


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


def _global_options(short_output: bool = True) -> argparse.ArgumentParser:
    """The options every command takes, before or after its name (defaults filled in later,
    so a value given before the command is not overwritten by the command's default);
    ``short_output=False``: --output without -o (a command whose -o is a file)."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("global options")
    group.add_argument("--workdir", default=argparse.SUPPRESS, metavar="FOLDER",
                       help="use the local emulator with this folder (it must exist, see --create)")
    group.add_argument("--create", action="store_true", default=argparse.SUPPRESS,
                       help="create the --workdir folder if it does not exist")
    group.add_argument("--output", *(["-o"] if short_output else []), type=_output_format,
                       default=argparse.SUPPRESS, metavar="{json,table,text}",
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

    text = ("write one self-contained HTML page about jobs: a timeline of every child, status "
            "counts, usage and memory advice, each failure with its reason and log tail")
    # its own -o (the page's file, as Nextflow's -with-report FILE): the global -o is --output
    report = commands.add_parser("report", help=text, description=text, epilog=EXIT_CODES_HELP,
                                 formatter_class=formatter, parents=[_global_options(False)])
    report.set_defaults(run=cmd_report)
    report.add_argument("jobs", nargs="+", metavar="JOB", help="Batch job ids (arrays or plain jobs)")
    report.add_argument("-o", "--file", dest="report_file", required=True, metavar="FILE.html",
                        help="where to write the page")

    command("check", "verify the environment end to end", cmd_check)
    command("template", "print the CloudFormation template", cmd_template)
    image = command("image", "print the worker image build and push commands", cmd_image)
    image.add_argument("--repository", help="ECR repository URI")
    image.add_argument("--region", help="AWS region of the repository")
    image.add_argument("--python", help="Python version of the image (default: this interpreter's)")
    image.add_argument("--platforms", help="linux/amd64, linux/arm64, or both comma-separated, or "
                       "all (default: this machine's; another needs QEMU)")
    image.add_argument("--extra-packages", metavar="PACKAGES", help="the libraries your functions "
                       "import (numpy,pandas), installed at the versions installed here "
                       "(default: $EXTRA_PIP_PACKAGES)")
    return parser


def cmd_report(args: argparse.Namespace) -> int:
    # start-up: report (the usage, costs and job views it draws) costs ~28 ms on every other
    # command and on --help
    from ..report import write

    print(write(environment(args), args.jobs, args.report_file))
    return int(ExitCode.OK)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    for name, default in _GLOBAL_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, default)
    return args


# -- errors -------------------------------------------------------------------------------------
def classify(error: BaseException) -> "tuple[ExitCode, str]":
    """The exit code and the one-line message for an error a command raised."""
    if isinstance(error, CLIError):
        return error.code, str(error)
    if isinstance(error, JobMetadataExpired):
        return ExitCode.NOT_FOUND, str(error)
    if isinstance(error, ConfigurationError):
        return ExitCode.USAGE, str(error)
    if isinstance(error, BatchError):
        return ExitCode.FAILED, f"{type(error).__name__}: {error}"
    try:
        # start-up: botocore's exceptions cost ~4 ms on --help; only a command that raised
        # needs them
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, ParamValidationError
    except ImportError:  # pragma: no cover - botocore is a dependency
        BotoCoreError = ClientError = NoCredentialsError = ParamValidationError = ()
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
        note("interrupted")
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return ExitCode.BROKEN_PIPE
    except Exception as error:
        code, message = classify(error)
        if args.debug:
            traceback.print_exc()
        try:
            note(message.splitlines()[0] if message else type(error).__name__)
        except BrokenPipeError:  # stderr closed too
            pass
        return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
