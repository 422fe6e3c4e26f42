"""map's pipeline: an iterable of items becomes Batch array jobs, one per slice, and futures.

    BatchExecutor.map / map_futures
        │
    slices(session, settings, fn, iterables, chunksize)   checked now: chunksize, fn, iterables,
        │                                                 the function pickled once (MapPlan)
        │  per slice, as the consumer asks for it:
        ├─ slice_shape(...)  items per child, children per job: chunksize, "auto"'s timing
        │                    (chunking.AutoChunksize), map(buffersize=N)'s room (Budget)
        ├─ send_slice(...)   children read and pickled one at a time (pack_children), their
        │                    futures (new_futures), the job submitted with its dependencies
        │                    (submit_job: futures among the items become Batch's dependsOn);
        │                    on warm workers a child whose items take a warm call's future
        │                    (or one not sent yet) is held on the client until they are done
        │                    (held_on_client, hold_children: warmpool.WarmPool.add_held)
        └─ CachedSlices      with cache=True instead: the slice's items at once, hits and calls
                             following one in flight resolved without running, the rest sent
                             in children of consecutive items (see batchfutures.cache)
        │
    ordered_results / buffered_results   map's iterator: values in input order, the first
                                         failure raised, a bounded look-ahead of slices
"""

from __future__ import annotations

import collections
import functools
import itertools
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple, Union

from . import chunking, wire
from .batchlimits import MAX_ARRAY_SIZE
from .cache import Follower, has_future
from .dependencies import substitute
from .futures import BatchFuture
from .jobs import TrackedJob
from .session import Session, Upstream, settle_cached
from .settings import JobSettings
from .submission import PendingJob, job_name_for

__all__ = ["MAP_LOOKAHEAD_SLICES", "Budget", "MapPlan", "slices", "ordered_results",
           "buffered_results", "held_on_client"]

# map() keeps this many slices (of up to 10,000 children) submitted ahead of the one it yields.
MAP_LOOKAHEAD_SLICES = 2


class Budget:
    """map(buffersize=N): items submitted (``taken``) and handed to the consumer (``yielded``)."""

    def __init__(self, buffersize: int) -> None:
        self.buffersize = buffersize
        self.taken = 0
        self.yielded = 0

    def room(self, size: int) -> int:
        """How many children of ``size`` items may be submitted now."""
        return max(0, self.yielded + self.buffersize - self.taken) // size


@dataclass(frozen=True)
class MapPlan:
    """What every Batch job of one map shares: the function's pickle and how items travel."""

    session: Session
    settings: JobSettings
    function_pickle: bytes
    single: bool  # one iterable: each item is the call's only argument ("arg" encoding)
    name: str
    per_child: bool  # one future per child (map's iterator), else one per item
    warm: bool = False  # on warm workers: children awaiting warm calls are held (HeldChild)

    @property
    def encoding(self) -> str:
        return wire.ARG if self.single else wire.ARGS

    def arguments(self, value: Any) -> tuple:
        """An item as the call's positional arguments."""
        return (value,) if self.single else tuple(value)

    def substituted(self, value: Any, upstream: Upstream) -> Any:
        """An item with the futures among its arguments replaced by references to their results."""
        if self.single:
            return substitute(value, upstream.replace)
        return tuple(substitute(v, upstream.replace) for v in value)

    def pack(self, chunk: List[Any], first_item: int) -> bytes:
        # a failure names the map's item: "item k" counts from the map's first item
        return wire.pack_arguments(chunk, single=self.single, first_item=first_item,
                                   by_value=self.session.by_value)

    def pending(self, blobs: List[bytes], counts: List[int], futures: List[List[BatchFuture]],
                size: int, upstream: Upstream) -> PendingJob:
        """One Batch job of these children, depending on the jobs its items' futures belong to."""
        for child, group in enumerate(futures):
            for future in group:
                upstream.remember(future, child)
        return PendingJob(self.settings, [self.function_pickle], blobs, counts, futures, size,
                          self.name, self.encoding, self.per_child, upstream.depends_on(len(blobs)))


