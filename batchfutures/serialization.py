"""What travels through storage, and how it is pickled (cloudpickle).

    client                                       worker
    ------                                       ------
    dumps(fn)            -> functions/<sha>.pkl  loads(data) -> fn
    pack_items(calls)    -> inputs, child blob   unpack_items(blob, encoding)
    pack_arguments(args) -> inputs, child blob       -> [(fn index, args, kwargs)]
    payload_stamp()      -> inputs header        check_stamp(header) -> mismatch message or None
                                                 run each item -> encode_ok(value)
                                                                | encode_error(exc, tb)
                                                                | encode_unpicklable(...)
                                                                | encode_mismatch(message)
    unpack_result(data)  <- results/<i>          pack_result(outcomes, meta)
    outcome_result(o)    -> (ok, value or exception): the poller sets it on a future
    decode_outcome(o)    -> value, or raises the exception

Result object (``results/<i>``), one per child, one outcome per item:

    b"BFRESLT1" | uint64 LE M | M bytes JSON meta | uint64 LE K | K uint64 LE outcome lengths
    | the K outcomes, concatenated

A child blob is one cloudpickle of a list, in one of three encodings named by the inputs header's
"encoding" (so map pays for its arguments only, not for a function index and a kwargs dict per
item):

    "calls"  [(function index, args tuple, kwargs dict), ...]   submit: calls coalesced into a job
    "args"   [args tuple, ...]                                    map over several iterables
    "arg"    [argument, ...]                                      map over one iterable

Each outcome is its own pickle, so one the client cannot load fails only its own item. An
outcome is a plain pickle of a tuple of builtins; the user's value or exception is a cloudpickle
nested in it as bytes, so the kind, type name, repr and traceback text survive even when the
value itself cannot be loaded on the client:

    ("ok", payload)
    ("error", payload, type name, repr, traceback text)
    ("unpicklable", message, type name, repr, traceback text)
    ("mismatch", message)

A remote exception comes back as itself (same type, same args) with ``__cause__`` holding the
remote traceback text, as ``concurrent.futures.process`` does.
"""

from __future__ import annotations

import json
import pickle
import platform
import struct
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

import cloudpickle

__all__ = [
    "RemoteTraceback", "dumps", "loads", "payload_stamp", "check_stamp", "stamp_differences",
    "pack_items", "pack_arguments", "unpack_items", "CALLS", "ARGS", "ARG", "encode_ok",
    "encode_error", "encode_unpicklable",
    "encode_mismatch", "pack_result", "unpack_result", "outcome_result", "decode_outcome",
    "outcome_kind",
]

PROTOCOL = pickle.HIGHEST_PROTOCOL
RESULT_MAGIC = b"BFRESLT1"
OK, ERROR, UNPICKLABLE, MISMATCH = "ok", "error", "unpicklable", "mismatch"
CALLS, ARGS, ARG = "calls", "args", "arg"  # child blob encodings (the header's "encoding")
REPR_LIMIT = 2000
_U64 = struct.Struct("<Q")


