"""Issue 19, point 4: emulator records read back from disk are checked against a schema with
bounds (emulator/schema.py); a bad one (a list where an object belongs, a huge `array_size` or
`chunks`, a record copied under another job's name, a log stream climbing out of the logs
folder) is skipped with one warning naming its file and field, and never fails DescribeJobs or
ListJobs for the queue, nor allocates in proportion to a number it claims. Also: a CLI job id
cannot name a storage object outside `jobs/`.

Real parts: records built by the emulator's own `Job`, read by the real `RecordStore` and
`JobTable` (a thread, no processes); the slow tests run a `BatchEmulator` job and the CLI.
"""

import copy
import json
import logging
import os
import subprocess
import sys
import threading
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest

from batchfutures.emulator import BatchEmulator, schema
from batchfutures.emulator.jobstate import EXITED, Job, JobSpec, describe, summary
from batchfutures.emulator.records import (
    BadRecord,
    DefinitionStore,
    QueueStore,
    RecordStore,
    job_texts,
    owner_token,
)
from batchfutures.emulator.table import JobTable
from batchfutures.errors import ConfigurationError
from batchfutures.statuses import JobStatus
from batchfutures.storage import Storage

QUEUE = "q"
NOW = int(time.time() * 1000)


def make_job(*, array_size=None, num_nodes=None, stopped=NOW, stream="d/default/task") -> Job:
    """A finished job as the emulator builds it: one succeeded attempt per unit."""
    spec = JobSpec(
        job_id=str(uuid.uuid4()), name="j", queue=QUEUE, definition_name="d",
        definition_arn="arn:aws:batch:us-east-1:123456789012:job-definition/d:1", image="img",
        command=["python", "-c", "pass"], environment=[{"name": "X", "value": "1"}],
        resource_requirements=[{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "2048"}],
        vcpus=1.0, memory=2048, gpus=0, timeout=100, tags={"k": "v"}, parameters={"p": "q"},
        retry_strategy={"attempts": 3, "evaluateOnExit": [{"onExitCode": "3", "action": "RETRY"}]},
        depends_on=[], array_size=array_size, created=stopped - 10, seq=0,
        platform_capabilities=["EC2"], tag_total=1, num_nodes=num_nodes,
        main_node=0 if num_nodes else None,
        nodes=[{"image": "img", "vcpus": 1.0, "memory": 2048}] * num_nodes if num_nodes else None)
    job = Job(spec)
    for unit in job.units:
        unit.created, unit.started = stopped - 10, stopped - 5
        unit.attempts.append({"container": {"logStreamName": stream, "taskArn": "arn:task", "exitCode": 0},
                              "startedAt": stopped - 5, "stoppedAt": stopped, "statusReason": EXITED})
        job.move(unit, JobStatus.SUCCEEDED, stopped, EXITED)
    if job.has_children:
        job.finish_parent(JobStatus.SUCCEEDED, None, stopped)
    return job


def on_disk(job: Job, owner=None):
    """(parent record, chunk records) exactly as the Persister writes and a reader parses them."""
    parent, chunks = job_texts(job, owner or owner_token("a1b2c3"), range(job.chunk_count))
    return json.loads(parent), [json.loads(chunks[k]) for k in sorted(chunks)]


def planted(record, path, value):
    """A copy of `record` with the field at dotted `path` (``a.b[2].c``) set to `value`."""
    record = copy.deepcopy(record)
    *parents, last = path.replace("[", ".[").split(".")
    target = record
    for part in parents:
        target = target[int(part[1:-1])] if part.startswith("[") else target[part]
    if last.startswith("["):
        target[int(last[1:-1])] = value
    else:
        target[last] = value
    return record


