"""Storage: sealed, retried reads and writes under one root, through fsspec (local files, or S3
via s3fs). The names are layout.py's; the bytes of a child's items and results are wire.py's.

The executor writes a job's payload here and submits a Batch job that carries only a URL; the
worker reads its slice and writes its result; the poller lists and reads results.

    client (Session)                    R = file:///.../storage  or  s3://bucket/prefix
    ----------------                    ------------------------------------------------
    put_function(run, pickle)  ───────> R/runs/<run_id>/functions/<sha256>.pkl   once per run, sealed
    write_inputs(job, header, blobs) ─> R/runs/<run_id>/jobs/<job_key>/inputs     one per Batch job
    write_job_pointer(id, job) ───────> R/jobs/<batch job id>                     (attach after expiry)
                                                 │
    worker (child i) <── read_child_inputs ──────┘  GET [0, 64 KiB), then GET its own blob
                     ── write_result(job, i) ──> R/runs/<run_id>/jobs/<job_key>/results/<i>
                     ── write_oom_marker(job, i) > R/runs/<run_id>/jobs/<job_key>/oom/<i>
                        (only on a MemoryError, exit 137; never a result: see worker/main.py)
                                                 │
    poller <── list_results (one LIST) ──────────┤
           <── read_result(job, i) ──────────────┘  checks its seal: IntegrityError, else the bytes
           <── oom_markers(job, [i]) ────────────┘  a FAILED child's, exit 137 with no OOM reason

Every object anyone unpickles is authenticated (signing.py): functions, results and job
pointers are sealed objects (magic, HMAC-SHA256 tag, payload) whose tag binds them to R itself
(``mac_root``: ``s3://bucket/prefix``, ``file:///path``) and to their name under R; the inputs
object carries the MAC of its header in the header and a tag in front of each child's blob.
Readers check before they return a byte: a missing, altered or foreign signature raises
IntegrityError. The key is the Storage's ``signer`` (by default the one
signing.default_signer() finds); the bucket never holds it.

Reading a signed object (a sealed object, or a child's range of an inputs object) is one GET
(one open() locally) streamed into one buffer of the size S3 (or fstat) announces, the MAC
computed chunk by chunk as it arrives (``_Verifying``): no second copy of the object is made,
and an object over ``max_object_size`` (MAX_OBJECT_SIZE, or BATCHFUTURES_MAX_OBJECT_SIZE) is
refused with ObjectTooLargeError, an IntegrityError, before a byte of its body is read.

The inputs object's bytes (a header, an index, a tagged range per child) are wire.py's; Storage
writes it and reads a child's prefix and range, checking each MAC as it goes.

Writes are atomic from a reader's view. A local file is written under a temporary name in the
same folder (``.<name>.<random>.tmp``) and renamed over the target (os.replace), or, for an
exclusive write, hard-linked to it (fails if the target exists); the temporary is removed
whatever happens. An object store PUT (s3fs ``pipe_file``) is atomic by itself (past 100 MB s3fs
uploads in parts, visible only once completed and aborted on failure), and an exclusive one sends
``If-None-Match: *``. A half-written object is never visible and a failed write leaves nothing
behind. On object stores, transient errors (5xx, throttling, connection trouble) are retried
with tenacity within ``STORAGE_RETRY`` (s3fs's and botocore's own retries off); local disk
errors and permanent answers (404, 403, a lost conditional write) fail at once.
"""

from __future__ import annotations

import errno
import hmac
import inspect
import json
import logging
import os
import stat
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from . import wire
from .awsclients import CLIENT_CONFIG
from .errors import ConfigurationError, IntegrityError
from .layout import (
    Layout,
    check_run_id,
    inputs_url,
    oom_folder,
    oom_marker_url,
    result_indices,
    result_url,
    results_folder,
    root_of_job_url,
)
from .signing import SEAL_MAGIC, TAG_SIZE, Signer, check_digest, default_signer
from .workdir import make_private_dirs, open_private

__all__ = ["Storage", "MAX_OBJECT_SIZE", "SIZE_VARIABLE",
           "ObjectTooLargeError", "size_limit"]

# The largest signed object (or inputs range) a reader accepts, checked before its body is read:
# whoever can write the bucket could otherwise make a worker or the client allocate any size.
MAX_OBJECT_SIZE = 2 * 1024 ** 3
SIZE_VARIABLE = "BATCHFUTURES_MAX_OBJECT_SIZE"  # bytes; overrides MAX_OBJECT_SIZE
READ_CHUNK = 1024 * 1024  # bytes fed to the MAC (and copied into the buffer) at a time
OOM_KIND = "oom"  # an out-of-memory marker's seal (layout.oom_marker_url says where)
_MARKER_GETS = 8  # the poller reads this many markers one GET each; more: one LIST first
_T = TypeVar("_T")
logger = logging.getLogger("batchfutures")
_OPENED: Dict[str, "Storage"] = {}  # root URL -> the Storage from_url last made for it

try:  # tenacity >= 8.3: stop before a wait that would end past the budget's seconds
    from tenacity import stop_before_delay
except ImportError:  # older tenacity: may overshoot by one wait
    from tenacity import stop_after_delay as stop_before_delay  # type: ignore[assignment]


@dataclass(frozen=True)
class StorageRetryBudget:
    """How long one storage call may keep trying: attempts and seconds, whichever ends first."""

    attempts: int
    seconds: float  # from the first attempt; a wait that would end past it is not started
    first_wait: float  # full jitter: wait n is uniform in [0, min(max_wait, first_wait * 2^(n-1))]
    max_wait: float


