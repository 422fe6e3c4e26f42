"""The job-state core an executor and its settings views share.

    BatchExecutor ──submit──> Coalescer (coalescer.py): buffers of calls per settings
          │                        │ closed by time, size, result()/log(), shutdown, exit
          │──map slices──┐         v
          │              └──> Submitter (submission.py): uploads, SubmitJob (build_request),
          │                        │ max_workers pacing; a TrackedJob per Batch job
          │                        v
          └─ futures <──────── Poller (poller.py): the one thread that reads Batch and storage
                                   and settles the futures; its loop also closes due buffers,
                                   submits paced children and sends queued cancellations

A Session owns the environment, storage, run id and those three parts, and what concerns
futures the user touches: cancel and abort, attach, logs, shutdown, Ctrl-C and interpreter
exit. Executors are thin layers that hold a Session and a JobSettings.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import platform
import sys
import threading
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple

from . import batchapi, logs, retrypolicy, serialization, shipfiles, wire
from .batchlimits import MAX_ARRAY_SIZE
from .cache import CallCache, has_future
from .coalescer import Coalescer
from .dependencies import MAX_DEPENDENCIES, FutureRef, substitute_call
from .dryrun import DryRunEnvironment, DryRunTracker, RecordingStorage
from .errors import (
    ABORT_REASON_PREFIX,
    ConfigurationError,
    DependencyFailedError,
    JobAbortedError,
    JobMetadataExpired,
)
from .futures import BatchFuture
from .jobs import TrackedJob, settle
from .livetail import LiveTail
from .poller import LOG_TAIL_LINES, Poller
from .retrypolicy import Retries
from .settings import JobSettings
from .statuses import JobStatus
from .submission import (
    RETRY_RULES,
    PendingJob,
    Submitter,
    fail_all,
    job_name_for,
)

if TYPE_CHECKING:
    from .environments import Environment

__all__ = ["Session", "RETRY_RULES", "job_name_for"]

logger = logging.getLogger("batchfutures")

PACING_RECHECK = 1.0  # with max_workers: look at free workers at least this often

_live_sessions: "weakref.WeakSet[Session]" = weakref.WeakSet()
_interpreter_exiting = False


def _at_interpreter_exit() -> None:
    """As concurrent.futures does: buffered calls are sent, local jobs are waited for."""
    global _interpreter_exiting
    _interpreter_exiting = True
    for session in list(_live_sessions):
        try:
            session.finish_at_exit()
            if session.live_tail is not None:  # echo_output="live": the last lines of the
                session.live_tail.stop()  # calls streamed (never echoed as they resolve)
        except Exception:  # one session must not keep the others' calls from being sent
            logger.exception("batchfutures: could not finish an executor at interpreter exit")


# Runs before non-daemon threads are joined and before atexit handlers (the emulator closes in
# one), as concurrent.futures.process registers its own exit hook.
_register_atexit = getattr(threading, "_register_atexit", None)
if _register_atexit is not None:
    _register_atexit(_at_interpreter_exit)
else:  # pragma: no cover - Python without threading._register_atexit
    import atexit

    atexit.register(_at_interpreter_exit)


def _weak_wake(poller: Poller, unsubscribe: Callable[[Callable[[], None]], None]
               ) -> Callable[[], None]:
    """The process-wide emulator's callback: wakes the poller while it lives, then removes
    itself, so an executor no longer used is not kept alive (nor woken) by the emulator."""
    reference = weakref.ref(poller)

    def wake() -> None:
        target = reference()
        if target is not None:
            target.wake()
        else:
            unsubscribe(wake)

    return wake


_cleaned_workdirs: set = set()
_cleaned_lock = threading.Lock()


def _clean_local_storage_once(env: Environment) -> None:
    """Local payloads stay bounded: once per process and workdir, in the background, finished
    runs older than BATCHFUTURES_LOCAL_RETENTION_DAYS (default 7) are removed (cleanup.py).
    On AWS the template's lifecycle rule expires them instead."""
    if not env.is_local or env.workdir is None:
        return
    with _cleaned_lock:
        if env.workdir in _cleaned_workdirs:
            return
        _cleaned_workdirs.add(env.workdir)
    # start-up: cleanup costs ~1.7 ms, which a session on AWS never needs
    from .cleanup import remove_finished_runs

    threading.Thread(target=remove_finished_runs, args=(env,), name="batchfutures-cleanup",
                     daemon=True).start()


