"""`retries=Retries(n, on=(ExcType, ...), backoff=S, max_delay=S)`: which failures a call retries.

Batch retries a failed attempt of a child (only that child of an array) while attempts remain
and no `evaluateOnExit` rule says EXIT (submission.RETRY_RULES: out of memory, timeout, our own
aborts). So everything here rides on Batch's own retries, attempt by attempt:

    a listed exception raised by the call, attempts remain (AWS_BATCH_JOB_ATTEMPT < n)
        -> `Retrying` (the function as sent) asks for a retry (checkpoints.request_retry); the
           worker waits `delay_after(attempt)` and exits RETRY_EXIT_STATUS without writing the
           child's result: Batch starts that child's next attempt (its other items run again)
    a listed exception on the last attempt, or any exception not listed
        -> the call's outcome, as always (the worker exits 0; the future raises it)
    a start failure with no exit code (`is_start_failure`: the image not pulled, the task's
    resources not set up, the task never started, its host drained) and a lost host
        -> no rule matches, so Batch retries it: retried by default under a Retries policy

On warm workers (keepalive=) the same `Retrying` asks, with the call's message's receive count
as its attempt: the worker leaves the message to come back after the delay (worker/warm.py).

Multi-node jobs (nodes > 1) are refused a policy listing exceptions when the settings are made
(`check_nodes`, ConfigurationError), never left to ignore it: Batch retries such a job as a whole
on its main node's failure only (a node's other than the main one makes no attempt), every node's
result of the failed attempt stays written (a node's result is written once), and the emulator
retries no multi-node job. `Retries(n)` without `on` keeps its meaning there: Batch's attempts.

`retries=int` keeps its meaning (Batch's attempts; a user exception is an outcome, never retried).
The delays are spent in the failing attempt's container, just before it exits (Batch has no delay
between attempts); `backoff` doubles each time up to `max_delay`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Optional, Tuple, Type

from . import checkpoints
from .errors import ConfigurationError

__all__ = ["Retries", "RETRY_EXIT_STATUS", "START_FAILURE_PREFIXES", "is_start_failure",
           "delay_after", "retry_in_worker", "attempts_of", "MAX_ATTEMPTS", "Retrying", "wrap",
           "by_exception", "nodes_refusal", "check_nodes"]

MAX_ATTEMPTS = 10  # Batch's retryStrategy.attempts: 1 to 10
# EX_TEMPFAIL (sysexits.h): "temporary failure, the user is invited to retry"; a listed exception
# with attempts left ends the attempt with it (never 137: that is an out-of-memory kill)
RETRY_EXIT_STATUS = 75
# Stopped reasons of tasks that never ran the call, with no exit code (ECS's stopped-task errors,
# "Amazon ECS stopped task error messages" in the ECS Developer Guide; the last one is ECS Managed
# Instances draining a host). Batch copies the task's reason into the attempt's statusReason.
START_FAILURE_PREFIXES = (
    "CannotPullContainerError",
    "ResourceInitializationError",
    "Task failed to start",
    "Task stopped during instance draining",
)
_START_FAILURES = tuple(prefix.lower() for prefix in START_FAILURE_PREFIXES)


@dataclass(frozen=True)
class Retries:
    """Up to ``attempts`` attempts of a call; the exceptions ``on`` raised by it are retried
    (with ``backoff`` seconds before the first retry, doubling up to ``max_delay``), besides the
    failures Batch retries anyway (start failures, lost hosts, crashes)."""

    attempts: int
    on: Tuple[Type[BaseException], ...] = ()
    backoff: float = 1.0
    max_delay: float = 60.0

    def __init__(self, attempts: int, on: Any = (), backoff: float = 1.0,
                 max_delay: float = 60.0) -> None:
        if isinstance(attempts, bool) or not isinstance(attempts, int) \
                or not 1 <= attempts <= MAX_ATTEMPTS:
            raise ConfigurationError(
                f"Retries(attempts) counts attempts (Batch's retryStrategy.attempts): an int from 1 "
                f"to {MAX_ATTEMPTS}, not {attempts!r}")
        kinds = (on,) if isinstance(on, type) else tuple(on)
        for kind in kinds:
            if not (isinstance(kind, type) and issubclass(kind, BaseException)):
                raise ConfigurationError(f"Retries(on=...) takes exception classes, not {kind!r}")
        for name, value in (("backoff", backoff), ("max_delay", max_delay)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ConfigurationError(f"Retries({name}=) must be seconds >= 0, not {value!r}")
        object.__setattr__(self, "attempts", attempts)
        object.__setattr__(self, "on", kinds)
        object.__setattr__(self, "backoff", float(backoff))
        object.__setattr__(self, "max_delay", float(max_delay))

    def listed(self, error: BaseException) -> bool:
        return bool(self.on) and isinstance(error, self.on)


def attempts_of(retries: Any) -> int:
    """Batch's retryStrategy.attempts for a ``retries=`` setting (an int or a Retries)."""
    return retries.attempts if isinstance(retries, Retries) else int(retries)


