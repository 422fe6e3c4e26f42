"""max_cost end to end on the embedded emulator: the budget stops submission mid-way."""

import time

import pytest

from batchfutures import BatchExecutor, BudgetExceededError

pytestmark = pytest.mark.slow


def slow_square(x):
    time.sleep(1.0)
    return x * x


def test_max_cost_stops_submitting_and_fails_what_was_not_sent(local_env):
    # one call of 1 vCPU and 2 GiB for >= 1 s costs >= 1/3600 * (0.04048 + 2 * 0.004445) USD
    with BatchExecutor(local_env, max_workers=1, max_cost=1e-5) as ex:
        futures = [ex.submit(slow_square, i) for i in range(4)]
        outcomes = [f.exception(timeout=120) for f in futures]
        assert outcomes[0] is None and futures[0].cost > 1e-5
        assert isinstance(outcomes[-1], BudgetExceededError)
        sent = [f for f in futures if f.job_id is not None]
        assert all(f.exception() is None for f in sent)  # what was sent ran to its end
        assert ex.cost == pytest.approx(sum(f.cost for f in sent))
        assert ex.cost >= 1e-5


def test_a_budget_reached_mid_map(local_env):
    with BatchExecutor(local_env, max_workers=1, max_cost=1e-5) as ex:
        results = ex.map(slow_square, range(4))
        assert next(results) == 0
        with pytest.raises(BudgetExceededError, match="max_cost=1e-05 USD reached"):
            next(results)
        assert ex.cost >= 1e-5