class SentSlice(NamedTuple):
    """What one slice sent: its futures in order, how many items it read, and the first Batch
    job's first future and item count (what "auto" samples)."""

    futures: List[BatchFuture]
    items: int
    first_future: Optional[BatchFuture]
    first_items: int


def check_map_call(fn: Callable[..., Any], iterables: tuple, chunksize: Union[int, str]) -> None:
    if chunksize != chunking.AUTO and (
            isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1):
        raise ValueError("chunksize must be >= 1 or \"auto\".")
    if not callable(fn):
        raise TypeError(f"map() needs a callable, not {type(fn).__name__}")
    if not iterables:
        raise TypeError("map() must have at least one iterable")


def slice_shape(chunksize: Union[int, str], auto: Optional[chunking.AutoChunksize],
                budget: Optional[Budget]) -> Optional[Tuple[int, int]]:
    """(items per child, at most how many children) of the next slice; None when map's
    buffersize leaves no room for a whole child yet."""
    size, children = (int(chunksize), None) if auto is None else auto.layout()
    if budget is not None:
        size = min(int(size), budget.buffersize)
        room = budget.room(size)
        if room < 1:
            return None
        children = min(children or MAX_ARRAY_SIZE, room)
    return int(size), min(MAX_ARRAY_SIZE, children or MAX_ARRAY_SIZE)


class HeldChild(NamedTuple):
    """A warm map's child held on the client until the futures among its items are done."""

    slot: int  # its place among its slice's children
    chunk: List[Any]  # its items, futures in place
    first_item: int  # the map position of its first item
    upstream: List[BatchFuture]  # the futures among its items, once each


def held_on_client(on_batch_jobs: List[bool]) -> bool:
    """Whether a warm map's child waits on the client for the futures among its items (one
    flag per future: it belongs to a Batch job). A Batch job's future is read by the worker
    from storage, or awaited through dependsOn, as on the cold path; any other (a warm call's,
    one not sent yet) is awaited here, as submit on warm workers awaits its arguments."""
    return not all(on_batch_jobs)


def on_batch_job(session: Session, future: BatchFuture) -> bool:
    """Whether ``future`` belongs to a Batch job (a buffered cold call is sent first)."""
    if future._bound() is None and not future.done():
        session.flush_for(future)
    bound = future._bound()
    return bound is not None and isinstance(bound.job, TrackedJob)


def held_child(plan: MapPlan, chunk: List[Any], first_item: int, slot: int
               ) -> Optional[HeldChild]:
    """The child of ``chunk`` as held on the client, or None when it is sent as it is."""
    futures = futures_of_chunk(plan, chunk)
    if not held_on_client([on_batch_job(plan.session, future) for future in futures]):
        return None
    return HeldChild(slot, chunk, first_item, futures)


def futures_of_chunk(plan: MapPlan, chunk: List[Any]) -> List[BatchFuture]:
    """The futures among a chunk's items' arguments, once each."""
    # start-up: warmpool costs ~1.8 ms on a start without keepalive=; only a warm map gets here
    from .warmpool import check_same_session, futures_among

    found: Dict[int, BatchFuture] = {}
    for value in chunk:
        for future in futures_among(plan.arguments(value), {}):
            found.setdefault(id(future), future)
    futures = list(found.values())
    check_same_session(plan.session, futures)
    return futures


def pack_children(plan: MapPlan, items: Iterator[Any], size: int, max_children: int,
                  position: int, upstream: Upstream, held: Optional[List[HeldChild]] = None
                  ) -> Tuple[List[bytes], List[int]]:
    """Up to ``max_children`` children of ``size`` items read and pickled one at a time, so a
    slice's items are never all alive at once, only their pickles: (blobs, items per child).
    With ``held`` (a warm map), a child held on the client is put there instead."""
    blobs: List[bytes] = []
    counts: List[int] = []
    while len(blobs) + len(held or ()) < max_children:
        chunk = list(itertools.islice(items, size))
        if not chunk:
            break
        if held is not None:
            child = held_child(plan, chunk, position, len(blobs) + len(held))
            if child is not None:
                held.append(child)
                position += len(chunk)
                continue
        upstream.child = len(blobs)
        blobs.append(plan.pack([plan.substituted(value, upstream) for value in chunk], position))
        counts.append(len(chunk))
        position += len(chunk)
    return blobs, counts


