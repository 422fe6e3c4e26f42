"""Warm workers: ``BatchExecutor(env, keepalive=S, max_workers=N)`` runs its calls on up to N
long-lived Batch jobs that take them from a queue, so an iterative program (an optimizer's
``pool.map`` per generation, a sampler's per step) pays a Batch job's start once, not per map.

Data flow (one pool per distinct JobSettings of a Session, as with_settings views make):

    user thread                         SQS (emulator: emulator/sqs.py)        warm worker k
    -----------                         ------------------------------         (Batch job)
    ex.submit / ex.map
      pickle fn: put_function once ──> R/runs/<run>/functions/<sha>.pkl
      per call (a submit, or a map child of chunksize items): a WarmCall, its future(s)
        PENDING in the pool's deque
      _pump: while fewer than `window` (max(2 N, 16)) calls are sent and unfinished:
        future RUNNING (as a ProcessPoolExecutor's call queue: cancel() works until now)
        SendMessageBatch ───────────────> work queue <pool>-work
          (base64 of the sealed call:        │  ReceiveMessage(1, long poll,
           its items inline up to 180 KiB,   │    VisibilityTimeout V) ─────────> decode, seal
           else stored and pointed to)       │                                  checked
      too few workers for the calls sent:    │                                  runner process
        SubmitJob(python -m batchfutures.    │                                  (forked once:
        worker --warm R/runs/<run>/warm/<k>) │                                  initializer,
        one job per worker, never per call   │                                  globals kept)
                                             │                                  runs the call,
                                             │    ChangeMessageVisibility(V)   <─ every V/3 s
                                             │                                  PUT results/<n>
                                             │                                  once (exclusive;
                                             │                                  local queues:
                                             │                                  large ones only)
                                 completions queue <pool>-done <──── SendMessage({n, worker,
                                             │                         sealed result inline})
                                             │                      DeleteMessage(work)
    pool thread (one per pool)               │
      ReceiveMessage(10, long poll) <────────┘
      seal checked (unseal "result" under results/<n>; or GET it when not inline)
      settle the call's future(s) (jobs.decode_result), echo its output (echo_output="live":
        not what the session's LiveTail streamed from its worker's log, warmlive.py), keep it
        for log()
      DeleteMessageBatch ten at a time, or once idle (completions_to_delete); refill the
        window (_pump)
      every WATCH_EVERY s with workers: DescribeJobs(worker ids) (<= 100 a request): a worker
        that ended is forgotten and replaced while calls wait; never a Batch request per call
    shutdown/exit: DeleteQueue(work) (idle workers exit at their next receive), TerminateJob of
      every worker (a running call is stopped), DeleteQueue(done)

No call lost or run twice to a result. A message reappears after its visibility timeout when
its worker died holding it; the worker that takes it again sees ApproximateReceiveCount > 1 and
first looks for the call's result (written once: a second writer loses, so a call whose first
worker finished but died before its completion is not run again, only completed). A call seen
more times than its ``retries`` (attempts, as Batch's) fails with HostTerminatedError
(warmwire.lost_failure) instead of running again: the worker that held it is gone, and nothing
else can say how. The common deaths never reach that point: the call runs in the worker's
runner process, so a kernel OOM kill or a MemoryError (exit 137) ends only the runner, and the
worker fails that call with MemoryLimitExceeded and starts a new runner; a call past its
``timeout`` is killed by the worker (JobTimeoutError): timeout is per call here, not the
worker job's. The call's own exception comes back as itself, as on the cold path.

On the emulator's local queues a result under INLINE_LIMIT is not stored at all: its sealed
completion message is the record (warmwire.results_in_messages) and the first completion of a
call settles it, a later one is dropped (_complete).

Costs per call (benchmarks/bench_warm.py): SQS 3 requests by the worker (receive, completion,
delete) and about 1 by the client (sends, completion receives and deletes in batches), storage
1 PUT (the result) on AWS and none on the local queues, no GET when the result is under
180 KiB; Batch 0 (SubmitJob per worker, DescribeJobs per WATCH_EVERY for the whole pool).

Besides plain calls: a future among submit's arguments, or among a map child's items (a warm
call's, or one not sent yet: mapping.py), is awaited here, on the client, and the call then
sent (submit_warm, WarmPool.add_held: HeldCall); retry_on_oom sends a call killed for memory
to the pool of the settings with more memory (_retried_for_memory, oom_retry_settings); a dry
run builds what a pool would send and sends nothing (WarmDryRun). nodes > 1 stays on the cold
path (runs_warm). retries=Retries(on=...) and checkpoints work per call as on the cold path: a
worker's retry notice lists the attempt (WarmCall.attempts_of: future.attempts) and leaves the
call's message to come back after the policy's delay (worker/warm.py, warmwire module doc).
A client killed outright leaves its queues: its workers exit after keepalive
seconds without calls; the queues are tagged ``batchfutures:run`` (and expire after
MESSAGE_RETENTION with nothing in them); ``batchfutures cleanup`` removes them (cleanup.py).
"""

from __future__ import annotations

import base64
import collections
import functools
import hashlib
import json
import logging
import os
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Mapping, Optional, Tuple

from . import batchapi, logforward, serialization, sqsapi, warmlive, warmwire, wire
from .errors import (
    ConfigurationError,
    DependencyFailedError,
    DryRunResult,
    JobAbortedError,
    MemoryLimitExceeded,
    classify_failure,
)
from .futures import BatchFuture
from .jobs import decode_result, settle
from .settings import JobSettings
from .statuses import JobStatus
from .submission import build_request, user_tag
from .usage import Usage
from .workdir import secure_folder

if TYPE_CHECKING:
    from .environments import Environment

__all__ = ["WarmPool", "WarmCall", "VISIBILITY_TIMEOUT", "WATCH_EVERY", "sqs_spec_for",
           "workers_to_start", "window_for", "completions_to_delete", "local_queue_folder",
           "queue_base", "batches_by_size", "runs_warm", "submit_warm", "WarmDryRun",
           "oom_retry_settings", "HeldCall", "item_fate", "release_plan", "merged_outcomes",
           "check_same_session", "await_upstream"]

logger = logging.getLogger("batchfutures")

