"""`cache=True`: a call that already succeeded in this storage is not run again.

    client, before SubmitJob (Submitter.before_submit -> CallCache.write_index)
        R/cache/<function digest>/<run id>.<job key>     one sealed index object per Batch job:
                                                          [[call digest, child, position], ...]
    client, before a map slice or a coalesced submit is sent (CallCache.lookup)
        LIST R/cache/<function digest>/                   once per map (per flush for submit)
        GET  each index object not read before            once per session
        GET  R/runs/<run>/jobs/<key>/results/<child>      per candidate child: only an "ok"
                                                          outcome of that item is a hit

An index object is read as every signed object is (Storage.read_sealed: its size checked
before a byte is read, at most MAX_INDEX_SIZE; never a symlink or FIFO locally; the MAC computed
as it streams in), and one listing reads at most MAX_INDEX_READS of them, the newest runs first:
whoever can write the bucket without the key can make a client read no more than that.

A call's digest is sha256 over the function's digest (the sha256 of its stored pickle, the
name it is stored under), the environment digest (environment variables, secrets, job
definition, the initializer's arguments) and the cloudpickle of ``(args, kwargs)``. Nothing is
copied: an index points at result objects, which are signed and checked as every result is, so
an entry whose run was removed (cleanup, S3 expiry) is a miss. The worker knows nothing of it.

Within one session, identical calls in flight run once: the later future follows the first
(``follow``) and takes its outcome, failure included. See docs/caching.md.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import cloudpickle

from . import serialization, signing, wire
from .errors import DryRunResult, IntegrityError
from .futures import BatchFuture
from .jobs import settle
from .layout import CACHE_FOLDER

if TYPE_CHECKING:
    from .storage import Storage

__all__ = ["CallCache", "CACHE_FOLDER", "MAX_INDEX_READS", "MAX_INDEX_SIZE", "forget_runs",
           "environment_digest"]

logger = logging.getLogger("batchfutures")

INDEX_KIND = "cache-index"
READERS = 16  # parallel GETs of index and result objects on an object store
# An index entry is ~80 bytes ([64-hex digest, child, position]): 32 MiB is ~400,000 calls in
# one Batch job; a job with more is not cached (its index is not written), rather than let a
# reader take any size.
MAX_INDEX_SIZE = 32 * 1024 * 1024
MAX_INDEX_READS = 256  # index objects read per listing (newest runs first); more are skipped

# (job URL, child, position of the item in the child)
Location = Tuple[str, int, int]
Outcome = Tuple[bool, Any]


def digest_of(*parts: bytes) -> str:
    """sha256 over length-prefixed parts, so no two splits of the same bytes collide."""
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(len(part).to_bytes(8, "little"))
        hasher.update(part)
    return hasher.hexdigest()


def environment_digest(definition: str, settings: Any, initargs: Optional[bytes]) -> str:
    """What of the job's environment makes two calls different (docs/caching.md)."""
    described = {
        "definition": definition,
        "environment": sorted(dict(settings.environment).items()),
        "secrets": sorted(dict(settings.secrets or {}).items()),
        "initargs": None if initargs is None else hashlib.sha256(initargs).hexdigest(),
    }
    return digest_of(json.dumps(described, sort_keys=True).encode())


def has_future(value: Any) -> bool:
    """A future among the arguments (itself, or in a list/tuple): such a call is never cached,
    its argument is another job's result, known only by that job's place in storage."""
    if isinstance(value, BatchFuture):
        return True
    if isinstance(value, (list, tuple)):
        return any(isinstance(item, BatchFuture) for item in value)
    return False


def _index_payload(entries: Sequence[Tuple[str, int, int]]) -> bytes:
    return json.dumps({"calls": [list(entry) for entry in entries]},
                      separators=(",", ":")).encode()


class Follower:
    """Slots of a map segment that run nowhere (cache hits, calls following another in flight):
    its future resolves, as a map child's does, to a callable returning the outcomes."""

    def __init__(self, future: BatchFuture, count: int) -> None:
        self.future = future
        self._slots: List[Optional[Outcome]] = [None] * count
        self._left = count
        self._lock = threading.Lock()

    def fill(self, position: int, outcome: Outcome) -> None:
        with self._lock:
            if self._slots[position] is None:
                self._left -= 1
            self._slots[position] = outcome
            complete = self._left == 0
        if complete:
            outcomes = list(self._slots)
            settle(self.future, True, lambda: outcomes)


