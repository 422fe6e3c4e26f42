"""A call's logging records reach the client's handlers (logforward, worker/logrecords)."""

import io
import json
import logging
import os

import pytest

from batchfutures import logforward
from batchfutures.worker import logrecords


@pytest.fixture
def clean_logging():
    """Logger levels and root handlers as they were, whatever a test sets."""
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    named = {name: logger.level for name, logger in logging.Logger.manager.loggerDict.items()
             if isinstance(logger, logging.Logger)}
    yield
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)
    for name, logger in logging.Logger.manager.loggerDict.items():
        if isinstance(logger, logging.Logger):
            logger.setLevel(named.get(name, logging.NOTSET))


@pytest.mark.parametrize("root, named, expected", [
    (logging.WARNING, {}, {"": logging.WARNING}),
    (logging.INFO, {"app": logging.DEBUG, "noisy": logging.ERROR},
     {"": logging.INFO, "app": logging.DEBUG, "noisy": logging.ERROR}),
    (logging.INFO, {"unset": logging.NOTSET}, {"": logging.INFO}),  # inherits: nothing to ship
    (logging.INFO, {"batchfutures": logging.DEBUG, "batchfutures.worker": logging.DEBUG,
                    "batchfuturesque": logging.DEBUG},
     {"": logging.INFO, "batchfuturesque": logging.DEBUG}),  # the library's own are not shipped
])
def test_levels_of(root, named, expected):
    assert logforward.levels_of(root, named) == expected


@pytest.mark.parametrize("environ, expected", [
    ({"AWS_BATCH_JOB_ID": "abc:3", "AWS_BATCH_JOB_ARRAY_INDEX": "3"},
     {"job_id": "abc", "call_index": 3, "processName": "abc:3"}),
    ({"AWS_BATCH_JOB_ID": "abc"}, {"job_id": "abc", "call_index": None, "processName": "abc"}),
    ({"AWS_BATCH_JOB_ID": "abc:7"}, {"job_id": "abc", "call_index": 7, "processName": "abc:7"}),
    ({}, {"job_id": "", "call_index": None, "processName": "worker"}),
])
def test_call_tags(environ, expected):
    assert logrecords.call_tags(environ) == expected


def _record(**fields):
    base = {"name": "app", "levelno": logging.INFO, "levelname": "INFO", "msg": "hello %s",
            "args": ("there",), "pathname": "/home/u/script.py", "lineno": 12}
    base.update(fields)
    return logging.makeLogRecord(base)


TAGS = {"job_id": "abc", "call_index": 2, "processName": "abc:2"}


def test_as_dict_is_json_and_formats_the_message():
    data = logrecords.as_dict(_record(user_id=7, blob=object()), TAGS)
    assert json.loads(json.dumps(data)) == data
    assert data["msg"] == "hello there"
    assert data["user_id"] == 7 and "blob" not in data  # extra= scalars only
    assert data["processName"] == "abc:2" and data["call_index"] == 2


def test_as_dict_formats_the_traceback_and_cuts_long_messages():
    try:
        raise ValueError("boom")
    except ValueError:
        import sys
        record = _record(exc_info=sys.exc_info(), msg="x" * (logrecords.MAX_MESSAGE + 10), args=())
    data = logrecords.as_dict(record, TAGS)
    assert "ValueError: boom" in data["exc_text"]
    assert data["msg"].endswith("[... 10 characters cut]")


def test_a_bad_format_is_said_not_raised():
    data = logrecords.as_dict(_record(msg="%d", args=("not a number",)), TAGS)
    assert "could not be formatted" in data["msg"]


def test_round_trip_through_the_clients_handler_and_format(clean_logging):
    stream, log = io.StringIO(), io.StringIO()
    keeper = logrecords.RecordKeeper(log_stream=log, environ={"AWS_BATCH_JOB_ID": "abc:2"})
    keeper.install()
    logging.getLogger().setLevel(logging.INFO)
    try:
        logging.getLogger("app").info("first %d", 1)
        logging.getLogger("batchfutures").warning("the library's own: not forwarded")
        logging.getLogger("app.sub").warning("second")
        records = keeper.take()
    finally:
        keeper.remove()
    assert keeper.take() == []  # taken once
    # the container's log too: one line per record, its JSON after the prefix
    lines = log.getvalue().splitlines()
    assert [line[:len(logrecords.LINE_PREFIX)] for line in lines] == [logrecords.LINE_PREFIX] * 2
    assert lines[0].startswith('batchfutures.log: {"levelname": "INFO", "name": "app", "msg": "first 1"')
    assert [json.loads(line[len(logrecords.LINE_PREFIX):]) for line in lines] == records
    shipped = json.loads(json.dumps(records))  # as the result object carries them

    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(processName)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().handlers[:] = [handler]
    logforward.replay(shipped)
    assert stream.getvalue().splitlines() == ["abc:2 INFO app: first 1", "abc:2 WARNING app.sub: second"]


