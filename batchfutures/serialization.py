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
    | the K outcomes, concatenated | the output section (meta["output"] bytes; absent if 0)

The output section (BatchExecutor(echo_output=True)) is what the items printed, one
JSON object for the child, holding only the items that printed something:
``{"<item position>": [stdout, stderr, stdout chars cut, stderr chars cut]}`` (the end of each
stream, at most calls.OUTPUT_LIMIT characters). It is read apart from the outcomes
(result_output), so decoding an outcome costs what it did; an object without meta["output"]
(written before echo_output existed, or by a child that printed nothing) has none.

The meta's "usage" (docs/usage.md) is what each item used in its container, measured by the worker
(calls.Meter): one entry per item, in item order, ``[wall_s, cpu_s, peak_mib]`` (peak_mib null
where memory is not measured: the emulator's thread launcher), or null for an item not measured
(its function did not load). Absent when no item was measured: an object written before usage was measured,
a refused job, an initializer that failed. Read apart from the outcomes (result_usage), at no
extra request: it travels in the object the client reads anyway.

With an executor initializer, a function's pickle is ``(initializer, fn)`` made by one dumps
(dumps_function): cloudpickle gives the functions of one dumps that share a module one globals
dict when loaded, so what the initializer sets with ``global`` is what the function reads, even
for functions pickled by value (``__main__``, modules shipped by value). The initargs travel
once per session in their own pickle.

A child blob is one cloudpickle of a list, in one of three encodings named by the inputs header's
"encoding" (so map pays for its arguments only, not for a function index and a kwargs dict per
item):

    "calls"  [(function index, args tuple, kwargs dict), ...]   submit: calls coalesced into a job
    "args"   [args tuple, ...]                                    map over several iterables
    "arg"    [argument, ...]                                      map over one iterable

A "calls" blob starts with the function indices its items use, outside the pickle, so the worker
fetches those functions and checks their seals before it unpickles anything, the arguments
included (item_functions; "args" and "arg" items all call function 0):

    b"BFCALLS1" | uint64 LE n | n uint64 LE function indices, ascending | the pickle

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

import contextlib
import json
import os
import pickle
import platform
import site
import struct
import sys
import sysconfig
import threading
import traceback
from typing import Any, Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple, Union

import cloudpickle

__all__ = [
    "RemoteTraceback", "dumps", "loads", "payload_stamp", "check_stamp", "stamp_differences",
    "pack_items", "pack_arguments", "unpack_items", "CALLS", "ARGS", "ARG", "encode_ok",
    "encode_error", "encode_unpicklable",
    "encode_mismatch", "pack_result", "unpack_result", "outcome_result", "decode_outcome",
    "outcome_kind", "dumps_function", "result_output", "result_usage", "echo_output", "item_functions",
]

PROTOCOL = pickle.HIGHEST_PROTOCOL
RESULT_MAGIC = b"BFRESLT1"
OK, ERROR, UNPICKLABLE, MISMATCH = "ok", "error", "unpicklable", "mismatch"
INITIALIZER, DEPENDENCY = "initializer", "dependency"
CALLS, ARGS, ARG = "calls", "args", "arg"  # child blob encodings (the header's "encoding")
CALLS_MAGIC = b"BFCALLS1"
Buffer = Union[bytes, bytearray, memoryview]  # a pickle as read: storage returns bytearrays
REPR_LIMIT = 2000
_U64 = struct.Struct("<Q")


class RemoteTraceback(Exception):
    """Holds the remote traceback text; the ``__cause__`` of a re-raised remote exception."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


# -- which modules travel by value ----------------------------------------------------------
# A function is pickled by reference (module + name) when its module is importable here. The
# worker image has the standard library and site-packages, not the user's own modules (a script
# beside the notebook, a package on PYTHONPATH, an uninstalled checkout): those go by value,
# unless the user opts out (BatchExecutor(..., ship_local_modules=False)).
_ALWAYS_BY_REFERENCE = frozenset({"batchfutures", "cloudpickle", "__main__"})
_local_lock = threading.Lock()
_local_cache: Tuple[int, FrozenSet[str]] = (-1, frozenset())


def _installed_roots() -> Tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        roots.update(site.getsitepackages())
    except AttributeError:  # some virtualenv builds lack it
        pass
    user_site = getattr(site, "getusersitepackages", lambda: None)()
    roots.add(user_site)
    return tuple(os.path.realpath(root) + os.sep for root in roots if root)


def local_modules() -> FrozenSet[str]:
    """Top-level names of the loaded modules that live outside the stdlib and site-packages."""
    global _local_cache
    modules = sys.modules
    with _local_lock:
        count, names = _local_cache
        if count == len(modules):
            return names
        roots = _installed_roots()
        found = set()
        for name, module in list(modules.items()):
            top = name.partition(".")[0]
            if top in _ALWAYS_BY_REFERENCE or top in found or module is None:
                continue
            origin = getattr(module, "__file__", None)
            if not isinstance(origin, str):
                continue  # built-in, frozen or namespace package: the worker has or needs none
            if not os.path.realpath(origin).startswith(roots):
                found.add(top)
        _local_cache = (len(modules), frozenset(found))
        return _local_cache[1]


_registered_by_us: Dict[str, int] = {}  # module name -> blocks using it (threads pickle at once)


@contextlib.contextmanager
def local_modules_by_value(enabled: bool = True) -> Iterator[None]:
    """Pickle the user's own modules by value for the duration of the block.

    cloudpickle's registry is process-wide: a module the user registered stays theirs; the ones
    registered here are counted so that one thread's block never unregisters another's.
    """
    if not enabled:
        yield
        return
    mine: List[str] = []
    with _local_lock:
        users_own = cloudpickle.list_registry_pickle_by_value() - set(_registered_by_us)
    names = local_modules() - users_own
    with _local_lock:
        for name in names:
            module = sys.modules.get(name)
            if module is None:
                continue
            if name not in _registered_by_us:
                try:
                    cloudpickle.register_pickle_by_value(module)
                except ValueError:  # not a registrable module (e.g. replaced in sys.modules)
                    continue
                _registered_by_us[name] = 0
            _registered_by_us[name] += 1
            mine.append(name)
    try:
        yield
    finally:
        with _local_lock:
            for name in mine:
                _registered_by_us[name] -= 1
                if not _registered_by_us[name]:
                    del _registered_by_us[name]
                    module = sys.modules.get(name)
                    if module is not None:
                        try:
                            cloudpickle.unregister_pickle_by_value(module)
                        except ValueError:
                            pass


def missing_module_message(what: str, error: BaseException) -> Optional[str]:
    """For a payload that failed to load because a module is missing here: say what to do."""
    if not isinstance(error, ImportError):
        return None
    name = getattr(error, "name", None) or str(error)
    return (f"the worker could not load {what}: module {name!r} is not installed in the "
            f"worker's image ({type(error).__name__}: {error}). Either install it in the image "
            f"(`batchfutures image` builds one from this client's packages), or let batchfutures "
            f"ship it by value: keep BatchExecutor(..., ship_local_modules=True) and make sure "
            f"the module is not installed in site-packages on the client either.")


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


def _try_dumps(obj: Any, by_value: bool = True) -> Tuple[Optional[bytes], Optional[BaseException]]:
    try:
        with local_modules_by_value(by_value):
            return cloudpickle.dumps(obj, protocol=PROTOCOL), None
    except MemoryError:
        raise
    except Exception as error:  # PicklingError, TypeError, AttributeError, RecursionError...
        return None, error


def _reason(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def dumps(obj: Any, *, what: Optional[str] = None, by_value: bool = True) -> bytes:
    """cloudpickle ``obj``; any failure raises SerializationError naming what failed.

    ``by_value``: the client's own modules (see local_modules) are pickled by value.
    """
    data, error = _try_dumps(obj, by_value)
    if data is None:
        assert error is not None
        raise _serialization_error(f"cannot pickle {what or _describe(obj)}: {_reason(error)}") \
            from error
    return data


def dumps_function(fn: Any, initializer: Any = None, *, by_value: bool = True) -> bytes:
    """``fn``'s pickle; with an executor ``initializer``, ``(initializer, fn)`` in one dumps.

    One dumps: cloudpickle gives functions pickled together that share a module (``__main__``,
    a module shipped by value) one globals dict when loaded, so what ``initializer`` sets with
    ``global`` is what ``fn`` reads in the worker (calls.load_bundles). Pickled apart, each
    would get its own copy of the module's globals.
    """
    if initializer is None:
        return dumps(fn, by_value=by_value)
    return dumps((initializer, fn), what=_describe(fn), by_value=by_value)


def loads(data: Buffer) -> Any:
    return cloudpickle.loads(data)


def pack_items(items: Sequence[Tuple[int, tuple, dict]], *, first_item: Optional[int] = None,
               by_value: bool = True) -> bytes:
    """A child's blob in the "calls" encoding: (function index, args, kwargs) per item.

    The whole chunk is one pickle (fast). When it fails, the culprit is looked for argument by
    argument so the SerializationError names it; ``first_item`` numbers the items in the
    message (the map position of the chunk's first item).
    """
    items = list(items)
    data, error = _try_dumps(items, by_value)
    if data is not None:
        used = sorted({int(function_index) for function_index, _, _ in items})
        return b"".join([CALLS_MAGIC, struct.pack(f"<{len(used) + 1}Q", len(used), *used), data])
    assert error is not None
    raise _culprit([(args, kwargs) for _, args, kwargs in items], error, first_item)


def _calls_header(blob: Buffer) -> Optional[Tuple[List[int], int]]:
    """(function indices, where the pickle starts) of a "calls" blob; None for one written
    without them (before the prefix existed)."""
    view = memoryview(blob)
    if bytes(view[:len(CALLS_MAGIC)]) != CALLS_MAGIC:
        return None
    (count,) = _U64.unpack_from(view, len(CALLS_MAGIC))
    start = len(CALLS_MAGIC) + 8 + 8 * count
    if start > len(view):
        raise ValueError("a corrupt calls blob: its function indices run past its end")
    return list(struct.unpack_from(f"<{count}Q", view, len(CALLS_MAGIC) + 8)), start


def item_functions(blob: Buffer, encoding: str = CALLS) -> Optional[List[int]]:
    """The function indices a child's items call, read without unpickling anything; None when
    the blob does not say (a "calls" blob written without them: every function may be used)."""
    if encoding in (ARGS, ARG):
        return [0]
    found = _calls_header(blob)
    return None if found is None else found[0]


def pack_arguments(chunk: List[Any], *, single: bool, first_item: int,
                   by_value: bool = True) -> bytes:
    """A map child's blob: the "arg" encoding (``single``: one argument per item) or "args".

    A failure names the argument and the map's item number, as pack_items does.
    """
    data, error = _try_dumps(chunk, by_value)
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


def unpack_items(blob: Buffer, encoding: str = CALLS) -> List[Tuple[int, tuple, dict]]:
    """A child's items as (function index, args, kwargs), whatever their encoding."""
    if encoding == CALLS:
        found = _calls_header(blob)
        return cloudpickle.loads(blob if found is None else memoryview(blob)[found[1]:])
    loaded = cloudpickle.loads(blob)
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
    """The outcome of an item that returned ``value``.

    A value that cannot be pickled makes the pickling error itself the item's exception, as
    ProcessPoolExecutor does. MemoryError propagates: the worker treats it as running out of
    memory.
    """
    try:
        payload = cloudpickle.dumps(value, protocol=PROTOCOL)
    except MemoryError:
        raise
    except Exception as error:
        from .errors import add_note

        note = f"batchfutures: the function returned {_type_name(value)}, which could not be pickled"
        add_note(error, note)  # the note travels with the exception
        text = traceback.format_exc()
        if sys.version_info < (3, 11):  # tracebacks show notes from 3.11 on
            text += note + "\n"
        return encode_error(error, text)
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


def encode_dependency_failure(upstream_job_id: str, upstream_outcome: bytes) -> bytes:
    """The outcome of an item whose argument, another call's result, did not succeed."""
    return _envelope(DEPENDENCY, upstream_job_id, upstream_outcome)


def encode_initializer_failure(initializer: Any, error: BaseException, tb_text: str) -> bytes:
    """The outcome of each item of a child whose initializer raised ``error``."""
    inner = encode_error(error, tb_text)
    return _envelope(INITIALIZER, _describe(initializer), inner)


# -- the result object --------------------------------------------------------------------------
def pack_result(outcomes: Sequence[bytes], meta: Dict[str, Any],
                output: Optional[Dict[int, Sequence[Any]]] = None) -> bytes:
    """One object per child: JSON metadata, its items' outcomes and, when an item printed
    something, the output section (``output``: item position -> [stdout, stderr, stdout chars
    cut, stderr chars cut]); the format is in the module docstring."""
    section = json.dumps({str(k): list(v) for k, v in output.items()}).encode() if output else b""
    if section:
        meta = {**meta, "output": len(section)}
    meta_bytes = json.dumps(meta, sort_keys=True, default=str).encode()
    lengths = struct.pack(f"<{len(outcomes)}Q", *(len(o) for o in outcomes))
    return b"".join([RESULT_MAGIC, _U64.pack(len(meta_bytes)), meta_bytes,
                     _U64.pack(len(outcomes)), lengths, *outcomes, section])


def _output_length(meta: Dict[str, Any]) -> int:
    length = meta.get("output", 0)
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"a corrupt result object: its output length is {length!r}")
    return length


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
    if position + sum(lengths) + _output_length(meta) != len(view):
        raise ValueError("a truncated or corrupt result object: its size does not add up")
    outcomes = []
    for length in lengths:
        outcomes.append(bytes(view[position:position + length]))
        position += length
    return meta, outcomes


def result_output(data: Any) -> Dict[int, List[Any]]:
    """What the items of a result object printed: item position -> [stdout, stderr, stdout
    chars cut, stderr chars cut], only for items that printed; {} when none did, for an object
    written before echo_output existed, and for anything unreadable (the outcomes' decoding reports that).
    Reads the meta and the output section only, never an outcome."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return {}
    try:
        view = memoryview(data)
        if bytes(view[:8]) != RESULT_MAGIC:
            return {}
        (meta_length,) = _U64.unpack_from(view, 8)
        meta = bytes(view[16:16 + meta_length])
        if b'"output"' not in meta:  # nothing printed: not even the meta is parsed
            return {}
        length = _output_length(json.loads(meta))
        if not length or length > len(view):
            return {}
        section = json.loads(bytes(view[len(view) - length:]))
        return {int(position): list(printed) for position, printed in section.items()
                if isinstance(printed, list) and len(printed) == 4}
    except Exception:
        return {}


def result_usage(data: Any) -> Optional[List[Any]]:
    """The meta's per-item usage entries (see the module docstring), None when the object has
    none (written before usage was measured, no item measured) or cannot be read. Reads the meta only."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return None
    try:
        view = memoryview(data)
        if bytes(view[:8]) != RESULT_MAGIC:
            return None
        (meta_length,) = _U64.unpack_from(view, 8)
        meta = bytes(view[16:16 + meta_length])
        if b'"usage"' not in meta:  # nothing measured: not even the meta is parsed
            return None
        usage = json.loads(meta).get("usage")
    except Exception:
        return None
    return usage if isinstance(usage, list) else None


def _echo_stream(stream: Any, text: Any, cut: Any, name: str) -> None:
    if stream is None or not isinstance(text, str) or not (text or cut):
        return
    if isinstance(cut, int) and cut > 0:
        text = (f"[batchfutures: the first {cut} characters this call wrote to {name} were cut; "
                f"future.log() has them]\n") + text
    try:
        stream.write(text)
    except UnicodeEncodeError:  # the client's terminal cannot show some character
        encoding = getattr(stream, "encoding", None) or "utf-8"
        stream.write(text.encode(encoding, "backslashreplace").decode(encoding, "replace"))
    stream.flush()


def echo_output(printed: Optional[Sequence[Any]]) -> None:
    """Write what one call printed (an entry of result_output) to this process's sys.stdout and
    sys.stderr, as a ProcessPoolExecutor's worker prints to its parent's terminal."""
    if not printed:
        return
    out, err, out_cut, err_cut = printed
    try:
        _echo_stream(sys.stdout, out, out_cut, "stdout")
        _echo_stream(sys.stderr, err, err_cut, "stderr")
    except Exception:  # a closed or broken stream: the output stays in the job's log
        pass


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
            raised = cloudpickle.loads(payload)
            if not isinstance(raised, BaseException):
                raise TypeError(f"expected an exception, got {type(raised).__name__}")
        except Exception as not_loaded:  # e.g. the exception's class does not exist on the client
            return False, _remote_error(
                f"the function raised {type_name}: {repr_text}, which could not be loaded here "
                f"({_reason(not_loaded)})", tb_text)
        raised.__cause__ = RemoteTraceback(f'\n"""\n{tb_text}"""')
        return False, raised
    if kind == DEPENDENCY:
        from .errors import DependencyFailedError

        _, upstream_job_id, inner = fields
        _, cause = outcome_result(inner)
        dependency = DependencyFailedError(
            f"an argument of this call is the result of {upstream_job_id}, which failed: {cause!r}",
            job_id=upstream_job_id, status_reason="a dependency failed")
        dependency.__cause__ = cause
        return False, dependency
    if kind == INITIALIZER:
        from .errors import InitializerFailedError

        _, described, inner = fields
        _, cause = outcome_result(inner)
        initializer = InitializerFailedError(
            f"{described}, the executor's initializer, raised {cause!r} in this call's worker "
            f"process, so its items did not run")
        initializer.__cause__ = cause
        return False, initializer
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