STORAGE_RETRY = StorageRetryBudget(attempts=10, seconds=20.0, first_wait=0.5, max_wait=5.0)
"""The one retry budget of every S3 call, in the client and in the worker (s3fs's loop and
botocore's retries are off, so budgets never multiply).

Why these numbers: every child of a run GETs the same function and inputs objects, so at
thousands of children S3 answers 503 SlowDown in bursts until the prefix scales. The old 4
attempts in ~1.4 s failed children a longer wait would have carried. Waits widen 0.5, 1, 2, 4 s
then stay at 5 s (full jitter, so children that failed together do not return together): about
16 s of waiting on average over 9 waits, never past 20 s. That outlasts a burst of seconds, and
is still short against a child's run and Batch's own retry of a failed attempt, so an S3 that
is really down fails the call within ~20 s.
"""

# errno values that say "try again" (s3fs maps 500 to EREMOTEIO, 503 SlowDown and 409 to EBUSY)
_TRANSIENT_ERRNOS = {
    errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.EIO, errno.ETIMEDOUT, errno.ECONNRESET,
    errno.ECONNABORTED, errno.ECONNREFUSED, errno.EPIPE, getattr(errno, "EREMOTEIO", 121),
    getattr(errno, "ESTALE", 116),
}
# 408 RequestTimeout, 409 a conflicting operation in progress ("try again"), 429 throttling
_TRANSIENT_STATUSES = {408, 409, 429, 500, 502, 503, 504}
_PERMANENT = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
              NotADirectoryError, NotImplementedError)
_TRANSIENT_NAMES = ("Timeout", "Connection", "IncompleteRead", "ResponseParser", "ClientPayload",
                    "HTTPClientError")


def _http_status(error: BaseException) -> Optional[int]:
    """The HTTP status of the S3 answer behind an error (s3fs keeps the ClientError as its
    cause), or None for errors without one (connections, local disks)."""
    for candidate in (error, error.__cause__):
        response = getattr(candidate, "response", None)
        if isinstance(response, dict):
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if isinstance(status, int) and status:
                return status
    return None


def _transient(error: BaseException) -> bool:
    """Worth another attempt: network trouble, throttling, a 5xx; not a missing object, a
    refusal or a lost conditional write (those fail at once)."""
    if isinstance(error, _PERMANENT):
        return False
    if isinstance(error, (TimeoutError, ConnectionError)):
        return True  # S3's RequestTimeout is a 400, mapped to TimeoutError by s3fs
    status = _http_status(error)
    if status is not None:
        return status in _TRANSIENT_STATUSES  # any other 4xx, and 501, is permanent
    if isinstance(error, OSError):
        # s3fs turns an S3 error code it does not know into an OSError without errno or EIO
        return error.errno is None or error.errno in _TRANSIENT_ERRNOS
    # botocore/aiohttp connection and read errors that reach us untranslated
    return any(word in cls.__name__ for cls in type(error).__mro__ for word in _TRANSIENT_NAMES)


def _log_retry(state: Any) -> None:
    logger.debug("storage: retrying %s after %r (attempt %d)",
                 getattr(state.fn, "__name__", "call"), state.outcome.exception(),
                 state.attempt_number)


def _retrying(budget: StorageRetryBudget = STORAGE_RETRY,
              sleep: Callable[[float], Any] = time.sleep) -> Retrying:
    """The tenacity policy of one storage call (``sleep``: a fake clock's, in tests)."""
    return Retrying(
        retry=retry_if_exception(_transient),
        wait=wait_random_exponential(multiplier=budget.first_wait, max=budget.max_wait),
        stop=stop_after_attempt(budget.attempts) | stop_before_delay(budget.seconds),
        before_sleep=_log_retry, sleep=sleep, reraise=True)


def _one_retry_layer(options: Dict[str, Any]) -> Tuple[Dict[str, Any], int]:
    """s3fs options with botocore's retries off (unless the caller set them), and how many
    passes s3fs's own loop makes (``retries``, 1 unless given): STORAGE_RETRY is the budget.

    s3fs ignores ``retries`` as an option (its loop count is the ``retries`` attribute, and an
    unknown option reaches AioSession), so it is taken out here and set on the filesystem.
    """
    options = dict(options)
    loops = int(options.pop("retries", 1))
    config = dict(options.get("config_kwargs") or {})  # never mutate the caller's dict
    config.setdefault("retries", dict(CLIENT_CONFIG["retries"]))
    options["config_kwargs"] = config
    return options, max(1, loops)


def _s3_options(options: Dict[str, Any]) -> Dict[str, Any]:
    """Point s3fs at AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (moto, MinIO, LocalStack).

    botocore >= 1.31 reads these variables itself, but s3fs >= 2023.1 may come with an older
    aiobotocore/botocore that does not, so the endpoint is passed explicitly unless the caller
    gave one or AWS_IGNORE_CONFIGURED_ENDPOINT_URLS is set.
    """
    if os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() in ("1", "true"):
        return options
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    client_kwargs = dict(options.get("client_kwargs") or {})  # never mutate the caller's dict
    if endpoint and not options.get("endpoint_url") and not client_kwargs.get("endpoint_url"):
        client_kwargs["endpoint_url"] = endpoint
        options = {**options, "client_kwargs": client_kwargs}
    return options


