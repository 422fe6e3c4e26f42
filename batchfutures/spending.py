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
from typing import Any, Optional

from . import costs
from .environments import Environment, queue_compute_environments
from .errors import BudgetExceededError, ConfigurationError

__all__ = ["Spending", "check_max_cost", "pricing_of"]

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


def pricing_of(env: Environment) -> Any:
    """How an environment's calls are priced (a costs.Pricing): the emulator as Fargate; on AWS
    from its queue's first enabled compute environment (read once by the caller), else the job
    definition's platform."""
    if env.is_local:  # the emulator
        return costs.LOCAL
    try:
        return costs.pricing_from(queue_compute_environments(env.batch, env.job_queue))
    except Exception as error:  # no describe permission, no queue: the platform alone
        logger.debug("pricing: the queue's compute environments could not be read: %r", error)
    platform = None
    try:
        platform = env.job_platform()
    except Exception:
        pass
    return costs.Pricing("FARGATE" if platform == "FARGATE" else "EC2")
