"""The worker's half of logging forwarding: what a call logs with ``logging``, kept for the client.

With echo_output (the inputs header's "output"), while a process runs items a ``RecordKeeper``
handler sits on the root logger: each record a call's loggers pass (the user's, not
batchfutures' own) becomes a plain dict (``as_dict``) kept with the item's output
(calls.Capture) and is written, formatted, to the container's log (the real stderr, not the
echo's tee). The client replays the dicts through its own handlers (batchfutures.logforward).

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
import logging
import os
import threading
from typing import Any, Deque, Dict, List, Mapping, Optional

__all__ = ["MAX_RECORDS", "MAX_MESSAGE", "OWN_LOGGER", "RecordKeeper", "apply_levels", "as_dict",
           "call_tags"]

MAX_RECORDS = 1000  # records kept per item (the last ones); the container's log has them all
MAX_MESSAGE = 16 * 1024  # characters of a record's message, and of its traceback, kept
OWN_LOGGER = "batchfutures"  # the library's own records are not the call's: not forwarded

_PLAIN = ("name", "levelno", "levelname", "pathname", "filename", "module", "lineno", "funcName",
          "created", "msecs", "thread", "threadName", "process")
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
# in the container's log, marked as kept for the client (echo_output="live" does not show them:
# they reach the client's handlers when the call resolves)
_LOG_FORMAT = logging.Formatter("batchfutures.log: %(levelname)s:%(name)s:%(message)s")


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
        exc_text = _LOG_FORMAT.formatException(record.exc_info)
    data["exc_text"] = _cut(exc_text) if exc_text else None
    data["stack_info"] = _cut(record.stack_info) if record.stack_info else None
    for key, value in record.__dict__.items():  # the user's extra=, when JSON can carry it
        if key not in _STANDARD and key not in data and (
                value is None or isinstance(value, (str, int, float, bool))):
            data[key] = value
    data.update(tags)
    return data


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
    until ``take``, and written to ``log_stream`` (the container's log)."""

    def __init__(self, log_stream: Any = None, environ: Optional[Mapping[str, str]] = None,
                 limit: int = MAX_RECORDS) -> None:
        super().__init__(logging.NOTSET)
        self._records: Deque[Dict[str, Any]] = collections.deque(maxlen=limit)
        self._cut = 0
        self._guard = threading.Lock()  # the call's own threads may log too
        self._stream = log_stream
        self._tags = call_tags(os.environ if environ is None else environ)

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == OWN_LOGGER or record.name.startswith(OWN_LOGGER + "."):
            return
        try:
            data = as_dict(record, self._tags)
            if self._stream is not None:
                self._stream.write(_LOG_FORMAT.format(record) + "\n")
        except Exception:
            self.handleError(record)
            return
        with self._guard:
            if len(self._records) == self._records.maxlen:
                self._cut += 1
            self._records.append(data)

    def take(self) -> List[Dict[str, Any]]:
        """The records made since the last take, in order (the last MAX_RECORDS, after a note of
        how many earlier ones were cut)."""
        with self._guard:
            records, cut = list(self._records), self._cut
            self._records.clear()
            self._cut = 0
        if cut:
            note = logging.makeLogRecord({
                "name": OWN_LOGGER, "levelno": logging.WARNING, "levelname": "WARNING",
                "msg": f"the first {cut} log records of this call were cut; future.log() has them"})
            records.insert(0, as_dict(note, self._tags))
        return records

    def install(self) -> "RecordKeeper":
        logging.getLogger().addHandler(self)
        return self

    def remove(self) -> None:
        logging.getLogger().removeHandler(self)

