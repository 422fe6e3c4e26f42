"""Inside a call: `checkpoint(state)`, `restored(default)`, `interrupted()` (docs/spot.md).

A Spot host is reclaimed with a notice: Fargate Spot sends the task SIGTERM two minutes before it
stops it, EC2 Spot does too once the host drains (the template's ECS_ENABLE_SPOT_INSTANCE_DRAINING),
then SIGKILL. The worker turns SIGTERM into `interrupted()` (its handler: `on_sigterm`), and
the call may save its state at any time. A call that never used this API keeps SIGTERM's
usual meaning (the process ends at once, as before: an abort does not wait for the kill):

    def simulate(steps):
        state = batchfutures.restored(default={"step": 0, "total": 0.0})
        while state["step"] < steps:
            state["total"] += work(state["step"]); state["step"] += 1
            if batchfutures.interrupted() or state["step"] % 1000 == 0:
                batchfutures.checkpoint(state)
        return state["total"]

A checkpoint is pickled (cloudpickle), sealed with the job's signing key (kind "checkpoint",
bound to its name under the storage root, as every payload) and written to
``<job_url>/checkpoints/<child>.<item>`` of the call's first job (a resubmitted call, out of
memory or fallen back from Spot, reads its items from that job and so keeps its key); a warm
worker's call (worker/warm.py) keeps it at ``<pool_url>/checkpoints/<call number>.<item>`` of
the pool it was first sent to; each checkpoint replaces the one before. `restored()` reads it
on the call's next attempt (once per attempt; an unsigned or altered one raises IntegrityError,
nothing is unpickled). Outside a call run by a worker, `checkpoint` does nothing (False) and
`restored` gives the default.

The worker sets the call's context (`begin_call`, `at_item`, `end_call`), one per thread, since
the emulator's threads launcher runs attempts as threads of one process.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable, Optional, Protocol, Tuple

from . import serialization


class Storage(Protocol):
    """What a checkpoint needs of storage.Storage (a Protocol: no import of it, no cycle)."""

    mac_root: str

    @property
    def signer(self) -> Any: ...

    def name_of(self, url: str) -> str: ...
    def put_bytes(self, url: str, data: bytes, *, exclusive: bool = False) -> bool: ...
    def read_sealed(self, url: str, kind: str, *, limit: Optional[int] = None) -> Any: ...

__all__ = ["checkpoint", "restored", "interrupted", "attempt", "CHECKPOINT_KIND",
           "checkpoint_url", "begin_call", "at_item", "end_call", "on_sigterm",
           "install_sigterm_handler", "request_retry", "retry_requested", "retry_reason",
           "take_retry"]

CHECKPOINT_KIND = "checkpoint"
_NOT_READ = object()


class _Call:
    """The running call's place: where its checkpoint lives, its attempt, its stop signal."""

    def __init__(self, storage: Storage, job_url: str, child: int, attempt: int,
                 stopping: Callable[[], bool]) -> None:
        self.storage, self.job_url, self.child = storage, job_url, child
        self.attempt, self.stopping = attempt, stopping
        self.item = 0
        self.restored: Any = _NOT_READ
        self.retry_after: Optional[float] = None  # retrypolicy: end this attempt for a retry
        self.retry_reason: Optional[str] = None  # the listed exception that asked for it


_local = threading.local()
_sigterm = threading.Event()  # this process was asked to stop (the whole process: a signal)
_aware = threading.Event()  # a call here used checkpoint/restored/interrupted: SIGTERM waits


def checkpoint_url(job_url: str, child: int, item: int) -> str:
    return f"{job_url.rstrip('/')}/checkpoints/{child:05d}.{item}"


def _current() -> Optional[_Call]:
    return getattr(_local, "call", None)


def begin_call(storage: Storage, job_url: str, child: int, attempt: Optional[str] = None,
               stopping: Optional[Callable[[], bool]] = None) -> None:
    """The worker: this thread now runs child ``child`` of ``job_url`` (the call's first job),
    Batch attempt ``attempt`` (AWS_BATCH_JOB_ATTEMPT, 1-based)."""
    try:
        number = int(attempt) if attempt else 1
    except ValueError:
        number = 1
    # SIGTERM's meaning is this call's to choose (a warm worker's process runs call after
    # call: one that used this module before does not choose for the next)
    _aware.clear()
    _local.call = _Call(storage, job_url, child, number, stopping or (lambda: False))


