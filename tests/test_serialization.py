"""Pickling of calls, the version stamp, per-item outcomes and the result object."""

from __future__ import annotations

import pickle
import sys
import threading
import traceback
import types

import cloudpickle
import pytest

from batchfutures import EnvironmentMismatchError, RemoteError, SerializationError, serialization, wire
from batchfutures.wire import RemoteTraceback


def raised(error: BaseException) -> tuple:
    """(exception, traceback text) as the worker sees them."""
    try:
        raise error
    except BaseException as caught:  # noqa: B036 - the worker records every BaseException
        return caught, traceback.format_exc()


# -- dumps and items ----------------------------------------------------------------------------
def test_dumps_round_trips_lambdas_and_closures():
    offset = 10
    fn = serialization.loads(serialization.dumps(lambda x: x + offset))
    assert fn(1) == 11


def test_unpicklable_function_names_the_function():
    lock = threading.Lock()

    def holds_a_lock():
        return lock

    with pytest.raises(SerializationError) as caught:
        serialization.dumps(holds_a_lock)
    assert isinstance(caught.value, pickle.PicklingError)
    assert "holds_a_lock" in str(caught.value) and "lock" in str(caught.value)


@pytest.mark.parametrize("obj, cause", [
    (threading.Lock(), "TypeError"),
    (types.SimpleNamespace(gen=(i for i in range(3))), "TypeError"),
])
def test_any_pickling_failure_is_a_serialization_error(obj, cause):
    with pytest.raises(SerializationError, match=cause):
        serialization.dumps(obj)


def test_recursion_error_is_a_serialization_error():
    deep: list = []
    for _ in range(sys.getrecursionlimit() * 20):
        deep = [deep]
    with pytest.raises(SerializationError, match="(?i)recursion"):
        serialization.dumps(deep)


def test_attribute_error_while_pickling_is_a_serialization_error():
    class Broken:
        def __reduce__(self):
            raise AttributeError("no such thing")

    with pytest.raises(SerializationError, match="AttributeError: no such thing"):
        serialization.dumps(Broken())


def test_pack_items_names_the_argument_that_fails():
    lock = threading.Lock()
    with pytest.raises(SerializationError, match=r"positional argument 1 \(a _thread.lock\) of the call"):
        wire.pack_items([(0, (1, lock), {})])
    with pytest.raises(SerializationError, match=r"keyword argument 'key' .* of item 12"):
        wire.pack_items([(0, (1,), {}), (0, (), {"key": lock})], first_item=11)
    items = [(0, (1, "two"), {"three": 3.0}), (1, (), {})]
    assert wire.unpack_items(wire.pack_items(items)) == items



def test_map_encodings_carry_arguments_only_and_unpack_to_calls():
    single = [1, (2, 3), {"four": 4}, None]
    blob = wire.pack_arguments(single, single=True, first_item=0)
    assert wire.unpack_items(blob, wire.ARG) == [(0, (x,), {}) for x in single]
    several = [(1, "a"), (2, "b")]
    blob = wire.pack_arguments(several, single=False, first_item=0)
    assert wire.unpack_items(blob, wire.ARGS) == [(0, t, {}) for t in several]
    # the lean encoding is smaller than a (function index, args, kwargs) triple per item
    assert len(wire.pack_arguments(list(range(1000)), single=True, first_item=0)) < \
        len(wire.pack_items([(0, (x,), {}) for x in range(1000)])) / 2
    with pytest.raises(ValueError, match="unknown item encoding 'columns'"):
        wire.unpack_items(blob, "columns")


def test_pack_arguments_names_the_map_item_that_fails():
    lock = threading.Lock()
    with pytest.raises(SerializationError, match=r"positional argument 0 \(a _thread.lock\) of item 42"):
        wire.pack_arguments([1, lock], single=True, first_item=41)
    with pytest.raises(SerializationError, match=r"positional argument 1 \(a _thread.lock\) of item 7"):
        wire.pack_arguments([(1, 2), (3, lock)], single=False, first_item=6)


def countdown():
    yield from (3, 2, 1)


@pytest.mark.parametrize("make, named", [
    (countdown, "the generator 'countdown'"),
    (threading.Lock, "a _thread.lock"),
    (threading.RLock, "a _thread.RLock"),
])
def test_serialization_error_names_what_failed(make, named):
    obj = make()
    with pytest.raises(SerializationError) as caught:
        serialization.dumps(obj)
    assert isinstance(caught.value, pickle.PicklingError)
    assert str(caught.value).startswith(f"cannot pickle {named}: TypeError")
    with pytest.raises(pickle.PicklingError, match=rf"positional argument 0 \({named}\) of the call"):
        wire.pack_items([(0, (obj,), {})])

