"""SIGTERM on the worker's inner pool (worker/pool.py: BATCHFUTURES_VCPUS >= 2, a child of 2+
items on forked sub-processes) when only some items use the checkpoint API.

The contract (docs/spot.md): a call that used checkpoint/restored/interrupted goes on until the
kill, interrupted() true; any other ends at once. A sub-process whose call did not checkpoint
ends of the SIGTERM the worker forwards; that must not end the container (and with it the
sibling still saving its work): the worker waits for the others, then ends with 143, as the
sequential worker ends of SIGTERM, without a result, so Batch retries the child.

The decision is pool.sub_process_ending (a table test); the slow tests run real workers on the
embedded emulator and send SIGTERM to the attempt's main process, as its TerminateJob and its
Spot reclaim fault do (emulator/runtime/attempts.py).
"""

import os
import signal
import time
from pathlib import Path

import pytest
from spotcases import wait_for

import batchfutures
from batchfutures import BatchExecutor
from batchfutures.batchlimits import OOM_EXIT_STATUS
from batchfutures.worker import pool

SIGTERM_STATUS = 128 + signal.SIGTERM
needs_fork = pytest.mark.skipif(not pool.FORK_AVAILABLE, reason="the inner pool forks (Linux)")


@pytest.mark.parametrize("exit_status, killed, sigterm_forwarded, oom_counted, expected", [
    # it ended of the SIGTERM the worker forwarded: its call did not checkpoint; the others go on
    (SIGTERM_STATUS, False, True, False, pool.Ending.AFTER_THE_OTHERS),
    # the same status with no SIGTERM received: its own doing (os.kill in the call), a crash
    (SIGTERM_STATUS, False, False, False, pool.Ending.NOW),
    # its MemoryError (exit 137), during a notice or not
    (OOM_EXIT_STATUS, False, True, False, pool.Ending.MEMORY),
    (OOM_EXIT_STATUS, False, False, False, pool.Ending.MEMORY),
    # a SIGKILL the cgroup counts as an OOM kill; one it does not (not the notice's: that kills all)
    (OOM_EXIT_STATUS, True, False, True, pool.Ending.MEMORY),
    (OOM_EXIT_STATUS, True, True, True, pool.Ending.MEMORY),
    (OOM_EXIT_STATUS, True, True, False, pool.Ending.NOW),
    (OOM_EXIT_STATUS, True, False, False, pool.Ending.NOW),
    # any other end (os._exit in the call, a crash) ends the container now, SIGTERM or not
    (1, False, True, False, pool.Ending.NOW),
    (3, False, False, False, pool.Ending.NOW),
    (0, False, True, False, pool.Ending.NOW),
])
def test_what_a_sub_processs_end_means(exit_status, killed, sigterm_forwarded, oom_counted,
                                       expected):
    assert pool.sub_process_ending(exit_status, killed, sigterm_forwarded,
                                   oom_counted) is expected


def gone(pid):
    """The process ended (reaped, or a zombie its parent has yet to reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def saves_or_waits(index, folder):
    """Item 0 checkpoints and, told to stop, works on past its sibling's end, then saves;
    item 1 knows nothing of checkpoints and waits (SIGTERM ends it). A later attempt: item 0
    returns what it restored, item 1 runs afresh."""
    folder = Path(folder)
    if index == 1:
        if os.environ.get("AWS_BATCH_JOB_ATTEMPT", "1") != "1":
            return ("fresh", 1)
        (folder / "started1").write_text(str(os.getpid()))
        time.sleep(600)
        return ("not stopped", 1)
    state = batchfutures.restored()
    if state is not None:
        return ("restored", state)
    (folder / "started0").write_text(f"{os.getpid()} {os.getppid()}")
    steps = 0
    while not batchfutures.interrupted():
        steps += 1
        batchfutures.checkpoint(("steps", steps))
        time.sleep(0.01)
    sibling = int(wait_for(lambda: (folder / "started1").read_text(), what="the sibling's pid"))
    wait_for(lambda: gone(sibling), what="the sibling to end of SIGTERM")
    # the work a notice is for: still running well after the sibling ended (the worker, had it
    # ended with it, would have taken this process along within milliseconds)
    time.sleep(0.5)
    batchfutures.checkpoint(("saved after the notice", steps))
    (folder / "saved").write_text(str(steps))
    time.sleep(600)  # the kill comes


def checkpoint_names(local_env):
    return sorted(path.name for path in Path(local_env.workdir).rglob("checkpoints/*"))


def started(folder):
    return all((folder / f"started{i}").exists() for i in range(2))


@pytest.mark.slow
@needs_fork
def test_terminate_job_lets_the_checkpointing_item_save_while_its_sibling_ends_at_once(local_env,
                                                                                    tmp_path):
    with BatchExecutor(local_env, vcpus=2) as ex:
        futures = ex.map_futures(saves_or_waits, range(2), [str(tmp_path)] * 2, chunksize=2)
        wait_for(lambda: started(tmp_path), what="both items to start")
        pids = {(tmp_path / f"started{i}").read_text().split()[0] for i in range(2)}
        assert len(pids) == 2  # two sub-processes: the pool path
        # TerminateJob: SIGTERM to the attempt's main process, SIGKILL to all 2 s later
        local_env.batch.terminate_job(jobId=futures[0].job_id, reason="test: stop the job")
        for future in futures:  # a terminated job is not retried: both calls fail with it
            with pytest.raises(Exception, match="stop the job"):
                future.result(timeout=120)
    assert (tmp_path / "saved").exists(), "the checkpointing item was killed with its sibling"
    assert checkpoint_names(local_env) == ["00000.0"]  # item 0's own key; item 1 saved nothing
    # the container did not end of the sibling's SIGTERM (143) but at the kill that followed
    assert futures[0].attempts[-1].exit_code == OOM_EXIT_STATUS


@pytest.mark.slow
@needs_fork
def test_a_spot_notice_then_the_kill_and_the_retry_restores_the_saver_and_reruns_the_other(
        local_env, tmp_path):
    with BatchExecutor(local_env, vcpus=2, retries=2) as ex:
        futures = ex.map_futures(saves_or_waits, range(2), [str(tmp_path)] * 2, chunksize=2)
        wait_for(lambda: started(tmp_path), what="both items to start")
        worker = int((tmp_path / "started0").read_text().split()[1])  # the attempt's process
        os.kill(worker, signal.SIGTERM)  # the Spot notice, as the emulator's reclaim sends it
        wait_for(lambda: (tmp_path / "saved").exists() or futures[0].done(),
                 what="the saver's checkpoint, or the attempt's end without it")
        assert (tmp_path / "saved").exists(), "the checkpointing item was killed with its sibling"
        steps = int((tmp_path / "saved").read_text())
        os.kill(worker, signal.SIGKILL)  # the notice's end
        assert [f.result(timeout=120) for f in futures] == [
            ("restored", ("saved after the notice", steps)), ("fresh", 1)]
        assert [a.exit_code for a in futures[0].attempts] == [OOM_EXIT_STATUS, 0]
