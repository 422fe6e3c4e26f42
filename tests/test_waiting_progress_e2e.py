"""The progress bar says why a job waits, on the embedded emulator (real worker processes: the
slow tier). One call holds what a second needs (the compute environment's vCPUs, or a
consumable resource); the bar's stream shows the second one's reason, read by the poller from
GetJobQueueSnapshot."""

import io
import threading
import time
from pathlib import Path

import pytest

import batchfutures
from batchfutures import BatchExecutor, progress

pytestmark = pytest.mark.slow


def hold_until(gate):
    """Run until the file ``gate`` exists."""
    while not Path(gate).exists():
        time.sleep(0.05)
    return "held"


def quick():
    return "ran"


def wait_for(predicate, timeout=90.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("case, expected", [
    ("vcpus", "waiting: 1st in queue, 2/2 vCPUs in use"),  # the CE's maxvCpus (2) all held
    ("licence", "waiting: licence busy (1/1 in use), 1st in queue"),
])
def test_the_bar_shows_why_a_job_that_cannot_start_waits(local_env, tmp_path, monkeypatch, case,
                                                         expected):
    monkeypatch.setenv("BATCHFUTURES_WAIT_REASON_AFTER", "0")  # read at once (default 30 s)
    monkeypatch.setattr(progress, "LINE_INTERVAL", 0.0)  # a line at every change
    gate = tmp_path / "gate"
    if case == "licence":
        local_env.batch.create_consumable_resource(consumableResourceName="licence",
                                                   totalQuantity=1, resourceType="REPLENISHABLE")
    with BatchExecutor(local_env, vcpus=2 if case == "vcpus" else 0.5) as ex:
        runner = ex.with_settings(consumes={"licence": 1}) if case == "licence" else ex
        holder = runner.submit(hold_until, str(gate))
        wait_for(holder.running, what="the first call to start")
        waiter = runner.submit(quick)
        stream = io.StringIO()
        drawing = threading.Thread(target=batchfutures.progress, args=([holder, waiter],),
                                   kwargs={"file": stream, "desc": "calls"}, daemon=True)
        drawing.start()
        try:
            wait_for(lambda: expected in stream.getvalue(), what=f"{expected!r} on the bar")
            assert not waiter.done()  # it still waits: the reason is shown while it does
        finally:
            gate.touch()
        assert holder.result(timeout=120) == "held" and waiter.result(timeout=120) == "ran"
        drawing.join(30)
    lines = stream.getvalue().splitlines()
    assert any(expected in line for line in lines)
    assert expected not in lines[-1]  # once every call ended, no reason is shown