# -- the validator: a table of bad fields, each named ---------------------------------------------
def test_what_the_emulator_writes_passes():
    for job in (make_job(), make_job(array_size=1001), make_job(num_nodes=3)):
        parent, chunks = on_disk(job)
        assert schema.job_problem(parent, job.job_id) is None
        children = schema.children_of(parent["spec"])
        assert parent["chunks"] == len(chunks) == (children + 499) // 500
        for number, chunk in enumerate(chunks):
            assert schema.chunk_problem(chunk, number, children) is None


PLAIN_CASES = [  # (field set, value, the field the problem names)
    ("spec", ["a list where an object belongs"], "spec"),
    ("spec.environment", {"X": "1"}, "spec.environment"),
    ("spec.environment[0]", ["X", "1"], "spec.environment[0]"),
    ("spec.tags", ["k", "v"], "spec.tags"),
    ("spec.parameters", {"p": ["q"]}, "spec.parameters.p"),
    ("spec.depends_on", [{"jobId": "x"}] * 21, "spec.depends_on"),
    ("spec.retry_strategy.attempts", 11, "spec.retry_strategy.attempts"),
    ("spec.retry_strategy.attempts", True, "spec.retry_strategy.attempts"),
    ("spec.timeout", float("nan"), "spec.timeout"),
    ("spec.name", "n" * 5000, "spec.name"),
    ("spec.command", ["x\x00y"], "spec.command[0]"),
    ("spec.queue", "../q", "spec.queue"),
    ("spec.job_id", str(uuid.uuid4()), "spec.job_id"),  # a record copied under another name
    ("spec.array_size", 10 ** 12, "spec.array_size"),
    ("spec.array_size", 1, "spec.array_size"),
    ("spec.num_nodes", 10 ** 9, "spec.num_nodes"),
    ("chunks", 10 ** 12, "chunks"),
    ("chunks", 1, "chunks"),  # a plain job has no chunk files
    ("chunkSize", 7, "chunkSize"),
    ("format", "2", "format"),
    ("owner", {"pid": 1}, "owner"),
    ("owner[0]", "1", "owner[0]"),
    ("owner[2]", "../../x", "owner[2]"),
    ("unit", [], "unit"),
    ("unit.status", "DONE", "unit.status"),
    ("unit.createdAt", True, "unit.createdAt"),
    ("unit.attempts", {"0": {}}, "unit.attempts"),
    ("unit.attempts[0]", "attempt", "unit.attempts[0]"),
    ("unit.attempts[0].container", [], "unit.attempts[0].container"),
    ("unit.attempts[0].container.exitCode", "0", "unit.attempts[0].container.exitCode"),
    ("unit.attempts[0].container.logStreamName", 7, "unit.attempts[0].container.logStreamName"),
    ("unit.attempts[0].container.extra", {"nested": 1}, "unit.attempts[0].container.extra"),
    ("unit.attempts", [{"stoppedAt": 1}] * 11, "unit.attempts"),
]


@pytest.mark.parametrize(("path", "value", "where"), PLAIN_CASES,
                         ids=[f"{path}={str(value)[:20]}" for path, value, _ in PLAIN_CASES])
def test_a_bad_field_of_a_job_record_is_named(path, value, where):
    job = make_job()
    parent, _ = on_disk(job)
    found = schema.job_problem(planted(parent, path, value), job.job_id)
    assert found is not None and found.where == where, found


def test_eleven_attempts_counting_the_current_one_are_refused():
    job = make_job()
    parent, _ = on_disk(job)
    unit = parent["unit"]
    unit["attempts"] = unit["attempts"] * 10
    assert schema.job_problem(parent, job.job_id) is None  # ten: Batch's limit
    unit["current"] = {"container": {}}
    assert schema.job_problem(parent, job.job_id).where == "unit.attempts"


@pytest.mark.parametrize(("record", "where"), [
    ([], ""), ("text", ""), (None, ""), ({"format": 2}, "chunks"),
    ({"format": 2, "chunks": 0, "spec": {}}, "spec.created"),
])
def test_a_record_that_is_not_an_object_or_misses_fields_is_refused(record, where):
    found = schema.job_problem(record, str(uuid.uuid4()))
    assert found is not None and found.where == where, found