def test_replay_honours_the_clients_level_now(clean_logging):
    stream = io.StringIO()
    logging.getLogger().handlers[:] = [logging.StreamHandler(stream)]
    logging.getLogger().setLevel(logging.WARNING)
    logforward.replay([
        logrecords.as_dict(_record(msg="dropped", args=()), TAGS),
        logrecords.as_dict(_record(levelno=logging.ERROR, levelname="ERROR", msg="kept", args=()), TAGS),
        {"name": 3}, "junk", {"name": "app", "levelno": "high"},  # malformed: skipped
    ])
    assert stream.getvalue() == "kept\n"


def _keep_replayed():
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    logging.getLogger().handlers[:] = [Keep()]
    logging.getLogger().setLevel(logging.DEBUG)
    return seen


def test_replay_sets_the_tags_on_the_record(clean_logging):
    seen = _keep_replayed()
    logforward.replay([logrecords.as_dict(_record(), TAGS)])
    (record,) = seen
    assert (record.job_id, record.call_index, record.getMessage()) == ("abc", 2, "hello there")
    assert (record.pathname, record.lineno) == ("/home/u/script.py", 12)


def test_records_under_the_level_are_never_made(clean_logging):
    class Expensive:
        def __init__(self):
            self.formatted = False

        def __str__(self):
            self.formatted = True
            return "expensive"

    logrecords.apply_levels({"": logging.INFO, "chatty": logging.ERROR})
    debug, chatty, info = Expensive(), Expensive(), Expensive()
    keeper = logrecords.RecordKeeper(environ={}).install()
    try:
        logging.getLogger("app").debug("%s", debug)
        logging.getLogger("chatty").warning("%s", chatty)
        logging.getLogger("app").info("%s", info)
        records = keeper.take()
    finally:
        keeper.remove()
    assert [r["msg"] for r in records] == ["expensive"]
    assert (debug.formatted, chatty.formatted, info.formatted) == (False, False, True)


@pytest.mark.parametrize("levels", [None, "INFO", {"": "INFO"}, {3: 10}, {"x": True}])
def test_apply_levels_ignores_malformed(clean_logging, levels):
    before = logging.getLogger().level
    logrecords.apply_levels(levels)
    assert logging.getLogger().level == before


def test_records_past_the_limit_are_cut_with_a_note(clean_logging):
    keeper = logrecords.RecordKeeper(environ={}, limit=3)
    logging.getLogger().setLevel(logging.INFO)
    keeper.install()
    try:
        for i in range(5):
            logging.getLogger("app").info("r%d", i)
        records = keeper.take()
    finally:
        keeper.remove()
    assert [r["msg"] for r in records[1:]] == ["r2", "r3", "r4"]
    assert "first 2 log records" in records[0]["msg"]


# -- a record's line in the container's log, read back (echo_output="live") --------------------
def test_a_records_line_replays_it(clean_logging):
    seen = _keep_replayed()
    line = logrecords.log_line(logrecords.as_dict(_record(), TAGS))
    assert logforward.replay_line(line) is True
    (record,) = seen
    assert (record.name, record.getMessage(), record.call_index, record.lineno) == (
        "app", "hello there", 2, 12)


@pytest.mark.parametrize("fields", [
    {"msg": "m" * 40_000},
    {"msg": "\n\t\"é" * 10_000, "exc_text": "Traceback\n" * 5_000, "stack_info": "s" * 16_000},
    {**{f"extra{i}": "e" * 60 for i in range(400)}},  # many short extras: the essentials only
    {"name": "n" * 40_000},
])
def test_a_records_line_is_bounded_and_still_reads(clean_logging, fields):
    data = {**logrecords.as_dict(_record(msg="short", args=()), TAGS), **fields}
    line = logrecords.log_line(data)
    assert len(line) <= logrecords.MAX_LINE and "\n" not in line and line.isascii()
    seen = _keep_replayed()
    assert logforward.replay_line(line) is True
    (record,) = seen
    assert record.levelno == logging.INFO and record.name.startswith(data["name"][:100])


def test_a_records_long_message_says_it_was_cut_in_the_line():
    data = logrecords.as_dict(_record(msg="m" * 40_000, args=()), TAGS)
    back = json.loads(logrecords.log_line(data)[len(logrecords.LINE_PREFIX):])
    assert back["msg"].startswith("mmm") and back["msg"].endswith("characters cut in the log line]")
    assert back["job_id"] == "abc" and back["call_index"] == 2


@pytest.mark.parametrize("line", [
    "hello from the call",
    "batchfutures.log: INFO:app:an older worker's line",  # not JSON: not a record here
    "batchfutures.log: [1, 2]",
    "batchfutures.log: null",
    "batchfutures.log: " + "[" * 50_000,  # nested past the parser's depth
    "batchfutures.log: {\"name\": \"app\", \"levelno\": 20, \"msg\": \"" + "x" * 70_000 + "\"}",
    "batchfutures.note: the worker's own",
    None, 42, b"batchfutures.log: {}",
])
def test_anything_else_is_not_a_record(clean_logging, line):
    seen = _keep_replayed()
    assert logforward.replay_line(line) is False
    assert seen == []