VISIBILITY_TIMEOUT = 30  # seconds a received call stays hidden; its worker extends it as it runs
BATCH_BYTES = 1_000_000  # under SendMessageBatch's 1 MiB (a message is at most ~240 KiB)
WINDOW_FLOOR = 16  # calls sent ahead at least (window_for)
MAX_FAILED_STARTS = 3  # workers in a row failing before any call: the calls fail (_give_up)
WATCH_EVERY = 1.0  # seconds between DescribeJobs of the pool's workers
MESSAGE_RETENTION = 86400  # a dead client's queues hold nothing older than a day
SHUTDOWN_GRACE = 2.0  # seconds idle workers get to leave by themselves before TerminateJob
# Benchmarks only (bench_warm.py --aws-latency): seconds each SQS request of the emulator's and
# each storage request of a warm worker waits first, as AWS's round trips would.
INJECTED_LATENCY: Dict[str, float] = {}
COMPLETION_WAIT = 1  # seconds of a completions long poll (the thread also watches workers)


def workers_to_start(live: int, outstanding: int, max_workers: int) -> int:
    """How many workers to start now: enough for the calls outstanding, at most max_workers."""
    return max(0, min(max_workers, outstanding) - live)


def batches_by_size(sizes: List[int], limit: int = BATCH_BYTES, most: int = 10
                    ) -> List[List[int]]:
    """Messages (by size, in order) in SendMessageBatch requests of at most ``most`` entries
    and ``limit`` bytes together (SQS refuses a larger batch)."""
    parts: List[List[int]] = []
    total = 0
    for index, size in enumerate(sizes):
        if not parts or len(parts[-1]) == most or total + size > limit:
            parts.append([])
            total = 0
        parts[-1].append(index)
        total += size
    return parts


def completions_to_delete(handled: int, received: bool, oldest: float) -> bool:
    """Whether the pool's thread deletes (up to ten of) the ``handled`` completions it settled
    now: ten make a DeleteMessageBatch; fewer wait until a long poll came back empty (the pool
    is idle) or the oldest was handled ``oldest`` seconds ago, a third of the visibility
    timeout (it must not come back; if it did, its call is done and it is ignored)."""
    if handled >= 10:
        return True
    return handled > 0 and (not received or oldest >= VISIBILITY_TIMEOUT / 3)


_MULTINODE_NOTED = threading.Event()  # nodes > 1 under keepalive is logged once a process


def runs_warm(settings: JobSettings) -> bool:
    """Whether the calls of ``settings`` run on warm workers: ``keepalive > 0`` and one node. A
    multi-node call is one Batch multi-node parallel job whose nodes start together and reach
    each other (batchfutures.node()): a pool's single-node worker cannot be that, so those
    calls stay cold jobs (said once a process, at INFO)."""
    if not settings.keepalive:
        return False
    if settings.nodes > 1:
        if not _MULTINODE_NOTED.is_set():
            _MULTINODE_NOTED.set()
            logger.info("batchfutures: nodes=%d calls run as multi-node Batch jobs, one per call, "
                        "not on warm workers (keepalive= applies to single-node calls only)",
                        settings.nodes)
        return False
    return True


def oom_retry_settings(settings: JobSettings, decision: Any) -> JobSettings:
    """The settings of a call's retry with more memory (an oomretry RESUBMIT decision: its
    memory, and on Fargate the vCPUs of its pair): the pool that runs it is these settings'."""
    if decision.vcpus is not None:
        return replace(settings, memory=decision.memory_mib, vcpus=decision.vcpus)
    return replace(settings, memory=decision.memory_mib)


def futures_among(args: tuple, kwargs: Dict[str, Any]) -> List[BatchFuture]:
    """The futures among a call's arguments (an argument, or an item of a list/tuple argument,
    where cache.has_future looks), each once."""
    found: Dict[int, BatchFuture] = {}
    for value in (*args, *kwargs.values()):
        for item in (value if isinstance(value, (list, tuple)) else (value,)):
            if isinstance(item, BatchFuture):
                found.setdefault(id(item), item)
    return list(found.values())