ARRAY_CASES = [
    ("spec.num_nodes", 2, "spec.num_nodes"),  # an array with nodes
    ("unit", {"status": "SUCCEEDED"}, "unit"),  # a parent has no unit of its own
    ("job", ["SUCCEEDED"], "job"),
    ("job.status", 3, "job.status"),
    ("chunks", 3, "chunks"),  # 1001 children fill 3 chunks, not 2... but 3 is what it has
]


def test_array_parent_fields_are_checked():
    job = make_job(array_size=1001)
    parent, _ = on_disk(job)
    assert parent["chunks"] == 3
    for path, value, where in ARRAY_CASES[:-1]:
        found = schema.job_problem(planted(parent, path, value), job.job_id)
        assert found is not None and found.where == where, (path, found)
    found = schema.job_problem(planted(parent, "chunks", 21), job.job_id)
    assert found is not None and found.where == "chunks"


CHUNK_CASES = [
    ("units", {"0": {}}, "units"),
    ("units[3]", [], "units[3]"),
    ("units[3].status", None, "units[3].status"),
    ("units[3].attempts", "many", "units[3].attempts"),
    ("units[3].attempts[0].container.exitCode", [0], "units[3].attempts[0].container.exitCode"),
    ("start", 500, "start"),
    ("start", -1, "start"),
]


@pytest.mark.parametrize(("path", "value", "where"), CHUNK_CASES,
                         ids=[f"{path}={str(value)[:20]}" for path, value, _ in CHUNK_CASES])
def test_a_bad_field_of_a_chunk_record_is_named(path, value, where):
    job = make_job(array_size=10)
    _, chunks = on_disk(job)
    found = schema.chunk_problem(planted(chunks[0], path, value), 0, 10)
    assert found is not None and found.where == where, found


def test_a_chunk_with_more_children_than_the_job_is_refused():
    job = make_job(array_size=10)
    _, chunks = on_disk(job)
    assert schema.chunk_problem(chunks[0], 0, 10) is None
    assert schema.chunk_problem(chunks[0], 0, 9).where == "units"
    chunks[0]["units"] = chunks[0]["units"] * 60  # 600 > 500 per chunk
    assert schema.chunk_problem(chunks[0], 0, 10_000).where == "units"


@pytest.mark.parametrize(("rule", "value", "ok"), [
    (schema.Int(0, 10), 10, True), (schema.Int(0, 10), 11, False), (schema.Int(0, 10), True, False),
    (schema.Int(0, 10), 1.0, False), (schema.Num(0, 1), 0.5, True), (schema.Num(), float("inf"), False),
    (schema.Str(3), "abc", True), (schema.Str(3), "abcd", False), (schema.Str(3), b"a", False),
    (schema.Bool(), 0, False), (schema.Const(2), 2.0, False), (schema.Nullable(schema.Bool()), None, True),
    (schema.ListOf(schema.Int(), 2), [1, 2, 3], False),
    (schema.MapOf(schema.Int(), key_len=2), {"abc": 1}, False),
    (schema.Json(max_depth=3), [[[1]]], True), (schema.Json(max_depth=3), [[[[[1]]]]], False),
    (schema.Json(), {"a": {"b": None}}, True), (schema.Scalar(), [1], False),
])
def test_each_rule(rule, value, ok):
    assert (schema.problem(rule, value) is None) == ok


# -- reading: bad records are skipped, once, without allocating what they claim ---------------
@pytest.fixture
def table(tmp_path):
    made = JobTable(tmp_path / "emulator", threading.RLock(), owner_token("a1b2c3"), 86400)
    yield made
    made.close()


