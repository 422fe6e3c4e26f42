"""`BatchExecutor`: a `concurrent.futures.Executor` whose workers are AWS Batch jobs.

    BatchExecutor(env, **settings) ──holds──> Session (environment, storage, poller, buffers)
        │  with_settings(**overrides) ──> another BatchExecutor on the same Session
        │
        ├─ submit(fn, *args)  ──> Session.submit: coalesced with neighbours into one array job
        ├─ map(fn, *its)      ──> slices of up to 10,000 children x chunksize items, submitted as
        │                         the iterator is consumed (a bounded look-ahead), results in order;
        │                         buffersize=N: at most N items submitted ahead of the last yielded
        ├─ map_futures(...)   ──> the same layout, every slice at once, one future per item
        ├─ attach(job_id)     ──> futures of an earlier job, from Batch and from storage
        ├─ shutdown()         ──> flush, optionally cancel, wait, stop the poller
        ├─ terminate_workers(), kill_workers() ──> Session.terminate: TerminateJob per unfinished
        │                         job, every unfinished future fails (JobAbortedError), shut down
        └─ _max_workers       ──> max_workers, else the environment's vCPUs at once / job vCPUs
                                  (what Dask and the joblib backend size their fan-out by)

The executor is a thin layer: the job state lives in `session.Session` and the parts it holds
(`coalescer.Coalescer`, `submission.Submitter`, `poller.Poller`, `jobs.TrackedJob`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import itertools
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Literal, Optional, Tuple, Union

from . import chunking, wire
from .batchlimits import MAX_ARRAY_SIZE
from .cache import Follower, has_future
from .dependencies import substitute
from .environments import EnvironmentLike, resolve_environment
from .futures import BatchFuture
from .progress import for_map as progress_for_map
from .session import Session, Upstream, settle_cached
from .settings import JobSettings
from .submission import PendingJob, job_name_for

__all__ = ["BatchExecutor"]

# map() keeps this many slices (of up to 10,000 children) submitted ahead of the one it yields.
MAP_LOOKAHEAD_SLICES = 2


def _take(outcomes: "collections.deque") -> Any:
    """The next item's value, or raise its exception."""
    ok, value = outcomes.popleft()
    if not ok:
        outcomes.clear()  # the map ends at its first failed item
        raise value
    return value


class _Budget:
    """map(buffersize=N): items submitted (``taken``) and handed to the consumer (``yielded``)."""

    def __init__(self, buffersize: int) -> None:
        self.buffersize = buffersize
        self.taken = 0
        self.yielded = 0

    def room(self, size: int) -> int:
        """How many children of ``size`` items may be submitted now."""
        return max(0, self.yielded + self.buffersize - self.taken) // size


