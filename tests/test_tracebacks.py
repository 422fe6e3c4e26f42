"""Remote tracebacks name the user's file and line and show its source line (batchfutures.tracebacks)."""

import pickle
import sys
import textwrap
import traceback

import cloudpickle
import pytest

from batchfutures import tracebacks

SCRIPT = textwrap.dedent('''\
    def helper(x):
        return 1 / x


    def check(x):
        inner = lambda y: helper(y)  # noqa: E731
        return inner(x)
''')


@pytest.fixture
def script_functions(tmp_path):
    """A script's functions, compiled from a real file, as cloudpickle ships them: by value."""
    path = tmp_path / "user_script.py"
    path.write_text(SCRIPT)
    namespace = {"__name__": "__main__"}
    exec(compile(SCRIPT, str(path), "exec"), namespace)
    return path, namespace


def _frames(function, *args):
    try:
        function(*args)
    except ZeroDivisionError as error:
        return "".join(traceback.format_exception(error))
    raise AssertionError("expected ZeroDivisionError")


def test_cloudpickle_alone_loses_the_file_name(script_functions):
    # why the module exists: cloudpickle names the file of code it ships by value <dynamic-code>
    _, namespace = script_functions
    loaded = pickle.loads(cloudpickle.dumps(namespace["check"]))
    assert loaded.__code__.co_filename == tracebacks.DYNAMIC_FILENAME


def test_pickled_by_value_keeps_the_script_file_and_line(script_functions):
    path, namespace = script_functions
    loaded = pickle.loads(tracebacks.dumps(namespace["check"], protocol=pickle.HIGHEST_PROTOCOL))
    assert loaded.__code__.co_filename == str(path)
    text = _frames(loaded, 0)
    # every frame of the script: the function, the nested lambda, the helper it calls
    assert f'File "{path}", line 7, in check' in text
    assert f'File "{path}", line 6, in <lambda>' in text
    assert f'File "{path}", line 2, in helper' in text
    assert "    return 1 / x" in text  # the file exists here: traceback reads the line itself
    assert "<dynamic-code>" not in text


def test_same_function_same_bytes(script_functions):
    # content-addressed function objects stay deduplicated
    _, namespace = script_functions
    assert tracebacks.dumps(namespace["check"]) == tracebacks.dumps(namespace["check"])


def test_loaded_function_still_runs(script_functions):
    _, namespace = script_functions
    loaded = cloudpickle.loads(tracebacks.dumps(namespace["check"]))
    assert loaded(4) == 0.25


REMOTE = '''Traceback (most recent call last):
  File "/srv/batchfutures/worker/calls.py", line 287, in _run
    value = function(*args, **kwargs)
            ^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{path}", line 7, in check
  File "{path}", line 6, in <lambda>
  File "{path}", line 2, in helper
ZeroDivisionError: division by zero'''

FILLED = '''Traceback (most recent call last):
  File "/srv/batchfutures/worker/calls.py", line 287, in _run
    value = function(*args, **kwargs)
            ^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{path}", line 7, in check
    return inner(x)
  File "{path}", line 6, in <lambda>
    inner = lambda y: helper(y)  # noqa: E731
  File "{path}", line 2, in helper
    return 1 / x
ZeroDivisionError: division by zero'''

GROUP = '''  + Exception Group Traceback (most recent call last):
  |   File "{path}", line 7, in check
  | ExceptionGroup: eg (1 sub-exception)
  +-+---------------- 1 ----------------
    | Traceback (most recent call last):
    |   File "{path}", line 2, in helper
    | ZeroDivisionError: division by zero
    +------------------------------------'''

GROUP_FILLED = '''  + Exception Group Traceback (most recent call last):
  |   File "{path}", line 7, in check
  |     return inner(x)
  | ExceptionGroup: eg (1 sub-exception)
  +-+---------------- 1 ----------------
    | Traceback (most recent call last):
    |   File "{path}", line 2, in helper
    |     return 1 / x
    | ZeroDivisionError: division by zero
    +------------------------------------'''

CHAINED = '''Traceback (most recent call last):
  File "{path}", line 2, in helper
ZeroDivisionError: division by zero

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "{path}", line 5, in check
    a line the worker printed
RuntimeError: wrapped'''

CHAINED_FILLED = '''Traceback (most recent call last):
  File "{path}", line 2, in helper
    return 1 / x
ZeroDivisionError: division by zero

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "{path}", line 5, in check
    a line the worker printed
RuntimeError: wrapped'''

NOWHERE = '''Traceback (most recent call last):
  File "<dynamic-code>", line 2, in helper
  File "/no/such/file.py", line 9, in f
  File "{path}", line 99, in past_the_end
ValueError'''

RECURSION = '''Traceback (most recent call last):
  File "{path}", line 2, in helper
  [Previous line repeated 996 more times]
RecursionError: maximum recursion depth exceeded'''

RECURSION_FILLED = '''Traceback (most recent call last):
  File "{path}", line 2, in helper
    return 1 / x
  [Previous line repeated 996 more times]
RecursionError: maximum recursion depth exceeded'''


