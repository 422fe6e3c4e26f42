"""Issue 33's per-call features on the worker's inner pool (worker/pool.py: BATCHFUTURES_VCPUS >= 2
and a child of 2+ items, the items in forked sub-processes): each item's own checkpoint, a listed
exception's retry, SIGTERM's interrupted(). Real workers on the embedded emulator (slow tier)."""

import os
import time
from pathlib import Path

import pytest
from spotcases import wait_for

import batchfutures
from batchfutures import BatchExecutor, Retries
from batchfutures.emulator.faults import FaultProfile
from batchfutures.worker import pool

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not pool.FORK_AVAILABLE, reason="the inner pool forks (Linux)")]


def checkpoint_names(local_env):
    return sorted(path.name for path in Path(local_env.workdir).rglob("checkpoints/*"))


def saves_its_index(index):
    previous = batchfutures.restored()
    batchfutures.checkpoint(index)
    return index, previous, os.getpid()


def test_each_item_of_a_pooled_child_checkpoints_under_its_own_key(local_env):
    with BatchExecutor(local_env, vcpus=2) as ex:
        values = list(ex.map(saves_its_index, range(6), chunksize=6))
    assert [(index, previous) for index, previous, _ in values] == [(i, None) for i in range(6)]
    assert len({pid for _, _, pid in values}) == 2  # the pool path was taken
    assert checkpoint_names(local_env) == [f"00000.{i}" for i in range(6)]


def resumes_or_fails(index):
    """Attempt 1: save index * 10, and item 3 raises ValueError; attempt 2: each item's own."""
    state = batchfutures.restored()
    if state is not None:
        return ("restored", state)
    batchfutures.checkpoint(index * 10)
    if index == 3:
        raise ValueError("attempt 1 of item 3")
    return ("fresh", index)


def test_a_listed_exception_in_a_sub_process_retries_and_each_item_restores_its_own(local_env):
    with BatchExecutor(local_env, vcpus=2, retries=Retries(2, on=ValueError, backoff=0)) as ex:
        futures = ex.map_futures(resumes_or_fails, range(6), chunksize=6)
        assert [f.result(timeout=120) for f in futures] == [("restored", i * 10) for i in range(6)]
        assert [a.exit_code for a in futures[0].attempts] == [75, 0]


def until_interrupted(index, folder):
    """Checkpoint as it goes and once told to stop (SIGTERM); a later attempt returns its state."""
    folder = Path(folder)
    state = batchfutures.restored()
    if state is not None:
        return ("restored", state)
    (folder / f"started{index}").write_text(str(os.getpid()))
    steps = 0
    while not batchfutures.interrupted():
        steps += 1
        batchfutures.checkpoint(("steps", index, steps))
        time.sleep(0.01)
    batchfutures.checkpoint(("interrupted", index, steps))
    (folder / f"interrupted{index}").write_text(str(steps))
    time.sleep(600)  # the kill comes


def test_a_spot_notice_reaches_every_sub_process_and_their_checkpoints_survive(local_env, tmp_path):
    # Spot reclaims 4 s after RUNNING: SIGTERM, and SIGKILL 3 s later
    local_env.emulator.set_faults(FaultProfile(spot_reclaim_rate=1.0, spot_reclaim_after=4.0,
                                               spot_notice=3.0))
    with BatchExecutor(local_env, vcpus=2, retries=3) as ex:
        futures = ex.map_futures(until_interrupted, range(2), [str(tmp_path)] * 2, chunksize=2)
        wait_for(lambda: all((tmp_path / f"started{i}").exists() for i in range(2)),
                 what="both items to start")
        local_env.emulator.set_faults(FaultProfile(spot_notice=3.0))  # the retry runs in peace
        results = [f.result(timeout=120) for f in futures]
        steps = [int((tmp_path / f"interrupted{i}").read_text()) for i in range(2)]
        assert results == [("restored", ("interrupted", i, steps[i])) for i in range(2)]
        assert futures[0].reclaims == 1 and futures[0].attempts[-1].exit_code == 0
    pids = {(tmp_path / f"started{i}").read_text() for i in range(2)}
    assert len(pids) == 2  # the two items ran at once, in two sub-processes
