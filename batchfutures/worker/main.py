"""What the container command runs: ``python -m batchfutures.worker <job_url>`` (__main__.py).

    AWS_BATCH_JOB_ARRAY_INDEX = i (absent: 0, a plain job)
    (a node of a multi-node job: i = AWS_BATCH_JOB_NODE_INDEX; it runs child 0's items and
     writes results/<i>; the main node then waits for every node's result before it exits)
      -> <job_url>/results/<i> already there?  an earlier attempt finished: keep it, exit 0
      -> BATCHFUTURES_ENVIRONMENT (requirements=)?  its archive, seal checked, unpacked once per
         host and put first on sys.path (envs.py)
      -> read the header and child i's byte range of <job_url>/inputs, checking their MACs
         (a retry_on_oom retry's header names, per child, the first job's inputs to read instead)
      -> read the functions its items call (the blob names them outside its pickle), the
         initializer and the initargs, checking each one's seal (calls.Prefetched): all seals
         before anything is unpickled or run, on both paths; a failed one refuses the job
      -> the client's Python/cloudpickle differ (header stamp)?  every item: a mismatch outcome
      -> unpickle the arguments; read (and check) the upstream results they refer to
      -> the executor's initializer(*initargs), if any, once; if it raises, every item fails
         (header "initargs": each function's pickle is (initializer, fn) from one dumps, so
         they share one module namespace: see calls.load_bundles)
      -> unpickle them (once each), run each item in order; print goes to the log, and with
         header "output" (echo_output=True) each item's stdout and stderr are also kept, the
         last calls.OUTPUT_LIMIT characters of each (calls.Capture), for the client to print
         (an argument that is another call's result is read from that call's result object)
      -> one outcome per item: value | exception + traceback | unpicklable | mismatch
         and its usage (calls.Meter: wall/CPU seconds and peak MiB of the item, also
         per item on the inner pool), in the result's JSON meta "usage", no extra request
      -> write <job_url>/results/<i> once, atomically and only if absent, with the kept
         output in its output section (wire.pack_result); exit 0

An exception raised by the user's function (any BaseException, SystemExit included) is an
outcome, not a container failure: the worker still exits 0. A MemoryError, from the function or
while pickling its result, means the container ran out of memory: the worker writes one line to
stderr and ends with exit status 137 without writing a result, as the kernel's OOM killer would
(the local emulator caps memory with RLIMIT_DATA, so there an over-limit allocation surfaces as
MemoryError). No kernel killed it, so Batch gives no OutOfMemoryError reason: before it exits,
``_out_of_memory`` records an out-of-memory marker (storage.write_oom_marker, <job_url>/oom/<i>,
signed; never a result), from which the client classifies the exit as MemoryLimitExceeded.
A call whose function is under a Retries policy (retrypolicy.Retrying) and raised an exception
the policy lists, with attempts left, makes the attempt end with RETRY_EXIT_STATUS after the
policy's delay, writing no result: Batch retries the child. SIGTERM (a Spot reclaim's notice)
sets batchfutures.interrupted() for a call that uses checkpoints.py, whose context (the call's
key, attempt, item) is set here around each child's items.
A result already written by an earlier attempt is kept: a retry never overwrites
a finished result. The worker's own messages go to stderr through the "batchfutures" logger.
Once the result is written the process ends (``os._exit`` after the atexit handlers), so a
non-daemon thread left running by the function cannot keep the job alive.

Signing (signing.py): the key is found where the job's BATCHFUTURES_SIGNING_KEY_SOURCE says. An
inputs object, function, initializer or initargs object (or an upstream result an argument names)
that is unsigned, altered, signed with another key or for another storage root, or over the size
limit (storage.MAX_OBJECT_SIZE), is refused before anything runs, on the sequential path and on
the inner pool alike, and before any payload is unpickled: the job's log says why, and the result records
the refusal in its JSON metadata only (never a pickle), so the client raises IntegrityError
without unpickling. No key at all is a failed container (exit 1) whose log says where the key
was looked for.

In a thread (the emulator's ``launcher="threads"``, emulator/runtime/threads.py) the same code runs
through ``run(job_url, environ, fork=False, cancelled=...)``: the attempt's environment is the
mapping given (threads share os.environ), the items run in this thread (no forked pool), nothing
calls os._exit (``run`` returns the exit status; a MemoryError propagates), and once
``cancelled()`` is true (the attempt was killed) no further item runs and no result is written.

    python -m batchfutures.worker <url>  ->  guarded_main (oomguard: in an ECS container, in one
                                             forked child) -> main: logging, run(url, os.environ)
                                             -> exit_process(status)
    ThreadLauncher (emulator)            ->  run(url, its env, fork=False, cancelled) -> status

Imports stay light: no boto3 for file:// URLs, s3fs only through fsspec for s3:// URLs.
"""