def settle_cached(future: BatchFuture, outcome: Tuple[bool, Any]) -> None:
    """A call found in the cache: resolved from the stored result, without a job."""
    future._mark_cached()
    if outcome[0]:
        future._update(JobStatus.SUCCEEDED)
    settle(future, *outcome)


def _where(future: BatchFuture) -> Tuple[str, Optional[int]]:
    """Where a future's result is: its Batch job's URL and its child ("" before submission)."""
    bound = future._bound()
    if bound is None or not isinstance(bound.job, TrackedJob):
        return "", None
    return bound.job.job_url, bound.child


def _job_id(future: BatchFuture) -> Optional[str]:
    """The id of the Batch job (the array's, not the child's) a future is bound to."""
    bound = future._bound()
    return bound.job.job_id if bound is not None and isinstance(bound.job, TrackedJob) else None


def _forget_upstream(future: "concurrent.futures.Future[Any]") -> None:
    if isinstance(future, BatchFuture):
        future._forget_upstream()


class Upstream:
    """The futures a call (or a map child) takes as arguments, turned into FutureRefs.

    A future still in a coalescing buffer is sent first (it needs a job id); one already
    succeeded needs no dependency (its result is in storage); one that failed or was cancelled
    decides the dependent's fate at once.
    """

    def __init__(self, session: "Session") -> None:
        self._session = session
        self.unfinished: Dict[str, Any] = {}  # job id -> TrackedJob, for dependsOn
        self.pairs: set = set()  # (job id, child) of every reference
        self.futures_by_child: Dict[Optional[int], List[BatchFuture]] = {}  # None: a submit
        self.failed: Optional[BatchFuture] = None
        self.cancelled = False
        self.child: Optional[int] = None  # map: the child whose items are being read
        self.pairs_by_child: Dict[int, set] = {}  # map: child -> upstream children it reads

    def replace(self, value: Any) -> Optional[FutureRef]:
        if not isinstance(value, BatchFuture):
            return None
        if value._core is not self._session:
            raise ConfigurationError("a future passed as an argument must come from the same "
                                     "executor (or one of its with_settings views)")
        if value._bound() is None and not value.done():
            self._session.flush_for(value)  # buffered: send it now, it needs a job id
        bound = value._bound()  # job and child read together: a rebind moves both
        if value.cancelled():
            self.cancelled = True
        elif value.done() and value.exception() is not None:
            self.failed = self.failed or value
        if bound is None:
            if self.cancelled or self.failed is not None:
                return FutureRef("", 0, 0, "")
            raise ConfigurationError(
                "a future passed as an argument was not submitted yet (held back by "
                "max_workers); wait for its job_id before passing it on")
        job, child = bound
        if not isinstance(job, TrackedJob):
            raise ConfigurationError(
                "a future of a warm call (keepalive=) was passed to a call that runs as a Batch "
                "job of its own: pass its result() instead, or run both on warm workers")
        self.futures_by_child.setdefault(self.child, []).append(value)
        self.pairs.add((job.job_id, child))
        if self.child is not None:
            self.pairs_by_child.setdefault(self.child, set()).add(child)
        if not value.done():
            self.unfinished[job.job_id] = job
            if len(self.unfinished) > MAX_DEPENDENCIES:
                raise ConfigurationError(
                    f"a call may depend on at most {MAX_DEPENDENCIES} Batch jobs (Batch's limit); "
                    f"gather the inputs in one map_futures call, or wait for some first")
        return FutureRef(job.job_url, child, value._item or 0, job.child_id(child),
                         nodes=job.nodes)

    def settle_dependent(self, future: BatchFuture) -> None:
        """The dependent's fate when an argument already failed or was cancelled."""
        if self.cancelled:
            future.cancel()
            return
        failed = self.failed
        assert failed is not None
        cause = failed.exception()
        error = DependencyFailedError(
            f"an argument of this call is the result of {failed.job_id}, which failed: {cause!r}",
            job_id=failed.job_id, status_reason="a dependency failed")
        error.__cause__ = cause
        settle(future, False, error)

    def cancel_with_upstream(self, dependents: List[BatchFuture], child: Optional[int] = None) -> None:
        """Cancelling an upstream future cancels what depends on it (a submit, or map child)."""
        def cancel(done: "concurrent.futures.Future[Any]") -> None:
            if done.cancelled():
                for dependent in dependents:
                    dependent.cancel()

        for upstream in self.futures_by_child.get(child, ()):
            if not upstream.done():
                upstream.add_done_callback(cancel)

    def remember(self, future: BatchFuture, child: Optional[int] = None) -> None:
        """The dependent keeps its upstream futures while it waits, so that Batch's "Dependent
        Job failed" becomes DependencyFailedError with the upstream's exception as cause, or,
        when the upstream was retried, a rerun once it is done (reruns.py)."""
        upstream = self.futures_by_child.get(child)
        if upstream:
            # where each one's result is as its FutureRef says: a rerun redirects moved ones
            future._set_upstream(upstream, [_where(u) for u in upstream])
            future.add_done_callback(_forget_upstream)

    def depends_on(self, size: int) -> List[Dict[str, str]]:
        """dependsOn for a job of ``size`` children whose child i referenced ``pairs``."""
        if not self.unfinished:
            return []
        if len(self.unfinished) == 1 and size > 1:
            (job_id, job), = self.unfinished.items()
            if job.size == size and all(j == job_id for j, _ in self.pairs) and \
                    self.pairs_by_child == {i: {i} for i in range(size)}:
                return [{"jobId": job_id, "type": "N_TO_N"}]
        return [{"jobId": job_id} for job_id in sorted(self.unfinished)]


