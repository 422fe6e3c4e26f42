"""The client's half of logging forwarding: a call's ``logging`` records, through this process's
handlers and formats (as a ProcessPoolExecutor's forked workers log through the parent's).

On by default with echo_output (``BatchExecutor(echo_output=False)`` turns both off). The worker
keeps what each call logs (worker/logrecords.py: one plain dict per record, in the order made)
next to what it printed, and their order (outputorder.py); when the call's future resolves, its
records are replayed here, between its prints as it made them (wire.echo_output), or, with
echo_output="live", each as its log line is read (``replay_line``). Each becomes a LogRecord
again (``logging.makeLogRecord``) and is handled by the logger of the same name here, so the
client's handlers, formats, filters and levels apply (``%(filename)s:%(lineno)d`` are the
call's, in the user's file; tracebacks.Pickler keeps it).

A replayed record carries the call's tags: ``record.job_id`` (the Batch job), ``record.call_index``
(the array child; None for a plain job) and ``record.processName`` (the child's job id: a
format with ``%(processName)s`` shows which call logged, as a worker process's name would).

The worker makes only the records the client would keep: ``client_levels`` (the root logger's
level and every level set on a named logger here) travels in the inputs header ("log_levels")
and is set on the same loggers in the worker before anything runs. A record under the level is
refused by the worker's logger as it would be here: its message is never formatted.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Dict, Iterable, Mapping

from . import tracebacks

__all__ = ["client_levels", "levels_of", "replay", "replay_line", "readable_line", "OWN_LOGGER",
           "LINE_PREFIX"]

OWN_LOGGER = "batchfutures"  # its levels are this library's business, not the calls'
# a record's line in a call's log (worker/logrecords.log_line): this prefix, then its JSON
LINE_PREFIX = "batchfutures.log: "
# longest record line read back: the worker writes at most 16,000 characters (logrecords.MAX_LINE);
# anything longer is not its and is not parsed
MAX_LINE = 64 * 1024


def levels_of(root_level: int, named: Mapping[str, int]) -> Dict[str, int]:
    """The levels a worker sets: ``{"": root_level}`` and each named logger's level, but
    batchfutures' own and unset (NOTSET) ones (pure)."""
    levels = {"": root_level}
    for name, level in named.items():
        if name == OWN_LOGGER or name.startswith(OWN_LOGGER + "."):
            continue
        if isinstance(level, int) and level != logging.NOTSET:
            levels[name] = level
    return levels


def client_levels() -> Dict[str, int]:
    """This process's logger levels, for the inputs header (see the module docstring)."""
    named = {name: logger.level for name, logger in list(logging.Logger.manager.loggerDict.items())
             if isinstance(logger, logging.Logger)}
    return levels_of(logging.getLogger().level, named)


_TRUSTED_KEYS = frozenset({"exc_info", "args"})  # never taken from the wire: rebuilt here
# nor a name that would shadow a LogRecord method (getMessage) or a dunder
_METHODS = frozenset(name for name in dir(logging.LogRecord) if callable(getattr(logging.LogRecord, name)))


# fields a formatter takes as numbers (%(lineno)d, formatTime) or adds as text (exc_text): one
# of another type in a line the call printed itself is dropped (the LogRecord's default), or
# the client's handler prints "--- Logging error ---" and a traceback instead of the record
_NUMBERS = frozenset({"created", "msecs", "relativeCreated", "lineno", "thread", "process"})
_TEXTS = frozenset({"exc_text", "stack_info", "levelname", "pathname", "filename", "module",
                    "funcName", "threadName", "processName"})


def _typed(key: str, value: Any) -> bool:
    if key in _NUMBERS:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return key not in _TEXTS or isinstance(value, str)


def _record(data: Mapping[str, Any]) -> logging.LogRecord:
    fields = {key: value for key, value in data.items()
              if isinstance(key, str) and key not in _TRUSTED_KEYS and key not in _METHODS
              and not key.startswith("__") and _typed(key, value)}
    fields.setdefault("levelname", logging.getLevelName(fields["levelno"]))
    if not isinstance(fields.get("msg", ""), str):  # filters and handlers may take it as text
        fields["msg"] = str(fields["msg"])
    if isinstance(fields.get("exc_text"), str):  # the call's frames with this file's lines
        fields["exc_text"] = tracebacks.with_source_lines(fields["exc_text"])
    fields["args"] = None  # the message was formatted in the worker
    fields["exc_info"] = None
    return logging.makeLogRecord(fields)


def replay(records: Iterable[Any]) -> None:
    """Handle a call's records (dicts, as the worker kept them) through this process's loggers,
    in order; a record its logger's level now refuses is dropped, as ``logger.log`` would."""
    for data in records:
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            continue
        level = data.get("levelno")
        if not isinstance(level, int) or isinstance(level, bool):
            continue
        logger = logging.getLogger(data["name"] or None)
        if not logger.isEnabledFor(level):
            continue
        try:
            logger.handle(_record(data))
        except Exception:  # a broken handler: the record stays in the job's log
            logging.getLogger(OWN_LOGGER).debug("a forwarded log record could not be handled",
                                                exc_info=True)


def _record_of_line(line: str) -> Any:
    """The JSON object of a record's line, or None (bounded: never raises)."""
    if not line.startswith(LINE_PREFIX) or len(line) > MAX_LINE:
        return None
    try:
        data = json.loads(line[len(LINE_PREFIX):])
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    return data if isinstance(data, dict) else None


def readable_line(line: str) -> str:
    """A log line for people (future.log(), `batchfutures logs`, an error's log tail): a record's
    JSON line as ``batchfutures.log: LEVEL:logger:message`` and its traceback, as logging's
    default format writes it; any other line as it is (pure)."""
    data = _record_of_line(line)
    if data is None:
        return line
    text = f"{LINE_PREFIX}{data.get('levelname')}:{data.get('name') or 'root'}:{data.get('msg')}"
    for key in ("exc_text", "stack_info"):
        if isinstance(data.get(key), str) and data[key]:
            text += "\n" + data[key]
    return text


def replay_line(line: Any) -> bool:
    """A line of a call's log: when it is a record's line (LINE_PREFIX and a JSON object, at most
    MAX_LINE characters), replay that record (as ``replay``) and say True; anything else, False.
    Never raises (a hostile line is not a record)."""
    data = _record_of_line(line) if isinstance(line, str) else None
    if data is None:
        return False
    replay([data])
    return True