class _MapJob:
    """One map's slices with ``cache=True``: calls found in the cache or following an identical
    call in flight are not sent; the rest run in children of consecutive items, so the futures
    of a slice stay in input order (see batchfutures.cache)."""

    def __init__(self, session: Session, settings: JobSettings, function_pickle: bytes,
                 single: bool, encoding: str, name: str, per_child: bool) -> None:
        self.session = session
        self.settings = settings
        self.function_pickle = function_pickle
        self.single = single
        self.encoding = encoding
        self.name = name
        self.per_child = per_child
        self._refreshed = False

    def _call(self, value: Any) -> Optional[Tuple[tuple, dict]]:
        """The item as a call's (args, kwargs); None when a future is among them."""
        values = (value,) if self.single else tuple(value)
        if any(has_future(v) for v in values):
            return None
        return values, {}

    def send_cached(self, raw: List[Any], first: int, size: int
                    ) -> Tuple[List[BatchFuture], Optional[BatchFuture], int]:
        """Submit the calls of ``raw`` (map items ``first``...) that must run; every item's
        future (or, per child, one future per run of items) in order, the first submitted
        future and how many items its Batch job runs."""
        session, cache = self.session, self.session.cache
        assert cache is not None
        function_digest = cache.function_digest(self.function_pickle)
        if not self._refreshed:  # one listing of the function's index per map
            cache.refresh(function_digest)
            self._refreshed = True
        digests = cache.call_digests(function_digest, self.settings,
                                     [self._call(value) for value in raw])
        hits = cache.lookup(function_digest, digests)
        follows: Dict[int, Any] = {}  # item -> leader (future, position) or an earlier item
        first_of: Dict[str, int] = {}
        for i, digest in enumerate(digests):
            if i in hits or digest is None:
                continue
            leader = cache.leader(digest)
            if leader is not None:
                follows[i] = leader
            elif digest in first_of:
                follows[i] = first_of[digest]
            else:
                first_of[digest] = i
        # segments of consecutive items: run ones in children of at most ``size``
        segments: List[Tuple[bool, List[int]]] = []
        for i in range(len(raw)):
            runs = i not in hits and i not in follows
            if segments and segments[-1][0] == runs and (not runs or len(segments[-1][1]) < size):
                segments[-1][1].append(i)
            else:
                segments.append((runs, [i]))
        run_children = [indices for runs, indices in segments if runs]
        place: Dict[int, Tuple[BatchFuture, Optional[int]]] = {}  # run item -> its future
        child_futures: List[List[BatchFuture]] = []
        for indices in run_children:
            if self.per_child:
                future = BatchFuture(session)
                future._set_cache_key((function_digest, tuple(digests[i] for i in indices)))
                cache.register([(digests[i], k) for k, i in enumerate(indices)], future)
                place.update((i, (future, k)) for k, i in enumerate(indices))
                child_futures.append([future])
            else:
                group = []
                for i in indices:
                    future = BatchFuture(session)
                    future._set_cache_key((function_digest, (digests[i],)))
                    cache.register([(digests[i], None)], future)
                    place[i] = (future, None)
                    group.append(future)
                child_futures.append(group)
        jobs = []
        for start in range(0, len(run_children), MAX_ARRAY_SIZE):
            jobs.append(self._pending(raw, first, run_children[start:start + MAX_ARRAY_SIZE],
                                      child_futures[start:start + MAX_ARRAY_SIZE], size))
        out: List[BatchFuture] = []
        children = iter(child_futures)
        for runs, indices in segments:
            if runs:
                out.extend(next(children))
            elif self.per_child:
                slots = Follower(BatchFuture(session), len(indices))
                slots.future._mark_cached()
                for slot, i in enumerate(indices):
                    self._resolve(i, hits, follows, place, functools.partial(slots.fill, slot))
                out.append(slots.future)
            else:
                for i in indices:
                    future = BatchFuture(session)
                    if i in hits:
                        settle_cached(future, cache.hit_outcome(hits[i]))
                    else:
                        self._resolve(i, hits, follows, place,
                                      functools.partial(cache.settle_follower, future))
                    out.append(future)
        for pending, upstream in jobs:
            session.submit_job(pending)
            for child, group in enumerate(pending.futures):
                upstream.cancel_with_upstream(group, child)
        first_run = child_futures[0][0] if child_futures else None
        run_items = sum(jobs[0][0].item_counts) if jobs else 0
        return out, first_run, run_items

    def _resolve(self, i: int, hits: Dict[int, bytes], follows: Dict[int, Any],
                 place: Dict[int, Tuple[BatchFuture, Optional[int]]],
                 deliver: Callable[[Any], None]) -> None:
        cache = self.session.cache
        assert cache is not None
        if i in hits:
            deliver(cache.hit_outcome(hits[i]))
            return
        leader = follows[i]
        cache.follow(place[leader] if isinstance(leader, int) else leader, deliver)

    def _pending(self, raw: List[Any], first: int, children: List[List[int]],
                 futures: List[List[BatchFuture]], size: int) -> Tuple[PendingJob, Upstream]:
        """One Batch job of run children (items of ``raw`` by index), with its dependencies."""
        session = self.session
        upstream = Upstream(session)
        blobs: List[bytes] = []
        for child, indices in enumerate(children):
            upstream.child = child
            if self.single:
                chunk = [substitute(raw[i], upstream.replace) for i in indices]
            else:
                chunk = [tuple(substitute(v, upstream.replace) for v in raw[i]) for i in indices]
            blobs.append(wire.pack_arguments(
                chunk, single=self.single, first_item=first + indices[0], by_value=session.by_value))
        for child, group in enumerate(futures):
            for future in group:
                upstream.remember(future, child)
        counts = [len(indices) for indices in children]
        return PendingJob(self.settings, [self.function_pickle], blobs, counts, futures, size,
                          self.name, self.encoding, self.per_child,
                          upstream.depends_on(len(blobs))), upstream