def at_item(position: int) -> None:
    """The worker: the next item run is the one at ``position`` in its child."""
    call = _current()
    if call is not None:
        call.item, call.restored = position, _NOT_READ
    # each item decides for itself: an earlier item's use of the API does not make this one
    # wait past SIGTERM, and one that starts after SIGTERM came ends the process as it would have
    _aware.clear()
    if _sigterm.is_set():
        on_sigterm()


def end_call() -> None:
    _local.call = None


def request_retry(delay: float, error: Optional[BaseException] = None,
                  reason: Optional[str] = None) -> bool:
    """retrypolicy.Retrying: the call raised a listed exception with attempts left; the worker
    ends this attempt after ``delay`` seconds without a result, for Batch to retry it. False
    outside a worker (nothing to retry: the exception is the outcome). ``reason``: the
    "Type: message" of an error raised elsewhere (worker/pool.py: in a sub-process)."""
    call = _current()
    if call is None:
        return False
    call.retry_after = max(call.retry_after or 0.0, delay)
    if error is not None:
        reason = f"{type(error).__name__}: {error}"
    if reason is not None and call.retry_reason is None:
        call.retry_reason = reason
    return True


def take_retry() -> Optional[Tuple[float, Optional[str]]]:
    """worker/pool.py's sub-process: the retry the item just run asked for, (delay, reason) or
    None, cleared here (the worker asks for it again: request_retry there)."""
    call = _current()
    if call is None or call.retry_after is None:
        return None
    asked = (call.retry_after, call.retry_reason)
    call.retry_after = call.retry_reason = None
    return asked


def retry_requested() -> Optional[float]:
    """The worker: the delay before this attempt ends for a retry, None when none was asked."""
    call = _current()
    return call.retry_after if call is not None else None


def retry_reason() -> Optional[str]:
    """The worker: the exception that asked for this attempt's retry ("Type: message")."""
    call = _current()
    return call.retry_reason if call is not None else None


def attempt() -> int:
    """This call's Batch attempt, 1-based (1 outside a worker)."""
    call = _current()
    return call.attempt if call is not None else 1


def interrupted() -> bool:
    """True once the worker was asked to stop (SIGTERM: a Spot reclaim's notice, a terminated
    job): save what you have with `checkpoint` now, the kill follows."""
    call = _current()
    if call is not None:
        _aware.set()
    return _sigterm.is_set() or (call is not None and bool(call.stopping()))


def checkpoint(state: Any) -> bool:
    """Save ``state`` for this call's next attempt (replacing its last checkpoint); False outside
    a call run by a worker."""
    call = _current()
    if call is None:
        return False
    _aware.set()
    url = checkpoint_url(call.job_url, call.child, call.item)
    storage = call.storage
    payload = serialization.dumps(state, what="the checkpoint")
    storage.put_bytes(url, storage.signer.seal(CHECKPOINT_KIND, storage.name_of(url), payload,
                                               root=storage.mac_root))
    return True


def restored(default: Any = None) -> Any:
    """The state the call's last attempt saved with `checkpoint`, else ``default``."""
    call = _current()
    if call is None:
        return default
    _aware.set()
    if call.restored is _NOT_READ:
        url = checkpoint_url(call.job_url, call.child, call.item)
        data = call.storage.read_sealed(url, CHECKPOINT_KIND)
        call.restored = None if data is None else (serialization.loads(data),)
    return default if call.restored is None else call.restored[0]


def on_sigterm(signum: int = signal.SIGTERM, frame: Any = None) -> None:
    """The worker's SIGTERM handler: a call that used this module goes on, `interrupted()` now
    true, until it ends or the kill comes; any other ends the process of SIGTERM, as before."""
    _sigterm.set()
    if not _aware.is_set():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def install_sigterm_handler() -> bool:
    """In the worker's main thread: SIGTERM no longer ends the process at once. False when
    signals cannot be set here (not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, on_sigterm)
    return True
