"""The container: a fresh process per attempt, Batch's variables, the overrides' environment."""

import json

import pytest
from botocore.exceptions import ClientError
from emulator_harness import QUEUE, py

DUMP_ENV = ("import json, os, sys\n"
            "name = os.environ.get('AWS_BATCH_JOB_ARRAY_INDEX', 'plain')\n"
            "keys = [k for k in os.environ if k.startswith('AWS_BATCH') or k.startswith('MY_')]\n"
            "with open(os.path.join(sys.argv[1], name + '.json'), 'w') as f:\n"
            "    json.dump({k: os.environ[k] for k in keys} | {'pid': os.getpid()}, f)\n")


@pytest.mark.slow
def test_an_array_of_five_children_each_see_their_own_index(emu, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    array = emu.job(py(DUMP_ENV) + [str(out)], name="five", size=5, env={"MY_SETTING": "on"})
    parent = emu.wait(array)
    assert parent["status"] == "SUCCEEDED"
    seen = {int(p.stem): json.loads(p.read_text()) for p in out.iterdir()}
    assert sorted(seen) == [0, 1, 2, 3, 4]
    pids = set()
    for index, env in seen.items():
        assert env["AWS_BATCH_JOB_ARRAY_INDEX"] == str(index)
        assert env["AWS_BATCH_JOB_ARRAY_SIZE"] == "5"
        assert env["AWS_BATCH_JOB_ID"] == f"{array}:{index}"
        assert env["AWS_BATCH_JOB_ATTEMPT"] == "1"
        assert env["AWS_BATCH_JQ_NAME"] == QUEUE
        assert env["AWS_BATCH_CE_NAME"]
        assert env["MY_SETTING"] == "on"
        pids.add(env["pid"])
    assert len(pids) == 5  # a fresh process each
    children = emu.describe_jobs(jobs=[f"{array}:{i}" for i in range(5)])["jobs"]
    assert [c["arrayProperties"] for c in children] == [{"index": i} for i in range(5)]
    assert all(c["jobArn"].endswith(f"/{array}:{i}") for i, c in enumerate(children))


@pytest.mark.slow
def test_a_plain_job_has_no_array_variables(emu, tmp_path, monkeypatch):
    # even when the client itself runs inside an array job
    monkeypatch.setenv("AWS_BATCH_JOB_ARRAY_INDEX", "7")
    monkeypatch.setenv("AWS_BATCH_JOB_ARRAY_SIZE", "9")
    job = emu.job(py(DUMP_ENV) + [str(tmp_path)], env={"MY_A": "1", "MY_B": "two words"})
    detail = emu.wait(job)
    assert detail["status"] == "SUCCEEDED"
    env = json.loads((tmp_path / "plain.json").read_text())
    assert "AWS_BATCH_JOB_ARRAY_INDEX" not in env and "AWS_BATCH_JOB_ARRAY_SIZE" not in env
    assert env["AWS_BATCH_JOB_ID"] == job
    assert env["MY_A"] == "1" and env["MY_B"] == "two words"
    shown = {v["name"]: v["value"] for v in detail["container"]["environment"]}
    assert shown["MY_A"] == "1" and shown["MY_B"] == "two words"
    assert detail["container"]["command"] == py(DUMP_ENV) + [str(tmp_path)]


@pytest.mark.slow
def test_the_definitions_environment_is_passed_and_overrides_win(emu, tmp_path):
    emu.register_job_definition(
        jobDefinitionName="with-env", type="container",
        containerProperties={"image": "local", "command": py(DUMP_ENV) + [str(tmp_path)],
                             "environment": [{"name": "MY_FROM_DEFINITION", "value": "d"},
                                             {"name": "MY_BOTH", "value": "definition"}],
                             "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                                      {"type": "MEMORY", "value": "512"}]})
    job = emu.submit_job(jobName="env", jobQueue=QUEUE, jobDefinition="with-env",
                         containerOverrides={"environment": [{"name": "MY_BOTH", "value": "override"}]})
    detail = emu.wait(job["jobId"])
    assert detail["status"] == "SUCCEEDED"
    env = json.loads((tmp_path / "plain.json").read_text())
    assert env["MY_FROM_DEFINITION"] == "d" and env["MY_BOTH"] == "override"
    shown = {v["name"]: v["value"] for v in detail["container"]["environment"]}
    assert shown["MY_FROM_DEFINITION"] == "d" and shown["MY_BOTH"] == "override"


@pytest.mark.parametrize("name", ["AWS_BATCH_JOB_ID", "AWS_BATCHX"])
def test_overrides_may_not_set_aws_batch_variables(emu, name):
    with pytest.raises(ClientError) as raised:
        emu.job(py("pass"), env={name: "1"})
    assert raised.value.response["Error"]["Code"] == "ClientException"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


@pytest.mark.slow
def test_a_command_that_cannot_start_fails_the_attempt(emu, tmp_path):
    detail = emu.run([str(tmp_path / "no-such-program")])
    assert detail["status"] == "FAILED"
    assert len(detail["attempts"]) == 1
    assert detail["attempts"][0]["container"]["reason"].startswith("CannotStartContainerError")


def test_an_emptied_scratch_folder_is_kept_for_a_later_attempt_and_anything_else_removed(tmp_path):
    import os

    from batchfutures.emulator.runtime.container import Scratch

    scratch = Scratch(tmp_path, [123, "456"])
    first = scratch.make("task-1")
    inode = os.stat(first).st_ino
    scratch.recycle(first)
    assert not os.path.exists(first)
    second = scratch.make("task-2")  # the same folder, renamed: empty, named for its task
    assert second.endswith("task-2") and os.stat(second).st_ino == inode
    assert os.listdir(second) == []
    with open(os.path.join(second, "left"), "w"):
        pass
    scratch.recycle(second)  # not empty: removed, never handed out again
    assert not os.path.exists(second)
    third = scratch.make("task-3")
    assert os.listdir(third) == []  # a new folder (its inode number may be the freed one's)
    scratch.recycle(third)
    spare = next(p for p in os.listdir(scratch.mine) if p.startswith(".spare"))
    with open(os.path.join(scratch.mine, spare, "late"), "w"):  # written after it was kept
        pass
    fourth = scratch.make("task-4")
    assert os.listdir(fourth) == []
    scratch.recycle(fourth)
    scratch.close()
    assert os.listdir(scratch.mine) == []
