"""Running one child's calls: what the worker's sequential path and its inner pool share.

    worker.run_items
      Prefetched(storage, payload_urls(header, used))   every pickle a child needs, fetched and
                                                        its seal checked before anything loads
      run_initializer | load_bundles                    the executor's initializer, once per
                                                        process (bundled with the functions:
                                                        one module namespace)
      ItemRunner(prefetched, header, index, ...).run(item) -> the item's encoded outcome
          in the worker's process (N = 1), or in each of pool.py's forked sub-processes (N > 1)
      Capture                                           each item's stdout and stderr (_Tee),
                                                        its logging records
                                                        (logrecords.RecordKeeper) and their
                                                        order (_Order), for the client's echo
                                                        (echo_output)
      Meter                                             each item's wall time, CPU time and peak
                                                        memory (ItemRunner.usage, docs/usage.md)

An outcome is encoded the same on both paths: a function that does not load fails only its own
items (``load_failure``: a mismatch when a module or version differs, else unpicklable), an
argument that is another call's result is read from storage (dependencies.Resolver, preloaded
before anything runs, so no path reads storage while items run), an exception raised by the
function (SystemExit too) is that item's outcome. MemoryError and IntegrityError propagate: the
first ends the container as the OOM killer would, the second refuses the job.

Usage (docs/usage.md): ``ItemRunner.run`` measures each item it runs (its arguments' resolving, the
call, its outcome's pickling) with a ``Meter`` and leaves ``[wall_s, cpu_s, peak_mib]`` in
``ItemRunner.usage`` (None for an item whose function did not load: no call ran). A process's
Meter, per item: one write of "5" to ``/proc/self/clear_refs`` (Linux resets VmHWM, the
high-water mark of the resident set, to the current RSS), getrusage(SELF) and
getrusage(CHILDREN) before and after, one pread of ``/proc/self/status`` (VmHWM) after: six
syscalls, no thread, no file opened per item (both files are opened once per process). CPU is
user + system of the process plus of the children it waited for (RUSAGE_CHILDREN); the peak is
the larger of VmHWM and, when a child it waited for set a new high, that child's maxrss. Where
clear_refs cannot be written the peak is VmHWM unreset (the process's peak so far: an upper
bound). In a thread (the emulator's ``launcher="threads"``) the Meter reads RUSAGE_THREAD and
measures no memory (the process is the emulator's; peak None).
"""

from __future__ import annotations

import collections
import io
import logging
import os
import resource
import shutil
import sys
import threading
import time
import traceback
from typing import IO, TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple, Union

from .. import serialization, wire
from ..dependencies import Resolver, UpstreamFailed, has_refs
from ..errors import IntegrityError
from . import logrecords

if TYPE_CHECKING:
    import tarfile

    from ..storage import Storage

__all__ = ["OUTPUT_LIMIT", "Item", "Prefetched", "payload_urls", "ItemRunner", "Capture",
           "Meter", "load_failure", "load_bundles", "run_initializer", "flush_output"]

logger = logging.getLogger("batchfutures")

OUTPUT_LIMIT = 64 * 1024  # characters of each item's stdout, and of its stderr, kept for the client
Item = Tuple[int, tuple, Dict[str, Any]]  # (function index, args, kwargs)