class CallCache:
    """One session's view of the cache: digests, look-ups, index writes, calls in flight."""

    def __init__(self, storage: Storage, *, definition: str, by_value: bool,
                 initargs: Optional[bytes], dry_run: bool = False) -> None:
        self._storage = storage  # the real one, also in a dry run (reads only)
        self._definition = definition
        self._by_value = by_value
        self._initargs = initargs
        self._dry_run = dry_run
        self._lock = threading.Lock()
        self._environments: Dict[Any, str] = {}
        # function digest -> call digest -> where its outcome may be; index objects known
        self._entries: Dict[str, Dict[str, List[Location]]] = {}
        self._known: Dict[str, Set[str]] = {}
        self._inflight: Dict[str, Tuple[BatchFuture, Optional[int]]] = {}

    # -- digests -------------------------------------------------------------------------------
    def function_digest(self, function_pickle: bytes) -> str:
        return hashlib.sha256(function_pickle).hexdigest()  # its storage name (put_function)

    def call_digest(self, function_digest: str, settings: Any, args: tuple, kwargs: dict) -> str:
        (digest,) = self.call_digests(function_digest, settings, [(args, kwargs)])
        assert digest is not None
        return digest

    def call_digests(self, function_digest: str, settings: Any,
                     calls: Sequence[Optional[Tuple[tuple, dict]]]) -> List[Optional[str]]:
        """Each call's digest (None for None, or for arguments that do not pickle: the
        submission raises for them). One pickler for all, its memo cleared between calls, so
        each call's bytes are its own (a new pickler per call costs ~30 us)."""
        with self._lock:
            environment = self._environments.get(settings)
            if environment is None:
                environment = self._environments[settings] = environment_digest(
                    self._definition, settings, self._initargs)
        base = hashlib.sha256()  # the prefix once; each call's digest continues a copy of it
        for part in (function_digest.encode(), environment.encode()):
            base.update(len(part).to_bytes(8, "little") + part)
        buffer = io.BytesIO()
        digests: List[Optional[str]] = []
        with serialization.local_modules_by_value(self._by_value):
            pickler = cloudpickle.Pickler(buffer, protocol=serialization.PROTOCOL)
            for call in calls:
                if call is None:
                    digests.append(None)
                    continue
                buffer.seek(0)
                buffer.truncate()
                pickler.clear_memo()
                try:
                    pickler.dump((tuple(call[0]), dict(call[1])))
                except Exception:
                    digests.append(None)
                    continue
                arguments = buffer.getvalue()
                hasher = base.copy()
                hasher.update(len(arguments).to_bytes(8, "little") + arguments)
                digests.append(hasher.hexdigest())
        return digests

    # -- calls in flight -----------------------------------------------------------------------
    def leader(self, digest: str) -> Optional[Tuple[BatchFuture, Optional[int]]]:
        with self._lock:
            return self._inflight.get(digest)

    def register(self, digests: Iterable[Tuple[Optional[str], Optional[int]]],
                 future: BatchFuture) -> None:
        """``future`` runs these calls (digest, position in a map child's outcomes or None;
        a None digest is not cacheable); identical calls made before it ends follow it."""
        mine = [(digest, position) for digest, position in digests if digest is not None]
        with self._lock:
            for digest, position in mine:
                self._inflight.setdefault(digest, (future, position))

        def forget(_done: Any) -> None:
            with self._lock:
                for digest, _ in mine:
                    if self._inflight.get(digest, (None,))[0] is future:
                        del self._inflight[digest]
        future.add_done_callback(forget)

    @staticmethod
    def follow(leader: Tuple[BatchFuture, Optional[int]], deliver: Callable[[Outcome], None]) -> None:
        """``deliver`` the leader's outcome for its call once it has one."""
        future, position = leader

        def done(finished: concurrent.futures.Future) -> None:
            if finished.cancelled():
                deliver((False, concurrent.futures.CancelledError()))
                return
            error = finished.exception()
            if error is not None:
                deliver((False, error))
            elif position is None:
                deliver((True, finished.result()))
            else:  # a map child's future: its outcomes, decoded here
                try:
                    deliver(finished.result()()[position])
                except BaseException as failure:  # never lose a follower
                    deliver((False, failure))
        future.add_done_callback(done)

    def settle_follower(self, future: BatchFuture, outcome: Outcome) -> None:
        if outcome[0] or not isinstance(outcome[1], concurrent.futures.CancelledError):
            future._mark_cached(outcome[0])  # not run for itself: it took the first call's outcome
            settle(future, *outcome)
        else:
            future.cancel()

    def hit_outcome(self, encoded: bytes) -> Outcome:
        """The outcome a hit's future takes (in a dry run: what would come from the cache)."""
        if self._dry_run:
            return False, DryRunResult("dry run: this call would come from the cache, not run")
        return wire.outcome_result(encoded)

    # -- the index -----------------------------------------------------------------------------
    def _folder(self, function_digest: str) -> str:
        return self._storage.layout.cache_folder(function_digest)

    def refresh(self, function_digest: str) -> None:
        """One LIST of the function's index folder; a GET of each index object not read yet."""
        storage = self._storage
        try:
            names = [n for n in storage.list_names(self._folder(function_digest))
                     if not n.startswith(".")]
        except Exception as error:  # the cache only saves work: a failed read is a miss
            logger.warning("batchfutures: cannot list the cache of %s: %s", function_digest, error)
            return
        with self._lock:
            known = self._known.setdefault(function_digest, set())
            new = sorted((name for name in names if name not in known), reverse=True)
        if not new:
            return
        if len(new) > MAX_INDEX_READS:  # run ids sort by time: the newest runs' indexes
            logger.warning("batchfutures: the cache of %s has %d index objects not read yet; "
                           "reading the newest %d", function_digest, len(new), MAX_INDEX_READS)
            new = new[:MAX_INDEX_READS]
        read = self._map(lambda name: self._read_index(function_digest, name), new)
        with self._lock:
            entries = self._entries.setdefault(function_digest, {})
            for name, found in zip(new, read):
                if found is None:
                    continue
                self._known[function_digest].add(name)
                for digest, location in found:
                    entries.setdefault(digest, []).append(location)

    def _read_index(self, function_digest: str, name: str) -> Optional[List[Tuple[str, Location]]]:
        storage = self._storage
        run_id, dot, job_key = name.partition(".")
        if not dot:
            return None
        url = f"{self._folder(function_digest)}/{name}"
        try:  # the one sealed read: size first, no link or FIFO, MAC streamed
            data = storage.read_sealed(url, INDEX_KIND, limit=MAX_INDEX_SIZE)
            if data is None:
                return None
            calls = json.loads(bytes(data))["calls"]
        except IntegrityError as error:
            logger.warning("batchfutures: ignoring the cache index %s: %s", name, error)
            return []
        except Exception as error:
            logger.warning("batchfutures: cannot read the cache index %s: %s", name, error)
            return None
        job_url = storage.job_url(run_id, job_key)  # the name was signed: so is where it points
        return [(str(digest), (job_url, int(child), int(position)))
                for digest, child, position in calls]

    def write_index(self, storage: Storage, job: Any, job_url: str) -> None:
        """Before SubmitJob: one index object per function of the job, naming each cacheable
        call's child and position (a killed client's jobs go on writing their results)."""
        by_function: Dict[str, List[Tuple[str, int, int]]] = {}
        for child, group in enumerate(job.futures):
            for index, future in enumerate(group):
                key = future._cache_key
                if key is None:
                    continue
                function_digest, digests = key
                for offset, digest in enumerate(digests):
                    if digest is not None:
                        position = offset if job.per_child else index
                        by_function.setdefault(function_digest, []).append((digest, child, position))
        where = storage.split_job_url(job_url)
        if not by_function or where is None:
            return
        name = f"{where[0]}.{where[1]}"
        for function_digest, entries in by_function.items():
            url = storage.layout.cache_folder(function_digest, name)
            payload = _index_payload(entries)
            if len(payload) > MAX_INDEX_SIZE - 64:  # readers refuse it: these calls go uncached
                logger.warning("batchfutures: not caching the %d calls of %s: their index would "
                               "be over %d bytes", len(entries), url, MAX_INDEX_SIZE)
                continue
            try:
                storage.put_bytes(url, storage.signer.seal(INDEX_KIND, storage.name_of(url),
                                                           payload, root=_mac_root(storage)))
            except Exception as error:  # the job runs all the same; it is just not findable
                logger.warning("batchfutures: cannot write the cache index %s: %s", url, error)
                continue
            if self._dry_run:
                continue
            with self._lock:  # this session's own entries, without reading them back
                self._known.setdefault(function_digest, set()).add(name)
                known = self._entries.setdefault(function_digest, {})
                for digest, child, position in entries:
                    known.setdefault(digest, []).append((job_url, child, position))

    # -- look-up -------------------------------------------------------------------------------
    def lookup(self, function_digest: str, digests: Sequence[Optional[str]]) -> Dict[int, bytes]:
        """The encoded "ok" outcome of each call (by its position in ``digests``) that
        succeeded before; a missing result or a failed item is a miss."""
        with self._lock:
            entries = self._entries.get(function_digest, {})
            candidates = {i: list(entries.get(d, ())) for i, d in enumerate(digests)
                          if d is not None and d in entries}
        children = sorted({(url, child) for found in candidates.values() for url, child, _ in found})
        if not children:
            return {}
        outcomes = dict(zip(children, self._map(self._read_outcomes, children)))
        hits: Dict[int, bytes] = {}
        for i, found in candidates.items():
            for url, child, position in found:
                stored = outcomes.get((url, child)) or []
                if position < len(stored) and stored[position] is not None:
                    hits[i] = stored[position]
                    break
        return hits

    def _read_outcomes(self, child: Tuple[str, int]) -> List[Optional[bytes]]:
        """A child's outcomes, each None unless it is "ok"; [] without a (valid) result."""
        job_url, index = child
        try:
            data = self._storage.read_result(job_url, index)
            if data is None:
                return []
            meta, outcomes = wire.unpack_result(data)
        except IntegrityError as error:
            logger.warning("batchfutures: a cached result failed its check, running the call "
                           "again: %s", error)
            return []
        except Exception as error:
            logger.warning("batchfutures: cannot read a cached result of %s: %s", job_url, error)
            return []
        if meta.get(signing.REFUSED):
            return []
        return [encoded if _is_ok(encoded) else None for encoded in outcomes]

    def _map(self, fn: Callable[[Any], Any], values: List[Any]) -> List[Any]:
        if self._storage.local or len(values) < 2:
            return [fn(value) for value in values]
        with concurrent.futures.ThreadPoolExecutor(min(READERS, len(values))) as pool:
            return list(pool.map(fn, values))


def _mac_root(storage: Storage) -> str:
    """The root a seal is bound to, as storage binds every object it seals."""
    return str(getattr(storage, "mac_root", ""))


def _is_ok(encoded: bytes) -> bool:
    try:
        return wire.outcome_kind(encoded) == wire.OK
    except Exception:
        return False


def forget_runs(storage: Storage, run_ids: Iterable[str]) -> int:
    """Remove the index objects of these (removed) runs; how many. Listings of ``R/cache`` and
    of each function's folder, one DELETE per index object."""
    runs = set(run_ids)
    if not runs:
        return 0
    removed = 0
    root = storage.layout.cache_folder()
    if storage.is_link(root):
        return 0  # never through a symbolic link (as cleanup.remove)
    for function_digest in storage.list_names(root):
        if function_digest.startswith(".") or "/" in function_digest:
            continue
        folder = f"{root}/{function_digest}"
        if storage.is_link(folder):
            continue
        for name in storage.list_names(folder):
            if name.partition(".")[0] in runs:
                storage.delete(f"{folder}/{name}")
                removed += 1
    return removed