def new_futures(session: Session, counts: List[int], per_child: bool) -> List[List[BatchFuture]]:
    """Per child, one future (``per_child``) or one per item."""
    if per_child:
        return [[BatchFuture(session)] for _ in counts]
    return [[BatchFuture(session) for _ in range(count)] for count in counts]


def submit_job(plan: MapPlan, pending: PendingJob, upstream: Upstream) -> None:
    """Send one Batch job; cancelling an upstream future then cancels the children using it."""
    plan.session.submit_job(pending)
    for child, group in enumerate(pending.futures):
        upstream.cancel_with_upstream(group, child)


def send_slice(plan: MapPlan, items: Iterator[Any], position: int, size: int,
               max_children: int) -> Optional[SentSlice]:
    """Read, pickle and submit one slice as one Batch job (a warm map: its children held on
    the client apart); None once the items are exhausted."""
    upstream = Upstream(plan.session)  # futures among the items: Batch dependencies
    held: Optional[List[HeldChild]] = [] if plan.warm else None
    blobs, counts = pack_children(plan, items, size, max_children, position, upstream, held)
    if not blobs and not held:
        return None
    futures = new_futures(plan.session, counts, plan.per_child)
    if blobs:
        submit_job(plan, plan.pending(blobs, counts, futures, size, upstream), upstream)
    first = futures[0][0] if futures else None
    if held:
        futures = hold_children(plan, held, futures)
    return SentSlice([future for group in futures for future in group],
                     sum(counts) + sum(len(child.chunk) for child in held or ()),
                     first, sum(counts))


def hold_children(plan: MapPlan, held: List[HeldChild], sent: List[List[BatchFuture]]
                  ) -> List[List[BatchFuture]]:
    """The held children given to their warm pool, each with its futures; every child's
    futures in slice order (the held ones in their slots)."""
    ordered: List[List[BatchFuture]] = []
    others = iter(sent)
    for child in held:
        while len(ordered) < child.slot:
            ordered.append(next(others))
        group = new_futures(plan.session, [len(child.chunk)], plan.per_child)[0]
        hold(plan, child, group)
        ordered.append(group)
    ordered.extend(others)
    return ordered


def hold(plan: MapPlan, child: HeldChild, group: List[BatchFuture]) -> None:
    """One held child given to its warm pool, which sends it once its futures are done."""
    from .warmpool import HeldCall, await_upstream  # start-up: as futures_of_chunk's

    session, single = plan.session, plan.single
    await_upstream(session, child.upstream)
    session.warm_pool(plan.settings).add_held(HeldCall(
        child.upstream, plan.function_pickle, plan.encoding,
        [(plan.arguments(value), {}) for value in child.chunk], group, plan.per_child,
        pack=lambda resolved, first: plan.pack(
            [args[0] if single else args for args, _ in resolved], first),
        first_item=child.first_item))


