"""Where the embedded default keeps its emulator, payloads and key: one definition, imported
by environments.py and by the worker's side of signing.py (so it pulls in nothing heavy)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_workdir"]


def default_workdir() -> Path:
    """A per-user cache folder: $BATCHFUTURES_WORKDIR, else $XDG_CACHE_HOME/batchfutures."""
    explicit = os.environ.get("BATCHFUTURES_WORKDIR")
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "batchfutures"