from __future__ import annotations

import atexit
import logging
import os
import platform
import socket
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from .. import checkpoints, serialization, signing, wire
from ..awsclients import worker_storage_options
from ..batchlimits import OOM_EXIT_STATUS
from ..dependencies import Resolver
from ..errors import ConfigurationError, IntegrityError
from ..retrypolicy import RETRY_EXIT_STATUS
from ..storage import Storage, size_limit
from . import calls, envs, oomguard, pool
from .storagelib import check_storage_library

if TYPE_CHECKING:
    from ..signing import Signer
    from .nodes import NodeInfo

logger = logging.getLogger("batchfutures")
NODE_POLL_INTERVAL = 0.25  # the main node's look for the other nodes' results (a HEAD each on S3)
# After every node's result is there, the main node waits this long before it ends the job (which
# stops the nodes still running), so a node that wrote its result usually exits SUCCEEDED.
NODE_EXIT_GRACE = 1.0
_OOM_LINE = b"batchfutures.worker: MemoryError: out of memory; exiting with status 137 like the OOM killer\n"
_OOM_MARKER_FAILED = (b"batchfutures.worker: could not record the out-of-memory marker; the "
                      b"client will see a plain exit status 137\n")


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


def _out_of_memory(job_url: Optional[str] = None) -> None:
    """Die as an out-of-memory kill would: no result, exit status 137.

    Before it exits, it records the out-of-memory marker of this child (storage.write_oom_marker,
    at ``<job_url>/oom/<i>``, beside the results and never one): the kernel's kill gives Batch
    an ``OutOfMemoryError`` reason, a MemoryError does not (on AWS, or under the emulator's
    cgroups), so the marker is what lets the client classify this exit 137 as
    MemoryLimitExceeded and retry_on_oom act on it. Memory is short: the frames that failed are
    gone (``main`` calls this after its ``except`` block), the stderr line is preallocated, the
    marker is a few dozen bytes written with the Storage the attempt already made (its key
    loaded), and any failure to write it (MemoryError included) leaves a plain exit 137.
    """
    try:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os.write(2, _OOM_LINE)  # preallocated, no logging machinery: memory is short
        if job_url:
            _record_out_of_memory(job_url, os.environ)
    finally:
        os._exit(OOM_EXIT_STATUS)


def _record_out_of_memory(job_url: str, environ: Mapping[str, str]) -> None:
    """_out_of_memory's marker, best effort: never raises."""
    try:
        raw = environ.get("AWS_BATCH_JOB_NODE_INDEX") or environ.get("AWS_BATCH_JOB_ARRAY_INDEX")
        index = int(raw or 0)
        storage = Storage.opened(job_url)
        if storage is None:  # the attempt failed before it made one: make it as run_child does
            storage = Storage.from_url(
                job_url, signer=_job_signer(environ),
                storage_options=worker_storage_options(dict(environ)) or None,
                max_object_size=size_limit(environ))
        storage.write_oom_marker(job_url, index, environ.get("AWS_BATCH_JOB_ATTEMPT"))
    except BaseException:  # noqa: B036 - a MemoryError too: then it is a plain exit 137
        try:
            os.write(2, _OOM_MARKER_FAILED)
        except BaseException:  # noqa: B036
            pass


