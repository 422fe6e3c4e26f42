"""How what travels through storage is pickled (cloudpickle); the formats the pickles travel
in are wire.py's.

    client                                       worker
    ------                                       ------
    dumps(fn)            -> functions/<sha>.pkl  loads(data) -> fn
    dumps_function(fn, initializer)              check_stamp(header) -> mismatch message or None
    payload_stamp()      -> inputs header        load_failure_message(what, header, error)

A function is pickled by reference (module + name) when the worker can import its module, and by
value otherwise (local_modules, local_modules_by_value): the worker's image has the standard
library and site-packages, not the client's own modules.

With an executor initializer, a function's pickle is ``(initializer, fn)`` made by one dumps
(dumps_function): cloudpickle gives the functions of one dumps that share a module one globals
dict when loaded, so what the initializer sets with ``global`` is what the function reads, even
for functions pickled by value (``__main__``, modules shipped by value). The initargs travel
once per session in their own pickle.

A pickling failure raises SerializationError naming what failed; for a call's arguments,
argument_error names the first argument that does not pickle and the map's item number.
"""

from __future__ import annotations

import contextlib
import copyreg
import io
import os
import pickle
import platform
import site
import sys
import sysconfig
import threading
from typing import Any, Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple, Union

import cloudpickle

from . import tracebacks
from ._version import __version__
from .errors import SerializationError

__all__ = [
    "dumps", "loads", "payload_stamp", "check_stamp", "stamp_differences", "dumps_function",
    "load_failure_message", "missing_module_message", "local_modules", "local_modules_by_value",
    "argument_error", "describe", "reason", "try_dumps",
]

PROTOCOL = pickle.HIGHEST_PROTOCOL
Buffer = Union[bytes, bytearray, memoryview]  # a pickle as read: storage returns bytearrays


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
            f"(`batchfutures image` builds one from this client's packages), or ship it with "
            f"the job: BatchExecutor(..., requirements=\"auto\") (or a list) for an installed "
            f"library, at this client's version; or let batchfutures ship it by value: keep "
            f"BatchExecutor(..., ship_local_modules=True) and make sure the module is not "
            f"installed in site-packages on the client either.")


# -- pickling on the client ---------------------------------------------------------------------
def _serialization_error(message: str) -> Exception:
    return SerializationError(message)


def describe(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    kind = type(obj).__name__
    if isinstance(name, str):
        module = getattr(obj, "__module__", None)
        where = f" from {module}" if isinstance(module, str) else ""
        return f"the {kind} {name!r}{where}"
    return f"a {type(obj).__module__}.{kind}" if type(obj).__module__ != "builtins" else f"a {kind}"


def try_dumps(obj: Any, by_value: bool = True) -> Tuple[Optional[bytes], Optional[BaseException]]:
    try:
        with local_modules_by_value(by_value):
            # code objects keep their file: remote tracebacks name the user's (tracebacks.py)
            return tracebacks.dumps(obj, protocol=PROTOCOL), None
    except MemoryError:
        raise
    except Exception as error:  # PicklingError, TypeError, AttributeError, RecursionError...
        return None, error


def reason(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def dumps(obj: Any, *, what: Optional[str] = None, by_value: bool = True) -> bytes:
    """cloudpickle ``obj``; any failure raises SerializationError naming what failed.

    ``by_value``: the client's own modules (see local_modules) are pickled by value.
    """
    data, error = try_dumps(obj, by_value)
    if data is None:
        assert error is not None
        raise _serialization_error(f"cannot pickle {what or describe(obj)}: {reason(error)}") \
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
    return dumps((initializer, fn), what=describe(fn), by_value=by_value)


class _OwnReducePickler(cloudpickle.Pickler):
    """cloudpickle's Pickler, but an exception is reduced as its own class says, whatever
    reducer another library registered in copyreg for exception types: tblib's
    ``pickling_support.install()`` (which importing dask.multiprocessing runs) rebuilds an
    exception without calling ``__init__``, so ``SystemExit(5).code`` comes back None."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, BaseException) and type(obj) in copyreg.dispatch_table:
            return obj.__reduce_ex__(self.proto)
        return super().reducer_override(obj)


def dumps_exception(error: BaseException, own_reduce: bool = True) -> bytes:
    """``error`` pickled by the exceptions' own reduce (_OwnReducePickler), or, with
    ``own_reduce=False``, as cloudpickle alone does (a registered reducer such as tblib's can
    rebuild an exception whose ``__init__`` takes other arguments than its ``args``)."""
    if not own_reduce:
        return cloudpickle.dumps(error, protocol=PROTOCOL)
    with io.BytesIO() as buffer:
        _OwnReducePickler(buffer, protocol=PROTOCOL).dump(error)
        return buffer.getvalue()


def loads(data: Buffer) -> Any:
    return cloudpickle.loads(data)


def argument_error(calls: Sequence[Tuple[tuple, dict]], error: BaseException,
             first_item: Optional[int]) -> Exception:
    """The SerializationError naming the first argument that does not pickle (caused by it)."""
    for position, (args, kwargs) in enumerate(calls):
        if len(calls) == 1 and first_item is None:
            of = "of the call"
        else:
            of = f"of item {position + (first_item or 0)}"
        for number, value in enumerate(args):
            failure = try_dumps(value)[1]
            if failure is not None:
                return caused(_serialization_error(
                    f"cannot pickle positional argument {number} ({describe(value)}) {of}: "
                    f"{reason(failure)}"), failure)
        for name, value in kwargs.items():
            failure = try_dumps(value)[1]
            if failure is not None:
                return caused(_serialization_error(
                    f"cannot pickle keyword argument {name!r} ({describe(value)}) {of}: "
                    f"{reason(failure)}"), failure)
    return caused(_serialization_error(f"cannot pickle the call's arguments: {reason(error)}"),
                   error)


def caused(error: Exception, cause: BaseException) -> Exception:
    """``error`` as ``raise error from cause`` leaves it, for raising where it is returned to."""
    error.__cause__ = cause
    error.__suppress_context__ = True
    return error


# -- the version stamp --------------------------------------------------------------------------
def payload_stamp() -> Dict[str, str]:
    """The versions the client pickles with; stamped at the top level of every inputs header."""
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
    return (f"the worker could not load {what} ({reason(error)}), and its versions differ from "
            f"the client's: {'; '.join(differences)}. Run the worker with the client's versions.")