# CPython 3.12.0 to 3.12.2 refuse to start threads once the interpreter exits, also in the
# threading atexit hooks where concurrent.futures (and finish_at_exit) run (gh-113964)
THREADS_REFUSED_AT_EXIT = (3, 12, 0) <= sys.version_info[:3] < (3, 12, 3)


class Session:
    """What an executor and its views share: environment, storage, run, the three parts."""

    def __init__(self, env: Environment, *, max_workers: Optional[int] = None,
                 initializer: Optional[Callable[..., Any]] = None, initargs: tuple = (),
                 ship_local_modules: bool = True, dry_run: bool = False,
                 echo_output: bool = True, cache: bool = False,
                 files: Optional[bytes] = None, live: bool = False) -> None:
        self.env = env
        self.dry_run = dry_run
        self.storage = env.storage
        self.by_value = ship_local_modules
        self.run_id = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:10]
        # pickled now: an initializer that cannot travel fails here, not at the first submit.
        # The initializer travels in each function's pickle (pickle_function: one namespace in
        # the worker), its initargs once per session (Submitter, header "initargs").
        self.initializer = initializer
        pickled_initargs = None
        if initializer is not None:
            serialization.dumps(initializer, what=f"the initializer {initializer!r}",
                                by_value=ship_local_modules)
            pickled_initargs = serialization.dumps(
                tuple(initargs), what=f"the initargs of the initializer {initializer!r}",
                by_value=ship_local_modules)
        min_interval, max_interval = env.poll_intervals
        # the poller holds this session weakly; its other collaborators are given to it
        self.poller = Poller(self, batch=lambda: env.batch,  # made at the first round
                             storage=self.storage, log_tail=self.log_tail,
                             min_interval=min_interval, max_interval=max_interval,
                             grace=env.describe_grace)
        self.coalescer = Coalescer(MAX_ARRAY_SIZE)
        submit_env: Environment = env
        track: Callable[[TrackedJob], None] = self.poller.track
        if dry_run:  # the same submission path, recorded: nothing reaches Batch or storage
            dry_env, recording = DryRunEnvironment(env), RecordingStorage(self.storage.root_url)
            submit_env, self.storage = dry_env, recording
            track = DryRunTracker(dry_env, recording).track
        self.submitter = Submitter(submit_env, self.storage, self.run_id, track=track,
                                   wake=self.poller.wake, max_workers=max_workers,
                                   initargs=pickled_initargs, echo_output=echo_output)
        self.submitter.files = files  # files=: shipfiles.pack's archive, or None
        # echo_output="live": running calls' output streamed from their logs (livetail.py)
        self.live_tail: Optional[LiveTail] = None
        if live and not dry_run:
            self.live_tail = LiveTail(env, lambda: self.poller.outstanding)
            self.submitter.live_tail = self.live_tail
            self.live_tail.start()
        self.cache: Optional[CallCache] = None
        if cache:
            # reads from the real storage, also in a dry run (what would come from the cache)
            self.cache = CallCache(env.storage, definition=env.planned_definition(),
                                   by_value=ship_local_modules,
                                   initargs=shipfiles.cache_part(pickled_initargs, files),
                                   dry_run=dry_run)
            self.submitter.before_submit = self.cache.write_index
        self._lock = threading.RLock()
        self.warm_pools: Dict[JobSettings, Any] = {}  # keepalive > 0: warmpool.WarmPool each
        self._cancelled_at_shutdown = False
        self.closed = False
        _live_sessions.add(self)
        if not dry_run:
            _clean_local_storage_once(env)
        if not dry_run:  # the emulator wakes the poller at every change; AWS says nothing
            env.subscribe(_weak_wake(self.poller, env.unsubscribe))

    @property
    def submitted_jobs(self) -> List[str]:
        return self.submitter.submitted_jobs

    def pickle_function(self, fn: Callable, retry_policy: Optional[Retries] = None) -> bytes:
        """``fn``'s pickle as the worker loads it: with an initializer, both in one dumps, so
        they share one module namespace there (serialization.dumps_function); under a Retries
        policy that lists exceptions, as retrypolicy.Retrying (the worker's retry decision)."""
        return serialization.dumps_function(retrypolicy.wrap(fn, retry_policy), self.initializer,
                                            by_value=self.by_value)

    # -- submit and coalescing ---------------------------------------------------------------
    def submit(self, settings: JobSettings, fn: Callable, args: tuple, kwargs: dict) -> BatchFuture:
        self._check_open()
        if self._warm(settings):  # futures among the arguments: awaited on the client
            from .warmpool import submit_warm  # start-up: as _warm's

            return submit_warm(self, settings, fn, args, kwargs)
        upstream = Upstream(self)
        cacheable = self.cache is not None and settings.nodes == 1 and not any(
            has_future(value) for value in (*args, *kwargs.values()))
        args, kwargs = substitute_call(args, kwargs, upstream.replace)
        future = BatchFuture(self)
        if upstream.cancelled or upstream.failed is not None:
            upstream.settle_dependent(future)
            return future
        if settings.nodes > 1:  # never coalesced: one multi-node parallel job per call
            self._submit_multinode(settings, fn, args, kwargs, future, upstream)
            return future
        key = (settings, tuple(sorted(upstream.unfinished)))
        # SerializationError now, before anything is uploaded
        pickled = self.coalescer.known_pickle(key, fn) or \
            self.pickle_function(fn, settings.retry_policy)
        wire.pack_items([(0, args, kwargs)], by_value=self.by_value)
        if cacheable and self._follow_or_register(settings, pickled, args, kwargs, future):
            return future
        upstream.remember(future)
        with self._lock:
            self._check_open()
            full = self.coalescer.add(key, (future, fn, args, kwargs), pickled)
        upstream.cancel_with_upstream([future])
        if full:
            self.flush(key)
        else:
            self.poller.start()
            self.poller.wake()
        return future

    def _follow_or_register(self, settings: JobSettings, pickled: bytes, args: tuple,
                            kwargs: dict, future: BatchFuture) -> bool:
        """cache=True: True when ``future`` follows an identical call in flight (nothing to
        send); else it is the call others follow, found in storage or run at flush."""
        cache = self.cache
        assert cache is not None
        function_digest = cache.function_digest(pickled)
        digest = cache.call_digest(function_digest, settings, args, kwargs)
        leader = cache.leader(digest)
        if leader is not None:
            cache.follow(leader, functools.partial(cache.settle_follower, future))
            return True
        future._set_cache_key((function_digest, (digest,)))
        cache.register([(digest, None)], future)
        return False

    def _from_cache(self, calls: List[Any]) -> List[Any]:
        """The calls of a flushed buffer not found in the cache; the others are settled."""
        cache = self.cache
        if cache is None:
            return calls
        by_function: Dict[str, List[int]] = {}
        for i, (future, _fn, _args, _kwargs) in enumerate(calls):
            if future._cache_key is not None:
                by_function.setdefault(future._cache_key[0], []).append(i)
        found: Dict[int, bytes] = {}
        for function_digest, indices in by_function.items():
            cache.refresh(function_digest)
            hits = cache.lookup(function_digest, [calls[i][0]._cache_key[1][0] for i in indices])
            found.update((indices[k], encoded) for k, encoded in hits.items())
        for i, encoded in found.items():
            settle_cached(calls[i][0], cache.hit_outcome(encoded))
        return [call for i, call in enumerate(calls) if i not in found]

    def _submit_multinode(self, settings: JobSettings, fn: Callable, args: tuple, kwargs: dict,
                          future: BatchFuture, upstream: Upstream) -> None:
        """One Batch multi-node job for this call alone: one child, run on every node."""
        pickled = self.pickle_function(fn)  # SerializationError now
        blob = wire.pack_items([(0, args, kwargs)], by_value=self.by_value)
        upstream.cancel_with_upstream([future])
        self.submit_job(PendingJob(settings, [pickled], [blob], [1], [[future]], chunksize=1,
                                   name=job_name_for(fn),
                                   depends_on=[{"jobId": j} for j in sorted(upstream.unfinished)]))

    def _warm(self, settings: JobSettings) -> bool:
        """keepalive > 0 runs calls on warm workers (warmpool.py), except what needs jobs."""
        if not settings.keepalive:
            return False
        # start-up: warmpool (sqsapi, warmwire) costs ~1.3 ms; only keepalive= needs it
        from .warmpool import runs_warm

        return runs_warm(settings)

    def warm_pool(self, settings: JobSettings) -> Any:
        """The warm workers of ``settings`` (made at their first call)."""
        with self._lock:
            self._check_open()
            pool = self.warm_pools.get(settings)
            if pool is None:
                from .warmpool import WarmDryRun, WarmPool  # start-up: as _warm's

                pool = self.warm_pools[settings] = (WarmDryRun if self.dry_run
                                                    else WarmPool)(self, settings)
            return pool

    def _warm_unfinished(self) -> List[BatchFuture]:
        return [f for pool in list(self.warm_pools.values()) for f in pool.unfinished()]

    def _close_warm(self, stop_running: str = "") -> None:
        for pool in list(self.warm_pools.values()):
            try:
                pool.close(stop_running=stop_running)
            except Exception:  # one pool must not keep the others' workers running
                logger.exception("batchfutures: could not close a warm pool")

    def submit_job(self, job: PendingJob) -> None:
        """A map slice: submitted now, or paced under max_workers."""
        if self._warm(job.settings) and not job.depends_on and len(job.function_pickles) == 1:
            self.warm_pool(job.settings).add(job.function_pickles[0], job.encoding, job.blobs,
                                             job.item_counts, job.futures, job.per_child)
            return
        self.poller.start()
        self.submitter.submit(job)

    def has_pending(self) -> bool:
        return self.coalescer.pending() or self.submitter.has_waiting()

    def next_flush_delay(self) -> float:
        if self.submitter.has_waiting():  # woken when a paced child finishes; a safety net
            return min(PACING_RECHECK, self.coalescer.next_delay())
        return self.coalescer.next_delay()

    def flush_due(self) -> None:
        """On the poller thread: send the buffers whose window closed, and paced children."""
        self.submitter.submit_paced()
        for key in self.coalescer.due():
            self.flush(key)

    def flush_all(self) -> None:
        for key in self.coalescer.all():
            self.flush(key)

    def flush_for(self, future: BatchFuture) -> None:
        """Send the buffer holding ``future`` now: its caller is waiting for it."""
        if future._bound() is not None:
            return
        key = self.coalescer.holding(future)
        if key is not None:
            self.flush(key)

    def flush(self, key: Tuple[JobSettings, Tuple[str, ...]]) -> None:
        settings, depends_on = key
        batch = self.coalescer.take(key)
        if batch is None:
            return
        calls = [call for call in batch.calls if not call[0].done()]  # skip cancelled, aborted
        pickles = batch.pickles
        del batch
        try:
            calls = self._from_cache(calls)
        except BaseException as error:  # the futures carry the failure; nobody waits in vain
            fail_all([[call[0]] for call in calls], error)
            if not isinstance(error, Exception):
                raise
            return
        if not calls:
            return
        function_pickles: List[bytes] = []
        index_of: Dict[int, int] = {}
        blobs: List[bytes] = []
        futures: List[List[BatchFuture]] = []
        for future, fn, args, kwargs in calls:  # one child per call
            if id(fn) not in index_of:
                index_of[id(fn)] = len(function_pickles)
                function_pickles.append(pickles[id(fn)][1])
            blobs.append(wire.pack_items([(index_of[id(fn)], args, kwargs)],
                                                  by_value=self.by_value))
            futures.append([future])
        name = job_name_for(calls[0][1])
        del calls, pickles  # the callables and arguments now live only in their pickles
        try:
            self.submitter.submit(PendingJob(settings, function_pickles, blobs, [1] * len(blobs),
                                             futures, chunksize=1, name=name,
                                             depends_on=[{"jobId": j} for j in depends_on]))
        except BaseException as error:  # the futures carry the failure; nobody waits in vain
            fail_all(futures, error)
            if not isinstance(error, Exception):
                raise

    # -- results, logs, cancel, abort --------------------------------------------------------
    # the log reader is batchfutures.logs; these keep the poller's and the futures' calls
    def log_stream(self, description: Dict[str, Any]) -> Optional[str]:
        return logs.log_stream(description)

    def log_group(self, description: Dict[str, Any]) -> str:
        return logs.log_group_of(description, self.env.log_group)

    def log_tail(self, description: Mapping[str, Any]) -> Optional[str]:
        description = self._main_node_of(dict(description))
        return logs.job_log_tail(self.env.logs, description, self.env.log_group,
                                 lines=LOG_TAIL_LINES)

    def _main_node_of(self, description: Dict[str, Any]) -> Dict[str, Any]:
        """A multi-node job's parent has no container: its log is its main node's."""
        properties = description.get("nodeProperties")
        if not properties or "mainNode" not in properties or "#" in str(description.get("jobId")):
            return description
        main = f"{description.get('jobId')}#{properties['mainNode']}"
        found = batchapi.describe_jobs(self.env.batch, [main])
        return found[0] if found else description

    def read_log(self, future: BatchFuture) -> str:
        bound = future._bound()
        kept = bound.job.log_text(future._item or 0) if bound is not None else None
        if kept is not None:  # a warm call: its own output, as its worker kept it
            return kept
        job_id = future.job_id
        if job_id is None:
            return ""
        found = batchapi.describe_jobs(self.env.batch, [job_id])
        if not found:
            raise JobMetadataExpired(f"Batch no longer knows job {job_id}; its log is gone with it",
                                     job_id=job_id)
        return logs.job_log(self.env.logs, self._main_node_of(found[0]), self.env.log_group)

    def on_cancelled(self, future: BatchFuture) -> None:
        """A future was cancelled: the poller thread cancels its remote child (in bulk)."""
        self.poller.request_cancel(future)

    def abort(self, future: BatchFuture, reason: str) -> bool:
        """Fail the future as aborted now; the poller thread sends TerminateJob."""
        return self.poller.request_abort(future, reason)

    # -- attach ------------------------------------------------------------------------------
    def attach(self, job_id: str) -> List[BatchFuture]:
        parent_id, _, child = job_id.partition(":")
        found = batchapi.describe_jobs(self.env.batch, [parent_id])
        job_url = None
        if found:
            command = (found[0].get("container") or {}).get("command") or []
            job_url = command[-1] if command else None
        if job_url is None:
            job_url = self.storage.read_job_pointer(parent_id)
        if job_url is None:
            raise JobMetadataExpired(
                f"Batch does not know job {parent_id} and storage has no record of it", job_id=job_id)
        header = self.storage.read_header(job_url)
        children, items, chunksize = header["children"], header["items"], header["chunksize"]
        futures = [
            [BatchFuture(self) for _ in range(min(chunksize, items - i * chunksize))]
            for i in range(children)
        ]
        follow = None
        if child:
            wanted = int(child)
            if not 0 <= wanted < children:
                raise ConfigurationError(f"job {parent_id} has no child {wanted}")
            follow = [wanted]
            selected = futures[wanted]
        else:
            selected = [f for group in futures for f in group]
        job = TrackedJob(parent_id, job_url, futures, array=children > 1, follow=follow,
                         submitted_at=time.monotonic() - 1e9,  # no grace: the job is old
                         nodes=int(header.get("nodes", 1)))
        self.poller.track(job)
        return selected

    # -- shutdown ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if _interpreter_exiting:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        if self.closed:
            raise RuntimeError("cannot schedule new futures after shutdown")

    def _unfinished_futures(self) -> List[BatchFuture]:
        waiting = self.submitter.waiting_futures()
        tracked = [f for job in self.poller.outstanding for f in job.futures()]
        return [f for f in waiting + tracked if not f.done()]

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        with self._lock:
            self.closed = True
        if cancel_futures:
            self._cancelled_at_shutdown = True
            for future in self.coalescer.futures() + self.submitter.drop_waiting():
                future.cancel()  # never sent: nothing remote to cancel
            for future in self._unfinished_futures():
                future.cancel()
            for pool in list(self.warm_pools.values()):
                pool.cancel_waiting()
        self.flush_all()
        if wait:
            # a KeyboardInterrupt here propagates: Ctrl-C is never swallowed
            concurrent.futures.wait(self._unfinished_futures() + self._warm_unfinished())
            self._close_warm()
        elif self.warm_pools:  # the workers go once the calls sent are done
            def close_when_done() -> None:
                concurrent.futures.wait(self._warm_unfinished())
                self._close_warm()

            threading.Thread(target=close_when_done, name="batchfutures-warm-close",
                             daemon=True).start()
        if self.live_tail is not None:  # the ended calls' last lines, then no more rounds
            self.live_tail.stop(wait=wait)
        self.poller.stop(wait=wait)

    def interrupt(self) -> None:
        """Ctrl-C left the executor: stop every unfinished job of this session, promptly.

        Calls not yet sent are cancelled; jobs Batch has are cancelled (not started) or
        terminated (running), one call per Batch job; the job ids are logged once.
        """
        with self._lock:
            self.closed = True
        self._cancelled_at_shutdown = True
        for future in self.coalescer.clear() + self.submitter.drop_waiting():
            future.cancel()
        self._close_warm("the client was interrupted (KeyboardInterrupt)")
        self._stop_jobs("interrupted",
                        f"{ABORT_REASON_PREFIX} interrupted by the client (KeyboardInterrupt)",
                        "the client was interrupted")

    def terminate(self, how: str) -> None:
        """``terminate_workers()``/``kill_workers()`` (``how``): every unfinished call fails
        with JobAbortedError now, one TerminateJob per unfinished Batch job, and the session
        is shut down. Calls not sent yet are never sent (they fail the same way)."""
        with self._lock:
            self.closed = True
        self._cancelled_at_shutdown = True
        reason = f"{ABORT_REASON_PREFIX} {how}() was called"
        for future in self.coalescer.clear() + self.submitter.drop_waiting():
            settle(future, False, JobAbortedError(
                f"the call was stopped before it was submitted: {how}() was called",
                status_reason=reason))
        self._close_warm(f"{how}() was called")
        self._stop_jobs(f"{how}() was called", reason, f"{how}() was called", level=logging.INFO)

    def _stop_jobs(self, event: str, reason: str, why: str, level: int = logging.WARNING) -> None:
        """TerminateJob for each Batch job with unfinished futures (an array's parent stops its
        children too); those futures fail with JobAbortedError; the poller drains and stops."""
        jobs = [job for job in self.poller.outstanding
                if any(not f.done() for f in job.futures())]
        if jobs:
            logger.log(level, "batchfutures: %s; stopping %d Batch job(s): %s", event, len(jobs),
                       ", ".join(job.job_id for job in jobs))
        failed = batchapi.stop_jobs(self.env.batch, batchapi.Stop.TERMINATE, [job.job_id for job in jobs],
                                    reason, attempts=2, max_delay=2.0)  # TerminateJobs: 50 a call
        for job_id, error in failed.items():
            logger.warning("batchfutures: could not stop Batch job %s: %s", job_id, error)
        for job in jobs:
            stopped = JobAbortedError(f"Batch job {job.job_id} was stopped: {why}",
                                      job_id=job.job_id, status_reason=reason)
            for future in job.futures():
                settle(future, False, stopped)
        self.poller.stop(wait=False)

    def finish_at_exit(self) -> None:
        """At interpreter exit: send buffered calls; wait for local jobs, or name AWS ones."""
        self.flush_all()
        self.submitter.submit_paced()
        if self._cancelled_at_shutdown:
            return
        if self.warm_pools:  # as ProcessPoolExecutor: the calls sent finish, then the workers go
            concurrent.futures.wait(self._warm_unfinished())
            self._close_warm()
        # the calls this session sent (not the jobs it only attached to and observes)
        submitted = set(self.submitter.submitted_jobs)
        unfinished = [f for f in self._unfinished_futures()
                      if _job_id(f) is None or _job_id(f) in submitted]
        if not unfinished:
            return
        if self.env.is_local:
            if THREADS_REFUSED_AT_EXIT:
                logger.warning(
                    "batchfutures: %d call(s) are unfinished at interpreter exit, and Python %s "
                    "cannot start the threads the local emulator needs to run them now (CPython "
                    "gh-113964, fixed in 3.12.3): they fail to start. Call executor.shutdown() "
                    "(or use a with block) before the script ends, or upgrade Python.",
                    len(unfinished), platform.python_version())
            # the emulator's jobs die with this process, so wait, as ProcessPoolExecutor does
            concurrent.futures.wait(unfinished)
            return
        jobs = sorted({job_id for job_id in map(_job_id, unfinished) if job_id is not None})
        logger.warning(
            "batchfutures: the interpreter exits while %d Batch job(s) still run; they go on in "
            "Batch. Collect their results later with BatchExecutor(env).attach(job_id): %s",
            len(jobs), ", ".join(jobs))