def flush_output() -> None:
    """What the function printed reaches the log now, even if a later item gets the process
    killed (and, before a fork, is not written once by every sub-process)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def line_buffered_output() -> None:
    """The process's stdout and stderr (under Capture's tee) flush at each newline."""
    for stream in (sys.stdout, sys.stderr):
        real: Any = getattr(stream, "_stream", stream)  # calls._Tee keeps the original
        try:
            real.reconfigure(line_buffering=True)
        except Exception:  # not a TextIOWrapper (replaced by the user): left as it is
            pass


# -- the payloads -------------------------------------------------------------------------------
class Prefetched:
    """A child's function, initializer and initargs pickles, each seal checked, all fetched
    before anything is unpickled or run (and, on the inner pool, before the fork); read
    through ``get_function`` as Storage's.

    A seal that fails raises IntegrityError from the constructor: the job is refused, whatever
    path would have run it. Any other failure (a missing object) is kept, and fails only what
    loads that pickle.
    """

    def __init__(self, storage: "Storage", urls: Sequence[str]) -> None:
        self._payloads: Dict[str, Union[bytearray, Exception]] = {}
        for url in dict.fromkeys(urls):
            try:
                self._payloads[url] = storage.get_function(url)
            except (MemoryError, IntegrityError):
                raise
            except Exception as error:  # what loads it fails, as it would have
                self._payloads[url] = error

    def get_function(self, url: str) -> bytearray:
        payload = self._payloads.get(url)
        if payload is None:  # never loaded unchecked
            raise LookupError(f"{url} was not among the payloads checked before the run")
        if isinstance(payload, Exception):
            raise payload
        return payload


def payload_urls(header: Dict[str, Any], function_indices: Optional[Sequence[int]]) -> List[str]:
    """The pickles a child needs: its functions (all of the header's when ``function_indices``
    is None), the initializer (header "initializer") and the initargs (header "initargs")."""
    functions = header.get("functions") or []
    wanted = range(len(functions)) if function_indices is None else sorted(set(function_indices))
    urls = [functions[i] for i in wanted if isinstance(i, int) and 0 <= i < len(functions)]
    urls += [header[key] for key in ("initializer", "initargs", "files") if header.get(key)]
    return urls


def load_failure(what: str, header: Dict[str, Any], error: BaseException) -> bytes:
    """The outcome for a function or arguments that did not load: mismatch or unpicklable."""
    message = (serialization.missing_module_message(what, error)
               or serialization.load_failure_message(what, header, error))
    if message is not None:
        return wire.encode_mismatch(message)
    return wire.encode_unpicklable(
        f"the worker could not load {what}: {type(error).__name__}: {error}",
        traceback.format_exc(), type_name=type(error).__name__)


# -- the initializer ----------------------------------------------------------------------------
def load_bundles(fetch: Callable[[int], bytearray], function_indices: Sequence[int],
                 initargs: Any, header: Dict[str, Any], index: int
                 ) -> Tuple[Dict[int, Any], Dict[int, bytes], Optional[bytes]]:
    """Load a child's ``(initializer, fn)`` pickles and run ``initializer(*initargs)`` once.

    With an executor initializer (header "initargs"), each function was pickled together with
    it in one dumps (serialization.dumps_function): loaded, they share one module namespace,
    so what the initializer sets with ``global`` is what the function reads. The initializer
    runs once in this process, the first loaded function's copy (a child runs one function's
    items: one call per child for submit, one function per map). ``fetch(i)``: function i's
    pickle; ``initargs``: their pickle, or the exception fetching it raised.

    Returns (functions, failed functions' outcomes, failure): ``failure`` is every item's
    outcome when the initargs did not load or the initializer raised.
    """
    functions: Dict[int, Any] = {}
    failed: Dict[int, bytes] = {}
    initializer = None
    for function_index in function_indices:
        try:
            bundled_initializer, functions[function_index] = serialization.loads(
                fetch(function_index))
        except MemoryError:
            raise
        except Exception as error:
            logger.warning("child %d: could not load function %d: %s", index, function_index,
                           type(error).__name__)
            failed[function_index] = load_failure("the function", header, error)
            continue
        if initializer is None:
            initializer = bundled_initializer
    if initializer is None:  # no function loaded: its items fail as they are
        return functions, failed, None
    try:
        if isinstance(initargs, Exception):
            raise initargs
        loaded_initargs = serialization.loads(initargs)
    except MemoryError:
        raise
    except Exception as error:
        logger.warning("child %d: could not load the initializer's arguments: %s", index,
                       type(error).__name__)
        return functions, failed, load_failure("the executor's initializer", header, error)
    return functions, failed, _call_initializer(initializer, loaded_initargs, index)


def run_initializer(prefetched: Prefetched, header: Dict[str, Any], url: str,
                    index: int) -> Optional[bytes]:
    """Run ``initializer(*initargs)`` from one pickle of both (header "initializer", as older
    clients wrote it: the functions do not share its namespace); None when it returned, else
    the outcome for every item."""
    try:
        initializer, initargs = serialization.loads(prefetched.get_function(url))
    except MemoryError:
        raise
    except Exception as error:
        logger.warning("child %d: could not load the initializer: %s", index, type(error).__name__)
        return load_failure("the executor's initializer", header, error)
    return _call_initializer(initializer, initargs, index)


def _call_initializer(initializer: Any, initargs: Any, index: int) -> Optional[bytes]:
    """``initializer(*initargs)``; None when it returned, else the outcome for every item."""
    try:
        initializer(*initargs)
    except MemoryError:
        raise
    except BaseException as error:  # as ProcessPoolExecutor: the initializer's failure breaks the child
        logger.warning("child %d: the initializer raised %s; its items are not run", index,
                       type(error).__name__)
        return wire.encode_initializer_failure(initializer, error, traceback.format_exc())
    finally:
        flush_output()
    return None


def initialize(prefetched: Prefetched, header: Dict[str, Any], items: Sequence[Item],
               index: int) -> Tuple[Dict[int, Any], Dict[int, bytes], Optional[bytes]]:
    """What a process does before its items: the executor's initializer, once (header
    "initializer"; or, header "initargs", with the functions it is bundled with, loaded).
    (functions loaded, failed functions' outcomes, failure for every item or None)."""
    logrecords.apply_levels(header.get("log_levels"))  # before the initializer logs anything
    if header.get("live"):  # echo_output="live": each line reaches the log as it is printed
        line_buffered_output()
    failure = unpack_files(prefetched, header, index)
    if failure is not None:
        return {}, {}, failure
    url = header.get("initializer")
    failure = run_initializer(prefetched, header, url, index) if url else None
    if failure is not None or not header.get("initargs"):
        return {}, {}, failure
    urls = header["functions"]
    try:
        initargs: Any = prefetched.get_function(header["initargs"])
    except MemoryError:
        raise
    except Exception as error:  # missing: loading them fails every item
        initargs = error
    return load_bundles(lambda i: prefetched.get_function(urls[i]),
                        sorted({function_index for function_index, _, _ in items}),
                        initargs, header, index)


# -- files= ------------------------------------------------------------------------------------
def _file_member_name(member: "tarfile.TarInfo") -> Optional[str]:
    """The member's relative path, or None for anything but a plain file or folder inside."""
    if not (member.isfile() or member.isdir()):
        return None
    name = os.path.normpath(member.name)
    if os.path.isabs(name) or name == os.pardir or name.startswith(os.pardir + os.sep) \
            or name == os.curdir:
        return None
    return name


def unpack_files(prefetched: Prefetched, header: Dict[str, Any], index: int) -> Optional[bytes]:
    """The run's files= archive (header "files", its seal checked) into the working directory,
    before the initializer: each file written aside and linked into place, so a process beside
    (the inner pool's) sees it whole or not at all; a file already there that differs is
    replaced (warned), except in the client's own folder (kept, warned). None when
    done; else the outcome of every item (the files could not be written)."""
    url = header.get("files")
    if not url:
        return None
    try:
        write_files(prefetched.get_function(url))
    except (MemoryError, IntegrityError):
        raise
    except Exception as error:
        logger.warning("child %d: could not write the files= archive: %s", index,
                       type(error).__name__)
        return load_failure("the files shipped with files=", header, error)
    return None


def write_files(data: Union[bytes, bytearray]) -> None:
    """The files= archive ``data`` (its seal checked) into the working directory, as
    unpack_files says; raises what writing raised."""
    import tarfile  # start-up: ~1.5 ms on a worker's start; only a run with files= needs it

    from ..shipfiles import CLIENT_FOLDER_HEADER  # start-up: as tarfile, only files= needs it

    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        in_client_folder = runs_in_folder(archive.pax_headers.get(CLIENT_FOLDER_HEADER))
        for member in archive.getmembers():
            name = _file_member_name(member)
            if name is None:
                continue
            if member.isdir():
                os.makedirs(name, exist_ok=True)
                continue
            replacing = os.path.lexists(name)
            if replacing:
                if _same_content(name, archive.extractfile(member)):
                    continue  # a sibling process wrote it, or the image holds the same
                if in_client_folder:  # the emulator in the client's folder: the user's file
                    logger.warning("files=: %s differs from the copy shipped, and this is the "
                                   "client's own folder: keeping the file as it is", name)
                    continue
                logger.warning("files=: %s was already in the working directory (the image's "
                               "copy?) and differs from the one shipped: replacing it", name)
            folder = os.path.dirname(name)
            if folder:
                os.makedirs(folder, exist_ok=True)
            source = archive.extractfile(member)
            assert source is not None  # a regular file's
            aside = f"{name}.{os.getpid()}.batchfutures-partial"
            with open(aside, "wb") as handle:
                shutil.copyfileobj(source, handle)
            os.chmod(aside, (member.mode & 0o755) | 0o600)
            try:
                if replacing:  # atomic: a process beside sees the old file or the new
                    os.replace(aside, name)
                else:
                    os.link(aside, name)
            except FileExistsError:  # another process put it there first
                pass
            finally:
                if os.path.lexists(aside):
                    os.unlink(aside)


def runs_in_folder(client_folder: Optional[str], here: Optional[str] = None) -> bool:
    """Whether the working directory ``here`` (default: this one) is ``client_folder``, the
    folder the client shipped its files from (the emulator runs a call there when asked)."""
    if not client_folder:
        return False
    try:
        return os.path.samefile(client_folder, here or os.getcwd())
    except OSError:  # no such folder on this machine: not the client's
        return False


def _same_content(path: str, shipped: Optional[IO[bytes]]) -> bool:
    """Whether the file at ``path`` holds exactly what ``shipped`` reads."""
    if shipped is None:
        return False
    try:
        with open(path, "rb") as handle:
            while True:
                mine, theirs = handle.read(1 << 16), shipped.read(1 << 16)
                if mine != theirs:
                    return False
                if not mine:
                    return True
    except OSError:  # a folder, unreadable: not the same file
        return False


# -- the items ----------------------------------------------------------------------------------
class ItemRunner:
    """One process's items: each function loaded once, one encoded outcome per item."""

    def __init__(self, prefetched: Prefetched, header: Dict[str, Any], index: int,
                 resolver: Resolver, functions: Optional[Dict[int, Any]] = None,
                 failed: Optional[Dict[int, bytes]] = None, meter: Optional["Meter"] = None) -> None:
        self._prefetched, self._header, self._index = prefetched, header, index
        self._resolver = resolver  # preloaded: resolving reads nothing
        self._functions: Dict[int, Any] = functions or {}  # loaded already (load_bundles)
        # a function that did not load fails each of its items
        self._failed: Dict[int, bytes] = failed or {}
        self._meter = meter
        logrecords.apply_levels(header.get("log_levels"))  # (the warm runner's path too)
        # the last item's [wall_s, cpu_s, peak_mib or None]; None: not measured (no meter, or
        # its function did not load)
        self.usage: Optional[List[Any]] = None

    def _function(self, function_index: int) -> Union[Callable[..., Any], bytes]:
        """The item's function, or the outcome of every item of a function that did not load."""
        if function_index in self._failed:
            return self._failed[function_index]
        if function_index not in self._functions:
            try:
                data = self._prefetched.get_function(self._header["functions"][function_index])
                self._functions[function_index] = serialization.loads(data)
            except MemoryError:
                raise
            except Exception as error:
                logger.warning("child %d: could not load function %d: %s", self._index,
                               function_index, type(error).__name__)
                self._failed[function_index] = load_failure("the function", self._header, error)
                return self._failed[function_index]
        return self._functions[function_index]

    def run(self, item: Item) -> bytes:
        """The item's encoded outcome; its usage in ``self.usage`` (None if not measured)."""
        self.usage = None
        meter = self._meter
        if meter is None:
            return self._run(item)
        started = meter.start()
        try:
            return self._run(item)
        finally:  # an item that raised has usage too (a MemoryError leaves no outcome: moot)
            self.usage = meter.stop(started) if not self._skipped else None

    _skipped = False  # the last item's function did not load: nothing ran, nothing measured

    def _run(self, item: Item) -> bytes:
        function_index, args, kwargs = item
        function = self._function(function_index)
        self._skipped = isinstance(function, bytes)
        if isinstance(function, bytes):
            return function
        if has_refs(args, kwargs):  # other calls' results: from storage, never the client
            try:
                args, kwargs = self._resolver.resolve(args, kwargs)
            except UpstreamFailed as failed:
                return wire.encode_dependency_failure(failed.ref.job_id, failed.outcome)
            except (MemoryError, IntegrityError):
                raise
            except Exception as error:
                return wire.encode_error(error, traceback.format_exc())
        try:
            value = function(*args, **kwargs)
        except MemoryError:
            raise
        except BaseException as error:  # the user's exception (even SystemExit) is an outcome
            tb_text = traceback.format_exc()
            # the container's log has it too (ex.logs(search="Traceback") finds it); the client
            # gets it with the outcome, not echoed (batchfutures' records are not forwarded)
            logger.warning("child %d: the call raised %s\n%s", self._index, type(error).__name__,
                           tb_text.rstrip("\n"))
            return wire.encode_error(error, tb_text)
        finally:
            flush_output()
        return wire.encode_ok(value)


# -- what the items use -------------------------------------------------------------------------
_MIB = 1024.0 * 1024.0


def _open_proc(name: str, flags: int) -> Optional[int]:
    try:
        return os.open(f"/proc/self/{name}", flags)
    except OSError:
        return None


class Meter:
    """Each item's wall time, CPU time and peak memory in this process (see the module
    docstring). Made in the process that runs the items (after the fork on the inner pool:
    /proc/self is the process that opens it); ``close()`` when its items are done."""

    __slots__ = ("_thread", "_clear", "_status")

    def __init__(self, thread: bool = False) -> None:
        self._thread = thread and hasattr(resource, "RUSAGE_THREAD")
        if thread:  # the emulator's process: its memory is not the item's, and never reset
            self._clear = self._status = None
        else:
            self._status = _open_proc("status", os.O_RDONLY)
            self._clear = _open_proc("clear_refs", os.O_WRONLY) if self._status is not None else None

    def start(self) -> Tuple[float, Any, Any]:
        if self._clear is not None:
            try:
                os.write(self._clear, b"5")  # VmHWM := the current RSS
            except OSError:
                os.close(self._clear)
                self._clear = None  # the peak so far, unreset, from now on
        if self._thread:
            return time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD), None
        return (time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF),
                resource.getrusage(resource.RUSAGE_CHILDREN))

    def stop(self, started: Tuple[float, Any, Any]) -> List[Any]:
        """``[wall_s, cpu_s, peak_mib or None]`` since ``start``."""
        wall = time.perf_counter() - started[0]
        before, children_before = started[1], started[2]
        if self._thread:
            after = resource.getrusage(resource.RUSAGE_THREAD)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            return [round(wall, 6), round(max(0.0, cpu), 6), None]
        after = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
               + children.ru_utime + children.ru_stime
               - children_before.ru_utime - children_before.ru_stime)
        peak_kib = self._hwm_kib()
        if peak_kib is None:  # no /proc: the process's peak so far (KiB on Linux)
            peak_kib = after.ru_maxrss
        if children.ru_maxrss > children_before.ru_maxrss:  # a child it waited for set a new high
            peak_kib = max(peak_kib, children.ru_maxrss)
        return [round(wall, 6), round(max(0.0, cpu), 6), round(peak_kib / 1024.0, 1)]

    def _hwm_kib(self) -> Optional[int]:
        if self._status is None:
            return None
        try:
            text = os.pread(self._status, 4096, 0)
        except OSError:
            return None
        at = text.find(b"VmHWM:")
        if at < 0:
            return None
        try:
            return int(text[at + 6:text.index(b"kB", at)])
        except ValueError:
            return None

    def close(self) -> None:
        for fd in (self._clear, self._status):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._clear = self._status = None


