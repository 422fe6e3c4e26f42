"""An attempt's request (emulator/runtime/container.py): Batch's variables, the record of a new
attempt, what the launcher gets and the log's last newline; real jobs, no process."""

from pathlib import Path

import pytest

from batchfutures.emulator.jobstate import Job, JobSpec
from batchfutures.emulator.runtime import container


def job(**fields):
    return Job(JobSpec(job_id="j1", name="n", queue="q", created=0, seq=1, **fields))


PLAIN = {"AWS_BATCH_JOB_ID": "j1", "AWS_BATCH_JOB_ATTEMPT": "1", "AWS_BATCH_JQ_NAME": "q",
         "AWS_BATCH_CE_NAME": "ce"}


@pytest.mark.parametrize("fields, index, expected", [
    ({}, None, PLAIN),
    ({"array_size": 5}, 3, dict(PLAIN, AWS_BATCH_JOB_ID="j1:3", AWS_BATCH_JOB_ARRAY_INDEX="3",
                                AWS_BATCH_JOB_ARRAY_SIZE="5")),
    ({"num_nodes": 2, "main_node": 0, "nodes": [{}, {}]}, 0,   # the main node: not told its address
     dict(PLAIN, AWS_BATCH_JOB_ID="j1#0", AWS_BATCH_JOB_NODE_INDEX="0", AWS_BATCH_JOB_NUM_NODES="2",
          AWS_BATCH_JOB_MAIN_NODE_INDEX="0")),
    ({"num_nodes": 2, "main_node": 0, "nodes": [{}, {}]}, 1,
     dict(PLAIN, AWS_BATCH_JOB_ID="j1#1", AWS_BATCH_JOB_NODE_INDEX="1", AWS_BATCH_JOB_NUM_NODES="2",
          AWS_BATCH_JOB_MAIN_NODE_INDEX="0", AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS="127.0.0.1")),
])
def test_batch_variables(fields, index, expected):
    unit = job(**fields).units[index or 0]
    unit.current = {"container": {}}  # the attempt under way is attempt 1
    assert container.batch_variables(unit, "ce") == expected


def test_the_attempt_number_counts_the_attempts_made():
    unit = job().units[0]
    unit.attempts, unit.current = [{}, {}], {"container": {}}
    assert container.batch_variables(unit, "ce")["AWS_BATCH_JOB_ATTEMPT"] == "3"


def test_a_new_attempt_names_its_task_and_log_stream():
    record = container.attempt_record("def", "ce")["container"]
    definition, default, task_id = record["logStreamName"].split("/")
    assert (definition, default, len(task_id)) == ("def", "default", 32)
    assert record["taskArn"].endswith(f":task/ce/{task_id}")
    assert container.attempt_record("def", "ce") != container.attempt_record("def", "ce")


def test_the_launch_request(tmp_path):
    unit = job(command=["python3", "-c", "pass"], vcpus=2, memory=512,
               environment=[{"name": "JOB", "value": "own"}, {"name": "AWS_BATCH_JOB_ID", "value": "x"}]
               ).units[0]
    unit.current = {"container": {}}
    request = container.launch_request(
        unit, "def/default/t1", compute_environment="ce", logs_folder=tmp_path,
        python_path=["/image"], cwd="", host={"PATH": "/bin", "SECRET_OF_THE_CLIENT": "no"})
    assert request.argv[1:] == ["-c", "pass"] and request.argv[0] != "python3"  # this interpreter
    assert (request.cwd, request.memory_mib, request.vcpus) == ("", 512, 2.0)
    assert request.log_path == str(tmp_path / "def" / "default" / "t1")
    assert request.env["JOB"] == "own" and request.env["PATH"] == "/bin"
    assert request.env["AWS_BATCH_JOB_ID"] == "j1"  # Batch's variables win
    assert request.env["PYTHONPATH"] == "/image" and request.env["OMP_NUM_THREADS"] == "2"
    assert "SECRET_OF_THE_CLIENT" not in request.env


def test_the_default_world_adds_nothing_when_attempts_are_threads():
    assert container.import_path_and_directory(False, in_processes=False) == ([], "")


@pytest.mark.parametrize("content, after", [
    (b"", b""),                    # an empty log stays empty
    (b"last line", b"last line\n"),
    (b"done\n", b"done\n"),
])
def test_close_log_ends_the_last_line(tmp_path, content, after):
    log = tmp_path / "log"
    log.write_bytes(content)
    container.close_log(log)
    assert log.read_bytes() == after


def test_close_log_of_a_missing_log_does_nothing(tmp_path):
    container.close_log(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()
    assert container.log_file(Path("/logs"), "a/default/b") == Path("/logs/a/default/b")