def slices(session: Session, settings: JobSettings, fn: Callable[..., Any], iterables: tuple,
           chunksize: Union[int, str], *, per_child: bool = False,
           deadline: Optional[float] = None,
           budget: Optional[Budget] = None) -> Iterator[List[BatchFuture]]:
    """Submit ``zip(*iterables)`` as Batch jobs of at most 10,000 children, one per slice.

    Each slice yields one future per item, or with ``per_child`` one per child, resolved
    with a callable returning that child's ``(ok, value)`` outcomes (map's iterator needs
    no more). With a ``budget`` (map's buffersize) a slice holds only the children it
    leaves room for, and is empty (nothing read, nothing sent) when there is none.
    The call is checked, and the function pickled, now; the slices are sent as they are taken.
    """
    check_map_call(fn, iterables, chunksize)
    session._check_open()
    # SerializationError before any upload; the map holds the pickle, not the callable
    function_pickle = session.pickle_function(fn, settings.retry_policy)  # with the initializer
    single = len(iterables) == 1
    items = iter(iterables[0]) if single else zip(*iterables)
    plan = MapPlan(session, settings, function_pickle, single, job_name_for(fn), per_child,
                   warm=session._warm(settings))
    auto = None if chunksize != chunking.AUTO else chunking.AutoChunksize(
        session, settings.vcpus, function_pickle, sample=per_child, deadline=deadline)
    cached = CachedSlices(plan) if session.cache is not None and settings.nodes == 1 else None

    def generate() -> Iterator[List[BatchFuture]]:
        position = 0
        while True:
            session._check_open()
            shape = slice_shape(chunksize, auto, budget)
            if shape is None:
                yield []
                continue
            size, max_children = shape
            if cached is not None:
                sent = cached.send_slice(items, position, size, max_children)
            else:
                sent = send_slice(plan, items, position, size, max_children)
            if sent is None:
                return
            position += sent.items
            if budget is not None:
                budget.taken = position
            if auto is not None and sent.first_future is not None:
                auto.submitted(sent.first_future, sent.first_items)
            yield sent.futures

    return generate()


class CachedSlices:
    """One map's slices with ``cache=True``: calls found in the cache or following an identical
    call in flight are not sent; the rest run in children of consecutive items, so the futures
    of a slice stay in input order (see batchfutures.cache)."""

    def __init__(self, plan: MapPlan) -> None:
        self.plan = plan
        self.session = plan.session
        cache = plan.session.cache
        assert cache is not None
        self.cache = cache
        self._refreshed = False

    def _call(self, value: Any) -> Optional[Tuple[tuple, dict]]:
        """The item as a call's (args, kwargs); None when a future is among them."""
        values = self.plan.arguments(value)
        if any(has_future(v) for v in values):
            return None
        return values, {}

    def send_slice(self, items: Iterator[Any], position: int, size: int,
                   max_children: int) -> Optional[SentSlice]:
        """The slice's items at once (hits are known only then); None once they are exhausted."""
        raw = list(itertools.islice(items, max_children * size))
        if not raw:
            return None
        futures, first_run, run_items = self.send_cached(raw, position, size)
        return SentSlice(futures, len(raw), first_run, run_items)

    def send_cached(self, raw: List[Any], first: int, size: int
                    ) -> Tuple[List[BatchFuture], Optional[BatchFuture], int]:
        """Submit the calls of ``raw`` (map items ``first``...) that must run; every item's
        future (or, per child, one future per run of items) in order, the first submitted
        future and how many items its Batch job runs."""
        session, cache, per_child = self.session, self.cache, self.plan.per_child
        function_digest = cache.function_digest(self.plan.function_pickle)
        if not self._refreshed:  # one listing of the function's index per map
            cache.refresh(function_digest)
            self._refreshed = True
        digests = cache.call_digests(function_digest, self.plan.settings,
                                     [self._call(value) for value in raw])
        hits = cache.lookup(function_digest, digests)
        follows = self._leaders(digests, hits)
        segments = run_segments(len(raw), lambda i: i not in hits and i not in follows, size)
        run_children = [indices for runs, indices in segments if runs]
        place: Dict[int, Tuple[BatchFuture, Optional[int]]] = {}  # run item -> its future
        child_futures: List[List[BatchFuture]] = []
        for indices in run_children:
            if per_child:
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
            elif per_child:
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
            if pending.blobs:  # not every child held on the client (a warm map)
                submit_job(self.plan, pending, upstream)
        sent = [pending for pending, _ in jobs if pending.blobs]
        first_run = sent[0].futures[0][0] if sent else None
        run_items = sum(sent[0].item_counts) if sent else 0
        return out, first_run, run_items

    def _leaders(self, digests: List[Optional[str]], hits: Dict[int, bytes]) -> Dict[int, Any]:
        """item -> what it follows: a call in flight (future, position) or an earlier item."""
        follows: Dict[int, Any] = {}
        first_of: Dict[str, int] = {}
        for i, digest in enumerate(digests):
            if i in hits or digest is None:
                continue
            leader = self.cache.leader(digest)
            if leader is not None:
                follows[i] = leader
            elif digest in first_of:
                follows[i] = first_of[digest]
            else:
                first_of[digest] = i
        return follows

    def _resolve(self, i: int, hits: Dict[int, bytes], follows: Dict[int, Any],
                 place: Dict[int, Tuple[BatchFuture, Optional[int]]],
                 deliver: Callable[[Any], None]) -> None:
        if i in hits:
            deliver(self.cache.hit_outcome(hits[i]))
            return
        leader = follows[i]
        self.cache.follow(place[leader] if isinstance(leader, int) else leader, deliver)

    def _pending(self, raw: List[Any], first: int, children: List[List[int]],
                 futures: List[List[BatchFuture]], size: int) -> Tuple[PendingJob, Upstream]:
        """One Batch job of run children (items of ``raw`` by index), with its dependencies;
        on warm workers, the children held on the client go to their pool instead (hold)."""
        upstream = Upstream(self.session)
        blobs: List[bytes] = []
        counts: List[int] = []
        sent: List[List[BatchFuture]] = []
        for indices, group in zip(children, futures):
            values = [raw[i] for i in indices]
            held = held_child(self.plan, values, first + indices[0], 0) \
                if self.plan.warm else None
            if held is not None:
                hold(self.plan, held, group)
                continue
            upstream.child = len(blobs)
            chunk = [self.plan.substituted(value, upstream) for value in values]
            blobs.append(self.plan.pack(chunk, first + indices[0]))
            counts.append(len(indices))
            sent.append(group)
        return self.plan.pending(blobs, counts, sent, size, upstream), upstream