# -- what the items print -----------------------------------------------------------------------
# the order's sources and its cap, as the client reads them (batchfutures/outputorder.py: the
# worker does not import the client's modules; tests/test_output_order.py holds them equal)
_STDOUT, _STDERR, _RECORDS = 0, 1, 2
MAX_RUNS = 2048  # runs kept per item, the last ones (outputorder.MAX_RUNS says why 2048)


class _Order:
    """The order of an item's writes and records: runs of ``[source, count]``, a new run only
    when the source changes, the last MAX_RUNS of them (earlier ones are grouped on the
    client). ``lock`` is the tees' and the record keeper's: a write is kept and noted at once."""

    def __init__(self, limit: int = MAX_RUNS) -> None:
        self.lock = threading.RLock()  # Capture.take holds it across the tees' and records' takes
        self._runs: Deque[List[int]] = collections.deque(maxlen=limit)
        self.last: Optional[int] = None  # the tee written last (_RecordLines)

    def note(self, source: int, count: int) -> None:
        """``count`` characters (or records) of ``source`` happened now; the caller holds lock."""
        if self._runs and self._runs[-1][0] == source:
            self._runs[-1][1] += count
        else:
            self._runs.append([source, count])

    def take(self, kept: Sequence[int]) -> List[List[int]]:
        """The runs since the last take, cut to what was kept of each source (tail_runs)."""
        with self.lock:
            runs = list(self._runs)
            self._runs.clear()
        return tail_runs(runs, kept)