def result_written(job_url: str, environ: Mapping[str, str]) -> bool:
    """Whether this attempt's child (or node) has its result in storage (oomguard asks, after
    a kill: a result written is kept, and needs no out-of-memory marker)."""
    raw = environ.get("AWS_BATCH_JOB_NODE_INDEX") or environ.get("AWS_BATCH_JOB_ARRAY_INDEX")
    storage = Storage.from_url(job_url, signer=_job_signer(environ),
                               storage_options=worker_storage_options(dict(environ)) or None,
                               max_object_size=size_limit(environ))
    return storage.has_result(job_url, int(raw or 0))


def _item_count(header: Dict[str, Any], index: int) -> int:
    """How many items child ``index`` holds, from the header alone (its blob may not load)."""
    chunksize, items = int(header.get("chunksize", 1)), int(header.get("items", 1))
    return max(1, min(chunksize, items - index * chunksize))


def run_items(storage: "Storage", header: Dict[str, Any], blob: Union[bytes, bytearray],
              index: int, context: Optional[Context] = None,
              output: Optional[Dict[int, Any]] = None,
              usage: Optional[List[Any]] = None) -> List[bytes]:
    """Run child ``index``'s items; one encoded outcome per item. MemoryError propagates, and
    so does IntegrityError: a seal that fails refuses the whole child, before anything ran.

    ``output``: a dict to fill with what each item printed (item position -> [stdout, stderr,
    chars cut of each]), for the items that printed; None: nothing is kept (only the log has it).
    ``usage``: a list to fill with each item's ``[wall_s, cpu_s, peak_mib or None]`` (None for
    an item not measured), in item order; left empty when no item ran.
    """
    context = context or _process_context()

    if header.get("sources"):  # a retry_on_oom retry: the items stay in the first job's inputs
        source_url, source_index = header["sources"][index]
        redirects = header.get("redirects")  # a rerun's: upstream results that moved
        header, blob = storage.read_child_inputs(source_url, int(source_index))
        if redirects:
            header = {**header, "redirects": redirects}
    encoding = header.get("encoding", wire.CALLS)
    try:  # which functions, read outside the pickle: their seals are checked before it loads
        used = wire.item_functions(blob, encoding)
    except ValueError:
        used = None  # every function of the header, then
    prefetched = calls.Prefetched(storage, calls.payload_urls(header, used))
    mismatch = serialization.check_stamp(header)
    if mismatch is not None:  # do not even try to unpickle: it may crash or mislead
        logger.warning("child %d: %s", index, mismatch)
        return [wire.encode_mismatch(mismatch)] * _item_count(header, index)
    try:
        items = wire.unpack_items(blob, encoding)
    except MemoryError:
        raise
    except Exception as error:
        logger.warning("child %d: could not load the call's arguments: %s", index,
                       type(error).__name__)
        return [calls.load_failure("the call's arguments", header, error)] * _item_count(header, index)
    processes = pool.processes_for(len(items), context.environ) if context.fork else 1
    if processes > 1:  # a job of N vCPUs: the items on N processes, the initializer in each
        return pool.run_items(storage, header, items, index, processes, output=output,
                              prefetched=prefetched, usage=usage)
    capture = calls.Capture(output is not None and context.fork)
    try:
        return _run_here(storage, prefetched, header, items, index, context, capture, output,
                         usage)
    finally:
        capture.close()