class BatchExecutor(concurrent.futures.Executor):
    """Run calls as AWS Batch (array) jobs; with no environment, on the embedded emulator."""

    def __init__(self, env: EnvironmentLike = None, max_workers: Optional[int] = None,
                 mp_context: Any = None, initializer: Optional[Callable[..., Any]] = None,
                 initargs: tuple = (), *, max_tasks_per_child: Optional[int] = None,
                 ship_local_modules: bool = True, dry_run: bool = False, echo_output: bool = True,
                 cache: bool = False, **settings: Any) -> None:
        """``ProcessPoolExecutor``'s parameters, after ``env``, then the job settings.

        ``max_workers`` bounds how many of this executor's children run at once (submissions
        are paced; see docs/architecture.md). ``initializer(*initargs)`` runs once in each
        child process before its items. ``mp_context`` and ``max_tasks_per_child`` are
        accepted for compatibility and have no effect: every attempt is a fresh process.
        ``ship_local_modules``: pickle functions and classes of the client's own modules
        (outside the standard library and site-packages) by value, since the worker's image
        does not have them. ``dry_run``: build every request and object as it would be sent,
        send nothing; the futures raise ``DryRunResult`` (see batchfutures.dryrun).
        ``echo_output``: what a call prints to stdout and stderr is written to this process's
        sys.stdout and sys.stderr when its future resolves (the job's log has it either way).
        ``cache``: a call identical (function, arguments, job environment, as pickled) to one
        that succeeded before in this storage resolves from its stored result, with
        ``future.cached`` True, instead of running again (see docs/caching.md).
        """
        if max_workers is not None:
            if isinstance(max_workers, bool) or not isinstance(max_workers, int):
                raise TypeError(f"max_workers must be an integer, not {type(max_workers).__name__}")
            if max_workers <= 0:
                raise ValueError("max_workers must be greater than 0")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if max_tasks_per_child is not None:
            if not isinstance(max_tasks_per_child, int):
                raise TypeError("max_tasks_per_child must be an integer")
            if max_tasks_per_child <= 0:
                raise ValueError("max_tasks_per_child must be >= 1")
        del mp_context  # every attempt is a fresh process: there is no start method to choose
        self._settings = JobSettings.from_kwargs(**settings)
        environment = resolve_environment(env)
        environment.validate_settings(self._settings)
        self._session = Session(environment, max_workers=max_workers, initializer=initializer,
                                initargs=tuple(initargs), ship_local_modules=ship_local_modules,
                                dry_run=dry_run, echo_output=bool(echo_output),
                                cache=bool(cache))

    @classmethod
    def _view(cls, session: Session, settings: JobSettings) -> "BatchExecutor":
        view = cls.__new__(cls)
        view._settings = settings
        view._session = session
        return view

    @property
    def environment(self) -> Any:
        return self._session.env

    @property
    def settings(self) -> JobSettings:
        return self._settings

    def with_settings(self, **overrides: Any) -> "BatchExecutor":
        """An executor view with other job settings, sharing environment, storage and poller."""
        settings = JobSettings.from_kwargs(self._settings, **overrides)
        self._session.env.validate_settings(settings)
        return self._view(self._session, settings)

    # -- submit ------------------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> BatchFuture:
        if not callable(fn):
            raise TypeError(f"submit() needs a callable, not {type(fn).__name__}")
        return self._session.submit(self._settings, fn, args, kwargs)

    # -- map ---------------------------------------------------------------------------------
    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any], timeout: Optional[float] = None,
            chunksize: Union[int, str] = 1, buffersize: Optional[int] = None,
            progress: Union[bool, str] = False) -> Iterator[Any]:
        """Like the built-in map, run as array jobs; results in input order.

        When the call on item k raised, items 0..k-1 are yielded and then item k's exception.
        ``timeout`` counts from this call and raises concurrent.futures.TimeoutError.
        ``chunksize="auto"``: about a minute of work per child, at least N = floor(vcpus) items
        (one per process the child runs them on). Unless this executor timed ``fn`` before, the
        first child is sent alone as a sample of N items, and the rest once it has finished,
        sized from its run time in its container (see docs/performance.md).
        ``progress``: True shows Batch's counts for this map on stderr, "auto" only on a terminal.
        ``buffersize`` (Python 3.14's ``Executor.map``): at most that many items are submitted
        ahead of the one last yielded, in children of ``min(chunksize, buffersize)`` items, so
        an endless iterable works; without it, slices of up to 10,000 children are submitted
        a few slices ahead.
        """
        if buffersize is not None:
            if not isinstance(buffersize, int):
                raise TypeError("buffersize must be an integer or None")
            if buffersize < 1:
                raise ValueError("buffersize must be None or > 0")
        end_time = None if timeout is None else time.monotonic() + timeout
        budget = None if buffersize is None else _Budget(buffersize)
        slices = self._slices(fn, iterables, chunksize, per_child=True, deadline=end_time,
                              budget=budget)
        shown = progress_for_map(progress, fn)  # None unless progress is asked for
        if shown is not None:
            slices = shown.follow(slices)
        # The first slices go now, as ProcessPoolExecutor.map submits at once: bad input raises
        # here, and a map nobody iterates still runs. Later slices follow as results are taken
        # (with an "auto" sample: the sample now, the rest once the iterator waits for it).
        if budget is not None:
            return self._buffered_results(slices, budget, end_time, shown)
        eager = 1 if chunksize == chunking.AUTO else MAP_LOOKAHEAD_SLICES + 1
        submitted: collections.deque = collections.deque(itertools.islice(slices, eager))

        def results() -> Iterator[Any]:
            current: collections.deque = collections.deque()
            outcomes: collections.deque = collections.deque()
            try:
                while True:
                    if outcomes:
                        # yielded straight from the deque: once the consumer has an item, this
                        # frame holds no reference to it (as ProcessPoolExecutor.map)
                        yield _take(outcomes)
                        continue
                    if not current:
                        if not submitted:
                            return
                        current.extend(submitted.popleft())
                        more = next(slices, None)
                        if more is not None:
                            submitted.append(more)
                        continue
                    remaining = None if end_time is None else end_time - time.monotonic()
                    outcomes.extend(current[0].result(remaining)())  # decoded here, when reached
                    current.popleft()
            finally:
                for child in itertools.chain(current, *submitted):
                    child.cancel()
                if shown is not None:
                    shown.close()

        return results() if shown is None else shown.watch(results())

    @staticmethod
    def _buffered_results(slices: Iterator[List[BatchFuture]], budget: "_Budget",
                          end_time: Optional[float], shown: Any) -> Iterator[Any]:
        """map(buffersize=N)'s iterator: children are submitted while fewer than N items are
        submitted and not yet yielded; the first ones now, as ProcessPoolExecutor.map does."""
        pending: collections.deque = collections.deque()  # one future per child, in order
        state = {"exhausted": False}

        def refill(slices_now: int = MAX_ARRAY_SIZE) -> None:
            while not state["exhausted"] and budget.taken < budget.yielded + budget.buffersize \
                    and slices_now > 0:
                slices_now -= 1
                group = next(slices, None)
                if group is None:
                    state["exhausted"] = True
                elif not group:  # no room for a whole child yet
                    return
                else:
                    pending.extend(group)

        refill(1)  # one slice now (an "auto" sample alone: the next one waits for its timing)

        def results() -> Iterator[Any]:
            outcomes: collections.deque = collections.deque()
            try:
                while True:
                    refill()
                    if outcomes:
                        budget.yielded += 1
                        yield _take(outcomes)
                        continue
                    if not pending:
                        return
                    remaining = None if end_time is None else end_time - time.monotonic()
                    outcomes.extend(pending[0].result(remaining)())
                    pending.popleft()
            finally:
                for child in pending:
                    child.cancel()
                if shown is not None:
                    shown.close()

        return results() if shown is None else shown.watch(results())

    def map_futures(self, fn: Callable[..., Any], *iterables: Iterable[Any],
                    chunksize: Union[int, str] = 1) -> List[BatchFuture]:
        """The layout of map(), every slice submitted now, one future per item.

        ``chunksize="auto"``: as map's when this executor timed ``fn`` before (an earlier auto
        map), otherwise N = floor(vcpus) items per child: every future is returned at once,
        with no sample to wait for.
        """
        futures: List[BatchFuture] = []
        for group in self._slices(fn, iterables, chunksize):
            futures.extend(group)
        return futures

    def _slices(self, fn: Callable[..., Any], iterables: tuple, chunksize: Union[int, str], *,
                per_child: bool = False, deadline: Optional[float] = None,
                budget: Optional["_Budget"] = None) -> Iterator[List[BatchFuture]]:
        """Submit ``zip(*iterables)`` as Batch jobs of at most 10,000 children, one per slice.

        Each slice yields one future per item, or with ``per_child`` one per child, resolved
        with a callable returning that child's ``(ok, value)`` outcomes (map's iterator needs
        no more). With a ``budget`` (map's buffersize) a slice holds only the children it
        leaves room for, and is empty (nothing read, nothing sent) when there is none.
        """
        if chunksize != chunking.AUTO and (
                isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1):
            raise ValueError("chunksize must be >= 1 or \"auto\".")
        if not callable(fn):
            raise TypeError(f"map() needs a callable, not {type(fn).__name__}")
        if not iterables:
            raise TypeError("map() must have at least one iterable")
        self._session._check_open()
        # SerializationError before any upload; the map holds the pickle, not the callable
        function_pickle = self._session.pickle_function(fn)  # with the initializer, if any
        # One iterable: each item is the call's only argument ("arg" encoding, no tuple each).
        single = len(iterables) == 1
        items = iter(iterables[0]) if single else zip(*iterables)
        encoding = wire.ARG if single else wire.ARGS
        name = job_name_for(fn)
        session = self._session
        settings = self._settings
        auto = None if chunksize != chunking.AUTO else chunking.AutoChunksize(
            session, settings.vcpus, function_pickle, sample=per_child, deadline=deadline)
        cache = session.cache if settings.nodes == 1 else None
        job = _MapJob(session, settings, function_pickle, single, encoding, name, per_child)

        def generate() -> Iterator[List[BatchFuture]]:
            position = 0
            while True:
                session._check_open()
                # child by child: a slice's items are never all alive at once, only their pickles
                size, children = (int(chunksize), None) if auto is None else auto.layout()
                if budget is not None:
                    size = min(int(size), budget.buffersize)
                    room = budget.room(size)
                    if room < 1:
                        yield []
                        continue
                    children = min(children or MAX_ARRAY_SIZE, room)
                if cache is not None:  # the slice's items at once: hits are known only then
                    raw = list(itertools.islice(
                        items, min(MAX_ARRAY_SIZE, children or MAX_ARRAY_SIZE) * int(size)))
                    if not raw:
                        return
                    slice_futures, first_run, run_items = job.send_cached(raw, position, int(size))
                    position += len(raw)
                    del raw
                    if budget is not None:
                        budget.taken = position
                    if auto is not None and first_run is not None:
                        auto.submitted(first_run, run_items)
                    yield slice_futures
                    continue
                blobs: List[bytes] = []
                counts: List[int] = []
                upstream = Upstream(session)  # futures among the items: Batch dependencies
                while len(blobs) < min(MAX_ARRAY_SIZE, children or MAX_ARRAY_SIZE):
                    chunk = list(itertools.islice(items, size))
                    if not chunk:
                        break
                    upstream.child = len(blobs)
                    if single:
                        chunk = [substitute(value, upstream.replace) for value in chunk]
                    else:
                        chunk = [tuple(substitute(v, upstream.replace) for v in values)
                                 for values in chunk]
                    # a failure names the map's item: "item k" counts from the map's first item
                    blobs.append(wire.pack_arguments(
                        chunk, single=single, first_item=position, by_value=session.by_value))
                    counts.append(len(chunk))
                    position += len(chunk)
                if not blobs:
                    return
                if per_child:
                    futures = [[BatchFuture(session)] for _ in counts]
                else:
                    futures = [[BatchFuture(session) for _ in range(count)] for count in counts]
                for child, group in enumerate(futures):
                    for future in group:
                        upstream.remember(future, child)
                session.submit_job(PendingJob(settings, [function_pickle], blobs, counts, futures,
                                              size, name, encoding, per_child,
                                              upstream.depends_on(len(blobs))))
                for child, group in enumerate(futures):
                    upstream.cancel_with_upstream(group, child)
                del blobs
                if budget is not None:
                    budget.taken = position
                if auto is not None:
                    auto.submitted(futures[0][0], sum(counts))
                yield [future for group in futures for future in group]

        return generate()

    # -- attach, shutdown ----------------------------------------------------------------------
    def attach(self, job_id: str) -> Union[BatchFuture, List[BatchFuture]]:
        """The future(s) of a job submitted earlier, possibly by another process."""
        futures = self._session.attach(job_id)
        return futures[0] if len(futures) == 1 else futures

    def job(self, job_id: str) -> Any:
        """The Batch job as a whole (a `jobview.JobInfo`): status, reason, child count and, per
        child, status, exit code and reason, from DescribeJobs and ListJobs; ``.log()`` reads
        its log; ``.usage`` (read from storage when first asked) its calls' CPU summed, their
        largest peak memory, and the vCPU- and GiB-seconds it reserved (docs/usage.md). For
        arrays and plain jobs alike; ``"<array id>:<i>"`` names one child."""
        from .jobview import describe_in

        return describe_in(self._session.env, job_id)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._session.shutdown(wait=wait, cancel_futures=cancel_futures)

    def terminate_workers(self) -> None:
        """Python 3.14's ``ProcessPoolExecutor.terminate_workers``: stop every unfinished job of
        this executor now (TerminateJob), fail its futures with ``JobAbortedError``, shut down.

        On AWS, TerminateJob stops a running container as ECS does (SIGTERM, then SIGKILL after
        the stop timeout); the local emulator kills the attempt's processes at once (SIGKILL).
        """
        self._session.terminate("terminate_workers")

    def kill_workers(self) -> None:
        """Python 3.14's ``ProcessPoolExecutor.kill_workers``: as ``terminate_workers`` (Batch
        has one way to stop a job, TerminateJob)."""
        self._session.terminate("kill_workers")

    @property
    def _max_workers(self) -> int:
        """How many calls can run at once (the attribute Dask reads to size its fan-out):
        ``max_workers`` when given, else the vCPUs the environment runs at once (the local
        ``max_vcpus`` or CPUs; on AWS the queue's compute environments' maxvCpus, read once)
        divided by the vCPUs of one job of these settings (all its nodes)."""
        given = self._session.submitter.max_workers
        if given is not None:
            return int(given)
        settings = self._settings
        env = self._session.env
        per_job = settings.vcpus * max(1, settings.nodes)
        workers = int(env.max_vcpus_at_once() / per_job + 1e-9)
        if settings.gpus and isinstance(getattr(env, "gpus", None), int):
            workers = min(workers, env.gpus // (settings.gpus * max(1, settings.nodes)))
        return max(1, workers)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> Literal[False]:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            # Ctrl-C: stop what this executor started (cancel, terminate), say which jobs, and
            # leave now; a second Ctrl-C interrupts even that
            self._session.interrupt()
            return False
        try:
            self.shutdown(wait=True)
        except KeyboardInterrupt:  # Ctrl-C while waiting for the block's work
            self._session.interrupt()
            raise
        return False

    def __repr__(self) -> str:
        return f"BatchExecutor({self._session.env!r}, {self._settings.as_dict()!r})"
