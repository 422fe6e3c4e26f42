"""`ResultReader`: finished children's result objects, read concurrently, off the poller thread.

    poller thread                        reader threads (at most CONCURRENCY)          storage
    -------------                        ------------------------------------          -------
    reconcile says: read children 3..9
      reader.request(job, (3, ..., 9)) ─> about √n tasks (every k-th index) ──> GET results/<i>
                                          each result goes to the inbox as it arrives
      ...the poller goes on with Batch   <── wake(): the poller settles what arrived, without
         reads of other jobs                 waiting for its next DescribeJobs round
      reader.take() ─> {job: {index: Arrival}}  ─> reconcile.arrived ─> TrackedJob.apply

One GET costs S3's first-byte latency (20-50 ms); read one after the other on the poller thread,
10,000 results took minutes and held up every other job's Batch reads. Here up to CONCURRENCY
GETs are in flight at once, the poller never waits for one, and a result is settled as soon as
it is read. Up to 1,024 results at once are read by at most READERS threads, a larger burst by
about √n of them (see `batches`): a reader thread stays resident (~30 KB) for the executor's
life, so a few hundred results do not start 64.
`read_now` is the blocking form, for the rare reads a decision waits on (a job Batch has
forgotten, a multi-node job's node results).

An arrival is the result's bytes, None (no object there), the `IntegrityError` its seal check
raised (its items fail; nothing of it is unpickled), or a `ReadFailed` (storage failed past its
retry budget: the child is read again later).
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, Iterable, List, Optional, Protocol, Sequence, Tuple, Union

from .errors import IntegrityError

logger = logging.getLogger("batchfutures")

__all__ = ["ResultReader", "ReadFailed", "Arrival", "CONCURRENCY", "READERS"]

# GETs in flight at once: S3 serves thousands per second per prefix; 64 keeps the client's own
# sockets and threads modest while reading about 2,000 results a second at 30 ms each.
CONCURRENCY = 64
# readers a burst of up to READERS² results gets (READERS reads each, ~1 s at 30 ms); a larger
# one gets about √n, up to CONCURRENCY: a reader thread stays resident (~30 KB) for the
# executor's life, and 64 of them cost what 1,300 futures do
READERS = 32


@dataclass(frozen=True)
class ReadFailed:
    """Storage failed to answer (past its retry budget); the child is to be read again."""

    error: BaseException


Arrival = Union[bytes, bytearray, None, IntegrityError, ReadFailed]


class ResultStore(Protocol):
    """What the reader needs of storage.Storage."""

    def read_result(self, job_url: str, index: int) -> Union[bytes, bytearray, None]: ...


class ResultReader:
    """Reads result objects on a bounded pool of threads; the poller takes what arrived."""

    def __init__(self, storage: ResultStore, on_arrival: Callable[[], None], *,
                 concurrency: int = CONCURRENCY) -> None:
        self._storage = storage
        self._on_arrival = on_arrival
        self._concurrency = concurrency
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._lock = threading.Lock()
        self._inbox: Dict[Hashable, Dict[int, Arrival]] = {}
        self._in_flight = 0  # indices requested and not yet in the inbox
        self._tasks = 0      # request tasks queued or running
        self._readers = 0    # reader threads started for them (the pool never ends one early)

    def request(self, job: Hashable, job_url: str, indices: Sequence[int]) -> None:
        """Read these children's results in the background; they arrive in the inbox under
        ``job`` (the poller's TrackedJob)."""
        if not indices:
            return
        pool = self._threads()
        with self._lock:
            self._in_flight += len(indices)
            tasks = batches(indices, self._concurrency, idle=self._readers - self._tasks)
            self._tasks += len(tasks)
            self._readers = min(self._concurrency, max(self._readers, self._tasks))
        for batch in tasks:
            pool.submit(self._read_batch, job, job_url, batch)

    def read_now(self, job_url: str, indices: Iterable[int]) -> Dict[int, Arrival]:
        """Read these results concurrently and wait for them all."""
        wanted = list(indices)
        if len(wanted) <= 1:
            return {index: self._read_one(job_url, index) for index in wanted}
        pool = self._threads()
        return dict(zip(wanted, pool.map(lambda i: self._read_one(job_url, i), wanted)))

    def take(self) -> Dict[Hashable, Dict[int, Arrival]]:
        """Everything that arrived since the last take, by job (the poller thread's)."""
        with self._lock:
            arrived, self._inbox = self._inbox, {}
        return arrived

    @property
    def busy(self) -> bool:
        """Some requested read has not arrived yet."""
        return self._in_flight > 0

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    def _threads(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:  # made on first use: most executors of a script read little
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self._concurrency, thread_name_prefix="batchfutures-results")
            return self._pool

    # -- reader threads --------------------------------------------------------------------------
    def _read_batch(self, job: Hashable, job_url: str, indices: Tuple[int, ...]) -> None:
        try:
            self._read_each(job, job_url, indices)
        finally:
            with self._lock:
                self._tasks -= 1

    def _read_each(self, job: Hashable, job_url: str, indices: Tuple[int, ...]) -> None:
        for index in indices:
            arrival = self._read_one(job_url, index)
            with self._lock:
                first = not self._inbox  # the poller takes the whole inbox: one wake is enough
                self._inbox.setdefault(job, {})[index] = arrival
                self._in_flight -= 1
            if first:
                try:
                    self._on_arrival()
                except Exception:  # the poller's next round takes it anyway
                    logger.debug("batchfutures: could not wake the poller", exc_info=True)

    def _read_one(self, job_url: str, index: int) -> Arrival:
        try:
            return self._storage.read_result(job_url, index)
        except IntegrityError as refused:  # forged or altered: its items fail, unpickled never
            return refused
        except Exception as error:  # past storage's retry budget: read again later
            logger.warning("batchfutures: could not read result %d of %s: %s", index, job_url,
                           error)
            return ReadFailed(error)


def batches(indices: Sequence[int], concurrency: int = CONCURRENCY,
            idle: int = 0) -> List[Tuple[int, ...]]:
    """How ``request`` splits indices into tasks, one reader thread each (pure; for tests).

    A burst of n reads gets n tasks up to READERS, then READERS up to READERS² reads, then
    about √n, at most ``concurrency``; as many as there are ``idle`` readers when more (threads
    already started cost nothing more). Task k takes every k-th index: the reads across tasks
    go in index order, as map's consumer waits for them."""
    if not indices:
        return []
    root = math.isqrt(len(indices) - 1) + 1  # ceil(√n)
    tasks = min(len(indices), max(1, concurrency), max(READERS, root, idle))
    return [tuple(indices[first::tasks]) for first in range(tasks)]