# -- the stamp ----------------------------------------------------------------------------------
def test_stamp_and_check():
    from batchfutures._version import __version__

    stamp = serialization.payload_stamp()
    major, minor, micro = sys.version_info[:3]
    assert stamp == {"python": f"{major}.{minor}.{micro}", "python_minor": f"{major}.{minor}",
                     "cloudpickle": cloudpickle.__version__, "batchfutures": __version__}
    assert serialization.check_stamp(stamp) is None
    assert serialization.stamp_differences(stamp) == []
    patch = dict(stamp, python=f"{major}.{minor}.{micro + 1}", batchfutures="0.0.0")
    assert serialization.check_stamp(patch) is None  # a patch level does not stop the worker
    assert len(serialization.stamp_differences(patch)) == 2


@pytest.mark.parametrize("change, client_side", [
    ({"python": "2.7.18", "python_minor": "2.7"}, "Python 2.7.18"),
    ({"cloudpickle": "1.6.0"}, "cloudpickle 1.6.0"),
])
def test_mismatch_names_both_versions(change, client_side):
    message = serialization.check_stamp(dict(serialization.payload_stamp(), **change))
    assert message is not None
    assert client_side in message
    assert f"Python {serialization.payload_stamp()['python']}" in message
    assert f"cloudpickle {cloudpickle.__version__}" in message



def test_a_stamp_with_only_python_2_7_is_a_mismatch_naming_both_versions():
    # "python" changed, "python_minor" and the rest left as this interpreter's
    mine = serialization.payload_stamp()
    message = serialization.check_stamp(dict(mine, python="2.7"))
    assert message is not None
    assert "the client pickled with Python 2.7," in message
    assert f"this worker runs Python {mine['python']}, cloudpickle {mine['cloudpickle']}" in message
    assert serialization.check_stamp({"python_minor": "2.7"}) is not None  # an older-style stamp
    assert serialization.check_stamp({}) is None  # no stamp: nothing to compare

# -- outcomes -----------------------------------------------------------------------------------
def test_ok_outcome():
    encoded = wire.encode_ok({"a": [1, 2]})
    assert wire.outcome_kind(encoded) == "ok"
    assert wire.outcome_result(encoded) == (True, {"a": [1, 2]})
    assert wire.decode_outcome(encoded) == {"a": [1, 2]}


def test_error_outcome_is_the_same_exception_with_the_remote_traceback():
    error, tb = raised(ValueError("bad value", 7))
    encoded = wire.encode_error(error, tb)
    ok, exc = wire.outcome_result(encoded)
    assert not ok and type(exc) is ValueError and exc.args == ("bad value", 7)
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert "raise error" in str(exc.__cause__) and "ValueError: ('bad value', 7)" in str(exc.__cause__)
    with pytest.raises(ValueError) as caught:
        wire.decode_outcome(encoded)
    assert caught.value.args == ("bad value", 7) and isinstance(caught.value.__cause__, RemoteTraceback)


def test_system_exit_is_an_ordinary_outcome():
    ok, exc = wire.outcome_result(wire.encode_error(*raised(SystemExit(5))))
    assert not ok and type(exc) is SystemExit and exc.code == 5


def test_unpicklable_exception_becomes_remote_error_with_type_repr_and_traceback():
    error, tb = raised(ValueError("holds", threading.Lock()))
    encoded = wire.encode_error(error, tb)
    assert wire.outcome_kind(encoded) == "unpicklable"
    ok, exc = wire.outcome_result(encoded)
    assert not ok and type(exc) is RemoteError
    assert "ValueError" in str(exc) and "holds" in str(exc)
    assert exc.traceback == tb
    with pytest.raises(RemoteError):
        wire.decode_outcome(encoded)


