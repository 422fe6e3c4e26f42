"""Placement: whether a RUNNABLE unit can ever start here, whether it can start now, and in
which order the queue starts them. Pure decisions, table-tested (tests/emulator/test_placement.py);
the scheduler applies them.

    Host(max_vcpus, memory_mib, gpus)             what this emulator runs at once
    Ask(vcpus, total_vcpus, memory_mib, gpus)     one unit's request; a multi-node job's nodes
                                                  run together, so its total must fit at once
    never_fits(ask, host) -> bool                 Batch holds such a job RUNNABLE with
                                                  MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT
    fits_now(ask, used_vcpus, host) -> bool       its vCPUs are free now
    queue_key(seq, index, is_main_node)           submission order; within a job, a multi-node
        -> (seq, place)                           job's main node first, then by index

Only vCPUs are shared out: memory and GPUs are checked against the machine's whole, since the
emulator runs one "instance" and Batch would place a job on any instance that holds it.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

__all__ = ["Host", "Ask", "never_fits", "fits_now", "queue_key"]

EPSILON = 1e-9  # vCPUs are floats (0.25 on Fargate): sums must not miss by a rounding


class Host(NamedTuple):
    max_vcpus: float
    memory_mib: Optional[int]  # None: unknown, never a reason to refuse
    gpus: int


class Ask(NamedTuple):
    vcpus: float              # what the unit holds while it runs
    total_vcpus: float        # what its job needs at once (a multi-node job: every node's)
    memory_mib: Optional[int]
    gpus: int


def never_fits(ask: Ask, host: Host) -> bool:
    """Whether the unit can never start here, however long it waits."""
    if ask.total_vcpus > host.max_vcpus + EPSILON or ask.gpus > host.gpus:
        return True
    return bool(ask.memory_mib and host.memory_mib and ask.memory_mib > host.memory_mib)


def fits_now(ask: Ask, used_vcpus: float, host: Host) -> bool:
    """Whether the unit's vCPUs are free now, ``used_vcpus`` being held by running units."""
    return used_vcpus + ask.vcpus <= host.max_vcpus + EPSILON


def queue_key(seq: Optional[int], index: Optional[int], is_main_node: bool) -> Tuple[int, int]:
    """Where the unit stands in its queue: by its job's submission, then a main node before its
    job's other nodes, then by child or node index."""
    return (seq or 0, -1 if is_main_node else index or 0)
