"""Batch's lifecycle: statuses in order, epoch-ms timestamps, attempts, array parents, ListJobs."""

import time

import pytest
from emulator_harness import ORDER, QUEUE, py, wait_until

STATUSES = set(ORDER)


def waits_for(path):
    """Code for a job that runs until ``path`` exists."""
    return py(f"import os, time\nwhile not os.path.exists({str(path)!r}): time.sleep(0.01)\n")


class Recorder:
    """Every status each job had after each scheduler step (through the listener) or a call."""

    def __init__(self, emu):
        self.emu, self.ids, self.seen = emu, [], {}
        emu.add_listener(self.look)

    def watch(self, job_id):
        self.ids.append(job_id)
        self.look()
        return job_id

    def look(self):
        ids = list(self.ids)
        if not ids:
            return
        for job in self.emu.emulator.describe_jobs(jobs=ids)["jobs"]:
            history = self.seen.setdefault(job["jobId"], [])
            if not history or history[-1] != job["status"]:
                history.append(job["status"])


def in_lifecycle_order(history):
    positions = [ORDER.index(s) for s in history]
    return positions == sorted(positions) and len(set(positions)) == len(positions)


@pytest.mark.slow
def test_a_job_goes_through_the_lifecycle_in_order(make_emulator, tmp_path):
    emu = make_emulator(max_vcpus=1)
    recorder = Recorder(emu)
    first = recorder.watch(emu.job(waits_for(tmp_path / "first"), name="first"))
    holder = recorder.watch(emu.job(waits_for(tmp_path / "holder"), name="holder"))
    job = recorder.watch(emu.job(waits_for(tmp_path / "job"), name="job",
                                 dependsOn=[{"jobId": first}]))
    emu.wait(first, ["RUNNING"])
    emu.wait(holder, ["RUNNABLE"])
    emu.wait(job, ["PENDING"])          # its dependency runs
    (tmp_path / "first").touch()
    emu.wait(holder, ["RUNNING"])
    emu.wait(job, ["RUNNABLE"])         # the one vCPU is taken
    (tmp_path / "holder").touch()
    emu.wait(job, ["RUNNING"])
    (tmp_path / "job").touch()
    detail = emu.wait(job)
    recorder.look()
    assert detail["status"] == "SUCCEEDED"
    history = recorder.seen[job]
    assert in_lifecycle_order(history), history
    assert {"PENDING", "RUNNABLE", "RUNNING", "SUCCEEDED"} <= set(history), history
    assert history[0] in ("SUBMITTED", "PENDING")
    for other in (first, holder):
        assert in_lifecycle_order(recorder.seen[other]), recorder.seen[other]


@pytest.mark.slow
def test_timestamps_are_epoch_milliseconds_and_each_attempt_is_recorded(emu):
    before = int(time.time() * 1000)
    job = emu.job(py("print('ok')"))
    queued = emu.detail(job)
    # the model marks startedAt required: 0 until the job starts (AWS leaves it out)
    assert queued["startedAt"] == 0 or queued["status"] not in ("SUBMITTED", "PENDING", "RUNNABLE")
    detail = emu.wait(job)
    after = int(time.time() * 1000)
    assert detail["status"] == "SUCCEEDED"
    assert before <= detail["createdAt"] <= detail["startedAt"] <= detail["stoppedAt"] <= after
    assert detail["statusReason"] == "Essential container in task exited"
    assert detail["container"]["exitCode"] == 0
    [attempt] = detail["attempts"]
    assert attempt["container"]["exitCode"] == 0
    assert attempt["container"]["logStreamName"].startswith("batchfutures-worker/default/")
    assert attempt["statusReason"] == "Essential container in task exited"
    assert detail["startedAt"] <= attempt["startedAt"] <= attempt["stoppedAt"] <= detail["stoppedAt"]
    assert detail["jobArn"].endswith(f":job/{job}")
    assert detail["jobQueue"].endswith(f":job-queue/{QUEUE}")
    assert detail["jobDefinition"].endswith(":job-definition/batchfutures-worker:1")
    assert detail["isCancelled"] is False and detail["isTerminated"] is False


