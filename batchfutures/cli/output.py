"""What every command shares: the exit codes, the output formats, the error that carries a
message and an exit code, and the helpers that print (plain lines, notes on stderr, tables,
JSON, times and durations, counts per status)."""

from __future__ import annotations

import enum
import json
import re
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
# What a field of a job (a stop reason, a name, a log line, a result's repr) must never bring to
# the terminal of whoever runs the command: C0 and C1 control characters (ESC and CSI start
# the sequences that move the cursor, retitle the window or rewrite the screen; CR and BS
# overwrite what was printed), DEL, and the bidirectional overrides that reorder what is shown.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                                "\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: "re.Match[str]") -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xff else f"\\u{code:04x}"


def escape(text: str, *, keep_lines: bool = False) -> str:
    """``text`` with every control character written as a visible escape (``\\x1b``, ``\\n``):
    what one field may print. ``keep_lines``: newlines and tabs stay (a whole line of output
    whose fields were escaped, or a log's own lines)."""
    return (_CONTROL_BUT_LINES if keep_lines else _CONTROL).sub(_escaped, text)


def out(text: str = "") -> None:
    print(escape(text, keep_lines=True), flush=True)


def note(text: str) -> None:
    print(f"batchfutures: {escape(text, keep_lines=True)}", file=sys.stderr, flush=True)


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
    """Left-aligned columns under upper-case headers, two spaces apart; each cell escaped (a
    newline in a field cannot make a row of its own)."""
    cells = [[escape(str(h)) for h in headers]] + [
        ["-" if v is None else escape(str(v)) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip()
                     for row in cells)


def json_text(value: Any, **options: Any) -> str:
    """JSON with every control character escaped: json.dumps writes C0 ones as \\uXXXX and, as
    ASCII, C1 ones and the bidirectional overrides too; DEL, which JSON lets through raw, too."""
    return json.dumps(value, default=str, ensure_ascii=True, **options).replace("\x7f", "\\u007f")


def print_json(value: Any) -> None:
    out(json_text(value, indent=2))


def counts_text(counts: Dict[str, int]) -> str:
    return ", ".join(f"{status} {count}" for status, count in counts.items() if count) or "none"
