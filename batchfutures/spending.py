"""``BatchExecutor(max_cost=USD)`` and ``ex.cost``: an executor's money, estimated as calls end.

Each call's estimate (``future.cost``: costs.estimate of its measured run time and its share of
what ran it) is added when its future finishes (`Spending.count`, a done callback, on the
poller's thread). Counting never waits for prices: a call whose queue's prices are not read
yet is added once they are, on the thread that reads them (`PricingWhenAsked.when_read`, at
most liveprices.READ_DEADLINE_S on AWS). Before a Batch job is sent, `Spending.check` raises
BudgetExceededError once the calls that ended reached ``max_cost``: that job's futures fail
with it and nothing more is submitted. With ``max_cost`` that check counts every call that
ended, so it waits for prices still being read (once per executor; they are read as the first
job is sent, `priced_by`, so in practice they are known before any call ends): the budget is
decided on no less than when the count itself waited for them. Nothing already sent is cancelled,
so nothing is left running unknown to the executor (no orphaned job), and what runs still adds
to the total: the budget stops spending, it cannot undo it.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from . import costs, liveprices
from .environments import Environment, default_workdir, queue_compute_environments
from .errors import BudgetExceededError, ConfigurationError
from .workdir import secure_folder

__all__ = ["Spending", "check_max_cost", "pricing_of", "with_live_rates", "PricingWhenAsked",
           "PriceNotReadYet"]

logger = logging.getLogger("batchfutures")


def check_max_cost(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise ConfigurationError(f"max_cost must be a positive number of US dollars, not {value!r}")
    return float(value)


class PriceNotReadYet(Exception):
    """Raised to `Spending.count` only (never to a user): the call's prices are still being
    read by ``source``, and asking for them here would wait."""

    def __init__(self, source: "PricingWhenAsked") -> None:
        super().__init__("the queue's prices are not read yet")
        self.source = source


_counting = threading.local()  # .active while Spending.count reads a cost: it must not wait


def _cost_without_waiting(future: Any) -> Optional[float]:
    """``future.cost``, or PriceNotReadYet where it would wait for prices to be read."""
    _counting.active = True
    try:
        return future.cost
    finally:
        _counting.active = False


class Spending:
    """The estimated USD of an executor's finished calls, and its ``max_cost``."""

    def __init__(self, max_cost: Optional[float] = None) -> None:
        self.max_cost = check_max_cost(max_cost)
        self._total = 0.0
        self._lock = threading.Lock()
        # ended calls whose prices are being read: id(future) -> (future, what reads them)
        self._unpriced: Dict[int, Tuple[Any, PricingWhenAsked]] = {}

    @property
    def counted(self) -> float:
        """The calls priced so far; never waits (the budget's check, on any thread)."""
        with self._lock:
            return self._total

    @property
    def unpriced(self) -> int:
        """Ended calls whose prices are still being read (not in `counted` yet)."""
        with self._lock:
            return len(self._unpriced)

    @property
    def total(self) -> float:
        """Every ended call (``ex.cost``): prices still being read are waited for here, on the
        asker's thread, as ``future.cost`` waits for them."""
        with self._lock:
            waiting = list(self._unpriced.items())
        for key, (_, source) in waiting:
            try:
                source.pricing()
            except Exception:  # a cost that cannot be read is not counted
                logger.debug("pricing: could not be read for ex.cost", exc_info=True)
            self._priced(key)
        return self.counted

    def add(self, usd: Optional[float]) -> None:
        if usd:
            with self._lock:
                self._total += usd

    def count(self, future: Any) -> None:
        """A done callback: the finished call's cost (None when not measured) is added, now if
        its prices are known, else when they are read (never waiting for them here)."""
        try:
            usd = _cost_without_waiting(future)
        except PriceNotReadYet as unread:
            with self._lock:
                self._unpriced[id(future)] = (future, unread.source)
            unread.source.when_read(functools.partial(self._priced, id(future)))
            return
        except Exception:  # a cost that cannot be read is not counted: never fail the callback
            return
        self.add(usd)

    def priced_by(self, source: "PricingWhenAsked") -> None:
        """The executor's pricing, as its first job is sent. With max_cost its prices are read
        now, on their own thread: the budget's check needs them once a call ends, and a Batch
        job takes longer to end than the read (so that check does not wait for it)."""
        if self.max_cost is not None:
            source.when_read(_nothing)

    def _priced(self, key: int) -> None:
        """Its prices were read: the call waiting under ``key`` is counted (once)."""
        with self._lock:
            entry = self._unpriced.pop(key, None)
        if entry is not None:
            self.count(entry[0])

    def exceeded(self) -> bool:
        """Whether the calls that ended reached max_cost: every one of them, so a call whose
        prices are still being read is waited for here (as its count used to wait on the
        poller; once per executor, within liveprices.READ_DEADLINE_S on AWS)."""
        return self.max_cost is not None and self.total >= self.max_cost

    def check(self, calls: int = 1) -> None:
        """Before sending ``calls`` calls: BudgetExceededError once the estimate reached max_cost.
        Without max_cost it never waits."""
        if not self.exceeded():
            return
        assert self.max_cost is not None
        spent = self.counted
        raise BudgetExceededError(
            f"max_cost={self.max_cost:g} USD reached (an estimated {spent:.6g} USD spent by this "
            f"executor's finished calls): {calls} call(s) not sent; what runs goes on",
            spent=spent, max_cost=self.max_cost)


