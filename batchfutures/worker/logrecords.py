"""The worker's half of logging forwarding: what a call logs with ``logging``, kept for the client.

With echo_output (the inputs header's "output"), while a process runs items a ``RecordKeeper``
handler sits on the root logger: each record a call's loggers pass (the user's, not
batchfutures' own) becomes a plain dict (``as_dict``) kept with the item's output
(calls.Capture), noted in the order of the item's writes, and is written to the container's log
(the real stderr, not the echo's tee) as one line, ``batchfutures.log: `` and its JSON
(``log_line``, at most MAX_LINE characters). The client replays the dicts through its own
handlers (batchfutures.logforward): from the result object as the call resolves, or, with
echo_output="live", from that line as it is read.

Levels: the header's "log_levels" (the client's root level and the levels it set on named
loggers, logforward.client_levels) are set on the same loggers here before the initializer
(``apply_levels``), so ``log.debug(...)`` under a client at INFO is refused by the logger's
own level check: no record is made, no argument is formatted.

A record dict holds LogRecord's attributes that survive JSON: name, levelno, levelname, msg
(the message, formatted here: ``args`` may not pickle or serialize), pathname, filename, module,
lineno, funcName, created, msecs, thread, threadName, process, exc_text and stack_info (the
traceback, formatted here), the user's ``extra=`` values that are JSON scalars, and the call's
tags: ``job_id`` (the Batch job), ``call_index`` (the array child, None for a plain job) and
``processName`` (the child's job id, for formats that show it).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Tuple

__all__ = ["MAX_RECORDS", "MAX_MESSAGE", "MAX_LINE", "LINE_PREFIX", "OWN_LOGGER", "RecordKeeper",
           "apply_levels", "as_dict", "call_tags", "log_line"]

MAX_RECORDS = 1000  # records kept per item (the last ones); the container's log has them all
MAX_MESSAGE = 16 * 1024  # characters of a record's message, and of its traceback, kept
# a record's line in the container's log, at most: under Docker's 16 KiB log copier buffer, which
# splits a longer line into parts (the later ones without the prefix: they would show as output)
MAX_LINE = 16000
OWN_LOGGER = "batchfutures"  # the library's own records are not the call's: not forwarded

_PLAIN = ("name", "levelno", "levelname", "pathname", "filename", "module", "lineno", "funcName",
          "created", "msecs", "thread", "threadName", "process")
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
# a record's line in the container's log: this prefix, then the record dict as JSON
# (logforward.replay_line reads it back: echo_output="live" replays it in order with the prints)
LINE_PREFIX = "batchfutures.log: "
_FORMATTER = logging.Formatter()
# first in the line, so a person reading the log sees what a console would
_LEADING = ("levelname", "name", "msg")


def call_tags(environ: Mapping[str, str]) -> Dict[str, Any]:
    """The call's tags from Batch's variables: job_id, call_index, processName."""
    child = environ.get("AWS_BATCH_JOB_ID") or ""
    parent, _, index = child.partition(":")
    raw = environ.get("AWS_BATCH_JOB_ARRAY_INDEX") or index
    call_index = int(raw) if raw.isdigit() else None
    return {"job_id": parent or child, "call_index": call_index, "processName": child or "worker"}


def _cut(text: str) -> str:
    if len(text) <= MAX_MESSAGE:
        return text
    return text[:MAX_MESSAGE] + f" [... {len(text) - MAX_MESSAGE} characters cut]"


def as_dict(record: logging.LogRecord, tags: Mapping[str, Any]) -> Dict[str, Any]:
    """A record as JSON-able builtins (see the module docstring)."""
    data: Dict[str, Any] = {key: getattr(record, key, None) for key in _PLAIN}
    try:
        data["msg"] = _cut(record.getMessage())
    except Exception as error:  # a bad format: say so, as logging would on the console
        data["msg"] = _cut(f"{record.msg!r} (could not be formatted: {type(error).__name__})")
    exc_text = record.exc_text
    if record.exc_info and not exc_text:
        exc_text = _FORMATTER.formatException(record.exc_info)
    data["exc_text"] = _cut(exc_text) if exc_text else None
    data["stack_info"] = _cut(record.stack_info) if record.stack_info else None
    for key, value in record.__dict__.items():  # the user's extra=, when JSON can carry it
        if key not in _STANDARD and key not in data and (
                value is None or isinstance(value, (str, int, float, bool))):
            data[key] = _cut(value) if isinstance(value, str) else value
    data.update(tags)
    return data


def log_line(data: Mapping[str, Any], limit: int = MAX_LINE) -> str:
    """A record dict as one line of at most ``limit`` characters: LINE_PREFIX and its JSON (ASCII:
    a character is a byte), its longest strings cut until it fits, said in each (bounded: a
    round per field)."""
    fields = {key: data[key] for key in _LEADING if key in data}
    fields.update(data)
    budget = limit - len(LINE_PREFIX)
    for _ in range(len(fields) + 1):
        text = json.dumps(fields, ensure_ascii=True, default=str)
        if len(text) <= budget:
            return LINE_PREFIX + text
        longest = max(fields, key=lambda key: len(fields[key]) if isinstance(fields[key], str) else 0)
        value = fields[longest]
        if not isinstance(value, str) or len(value) < 64:  # nothing left to cut: the essentials
            break
        over = len(text) - budget + 64  # escapes make JSON longer than the text: cut at least this
        keep = max(0, len(value) - over)
        fields[longest] = value[:keep] + f" [... {len(value) - keep} characters cut in the log line]"
    essentials = {key: data.get(key) for key in ("levelname", "name", "levelno")}
    essentials["msg"] = "[a log record too long for its log line; the result has it]"
    return LINE_PREFIX + json.dumps(essentials, ensure_ascii=True, default=str)[:budget]


def apply_levels(levels: Any) -> None:
    """Set the client's logger levels here (header "log_levels": {"": root level, name: level});
    anything malformed is ignored (the defaults stay)."""
    if not isinstance(levels, dict):
        return
    for name, level in levels.items():
        if isinstance(name, str) and isinstance(level, int) and not isinstance(level, bool):
            logging.getLogger(name or None).setLevel(level)


class RecordKeeper(logging.Handler):
    """On the root logger while items run: each record of the user's loggers, kept as a dict
    until ``take``, and written to ``log_stream`` (the container's log) as its ``log_line``.
    ``lock``: the guard of what is kept (calls.Capture's, shared with its tees); ``on_kept``:
    called under it as each record is kept (Capture notes it in the order of the writes)."""

    def __init__(self, log_stream: Any = None, environ: Optional[Mapping[str, str]] = None,
                 limit: int = MAX_RECORDS, lock: Any = None,
                 on_kept: Optional[Callable[[], None]] = None) -> None:
        super().__init__(logging.NOTSET)
        self._records: Deque[Dict[str, Any]] = collections.deque(maxlen=limit)
        self._cut = 0
        self._guard = lock if lock is not None else threading.Lock()  # the call's threads log too
        self._on_kept = on_kept
        self._stream = log_stream
        self._tags = call_tags(os.environ if environ is None else environ)

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == OWN_LOGGER or record.name.startswith(OWN_LOGGER + "."):
            return
        try:
            data = as_dict(record, self._tags)
            if self._stream is not None:
                self._stream.write(log_line(data) + "\n")
        except Exception:
            self.handleError(record)
            return
        with self._guard:
            if len(self._records) == self._records.maxlen:
                self._cut += 1
            self._records.append(data)
            if self._on_kept is not None:
                self._on_kept()

    def take(self) -> List[Dict[str, Any]]:
        """The records made since the last take, in order (the last MAX_RECORDS, after a note of
        how many earlier ones were cut)."""
        return self.take_counted()[0]

    def take_counted(self) -> Tuple[List[Dict[str, Any]], int]:
        """(``take``'s records, how many of them lead as notes: 1 after a cut, else 0)."""
        with self._guard:
            records, cut = list(self._records), self._cut
            self._records.clear()
            self._cut = 0
        if not cut:
            return records, 0
        note = logging.makeLogRecord({
            "name": OWN_LOGGER, "levelno": logging.WARNING, "levelname": "WARNING",
            "msg": f"the first {cut} log records of this call were cut; future.log() has them"})
        return [as_dict(note, self._tags)] + records, 1

    def install(self) -> "RecordKeeper":
        logging.getLogger().addHandler(self)
        return self

    def remove(self) -> None:
        logging.getLogger().removeHandler(self)

