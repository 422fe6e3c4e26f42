"""max_cost: the executor's estimate as calls end, and the check before each submission."""

import pickle
import threading

import pytest

from batchfutures.errors import BatchError, BudgetExceededError, ConfigurationError
from batchfutures.spending import Spending


class Finished:
    def __init__(self, cost):
        self.cost = cost


@pytest.mark.parametrize("max_cost, costs, exceeded", [
    (None, [1.0, 2.0], False),
    (1.0, [0.4, 0.5], False),
    (1.0, [0.4, 0.6], True),  # reached counts
    (1.0, [0.4, None, 0.7], True),  # a call not measured adds nothing
    (0.01, [], False),
])
def test_the_budget_is_reached_by_what_finished(max_cost, costs, exceeded):
    spending = Spending(max_cost)
    for cost in costs:
        spending.count(Finished(cost))
    assert spending.exceeded() is exceeded
    assert spending.total == pytest.approx(sum(c for c in costs if c))
    if exceeded:
        with pytest.raises(BudgetExceededError, match="3 call") as raised:
            spending.check(3)
        assert isinstance(raised.value, BatchError) and raised.value.max_cost == max_cost
        copy = pickle.loads(pickle.dumps(raised.value))
        assert (copy.spent, copy.max_cost, str(copy)) == (raised.value.spent, max_cost,
                                                          str(raised.value))
    else:
        spending.check(3)


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), True, "5"])
def test_max_cost_must_be_positive_dollars(value):
    with pytest.raises(ConfigurationError, match="max_cost"):
        Spending(value)


def test_counting_is_thread_safe():
    spending = Spending()
    threads = [threading.Thread(target=lambda: [spending.add(0.001) for _ in range(1000)])
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert spending.total == pytest.approx(4.0)


def test_the_executor_refuses_a_bad_max_cost_before_anything_starts(tmp_path):
    from batchfutures import BatchExecutor, LocalEnvironment

    with pytest.raises(ConfigurationError, match="max_cost"):
        BatchExecutor(LocalEnvironment(tmp_path / "work"), max_cost=-2)