class PricingWhenAsked:
    """An executor's pricing_of(env), read at the first cost asked (a call that ended: its
    future.cost, ex.cost, max_cost's count), never on the thread that submits: reading the
    queue and AWS's prices may take seconds, a submit must not wait for them. `Spending.count`
    (the poller's) does not wait either: it asks `when_read`, which reads on a thread of its own."""

    def __init__(self, env: Environment) -> None:
        self._env = env
        self._pricing: Optional[costs.Pricing] = None
        self._lock = threading.Lock()  # this executor's: one read, the others wait for it
        self._state = threading.Lock()  # guards the two below; never held across a read
        self._reader: Optional[threading.Thread] = None
        self._then: List[Callable[[], None]] = []  # to call once the pricing is known

    @property
    def known(self) -> Optional[costs.Pricing]:
        """The pricing once read, else None (never waits)."""
        return self._pricing

    def pricing(self) -> costs.Pricing:
        then: List[Callable[[], None]] = []
        with self._lock:
            if self._pricing is None:
                pricing = pricing_of(self._env)
                with self._state:
                    self._pricing = pricing
                    then, self._then = self._then, []
            found = self._pricing
        for callback in then:
            callback()
        return found

    def when_read(self, callback: Callable[[], None]) -> None:
        """``callback()`` once the pricing is known: now if it is, else on the thread that
        reads it (started here once, when no read is under way)."""
        with self._state:
            if self._pricing is None:
                self._then.append(callback)
                if self._reader is None or not self._reader.is_alive():
                    self._reader = threading.Thread(target=self._read_for_callbacks,
                                                    name="batchfutures-pricing", daemon=True)
                    self._reader.start()
                return
        callback()

    def _read_for_callbacks(self) -> None:
        try:
            self.pricing()
        except Exception:  # as a cost that cannot be read: those waiting are not counted
            logger.debug("pricing: could not be read", exc_info=True)
            with self._state:
                self._then.clear()

    def of_call(self, vcpus: float, memory_mib: float, gpus: int = 0) -> "CallPricedWhenAsked":
        return CallPricedWhenAsked(self, vcpus, memory_mib, gpus)


class CallPricedWhenAsked:
    """costs.CallPricing's cost(usage), its queue's pricing read when first asked."""

    def __init__(self, source: PricingWhenAsked, vcpus: float, memory_mib: float,
                 gpus: int = 0) -> None:
        self.source, self.vcpus, self.memory_mib, self.gpus = source, vcpus, memory_mib, gpus

    def cost(self, usage: Any) -> Optional[float]:
        if getattr(usage, "wall_s", None) is None:
            return None  # not measured: nothing to read prices for
        pricing = self.source.known
        if pricing is None:
            if getattr(_counting, "active", False):  # Spending.count, on the poller: no wait
                raise PriceNotReadYet(self.source)
            pricing = self.source.pricing()
        return costs.CallPricing(pricing, self.vcpus, self.memory_mib, self.gpus).cost(usage)


def _nothing() -> None:
    pass


def pricing_of(env: Environment) -> Any:
    """How an environment's calls are priced (a costs.Pricing): the emulator as Fargate; on AWS
    from its queue's first enabled compute environment (read once by the caller), else the job
    definition's platform."""
    if env.is_local:  # the emulator
        return costs.LOCAL
    try:
        return with_live_rates(env, costs.pricing_from(
            queue_compute_environments(env.batch, env.job_queue)))
    except Exception as error:  # no describe permission, no queue: the platform alone
        logger.debug("pricing: the queue's compute environments could not be read: %r", error)
    platform = None
    try:
        platform = env.job_platform()
    except Exception:
        pass
    return with_live_rates(env, costs.Pricing("FARGATE" if platform == "FARGATE" else "EC2"))


def with_live_rates(env: Environment, pricing: costs.Pricing) -> costs.Pricing:
    """``pricing`` with the prices read from AWS (liveprices.read_rates: the Price List, the Spot
    price history; cached a day) when they could be read, else as it is (the shipped table).
    An EC2 queue whose instance type is not known keeps the table."""
    instance_type = pricing.instance_type
    if pricing.platform == "EC2" and not instance_type:
        return pricing
    if instance_type and "." not in instance_type:  # a family: its large, as the table does
        instance_type = f"{instance_type}.large"
    try:
        if not _is_aws(env.client("batch").meta.endpoint_url):
            return pricing  # Batch at another endpoint (the emulator's): no AWS prices apply
        folder = secure_folder((env.workdir or default_workdir()) / "prices", "price cache")
        rates = liveprices.read_rates(env.session, None, env.region_name,
                                      pricing.platform, pricing.architecture, instance_type,
                                      pricing.spot, folder)
    except Exception as error:  # no session, a folder refused: the table
        logger.debug("pricing: prices not read from AWS: %r", error)
        return pricing
    return replace(pricing, rates=rates) if rates is not None else pricing


def _is_aws(endpoint_url: str) -> bool:
    host = urlsplit(str(endpoint_url)).hostname or ""
    return host.endswith((".amazonaws.com", ".amazonaws.com.cn"))
