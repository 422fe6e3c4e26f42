"""The scheduler's placement (emulator/runtime/placement.py): pure decisions, one table each."""

import pytest

from batchfutures.emulator.runtime.placement import Ask, Host, fits_now, never_fits, queue_key

HOST = Host(max_vcpus=4.0, memory_mib=8192, gpus=1)


def ask(vcpus=1.0, total=None, memory=2048, gpus=0):
    return Ask(vcpus=vcpus, total_vcpus=vcpus if total is None else total, memory_mib=memory,
               gpus=gpus)


@pytest.mark.parametrize("request_, host, never", [
    (ask(), HOST, False),
    (ask(vcpus=4.0), HOST, False),                     # exactly the host's vCPUs
    (ask(vcpus=4.5), HOST, True),                      # more vCPUs than the host ever has
    (ask(vcpus=1.0, total=6.0), HOST, True),           # a multi-node job: its nodes run at once
    (ask(vcpus=2.0, total=4.0), HOST, False),
    (ask(memory=8192), HOST, False),
    (ask(memory=8193), HOST, True),                    # more memory than the machine has
    (ask(memory=None), HOST, False),                   # no memory asked
    (ask(memory=10**6), HOST._replace(memory_mib=None), False),  # the machine's unknown: placed
    (ask(gpus=1), HOST, False),
    (ask(gpus=2), HOST, True),                         # more GPUs than the machine has
    (ask(vcpus=0.1 + 0.2, total=0.1 + 0.2), HOST._replace(max_vcpus=0.3), False),  # rounding
])
def test_never_fits(request_, host, never):
    assert never_fits(request_, host) is never


@pytest.mark.parametrize("vcpus, used, fits", [
    (1.0, 0.0, True),
    (1.0, 3.0, True),      # the last vCPU
    (1.0, 3.5, False),
    (0.25, 3.75, True),    # Fargate's quarter vCPUs add up without rounding misses
    (2.0, 2.5, False),
    (4.0, 0.0, True),
])
def test_fits_now(vcpus, used, fits):
    assert fits_now(ask(vcpus=vcpus), used, HOST) is fits


def test_the_queue_order_is_submission_then_the_main_node_then_index():
    units = [  # (seq, index, is_main_node)
        (2, 0, False), (1, 3, False), (1, None, False), (2, 1, True), (1, 1, False), (3, None, False),
    ]
    ordered = sorted(units, key=lambda u: queue_key(*u))
    assert ordered == [(1, None, False), (1, 1, False), (1, 3, False),  # job 1: plain, children
                       (2, 1, True), (2, 0, False),                     # job 2: its main node first
                       (3, None, False)]
    assert queue_key(None, None, False) == (0, 0)  # a job without a sequence number goes first