def plant(store: RecordStore, job_id: str, text: str, chunks=None) -> Path:
    path = store.path(job_id)
    path.write_text(text)
    for number, chunk in (chunks or {}).items():
        store.chunk_path(job_id, number).parent.mkdir(exist_ok=True)
        store.chunk_path(job_id, number).write_text(chunk)
    return path


def write_good(store: RecordStore, job: Job) -> None:
    parent, chunks = job_texts(job, owner_token("a1b2c3"), range(job.chunk_count))
    store.write(job.job_id, parent, chunks)


def bad_records(store: RecordStore):
    """{job id: (its file, the field its warning names)} of records planted next to good ones."""
    plain, _ = on_disk(make_job())
    array_parent, array_chunks = on_disk(make_job(array_size=3))
    found = {}

    def add(record, where, chunks=None, text=None):
        job_id = str(uuid.uuid4())
        if isinstance(record, dict) and isinstance(record.get("spec"), dict):
            record = planted(record, "spec.job_id", job_id)
        path = plant(store, job_id, text if text is not None else json.dumps(record), chunks)
        found[job_id] = (path, where)
    add(planted(plain, "spec.environment", {"X": "1"}), "spec.environment")  # a dict, not a list
    huge = planted(planted(array_parent, "spec.array_size", 10 ** 12), "chunks", 2 * 10 ** 9)
    add(huge, "spec.array_size")
    add(planted(array_parent, "chunks", 10 ** 12), "chunks")
    add([plain], "the record")
    add(None, "not JSON", text="[" * 200_000)  # deeper than the parser's recursion limit
    add(array_parent, "units[1].attempts",
        chunks={0: json.dumps(planted(array_chunks[0], "units[1].attempts", {"a": 1}))})
    fifo = str(uuid.uuid4())  # opening it for reading would block until a writer came
    os.mkfifo(store.path(fifo))
    found[fifo] = (store.path(fifo), "not a regular file")
    copied = str(uuid.uuid4())
    found[copied] = (plant(store, copied, json.dumps(plain)), "spec.job_id")  # another job's record
    return found


def test_bad_records_next_to_good_jobs_are_skipped_with_one_warning_each(table, caplog):
    good, good_array = make_job(), make_job(array_size=700)
    write_good(table.store, good)
    write_good(table.store, good_array)
    bad = bad_records(table.store)
    caplog.set_level(logging.WARNING, logger="batchfutures")
    tracemalloc.start()
    try:
        for _ in range(3):  # every call answers; the second and third warn no more
            listed = table.in_queue(QUEUE)
            assert sorted(j.job_id for j in listed) == sorted([good.job_id, good_array.job_id])
            for job_id in bad:
                assert table.find(job_id) is None
                assert table.find(f"{job_id}:0") is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 * 1024  # nothing the size of 10**12 children or chunks
    job, _ = table.find(good.job_id)
    assert describe(job)["status"] == "SUCCEEDED" and summary(job)["jobId"] == good.job_id
    job, unit = table.find(f"{good_array.job_id}:699")
    assert unit.status == "SUCCEEDED" and describe(job, unit)["jobId"].endswith(":699")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for job_id, (path, where) in bad.items():
        mine = [w for w in warnings if job_id in w]
        assert len(mine) == 1, (job_id, mine)
        assert where in mine[0], mine[0]
        assert str(path) in mine[0] or str(path.parent / f"{job_id}.d") in mine[0], mine[0]
    assert len(warnings) == len(bad)
    for path, _ in bad.values():
        assert path.exists()  # skipped, not deleted: it may be evidence


def test_a_rewritten_record_is_read_again(table, caplog):
    job = make_job()
    parent, _ = on_disk(job)
    path = plant(table.store, job.job_id, json.dumps(planted(parent, "spec.tags", [])))
    assert table.find(job.job_id) is None
    os.unlink(path)  # a new inode: a new version of the record
    plant(table.store, job.job_id, json.dumps(parent))
    assert table.find(job.job_id)[0].status == "SUCCEEDED"


