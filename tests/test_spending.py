"""max_cost: the executor's estimate as calls end, and the check before each submission."""

import pickle
import threading

import pytest

from batchfutures import LocalEnvironment, costs
from batchfutures.errors import BatchError, BudgetExceededError, ConfigurationError
from batchfutures.spending import PricingWhenAsked, Spending


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
    from batchfutures import BatchExecutor

    with pytest.raises(ConfigurationError, match="max_cost"):
        BatchExecutor(LocalEnvironment(tmp_path / "work"), max_cost=-2)


# -- counting never waits for prices (the poller's done callback) ---------------------------
class Measured:
    def __init__(self, wall_s):
        self.wall_s = wall_s


class Ended:
    """A finished call as Spending.count sees it: its cost is its job's pricing of its usage
    (future.cost -> TrackedJob.item_cost -> the job's CallPricedWhenAsked)."""

    def __init__(self, call_pricing, wall_s):
        self.call_pricing, self.usage = call_pricing, Measured(wall_s)

    @property
    def cost(self):
        return self.call_pricing.cost(self.usage)


def local_cost(wall_s):
    return costs.estimate(wall_s, 1, 2048, costs.LOCAL).usd


def test_a_call_ended_while_prices_are_read_is_counted_once_they_are(tmp_path):
    source = PricingWhenAsked(LocalEnvironment(tmp_path / "work"))
    calls = source.of_call(1, 2048)
    spending = Spending()
    reading = source._lock  # held: the queue's prices are being read (as a hanging read holds it)
    reading.acquire()
    try:
        counter = threading.Thread(target=spending.count, args=(Ended(calls, 3600),))
        counter.start()
        counter.join(60)
        assert not counter.is_alive()  # count returned while the read is under way
        assert (spending.counted, spending.unpriced) == (0.0, 1)
        spending.check(1)  # no max_cost: nothing to wait for
    finally:
        reading.release()
    readers = [t for t in threading.enumerate() if t.name == "batchfutures-pricing"]
    for reader in readers:  # the thread count started prices the call once the read ends
        reader.join(60)
    assert spending.unpriced == 0 and spending.counted == pytest.approx(local_cost(3600))
    spending.count(Ended(calls, 3600))  # prices known: counted at once
    assert spending.counted == pytest.approx(2 * local_cost(3600))


def test_the_budget_counts_a_call_whose_prices_are_still_being_read(tmp_path):
    """max_cost's check waits for the read rather than pass on a total without that call
    (as strict as when the count waited for the prices on the poller)."""
    source = PricingWhenAsked(LocalEnvironment(tmp_path / "work"))
    spending = Spending(max_cost=0.5 * local_cost(3600))
    with source._lock:  # the read is under way: the reading thread count starts waits on it
        spending.count(Ended(source.of_call(1, 2048), 3600))
        assert (spending.counted, spending.unpriced) == (0.0, 1)
    with pytest.raises(BudgetExceededError):  # whether or not the reading thread priced it yet
        spending.check(1)
    assert spending.counted == pytest.approx(local_cost(3600))


def test_ex_cost_waits_for_the_prices_being_read(tmp_path):
    source = PricingWhenAsked(LocalEnvironment(tmp_path / "work"))
    spending = Spending()
    source._lock.acquire()  # the reading thread started by count waits for this
    spending.count(Ended(source.of_call(1, 2048), 60))
    assert spending.unpriced == 1
    source._lock.release()
    assert spending.total == pytest.approx(local_cost(60))  # read (or waited for) here
    assert spending.unpriced == 0


def test_a_cost_asked_outside_count_waits_for_its_prices(tmp_path):
    """future.cost on the user's thread reads the prices there (it never raises PriceNotReadYet)."""
    source = PricingWhenAsked(LocalEnvironment(tmp_path / "work"))
    assert source.known is None
    assert Ended(source.of_call(1, 2048), 60).cost == pytest.approx(local_cost(60))
    assert source.known == costs.LOCAL


@pytest.mark.parametrize("max_cost, read_at_once", [(None, False), (1.0, True)])
def test_with_max_cost_prices_are_read_as_the_first_job_is_sent(tmp_path, max_cost, read_at_once):
    """The budget's check will need them as soon as a call ends: read on their own thread
    before any call ended; without max_cost, when a cost is first asked."""
    source = PricingWhenAsked(LocalEnvironment(tmp_path / "work"))
    Spending(max_cost).priced_by(source)
    for reader in [t for t in threading.enumerate() if t.name == "batchfutures-pricing"]:
        reader.join(60)
    assert (source.known is not None) is read_at_once
