"""The commands about the environment rather than a job: `cleanup` (stored payloads of
finished runs), `check` (the environment end to end), `template` and `image` (setting up AWS)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any, List, Optional, Tuple

from .envargs import environment
from .output import ExitCode, OutputFormat, note, out, print_json

if TYPE_CHECKING:
    from ..environments import Environment
    from ..sqsapi import SQSAPI


# -- cleanup ------------------------------------------------------------------------------------
def cmd_cleanup(args: argparse.Namespace) -> int:
    # start-up: cleanup (batchapi: botocore, tenacity) adds ~19 ms to the CLI's start, which
    # parses every command; only this one uses it
    from .. import cleanup

    env = environment(args)
    storage = env.storage
    reports = cleanup.survey(storage, env.batch, horizon_seconds=args.older_than * 3600,
                             all_finished=args.all)
    chosen = [r for r in reports if r.decision.remove]
    queues, sqs = _warm_queues(env, reports, args.older_than * 3600)
    if args.output is OutputFormat.JSON:
        print_json([r.as_dict() for r in reports] + [q.as_dict() for q in queues])
    else:
        for item in [*reports, *queues]:
            verb = ("would remove" if args.dry_run else "removing") if item.decision.remove \
                else "keeping"
            out(f"{verb} {item.url}: {item.decision.reason}")
    if not args.dry_run:
        cleanup.remove(storage, chosen)
        if sqs is not None:
            cleanup.remove_queues(sqs, queues)
    if args.output is not OutputFormat.JSON:
        out(f"{len(chosen)} run(s) {'to remove' if args.dry_run else 'removed'}")
        if queues:
            doomed = sum(q.decision.remove for q in queues)
            out(f"{doomed} warm queue(s) {'to remove' if args.dry_run else 'removed'}")
    return ExitCode.OK


def _warm_queues(env: Environment, reports: Any, horizon_seconds: float
                 ) -> Tuple[List[Any], Optional[SQSAPI]]:
    """The warm pools' queues with their decisions, and the SQS client; none when SQS cannot
    be asked (no permission for it, say): the runs are cleaned up all the same."""
    from .. import cleanup  # start-up: as cmd_cleanup's

    try:
        sqs = cleanup.sqs_client_for(env)
        prefix = cleanup.warm_queue_prefix(env.stack)
        return cleanup.survey_queues(sqs, reports, prefix=prefix,
                                     horizon_seconds=horizon_seconds), sqs
    except Exception as error:  # the queues are a bonus: never fail the runs' cleanup for them
        note(f"warm queues not looked at: {error}")
        return [], None


# -- check, template, image ---------------------------------------------------------------------
def cmd_check(args: argparse.Namespace) -> int:
    from .checks import run_checks  # start-up: ~8 ms of the CLI's start; only `check` runs them

    env = environment(args)
    verdicts = run_checks(env)
    for name, ok, detail in verdicts:
        out(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    failures = sum(not ok for _, ok, _ in verdicts)
    if failures:  # stderr: stdout stays one line per part
        note(f"{failures} of {len(verdicts)} checks failed: fix the FAIL lines, then run "
             f"`batchfutures check` again")
    return ExitCode.FAILED if failures else ExitCode.OK


def cmd_template(args: argparse.Namespace) -> int:
    # start-up: setup_resources (importlib.metadata) adds ~20 ms to the CLI's start
    from .setup_resources import template_text

    print(template_text(), end="", flush=True)
    return ExitCode.OK


def cmd_image(args: argparse.Namespace) -> int:
    from .setup_resources import image_commands  # start-up: as cmd_template's

    # the Dockerfile's build argument, set in the shell, works as --extra-packages (and is pinned)
    extra = getattr(args, "extra_packages", None) or os.environ.get("EXTRA_PIP_PACKAGES")
    out(image_commands(python_version=args.python, repository=args.repository, region=args.region,
                       platforms=getattr(args, "platforms", None), extra_packages=extra))
    return ExitCode.OK