def test_a_huge_record_file_is_refused_before_it_is_read(table, monkeypatch):
    monkeypatch.setattr(schema, "MAX_RECORD_BYTES", 4096)
    job = make_job()
    parent, _ = on_disk(job)
    parent["spec"]["environment"] = [{"name": "X", "value": "v" * 10_000}]
    plant(table.store, job.job_id, json.dumps(parent))
    with pytest.raises(BadRecord, match="bytes, more than 4096"):
        table.store.load(job.job_id)
    assert table.find(job.job_id) is None


@pytest.mark.parametrize("stream", ["../../../..", "../../../x", "/etc/x", "a/../../../../x", "a/./b"])
def test_an_expired_record_naming_a_stream_outside_the_logs_folder_deletes_nothing_there(
        tmp_path, table, stream, caplog):
    target = tmp_path / "x"  # emulator/logs/../../x, and what ../../../.. would reach too
    target.write_text("not the emulator's")
    job = make_job(stopped=NOW - 10 * 86_400_000, stream=stream)  # past the TTL: deleted on read
    parent, _ = on_disk(job)
    assert schema.job_problem(parent, job.job_id) is None  # a string: bounded, placed by log_files
    path = plant(table.store, job.job_id, json.dumps(parent))
    caplog.set_level(logging.WARNING, logger="batchfutures")
    assert table.find(job.job_id) is None
    assert not path.exists()  # the record itself was swept
    assert target.read_text() == "not the emulator's" and tmp_path.is_dir()
    assert f"{stream!r}, not a file under" in caplog.text


def test_a_child_index_of_thousands_of_digits_or_not_ascii_is_unknown(table):
    job = make_job(array_size=3)
    write_good(table.store, job)
    assert table.find(f"{job.job_id}:2") is not None
    for index in ("9" * 5000, "²", "-1", "3"):
        assert table.find(f"{job.job_id}:{index}") is None


def test_bad_queue_definition_and_control_files_are_skipped(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="batchfutures")
    queues = QueueStore(tmp_path)
    assert queues.create("good", {"state": "ENABLED", "priority": 1, "order": 1})
    (queues.folder / "listed.json").write_text('["ENABLED"]')
    (queues.folder / "huge.json").write_text('{"state": "ENABLED", "priority": 1, '
                                             '"jobStateTimeLimitActions": [' + "{}," * 9 + '{}]}')
    for _ in range(2):
        assert queues.names() == ["good"]
        assert queues.load("listed") is None
    assert caplog.text.count("listed.json") == 1 and caplog.text.count("huge.json") == 1
    definitions = DefinitionStore(tmp_path)
    good = {"jobDefinitionName": "d", "jobDefinitionArn": "arn:d:1", "revision": 1, "type": "container"}
    assert definitions.create("d", 1, good)
    (definitions.folder / "d" / "2.json").write_text(json.dumps({**good, "revision": "2"}))
    (definitions.folder / "d" / "3.json").write_text("[]")
    assert definitions.revisions("d") == [good]
    assert "2.json: revision" in caplog.text and "3.json: the record" in caplog.text
    store = RecordStore(tmp_path)
    store.send_control("i1", {"jobId": "j", "action": "CANCEL", "reason": "r"})
    folder = store.control / "i1"
    (folder / "bad.json").write_text('["CANCEL"]')
    assert store.take_control("i1") == [{"jobId": "j", "action": "CANCEL", "reason": "r"}]
    assert os.listdir(folder) == []  # the bad request too is gone, not re-read every 0.25 s
    assert "bad.json" in caplog.text


def test_a_job_id_cannot_name_a_pointer_outside_the_jobs_folder(tmp_path):
    local = Storage((tmp_path / "storage").as_uri())
    (tmp_path / "x").write_bytes(b"planted")
    for job_id in ("../../x", "../x", "..", ".", "", "a/b", "a\x00b"):
        with pytest.raises(ConfigurationError, match="is not a job id"):
            local.read_job_pointer(job_id)
        with pytest.raises(ValueError):
            local.delete_job_pointer(job_id)
    assert (tmp_path / "x").read_bytes() == b"planted"
    assert local.read_job_pointer(str(uuid.uuid4())) is None