class RemoteTraceback(Exception):
    """Holds the remote traceback text; the ``__cause__`` of a re-raised remote exception."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


# -- pickling on the client ---------------------------------------------------------------------
def _serialization_error(message: str) -> Exception:
    from .errors import SerializationError  # lazily: the worker never needs errors.py for this

    return SerializationError(message)


def _describe(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    kind = type(obj).__name__
    if isinstance(name, str):
        module = getattr(obj, "__module__", None)
        where = f" from {module}" if isinstance(module, str) else ""
        return f"the {kind} {name!r}{where}"
    return f"a {type(obj).__module__}.{kind}" if type(obj).__module__ != "builtins" else f"a {kind}"


def _try_dumps(obj: Any) -> Tuple[Optional[bytes], Optional[BaseException]]:
    try:
        return cloudpickle.dumps(obj, protocol=PROTOCOL), None
    except MemoryError:
        raise
    except Exception as error:  # PicklingError, TypeError, AttributeError, RecursionError...
        return None, error


def _reason(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def dumps(obj: Any, *, what: Optional[str] = None) -> bytes:
    """cloudpickle ``obj``; any failure raises SerializationError naming what failed."""
    data, error = _try_dumps(obj)
    if data is None:
        assert error is not None
        raise _serialization_error(f"cannot pickle {what or _describe(obj)}: {_reason(error)}") \
            from error
    return data


def loads(data: bytes) -> Any:
    return cloudpickle.loads(data)


def pack_items(items: Sequence[Tuple[int, tuple, dict]], *, first_item: Optional[int] = None) -> bytes:
    """A child's blob in the "calls" encoding: (function index, args, kwargs) per item.

    The whole chunk is one pickle (fast). When it fails, the culprit is looked for argument by
    argument so the SerializationError names it; ``first_item`` numbers the items in the
    message (the map position of the chunk's first item).
    """
    items = list(items)
    data, error = _try_dumps(items)
    if data is not None:
        return data
    assert error is not None
    raise _culprit([(args, kwargs) for _, args, kwargs in items], error, first_item)


def pack_arguments(chunk: List[Any], *, single: bool, first_item: int) -> bytes:
    """A map child's blob: the "arg" encoding (``single``: one argument per item) or "args".

    A failure names the argument and the map's item number, as pack_items does.
    """
    data, error = _try_dumps(chunk)
    if data is not None:
        return data
    assert error is not None
    raise _culprit([((value,) if single else value, {}) for value in chunk], error, first_item)


def _culprit(calls: Sequence[Tuple[tuple, dict]], error: BaseException,
             first_item: Optional[int]) -> Exception:
    """The SerializationError naming the first argument that does not pickle (caused by it)."""
    for position, (args, kwargs) in enumerate(calls):
        if len(calls) == 1 and first_item is None:
            of = "of the call"
        else:
            of = f"of item {position + (first_item or 0)}"
        for number, value in enumerate(args):
            failure = _try_dumps(value)[1]
            if failure is not None:
                return _caused(_serialization_error(
                    f"cannot pickle positional argument {number} ({_describe(value)}) {of}: "
                    f"{_reason(failure)}"), failure)
        for name, value in kwargs.items():
            failure = _try_dumps(value)[1]
            if failure is not None:
                return _caused(_serialization_error(
                    f"cannot pickle keyword argument {name!r} ({_describe(value)}) {of}: "
                    f"{_reason(failure)}"), failure)
    return _caused(_serialization_error(f"cannot pickle the call's arguments: {_reason(error)}"),
                   error)


def _caused(error: Exception, cause: BaseException) -> Exception:
    """``error`` as ``raise error from cause`` leaves it, for raising where it is returned to."""
    error.__cause__ = cause
    error.__suppress_context__ = True
    return error


def unpack_items(blob: bytes, encoding: str = CALLS) -> List[Tuple[int, tuple, dict]]:
    """A child's items as (function index, args, kwargs), whatever their encoding."""
    loaded = cloudpickle.loads(blob)
    if encoding == CALLS:
        return loaded
    if encoding == ARGS:
        return [(0, tuple(args), {}) for args in loaded]
    if encoding == ARG:
        return [(0, (argument,), {}) for argument in loaded]
    raise ValueError(f"unknown item encoding {encoding!r}")


# -- the version stamp --------------------------------------------------------------------------
def payload_stamp() -> Dict[str, str]:
    """The versions the client pickles with; stamped at the top level of every inputs header."""
    from ._version import __version__

    python = platform.python_version()
    return {
        "python": python,
        "python_minor": ".".join(python.split(".")[:2]),
        "cloudpickle": cloudpickle.__version__,
        "batchfutures": __version__,
    }


def _theirs(header: Dict[str, Any]) -> Dict[str, str]:
    python = str(header.get("python") or header.get("python_minor") or "")
    # the full version wins over "python_minor": a stamp whose "python" alone was changed (or
    # that disagrees with itself) must not pass for this interpreter's minor version
    minor = ".".join(python.split(".")[:2]) or str(header.get("python_minor") or "")
    return {"python": python, "python_minor": minor,
            "cloudpickle": str(header.get("cloudpickle") or ""),
            "batchfutures": str(header.get("batchfutures") or "")}


def _versions(stamp: Dict[str, str]) -> str:
    parts = [f"Python {stamp['python'] or '?'}", f"cloudpickle {stamp['cloudpickle'] or '?'}"]
    if stamp.get("batchfutures"):
        parts.append(f"batchfutures {stamp['batchfutures']}")
    return ", ".join(parts)


def _both(header: Dict[str, Any]) -> str:
    return (f"the client pickled with {_versions(_theirs(header))}; "
            f"this worker runs {_versions(payload_stamp())}")


def check_stamp(header: Dict[str, Any]) -> Optional[str]:
    """A message naming both sides when the worker cannot trust the payload, else None.

    Python major.minor and the cloudpickle major version must match: pickles of code objects
    do not cross Python minor versions, and cloudpickle's format changes with its major version.
    """
    theirs, mine = _theirs(header), payload_stamp()
    differ = (theirs["python_minor"] and theirs["python_minor"] != mine["python_minor"]) or (
        theirs["cloudpickle"]
        and theirs["cloudpickle"].split(".")[0] != mine["cloudpickle"].split(".")[0])
    if not differ:
        return None
    return (f"the worker cannot load this payload: {_both(header)}. Run the worker with the "
            f"client's Python minor version and cloudpickle major version (an image built for "
            f"this client: `batchfutures image`).")


def stamp_differences(header: Dict[str, Any]) -> List[str]:
    """Every version in the stamp that differs from this interpreter's (even a patch level)."""
    theirs, mine = _theirs(header), payload_stamp()
    return [f"{name} {theirs[name]} on the client, {mine[name]} on the worker"
            for name in ("python", "cloudpickle", "batchfutures")
            if theirs[name] and theirs[name] != mine[name]]


def load_failure_message(what: str, header: Dict[str, Any], error: BaseException) -> Optional[str]:
    """For a payload that failed to load: a mismatch message when any version differs."""
    differences = stamp_differences(header)
    if not differences:
        return None
    return (f"the worker could not load {what} ({_reason(error)}), and its versions differ from "
            f"the client's: {'; '.join(differences)}. Run the worker with the client's versions.")


# -- outcomes (worker side) ---------------------------------------------------------------------
def _safe_repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception as error:
        text = f"<{type(obj).__name__} object; repr() failed: {_reason(error)}>"
    return text if len(text) <= REPR_LIMIT else text[:REPR_LIMIT] + "...(truncated)"


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _envelope(*fields: Any) -> bytes:
    return pickle.dumps(fields, protocol=PROTOCOL)


def encode_ok(value: Any) -> bytes:
    """The outcome of an item that returned ``value``; an unpicklable value is recorded as such.

    MemoryError propagates: the worker treats it as running out of memory.
    """
    try:
        payload = cloudpickle.dumps(value, protocol=PROTOCOL)
    except MemoryError:
        raise
    except BaseException as error:
        return encode_unpicklable(
            f"the function returned {_type_name(value)}, which could not be pickled: "
            f"{_reason(error)}", traceback.format_exc(), type_name=_type_name(value),
            repr_text=_safe_repr(value))
    return _envelope(OK, payload)


def encode_error(error: BaseException, tb_text: Optional[str] = None) -> bytes:
    """The outcome of an item whose call raised ``error`` (any BaseException but MemoryError).

    The exception is also loaded back here: one that pickles but cannot be rebuilt (an
    ``__init__`` with other arguments than its ``args``) is recorded as unpicklable, with its
    type, repr and traceback, rather than failing on the client without them.
    """
    if tb_text is None:
        tb_text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    type_name, repr_text = _type_name(error), _safe_repr(error)
    try:
        payload = cloudpickle.dumps(error, protocol=PROTOCOL)
        pickle.loads(payload)
    except MemoryError:
        raise
    except BaseException as failure:
        return encode_unpicklable(
            f"the function raised {repr_text}, which could not be pickled and loaded back "
            f"({_reason(failure)})", tb_text, type_name=type_name, repr_text=repr_text)
    return _envelope(ERROR, payload, type_name, repr_text, tb_text)


def encode_unpicklable(message: str, tb_text: str, *, type_name: str = "",
                       repr_text: str = "") -> bytes:
    return _envelope(UNPICKLABLE, message, type_name, repr_text, tb_text)


def encode_mismatch(message: str) -> bytes:
    return _envelope(MISMATCH, message)


# -- the result object --------------------------------------------------------------------------
def pack_result(outcomes: Sequence[bytes], meta: Dict[str, Any]) -> bytes:
    """One object per child: JSON metadata and its items' outcomes (format in the docstring)."""
    meta_bytes = json.dumps(meta, sort_keys=True, default=str).encode()
    lengths = struct.pack(f"<{len(outcomes)}Q", *(len(o) for o in outcomes))
    return b"".join([RESULT_MAGIC, _U64.pack(len(meta_bytes)), meta_bytes,
                     _U64.pack(len(outcomes)), lengths, *outcomes])


def unpack_result(data: bytes) -> Tuple[Dict[str, Any], List[bytes]]:
    """(meta, encoded outcomes); ValueError for anything but a whole result object."""
    view = memoryview(data)
    try:
        if bytes(view[:8]) != RESULT_MAGIC:
            raise ValueError("not a batchfutures result object")
        (meta_length,) = _U64.unpack_from(view, 8)
        position = 16 + meta_length
        meta = json.loads(bytes(view[16:position]))
        (count,) = _U64.unpack_from(view, position)
        position += 8
        lengths = struct.unpack_from(f"<{count}Q", view, position)
        position += 8 * count
    except (struct.error, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"a truncated or corrupt result object: {error}") from error
    if position + sum(lengths) != len(view):
        raise ValueError("a truncated or corrupt result object: its size does not add up")
    outcomes = []
    for length in lengths:
        outcomes.append(bytes(view[position:position + length]))
        position += length
    return meta, outcomes


# -- outcomes (client side) ---------------------------------------------------------------------
def outcome_kind(encoded: bytes) -> str:
    """"ok", "error", "unpicklable" or "mismatch" (without loading the user's objects)."""
    return str(pickle.loads(encoded)[0])


def _remote_error(message: str, tb_text: Optional[str]) -> Exception:
    from .errors import RemoteError

    return RemoteError(message, tb_text)


def outcome_result(encoded: bytes) -> Tuple[bool, Any]:
    """``(True, value)`` or ``(False, exception)``, for the poller to set on a future."""
    try:
        fields = pickle.loads(encoded)
        kind = fields[0]
    except Exception as error:
        return False, _remote_error(f"the item's outcome is corrupt: {_reason(error)}",
                                    traceback.format_exc())
    if kind == OK:
        try:
            return True, cloudpickle.loads(fields[1])
        except Exception as error:  # e.g. the value's class does not exist on the client
            return False, _remote_error(
                f"the function's return value could not be loaded here: {_reason(error)}",
                traceback.format_exc())
    if kind == ERROR:
        _, payload, type_name, repr_text, tb_text = fields
        try:
            error = cloudpickle.loads(payload)
            if not isinstance(error, BaseException):
                raise TypeError(f"expected an exception, got {type(error).__name__}")
        except Exception as failure:  # e.g. the exception's class does not exist on the client
            return False, _remote_error(
                f"the function raised {type_name}: {repr_text}, which could not be loaded here "
                f"({_reason(failure)})", tb_text)
        error.__cause__ = RemoteTraceback(f'\n"""\n{tb_text}"""')
        return False, error
    if kind == MISMATCH:
        from .errors import EnvironmentMismatchError

        return False, EnvironmentMismatchError(fields[1])
    if kind == UNPICKLABLE:
        _, message, _type_name, _repr, tb_text = fields
        return False, _remote_error(message, tb_text)
    return False, _remote_error(f"the item's outcome has an unknown kind {kind!r}", None)


def decode_outcome(encoded: bytes) -> Any:
    """The item's value, or raise its exception."""
    ok, value = outcome_result(encoded)
    if ok:
        return value
    raise value
