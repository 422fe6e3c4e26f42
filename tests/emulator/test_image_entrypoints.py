"""Image entry points (issue 34, point 6): what a job runs when its job definition and overrides
give no command. On AWS the container runs its image's ENTRYPOINT; the emulator runs commands,
so it is told what an image runs: `BatchEmulator(images={PATTERN: argv})`, `--image
'PATTERN=COMMAND'`. A job whose image matches nothing cannot start, saying how to fix it."""

from __future__ import annotations

import sys

import pytest
from emulator_harness import py

from batchfutures.emulator.__main__ import image_option, image_options, parse_args
from batchfutures.emulator.runtime.container import (
    container_argv,
    entry_point,
    image_entry_points,
    no_entry_point,
)

LITHOPS = ["python", "-m", "lithops.serverless.backends.aws_batch.entry_point"]
IMAGES = {"*/lithops_v*/my-runtime:*": LITHOPS, "my-runtime:*": ["run", "it"],
          "*": ["catch", "all"]}


@pytest.mark.parametrize("image, images, expected", [
    ("123456789012.dkr.ecr.us-east-1.amazonaws.com/lithops_v380_test/my-runtime:latest",
     IMAGES, LITHOPS),
    ("my-runtime:1.0", IMAGES, ["run", "it"]),   # the first matching pattern wins, in order
    ("python:3.11-slim", IMAGES, ["catch", "all"]),
    ("python:3.11-slim", {"my-runtime:*": ["x"]}, None),  # no match: nothing to run
    ("MY-RUNTIME:1.0", {"my-runtime:*": ["x"]}, None),    # case-sensitive, as image names
    ("busybox", {"busy?ox": ["sh"]}, ["sh"]),              # fnmatch's ?
    ("busybox", {"busybox": ["sh"]}, ["sh"]),              # an exact name
    (None, {"*": ["x"]}, None),                            # no image at all
    ("anything", {}, None),
])
def test_entry_point_is_the_first_matching_pattern(image, images, expected):
    assert entry_point(image, images) == expected


def test_an_entry_points_leading_python_is_the_images_interpreter():
    assert container_argv(LITHOPS, "/opt/venv/bin/python") == ["/opt/venv/bin/python"] + LITHOPS[1:]


@pytest.mark.parametrize("images, error", [
    ({"": ["x"]}, "pattern"),
    ({"x": []}, "non-empty list"),
    ({"x": "python -m x"}, "non-empty list"),  # a string is not an argv
    ({"x": ["python", 1]}, "non-empty list"),
])
def test_bad_image_entry_points_are_refused(images, error):
    with pytest.raises(ValueError, match=error):
        image_entry_points(images)


@pytest.mark.parametrize("text, expected", [
    ("*lithops*=python -m lithops.serverless.backends.aws_batch.entry_point",
     ("*lithops*", LITHOPS)),
    ("img=sh -c 'echo a=b'", ("img", ["sh", "-c", "echo a=b"])),  # split at the first '='
    (" img = run ", ("img", ["run"])),
])
def test_image_option_parses_pattern_equals_command(text, expected):
    assert image_option(text) == expected


@pytest.mark.parametrize("text", ["img", "=run", "img=", "img=  ", "img=sh -c 'unclosed"])
def test_a_bad_image_option_is_refused(text):
    with pytest.raises(ValueError, match="--image"):
        image_option(text)


def test_image_options_keep_the_order_given_and_the_first_of_a_pattern():
    args = parse_args(["--image", "a*=one", "--image", "*=two", "--image", "a*=three"])
    images = image_options(args.image)
    assert images == {"a*": ["one"], "*": ["two"]}
    assert entry_point("abc", images) == ["one"]


def test_the_reason_says_how_to_give_an_entry_point():
    reason = no_entry_point("python:3.11-slim")
    assert "'python:3.11-slim'" in reason and "--image 'PATTERN=COMMAND'" in reason


def test_the_emulator_refuses_bad_images_before_starting(tmp_path):
    from batchfutures.emulator import BatchEmulator

    with pytest.raises(ValueError, match="non-empty list"):
        BatchEmulator(tmp_path / "emulator", images={"x": []})


def _definition(emu, name, image, command=None):
    properties = {"image": image, "resourceRequirements": [
        {"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "256"}]}
    if command is not None:
        properties["command"] = command
    emu.register_job_definition(jobDefinitionName=name, type="container",
                                containerProperties=properties)
    return name


def _submit(emu, definition, **overrides):
    return emu.submit_job(jobName="j", jobQueue="batchfutures", jobDefinition=definition,
                          containerOverrides=overrides)["jobId"]


@pytest.mark.slow
def test_a_commandless_job_runs_its_images_entry_point(make_emulator):
    code = "import os; print('entry', os.environ['WHO'], os.environ['AWS_BATCH_JOB_ID'])"
    emu = make_emulator(images={"registry.example/tool:*": ["python", "-c", code]})
    definition = _definition(emu, "tool", "registry.example/tool:1.0")
    job_id = _submit(emu, definition, environment=[{"name": "WHO", "value": "me"}])
    detail = emu.wait(job_id)
    assert detail["status"] == "SUCCEEDED", detail.get("statusReason")
    assert emu.log_lines(detail)[:1] == [f"entry me {job_id}"]
    assert detail["container"].get("command", []) == []  # as AWS shows: the job gave none


@pytest.mark.slow
def test_a_command_given_wins_over_the_entry_point(make_emulator):
    emu = make_emulator(images={"*": ["python", "-c", "raise SystemExit(3)"]})
    definition = _definition(emu, "given", "any:1", command=py("print('given')"))
    detail = emu.wait(_submit(emu, definition))
    assert detail["status"] == "SUCCEEDED", detail.get("statusReason")
    assert emu.log_lines(detail)[:1] == ["given"]
    detail = emu.wait(_submit(emu, definition, command=py("print('override')")))
    assert emu.log_lines(detail)[:1] == ["override"]


@pytest.mark.slow
def test_a_commandless_job_whose_image_matches_nothing_cannot_start(make_emulator):
    emu = make_emulator(images={"other:*": [sys.executable, "-c", "pass"]})
    definition = _definition(emu, "bare", "python:3.11-slim")
    detail = emu.wait(_submit(emu, definition))
    assert detail["status"] == "FAILED"
    assert detail["statusReason"] == "Task failed to start"  # AWS's words
    reason = detail["attempts"][-1]["container"]["reason"]
    assert reason.startswith("CannotStartContainerError: NoEntryPoint: ")
    assert "'python:3.11-slim'" in reason and "--image 'PATTERN=COMMAND'" in reason
