"""The environment a command acts on, from its global options (--workdir, --create), and the
command line that names that same environment again in the hints a command prints."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from ..workdir import make_private_dirs
from .output import CLIError, ExitCode

if TYPE_CHECKING:
    from ..environments import BaseEnvironment


def environment(args: argparse.Namespace) -> BaseEnvironment:
    """The settings' environment, or the local emulator in --workdir (made with --create)."""
    # start-up: environments (botocore, fsspec, tenacity) adds ~75 ms to the CLI's start;
    # `template`, `image` and --help never make an environment
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
            make_private_dirs(path)  # 0700 whatever the umask: LocalEnvironment checks it
        except OSError as error:
            raise CLIError(f"--workdir {args.workdir}: cannot create it ({error.strerror})",
                           ExitCode.USAGE)
    return LocalEnvironment(path)


def command_prefix(args: argparse.Namespace) -> str:
    """`batchfutures`, with the --workdir this run was given, for commands to copy and paste."""
    if args.workdir is None:
        return "batchfutures"
    return f"batchfutures --workdir {shlex.quote(str(args.workdir))}"
