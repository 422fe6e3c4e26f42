"""Scale: big arrays run through, and the work per change stays small.

Nothing here asserts a duration: a scheduler that costs O(children) per step would still pass,
only slowly, so the suite's own time is the check (see docs/emulator.md for measured numbers).
Launching a process costs the same per child whatever the emulator does, so the 10,000-child
array here runs one child and cancels the rest: every other path (admission, the RUNNABLE
queue, the status summary, listing, describing, persisting, cancelling) sees all 10,000.
"""

import os

import pytest
from emulator_harness import QUEUE, py, wait_until

CHILDREN = 200
# `true` starts fast, so the emulator's own work per child is most of what the test spends.
TRIVIAL = [os.environ.get("BATCHFUTURES_SCALE_COMMAND", "true")]


def list_all(emu, array, status):
    listed, token = [], None
    while True:
        request = {"arrayJobId": array, "jobStatus": status, "maxResults": 1000}
        if token:
            request["nextToken"] = token
        page = emu.list_jobs(**request)
        listed += [item["arrayProperties"]["index"] for item in page["jobSummaryList"]]
        token = page.get("nextToken")
        if not token:
            return listed


@pytest.mark.slow
def test_hundreds_of_children_run_through(make_emulator):
    emu = make_emulator(max_vcpus=4)
    array = emu.job(TRIVIAL, name="many", size=CHILDREN)
    parent = emu.wait(array, timeout=600)
    assert parent["status"] == "SUCCEEDED", parent.get("statusReason")
    assert parent["arrayProperties"]["statusSummary"]["SUCCEEDED"] == CHILDREN
    assert sorted(list_all(emu, array, "SUCCEEDED")) == list(range(CHILDREN))
    some = emu.describe_jobs(jobs=[f"{array}:{i}" for i in range(0, CHILDREN, 2)])["jobs"]
    assert len(some) == 100 and all(c["status"] == "SUCCEEDED" for c in some)
    assert emu.list_jobs(jobQueue=QUEUE, jobStatus="RUNNING")["jobSummaryList"] == []


@pytest.mark.slow
def test_ten_thousand_children(make_emulator, tmp_path):
    emu = make_emulator(max_vcpus=1)
    go = tmp_path / "go"
    hold = py(f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.01)\n")
    array = emu.job(hold, name="huge", size=10_000)
    emu.wait(f"{array}:0", ["RUNNING"])
    parent = emu.wait(array, ["PENDING"], check=lambda d: d["arrayProperties"]["statusSummary"]
                      ["RUNNABLE"] == 9_999)
    summary = parent["arrayProperties"]["statusSummary"]
    assert summary["RUNNING"] == 1 and sum(summary.values()) == 10_000
    assert sorted(list_all(emu, array, "RUNNABLE")) == list(range(1, 10_000))
    assert list_all(emu, array, "RUNNING") == [0]
    tail = emu.describe_jobs(jobs=[f"{array}:{i}" for i in range(9_900, 10_000)])["jobs"]
    assert [c["arrayProperties"]["index"] for c in tail] == list(range(9_900, 10_000))
    assert all(c["status"] == "RUNNABLE" for c in tail)

    emu.cancel_job(jobId=array, reason="enough")
    emu.wait(array, ["PENDING"], check=lambda d: d["arrayProperties"]["statusSummary"]
             ["FAILED"] == 9_999)
    go.touch()
    parent = emu.wait(array)
    assert parent["status"] == "FAILED" and parent["statusReason"] == "enough"
    assert parent["arrayProperties"]["statusSummary"]["SUCCEEDED"] == 1
    assert len(list_all(emu, array, "FAILED")) == 9_999

    # the record is chunked on disk, and another instance reads all of it back
    chunks = tmp_path / "emulator" / "jobs" / f"{array}.d"
    wait_until(lambda: chunks.is_dir() and len(os.listdir(chunks)) == 20, "the record's chunks")
    other = emu_reader = None
    try:
        from emulator_harness import Harness

        from batchfutures.emulator import BatchEmulator

        other = BatchEmulator(tmp_path / "emulator", max_vcpus=1)
        emu_reader = Harness(other)
        seen = wait_until(lambda: (lambda d: d if d and d["status"] == "FAILED" else None)(
            emu_reader.detail(array)), "the other instance to see the final record")
        assert seen["arrayProperties"]["statusSummary"]["FAILED"] == 9_999
        assert emu_reader.detail(f"{array}:9999")["statusReason"] == "enough"
        assert emu_reader.detail(f"{array}:0")["status"] == "SUCCEEDED"
    finally:
        if other is not None:
            other.close()