@pytest.mark.slow
def test_an_array_parent_is_only_submitted_pending_then_final(make_emulator, tmp_path):
    emu = make_emulator(max_vcpus=2)
    recorder = Recorder(emu)
    array = recorder.watch(emu.job(waits_for(tmp_path / "go"), name="arr", size=4))
    wait_until(lambda: emu.detail(array)["arrayProperties"]["statusSummary"].get("RUNNING") == 2,
               "two children running")
    parent = emu.detail(array)
    assert parent["status"] == "PENDING"
    summary = parent["arrayProperties"]["statusSummary"]
    assert set(summary) == STATUSES
    assert summary["RUNNING"] == 2 and summary["RUNNABLE"] == 2 and sum(summary.values()) == 4
    assert parent["arrayProperties"]["size"] == 4
    assert "index" not in parent["arrayProperties"]
    assert parent["startedAt"] > 0
    (tmp_path / "go").touch()
    final = emu.wait(array)
    recorder.look()
    assert final["status"] == "SUCCEEDED"
    assert final["arrayProperties"]["statusSummary"] == dict.fromkeys(STATUSES, 0) | {"SUCCEEDED": 4}
    assert final["attempts"] == []
    history = recorder.seen[array]
    assert set(history) <= {"SUBMITTED", "PENDING", "SUCCEEDED", "FAILED"}, history
    assert in_lifecycle_order(history), history


@pytest.mark.slow
def test_one_failed_child_fails_the_parent(emu):
    array = emu.job(py("import os; raise SystemExit(int(os.environ['AWS_BATCH_JOB_ARRAY_INDEX']) == 1)"),
                    size=3)
    parent = emu.wait(array)
    assert parent["status"] == "FAILED"
    summary = parent["arrayProperties"]["statusSummary"]
    assert summary["SUCCEEDED"] == 2 and summary["FAILED"] == 1
    children = emu.describe_jobs(jobs=[f"{array}:{i}" for i in range(3)])["jobs"]
    assert [c["status"] for c in children] == ["SUCCEEDED", "FAILED", "SUCCEEDED"]
    assert children[1]["container"]["exitCode"] == 1


@pytest.mark.slow
def test_list_jobs_by_array_and_status_with_paging(emu, tmp_path):
    array = emu.job(py("pass"), name="listed", size=5)
    emu.wait(array)
    ids, token, pages = [], None, 0
    while True:
        request = {"arrayJobId": array, "jobStatus": "SUCCEEDED", "maxResults": 2}
        if token:
            request["nextToken"] = token
        page = emu.list_jobs(**request)
        pages += 1
        assert len(page["jobSummaryList"]) <= 2
        ids.extend(s["jobId"] for s in page["jobSummaryList"])
        for summary in page["jobSummaryList"]:
            assert summary["status"] == "SUCCEEDED"
            assert summary["jobName"] == "listed"
            assert summary["arrayProperties"] == {"index": int(summary["jobId"].rpartition(":")[2])}
            assert summary["container"] == {"exitCode": 0}
        token = page.get("nextToken")
        if not token:
            break
    assert sorted(ids) == sorted(f"{array}:{i}" for i in range(5))
    assert pages == 3
    assert emu.list_jobs(arrayJobId=array, jobStatus="FAILED")["jobSummaryList"] == []
    assert emu.list_jobs(arrayJobId=array)["jobSummaryList"] == []  # no status: RUNNING only


@pytest.mark.slow
def test_list_jobs_without_a_status_lists_running_jobs_only(emu, tmp_path):
    done = emu.job(py("pass"), name="done")
    emu.wait(done)
    running = emu.job(waits_for(tmp_path / "go"), name="running")
    emu.wait(running, ["RUNNING"])
    listed = [s["jobId"] for s in emu.list_jobs(jobQueue=QUEUE)["jobSummaryList"]]
    assert listed == [running]
    by_status = [s["jobId"] for s in emu.list_jobs(jobQueue=QUEUE, jobStatus="SUCCEEDED")["jobSummaryList"]]
    assert by_status == [done]
    named = emu.list_jobs(jobQueue=QUEUE, filters=[{"name": "JOB_NAME", "values": ["runn*"]}])
    assert [s["jobId"] for s in named["jobSummaryList"]] == [running]
    (tmp_path / "go").touch()
    emu.wait(running)
