"""`python -m batchfutures.emulator`: the AWS Batch emulator as a local HTTP endpoint.

    python -m batchfutures.emulator [--port N] [--host H] [--folder DIR] [--max-vcpus N]
                                    [--gpus N] [--metadata-ttl S] [--isolation auto|cgroups|rlimit]
                                    [--inherit-client-path] [--launcher process|threads]
                                    [--image 'PATTERN=COMMAND' ...]
                                    [--summary-lag S] [--throttle-rate F] [--server-error-rate F]
                                    [--lost-reply-rate F] [--host-loss-rate F]
                                    [--host-loss-after S] [--fault-operations A,B]
                                    [--fault-seed N] [--account-tps R] [--account-burst N]
                                    [--item-throttle-rate F] [--child-stops-refused A,B]
                                    [--spot-reclaim-rate F] [--spot-reclaim-after S]
                                    [--spot-notice S] [--spot-platform SPOT|FARGATE_SPOT]
                                    [--spot-queues A,B] [--control-plane-delay S]
                                    [--access-key-id ID --secret-access-key-file PATH]

The fault flags set the emulator's FaultProfile (faults.py); all are off by default.
`--launcher threads` runs each worker attempt in a thread of this process (runtime/threads.py).
`--image 'PATTERN=COMMAND'` (repeatable, first match wins) says what a job runs when its job
definition and overrides give no command and the definition's `image` matches the fnmatch
PATTERN, as a container runs its image's entry point; COMMAND is split as a shell would (shlex),
a leading `python` meaning the image's interpreter. E.g. Lithops' aws_batch runtime:

    --image '*lithops*=python -m lithops.serverless.backends.aws_batch.entry_point'

The endpoint serves only requests SigV4-signed with its credentials (auth.py). The secret is
never in argv (any local user reads /proc/<pid>/cmdline) nor on stdout (a `> emulator.log` under
umask 022 is world-readable): it comes from BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY, or from
--secret-access-key-file PATH (a file of this user's, mode 0600, not a symlink), with the key id
from --access-key-id or BATCHFUTURES_EMULATOR_ACCESS_KEY_ID; else a pair is made at start. Either
way the URL and the pair are written only to <folder>/endpoint.json (mode 0600 from its creation;
keys `endpoint_url`, `aws_access_key_id`, `aws_secret_access_key`). `--secret-access-key SECRET`
is refused, naming the two ways to pass it. A --host other than a loopback address is refused
unless the credentials were given explicitly, with a secret of at least 20 characters.

Prints the endpoint URL as its only line (the credentials are in endpoint.json), then serves
until SIGINT or SIGTERM; jobs still running then are ended and recorded FAILED. Point a stock
boto3 client at it with the pair of endpoint.json:

    boto3.client("batch", endpoint_url=URL, region_name="us-east-1",
                 aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shlex
import signal
import stat
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

if TYPE_CHECKING:  # pragma: no cover
    from .faults import FaultProfile


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
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs jobs may use (default: this machine's NVIDIA GPUs)")
    parser.add_argument("--metadata-ttl", type=float, default=None,
                        help="seconds a finished job stays describable (default: one day)")
    parser.add_argument("--isolation", choices=["auto", "cgroups", "rlimit"], default=None,
                        help="how memory and CPU are limited: cgroups where they can be made "
                             "(auto, the default), cgroups or fail, or RLIMIT_DATA and sampling")
    parser.add_argument("--inherit-client-path", action="store_true",
                        help="give attempts this process's sys.path and working directory")
    parser.add_argument("--launcher", choices=["process", "threads"], default="process",
                        help="how attempts run: a process each (default), or the worker's code "
                             "in threads of this process (no memory limits; for benchmarks)")
    parser.add_argument("--image", action="append", default=[], metavar="PATTERN=COMMAND",
                        help="what a job with no command runs when its definition's image "
                             "matches the fnmatch PATTERN (its entry point; repeatable, first "
                             "match wins), e.g. '*lithops*=python -m "
                             "lithops.serverless.backends.aws_batch.entry_point'")
    faults = parser.add_argument_group("faults", "AWS's harshness on demand (all off by default)")
    faults.add_argument("--summary-lag", type=float, default=0.0, metavar="S",
                        help="refresh an array's statusSummary at most every S seconds")
    faults.add_argument("--throttle-rate", type=float, default=0.0, metavar="F",
                        help="answer fraction F of API calls with 429 TooManyRequestsException")
    faults.add_argument("--server-error-rate", type=float, default=0.0, metavar="F",
                        help="answer fraction F of API calls with 500 ServerException")
    faults.add_argument("--lost-reply-rate", type=float, default=0.0, metavar="F",
                        help="answer fraction F of SubmitJob calls with 500 after creating the job")
    faults.add_argument("--host-loss-rate", type=float, default=0.0, metavar="F",
                        help="lose the host of fraction F of attempts while they run")
    faults.add_argument("--host-loss-after", type=float, default=0.5, metavar="S",
                        help="a lost host goes within S seconds of RUNNING (default 0.5)")
    faults.add_argument("--fault-operations", default=None, metavar="A,B",
                        help="throttle and fail only these operations (e.g. ListJobs,DescribeJobs)")
    faults.add_argument("--fault-seed", type=int, default=None, metavar="N",
                        help="seed of the fault random streams, for reproducible runs")
    faults.add_argument("--account-tps", type=float, default=0.0, metavar="R",
                        help="the account's API budget: R calls a second, every Batch operation "
                             "of every client together (AWS: 50); over it, 429 "
                             "TooManyRequestsException")
    faults.add_argument("--account-burst", type=float, default=None, metavar="N",
                        help="calls the budget lets through at once (default: a second's worth)")
    faults.add_argument("--item-throttle-rate", type=float, default=0.0, metavar="F",
                        help="answer fraction F of the jobs of a bulk CancelJobs/TerminateJobs "
                             "ThrottlingException in the answer's errors (not stopped)")
    faults.add_argument("--child-stops-refused", default=None, metavar="A,B",
                        help="refuse these actions (CancelJob,TerminateJob) on an array child, "
                             "as the stack's client policy may on AWS (a child has no tags)")
    faults.add_argument("--spot-reclaim-rate", type=float, default=0.0, metavar="F",
                        help="Spot reclaims fraction F of attempts: SIGTERM, then SIGKILL after "
                             "the notice, with AWS's Spot reason")
    faults.add_argument("--spot-reclaim-after", type=float, default=1.0, metavar="S",
                        help="a reclaimed attempt gets its notice S seconds after RUNNING")
    faults.add_argument("--spot-notice", type=float, default=120.0, metavar="S",
                        help="seconds from SIGTERM to SIGKILL (AWS: two minutes)")
    faults.add_argument("--spot-platform", choices=["SPOT", "FARGATE_SPOT"], default="FARGATE_SPOT",
                        help="whose reason a reclaim ends with, outside a created Spot "
                             "environment (default FARGATE_SPOT)")
    faults.add_argument("--spot-queues", default=None, metavar="A,B",
                        help="reclaim only jobs of these queues (default: every queue)")
    parser.add_argument("--control-plane-delay", type=float, default=0.5, metavar="S",
                        help="seconds a compute environment or job queue stays CREATING, "
                             "UPDATING or DELETING")
    access = parser.add_argument_group(
        "access", "the credentials a request must be signed with (SigV4, as boto3 signs)")
    access.add_argument("--access-key-id", default=None, metavar="ID",
                        help="default $BATCHFUTURES_EMULATOR_ACCESS_KEY_ID, else one made at start")
    access.add_argument("--secret-access-key-file", type=Path, default=None, metavar="PATH",
                        help="a file of yours, mode 0600, holding the secret; default "
                             "$BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY, else one made at start "
                             "(both are written to <folder>/endpoint.json, mode 0600)")
    # never takes a value: a secret in argv is readable by every local user (/proc/PID/cmdline)
    access.add_argument("--secret-access-key", nargs="?", const=True, default=None,
                        metavar="SECRET", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


ACCESS_KEY_VARIABLE = "BATCHFUTURES_EMULATOR_ACCESS_KEY_ID"
SECRET_KEY_VARIABLE = "BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY"


SECRET_FILE_LIMIT = 4096  # bytes: a secret, not a file to read whole whatever its size
HOW_TO_PASS_THE_SECRET = (
    f"pass the secret in the variable {SECRET_KEY_VARIABLE} or in a file of yours with mode 0600 "
    "(--secret-access-key-file PATH), or give neither and read the pair made at start from "
    "<folder>/endpoint.json")


def read_secret_file(path: Path) -> str:
    """The secret in ``path``: a regular file (not a symlink, FIFO or device) owned by this user
    and private to them (ConfigurationError otherwise), at most SECRET_FILE_LIMIT bytes."""
    from ..errors import ConfigurationError  # start-up: as main's
    from ..workdir import check_private_file, open_private

    descriptor = open_private(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(descriptor, "rb") as stream:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise ConfigurationError(f"the secret access key file {path} is not a regular file")
        check_private_file(descriptor, path, "secret access key file")
        data = stream.read(SECRET_FILE_LIMIT + 1)
    if len(data) > SECRET_FILE_LIMIT:
        raise ConfigurationError(f"the secret access key file {path} is over "
                                 f"{SECRET_FILE_LIMIT} bytes: not a secret")
    secret = data.decode("utf-8", "replace").strip()
    if not secret:
        raise ConfigurationError(f"the secret access key file {path} is empty")
    return secret


def given_credentials(args: argparse.Namespace) -> Optional[Tuple[str, str]]:
    """The pair given by --access-key-id or its variable and by --secret-access-key-file or its
    variable; None when neither gives one. ValueError for a secret in argv, or half a pair."""
    if args.secret_access_key is not None:
        raise ValueError("refusing --secret-access-key: a secret on the command line is "
                         "readable by every user of this machine (/proc/<pid>/cmdline); "
                         + HOW_TO_PASS_THE_SECRET)
    key_id = args.access_key_id or os.environ.get(ACCESS_KEY_VARIABLE) or None
    if args.secret_access_key_file is not None:
        secret: Optional[str] = read_secret_file(args.secret_access_key_file)
    else:
        secret = os.environ.get(SECRET_KEY_VARIABLE) or None
    if (key_id is None) != (secret is None):
        raise ValueError("give both an access key id (--access-key-id or "
                         f"{ACCESS_KEY_VARIABLE}) and a secret access key "
                         f"(--secret-access-key-file or {SECRET_KEY_VARIABLE}), or neither")
    return (key_id, secret) if key_id is not None and secret is not None else None


def write_endpoint_file(folder: Path, endpoint_url: str, key_id: str, secret: str) -> Path:
    """<folder>/endpoint.json, mode 0600 from its creation: written to a new file of a random
    name in the (checked) folder, opened O_CREAT|O_EXCL|O_NOFOLLOW, then renamed over."""
    from ..workdir import open_private, secure_folder  # start-up: as main's

    folder = secure_folder(folder, "emulator folder")
    path = folder / "endpoint.json"
    aside = folder / f".endpoint.json.{secrets.token_hex(8)}"
    fd = open_private(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "w") as stream:
            json.dump({"endpoint_url": endpoint_url, "aws_access_key_id": key_id,
                       "aws_secret_access_key": secret}, stream, indent=2)
            stream.write("\n")
        os.replace(aside, path)
    except BaseException:
        try:
            os.unlink(aside)
        except OSError:
            pass
        raise
    return path


def image_option(text: str) -> Tuple[str, List[str]]:
    """One --image value, PATTERN=COMMAND (split at the first '='; COMMAND as a shell would):
    (pattern, argv). ValueError when either side is empty or COMMAND does not parse."""
    pattern, equals, command = text.partition("=")
    try:
        argv = shlex.split(command)
    except ValueError as error:  # an unclosed quote
        raise ValueError(f"--image {text!r}: {error}") from None
    if not equals or not pattern.strip() or not argv:
        raise ValueError(f"--image {text!r}: give PATTERN=COMMAND, e.g. "
                         "'*my-image*=python -m my.entry_point'")
    return pattern.strip(), argv


def image_options(values: List[str]) -> Dict[str, List[str]]:
    """The --image values in the order given (the first matching pattern wins)."""
    images: Dict[str, List[str]] = {}
    for text in values:
        pattern, argv = image_option(text)
        images.setdefault(pattern, argv)
    return images


def fault_profile(args: argparse.Namespace) -> FaultProfile:
    from .faults import FaultProfile  # start-up: as main's

    operations = None
    if args.fault_operations:
        operations = frozenset(p.strip() for p in args.fault_operations.split(",") if p.strip())
    return FaultProfile(summary_lag=args.summary_lag, throttle_rate=args.throttle_rate,
                        server_error_rate=args.server_error_rate,
                        lost_reply_rate=args.lost_reply_rate, host_loss_rate=args.host_loss_rate,
                        host_loss_after=args.host_loss_after, operations=operations,
                        seed=args.fault_seed, account_tps=args.account_tps,
                        account_burst=args.account_burst,
                        item_throttle_rate=args.item_throttle_rate,
                        child_stops_refused=frozenset(
                            p.strip() for p in (args.child_stops_refused or "").split(",")
                            if p.strip()),
                        spot_reclaim_rate=args.spot_reclaim_rate,
                        spot_reclaim_after=args.spot_reclaim_after, spot_notice=args.spot_notice,
                        spot_platform=args.spot_platform,
                        spot_queues=None if args.spot_queues is None else frozenset(
                            p.strip() for p in args.spot_queues.split(",") if p.strip()))


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # start-up: the server, the service (botocore's models) and what they use cost ~165 ms,
    # which --help and a refused flag never need (so for the imports in the helpers above)
    from .auth import check_secret_strength, is_loopback, new_credentials
    from .server import EmulatorServer
    from .service import BatchEmulator

    try:
        given = given_credentials(args)
        if given is not None:
            check_secret_strength(given[1], args.host)
    except (ValueError, OSError) as error:  # ConfigurationError is a ValueError
        print(f"batchfutures emulator: {error}", file=sys.stderr)
        return 2
    if given is None and not is_loopback(args.host):
        print(f"batchfutures emulator: refusing to listen on {args.host}, not a loopback address, "
              "with credentials made up at start: give --access-key-id (or "
              f"{ACCESS_KEY_VARIABLE}) and the secret in {SECRET_KEY_VARIABLE} or "
              "--secret-access-key-file PATH to serve other machines", file=sys.stderr)
        return 2
    key_id, secret = given if given is not None else new_credentials()

    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    options = {}
    if args.max_vcpus is not None:
        options["max_vcpus"] = args.max_vcpus
    if args.metadata_ttl is not None:
        options["metadata_ttl"] = args.metadata_ttl
    if args.gpus is not None:
        options["gpus"] = args.gpus
    try:
        folder = args.folder or default_folder()
        emulator = BatchEmulator(folder, isolation=args.isolation,
                                 inherit_client_path=args.inherit_client_path,
                                 faults=fault_profile(args), launcher=args.launcher,
                                 control_plane_delay=args.control_plane_delay,
                                 images=image_options(args.image), **options)
    except (ValueError, TypeError, OSError) as error:  # a bad option or an unusable folder
        print(f"batchfutures emulator: {error}", file=sys.stderr)
        return 2
    server = EmulatorServer(emulator, host=args.host, port=args.port, access_key_id=key_id,
                            secret_access_key=secret)
    try:
        try:
            server.start()
            write_endpoint_file(Path(folder), server.endpoint_url, key_id, secret)
        except OSError as error:  # the port is taken, or not ours to bind, or the folder
            print(f"batchfutures emulator: cannot serve on {args.host}:{args.port}: {error}",
                  file=sys.stderr)
            return 2
        print(server.endpoint_url, flush=True)  # the only line: the pair is in endpoint.json
        print(f"batchfutures emulator: sign requests with access key id {key_id}; the secret is "
              f"in {Path(folder) / 'endpoint.json'} (mode 0600), never printed", file=sys.stderr,
              flush=True)
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