class ObjectTooLargeError(IntegrityError):
    """A stored object over the size limit: refused before its body was read (nothing unpickled)."""

    def __init__(self, url: str, size: int, limit: int) -> None:
        super().__init__(
            f"the stored object {url} is {size} bytes, over the limit of {limit} bytes; refusing "
            f"to read it (nothing of it was read or unpickled). If it is yours, raise the limit: "
            f"{SIZE_VARIABLE}=<bytes> in the client's environment and the job's environment=")
        self.url, self.size, self.limit = url, size, limit

    def __reduce__(self) -> Any:
        return (type(self), (self.url, self.size, self.limit))


def size_limit(environ: Optional[Mapping[str, str]] = None) -> int:
    """The size limit ``environ`` (default os.environ) sets with SIZE_VARIABLE, else MAX_OBJECT_SIZE."""
    raw = (os.environ if environ is None else environ).get(SIZE_VARIABLE, "").strip()
    if not raw:
        return MAX_OBJECT_SIZE
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigurationError(f"{SIZE_VARIABLE}={raw!r} is not a positive number of bytes")
    return value


class _Verifying:
    """One signed object (or inputs range) read into one buffer while its MAC is computed.

    ``head`` bytes come first (the seal's magic and tag, or a range's tag) and are kept apart;
    the rest, the payload, goes into a buffer of exactly its size and through ``digest_for(n)``
    (signing.mac_stream for a payload of n bytes) as it arrives. ``begin(size)`` is called with
    the size the store announces, before any of the body is read: over ``limit`` it raises
    ObjectTooLargeError; a size other than ``expected`` (a range's) is a truncated object.
    """

    def __init__(self, url: str, limit: int, head: int, digest_for: Callable[[int], "hmac.HMAC"],
                 short: str, expected: Optional[int] = None,
                 check_head: Optional[Callable[[bytearray], None]] = None) -> None:
        self.url, self.limit, self.expected = url, limit, expected
        self._head_size, self._digest_for, self._short = head, digest_for, short
        self._check_head = check_head
        self.head = bytearray()
        self.payload = bytearray()
        self._filled = 0
        self.remaining = 0
        self.digest: Optional["hmac.HMAC"] = None

    def begin(self, size: int) -> None:
        if size > self.limit:
            raise ObjectTooLargeError(self.url, size, self.limit)
        if self.expected is not None and size != self.expected:
            raise IntegrityError(f"{self.url} is truncated: {size} of its {self.expected} bytes "
                                 f"are there; refusing it, nothing was unpickled")
        if size < self._head_size:
            raise IntegrityError(self._short)
        self.payload = bytearray(size - self._head_size)
        self.digest = self._digest_for(len(self.payload))
        self.remaining = size

    def feed(self, chunk: bytes) -> None:
        view = memoryview(chunk)[:self.remaining]
        self.remaining -= len(view)
        if len(self.head) < self._head_size:
            take = self._head_size - len(self.head)
            self.head += view[:take]
            view = view[take:]
            if len(self.head) == self._head_size and self._check_head is not None:
                self._check_head(self.head)  # e.g. no seal magic: stop before the payload
        if view:
            assert self.digest is not None
            self.payload[self._filled:self._filled + len(view)] = view
            self.digest.update(view)
            self._filled += len(view)

    def finish(self) -> None:
        if self.remaining:
            raise IntegrityError(f"{self.url} is truncated: it ended {self.remaining} bytes early; "
                                 f"refusing it, nothing was unpickled")