def resolved(value: Any) -> Any:
    """An argument with each future in it (itself, or an item of a list/tuple) replaced by its
    result; the futures are done."""
    if isinstance(value, BatchFuture):
        return value.result()
    if isinstance(value, (list, tuple)) and any(isinstance(v, BatchFuture) for v in value):
        items = [v.result() if isinstance(v, BatchFuture) else v for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def submit_warm(session: Any, settings: JobSettings, fn: Any, args: tuple,
                kwargs: Dict[str, Any]) -> BatchFuture:
    """``submit`` on warm workers: sent now, or, when futures are among the arguments, once
    they are done (WarmPool.add_held)."""
    future = BatchFuture(session)
    # under a Retries policy listing exceptions, as retrypolicy.Retrying: the worker retries
    function_pickle = session.pickle_function(fn, settings.retry_policy)  # SerializationError
    upstream = futures_among(args, kwargs)
    check_same_session(session, upstream)
    pool = session.warm_pool(settings)
    if not upstream:
        blob = wire.pack_items([(0, args, kwargs)], by_value=session.by_value)
        pool.add(function_pickle, wire.CALLS, [blob], [1], [[future]])
        return future
    await_upstream(session, upstream)
    by_value = session.by_value
    pool.add_held(HeldCall(
        upstream, function_pickle, wire.CALLS, [(args, kwargs)], [future], per_child=False,
        pack=lambda items, _first: wire.pack_items([(0, a, k) for a, k in items],
                                                   by_value=by_value)))
    return future


def check_same_session(session: Any, upstream: List[BatchFuture]) -> None:
    if any(done._core is not session for done in upstream):
        raise ConfigurationError("a future passed as an argument must come from the same "
                                 "executor (or one of its with_settings views)")


def await_upstream(session: Any, upstream: List[BatchFuture]) -> None:
    """A buffered cold call among ``upstream`` is sent now: a held call waits for it."""
    for done in upstream:
        if not done.done():
            session.flush_for(done)


# -- a call held on the client until the futures among its arguments are done -----------------
RUN, FAILED, CANCELLED = "run", "failed", "cancelled"  # an item's fate (item_fate)
SEND, PART, NONE, CANCEL = "send", "part", "none", "cancel"  # a held call's (release_plan)


@dataclass
class HeldCall:
    """A call (a submit, or one map child of ``len(items)`` items) whose arguments include
    futures the client awaits (``upstream``): sent to the pool once they are all done, with
    their results in their places (WarmPool.add_held)."""

    upstream: List[BatchFuture]  # every future among the items' arguments, once each
    function_pickle: bytes
    encoding: str
    items: List[Tuple[tuple, Dict[str, Any]]]  # each item's (args, kwargs), futures in place
    futures: List[BatchFuture]  # one per item, or (per_child) the child's one
    per_child: bool
    pack: Callable[[List[Tuple[tuple, Dict[str, Any]]], int], bytes]  # resolved items -> blob
    first_item: int = 0  # the map position of its first item (names an item in errors)


def upstream_state(done: BatchFuture) -> str:
    """A done argument future's part in its dependent's fate."""
    if done.cancelled():
        return CANCELLED
    return FAILED if done.exception() is not None else RUN


def item_fate(states: List[str]) -> str:
    """An item's fate from its argument futures' states: a cancelled one cancels it (first, as
    the cold path), a failed one fails it with DependencyFailedError, else it runs."""
    if CANCELLED in states:
        return CANCELLED
    return FAILED if FAILED in states else RUN


def release_plan(fates: List[str], per_child: bool) -> str:
    """What a held call does once its arguments are done, from its items' fates: SEND all its
    items; PART: send those that run, settle (or cancel) the others apart; NONE: send nothing,
    settle (or cancel) each; CANCEL its one future (a map child, per_child, with a cancelled
    item: as a cold child is cancelled with its upstream)."""
    if per_child and CANCELLED in fates:
        return CANCEL
    running = fates.count(RUN)
    if running == len(fates):
        return SEND
    return PART if running else NONE


def dependency_failure(upstream: List[BatchFuture]) -> DependencyFailedError:
    """The error of a call whose first failed argument future is among ``upstream``."""
    failed = next(done for done in upstream if not done.cancelled() and
                  done.exception() is not None)
    cause = failed.exception()
    error = DependencyFailedError(
        f"an argument of this call is the result of {failed.job_id}, which failed: {cause!r}",
        job_id=failed.job_id, status_reason="a dependency failed")
    error.__cause__ = cause
    return error


def merged_outcomes(fates: List[str], errors: Dict[int, BaseException],
                    ran: List[Tuple[bool, Any]]) -> List[Tuple[bool, Any]]:
    """A map child's outcomes in item order: the items that ran take ``ran`` in order, the
    others their ``errors``."""
    taken = iter(ran)
    return [next(taken) if fate == RUN else (False, errors[i]) for i, fate in enumerate(fates)]


def window_for(max_workers: int) -> int:
    """How many calls may be sent and unfinished at once: a map's round of a few calls per
    worker goes out in one batch (no wait for completions to refill), and ``cancel()`` still
    works for every call behind them (ProcessPoolExecutor sends max_workers + 1)."""
    return max(2 * max_workers, WINDOW_FLOOR)


def local_queue_folder(workdir: Any, environ: Optional[Mapping[str, str]] = None,
                       memory_folder: str = "/dev/shm") -> Any:
    """Where the emulator's queues of ``workdir`` live: in memory when this user has a private
    folder there ($XDG_RUNTIME_DIR, else one of its own made under /dev/shm: a message is a
    file created and removed per call, ~10 us there against ~100 us or more on a disk), else
    under the workdir's emulator folder. A folder another user planted is refused
    (workdir.secure_folder), and then the workdir's is used."""
    environ = os.environ if environ is None else environ
    name = "sqs-" + hashlib.sha256(str(workdir).encode()).hexdigest()[:12]
    runtime = environ.get("XDG_RUNTIME_DIR")
    candidates = [Path(runtime) / "batchfutures"] if runtime and os.path.isabs(runtime) else []
    if os.path.isdir(memory_folder):
        candidates.append(Path(memory_folder) / f"batchfutures-{os.geteuid()}")
    for base in candidates:
        try:
            return secure_folder(base, "queue folder") / name
        except (ConfigurationError, OSError) as refused:
            logger.debug("batchfutures: not using %s for the warm queues: %s", base, refused)
    return Path(workdir) / "emulator" / "sqs"


QUEUE_NAME_MAX = 80  # SQS: at most 80 characters of [A-Za-z0-9_-] (a .fifo suffix counted)
QUEUE_SUFFIX = len("-work")  # the longest of the two suffixes (-work, -done)
STACK_HASH = 8  # hex digits of the stack name's hash that stand for its cut part


def queue_base(stack: Optional[str], run_id: str, key: str) -> str:
    """The pool's queues' names without their -work/-done: ``<stack>-warm-<run>-<key>`` (what
    the stack's policies can grant, ``<stack>-warm-*``), ``batchfutures-warm-...`` with no
    stack. A stack name too long for SQS's 80 characters is cut and ends with a hash of the
    whole name instead (``<first characters>-<8 hex>``): the same stack always gets the same
    names (cleanup finds them by that prefix), two long stacks that begin alike do not."""
    tail = f"-warm-{run_id}-{key}"
    head = stack or "batchfutures"
    room = max(STACK_HASH + 2, QUEUE_NAME_MAX - QUEUE_SUFFIX - len(tail))
    if len(head) > room:
        digest = hashlib.sha256(head.encode()).hexdigest()[:STACK_HASH]
        head = f"{head[:room - STACK_HASH - 1]}-{digest}"
    return head + tail


def sqs_spec_for(env: Environment) -> Dict[str, Any]:
    """Where the pool's queues live: the local emulator's folder, or the environment's Region
    (boto3 finds the endpoint as for any service: AWS_ENDPOINT_URL_SQS, the config file)."""
    if env.is_local and env.workdir is not None:
        spec: Dict[str, Any] = {"local": str(local_queue_folder(env.workdir))}
        if INJECTED_LATENCY.get("sqs"):
            spec["latency"] = INJECTED_LATENCY["sqs"]
        return spec
    return {"region": env.region_name}


def worker_request(submitter: Any, env: Environment, settings: JobSettings, pool_url: str,
                   run_id: str, memory_mib: int) -> Dict[str, Any]:
    """The SubmitJob request of one warm worker of the pool at ``pool_url``."""
    command = list(env.worker_command(pool_url))
    command.insert(-1, "--warm")
    request = build_request(
        settings, name="batchfutures-warm", job_queue=submitter._queue_for(settings),
        job_definition=submitter._definition_for(settings), command=command, size=1,
        memory_mib=memory_mib, run_id=run_id, user=user_tag(),
        signing_environment=submitter._job_environment(),
        environment_tags=env.job_tags())
    request.pop("timeout", None)  # per call, enforced by the worker
    request["retryStrategy"] = {"attempts": 1}  # a dead worker is replaced by the pool
    return request


class WarmDryRun:
    """``dry_run=True`` with ``keepalive``: what a warm pool would do, built and not sent. Each
    call's futures raise DryRunResult: ``requests`` the SubmitJob of every worker the calls
    would start (at most max_workers, none started), ``objects`` the stored objects (the
    function, the pool's config, calls too large for a message), and ``sqs_requests`` the
    queues it would make and the SendMessageBatch requests of the calls."""

    def __init__(self, session: Any, settings: JobSettings) -> None:
        self.session = session
        self.settings = settings
        self.storage = session.storage  # a RecordingStorage: nothing is written
        key = uuid.uuid4().hex[:8]
        self.pool_url = self.storage.url("runs", session.run_id, "warm", key)
        given = session.submitter.max_workers
        self.max_workers = int(given) if given else max(1, int(session.env.max_vcpus_at_once()
                                                               / settings.vcpus + 1e-9))
        self.base = queue_base(session.env.stack, session.run_id, key)
        self.started = 0  # workers a real pool would have started so far

    def add(self, function_pickle: bytes, encoding: str, blobs: List[bytes],
            counts: List[int], futures: List[List[BatchFuture]], per_child: bool = False
            ) -> None:
        storage = self.storage
        memory = self.settings.memory_mib(None)  # the definition is not read in a dry run
        sqs: List[Dict[str, Any]] = []
        if not self.started and self.settings.requirements is not None:  # as a pool's first call
            from .envbuild import prepare  # start-up: as submission's

            prepare(self.session.env, storage, self.settings.requirements, [function_pickle], blobs)
        if not self.started:
            attributes = {"MessageRetentionPeriod": str(MESSAGE_RETENTION),
                          "VisibilityTimeout": str(VISIBILITY_TIMEOUT)}
            sqs += [{"Operation": "CreateQueue", "QueueName": f"{self.base}-{end}",
                     "Attributes": attributes} for end in ("work", "done")]
            storage.put_bytes(f"{self.pool_url}/config", b"{}")  # its size is not the point
        function_url = storage.put_function(self.session.run_id, function_pickle)
        sizes = []
        for number, (blob, count) in enumerate(zip(blobs, counts)):
            sealed = warmwire.encode_call(storage.signer, storage.mac_root,
                                          storage.name_of(self.pool_url), number, function_url,
                                          encoding, count, blob)
            if len(sealed) > warmwire.INLINE_LIMIT:
                storage.put_bytes(f"{self.pool_url}/calls/{number}", sealed)
                sealed = b"x" * 200  # a pointer's size
            sizes.append(len(base64.b64encode(sealed)))
        sqs += [{"Operation": "SendMessageBatch", "QueueName": f"{self.base}-work",
                 "Entries": len(part), "Bytes": sum(sizes[i] for i in part)}
                for part in batches_by_size(sizes)]
        start = workers_to_start(self.started, len(blobs), self.max_workers)
        self.started += start
        request = worker_request(self.session.submitter, self.session.submitter._env,
                                 self.settings, self.pool_url, self.session.run_id, memory)
        requests = [dict(request) for _ in range(start)]
        objects = storage.take_recorded()
        result = DryRunResult(
            f"dry run: warm workers (keepalive={self.settings.keepalive:g} s): {len(blobs)} "
            f"call(s) in {len(sqs)} SQS request(s), {start} worker(s) to start "
            f"({len(requests)} SubmitJob; at most {self.max_workers}), {len(objects)} "
            f"object(s) stored; nothing sent, no worker started",
            requests=requests, objects=objects)
        result.sqs_requests = sqs  # type: ignore[attr-defined]
        for group in futures:
            for future in group:
                if future.set_running_or_notify_cancel():
                    settle(future, False, result)

    def add_held(self, held: HeldCall) -> None:
        """A call on futures of a dry run (which never succeed): what it would send."""
        self.add(held.function_pickle, held.encoding, [b""], [len(held.items)],
                 [held.futures], per_child=held.per_child)

    def unfinished(self) -> List[BatchFuture]:
        return []

    def cancel_waiting(self) -> None:
        pass

    def close(self, *, stop_running: str = "") -> None:
        pass


class WarmCall:
    """One call on the warm path (a submit, or one map child): the BoundJob of its futures and
    the ShownStatuses of its one child."""

    __slots__ = ("pool", "number", "futures", "items", "per_child", "_status", "worker",
                 "output", "usage", "body", "_reason", "parts", "tries", "resent", "reported",
                 "earlier", "key", "__weakref__")

    def __init__(self, pool: "WarmPool", number: int, futures: List[BatchFuture], items: int,
                 body: str, per_child: bool) -> None:
        self.pool = pool
        self.number = number
        self.futures = futures
        self.items = items
        self.per_child = per_child  # map's: one future resolved with all its items' outcomes
        self.body = body
        self._status: str = JobStatus.SUBMITTED.value
        self.worker: Optional[str] = None
        self.output: Dict[int, Any] = {}
        self.usage: List[Any] = []
        self._reason: Optional[str] = None
        # retry_on_oom only: (function pickle, encoding, items' blob) to send again with more
        # memory, the tries so far (oomretry.Try), and whether its futures already run
        self.parts: Optional[Tuple[bytes, str, bytes]] = None
        self.tries: Tuple[Any, ...] = ()
        self.resent = False
        # future.attempts: the attempts its workers reported, by receive count (warmwire
        # .attempts_listed), after those on the pools it ran on before (retry_on_oom)
        self.reported: Dict[int, Any] = {}
        self.earlier: List[Any] = []
        self.key: Optional[Tuple[str, int]] = None  # its checkpoints' key, when not its own

    def attempts_of(self, child: int) -> List[Any]:
        """The call's ended attempts (callattempts.Attempt), oldest first."""
        return self.earlier + warmwire.attempts_listed(dict(self.reported))

    # BoundJob
    def child_id(self, index: Optional[int]) -> str:
        return self.worker or ""

    @property
    def default_status(self) -> str:
        return self._status

    @property
    def statuses(self) -> "WarmCall":
        return self

    def item_usage(self, child: int, position: int) -> Optional[Any]:
        return Usage.from_raw(self.usage[position]) if position < len(self.usage) else None

    # ShownStatuses (its one child)
    def status(self, child: int) -> Optional[str]:
        return self._status

    def reason(self, child: int) -> Optional[str]:
        return self._reason

    def exit_code(self, child: int) -> Optional[int]:
        return None

    def show(self, child: int, status: Optional[str], reason: Optional[str] = None,
             exit_code: Optional[int] = None) -> None:
        if status is not None:
            self._status = status
        if reason is not None:
            self._reason = reason

    def set_reason(self, child: int, reason: Optional[str]) -> None:
        self._reason = reason

    def set_exit_code(self, child: int, exit_code: Optional[int]) -> None:
        pass

    def log_text(self, position: int) -> str:
        """What the call printed (stdout then stderr), as its worker kept it."""
        printed = self.output.get(position)
        return "".join(printed[:2]) if printed else ""


class WarmPool:
    """The warm workers of one Session and JobSettings (see module doc)."""

    def __init__(self, session: Any, settings: JobSettings) -> None:
        # held weakly, as ProcessPoolExecutor's manager thread holds its executor: an executor
        # dropped without shutdown() is collected, and then its pool closes (_run)
        self._session_ref = weakref.ref(session)
        self._submitter = session.submitter
        self._log_tail = weakref.WeakMethod(session.log_tail)
        self.env = session.env
        self.storage = session.storage
        self.settings = settings
        self.memory_mib = settings.memory_mib(self.env.definition_memory())
        self.run_id = session.run_id
        key = uuid.uuid4().hex[:8]
        self.pool_url = self.storage.url("runs", self.run_id, "warm", key)
        self.pool_name = self.storage.name_of(self.pool_url)
        given = session.submitter.max_workers
        self.max_workers = int(given) if given else max(1, int(self.env.max_vcpus_at_once()
                                                               / settings.vcpus + 1e-9))
        self.window = window_for(self.max_workers)
        self.echo_output = session.submitter.echo_output
        # echo_output="live": the session's LiveTail follows the workers' streams, split by
        # call (warmlive.py); the workers write the markers under this token
        self.live: Optional[warmlive.WarmLive] = None
        if session.live_tail is not None:
            from .livetail import shown  # start-up: only "live" needs it

            self.live = warmlive.WarmLive(uuid.uuid4().hex[:12], self._live_statuses, shown)
        self.spec = sqs_spec_for(self.env)
        # on AWS, the environment's own boto3 session (its profile, its credentials)
        self.sqs, self._sqs_counts = sqsapi.counted(sqsapi.client_for(
            self.spec, session=self.env.session))
        stack = self.env.stack
        tags = {"batchfutures:run": self.run_id, "batchfutures:warm": key,
                **self.env.job_tags()}
        attributes = {"MessageRetentionPeriod": str(MESSAGE_RETENTION),
                      "VisibilityTimeout": str(VISIBILITY_TIMEOUT)}
        base = queue_base(stack, self.run_id, key)
        try:
            self.queue = self.sqs.create_queue(QueueName=f"{base}-work", Attributes=attributes,
                                               tags=tags)["QueueUrl"]
            self.completions = self.sqs.create_queue(QueueName=f"{base}-done",
                                                     Attributes=attributes, tags=tags)["QueueUrl"]
        except Exception as error:
            code = (getattr(error, "response", None) or {}).get("Error", {}).get("Code", "")
            if "AccessDenied" in str(code):
                raise ConfigurationError(
                    f"keepalive= needs SQS queues and this identity may not make them "
                    f"({code}: {error}); the client policy needs sqs:CreateQueue, TagQueue, "
                    f"SendMessage(Batch), ReceiveMessage, DeleteMessage(Batch), DeleteQueue on "
                    f"queues named {base.rsplit('-', 2)[0]}-* (see docs/warm.md)") from error
            raise
        self._initargs_url = (session.submitter._initargs_location()
                              if session.submitter._initargs is not None else None)
        self._files_url = (session.submitter._files_location()  # files=: unpacked by each worker
                           if session.submitter.files is not None else None)
        self._environment: Optional[Any] = None  # requirements=: envbuild.PoolEnvironment
        if settings.requirements is None:
            self._write_config()
        else:  # the config, with the environment's pointer, is written at the first call
            from .envbuild import PoolEnvironment  # start-up: as submission's

            self._environment = PoolEnvironment(self.env, self.storage, settings.requirements,
                                                session.submitter._initargs)
        self._lock = threading.RLock()
        self._numbers = iter(range(1 << 62))
        self._pending: Deque[WarmCall] = collections.deque()
        self._sent: Dict[int, WarmCall] = {}
        # calls settled lately: a retry notice that came after its call's completion (SQS
        # does not keep their order) still goes to its future.attempts
        self._settled: "weakref.WeakValueDictionary[int, WarmCall]" = \
            weakref.WeakValueDictionary()
        self._waiting: set = set()  # futures of calls waiting for their arguments (add_held)
        self._placement: Optional[Any] = None  # retry_on_oom: oomretry.Placement, read once
        self.workers: Dict[str, str] = {}  # job id -> last status seen
        self._delivered: set = set()  # workers that completed a call
        self._failed_starts = 0  # workers in a row that ended before completing any call
        # requests by operation (benchmarks)
        self.requests: collections.Counter = collections.Counter()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batchfutures-warm", daemon=True)
        self._thread.start()
        if self.live is not None:  # followed by the session's one LiveTail, in its budget
            session.live_tail.add_source(self.live.routes)

    # -- set-up ------------------------------------------------------------------------------
    def _write_config(self) -> None:
        settings = self.settings
        memory = self.memory_mib
        config = {"queue": self.queue, "completions": self.completions, "sqs": self.spec,
                  "keepalive": settings.keepalive, "visibility": VISIBILITY_TIMEOUT,
                  "timeout": settings.timeout, "attempts": settings.retries,
                  "initargs": self._initargs_url, "memory_mib": memory,
                  "storage_latency": INJECTED_LATENCY.get("storage", 0),
                  "results_in_messages": warmwire.results_in_messages(
                      self.spec, INJECTED_LATENCY.get("storage", 0)),
                  **serialization.payload_stamp()}
        if self.echo_output:  # the calls' logging records, made at the client's levels
            config["log_levels"] = logforward.client_levels()
        if self.live is not None:  # line-buffered, each call between markers of this token
            config["live"] = self.live.token
        if self._files_url is not None:
            config["files"] = self._files_url
        if self._environment is not None and self._environment.pointer is not None:
            config["environment"] = self._environment.pointer  # activated before any unpickling
        url = f"{self.pool_url}/config"
        storage = self.storage
        storage.put_bytes(url, storage.signer.seal(warmwire.CONFIG_KIND, storage.name_of(url),
                                                   json.dumps(config).encode(),
                                                   root=storage.mac_root))

    def _start_workers(self, count: int) -> None:
        submitter = self._submitter
        request = worker_request(submitter, self.env, self.settings, self.pool_url,
                                 self.run_id, self.memory_mib)
        for _ in range(count):  # exactly once each, with its own submission token
            job_id = batchapi.submit_exactly_once(
                self.env.batch, request, grace=float(self.env.describe_grace),
                budget=submitter.submit_budget,
                keep_waiting=lambda: not self._closed.is_set())["jobId"]
            self.requests["batch:SubmitJob"] += 1
            with self._lock:
                self.workers[job_id] = JobStatus.SUBMITTED.value
            logger.debug("warm pool %s: started worker %s", self.pool_name, job_id)

    # -- calls -------------------------------------------------------------------------------
    def add(self, function_pickle: bytes, encoding: str, blobs: List[bytes],
            counts: List[int], futures: List[List[BatchFuture]], per_child: bool = False,
            first_item: int = 0) -> None:
        """Calls (one per blob) whose futures are ``futures[i]``; sent as the window allows.
        ``first_item``: the map position of the first blob's first item (live output's label)."""
        if self._environment is not None:  # requirements=: before anything of the call is stored
            self._environment.admit(function_pickle, blobs, self._write_config)
        function_url = self.storage.put_function(self.run_id, function_pickle)
        calls = []
        position = first_item
        for blob, count, group in zip(blobs, counts, futures):
            call = self._new_call(function_url, encoding, blob, count, group, per_child)
            if self.settings.retry_on_oom:
                call.parts = (function_pickle, encoding, blob)
            if self.live is not None:  # a map's child by its items, a submit by its number
                self.live.label(call.number, warmlive.label_for(
                    encoding != wire.CALLS, call.number, position, count))
            position += count
            calls.append(call)
        with self._lock:
            self._pending.extend(calls)
        self._pump()

    def _new_call(self, function_url: str, encoding: str, blob: bytes, count: int,
                  group: List[BatchFuture], per_child: bool,
                  key: Optional[Tuple[str, int]] = None) -> WarmCall:
        """A call sealed for this pool (its items inline, or stored when large), its futures
        bound to it; ``key``: where its checkpoints are, when not its own (a resent call's)."""
        storage = self.storage
        number = next(self._numbers)
        sealed = warmwire.encode_call(storage.signer, storage.mac_root, self.pool_name,
                                      number, function_url, encoding, count, blob, key=key)
        if len(sealed) > warmwire.INLINE_LIMIT:
            url = f"{self.pool_url}/calls/{number}"
            storage.put_bytes(url, sealed)
            sealed = warmwire.encode_pointer(storage.signer, storage.mac_root,
                                             self.pool_name, number, url)
        call = WarmCall(self, number, group, count, base64.b64encode(sealed).decode(),
                        per_child)
        call.key = key
        for position, future in enumerate(group):
            future._bind(call, 0)
            future._set_item(position)
        return call

    def resend(self, earlier: WarmCall) -> None:
        """A call killed for memory on another pool, run again here (more memory): its futures
        are running already and move to this pool's call (future.job_id changes)."""
        assert earlier.parts is not None
        function_pickle, encoding, blob = earlier.parts
        if self._environment is not None:
            self._environment.admit(function_pickle, [blob], self._write_config)
        call = self._new_call(self.storage.put_function(self.run_id, function_pickle), encoding,
                              blob, earlier.items, earlier.futures, earlier.per_child,
                              key=earlier.key or (earlier.pool.pool_url, earlier.number))
        call.parts, call.tries, call.resent = earlier.parts, earlier.tries, True
        call.earlier = earlier.attempts_of(0)
        if self.live is not None and earlier.pool.live is not None:  # still the same item
            self.live.label(call.number, earlier.pool.live.label_of(earlier.number))
        with self._lock:
            self._pending.append(call)
        self._pump()

    def add_held(self, held: HeldCall) -> None:
        """A call whose arguments include the futures ``held.upstream``: it waits for them
        here, on the client (not on a worker), then goes to the pool with their results in
        their places; an item whose argument failed or was cancelled is settled as the cold
        path's dependents (DependencyFailedError, or cancelled), the others run."""
        left = [len(held.upstream)]
        with self._lock:
            self._waiting.update(held.futures)

        def one_done(_: Any) -> None:
            with self._lock:
                left[0] -= 1
                if left[0]:
                    return
            try:
                self._release(held)
            except Exception as error:  # SerializationError of a result, the pool shut down
                for future in held.futures:
                    settle(future, False, error)
            finally:  # after it is in _pending: unfinished() sees it all along
                with self._lock:
                    self._waiting.difference_update(held.futures)

        for done in held.upstream:
            done.add_done_callback(one_done)

    def _release(self, held: HeldCall) -> None:
        if all(future.done() for future in held.futures):  # cancelled while it waited
            return
        argument_futures = [futures_among(args, kwargs) for args, kwargs in held.items]
        fates = [item_fate([upstream_state(done) for done in found])
                 for found in argument_futures]
        plan = release_plan(fates, held.per_child)
        if plan == CANCEL:
            held.futures[0].cancel()
            return
        errors: Dict[int, BaseException] = {i: dependency_failure(argument_futures[i])
                                            for i, fate in enumerate(fates) if fate == FAILED}
        if not held.per_child:  # one future per item: each settled apart
            for i, fate in enumerate(fates):
                if fate == CANCELLED:
                    held.futures[i].cancel()
                elif fate == FAILED:
                    settle(held.futures[i], False, errors[i])
        elif plan == NONE:
            outcomes = merged_outcomes(fates, errors, [])
            settle(held.futures[0], True, functools.partial(_same, outcomes))
        if plan == NONE:
            return
        running = [i for i, fate in enumerate(fates) if fate == RUN]
        items = [(tuple(resolved(a) for a in held.items[i][0]),
                  {name: resolved(v) for name, v in held.items[i][1].items()}) for i in running]
        blob = held.pack(items, held.first_item + running[0])
        if self._closed.is_set():
            raise JobAbortedError("the warm pool was shut down while this call waited for its "
                                  "arguments")
        first = held.first_item + running[0]
        if not held.per_child:
            self.add(held.function_pickle, held.encoding, [blob], [len(items)],
                     [[held.futures[i] for i in running]], first_item=first)
        elif plan == SEND:
            self.add(held.function_pickle, held.encoding, [blob], [len(items)],
                     [held.futures], per_child=True, first_item=first)
        else:  # a map child with items that do not run: its outcome merged from a call's
            self.add(held.function_pickle, held.encoding, [blob], [len(items)],
                     [[self._merging(held.futures[0], fates, errors)]], per_child=True,
                     first_item=first)

    def _merging(self, child: BatchFuture, fates: List[str],
                 errors: Dict[int, BaseException]) -> BatchFuture:
        """The future of the call that runs some items of a map child: when it is done, the
        child's future resolves to every item's outcome (merged_outcomes)."""
        part = BatchFuture(self._session_ref())

        def done(_: Any) -> None:
            if part.cancelled():
                child.cancel()
            elif part.exception() is not None:
                settle(child, False, part.exception())
            else:
                outcomes = merged_outcomes(fates, errors, part.result()())
                settle(child, True, functools.partial(_same, outcomes))

        part.add_done_callback(done)
        child.add_done_callback(lambda _: child.cancelled() and part.cancel())
        return part

    def _pump(self) -> None:
        """Send waiting calls while the window has room; start workers the calls need."""
        with self._lock:
            batch: List[WarmCall] = []
            while self._pending and len(self._sent) + len(batch) < self.window:
                call = self._pending.popleft()
                # RUNNING once sent, as ProcessPoolExecutor's call queue; a call whose every
                # future was cancelled is never sent (a cancelled item of a chunk: its
                # outcome is dropped)
                if not call.resent and \
                        not any([f.set_running_or_notify_cancel() for f in call.futures]):
                    continue
                call._status = JobStatus.RUNNABLE.value
                batch.append(call)
                if len(batch) == 10:
                    self._send(batch)
                    batch = []
            if batch:
                self._send(batch)
            live = sum(1 for status in self.workers.values()
                       if status not in (JobStatus.SUCCEEDED.value, JobStatus.FAILED.value))
            start = workers_to_start(live, len(self._sent) + len(self._pending),
                                     self.max_workers)
        if start and not self._closed.is_set():
            self._start_workers(start)

    def _send(self, batch: List[WarmCall]) -> None:
        for call in batch:
            self._sent[call.number] = call
        for part in batches_by_size([len(call.body) for call in batch]):
            self.sqs.send_message_batch(QueueUrl=self.queue, Entries=[
                {"Id": str(i), "MessageBody": batch[i].body} for i in part])
        for call in batch:
            call.body = ""  # sent: the client keeps no copy of the arguments

    # -- the pool's thread -------------------------------------------------------------------
    def _run(self) -> None:
        next_watch = time.monotonic() + WATCH_EVERY
        # completions settled but not deleted yet (completions_to_delete): ten in a request,
        # not one a request in the moment each future is settled and its caller wakes; one
        # left undeleted would come back after the visibility timeout and be ignored
        handled: List[str] = []
        first_handled = 0.0
        while not self._closed.is_set():
            if self._session_ref() is None and not self.unfinished():
                logger.debug("batchfutures: warm pool %s: its executor is gone; closing",
                             self.pool_name)
                self.close()
                return
            try:
                answer = self.sqs.receive_message(QueueUrl=self.completions,
                                                  MaxNumberOfMessages=10,
                                                  WaitTimeSeconds=COMPLETION_WAIT)
                messages = answer.get("Messages", [])
                for message in messages:
                    self._complete(message["Body"])
                if messages and not handled:
                    first_handled = time.monotonic()
                handled.extend(m["ReceiptHandle"] for m in messages)
                while completions_to_delete(len(handled), bool(messages),
                                            time.monotonic() - first_handled):
                    self._delete_completions(handled[:10])
                    del handled[:10]
                    first_handled = time.monotonic()
                if messages and self._pending:
                    self._pump()
                if time.monotonic() >= next_watch and self.workers:
                    self._watch()
                    next_watch = time.monotonic() + WATCH_EVERY
            except Exception as error:
                if self._closed.is_set() or sqsapi.is_queue_gone(error):
                    return
                logger.warning("batchfutures: warm pool %s: %s", self.pool_name, error)
                time.sleep(0.5)

    def _delete_completions(self, handles: List[str]) -> None:
        self.sqs.delete_message_batch(QueueUrl=self.completions, Entries=[
            {"Id": str(i), "ReceiptHandle": handle} for i, handle in enumerate(handles)])

    def _complete(self, body: str) -> None:
        try:
            completion = warmwire.read_completion(body)
        except (ValueError, KeyError, TypeError):
            logger.warning("batchfutures: warm pool %s: a malformed completion was dropped",
                           self.pool_name)
            return
        number, worker, sealed = completion.number, completion.worker, completion.result
        with self._lock:
            call = self._sent.get(number) if completion.retry else self._sent.pop(number, None)
        if completion.retry:  # an attempt ended, the call goes on (its message comes back)
            call = call or self._settled.get(number)
            if call is not None and completion.attempt is not None and completion.receives:
                call.reported.setdefault(completion.receives, completion.attempt)
            return
        if call is None:  # a duplicate (a call completed again by a later holder)
            return
        self._settled[number] = call
        storage = self.storage
        url = storage.result_url(self.pool_url, number)
        data: Any
        try:
            if sealed is not None:
                data = storage.signer.unseal("result", storage.name_of(url), sealed,
                                             root=storage.mac_root)
            else:
                data = storage.read_result(self.pool_url, number)
        except Exception as error:  # IntegrityError: nothing of it is unpickled
            data = error
        call.worker = worker
        if completion.attempt is not None and completion.receives:
            call.reported[completion.receives] = completion.attempt
        if worker is not None:
            with self._lock:
                self._delivered.add(worker)
                self._failed_starts = 0
        if isinstance(data, BaseException) or data is None:
            failure = data if data is not None else RuntimeError(f"warm call {number}: no result")
            call._status = JobStatus.FAILED.value
            for future in call.futures:
                settle(future, False, failure)
            return
        call.output = wire.result_output(data)
        call.usage = list(wire.result_usage(data) or [])
        decoded = decode_result(data, call.items)
        if completion.attempt is not None and completion.receives:  # named by its outcome
            call.reported[completion.receives] = _with_reason(completion.attempt, decoded)
        if call.parts is not None and self._retried_for_memory(call, decoded):
            return
        call._status = JobStatus.SUCCEEDED.value if all(ok for ok, _ in decoded) \
            else JobStatus.FAILED.value
        # live: a call streamed while it ran is not echoed (its records were replayed in order
        # with its prints, from the stream)
        if self.echo_output and (self.live is None or self.live.echo_at_end(number, worker)):
            for position in sorted(call.output):
                wire.echo_output(call.output[position])
        if call.per_child:
            settle(call.futures[0], True, functools.partial(_same, decoded))
            return
        for future, (ok, value) in zip(call.futures, decoded):
            settle(future, ok, value)

    def _retried_for_memory(self, call: WarmCall, decoded: List[Any]) -> bool:
        """retry_on_oom: a call killed for memory (every item's outcome MemoryLimitExceeded:
        its process died) goes to the pool of the settings with more memory (oomretry.decide,
        as a cold job's child), or fails naming its tries. True when it was handled here."""
        # start-up: oomretry costs ~2.8 ms on a warm pool's start; only retry_on_oom needs it
        from . import oomretry

        errors = [value for ok, value in decoded if not ok]
        if not errors or len(errors) != len(decoded) or \
                not all(isinstance(error, MemoryLimitExceeded) for error in errors):
            return False
        tries = call.tries + (oomretry.Try(self.memory_mib, call.worker or ""),)
        if self._placement is None:
            self._placement = oomretry.placement_of(self.env)
        decision = oomretry.decide([t.memory_mib for t in tries], self.settings.retry_on_oom,
                                   self._placement, self.settings.vcpus)
        call._status = JobStatus.FAILED.value
        failure: BaseException
        if decision.verdict is oomretry.Verdict.GIVE_UP:
            failure = oomretry.final_error(errors[0], tries, decision.why)
        else:
            session = self._session_ref()
            try:
                if session is None:
                    raise JobAbortedError("the executor is gone: no retry with more memory")
                call.tries = tries
                session.warm_pool(oom_retry_settings(self.settings, decision)).resend(call)
                logger.info("batchfutures: warm call killed for memory at %d MiB; again with "
                            "%d MiB (retry_on_oom)", self.memory_mib, decision.memory_mib)
                return True
            except Exception as error:  # the executor shut down: the kill stands
                failure = oomretry.final_error(errors[0], tries, str(error))
        for future in call.futures:
            settle(future, False, failure)
        return True

    def _live_statuses(self) -> Dict[str, str]:
        """The workers' last statuses (the pool's watch), none once the pool is closed."""
        with self._lock:
            return {} if self._closed.is_set() else dict(self.workers)

    def _live_workers(self) -> List[str]:
        with self._lock:
            return [job for job, status in self.workers.items()
                    if status not in (JobStatus.SUCCEEDED.value, JobStatus.FAILED.value)]

    def _watch(self) -> None:
        ids = self._live_workers()
        if not ids:
            return
        found = batchapi.describe_jobs(self.env.batch, ids)
        self.requests["batch:DescribeJobs"] += (len(ids) + 99) // 100
        failed = []
        with self._lock:
            for job in found:
                self.workers[job["jobId"]] = job["status"]
                if job["status"] == JobStatus.FAILED.value:
                    logger.warning("batchfutures: warm worker %s ended: %s", job["jobId"],
                                   job.get("statusReason"))
                    if job["jobId"] not in self._delivered:
                        failed.append(job)
        for job in failed:  # a worker that never completed a call: it may not start at all
            self._failed_starts += 1
            if self._failed_starts >= MAX_FAILED_STARTS:
                self._give_up(job)
        self._pump()  # replace the workers that ended while calls wait

    def _give_up(self, job: Dict[str, Any]) -> None:
        """Workers keep failing before any call completes (a broken image, a missing key...):
        the calls waiting fail with the last one's typed error, instead of new workers being
        started for ever. A later call tries again."""
        try:
            log_tail = self._log_tail()
            tail = log_tail(job) if log_tail is not None else None
        except Exception:  # the log may be gone; the reason is still there
            tail = None
        error = classify_failure(job, log_tail=tail)
        with self._lock:
            calls = list(self._pending) + list(self._sent.values())
            self._pending.clear()
            self._sent.clear()
            self._failed_starts = 0
        logger.error("batchfutures: %d warm workers in a row ended before completing a call; "
                     "failing the %d call(s) waiting: %s", MAX_FAILED_STARTS, len(calls), error)
        for call in calls:
            call._status = JobStatus.FAILED.value
            for future in call.futures:
                settle(future, False, error)

    @property
    def sqs_requests(self) -> "collections.Counter[str]":
        """The client's SQS requests by operation (its workers count their own)."""
        return self._sqs_counts.counts

    # -- the end -----------------------------------------------------------------------------
    def unfinished(self) -> List[BatchFuture]:
        with self._lock:
            calls = list(self._pending) + list(self._sent.values())
            waiting = list(self._waiting)
        return [f for call in calls for f in call.futures if not f.done()] + \
            [f for f in waiting if not f.done()]

    def cancel_waiting(self) -> None:
        with self._lock:
            waiting, self._pending = list(self._pending), collections.deque()
            dependents = list(self._waiting)
        for call in waiting:
            for future in call.futures:
                future.cancel()
        for future in dependents:  # waiting for their arguments: never sent
            future.cancel()

    def close(self, *, stop_running: str = "") -> None:
        """Delete the queues and stop the workers; with ``stop_running`` (a reason), the calls
        still unfinished fail with JobAbortedError."""
        if self._closed.is_set():
            return
        self._closed.set()
        if stop_running:
            self.cancel_waiting()
            stopped = JobAbortedError(f"the warm worker running this call was stopped: "
                                      f"{stop_running}", status_reason=stop_running)
            for future in self.unfinished():
                settle(future, False, stopped)
        for url in (self.queue, self.completions):
            try:
                self.sqs.delete_queue(QueueUrl=url)
            except Exception as error:
                if not sqsapi.is_queue_gone(error):
                    logger.warning("batchfutures: could not delete the queue %s: %s", url, error)
        ids = self._live_workers()
        if ids and not stop_running:  # idle workers leave on their own once the queue is gone
            deadline = time.monotonic() + SHUTDOWN_GRACE
            while ids and time.monotonic() < deadline:
                time.sleep(0.05)
                for job in batchapi.describe_jobs(self.env.batch, ids):
                    with self._lock:
                        self.workers[job["jobId"]] = job["status"]
                ids = self._live_workers()
        if ids:
            failed = batchapi.stop_jobs(self.env.batch, batchapi.Stop.TERMINATE, ids,
                                        "batchfutures: the warm pool was shut down",
                                        attempts=2, max_delay=2.0)
            for job_id, problem in failed.items():
                logger.warning("batchfutures: could not stop warm worker %s: %s", job_id, problem)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=COMPLETION_WAIT + 1)


def _same(value: Any) -> Any:
    return value


def _with_reason(attempt: Any, decoded: List[Tuple[bool, Any]]) -> Any:
    """The last attempt, its reason the exception it ended with (the first item's that
    failed), when the worker gave none."""
    failed = next((value for ok, value in decoded if not ok), None)
    if attempt.reason is not None or failed is None:
        return attempt
    return attempt._replace(reason=f"{type(failed).__name__}: {failed}")