def test_a_hostile_records_line_is_replayed_safely(clean_logging):
    seen = _keep_replayed()
    hostile = {"name": "app", "levelno": 20, "msg": "plain", "args": ["%s"], "exc_info": [1, 2],
               "getMessage": "shadowed", "__class__": "x", "__dict__": {}}
    assert logforward.replay_line(logrecords.LINE_PREFIX + json.dumps(hostile)) is True
    (record,) = seen
    assert record.getMessage() == "plain" and record.exc_info is None and record.args is None
    # a record its level refuses, and malformed fields: a record line, nothing handled
    logging.getLogger().setLevel(logging.ERROR)
    assert logforward.replay_line(logrecords.LINE_PREFIX + json.dumps(hostile)) is True
    assert logforward.replay_line(logrecords.LINE_PREFIX + '{"name": 3, "levelno": 20}') is True
    assert len(seen) == 1


@pytest.mark.parametrize("field, value", [
    ("created", "yesterday"), ("msecs", "12"), ("relativeCreated", []), ("lineno", "12"),
    ("thread", "t"), ("process", {"pid": 1}), ("created", True), ("exc_text", ["frame"]),
    ("stack_info", {"a": 1}), ("levelname", 5), ("msg", {"not": "text"}),
    ("pathname", ["a"]), ("filename", 3), ("funcName", {}),
])
def test_a_records_line_with_a_field_of_the_wrong_type_is_shown_not_a_logging_error(
        clean_logging, capsys, field, value):
    # a line the call printed itself (echo_output="live" reads every line of its log): a field
    # a LogRecord's formatter takes as a number or text must not make the client's handler
    # print "--- Logging error ---" and a traceback instead of the record
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s %(filename)s:%(lineno)d %(thread)d %(process)d "
        "%(relativeCreated)d %(message)s"))
    handler.addFilter(lambda record: os.path.basename(record.pathname) is not None)  # as
    # handlers that take the path as text do (rich's RichHandler)
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)
    record = {"name": "app", "levelno": 20, "msg": "hello", field: value}
    assert logforward.replay_line(logrecords.LINE_PREFIX + json.dumps(record)) is True
    assert "Logging error" not in capsys.readouterr().err
    (line,) = stream.getvalue().splitlines()
    assert " INFO app " in line  # the level's name from its number when not text
    assert line.endswith(" {'not': 'text'}" if field == "msg" else " hello")


_WORKER_LINE = logrecords.log_line({"name": "app", "levelname": "WARNING", "levelno": 30,
                                    "msg": "disk low", "exc_text": None, "job_id": "j"})


@pytest.mark.parametrize("line, readable", [
    (_WORKER_LINE, "batchfutures.log: WARNING:app:disk low"),  # as logging's default format
    (logrecords.LINE_PREFIX + json.dumps({"name": "", "levelname": "ERROR", "msg": "boom",
                                          "exc_text": "Traceback (most recent call last):\n  x"}),
     "batchfutures.log: ERROR:root:boom\nTraceback (most recent call last):\n  x"),
    ("hello from the call", "hello from the call"),  # the call's own lines, as they are
    ("batchfutures.log: INFO:app:an older worker's line",
     "batchfutures.log: INFO:app:an older worker's line"),
    ("batchfutures.log: [1, 2]", "batchfutures.log: [1, 2]"),
    ("batchfutures.log: {\"msg\": \"" + "x" * 70_000 + "\"}",  # too long to be the worker's
     "batchfutures.log: {\"msg\": \"" + "x" * 70_000 + "\"}"),
])
def test_readable_line(line, readable):
    assert logforward.readable_line(line) == readable


def test_a_jobs_log_shows_records_as_logging_writes_them(tmp_path):
    """future.log() and the CLI read a record's JSON line (kept for the client's handlers) as
    `batchfutures.log: LEVEL:logger:message`, on the emulator's logs service."""
    from batchfutures import logs
    from batchfutures.emulator.logservice import LogsService

    folder = tmp_path / "logs"
    (folder / "def" / "default").mkdir(parents=True)
    (folder / "def" / "default" / "task").write_text(f"printed\n{_WORKER_LINE}\nafter\n")
    service = LogsService(folder)
    group = "/aws/batch/job"
    assert logs.read_all(service, group, "def/default/task") == [
        "printed", "batchfutures.log: WARNING:app:disk low", "after"]
    assert logs.tail(service, group, "def/default/task", lines=2) == [
        "batchfutures.log: WARNING:app:disk low", "after"]


def test_the_worker_and_the_client_name_the_record_line_alike():
    """The worker may not import the client's modules: each keeps its copy of the line's
    prefix, and the client reads back every line the worker may write."""
    assert logforward.LINE_PREFIX == logrecords.LINE_PREFIX
    assert logrecords.MAX_LINE <= logforward.MAX_LINE
