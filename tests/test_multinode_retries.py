"""Retries(on=...) and multi-node jobs (nodes > 1): refused when the settings are made.

A multi-node job's call cannot be retried by exception as a single-node call is: Batch retries
such a job as a whole on its main node's failure only, every node's result of the failed attempt
stays written (written once), and the emulator retries no multi-node job. So the combination is a
ConfigurationError (retrypolicy.nodes_refusal, decided here by a table), never a policy ignored.
"""

import pytest

from batchfutures import BatchExecutor, Retries
from batchfutures.errors import ConfigurationError
from batchfutures.retrypolicy import by_exception, check_nodes, nodes_refusal
from batchfutures.settings import JobSettings


class Throttled(Exception):
    pass


@pytest.mark.parametrize("retries, nodes, refused", [
    (Retries(3, on=Throttled), 2, True),  # the one combination refused
    (Retries(3, on=(Throttled, OSError)), 16, True),
    (Retries(3, on=Throttled), 1, False),  # a single-node job: retried in the worker
    (Retries(3), 4, False),  # no exception listed: Batch's attempts, as retries=3
    (Retries(1, on=Throttled), 4, False),  # one attempt: the exception is the outcome anyway
    (3, 4, False),  # retries=int
    (None, 4, False),
])
def test_which_retries_a_multinode_job_refuses(retries, nodes, refused):
    refusal = nodes_refusal(retries, nodes)
    assert (refusal is not None) is refused
    assert (refusal is not None) is (by_exception(retries) and nodes > 1)
    if refused:
        assert f"nodes={nodes}" in refusal and "Throttled" in refusal
        assert f"retries={retries.attempts}" in refusal  # what to pass instead
        with pytest.raises(ConfigurationError, match="not retried by exception"):
            check_nodes(retries, nodes)
    else:
        check_nodes(retries, nodes)


@pytest.mark.parametrize("first, then", [
    ({"retries": Retries(3, on=Throttled)}, {"nodes": 2}),
    ({"nodes": 2}, {"retries": Retries(3, on=Throttled)}),
    ({}, {"nodes": 2, "retries": Retries(3, on=Throttled)}),
])
def test_the_settings_refuse_the_combination_whichever_comes_first(first, then):
    base = JobSettings.from_kwargs(**first)
    with pytest.raises(ConfigurationError, match="multi-node job's call is not retried"):
        JobSettings.from_kwargs(base, **then)


def test_an_executor_refuses_it_before_anything_is_sent(local_env):
    with pytest.raises(ConfigurationError, match="nodes=2: a multi-node job's call is not"):
        BatchExecutor(local_env, nodes=2, retries=Retries(2, on=Throttled))
    with BatchExecutor(local_env, retries=Retries(2, on=Throttled)) as ex:
        with pytest.raises(ConfigurationError, match="Pass retries=2"):
            ex.with_settings(nodes=2)
        assert ex.with_settings(nodes=2, retries=2) is not None  # what the message proposes