def _run_here(storage: "Storage", prefetched: calls.Prefetched, header: Dict[str, Any],
              items: Sequence[calls.Item], index: int, context: Context, capture: calls.Capture,
              output: Optional[Dict[int, Any]], usage: Optional[List[Any]] = None) -> List[bytes]:
    """run_items in this process: the upstream results read (their seals checked), the
    initializer, then the items one by one; every payload in ``prefetched`` had its seal checked."""
    resolver = Resolver(storage, header.get("redirects"))
    resolver.preload(items)
    functions, failed, failure = calls.initialize(prefetched, header, items, index)
    if failure is not None:
        capture.keep(output, 0)
        return [failure] * len(items)
    meter = calls.Meter(thread=not context.fork) if usage is not None else None
    runner = calls.ItemRunner(prefetched, header, index, resolver, functions, failed, meter)
    outcomes: List[bytes] = []
    try:
        for item in items:
            context.check()
            checkpoints.at_item(len(outcomes))  # checkpoint() of this item: its own key
            try:
                outcomes.append(runner.run(item))
                if usage is not None:
                    usage.append(runner.usage)
            finally:  # what was printed since the last item (its own output) is this item's
                capture.keep(output, len(outcomes) - 1)
    finally:
        if meter is not None:
            meter.close()
    return outcomes


def run_child(job_url: str, index: int, attempt: Optional[str] = None,
              node: "Optional[NodeInfo]" = None, context: Optional[Context] = None) -> int:
    """Run one child of a Batch job and record its result; the container's exit status.

    ``node``: a node of a multi-node job. Every node runs child 0's items and writes its result
    at its node index; the main node then waits for the others' results, since its end ends
    the job and stops the nodes still running (BATCHFUTURES_NODE_WAIT bounds the wait, in
    seconds; unset, the job's timeout does).
    """
    context = context or _process_context()
    storage = Storage.from_url(job_url, signer=_job_signer(context.environ),
                               # the S3 guards the client set for the job
                               storage_options=worker_storage_options(dict(context.environ)) or None,
                               max_object_size=size_limit(context.environ))
    if storage.has_result(job_url, index):
        logger.info("child %d: a result is already written (an earlier attempt finished); "
                    "keeping it, not running again", index)
    else:
        status = _run_and_record(storage, job_url, index, attempt,
                                 0 if node is not None else index, context)
        if status:
            return status
    if node is not None and node.is_main:
        _wait_for_other_nodes(storage, job_url, node, context)
    return 0


def _job_signer(environ: Mapping[str, str]) -> "Signer":
    """signing.job_signer's choice of key, made from ``environ`` (a thread's is not os.environ)."""
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
                    child: int, context: Context) -> int:
    """Run child ``child``'s items and write the result at ``index``; the exit status: 0, or
    RETRY_EXIT_STATUS (no result written) when a call raised an exception its Retries policy
    lists with attempts left (retrypolicy.py), after the policy's delay."""
    meta: Dict[str, Any] = {
        "index": index, "attempt": attempt, "started": time.time(), "host": socket.gethostname(),
        "pid": os.getpid(), "worker": serialization.payload_stamp(),
    }
    output: Optional[Dict[int, Any]] = None
    usage: List[Any] = []
    try:
        if context.fork:  # requirements=: the job's environment first on sys.path, before any
            envs.activate(storage, context.environ)  # payload is unpickled (not in a thread)
        header, blob = storage.read_child_inputs(job_url, child)
        output = {} if header.get("output") else None  # echo_output=True: keep what items print
        # checkpoint()/restored() of its calls: kept under the call's first job (a resubmitted
        # child reads its items from there too)
        key_url, key_child = header["sources"][child] if header.get("sources") else (job_url, child)
        checkpoints.begin_call(storage, key_url, int(key_child), attempt, context.cancelled)
        try:
            outcomes = run_items(storage, header, blob, child, context, output, usage)
            retry_after = checkpoints.retry_requested()
        finally:
            checkpoints.end_call()
        del blob
    except IntegrityError as refused:  # raised before any item ran
        logger.error("child %d: refusing this job (nothing unverified was unpickled, nothing ran): "
                     "%s", index, refused)
        meta[signing.REFUSED] = str(refused)
        outcomes, output, retry_after = [], None, None
    calls.flush_output()
    if retry_after is not None:
        logger.warning("child %d: a call raised an exception its retries=Retries(on=...) lists; "
                       "attempt %s ends without a result in %g s, for Batch to retry it", index,
                       attempt, retry_after)
        time.sleep(retry_after)
        context.check()
        return RETRY_EXIT_STATUS
    meta["finished"] = time.time()
    if outcomes and any(entry is not None for entry in usage):  # per item, in item order
        meta["usage"] = (usage + [None] * len(outcomes))[:len(outcomes)]
    context.check()  # a killed attempt's thread must not record a result after its end
    if not storage.write_result(job_url, index, wire.pack_result(outcomes, meta, output)):
        logger.info("child %d: another attempt wrote its result first; kept that one", index)
    return 0


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
    if len(args) == 2 and args[0] == "--warm":  # a warm pool's worker (warm.py)
        _configure_logging()
        # start-up: warm.py adds ~1.7 ms (8 modules) to each worker's start; only --warm needs it
        from .warm import main as warm_main

        return warm_main(args[1])
    if len(args) != 1:
        sys.stderr.write("usage: python -m batchfutures.worker <job_url>\n")
        return 2
    _configure_logging()
    checkpoints.install_sigterm_handler()  # SIGTERM (a Spot notice): batchfutures.interrupted()
    try:
        return run(args[0], os.environ)
    except MemoryError:
        pass  # out of the except block: the failed frames (and what they held) are freed
    _out_of_memory(args[0])
    return 1  # not reached: _out_of_memory() does not return


