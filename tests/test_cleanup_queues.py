"""`batchfutures cleanup` and a dead client's warm queues: which go (decide_queue, pure), how
they are found (ListQueues by the warm prefix, paged; ListQueueTags) and deleted, on the
emulator's LocalSQS and on moto's SQS, and the CLI's --dry-run listing them."""

import os
import subprocess
import sys
import time

import boto3
import pytest
import s3server

from batchfutures import cleanup, warmpool
from batchfutures.cleanup import Decision, RunReport, decide_queue
from batchfutures.emulator.sqs import LocalSQS
from batchfutures.storage import Storage

aws_env = s3server.aws_env  # moto's SQS needs the fake credentials

DAY = 86400.0
OLD_RUN = "20200101T000000-00000000aa"  # started years ago
NEW_RUN = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-00000000bb"
KEPT = Decision(False, "in progress: 1 job(s) have not ended")
GOES = Decision(True, "finished 2.0 days ago")


@pytest.mark.parametrize("run_id, run_decision, age, horizon, removed, words", [
    (OLD_RUN, GOES, 5 * DAY, DAY, True, "goes"),  # its run is removed: so is the queue
    (OLD_RUN, KEPT, 5 * DAY, DAY, False, "in progress"),  # never under a running run
    (OLD_RUN, Decision(False, "finished, but newer than 1 day"), 5 * DAY, DAY, False, "stays"),
    (OLD_RUN, None, 5 * DAY, DAY, True, "gone from storage"),  # its run was removed before
    (NEW_RUN, None, 600.0, DAY, False, "not in storage"),  # a run whose first write is late
    (OLD_RUN, None, 2 * 3600.0, 0.0, True, "gone from storage"),  # --older-than 0: at least 1 h
    (OLD_RUN, None, 1800.0, 0.0, False, "not in storage"),
    (OLD_RUN, None, None, DAY, False, "not in storage"),  # no age known: never old
    (None, None, 5 * DAY, DAY, False, "no batchfutures:run tag"),  # not ours: never touched
    ("../x", GOES, 5 * DAY, DAY, False, "no batchfutures:run tag"),
])
def test_queue_policy(run_id, run_decision, age, horizon, removed, words):
    decision = decide_queue(run_id, run_decision, age, horizon)
    assert decision.remove is removed and words in decision.reason


@pytest.mark.parametrize("stack", [None, "bf", "a-warm-stack", "s" * 70])
def test_the_prefix_starts_every_warm_queue_of_the_stack(stack):
    prefix = cleanup.warm_queue_prefix(stack)
    name = warmpool.queue_base(stack, NEW_RUN, "0123abcd") + "-work"
    assert name.startswith(prefix) and prefix.endswith("-warm-")
    assert not warmpool.queue_base("other", NEW_RUN, "0123abcd").startswith(prefix)


def test_a_run_started_when_its_id_says():
    assert cleanup.run_started(OLD_RUN) == 1577836800.0  # 2020-01-01T00:00:00Z
    assert cleanup.run_started("not-a-run") is None


