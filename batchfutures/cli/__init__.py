"""The `batchfutures` command and what only it uses. The executor never imports this package.

    app.py              the parser, the exit code of each error, main (the entry point)
    output.py           exit codes, output formats, CLIError and the printing helpers
    envargs.py          the environment the global options name, and the command that names it
    demo.py             `demo` (and its --dry-run)
    jobcommands.py      `status` (--watch), `logs`, `result`, `cancel`, `jobs`
    admin.py            `cleanup`, `check`, `template`, `image`
    checks.py           the environment checks behind `check`
    setup_resources.py  the AWS stack's template and the worker image's build (with templates/)
"""

from .app import main

__all__ = ["main"]
