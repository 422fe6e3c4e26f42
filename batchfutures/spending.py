"""``BatchExecutor(max_cost=USD)`` and ``ex.cost``: an executor's money, estimated as calls end.

Each call's estimate (``future.cost``: costs.estimate of its measured run time and its share of
what ran it) is added when its future finishes (`Spending.count`, a done callback). Before a
Batch job is sent, `Spending.check` raises BudgetExceededError once the total reached
``max_cost``: that job's futures fail with it and nothing more is submitted. Nothing already
sent is cancelled, so nothing is left running unknown to the executor (no orphaned job), and
what runs still adds to the total: the budget stops spending, it cannot undo it.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import replace
from typing import Any, Optional
from urllib.parse import urlsplit

from . import costs, liveprices
from .environments import Environment, default_workdir, queue_compute_environments
from .errors import BudgetExceededError, ConfigurationError
from .workdir import secure_folder

__all__ = ["Spending", "check_max_cost", "pricing_of", "with_live_rates", "PricingWhenAsked"]

logger = logging.getLogger("batchfutures")


def check_max_cost(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise ConfigurationError(f"max_cost must be a positive number of US dollars, not {value!r}")
    return float(value)


class Spending:
    """The estimated USD of an executor's finished calls, and its ``max_cost``."""

    def __init__(self, max_cost: Optional[float] = None) -> None:
        self.max_cost = check_max_cost(max_cost)
        self._total = 0.0
        self._lock = threading.Lock()

    @property
    def total(self) -> float:
        with self._lock:
            return self._total

    def add(self, usd: Optional[float]) -> None:
        if usd:
            with self._lock:
                self._total += usd

    def count(self, future: Any) -> None:
        """A done callback: the finished call's cost (None when not measured) is added."""
        try:
            self.add(future.cost)
        except Exception:  # a cost that cannot be read is not counted: never fail the callback
            pass

    def exceeded(self) -> bool:
        return self.max_cost is not None and self.total >= self.max_cost

    def check(self, calls: int = 1) -> None:
        """Before sending ``calls`` calls: BudgetExceededError once the estimate reached max_cost."""
        if not self.exceeded():
            return
        assert self.max_cost is not None
        spent = self.total
        raise BudgetExceededError(
            f"max_cost={self.max_cost:g} USD reached (an estimated {spent:.6g} USD spent by this "
            f"executor's finished calls): {calls} call(s) not sent; what runs goes on",
            spent=spent, max_cost=self.max_cost)


class PricingWhenAsked:
    """An executor's pricing_of(env), read at the first cost asked (a call that ended: its
    future.cost, ex.cost, max_cost's count), never on the thread that submits: reading the
    queue and AWS's prices may take seconds, a submit must not wait for them."""

    def __init__(self, env: Environment) -> None:
        self._env = env
        self._pricing: Optional[costs.Pricing] = None
        self._lock = threading.Lock()  # this executor's: one read, the others wait for it

    def pricing(self) -> costs.Pricing:
        with self._lock:
            if self._pricing is None:
                self._pricing = pricing_of(self._env)
            return self._pricing

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
        return costs.CallPricing(self.source.pricing(), self.vcpus, self.memory_mib,
                                 self.gpus).cost(usage)


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
