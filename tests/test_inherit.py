"""os.environ changes reach the calls, credentials never (batchfutures.inherit)."""

import os

import pytest

from batchfutures import inherit

START = {"PATH": "/usr/bin", "SHELL_SET": "from the shell", "CHANGED": "old"}


@pytest.mark.parametrize("current, explicit, send, withheld", [
    # unchanged since start: the machine's, not sent
    (dict(START), {}, {}, {}),
    # set or changed by the script: sent
    ({**START, "MY_VAR": "hello", "CHANGED": "new"}, {}, {"MY_VAR": "hello", "CHANGED": "new"}, {}),
    # environment= names win: not inherited
    ({**START, "MY_VAR": "hello"}, {"MY_VAR": "explicit"}, {}, {}),
    # credential-like names, any case
    ({**START, "AWS_REGION": "eu-west-1", "aws_profile": "x", "DB_PASSWORD": "p",
      "GITHUB_TOKEN": "t", "API_KEY": "k", "client_secret": "s", "MONKEY": "banana"}, {}, {},
     {"AWS_REGION": "looks like a credential", "aws_profile": "looks like a credential",
      "DB_PASSWORD": "looks like a credential", "GITHUB_TOKEN": "looks like a credential",
      "API_KEY": "looks like a credential", "client_secret": "looks like a credential",
      "MONKEY": "looks like a credential"}),
    # an access key id in an innocent name
    ({**START, "HARMLESS": "AKIAIOSFODNN7EXAMPLE"}, {}, {}, {"HARMLESS": "looks like a credential"}),
    # batchfutures' own settings, and the machine's
    ({**START, "BATCHFUTURES_WORKDIR": "/w", "PATH": "/opt/bin:/usr/bin", "LD_PRELOAD": "x.so",
      "PYTEST_CURRENT_TEST": "t", "HOME": "/root2", "no_proxy": "127.0.0.1"}, {},
     {}, {"BATCHFUTURES_WORKDIR": "batchfutures' own setting", "PATH": "describes this machine",
          "LD_PRELOAD": "describes this machine", "PYTEST_CURRENT_TEST": "describes this machine",
          "HOME": "describes this machine", "no_proxy": "describes this machine"}),
    # names Batch (or a shell) cannot carry
    ({**START, "MY-VAR": "x", "1ST": "y"}, {}, {},
     {"MY-VAR": "not a valid variable name", "1ST": "not a valid variable name"}),
    # too long a value
    ({**START, "BIG": "x" * (inherit.MAX_VALUE + 1), "SMALL": "ok"}, {}, {"SMALL": "ok"},
     {"BIG": f"value over {inherit.MAX_VALUE} characters"}),
    # an empty value set by the script is sent as set
    ({**START, "EMPTY": ""}, {}, {"EMPTY": ""}, {}),
], ids=["unchanged", "set-and-changed", "explicit-wins", "credential-names", "credential-value",
        "own-and-machine", "invalid-names", "too-long", "empty"])
def test_decide(current, explicit, send, withheld):
    choice = inherit.decide(current, START, explicit)
    assert choice.send == send
    assert choice.withheld == withheld


def test_decide_leaves_room_for_the_explicit_environment():
    explicit = {"BIG_EXPLICIT": "x" * inherit.MAX_TOTAL}
    choice = inherit.decide({"SMALL": "ok"}, {}, explicit)
    assert choice.send == {} and "in all" in choice.withheld["SMALL"]


def test_decide_bounds_the_total():
    many = {f"VAR_{i:03d}": "v" * 1000 for i in range(10)}
    choice = inherit.decide(many, {})
    sent = sum(len(name) + len(value) for name, value in choice.send.items())
    assert 0 < sent <= inherit.MAX_TOTAL
    assert set(choice.send) | set(choice.withheld) == set(many)
    assert all("in all" in why for why in choice.withheld.values())


@pytest.mark.parametrize("name, expected", [
    ("AWS_ACCESS_KEY_ID", True), ("AWS_DEFAULT_REGION", True), ("SECRET", True),
    ("my_token", True), ("PASSWORDS", True), ("SSH_KEYFILE", True), ("KEYCLOAK_URL", True),
    ("MY_VAR", False), ("OMP_NUM_THREADS", False), ("DATA_DIR", False),
])
def test_looks_like_credential(name, expected):
    assert inherit.looks_like_credential(name) is expected


def test_inherited_sends_what_this_process_set(monkeypatch):
    monkeypatch.setenv("BF_TEST_INHERITED", "set by the script")
    monkeypatch.setenv("BF_TEST_SECRET", "never")
    pairs = dict(inherit.inherited())
    assert pairs["BF_TEST_INHERITED"] == "set by the script"
    assert "BF_TEST_SECRET" not in pairs
    # what the process started with is not sent
    start = inherit.start_environment()
    assert all(start.get(name) != value for name, value in pairs.items())


def test_start_environment_is_the_process_start():
    # /proc/self/environ is the environment the interpreter was started with: a variable set
    # since is not in it
    os.environ["BF_TEST_SET_LATER"] = "1"
    try:
        assert "BF_TEST_SET_LATER" not in inherit.start_environment()
    finally:
        del os.environ["BF_TEST_SET_LATER"]


@pytest.mark.parametrize("settings, expected", [
    ({}, {"environment": {"BF_TEST_WITH": "script"}}),
    ({"memory": "1GiB"}, {"memory": "1GiB", "environment": {"BF_TEST_WITH": "script"}}),
    ({"environment": {"OTHER": "1"}}, {"environment": {"BF_TEST_WITH": "script", "OTHER": "1"}}),
    ({"environment": {"BF_TEST_WITH": "explicit"}}, {"environment": {"BF_TEST_WITH": "explicit"}}),
    ({"environment": None}, {"environment": {"BF_TEST_WITH": "script"}}),
    ({"environment": ["not", "a mapping"]}, {"environment": ["not", "a mapping"]}),
], ids=["none", "other-settings", "added", "explicit-wins", "explicit-none", "left-to-settings"])
def test_with_inherited(monkeypatch, settings, expected):
    for name in [n for n in os.environ if n not in inherit.start_environment()]:
        monkeypatch.delenv(name)  # only this test's variable is new
    monkeypatch.setenv("BF_TEST_WITH", "script")
    assert inherit.with_inherited(settings) == expected


def test_with_inherited_adds_nothing_when_nothing_changed(monkeypatch):
    for name in [n for n in os.environ if n not in inherit.start_environment()]:
        monkeypatch.delenv(name)
    for name, value in inherit.start_environment().items():
        if os.environ.get(name) != value:
            monkeypatch.setenv(name, value)
    assert inherit.with_inherited({"memory": 512}) == {"memory": 512}