class Storage:
    """Reads and writes the payloads of every job under one root URL."""

    def __init__(self, root_url: str, *, storage_options: Optional[Dict[str, Any]] = None,
                 signer: Optional[Signer] = None, max_object_size: Optional[int] = None) -> None:
        """``max_object_size``: the largest signed object read (default: SIZE_VARIABLE, else
        MAX_OBJECT_SIZE)."""
        options = dict(storage_options or {})
        s3, loops = root_url.startswith(("s3://", "s3a://")), 1
        if s3:
            options, loops = _one_retry_layer(_s3_options(options))
        self.storage_options = options
        self.fs, path = fsspec.core.url_to_fs(root_url, **options)
        if s3:
            self.fs.retries = loops  # s3fs's own loop: one pass; STORAGE_RETRY does the retrying
        self.root = path.rstrip("/")
        self.root_url = root_url.rstrip("/")
        self.layout = Layout(self.root_url)
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        # what every MAC binds besides the name: the bucket and prefix (or folder) themselves,
        # so a job copied whole to another root under the same key does not verify there
        self.mac_root = f"{protocol}://{self.root}"
        self.max_object_size = size_limit() if max_object_size is None else max_object_size
        self.local = isinstance(self.fs, LocalFileSystem)
        # s3fs >= 2024.12 can PUT with If-None-Match: * (pipe_file(mode="create"))
        pipe = getattr(self.fs, "_pipe_file", None)
        self._conditional_put = pipe is not None and "mode" in inspect.signature(pipe).parameters
        self._uploaded: Set[str] = set()
        self._lock = threading.Lock()
        self._signer = signer

    @classmethod
    def from_url(cls, url: str, *, storage_options: Optional[Dict[str, Any]] = None,
                 signer: Optional[Signer] = None,
                 max_object_size: Optional[int] = None) -> "Storage":
        """The Storage rooted at R of a job URL ``R/runs/<run_id>/jobs/<job_key>`` (the worker's).

        The last one made for each root is kept (``opened``): the worker's out-of-memory marker
        is written with it, its key already loaded, when memory is short."""
        root = root_of_job_url(url)
        if root is None:
            raise ValueError(f"{url!r} is not a batchfutures job URL (R/runs/<run>/jobs/<key>)")
        storage = cls(root, storage_options=storage_options, signer=signer,
                      max_object_size=max_object_size)
        _OPENED[storage.root_url] = storage
        return storage

    @staticmethod
    def opened(url: str) -> Optional["Storage"]:
        """The Storage ``from_url`` last made for the root of job URL ``url``, if any."""
        root = root_of_job_url(url)
        return _OPENED.get(root) if root is not None else None

    @property
    def signer(self) -> Signer:
        """The key every object is sealed and checked with (signing.default_signer() if none given)."""
        if self._signer is None:
            with self._lock:
                if self._signer is None:
                    self._signer = default_signer()
        return self._signer

    def name_of(self, url: str) -> str:
        """An object's name for its signature: its key under the root (the URL if outside it)."""
        return self.layout.name_of(url)

    def __repr__(self) -> str:
        return f"Storage({self.root_url!r})"

    # -- URLs (layout.py's names) and paths ------------------------------------------------------
    def url(self, *parts: str) -> str:
        return self.layout.url(*parts)

    def run_url(self, run_id: str) -> str:
        return self.layout.run_url(run_id)

    def job_url(self, run_id: str, job_key: str) -> str:
        return self.layout.job_url(run_id, job_key)

    @staticmethod
    def inputs_url(job_url: str) -> str:
        return inputs_url(job_url)

    @staticmethod
    def result_url(job_url: str, index: int) -> str:
        return result_url(job_url, index)

    def _path(self, url: str) -> str:
        if url.startswith(self.root_url):
            return self.root + url[len(self.root_url):]
        return self.fs._strip_protocol(url)

    def _retried(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        if self.local:  # local disk errors are not transient; fail at once
            return fn(*args, **kwargs)
        return _retrying()(fn, *args, **kwargs)

    # -- primitive, atomic operations --------------------------------------------------------
    def put_bytes(self, url: str, data: bytes, *, exclusive: bool = False) -> bool:
        """Write one whole object atomically; retried on transient errors.

        ``exclusive=True`` writes only if no object exists there yet and returns False (writing
        nothing) when one does. Returns True when this call wrote the object.
        """
        return self._retried(self._put_once, self._path(url), data, exclusive)

    def _put_once(self, path: str, data: bytes, exclusive: bool) -> bool:
        if self.local:
            return _local_atomic_write(path, data, exclusive)
        if not exclusive:
            self.fs.pipe_file(path, data)
            return True
        if self._conditional_put:
            try:
                self.fs.pipe_file(path, data, mode="create")  # PUT with If-None-Match: *
                return True
            except FileExistsError:
                return False
            except OSError as error:  # 501 NotImplemented: a store without conditional writes
                if error.errno != errno.ENOSYS:
                    raise
        if self._object_at(path):  # best effort where the store cannot check for us
            return False
        self.fs.pipe_file(path, data)
        return True

    def get_bytes(self, url: str, start: Optional[int] = None,
                  end: Optional[int] = None) -> Optional[bytes]:
        """The object's bytes [start, end), or None when it does not exist."""
        path = self._path(url)
        if start is None and not self.local:
            # s3fs reads a whole object by first asking its size, from a listing cache that may
            # predate the object; a range "bytes=0-" is one GET that always sees the object.
            start = 0

        if self.local:  # never through a symlink, never blocking on a FIFO, size checked first
            return self._local_bytes(url, path, start, end)

        def read() -> Optional[bytes]:
            try:
                return self.fs.cat_file(path, start=start, end=end)
            except FileNotFoundError:
                return None
            except OSError as error:  # 416 for a range on an empty object
                if error.errno != errno.EINVAL or start or end is not None:
                    raise
                self.fs.invalidate_cache(path)
                return self.fs.cat_file(path)
        return self._retried(read)

    def _local_bytes(self, url: str, path: str, start: Optional[int],
                     end: Optional[int]) -> Optional[bytes]:
        """A local file's bytes [start, end) as a range read on S3 gives them (a range past the
        end reads what is there), opened as every local read is (``_open_local``); a read to
        the end over ``max_object_size`` is refused before it is read."""
        opened = self._open_local(url, path)
        if opened is None:
            return None
        handle, size = opened
        with handle:
            first, last = _byte_range(start, end, size)
            if end is None and last - first > self.max_object_size:  # a range is the caller's
                raise ObjectTooLargeError(url, last - first, self.max_object_size)
            handle.seek(first)
            return handle.read(max(0, last - first))

    @staticmethod
    def _open_local(url: str, path: str) -> Optional[Tuple[Any, int]]:
        """(an unbuffered handle, its size) of the regular file at ``path``: opened without
        following a symlink (IntegrityError) nor blocking on a FIFO or device (IntegrityError);
        None when there is none."""
        try:
            descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                                 | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno != errno.ELOOP:
                raise
            raise IntegrityError(f"{url} is a symbolic link; refusing it, nothing was "
                                 f"unpickled") from None
        handle = open(descriptor, "rb", buffering=0)
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            handle.close()
            raise IntegrityError(f"{url} is not a regular file; refusing it")
        return handle, info.st_size

    def _read_verified(self, url: str, make: Callable[[], _Verifying], start: Optional[int] = None,
                       end: Optional[int] = None) -> Optional[_Verifying]:
        """Stream the object at ``url`` (bytes [start, end)) through a fresh ``make()`` per
        attempt: one GET whose announced size ``begin`` judges before the body is read. None
        when there is no object."""
        _ = self.signer.key  # a missing key fails here, not inside the S3 event loop
        path = self._path(url)
        ranged = start is not None or end is not None

        def local() -> Optional[_Verifying]:
            opened = self._open_local(url, path)  # never through a symlink, never a FIFO
            if opened is None:
                return None
            handle, size = opened
            with handle:
                first, last = _byte_range(start, end, size)
                sink = make()
                sink.begin(max(0, last - first))  # before a byte of it is read
                handle.seek(first)
                while sink.remaining:
                    chunk = handle.read(min(READ_CHUNK, sink.remaining))
                    if not chunk:
                        break
                    sink.feed(chunk)
                sink.finish()
                return sink

        if self.local:
            return local()
        # start-up: fsspec.asyn adds ~1 ms to each worker's start; a file:// one never needs it
        from fsspec.asyn import sync

        bucket, key, _ = self.fs.split_path(path)
        extra = {"Range": f"bytes={start or 0}-{'' if end is None else end - 1}"} if ranged else {}

        async def stream() -> Optional[_Verifying]:
            sink = make()
            try:
                response = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, **extra)
            except FileNotFoundError:
                return None
            except OSError as error:  # 416: a range past the end of the object
                if not ranged or error.errno != errno.EINVAL:
                    raise
                sink.begin(0)
                sink.finish()
                return sink
            body = response["Body"]
            try:
                sink.begin(int(response.get("ContentLength") or 0))  # before the body is read
                while sink.remaining:
                    chunk = await body.read(min(READ_CHUNK, sink.remaining))
                    if not chunk:
                        break
                    sink.feed(chunk)
            finally:
                body.close()  # unread (an object refused by its size): the connection is dropped
            sink.finish()
            return sink
        return self._retried(lambda: sync(self.fs.loop, stream))

    def read_sealed(self, url: str, kind: str, *, limit: Optional[int] = None
                    ) -> Optional[bytearray]:
        """The payload of the sealed object of ``kind`` at ``url``, read as every signed object
        is: its size checked first (against ``limit`` when smaller than ``max_object_size``),
        never through a symlink or FIFO locally, the MAC computed as it streams in
        (IntegrityError, ObjectTooLargeError); None when there is none."""
        return self._read_sealed(url, kind, limit=limit)

    def _read_sealed(self, url: str, kind: str, *, limit: Optional[int] = None
                     ) -> Optional[bytearray]:
        """A sealed object's payload, its MAC checked as it was read; None when there is none."""
        cap = self.max_object_size if limit is None else min(limit, self.max_object_size)
        name = self.name_of(url)
        unsigned = (f"the {kind} object {name} is not signed; refusing to load it (nothing was "
                    f"unpickled)")

        def magic(head: bytearray) -> None:
            if head[:len(SEAL_MAGIC)] != SEAL_MAGIC:
                raise IntegrityError(unsigned)

        def make() -> _Verifying:
            return _Verifying(
                url, cap, len(SEAL_MAGIC) + TAG_SIZE,
                lambda size: self.signer.mac_stream(kind, name, root=self.mac_root, tail=size),
                unsigned, check_head=magic)
        sink = self._read_verified(url, make)
        if sink is None:
            return None
        assert sink.digest is not None
        check_digest(sink.head[len(SEAL_MAGIC):], sink.digest, kind, name)
        return sink.payload

    def exists(self, url: str) -> bool:
        """Whether an object or a folder is there."""
        path = self._path(url)
        if not self.local:
            self.fs.invalidate_cache(path)  # s3fs caches listings; other processes write
        return bool(self._retried(self.fs.exists, path))

    def list_names(self, url: str) -> List[str]:
        """The names in the folder at ``url`` (one LIST on S3; [] when there is none)."""
        path = self._path(url)
        if self.local:  # fsspec's ls strips and rebuilds every path: 5 us an entry, per poll
            try:
                return os.listdir(path)
            except (FileNotFoundError, NotADirectoryError):
                return []
        self.fs.invalidate_cache(path)

        def names() -> List[str]:
            try:
                entries = self.fs.ls(path, detail=False)
            except FileNotFoundError:
                return []
            return [entry.rstrip("/").rpartition("/")[2] for entry in entries]
        return self._retried(names)

    def is_link(self, url: str) -> bool:
        """Whether ``url`` is a symbolic link on local storage (never followed by a removal)."""
        return self.local and os.path.islink(self._path(url))

    def _names_after(self, url: str, after: str) -> List[str]:
        """The names in a folder that sort after ``after``: ListObjectsV2 with StartAfter, through
        s3fs's own paging and retries (its ``ls`` has no StartAfter)."""
        from fsspec.asyn import sync  # start-up: as in _read_verified (s3fs imported it here)

        list_pages = getattr(self.fs, "_list_pages", None)
        if list_pages is None:  # an s3fs without it: the whole folder
            return [name for name in self.list_names(url) if name > after]
        bucket, key, _ = self.fs.split_path(self._path(url))
        prefix = key.rstrip("/") + "/"

        async def collect() -> List[str]:
            names: List[str] = []
            async for page in list_pages("list_objects_v2", Bucket=bucket, Prefix=prefix,
                                         StartAfter=prefix + after, **self.fs.req_kw):
                names.extend(item["Key"][len(prefix):] for item in page.get("Contents", ()))
            return names
        return self._retried(lambda: sync(self.fs.loop, collect))

    def delete(self, url: str) -> None:
        """Remove an object or a whole folder; nothing there is fine."""
        path = self._path(url)
        with self._lock:  # put_function must upload again what is deleted here
            gone = url.rstrip("/")
            self._uploaded = {known for known in self._uploaded
                              if known != gone and not known.startswith(gone + "/")}

        def remove() -> None:
            try:
                self.fs.rm(path, recursive=True)
            except FileNotFoundError:
                pass
        self._retried(remove)
        if not self.local:
            self.fs.invalidate_cache(path)

    # -- functions ---------------------------------------------------------------------------
    def function_url(self, run_id: str, payload: bytes) -> str:
        return self.layout.function_url(run_id, payload)

    def put_function(self, run_id: str, payload: bytes) -> str:
        """Upload a pickled callable, sealed, under its content hash, once per run and Storage."""
        url = self.function_url(run_id, payload)
        with self._lock:
            if url in self._uploaded:
                return url
        self.put_bytes(url, self.signer.seal("function", self.name_of(url), payload,
                                             root=self.mac_root))
        with self._lock:
            self._uploaded.add(url)
        return url

    def get_function(self, url: str) -> bytearray:
        """The callable's pickle, once its seal is checked (IntegrityError otherwise)."""
        data = self._read_sealed(url, "function")
        if data is None:
            raise FileNotFoundError(f"the function payload {url} is missing")
        return data

    # -- inputs ------------------------------------------------------------------------------
    def write_inputs(self, job_url: str, header: Dict[str, Any], child_blobs: List[bytes]) -> str:
        """Write a Batch job's inputs object (its bytes: wire.pack_inputs); returns its URL.

        ``header["children"]`` is set to ``len(child_blobs)``; the header and every blob are
        signed with this Storage's key.
        """
        url = self.inputs_url(job_url)
        name = self.name_of(url)
        body = wire.inputs_header_body(header, len(child_blobs))
        header_mac = self.signer.mac("inputs-header", name, body, root=self.mac_root)
        tags = [self.signer.mac("inputs-child", name, wire.child_number(index), header_mac, blob,
                                root=self.mac_root) for index, blob in enumerate(child_blobs)]
        self.put_bytes(url, wire.pack_inputs(body, header_mac, tags, child_blobs))
        return url

    def read_header(self, job_url: str) -> Dict[str, Any]:
        """The inputs header, once its MAC is checked (IntegrityError otherwise)."""
        return self._read_prefix(job_url)[0]

    def _read_prefix(self, job_url: str) -> Tuple[Dict[str, Any], bytes, int, bytes]:
        """(checked header, the bytes read so far from offset 0, index table offset, header MAC)."""
        url = self.inputs_url(job_url)
        prefix = self.get_bytes(url, 0, wire.PREFIX_READ)
        if prefix is None:
            raise FileNotFoundError(f"the inputs of {job_url} are missing")
        table = wire.index_offset(prefix)
        if table is None:
            raise IntegrityError(f"{url} is not a batchfutures inputs object signed as this "
                                 f"version writes them ({wire.INPUTS_MAGIC!r}); refusing it, "
                                 f"nothing was unpickled")
        if table > self.max_object_size:
            raise ObjectTooLargeError(url, table, self.max_object_size)
        if table > len(prefix):  # a header longer than the prefix: one more read
            prefix += self._range(url, len(prefix), table)
        header, header_mac = self._checked_header(url, prefix[wire.INPUTS_PREAMBLE:table])
        return header, prefix, table, header_mac

    def _checked_header(self, url: str, stored: bytes) -> Tuple[Dict[str, Any], bytes]:
        """Check the header's MAC over the exact bytes it covers, then parse those bytes."""
        name = self.name_of(url)
        signed = wire.split_signed_header(stored)
        if signed is None:
            raise IntegrityError(f"the inputs object {name} has an unsigned header; refusing it, "
                                 f"nothing was unpickled")
        body, header_mac = signed
        self.signer.check(header_mac, "inputs-header", name, body, root=self.mac_root)
        return json.loads(body), header_mac

    def _range(self, url: str, start: int, end: int) -> bytes:
        data = self.get_bytes(url, start, end)
        if data is None or len(data) != end - start:  # a signed object is never short
            raise IntegrityError(f"{url} is truncated: bytes [{start}, {end}) are not all there")
        return data

    def read_child_inputs(self, job_url: str, index: int) -> Tuple[Dict[str, Any], bytearray]:
        """The header and child ``index``'s blob, reading only the prefix and its own range.

        Both are checked against their MACs before they are returned (IntegrityError otherwise).
        """
        url = self.inputs_url(job_url)
        header, prefix, table, header_mac = self._read_prefix(job_url)
        children = int(header["children"])
        if not 0 <= index < children:
            raise IndexError(f"child {index} is out of range: the job has {children} children")
        entry = wire.index_entry(table, index)
        if entry + wire.INDEX_ENTRY <= len(prefix):
            start, stop = wire.child_range(prefix, entry)
        else:  # more children than the prefix has index entries for
            start, stop = wire.child_range(self._range(url, entry, entry + wire.INDEX_ENTRY), 0)
        if not (table < start and start + TAG_SIZE <= stop):
            raise IntegrityError(f"the inputs object {self.name_of(url)} has a corrupt index entry "
                                 f"for child {index}; refusing it")
        name = self.name_of(url)
        if stop <= len(prefix):  # a plain job: the prefix already holds its range
            blob = bytearray(memoryview(prefix)[start + TAG_SIZE:stop])
            self.signer.check(prefix[start:start + TAG_SIZE], "inputs-child", name,
                              wire.child_number(index), header_mac, blob, root=self.mac_root)
            return header, blob
        if stop - start > self.max_object_size:
            raise ObjectTooLargeError(f"{url} (child {index})", stop - start, self.max_object_size)

        def make() -> _Verifying:
            return _Verifying(
                url, self.max_object_size, TAG_SIZE,
                lambda size: self.signer.mac_stream("inputs-child", name, wire.child_number(index),
                                                    header_mac, root=self.mac_root, tail=size),
                f"{url} is truncated", expected=stop - start)
        sink = self._read_verified(url, make, start, stop)
        if sink is None:
            raise FileNotFoundError(f"the inputs of {job_url} are missing")
        assert sink.digest is not None
        check_digest(sink.head, sink.digest, "inputs-child", name)
        return header, sink.payload

    # -- results -----------------------------------------------------------------------------
    def write_result(self, job_url: str, index: int, data: bytes, *, overwrite: bool = False) -> bool:
        """Write child ``index``'s result object once, sealed.

        Returns False, keeping the object that is there, when a result already exists (an
        earlier attempt finished): a retry never replaces a finished result.
        """
        url = self.result_url(job_url, index)
        sealed = self.signer.seal("result", self.name_of(url), data, root=self.mac_root)
        return self.put_bytes(url, sealed, exclusive=not overwrite)

    def read_result(self, job_url: str, index: int) -> Optional[bytearray]:
        """Child ``index``'s result bytes, None when there is none; IntegrityError when its seal
        does not check (nothing of it must then be unpickled)."""
        return self._read_sealed(self.result_url(job_url, index), "result")

    def has_result(self, job_url: str, index: int) -> bool:
        return self.object_exists(self.result_url(job_url, index))

    # -- out-of-memory markers ---------------------------------------------------------------
    @staticmethod
    def oom_marker_url(job_url: str, index: int) -> str:
        return oom_marker_url(job_url, index)

    def write_oom_marker(self, job_url: str, index: int, attempt: Optional[str] = None) -> None:
        """Record that child ``index`` (its Batch attempt ``attempt``, AWS_BATCH_JOB_ATTEMPT)
        ended on a MemoryError: a sealed object of a few dozen bytes (written when memory is
        short; the caller tolerates its failure). A later attempt's marker replaces an earlier
        one's; a result is never touched."""
        url = self.oom_marker_url(job_url, index)
        payload = json.dumps({"attempt": attempt, "time": round(time.time(), 3)},
                             separators=(",", ":")).encode()
        self.put_bytes(url, self.signer.seal(OOM_KIND, self.name_of(url), payload,
                                             root=self.mac_root))

    def read_oom_marker(self, job_url: str, index: int) -> Optional[Dict[str, Any]]:
        """Child ``index``'s out-of-memory marker (``{"attempt": "1" | None, "time": epoch}``),
        None when there is none; IntegrityError when its seal does not check (JSON, never a
        pickle, is read from it)."""
        url = self.oom_marker_url(job_url, index)
        data = self._read_sealed(url, OOM_KIND)
        if data is None:
            return None
        try:
            marker = json.loads(bytes(data).decode())
        except ValueError:
            marker = None
        if not isinstance(marker, dict):
            raise IntegrityError(f"the out-of-memory marker {self.name_of(url)} is not a marker")
        return marker

    def list_oom_markers(self, job_url: str) -> Set[int]:
        """Indices of the children of the job that recorded an out-of-memory marker."""
        return set(result_indices(self.list_names(oom_folder(job_url))))

    def oom_markers(self, job_url: str, indices: Sequence[int]) -> Dict[int, Optional[Dict[str, Any]]]:
        """The poller's read of the markers of failed children: index -> marker or None. A marker
        whose seal does not check counts as none (logged): it cannot make a failure an OOM.
        Other read errors propagate (the poll is made again). Past a few indices one listing
        says which markers exist, and only those are read."""
        found: Dict[int, Optional[Dict[str, Any]]] = {}
        present = self.list_oom_markers(job_url) if len(indices) > _MARKER_GETS else None
        for index in indices:
            if present is not None and index not in present:
                found[index] = None
                continue
            try:
                found[index] = self.read_oom_marker(job_url, index)
            except IntegrityError as error:
                logger.warning("batchfutures: ignoring the out-of-memory marker of child %d of "
                               "%s: %s", index, job_url, error)
                found[index] = None
        return found

    def object_exists(self, url: str) -> bool:
        """Whether an object (not a folder) is there; one GET of its first byte on S3.

        s3fs's exists() sends a HEAD and, for a missing key, a LIST too (it may be a folder).
        """
        return self._object_at(self._path(url))

    def _object_at(self, path: str) -> bool:
        if self.local:
            return os.path.isfile(path)

        def probe() -> bool:
            try:
                self.fs.cat_file(path, start=0, end=1)
            except FileNotFoundError:
                return False
            except OSError as error:
                if error.errno != errno.EINVAL:  # 416: an empty object is still there
                    raise
            return True
        return self._retried(probe)

    def list_results(self, job_url: str, start: int = 0) -> Set[int]:
        """Indices ``>= start`` of the children whose result is written (temporaries skipped).

        On S3 the listing starts after the key of ``start - 1`` (StartAfter), so its pages grow
        with the results written from ``start`` on, not with every result of the job.
        """
        folder = results_folder(job_url)
        if start > 0 and not self.local:
            after = self.name_of(self.result_url(job_url, start - 1))
            names = self._names_after(folder, after.rpartition("/")[2])
        else:
            names = self.list_names(folder)
        return {index for index in result_indices(names) if index >= start}

    # -- job pointers, runs, cleanup ---------------------------------------------------------
    def write_job_pointer(self, job_id: str, job_url: str) -> None:
        url = self.layout.pointer_url(job_id)
        self.put_bytes(url, self.signer.seal("pointer", self.name_of(url), job_url.encode(),
                                             root=self.mac_root))

    def read_job_pointer(self, job_id: str) -> Optional[str]:
        """The job URL recorded for a Batch job (sealed: a pointer cannot be redirected)."""
        data = self._read_sealed(self.layout.pointer_url(job_id), "pointer")
        return data.decode() if data is not None else None

    def delete_job(self, job_url: str) -> None:
        self.delete(job_url)

    def delete_run(self, run_id: str, job_ids: Sequence[str] = ()) -> None:
        """Remove a run's folder, and the pointers of its Batch jobs ``job_ids``."""
        check_run_id(run_id)
        self.delete(self.run_url(run_id))
        for job_id in job_ids:
            self.delete_job_pointer(job_id)

    def delete_job_pointer(self, job_id: str) -> None:
        self.delete(self.layout.pointer_url(job_id))

    def list_job_pointers(self) -> List[Tuple[str, Optional[float]]]:
        """(Batch job id, time its pointer was written, or None) of every job pointer: one LIST."""
        path = self._path(self.layout.pointers_folder())
        if not self.local:
            self.fs.invalidate_cache(path)

        def entries() -> List[Dict[str, Any]]:
            try:
                return self.fs.ls(path, detail=True)
            except FileNotFoundError:
                return []
        found = []
        for entry in self._retried(entries):
            name = entry["name"].rstrip("/").rpartition("/")[2]
            if name and not name.startswith(".") and entry.get("type") != "directory":
                found.append((name, _epoch(entry.get("mtime") or entry.get("LastModified"))))
        return sorted(found)

    def run_job_keys(self, run_id: str) -> List[str]:
        """The job keys a run holds payloads for (``R/runs/<run_id>/jobs/<job_key>``)."""
        return sorted(name for name in self.list_names(self.layout.run_jobs_folder(run_id))
                      if not name.startswith("."))

    def split_job_url(self, job_url: str) -> Optional[Tuple[str, str]]:
        """(run id, job key) of a job URL under this root, or None."""
        return self.layout.split_job_url(job_url)

    def list_runs(self) -> List[Tuple[str, Optional[float]]]:
        """(run id, newest modification time in the run as epoch seconds, or None) per run.

        One recursive listing of ``R/runs`` (S3 "folders" have no time of their own, and a local
        folder's time does not follow its subfolders), so its cost grows with the objects stored.
        """
        path = self._path(self.layout.runs_folder())
        if not self.local:
            self.fs.invalidate_cache(path)

        def find() -> Dict[str, Any]:
            try:
                return self.fs.find(path, withdirs=True, detail=True)
            except FileNotFoundError:
                return {}
        runs: Dict[str, Optional[float]] = {}
        for name, entry in self._retried(find).items():
            relative = name.rstrip("/")[len(path.rstrip("/")) + 1:]
            run_id = relative.split("/", 1)[0]
            if not run_id or run_id.startswith("."):
                continue
            modified = _epoch(entry.get("mtime") or entry.get("LastModified"))
            known = runs.get(run_id)
            runs[run_id] = modified if known is None else max(known, modified or known)
        return sorted(runs.items())


def _epoch(value: Any) -> Optional[float]:
    if value is None:
        return None
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    return float(value)


def _byte_range(start: Optional[int], end: Optional[int], size: int) -> Tuple[int, int]:
    """[first, last) of bytes [start, end) of an object of ``size`` bytes, as a range GET on S3
    reads it: a range past the end reads what is there."""
    return min(start or 0, size), size if end is None else min(end, size)


def _local_atomic_write(path: str, data: bytes, exclusive: bool) -> bool:
    """Write under a temporary name in the same folder (0600, O_NOFOLLOW; folders made 0700),
    then rename (or link) it into place."""
    folder = os.path.dirname(path)
    make_private_dirs(folder)  # folders 0700 and files 0600, whatever the umask (CONTRACT 9)
    temporary = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        with os.fdopen(open_private(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as handle:
            handle.write(data)
        if not exclusive:
            os.replace(temporary, path)
            return True
        try:
            os.link(temporary, path)  # atomic and fails if the target exists, unlike rename
        except FileExistsError:
            return False
        except OSError as error:  # a filesystem without hard links
            if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV,
                                   errno.EMLINK):
                raise
            if os.path.exists(path):
                return False
            os.replace(temporary, path)
        return True
    finally:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