class NeedsTwoArguments(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")  # args != the __init__ arguments: unpickling fails


def test_exception_that_cannot_be_rebuilt_is_caught_on_the_worker():
    encoded = wire.encode_error(*raised(NeedsTwoArguments(1, 2)))
    ok, exc = wire.outcome_result(encoded)
    assert not ok and type(exc) is RemoteError and "NeedsTwoArguments" in str(exc)
    assert "1/2" in exc.traceback


def test_exception_class_missing_on_the_client_keeps_its_name_and_traceback(tmp_path, monkeypatch):
    (tmp_path / "remote_only.py").write_text("class Custom(Exception):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import remote_only

    encoded = wire.encode_error(*raised(remote_only.Custom("from far away")))
    monkeypatch.delitem(sys.modules, "remote_only")
    (tmp_path / "remote_only.py").unlink()
    ok, exc = wire.outcome_result(encoded)
    assert not ok and type(exc) is RemoteError
    assert "remote_only.Custom" in str(exc) and "from far away" in str(exc)
    assert "from far away" in exc.traceback


def test_unpicklable_value_raises_its_pickling_error():
    encoded = wire.encode_ok(i for i in range(3))
    ok, exc = wire.outcome_result(encoded)
    assert not ok and type(exc) is TypeError and "generator" in str(exc)
    assert "could not be pickled" in str(exc.__cause__)


def test_mismatch_outcome():
    ok, exc = wire.outcome_result(wire.encode_mismatch("Python 2.7 vs 3.11"))
    assert not ok and type(exc) is EnvironmentMismatchError and str(exc) == "Python 2.7 vs 3.11"


def test_memory_error_while_pickling_propagates():
    class Huge:
        def __reduce__(self):
            raise MemoryError

    with pytest.raises(MemoryError):
        wire.encode_ok(Huge())


# -- the result object --------------------------------------------------------------------------
def test_result_object_round_trip_one_bad_outcome_fails_only_its_item():
    outcomes = [wire.encode_ok(1), b"garbage", wire.encode_ok("three")]
    data = wire.pack_result(outcomes, {"index": 4, "attempt": "1", "when": 1.5})
    assert data.startswith(wire.RESULT_MAGIC)
    meta, back = wire.unpack_result(data)
    assert meta == {"index": 4, "attempt": "1", "when": 1.5} and back == outcomes
    results = [wire.outcome_result(o) for o in back]
    assert results[0] == (True, 1) and results[2] == (True, "three")
    assert results[1][0] is False and type(results[1][1]) is RemoteError



def test_outcomes_whose_class_is_missing_on_the_client_fail_only_their_own_items(tmp_path, monkeypatch):
    (tmp_path / "worker_side.py").write_text(
        "class Point:\n    def __init__(self, x):\n        self.x = x\n\n"
        "class Oops(Exception):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import worker_side  # importable "on the worker" only: pickled by reference

    outcomes = [wire.encode_ok(1), wire.encode_ok(worker_side.Point(2)),
                wire.encode_error(*raised(worker_side.Oops("far"))),
                wire.encode_error(*raised(KeyError("k"))), wire.encode_ok([3])]
    data = wire.pack_result(outcomes, {"index": 0})
    monkeypatch.delitem(sys.modules, "worker_side")
    (tmp_path / "worker_side.py").unlink()
    results = [wire.outcome_result(o) for o in wire.unpack_result(data)[1]]
    assert results[0] == (True, 1) and results[4] == (True, [3])
    ok, error = results[3]
    assert not ok and type(error) is KeyError and error.args == ("k",)
    for ok, error in results[1:3]:
        assert not ok and type(error) is RemoteError and "worker_side" in str(error)
    assert "could not be loaded here" in str(results[1][1])
    assert "worker_side.Oops" in str(results[2][1]) and "far" in results[2][1].traceback

def test_truncated_or_foreign_result_object_is_refused():
    data = wire.pack_result([wire.encode_ok(1)] * 3, {})
    for broken in (data[:-1], data[:20], b"", b"something else entirely"):
        with pytest.raises(ValueError):
            wire.unpack_result(broken)


_TBLIB_SCRIPT = """
import tblib.pickling_support
from batchfutures import wire

class NeedsTwo(Exception):
    def __init__(self, a, b):
        super().__init__(a)
        self.b = b

tblib.pickling_support.install()  # what importing dask.multiprocessing does: every exception
                                  # type defined by then gets its reducer

def raised(error):
    try:
        raise error
    except BaseException as caught:
        return caught

ok, exc = wire.outcome_result(wire.encode_error(raised(SystemExit(5))))
print(type(exc).__name__, exc.code)
ok, exc = wire.outcome_result(wire.encode_error(raised(NeedsTwo(1, 2))))
print(type(exc).__name__, exc.args, exc.b)
"""


@pytest.mark.slow  # a real process: tblib's install is process-wide
def test_an_exception_comes_back_the_same_when_another_library_registered_a_reducer():
    """tblib's pickling_support.install() registers a reducer for every exception type that
    rebuilds it without __init__ (SystemExit's code lost): the exception's own reduce is used
    first, and the registered one only for an exception its own cannot rebuild."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _TBLIB_SCRIPT], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["SystemExit 5", "NeedsTwo (1,) 2"]
