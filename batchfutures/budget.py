"""One request budget per process: every Batch request passes one token bucket.

    env.batch ──> BudgetedClient(client, budget)
                     │ each Batch operation (boto3's operation methods, the emulator's @_api ones)
                     v
                  RequestBudget.acquire(): a token now, or a reserved one later (sleep until then)
                     │                     first come, first served: each caller reserves the
                     v                     next token, so threads never race for one
                  the client's method ──> Batch

AWS Batch answers every client of an account and Region from one shared budget (its quotas
page: 50 SubmitJob transactions a second per account; throttled calls get 429
TooManyRequestsException), so a process keeps to its own share: `request_rate` requests a
second (`AWSBatchEnvironment(request_rate=...)`, `BATCHFUTURES_REQUEST_RATE`, default
`DEFAULT_REQUEST_RATE`). Environments of one process that reach the same endpoint and Region
share one `RequestBudget` (`shared_budget`), at the smallest rate any of them asked for.

The decisions are pure and table-tested: `refill` (tokens after some seconds), `token_delay`
(how long until the next token) and `TokenBucket` (time is given, never read). The emulator's
account budget (emulator/faults.py) is the same `TokenBucket`, used with `take` (pass or 429)
where the client uses `reserve` (wait its turn).

The local emulator has no account to share: `LocalEnvironment` budgets only when given
`request_rate=` (a test of the AWS behaviour on the emulator), so local polling stays as fast
as the emulator answers.
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Hashable, Optional

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .batchapi import BatchAPI

DEFAULT_REQUEST_RATE = 20.0  # requests a second: 2/5 of the account's 50, room for neighbours
RATE_VARIABLE = "BATCHFUTURES_REQUEST_RATE"


def refill(tokens: float, burst: float, rate: float, elapsed: float) -> float:
    """The tokens of a bucket ``elapsed`` seconds later: ``rate`` a second, at most ``burst``
    (a debt of reserved tokens, negative, is paid back first)."""
    if elapsed <= 0:
        return tokens
    return min(burst, tokens + elapsed * rate)


def token_delay(tokens: float, rate: float) -> float:
    """Seconds until a bucket holding ``tokens`` (negative: reserved ahead) holds one whole
    token, refilled at ``rate`` a second; 0 when it holds one now."""
    if tokens >= 1.0:
        return 0.0
    return (1.0 - tokens) / rate


class TokenBucket:
    """`burst` tokens at most, refilled at `rate` a second. Pure: time is given.

    `take(now)`: pass (a token taken) or refuse, nothing owed (the emulator's account budget).
    `reserve(now)`: always take a token, now or in the future, and say how many seconds until
    it is there (the client waits that long); reservations leave the bucket in debt, so the
    callers after it wait their turn, one token apart.
    """

    def __init__(self, rate: float, burst: float, now: float = 0.0) -> None:
        self.rate, self.burst = float(rate), float(burst)
        self.tokens, self.updated = self.burst, now  # full at the start, as AWS's buckets are

    def _advance(self, now: float) -> None:
        if now > self.updated:
            self.tokens = refill(self.tokens, self.burst, self.rate, now - self.updated)
            self.updated = now

    def take(self, now: float) -> bool:
        self._advance(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def reserve(self, now: float) -> float:
        self._advance(now)
        delay = token_delay(self.tokens, self.rate)
        self.tokens -= 1.0
        return delay

    def available(self, now: float) -> float:
        """Tokens at ``now`` (negative while reservations are owed)."""
        self._advance(now)
        return self.tokens

    def slow_to(self, rate: float, burst: float) -> None:
        """Never faster than ``rate`` from now on (a second environment asked for less)."""
        self.rate = min(self.rate, float(rate))
        self.burst = min(self.burst, float(burst))
        self.tokens = min(self.tokens, self.burst)


class RequestBudget:
    """A TokenBucket shared by threads: `acquire` waits for this caller's token."""

    def __init__(self, rate: float, burst: Optional[float] = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._bucket = TokenBucket(rate, burst_for(rate) if burst is None else burst, clock())
        self.requests = 0  # for benchmarks and tests
        self.waited = 0.0  # seconds callers slept for a token, summed

    @property
    def rate(self) -> float:
        return self._bucket.rate

    def acquire(self) -> float:
        """Take this request's token, sleeping until it is there; the seconds slept."""
        with self._lock:
            delay = self._bucket.reserve(self._clock())
            self.requests += 1
            self.waited += delay
        if delay > 0:
            self._sleep(delay)
        return delay

    def tokens(self) -> float:
        """Tokens there now (negative: callers already wait for that many)."""
        with self._lock:
            return self._bucket.available(self._clock())

    def slow_to(self, rate: float) -> None:
        with self._lock:
            self._bucket.slow_to(rate, burst_for(rate))


def burst_for(rate: float) -> float:
    """A second's worth of requests at once, at least one: the poller's pages of one round go
    together, and the average stays ``rate``."""
    return max(1.0, float(rate))


def parse_rate(value: Any, label: str) -> float:
    """``value`` (a number, or the text of a variable) as a request rate; ConfigurationError
    naming ``label`` unless it is a positive finite number."""
    if isinstance(value, bool):
        rate = math.nan
    else:
        try:
            rate = float(value)
        except (TypeError, ValueError):
            rate = math.nan
    if not (rate > 0 and math.isfinite(rate)):
        raise ConfigurationError(
            f"{label}={value!r} must be a positive number of Batch requests a second (AWS Batch "
            f"allows 50 a second per account and Region, shared by every client; the default "
            f"share is {DEFAULT_REQUEST_RATE:g})")
    return rate


# -- one budget per endpoint and Region, per process -------------------------------------------
_budgets: Dict[Hashable, RequestBudget] = {}
_budgets_lock = threading.Lock()


def shared_budget(key: Hashable, rate: float) -> RequestBudget:
    """The process's budget for ``key`` (endpoint and Region); made at ``rate``, and slowed to
    ``rate`` when an environment asks for less than it has."""
    with _budgets_lock:
        budget = _budgets.get(key)
        if budget is None:
            budget = _budgets[key] = RequestBudget(rate)
        elif rate < budget.rate:
            budget.slow_to(rate)
        return budget


def budget_key(client: BatchAPI) -> Hashable:
    """Which account budget a boto3 client draws on: its endpoint and Region."""
    meta = getattr(client, "meta", None)
    return (str(getattr(meta, "endpoint_url", "")), str(getattr(meta, "region_name", "")))


# -- the client every Batch call goes through ------------------------------------------------------
class BudgetedClient:
    """A Batch client (boto3's, or the emulator) whose API operations each take a token of
    ``budget`` first; every other attribute is the client's own.

    Retries made by `batchapi.call` and `submit_exactly_once` call these methods again, so each
    retry is a request of the budget too."""

    def __init__(self, client: BatchAPI, budget: RequestBudget) -> None:
        self._client = client
        self.request_budget = budget
        self._methods: Dict[str, Callable[..., Any]] = {}
        meta = getattr(client, "meta", None)
        self._operations = frozenset(getattr(meta, "method_to_api_mapping", None) or ())

    @property
    def unbudgeted(self) -> Any:
        """The client itself (its requests bypass the budget: tests only)."""
        return self._client

    def _is_operation(self, name: str, attribute: Any) -> bool:
        return name in self._operations or getattr(attribute, "operation", None) is not None

    def __getattr__(self, name: str) -> Any:
        known = self._methods.get(name)
        if known is not None:
            return known
        attribute = getattr(self._client, name)
        if not (callable(attribute) and self._is_operation(name, attribute)):
            return attribute
        budget = self.request_budget

        def budgeted(*args: Any, **kwargs: Any) -> Any:
            budget.acquire()
            return attribute(*args, **kwargs)

        budgeted.__name__ = getattr(attribute, "__name__", name)
        budgeted.__doc__ = getattr(attribute, "__doc__", None)
        self._methods[name] = budgeted
        return budgeted

    def __repr__(self) -> str:
        return f"BudgetedClient({self._client!r}, {self.request_budget.rate:g} requests a second)"


def budgeted_client(client: BatchAPI, rate: float, key: Optional[Hashable] = None) -> BudgetedClient:
    """``client`` behind the process's shared budget for its endpoint and Region (or ``key``)."""
    return BudgetedClient(client, shared_budget(budget_key(client) if key is None else key, rate))