def tail_runs(runs: Sequence[Sequence[int]], kept: Sequence[int]) -> List[List[int]]:
    """``runs`` cut at their front to ``kept[source]`` of each source: what was kept of a stream
    (or of the records) is its end, so what was cut is its runs' first characters (pure)."""
    excess = [0, 0, 0]
    for source, count in runs:
        excess[source] += count
    excess = [max(0, total - kept[source]) for source, total in enumerate(excess)]
    cut: List[List[int]] = []
    for source, count in runs:
        dropped = min(excess[source], count)
        excess[source] -= dropped
        count -= dropped
        if not count:
            continue
        if cut and cut[-1][0] == source:  # a run between them was cut whole
            cut[-1][1] += count
        else:
            cut.append([source, count])
    return cut


class _Tee:
    """``sys.stdout`` or ``sys.stderr`` while a child's items run in this process: a write still
    reaches the stream (the container's log, as before) and is also kept for the client's echo,
    the last OUTPUT_LIMIT characters since the previous ``take`` (with a count of those cut),
    and noted in ``order`` (as ``source``) when given.

    Python-level writes only (print, sys.stdout.write, warnings, a logging handler made on
    sys.stderr while the tee is in place): output written to the file descriptors directly (a
    subprocess, C code, sys.stdout.buffer) reaches the log only.
    """

    def __init__(self, stream: Any, order: Optional[_Order] = None, source: int = _STDOUT) -> None:
        self._stream = stream
        self._order, self._source = order, source
        # the function's own threads may print too
        self._lock: Any = order.lock if order is not None else threading.Lock()
        self._parts: List[str] = []
        self._size = 0
        self._cut = 0
        self.open_line = False  # its last write did not end a line (_RecordLines)

    def write(self, text: Any) -> Any:
        written = self._stream.write(text)
        if isinstance(text, str) and text:
            with self._lock:
                self._parts.append(text)
                self._size += len(text)
                self.open_line = text[-1] != "\n"
                if self._order is not None:
                    self._order.note(self._source, len(text))
                    self._order.last = self._source
                if self._size > 2 * OUTPUT_LIMIT:  # bounded: keep the end
                    kept = "".join(self._parts)
                    self._cut += len(kept) - OUTPUT_LIMIT
                    self._parts, self._size = [kept[-OUTPUT_LIMIT:]], OUTPUT_LIMIT
        return written

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def take(self) -> Tuple[str, int]:
        """What was written since the last take (its end), and how many characters were cut."""
        with self._lock:
            text, cut = "".join(self._parts), self._cut
            self._parts, self._size, self._cut = [], 0, 0
        if len(text) > OUTPUT_LIMIT:
            cut += len(text) - OUTPUT_LIMIT
            text = text[-OUTPUT_LIMIT:]
        return text, cut

    def __getattr__(self, name: str) -> Any:  # flush, fileno, encoding, isatty, buffer...
        return getattr(self._stream, name)


