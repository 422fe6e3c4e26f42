"""retries=Retries(...): the policy, the worker's decision and the delays (pure)."""

import pickle

import pytest

from batchfutures import checkpoints, retrypolicy
from batchfutures.errors import ConfigurationError
from batchfutures.retrypolicy import Retries


class Flaky(Exception):
    pass


@pytest.mark.parametrize("policy, attempt, expected", [
    (Retries(5, on=(Flaky,), backoff=2, max_delay=60), 1, 2.0),
    (Retries(5, on=(Flaky,), backoff=2, max_delay=60), 2, 4.0),
    (Retries(5, on=(Flaky,), backoff=2, max_delay=60), 3, 8.0),
    (Retries(10, on=(Flaky,), backoff=2, max_delay=10), 4, 10.0),  # capped
    (Retries(3, on=(Flaky,), backoff=0), 2, 0.0),
    (Retries(3, on=(Flaky,)), 0, 0.0),
])
def test_delay_doubles_up_to_max_delay(policy, attempt, expected):
    assert retrypolicy.delay_after(policy, attempt) == expected


@pytest.mark.parametrize("policy, error, attempt, retry", [
    (Retries(3, on=(Flaky,)), Flaky(), 1, True),
    (Retries(3, on=(Flaky,)), Flaky(), 2, True),
    (Retries(3, on=(Flaky,)), Flaky(), 3, False),  # the last attempt: the error is the outcome
    (Retries(3, on=(Flaky,)), ValueError(), 1, False),  # not listed
    (Retries(3, on=(OSError,)), ConnectionResetError(), 1, True),  # a subclass of a listed one
    (Retries(3), Flaky(), 1, False),  # nothing listed
    (None, Flaky(), 1, False),
])
def test_the_worker_retries_listed_exceptions_while_attempts_remain(policy, error, attempt, retry):
    assert retrypolicy.retry_in_worker(policy, error, attempt) is retry


@pytest.mark.parametrize("reason, exit_code, start_failure", [
    ("CannotPullContainerError: context canceled", None, True),
    ("CannotPullContainerError: pull image manifest has been retried 5 time(s)", None, True),
    ("ResourceInitializationError: unable to pull secrets or registry auth", None, True),
    ("Task failed to start", None, True),
    ("Task stopped during instance draining", None, True),
    ("task failed to start", None, True),  # Batch's patterns are case-insensitive
    ("Task failed to start", 1, False),  # it ran: an exit code
    ("Essential container in task exited", 1, False),
    ("Host EC2 (instance i-0123) terminated.", None, False),  # a lost host, not a start failure
    (None, None, False),
])
def test_start_failures_are_those_without_an_exit_code(reason, exit_code, start_failure):
    assert retrypolicy.is_start_failure(reason, exit_code) is start_failure


@pytest.mark.parametrize("arguments, message", [
    ((0,), "from 1"), ((11,), "to 10"), ((True,), "not True"), ((3.0,), "not 3.0"),
    ((3, (ValueError, "x")), "exception classes"), ((3, (int,)), "exception classes"),
    ((3, (), -1), "backoff"), ((3, (), 1, float("inf")), "max_delay"),
])
def test_a_bad_policy_is_a_configuration_error(arguments, message):
    with pytest.raises(ConfigurationError, match=message):
        Retries(*arguments)


def test_a_policy_is_hashable_picklable_and_takes_one_class():
    policy = Retries(3, on=Flaky, backoff=0.5)
    assert policy.on == (Flaky,) and hash(policy) == hash(Retries(3, on=(Flaky,), backoff=0.5))
    assert pickle.loads(pickle.dumps(policy)) == policy
    assert retrypolicy.attempts_of(policy) == 3 and retrypolicy.attempts_of(4) == 4


@pytest.mark.parametrize("attempt, raised, delay", [
    ("1", Flaky, 1.5), ("2", Flaky, 3.0),
    ("3", Flaky, None),  # the last attempt: the error is the outcome
    ("1", ValueError, None),  # not listed
])
def test_wrap_asks_the_worker_to_retry_a_listed_error_and_keeps_the_name(attempt, raised, delay):
    def fetch(kind):
        raise kind("no")

    assert retrypolicy.wrap(fetch, 3) is fetch and retrypolicy.wrap(fetch, Retries(3)) is fetch
    wrapped = retrypolicy.wrap(fetch, Retries(3, on=(Flaky,), backoff=1.5))
    assert wrapped.__name__ == "fetch" and wrapped.__qualname__ == fetch.__qualname__
    with pytest.raises(raised):  # outside a worker: nothing to retry
        wrapped(raised)
    checkpoints.begin_call(None, "file:///x/runs/r/jobs/k", 0, attempt)
    try:
        with pytest.raises(raised):  # the outcome is still the error
            wrapped(raised)
        assert checkpoints.retry_requested() == delay
    finally:
        checkpoints.end_call()
    assert checkpoints.retry_requested() is None