@pytest.fixture(params=["emulator", "moto"])
def sqs(request, tmp_path):
    if request.param == "emulator":
        return LocalSQS(tmp_path / "sqs")
    env = request.getfixturevalue("aws_env")
    return boto3.client("sqs", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1")


def make_queues(sqs, run_id, count=2):
    base = warmpool.queue_base(None, run_id, os.urandom(4).hex())
    names = [f"{base}-work", f"{base}-done"][:count]
    return [sqs.create_queue(QueueName=name, tags={cleanup.RUN_TAG: run_id})["QueueUrl"]
            for name in names]


def queue_names(sqs):
    return sorted(url.rsplit("/", 1)[1] for url in cleanup.list_queue_urls(sqs, ""))


def test_a_dead_clients_queues_go_and_a_live_ones_stay(sqs):
    running = "20200102T000000-" + os.urandom(5).hex()
    gone = "20200103T000000-" + os.urandom(5).hex()
    finished = "20200104T000000-" + os.urandom(5).hex()
    running_queues = make_queues(sqs, running)
    gone_queues = make_queues(sqs, gone)
    finished_queues = make_queues(sqs, finished)
    untagged = sqs.create_queue(QueueName=f"batchfutures-warm-{os.urandom(4).hex()}")["QueueUrl"]
    elsewhere = sqs.create_queue(QueueName=f"someone-else-{os.urandom(4).hex()}")["QueueUrl"]
    reports = [RunReport(running, "file:///r/" + running, 30 * DAY, decision=KEPT),
               RunReport(finished, "file:///r/" + finished, 30 * DAY, decision=GOES)]
    found = cleanup.survey_queues(sqs, reports, prefix=cleanup.warm_queue_prefix(None),
                                  horizon_seconds=DAY)
    decided = {q.url: q.decision.remove for q in found}
    assert elsewhere not in decided  # another prefix: never listed
    assert decided[untagged] is False
    assert all(decided[url] is False for url in running_queues)
    assert all(decided[url] is True for url in gone_queues + finished_queues)
    removed = cleanup.remove_queues(sqs, found)
    assert sorted(removed) == sorted(gone_queues + finished_queues)
    left = set(cleanup.list_queue_urls(sqs, ""))
    assert set(running_queues) | {untagged, elsewhere} <= left
    assert not (set(gone_queues) | set(finished_queues)) & left
    # deleted already (by its pool, say, or another cleanup): not an error
    assert cleanup.remove_queues(sqs, [q for q in found if q.decision.remove]) == removed


def test_the_queues_are_listed_page_by_page(sqs, monkeypatch):
    monkeypatch.setattr(cleanup, "_QUEUE_PAGE", 2)
    run = "20200105T000000-" + os.urandom(5).hex()
    urls = make_queues(sqs, run) + make_queues(sqs, run) + make_queues(sqs, run, count=1)
    prefix = warmpool.queue_base(None, run, "")[:-1]  # this run's queues only
    asked = []
    real = sqs.list_queues

    def list_queues(**params):
        asked.append(params.get("NextToken"))
        return real(**params)

    monkeypatch.setattr(sqs, "list_queues", list_queues)
    assert sorted(cleanup.list_queue_urls(sqs, prefix)) == sorted(urls)
    assert len(asked) >= 3 and asked[0] is None  # five queues, two a page


def test_survey_decides_a_queue_by_its_runs_survey(tmp_path):
    """The runs' own survey (real storage, the emulator's Batch) decides the queues."""
    from batchfutures import LocalEnvironment

    env = LocalEnvironment(tmp_path / "work", max_vcpus=1)
    try:
        storage: Storage = env.storage
        job_url = storage.job_url(OLD_RUN, "k1")
        storage.put_bytes(storage.inputs_url(job_url), b"inputs")
        storage.write_job_pointer("job-unknown-to-batch", job_url)
        sqs = cleanup.sqs_client_for(env)
        urls = make_queues(sqs, OLD_RUN)
        later = time.time() + 2 * DAY
        reports = cleanup.survey(storage, env.batch, horizon_seconds=DAY, now=later)
        young = cleanup.survey_queues(sqs, cleanup.survey(storage, env.batch,
                                                          horizon_seconds=DAY),
                                      prefix=cleanup.warm_queue_prefix(None), horizon_seconds=DAY)
        assert {q.url: q.decision.remove for q in young} == dict.fromkeys(urls, False)
        old = cleanup.survey_queues(sqs, reports, prefix=cleanup.warm_queue_prefix(None),
                                    horizon_seconds=DAY, now=later)
        assert {q.url: q.decision.remove for q in old} == dict.fromkeys(urls, True)
    finally:
        env.emulator.close()


def run_cli(workdir, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHFUTURES_")}
    done = subprocess.run([sys.executable, "-m", "batchfutures", "--workdir", str(workdir), *args],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


@pytest.mark.slow
def test_the_cli_lists_a_dead_clients_queues_with_dry_run_then_deletes_them(tmp_path):
    from batchfutures import LocalEnvironment

    workdir = tmp_path / "work"
    env = LocalEnvironment(workdir, max_vcpus=1)
    try:
        sqs = cleanup.sqs_client_for(env)
        urls = make_queues(sqs, OLD_RUN)  # its run is not in storage: a client long dead
        live = make_queues(sqs, NEW_RUN)
    finally:
        env.emulator.close()
    dry = run_cli(workdir, "cleanup", "--dry-run")
    for url in urls:
        assert f"would remove {url}: its run {OLD_RUN} is gone from storage" in dry
    assert f"keeping {live[0]}" in dry and "2 warm queue(s) to remove" in dry
    assert set(urls) <= set(cleanup.list_queue_urls(sqs, ""))  # a dry run deletes nothing
    done = run_cli(workdir, "cleanup")
    assert "2 warm queue(s) removed" in done
    assert set(cleanup.list_queue_urls(sqs, "")) == set(live)
