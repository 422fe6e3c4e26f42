"""The container command: ``python -m batchfutures.worker <job_url>``.

    AWS_BATCH_JOB_ARRAY_INDEX = i (absent: 0, a plain job)
    (a node of a multi-node job: i = AWS_BATCH_JOB_NODE_INDEX; it runs child 0's items and
     writes results/<i>; the main node then waits for every node's result before it exits)
      -> <job_url>/results/<i> already there?  an earlier attempt finished: keep it, exit 0
      -> read the header and child i's byte range of <job_url>/inputs, checking their MACs
         (a retry_on_oom retry's header names, per child, the first job's inputs to read instead)
      -> the client's Python/cloudpickle differ (header stamp)?  every item: a mismatch outcome
      -> read the functions it needs and check each one's seal, all before running anything
      -> the executor's initializer(*initargs), if any, once; if it raises, every item fails
         (header "initargs": each function's pickle is (initializer, fn) from one dumps, so
         they share one module namespace: see _load_bundles)
      -> unpickle them (once each), run each item in order; print goes to the log, and with
         header "output" (echo_output=True) each item's stdout and stderr are also kept, the
         last OUTPUT_LIMIT characters of each (_Capture), for the client to print
         (an argument that is another call's result is read from that call's result object)
      -> one outcome per item: value | exception + traceback | unpicklable | mismatch
      -> write <job_url>/results/<i> once, atomically and only if absent, with the kept
         output in its output section (serialization.pack_result); exit 0

An exception raised by the user's function (any BaseException, SystemExit included) is an
outcome, not a container failure: the worker still exits 0. A MemoryError, from the function or
while pickling its result, means the container ran out of memory: the worker writes one line to
stderr and ends with exit status 137 without writing a result, as the kernel's OOM killer would
(the local emulator caps memory with RLIMIT_DATA, so there an over-limit allocation surfaces as
MemoryError). A result already written by an earlier attempt is kept: a retry never overwrites
a finished result. The worker's own messages go to stderr through the "batchfutures" logger.
Once the result is written the process ends (``os._exit`` after the atexit handlers), so a
non-daemon thread left running by the function cannot keep the job alive.

Signing (signing.py): the key is found where the job's BATCHFUTURES_SIGNING_KEY_SOURCE says. An
inputs object or function that is unsigned, altered or signed with another key is refused before
any of it is unpickled and before anything runs: the job's log says why, and the result records
the refusal in its JSON metadata only (never a pickle), so the client raises IntegrityError
without unpickling. No key at all is a failed container (exit 1) whose log says where the key
was looked for.

In a thread (the emulator's ``launcher="threads"``, emulator/threads.py) the same code runs
through ``run(job_url, environ, fork=False, cancelled=...)``: the attempt's environment is the
mapping given (threads share os.environ), the items run in this thread (no forked pool), nothing
calls os._exit (``run`` returns the exit status; a MemoryError propagates), and once
``cancelled()`` is true (the attempt was killed) no further item runs and no result is written.

    python -m batchfutures.worker <url>  ->  main: logging, run(url, os.environ) -> _exit(status)
    ThreadLauncher (emulator)            ->  run(url, its env, fork=False, cancelled) -> status

Imports stay light: no boto3 for file:// URLs, s3fs only through fsspec for s3:// URLs.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .errors import ConfigurationError, IntegrityError

if TYPE_CHECKING:
    from .nodes import NodeInfo
    from .signing import Signer
    from .storage import Storage

logger = logging.getLogger("batchfutures")
OOM_EXIT_STATUS = 137
NODE_POLL_INTERVAL = 0.25  # the main node's look for the other nodes' results (a HEAD each on S3)
# After every node's result is there, the main node waits this long before it ends the job (which
# stops the nodes still running), so a node that wrote its result usually exits SUCCEEDED.
NODE_EXIT_GRACE = 1.0
_OOM_LINE = b"batchfutures.worker: MemoryError: out of memory; exiting with status 137 like the OOM killer\n"
OUTPUT_LIMIT = 64 * 1024  # characters of each item's stdout, and of its stderr, kept for the client


def _never() -> bool:
    return False


class Cancelled(Exception):
    """The attempt was killed while its thread ran: stop, write nothing."""


class Context:
    """One attempt's world as the worker sees it: a process's is os.environ, forking allowed.

    A plain class, not a dataclass: `python -m` runs this module's body at every attempt, and a
    dataclass is built with exec (~1 ms of CPU per attempt on the emulator)."""

    __slots__ = ("environ", "fork", "cancelled")

    def __init__(self, environ: Mapping[str, str], fork: bool = True,
                 cancelled: Callable[[], bool] = _never) -> None:
        self.environ = environ
        self.fork = fork  # may run the items on forked processes (pool.py); never in a thread
        self.cancelled = cancelled  # true once the attempt was killed (threads only)

    def check(self) -> None:
        if self.cancelled():
            raise Cancelled()


def _process_context() -> Context:
    return Context(os.environ)


def _out_of_memory() -> None:
    """Die as an out-of-memory kill would: no result, exit status 137."""
    try:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os.write(2, _OOM_LINE)  # preallocated, no logging machinery: memory is short
    finally:
        os._exit(OOM_EXIT_STATUS)


def _flush() -> None:
    # what the function printed reaches the log now, even if a later item gets the process killed
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


class _Tee:
    """``sys.stdout`` or ``sys.stderr`` while a child's items run in this process: a write still
    reaches the stream (the container's log, as before) and is also kept for the client's echo,
    the last OUTPUT_LIMIT characters since the previous ``take`` (with a count of those cut).

    Python-level writes only (print, sys.stdout.write, warnings, a logging handler made on
    sys.stderr while the tee is in place): output written to the file descriptors directly (a
    subprocess, C code, sys.stdout.buffer) reaches the log only.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._lock = threading.Lock()  # the function's own threads may print too
        self._parts: List[str] = []
        self._size = 0
        self._cut = 0

    def write(self, text: Any) -> Any:
        written = self._stream.write(text)
        if isinstance(text, str) and text:
            with self._lock:
                self._parts.append(text)
                self._size += len(text)
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


class _Capture:
    """Each item's stdout and stderr in this process (``_Tee`` on both) while it is open.

    Output written before an item (the initializer's, the function's unpickling) is the next
    item's. Not enabled in a thread of the emulator's process (``launcher="threads"``): its
    sys.stdout is every thread's.
    """

    def __init__(self, enabled: bool) -> None:
        self._tees: Optional[Tuple[_Tee, _Tee]] = None
        if enabled and sys.stdout is not None and sys.stderr is not None:
            self._tees = (_Tee(sys.stdout), _Tee(sys.stderr))
            sys.stdout, sys.stderr = self._tees  # type: ignore[assignment]

    def take(self) -> Optional[List[Any]]:
        """[stdout, stderr, stdout chars cut, stderr chars cut] since the last take; None if
        nothing was written."""
        if self._tees is None:
            return None
        _flush()
        (out, out_cut), (err, err_cut) = self._tees[0].take(), self._tees[1].take()
        return [out, err, out_cut, err_cut] if out or err or out_cut or err_cut else None

    def keep(self, output: Optional[Dict[int, Any]], position: int) -> None:
        """What was written since the last take is item ``position``'s."""
        printed = self.take()
        if printed is not None and output is not None and position >= 0:
            output[position] = printed

    def close(self) -> None:
        if self._tees is None:
            return
        _flush()
        out, err = self._tees
        if sys.stdout is out:  # type: ignore[comparison-overlap]  # (the function may replace it)
            sys.stdout = out._stream
        if sys.stderr is err:  # type: ignore[comparison-overlap]
            sys.stderr = err._stream
        self._tees = None


def _item_count(header: Dict[str, Any], index: int) -> int:
    """How many items child ``index`` holds, from the header alone (its blob may not load)."""
    chunksize, items = int(header.get("chunksize", 1)), int(header.get("items", 1))
    return max(1, min(chunksize, items - index * chunksize))


def _load_failure(what: str, header: Dict[str, Any], error: BaseException) -> bytes:
    """The outcome for a function or arguments that did not load: mismatch or unpicklable."""
    from . import serialization

    message = (serialization.missing_module_message(what, error)
               or serialization.load_failure_message(what, header, error))
    if message is not None:
        return serialization.encode_mismatch(message)
    return serialization.encode_unpicklable(
        f"the worker could not load {what}: {type(error).__name__}: {error}",
        traceback.format_exc(), type_name=type(error).__name__)


def run_items(storage: "Storage", header: Dict[str, Any], blob: bytes, index: int,
              context: Optional[Context] = None,
              output: Optional[Dict[int, Any]] = None) -> List[bytes]:
    """Run child ``index``'s items; one encoded outcome per item. MemoryError propagates.

    ``output``: a dict to fill with what each item printed (item position -> [stdout, stderr,
    chars cut of each]), for the items that printed; None: nothing is kept (only the log has it).
    """
    from . import serialization

    context = context or _process_context()

    if header.get("sources"):  # a retry_on_oom retry: the items stay in the first job's inputs
        source_url, source_index = header["sources"][index]
        redirects = header.get("redirects")  # a rerun's: upstream results that moved
        header, blob = storage.read_child_inputs(source_url, int(source_index))
        if redirects:
            header = {**header, "redirects": redirects}
    mismatch = serialization.check_stamp(header)
    if mismatch is not None:  # do not even try to unpickle: it may crash or mislead
        logger.warning("child %d: %s", index, mismatch)
        return [serialization.encode_mismatch(mismatch)] * _item_count(header, index)
    try:
        items = serialization.unpack_items(blob, header.get("encoding", serialization.CALLS))
    except MemoryError:
        raise
    except Exception as error:
        logger.warning("child %d: could not load the call's arguments: %s", index,
                       type(error).__name__)
        return [_load_failure("the call's arguments", header, error)] * _item_count(header, index)
    from . import pool

    processes = pool.processes_for(len(items), context.environ) if context.fork else 1
    if processes > 1:  # a job of N vCPUs: the items on N processes, the initializer in each
        return pool.run_items(storage, header, items, index, processes, output=output)
    capture = _Capture(output is not None and context.fork)
    try:
        return _run_here(storage, header, items, index, context, capture, output)
    finally:
        capture.close()


def _run_here(storage: "Storage", header: Dict[str, Any], items: Sequence[Any], index: int,
              context: Context, capture: _Capture,
              output: Optional[Dict[int, Any]]) -> List[bytes]:
    """run_items in this process: the initializer, then the items one by one."""
    from . import serialization

    initializer_url = header.get("initializer")
    if initializer_url:  # the executor's initializer(*initargs), once per child process
        failure = _run_initializer(storage, header, initializer_url, index)
        if failure is not None:
            capture.keep(output, 0)
            return [failure] * len(items)

    from .dependencies import Resolver, UpstreamFailed, has_refs

    resolver = Resolver(storage, header.get("redirects"))
    functions: Dict[int, Any] = {}
    failed_functions: Dict[int, bytes] = {}  # a function that did not load fails each of its items
    pickles: Dict[int, bytes] = {}
    for function_index in sorted({item[0] for item in items}):
        # every seal is checked before anything runs: IntegrityError refuses the whole child
        try:
            pickles[function_index] = storage.get_function(header["functions"][function_index])
        except (MemoryError, IntegrityError):
            raise
        except Exception as error:  # missing: fails only its own items
            logger.warning("child %d: could not load function %d: %s", index, function_index,
                           type(error).__name__)
            failed_functions[function_index] = _load_failure("the function", header, error)
    if header.get("initargs"):  # (initializer, fn) pickles: one namespace each (_load_bundles)
        try:
            initargs: Any = storage.get_function(header["initargs"])
        except (MemoryError, IntegrityError):
            raise
        except Exception as error:  # missing: loading them fails every item below
            initargs = error
        loaded, failures, failure = _load_bundles(pickles.pop, list(pickles), initargs, header,
                                                  index)
        if failure is not None:
            capture.keep(output, 0)
            return [failure] * len(items)
        functions.update(loaded)
        failed_functions.update(failures)
    outcomes: List[bytes] = []
    for function_index, args, kwargs in items:
        context.check()
        try:  # every path appends this item's outcome (or raises)
            if function_index in failed_functions:
                outcomes.append(failed_functions[function_index])
                continue
            if function_index not in functions:
                try:
                    functions[function_index] = serialization.loads(pickles.pop(function_index))
                except MemoryError:
                    raise
                except Exception as error:
                    logger.warning("child %d: could not load function %d: %s", index,
                                   function_index, type(error).__name__)
                    outcome = _load_failure("the function", header, error)
                    failed_functions[function_index] = outcome
                    outcomes.append(outcome)
                    continue
            if has_refs(args, kwargs):  # other calls' results: read from storage, never the client
                try:
                    args, kwargs = resolver.resolve(args, kwargs)
                except UpstreamFailed as failed:
                    outcomes.append(serialization.encode_dependency_failure(failed.ref.job_id,
                                                                            failed.outcome))
                    continue
                except MemoryError:
                    raise
                except Exception as error:
                    outcomes.append(serialization.encode_error(error, traceback.format_exc()))
                    continue
            try:
                value = functions[function_index](*args, **kwargs)
            except MemoryError:
                raise
            except BaseException as error:  # the user's exception (even SystemExit) is an outcome
                outcomes.append(serialization.encode_error(error, traceback.format_exc()))
                del error  # drop the frames (and what they hold) now
            else:
                outcomes.append(serialization.encode_ok(value))
                del value
            _flush()
        finally:  # what was printed since the last item (its own output) is this item's
            capture.keep(output, len(outcomes) - 1)
    return outcomes


def _load_bundles(fetch: Callable[[int], bytes], function_indices: Sequence[int],
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
    from . import serialization

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
            failed[function_index] = _load_failure("the function", header, error)
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
        return functions, failed, _load_failure("the executor's initializer", header, error)
    return functions, failed, _call_initializer(initializer, loaded_initargs, index)


def _run_initializer(storage: "Storage", header: Dict[str, Any], url: str,
                     index: int) -> Optional[bytes]:
    """Run ``initializer(*initargs)`` from one pickle of both (header "initializer", written
    before issue 18: the functions do not share its namespace); None when it returned, else
    the outcome for every item."""
    from . import serialization

    try:
        initializer, initargs = serialization.loads(storage.get_function(url))
    except MemoryError:
        raise
    except Exception as error:
        logger.warning("child %d: could not load the initializer: %s", index, type(error).__name__)
        return _load_failure("the executor's initializer", header, error)
    return _call_initializer(initializer, initargs, index)


def _call_initializer(initializer: Any, initargs: Any, index: int) -> Optional[bytes]:
    """``initializer(*initargs)``; None when it returned, else the outcome for every item."""
    from . import serialization

    try:
        initializer(*initargs)
    except MemoryError:
        raise
    except BaseException as error:  # as ProcessPoolExecutor: the initializer's failure breaks the child
        logger.warning("child %d: the initializer raised %s; its items are not run", index,
                       type(error).__name__)
        return serialization.encode_initializer_failure(initializer, error, traceback.format_exc())
    finally:
        _flush()
    return None


def run_child(job_url: str, index: int, attempt: Optional[str] = None,
              node: "Optional[NodeInfo]" = None, context: Optional[Context] = None) -> int:
    """Run one child of a Batch job and record its result; the container's exit status.

    ``node``: a node of a multi-node job. Every node runs child 0's items and writes its result
    at its node index; the main node then waits for the others' results, since its end ends
    the job and stops the nodes still running (BATCHFUTURES_NODE_WAIT bounds the wait, in
    seconds; unset, the job's timeout does).
    """
    from .awsclients import worker_storage_options  # the S3 guards the client set for the job
    from .storage import Storage

    context = context or _process_context()
    storage = Storage.from_url(job_url, signer=_job_signer(context.environ),
                               storage_options=worker_storage_options(dict(context.environ)) or None)
    if storage.has_result(job_url, index):
        logger.info("child %d: a result is already written (an earlier attempt finished); "
                    "keeping it, not running again", index)
    else:
        _run_and_record(storage, job_url, index, attempt, 0 if node is not None else index,
                        context)
    if node is not None and node.is_main:
        _wait_for_other_nodes(storage, job_url, node, context)
    return 0


def _job_signer(environ: Mapping[str, str]) -> "Signer":
    """signing.job_signer's choice of key, made from ``environ`` (a thread's is not os.environ)."""
    from . import signing

    if environ is os.environ:
        return signing.job_signer()
    source = environ.get(signing.SOURCE_VARIABLE)
    if source and source != "env":
        return signing.Signer.from_source(source)
    key = environ.get(signing.KEY_VARIABLE)
    if key:
        return signing.Signer.from_key(key, "env")
    if source == "env":
        def missing() -> bytes:
            raise ConfigurationError(f"no signing key: {signing.KEY_VARIABLE} is not set "
                                             "in this attempt's environment")
        return signing.Signer(missing, "env")
    workdir = environ.get("BATCHFUTURES_WORKDIR") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "batchfutures")
    return signing.Signer.from_key_file(os.path.join(workdir, signing.KEY_FILE_NAME))


def _wait_for_other_nodes(storage: "Storage", job_url: str, node: "NodeInfo",
                          context: Context) -> None:
    limit = context.environ.get("BATCHFUTURES_NODE_WAIT")
    deadline = time.monotonic() + float(limit) if limit else None
    waiting = [i for i in range(node.count) if i != node.index]
    while waiting:  # one node looked at a time: a few requests a second, however many nodes
        context.check()
        if storage.has_result(job_url, waiting[0]):
            waiting.pop(0)
            continue
        if deadline is not None and time.monotonic() > deadline:
            logger.warning("main node: nodes %s wrote no result within BATCHFUTURES_NODE_WAIT="
                           "%ss; ending the job without them", waiting, limit)
            return
        time.sleep(NODE_POLL_INTERVAL)
    time.sleep(NODE_EXIT_GRACE)  # the last node wrote its result; let it exit on its own too


def _run_and_record(storage: "Storage", job_url: str, index: int, attempt: Optional[str],
                    child: int, context: Context) -> None:
    """Run child ``child``'s items and write the result at ``index``."""
    from . import serialization, signing

    meta: Dict[str, Any] = {
        "index": index, "attempt": attempt, "started": time.time(), "host": socket.gethostname(),
        "pid": os.getpid(), "worker": serialization.payload_stamp(),
    }
    output: Optional[Dict[int, Any]] = None
    try:
        header, blob = storage.read_child_inputs(job_url, child)
        output = {} if header.get("output") else None  # echo_output=True: keep what items print
        outcomes = run_items(storage, header, blob, child, context, output)
        del blob
    except IntegrityError as refused:  # raised before any item ran
        logger.error("child %d: refusing this job (nothing unverified was unpickled, nothing ran): "
                     "%s", index, refused)
        meta[signing.REFUSED] = str(refused)
        outcomes, output = [], None
    _flush()
    meta["finished"] = time.time()
    context.check()  # a killed attempt's thread must not record a result after its end
    if not storage.write_result(job_url, index, serialization.pack_result(outcomes, meta, output)):
        logger.info("child %d: another attempt wrote its result first; kept that one", index)


def _configure_logging() -> None:
    """A stderr handler on the "batchfutures" logger only: the user's root logger is theirs."""
    level_name = os.environ.get("BATCHFUTURES_LOG_LEVEL", "INFO").upper()
    level = logging.getLevelName(level_name)
    logger.setLevel(level if isinstance(level, int) else logging.INFO)
    if not any(getattr(handler, "_batchfutures_worker", False) for handler in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("batchfutures.worker: %(message)s"))
        handler._batchfutures_worker = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.propagate = False


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m batchfutures.worker <job_url>``; returns the exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m batchfutures.worker <job_url>\n")
        return 2
    _configure_logging()
    try:
        return run(args[0], os.environ)
    except MemoryError:
        _out_of_memory()
    return 1  # not reached: _out_of_memory() does not return


def run(job_url: str, environ: Mapping[str, str], *, fork: bool = True,
        cancelled: Optional[Callable[[], bool]] = None) -> int:
    """One attempt of the worker over ``environ`` (its AWS_BATCH_* variables, signing key
    source, BATCHFUTURES_VCPUS...); returns the container's exit status.

    A MemoryError propagates (the caller ends as the OOM killer would). ``fork=False`` runs
    the items in this thread; ``cancelled()`` true stops it before the next item and before the
    result is written (exit status 137, as the kill it stands for).
    """
    from .nodes import node as this_node

    context = Context(environ, fork=fork, cancelled=cancelled or _never)
    node = None
    if environ.get("AWS_BATCH_JOB_NODE_INDEX"):  # a node of a multi-node job
        try:
            node = this_node(environ)
        except RuntimeError as error:
            logger.error("%s", error)
            return 2
        index = node.index
    else:
        raw_index = environ.get("AWS_BATCH_JOB_ARRAY_INDEX", "0") or "0"
        try:
            index = int(raw_index)
        except ValueError:
            logger.error("AWS_BATCH_JOB_ARRAY_INDEX=%r is not an integer", raw_index)
            return 2
    try:
        return run_child(job_url, index, environ.get("AWS_BATCH_JOB_ATTEMPT"), node, context)
    except MemoryError:
        raise
    except Cancelled:
        return OOM_EXIT_STATUS  # 128 + SIGKILL: what the kill reported already
    except Exception as error:  # storage unreachable, inputs missing...: the container fails
        logger.error("child %d failed on Python %s: %s: %s", index, platform.python_version(),
                     type(error).__name__, error, exc_info=True)
        return 1


def _exit(code: int) -> None:
    """End the container once its result is recorded, whatever threads the function left.

    A plain interpreter exit first joins every non-daemon thread, so a thread the user's code
    started and never stopped would keep the job RUNNING (its result already written) until
    its timeout. atexit handlers still run; then the process ends with ``code``.
    """
    try:
        import atexit

        atexit._run_exitfuncs()
    finally:
        _flush()
        os._exit(code)


if __name__ == "__main__":
    _exit(main())