def guarded_main() -> int:
    """The container command's: ``main()`` in one forked child where oomguard says so, so a
    kernel OOM kill of it is recorded as the out-of-memory marker; returns the exit status."""
    if sys.argv[1:2] == ["--warm"]:  # its calls run in a process of their own (warm.Runner)
        return main()
    return oomguard.supervise(
        main, sys.argv[1:], finish=exit_process,
        record_oom=lambda url: _record_out_of_memory(url, os.environ),
        result_written=lambda url: result_written(url, os.environ))


def run(job_url: str, environ: Mapping[str, str], *, fork: bool = True,
        cancelled: Optional[Callable[[], bool]] = None) -> int:
    """One attempt of the worker over ``environ`` (its AWS_BATCH_* variables, signing key
    source, BATCHFUTURES_VCPUS...); returns the container's exit status.

    A MemoryError propagates (the caller ends as the OOM killer would). ``fork=False`` runs
    the items in this thread; ``cancelled()`` true stops it before the next item and before the
    result is written (exit status 137, as the kill it stands for).
    """
    context = Context(environ, fork=fork, cancelled=cancelled or _never)
    node = None
    if environ.get("AWS_BATCH_JOB_NODE_INDEX"):  # a node of a multi-node job
        # start-up: nodes.py (urllib.request) adds ~4 ms to each worker's start; only a node
        # of a multi-node job needs it
        from .nodes import node as this_node

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
        check_storage_library(job_url)  # s3fs too old for the exclusive result write: refuse
        return run_child(job_url, index, environ.get("AWS_BATCH_JOB_ATTEMPT"), node, context)
    except MemoryError:
        raise
    except Cancelled:
        return OOM_EXIT_STATUS  # 128 + SIGKILL: what the kill reported already
    except Exception as error:  # storage unreachable, inputs missing...: the container fails
        logger.error("child %d failed on Python %s: %s: %s", index, platform.python_version(),
                     type(error).__name__, error, exc_info=True)
        return 1


def exit_process(code: int) -> None:
    """End the container once its result is recorded, whatever threads the function left.

    A plain interpreter exit first joins every non-daemon thread, so a thread the user's code
    started and never stopped would keep the job RUNNING (its result already written) until
    its timeout. atexit handlers still run; then the process ends with ``code``.
    """
    try:
        atexit._run_exitfuncs()
    finally:
        calls.flush_output()
        os._exit(code)