def run_segments(count: int, runs: Callable[[int], bool], size: int) -> List[Tuple[bool, List[int]]]:
    """Items 0..count-1 in runs of consecutive items that run (``runs(i)``), at most ``size``
    each (a child), or that do not (resolved without running), in order."""
    segments: List[Tuple[bool, List[int]]] = []
    for i in range(count):
        here = runs(i)
        if segments and segments[-1][0] == here and (not here or len(segments[-1][1]) < size):
            segments[-1][1].append(i)
        else:
            segments.append((here, [i]))
    return segments


# -- map's iterator -------------------------------------------------------------------------------
def _take(outcomes: "collections.deque") -> Any:
    """The next item's value, or raise its exception."""
    ok, value = outcomes.popleft()
    if not ok:
        outcomes.clear()  # the map ends at its first failed item
        raise value
    return value


def ordered_results(slices: Iterator[List[BatchFuture]], eager: int, end_time: Optional[float],
                    shown: Any) -> Iterator[Any]:
    """map's iterator: ``eager`` slices are submitted now, as ProcessPoolExecutor.map submits at
    once (bad input raises here, and a map nobody iterates still runs); later slices follow as
    results are taken, keeping that many ahead."""
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

    return results()


def buffered_results(slices: Iterator[List[BatchFuture]], budget: Budget,
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

    return results()


def map_iterator(slices: Iterator[List[BatchFuture]], chunksize: Union[int, str],
                 budget: Optional[Budget], end_time: Optional[float], shown: Any) -> Iterator[Any]:
    """The iterator map() returns: buffered with a budget, else a few slices ahead (with an
    "auto" sample: the sample now, the rest once the iterator waits for it)."""
    if budget is not None:
        results = buffered_results(slices, budget, end_time, shown)
    else:
        eager = 1 if chunksize == chunking.AUTO else MAP_LOOKAHEAD_SLICES + 1
        results = ordered_results(slices, eager, end_time, shown)
    return results if shown is None else shown.watch(results)


def every_future(slices: Iterable[List[BatchFuture]]) -> List[BatchFuture]:
    """map_futures: every slice submitted now, one list of futures."""
    return [future for group in slices for future in group]