class _RecordLines:
    """Where the record keeper writes a record's line (the container's log, past the tees), at
    the start of a line: after a partial line the call wrote to that stream (a progress bar,
    print(..., end="")), the record's JSON was glued to its text, and the client showed it as
    output instead of replaying it. ``out``: stdout's tee when it writes to the same file
    (warm live's os.dup2), flushed first so its text comes before the record, as made."""

    def __init__(self, err: _Tee, out: Optional[_Tee], order: _Order) -> None:
        self._err, self._out, self._order = err, out, order

    def write(self, text: str) -> Any:
        if self._out is not None:
            try:
                self._out._stream.flush()
            except Exception:
                pass
        with self._order.lock:
            last = self._out if self._out is not None and self._order.last == _STDOUT \
                else self._err
            if last.open_line:
                text = "\n" + text
            self._err.open_line = False
            if self._out is not None:
                self._out.open_line = False
            return self._err._stream.write(text)


def _one_file(first: Any, second: Any) -> bool:
    """Whether two streams write to the same file (once per process: two fstat calls)."""
    if first is second:
        return True
    try:
        return os.path.sameopenfile(first.fileno(), second.fileno())
    except Exception:  # no descriptor (replaced by a StringIO): apart
        return False


class Capture:
    """Each item's stdout and stderr in this process (``_Tee`` on both), its logging records
    (a logrecords.RecordKeeper on the root logger, writing to the container's log, not to the
    tee) and their order (``_Order``: one lock for the three) while it is open.

    Output written before an item (the initializer's, the function's unpickling) is the next
    item's. Not enabled in a thread of the emulator's process (``launcher="threads"``): its
    sys.stdout and its loggers are every thread's.
    """

    def __init__(self, enabled: bool) -> None:
        self._tees: Optional[Tuple[_Tee, _Tee]] = None
        self._records: Optional[logrecords.RecordKeeper] = None
        self._order = _Order()
        if enabled and sys.stdout is not None and sys.stderr is not None:
            order = self._order
            out, err = _Tee(sys.stdout, order, _STDOUT), _Tee(sys.stderr, order, _STDERR)
            lines = _RecordLines(err, out if _one_file(sys.stdout, sys.stderr) else None, order)
            self._records = logrecords.RecordKeeper(
                log_stream=lines, lock=order.lock,
                on_kept=lambda: order.note(_RECORDS, 1)).install()
            self._tees = (out, err)
            sys.stdout, sys.stderr = self._tees

    def take(self) -> Optional[List[Any]]:
        """[stdout, stderr, stdout chars cut, stderr chars cut] since the last take, then the
        logging records made since (a fifth entry) and their order with the writes (a sixth,
        outputorder's runs), each only when needed; None if nothing was written or logged."""
        if self._tees is None:
            return None
        flush_output()
        with self._order.lock:  # what the call's threads write meanwhile is the next take's
            (out, out_cut), (err, err_cut) = self._tees[0].take(), self._tees[1].take()
            records, notes = self._records.take_counted() if self._records is not None else ([], 0)
            runs = self._order.take((len(out), len(err), len(records) - notes))
        printed: List[Any] = [out, err, out_cut, err_cut]
        if sum(1 for kept in (out, err, records) if kept) > 1 and runs:  # an order to keep
            return printed + [records, runs]
        if records:
            return printed + [records]
        return printed if out or err or out_cut or err_cut else None

    def line_ended(self) -> None:
        """A line written past the tees (warm live's call marker) ended any line they left open:
        the next record's line needs no newline before it."""
        if self._tees is not None:
            with self._order.lock:
                for tee in self._tees:
                    tee.open_line = False

    def keep(self, output: Optional[Dict[int, Any]], position: int) -> None:
        """What was written since the last take is item ``position``'s."""
        printed = self.take()
        if printed is not None and output is not None and position >= 0:
            output[position] = printed

    def close(self) -> None:
        if self._records is not None:
            self._records.remove()
            self._records = None
        if self._tees is None:
            return
        flush_output()
        out, err = self._tees
        if sys.stdout is out:  # (the function may replace it)
            sys.stdout = out._stream
        if sys.stderr is err:
            sys.stderr = err._stream
        self._tees = None