def delay_after(policy: Retries, attempt: int) -> float:
    """Seconds to wait after attempt number ``attempt`` (1-based) failed with a listed exception."""
    if attempt < 1:
        return 0.0
    return min(policy.max_delay, policy.backoff * 2.0 ** (attempt - 1))


def retry_in_worker(policy: Optional[Retries], error: BaseException, attempt: int) -> bool:
    """Should the worker end attempt ``attempt`` (1-based) for Batch to retry, after ``error``?"""
    return policy is not None and policy.listed(error) and attempt < policy.attempts


def is_start_failure(reason: Optional[str], exit_code: Optional[int]) -> bool:
    """An attempt that never ran the call: no exit code and one of ECS's start failure reasons."""
    return exit_code is None and bool(reason) and str(reason).lower().startswith(_START_FAILURES)


class Retrying:
    """The user's function under a Retries policy with listed exceptions (what is pickled and
    sent). Its name is the function's, so job names and logs do not change."""

    def __init__(self, fn: Any, policy: Retries) -> None:
        self.fn, self.policy = fn, policy
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.fn(*args, **kwargs)
        except BaseException as error:  # the outcome stays the error; the worker may retry it
            attempt = checkpoints.attempt()
            if retry_in_worker(self.policy, error, attempt):
                checkpoints.request_retry(delay_after(self.policy, attempt), error)
            raise


def by_exception(retries: Any) -> bool:
    """``retries`` retries listed exceptions: a Retries with ``on`` and attempts to spare."""
    return isinstance(retries, Retries) and bool(retries.on) and retries.attempts > 1


def wrap(fn: Any, retries: Any) -> Any:
    """``fn`` as it is sent: under `Retrying` when ``retries`` is a Retries listing exceptions."""
    return Retrying(fn, retries) if by_exception(retries) else fn


def nodes_refusal(retries: Any, nodes: int) -> Optional[str]:
    """Why ``retries`` cannot be the policy of a call on ``nodes`` nodes, or None (see the
    module doc: a multi-node job's call is never retried by exception)."""
    if nodes <= 1 or not by_exception(retries):
        return None
    listed = ", ".join(kind.__name__ for kind in retries.on)
    return (f"retries=Retries({retries.attempts}, on=({listed},)) with nodes={nodes}: a "
            f"multi-node job's call is not retried by exception (Batch retries such a job as a "
            f"whole, on its main node's failure only). Pass retries={retries.attempts} (Batch's "
            f"attempts, for crashes and lost hosts) with nodes=, or catch and retry the exception "
            f"inside the function")


def check_nodes(retries: Any, nodes: int) -> None:
    """JobSettings: refuse `nodes_refusal`'s combination when the settings are made."""
    refusal = nodes_refusal(retries, nodes)
    if refusal is not None:
        raise ConfigurationError(refusal)
