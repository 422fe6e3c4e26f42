"""The `batchfutures` command (app.py) and what only it uses: the environment checks
(checks.py), the AWS stack's template and the worker image's build (setup_resources.py,
templates/). The executor never imports this package."""

from .app import main

__all__ = ["main"]
