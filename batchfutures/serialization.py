"""What travels through storage, and how it is pickled.

    client                                   worker
    ------                                   ------
    dumps(fn)            -> functions/<sha>  loads
    pack_items(chunk)    -> inputs blob      unpack_items -> [(fn index, args, kwargs), ...]
    payload_stamp()      -> inputs header    check_stamp(header) -> mismatch message or None
    unpack_result(data)  <- results/<i>      pack_result([encode_ok(v) | encode_error(e) ...])
    outcome_result(o)    -> (ok, value or exception) for the poller to set on a future

Each outcome is pickled on its own, so one outcome the client cannot load fails only its item.
A remote exception comes back as itself, with `__cause__` holding the remote traceback text,
as `concurrent.futures.process` does.
"""

from __future__ import annotations

import pickle
import platform
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

import cloudpickle

RESULT_FORMAT = 1
OK, ERROR, UNPICKLABLE, MISMATCH = "ok", "error", "unpicklable", "mismatch"


class RemoteTraceback(Exception):
    """Holds the remote traceback text; set as the `__cause__` of a re-raised remote exception."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


def _serialization_error(message: str) -> Exception:
    from .errors import SerializationError

    return SerializationError(message)


def dumps(obj: Any, *, what: Optional[str] = None) -> bytes:
    """cloudpickle ``obj``; any failure becomes a SerializationError naming what failed."""
    try:
        return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:  # PicklingError, TypeError, AttributeError, RecursionError...
        label = what or _describe(obj)
        raise _serialization_error(f"cannot pickle {label}: {type(error).__name__}: {error}") from error


def _describe(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    return f"{type(obj).__name__} {name!r}" if name else f"a {type(obj).__name__}"


def loads(data: bytes) -> Any:
    return cloudpickle.loads(data)


def payload_stamp() -> Dict[str, str]:
    """The versions the client pickled with; the worker compares its own against them."""
    from ._version import __version__

    python = platform.python_version()
    return {
        "python": python,
        "python_minor": ".".join(python.split(".")[:2]),
        "cloudpickle": cloudpickle.__version__,
        "batchfutures": __version__,
    }


def check_stamp(header: Dict[str, Any]) -> Optional[str]:
    """A message naming both sides when this interpreter cannot trust the payload, else None."""
    mine = payload_stamp()
    theirs_python = str(header.get("python_minor") or header.get("python", ""))
    theirs_minor = ".".join(theirs_python.split(".")[:2])
    theirs_cp = str(header.get("cloudpickle", ""))
    problems = []
    if theirs_minor and theirs_minor != mine["python_minor"]:
        problems.append(f"Python {header.get('python', theirs_minor)} on the client, "
                        f"Python {mine['python']} on the worker")
    if theirs_cp and theirs_cp.split(".")[0] != mine["cloudpickle"].split(".")[0]:
        problems.append(f"cloudpickle {theirs_cp} on the client, cloudpickle {mine['cloudpickle']} "
                        f"on the worker")
    if not problems:
        return None
    return ("the worker cannot load this payload: " + "; ".join(problems)
            + ". Build the worker image with the client's versions (batchfutures image).")


# -- items -------------------------------------------------------------------------------------
def pack_items(items: Sequence[Tuple[int, tuple, dict]]) -> bytes:
    """A child's items: (function index into header["functions"], args, kwargs) each."""
    return dumps(list(items), what="the call's arguments")


def unpack_items(blob: bytes) -> List[Tuple[int, tuple, dict]]:
    return loads(blob)


# -- outcomes ----------------------------------------------------------------------------------
def encode_ok(value: Any) -> bytes:
    try:
        return cloudpickle.dumps((OK, value), protocol=pickle.HIGHEST_PROTOCOL)
    except MemoryError:
        raise
    except Exception as error:
        return encode_unpicklable(
            f"the result ({type(value).__name__}) could not be pickled: {error}",
            traceback.format_exc())


def encode_error(error: BaseException, tb_text: Optional[str] = None) -> bytes:
    tb_text = tb_text or "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        return cloudpickle.dumps((ERROR, error, tb_text), protocol=pickle.HIGHEST_PROTOCOL)
    except MemoryError:
        raise
    except Exception as pickling_error:
        return encode_unpicklable(
            f"the exception {type(error).__name__}: {error} could not be pickled "
            f"({pickling_error})", tb_text)


def encode_unpicklable(message: str, tb_text: str) -> bytes:
    return pickle.dumps((UNPICKLABLE, message, tb_text), protocol=pickle.HIGHEST_PROTOCOL)


def encode_mismatch(message: str) -> bytes:
    return pickle.dumps((MISMATCH, message), protocol=pickle.HIGHEST_PROTOCOL)


def pack_result(outcomes: Sequence[bytes], meta: Dict[str, Any]) -> bytes:
    """One object per child: its metadata and one separately pickled outcome per item."""
    return pickle.dumps({"format": RESULT_FORMAT, "meta": dict(meta), "outcomes": list(outcomes)},
                        protocol=pickle.HIGHEST_PROTOCOL)


def unpack_result(data: bytes) -> Tuple[Dict[str, Any], List[bytes]]:
    record = pickle.loads(data)
    return record.get("meta", {}), record["outcomes"]


def outcome_result(encoded: bytes) -> Tuple[bool, Any]:
    """``(True, value)`` or ``(False, exception)`` for the poller to set on a future."""
    from .errors import EnvironmentMismatchError, RemoteError

    try:
        outcome = cloudpickle.loads(encoded)
    except Exception as error:  # e.g. the exception's class does not exist on the client
        return False, RemoteError(
            f"the remote outcome could not be loaded here: {type(error).__name__}: {error}",
            traceback.format_exc())
    kind = outcome[0]
    if kind == OK:
        return True, outcome[1]
    if kind == ERROR:
        error, tb_text = outcome[1], outcome[2]
        error.__cause__ = RemoteTraceback(f'\n"""\n{tb_text}"""')
        return False, error
    if kind == MISMATCH:
        return False, EnvironmentMismatchError(outcome[1])
    return False, RemoteError(outcome[1], outcome[2])


def decode_outcome(encoded: bytes) -> Any:
    """The value of an outcome, or raise its exception."""
    ok, value = outcome_result(encoded)
    if ok:
        return value
    raise value