@pytest.mark.parametrize("remote, expected", [
    (REMOTE, FILLED),                  # frames the worker printed no line for get the client's
    (FILLED, FILLED),                  # lines the worker printed stay as they are
    (GROUP, GROUP_FILLED),             # an exception group's nested tracebacks
    (CHAINED, CHAINED_FILLED),         # a chain; the worker's own line kept
    (NOWHERE, NOWHERE),                # no such file, or line, here: left without one
    (RECURSION, RECURSION_FILLED),     # a "[Previous line repeated]" line is not a source line
    ("", ""),
    ("ValueError: no frames", "ValueError: no frames"),
], ids=["filled", "kept", "group", "chained", "nowhere", "recursion", "empty", "no-frames"])
def test_with_source_lines(tmp_path, remote, expected):
    path = tmp_path / "user_script.py"
    path.write_text(SCRIPT)
    shipped = {str(path), "/no/such/file.py"}
    assert (tracebacks.with_source_lines(remote.format(path=path), shipped=shipped)
            == expected.format(path=path))


def test_a_file_changed_since_is_read_again(tmp_path):
    path = tmp_path / "edited.py"
    path.write_text("first = 1\n")
    frame = f'Traceback (most recent call last):\n  File "{path}", line 1, in <module>\nNameError'
    assert "first = 1" in tracebacks.with_source_lines(frame, shipped={str(path)})
    path.write_text("second = 2  # a longer line, so the size differs\n")
    assert "second = 2" in tracebacks.with_source_lines(frame, shipped={str(path)})


def test_an_unreadable_line_is_skipped():
    def broken(filename, lineno):
        raise OSError("unreadable")

    text = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\nValueError'
    assert tracebacks.with_source_lines(text, getline=broken, shipped={"x.py"}) == text


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception groups from 3.11 on")
def test_real_group_format_is_filled(script_functions):
    # the table's GROUP shape is what traceback prints: checked against a real group
    path, namespace = script_functions
    loaded = cloudpickle.loads(tracebacks.dumps(namespace["helper"]))
    try:
        try:
            loaded(0)
        except ZeroDivisionError as error:
            raise ExceptionGroup("eg", [error])  # noqa: F821 (3.11 builtin)
    except Exception as group:
        text = "".join(traceback.format_exception(group))
    stripped = "\n".join(line for line in text.split("\n") if "return 1 / x" not in line)
    assert "return 1 / x" in tracebacks.with_source_lines(stripped)


# A remote text that names a file of the client's disk in its message: never read from here.
LEAK_IN_MESSAGE = '''Traceback (most recent call last):
  File "{path}", line 2, in helper
ValueError: boom
  File "{secret}", line 1, in leak'''

LEAK_IN_MESSAGE_FILLED = '''Traceback (most recent call last):
  File "{path}", line 2, in helper
    return 1 / x
ValueError: boom
  File "{secret}", line 1, in leak'''

LEAK_AS_FRAME = '''Traceback (most recent call last):
  File "{secret}", line 1, in leak
ValueError: boom'''

LEAK_AFTER_CHAIN = '''Traceback (most recent call last):
  File "{path}", line 2, in helper
KeyError: 'a'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "{path}", line 7, in check
RuntimeError: wrapped
    File "{path}", line 2, in helper
  File "{secret}", line 1, in leak'''

LEAK_AFTER_CHAIN_FILLED = '''Traceback (most recent call last):
  File "{path}", line 2, in helper
    return 1 / x
KeyError: 'a'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "{path}", line 7, in check
    return inner(x)
RuntimeError: wrapped
    File "{path}", line 2, in helper
  File "{secret}", line 1, in leak'''


@pytest.mark.parametrize("remote, expected", [
    (LEAK_IN_MESSAGE, LEAK_IN_MESSAGE_FILLED),    # a frame-like line of the message: not read,
    (LEAK_AS_FRAME, LEAK_AS_FRAME),               # a real frame of a file never shipped: not read
    (LEAK_AFTER_CHAIN, LEAK_AFTER_CHAIN_FILLED),  # nor a shipped file's line inside a message
], ids=["in-message", "not-shipped", "after-chain"])
def test_only_shipped_files_frames_are_read(tmp_path, remote, expected):
    path = tmp_path / "user_script.py"
    path.write_text(SCRIPT)
    secret = tmp_path / "hostname"
    secret.write_text("client-machine-secret\n")
    names = {"path": path, "secret": secret}
    filled = tracebacks.with_source_lines(remote.format(**names), shipped={str(path)})
    assert filled == expected.format(**names) and "client-machine-secret" not in filled


def test_the_files_whose_code_was_shipped_are_the_default(script_functions, tmp_path):
    # the review's repro: a message naming a file of the client's own disk
    path, namespace = script_functions
    secret = tmp_path / "hostname"
    secret.write_text("client-machine-secret\n")
    remote = (f'Traceback (most recent call last):\n  File "{path}", line 2, in helper\n'
              f'ValueError: boom\n  File "{secret}", line 1, in leak')
    tracebacks.dumps(namespace["helper"])  # shipping the function records its file
    filled = tracebacks.with_source_lines(remote)
    assert "return 1 / x" in filled and "client-machine-secret" not in filled
    unshipped = tmp_path / "never_shipped.py"
    unshipped.write_text("kept = 'here'\n")
    frame = f'Traceback (most recent call last):\n  File "{unshipped}", line 1, in f\nValueError'
    assert tracebacks.with_source_lines(frame) == frame