# -- end to end --------------------------------------------------------------------------------
def wait_until(predicate, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_describe_and_list_answer_for_the_good_job_beside_planted_bad_records(tmp_path, caplog):
    folder = tmp_path / "emulator"
    caplog.set_level(logging.WARNING, logger="batchfutures")
    first = BatchEmulator(folder, max_vcpus=1)
    try:
        good = first.submit_job(jobName="good", jobQueue="batchfutures",
                                jobDefinition="batchfutures-worker", arrayProperties={"size": 2},
                                containerOverrides={"command": ["python", "-S", "-c", "pass"]})["jobId"]
        wait_until(lambda: first.describe_jobs(jobs=[good])["jobs"][0]["status"] == "SUCCEEDED",
                   "the good job")
        store = RecordStore(folder)
        wait_until(lambda: store.signature(good) is not None, "the good job's record")
        parent, chunks = store.load(good)
        bad = {}
        for path, value in (("spec.environment", {"X": "1"}), ("spec.array_size", 10 ** 12),
                            ("chunks", 10 ** 12), ("spec", [])):
            job_id = str(uuid.uuid4())
            record = planted(parent, path, value)
            if path != "spec":
                record = planted(record, "spec.job_id", job_id)
            plant(store, job_id, json.dumps(record))
            bad[job_id] = path
        broken_chunk = str(uuid.uuid4())
        plant(store, broken_chunk, json.dumps(planted(parent, "spec.job_id", broken_chunk)),
              {0: json.dumps(planted(chunks[0], "units", "x"))})
        bad[broken_chunk] = "units"

        def check(emulator):
            found = emulator.describe_jobs(jobs=[good, f"{good}:1", *bad])["jobs"]
            assert [j["jobId"] for j in found] == [good, f"{good}:1"]
            assert found[0]["arrayProperties"]["statusSummary"]["SUCCEEDED"] == 2
            listed = emulator.list_jobs(jobQueue="batchfutures", jobStatus="SUCCEEDED")
            assert [j["jobId"] for j in listed["jobSummaryList"]] == [good]
            children = emulator.list_jobs(arrayJobId=good, jobStatus="SUCCEEDED")
            assert sorted(j["jobId"] for j in children["jobSummaryList"]) == [f"{good}:0", f"{good}:1"]
        check(first)
    finally:
        first.close()
    second = BatchEmulator(folder, max_vcpus=1)  # its sweep reads them all at start; good is foreign
    try:
        check(second)
        check(second)
    finally:
        second.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for job_id, where in bad.items():
        mine = [w for w in warnings if job_id in w]
        assert mine and all(where in w for w in mine), (job_id, mine)
        assert len(mine) <= 2  # once per emulator that read it, however often it was asked


@pytest.mark.slow
def test_cli_result_of_a_climbing_job_id_reads_nothing_outside_storage(tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir(mode=0o700)
    (workdir / "x").write_bytes(b"planted outside storage")
    env = {k: v for k, v in os.environ.items()
           if k not in ("BATCHFUTURES_JOB_QUEUE", "BATCHFUTURES_JOB_DEFINITION", "BATCHFUTURES_IO_BUCKET")}
    for job_id in ("../../x", "../x"):
        completed = subprocess.run([sys.executable, "-m", "batchfutures", "--workdir", str(workdir),
                                    "result", job_id], capture_output=True, text=True, timeout=120,
                                   env=env)
        assert completed.returncode == 2, completed.stderr
        assert "is not a job id" in completed.stderr and "IntegrityError" not in completed.stderr
        assert "Traceback" not in completed.stderr
