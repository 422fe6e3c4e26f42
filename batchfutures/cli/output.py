"""What every command shares: the exit codes, the output formats, the error that carries a
message and an exit code, and the helpers that print (plain lines, notes on stderr, tables,
JSON, times and durations, counts per status)."""

from __future__ import annotations

import enum
import json
import sys
import time
from typing import Any, Dict, Optional, Sequence


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
def out(text: str = "") -> None:
    print(text, flush=True)


def note(text: str) -> None:
    print(f"batchfutures: {text}", file=sys.stderr, flush=True)


def when(epoch: Optional[float]) -> str:
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch))


def span(seconds: Optional[float]) -> str:
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


def print_json(value: Any) -> None:
    out(json.dumps(value, indent=2, default=str))


def counts_text(counts: Dict[str, int]) -> str:
    return ", ".join(f"{status} {count}" for status, count in counts.items() if count) or "none"
