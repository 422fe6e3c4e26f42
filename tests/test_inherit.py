"""os.environ changes reach the calls, credentials never (batchfutures.inherit)."""

import json
import logging
import os

import pytest

from batchfutures import BatchExecutor, DryRunResult, inherit

START = {"PATH": "/usr/bin", "SHELL_SET": "from the shell", "CHANGED": "old"}
NAME, VALUE = "name looks like a credential", "value looks like a credential"
MACHINE = "describes this machine"


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
     {"AWS_REGION": NAME, "aws_profile": NAME, "DB_PASSWORD": NAME, "GITHUB_TOKEN": NAME,
      "API_KEY": NAME, "client_secret": NAME, "MONKEY": NAME}),
    # an access key id in an innocent name
    ({**START, "HARMLESS": "AKIAIOSFODNN7EXAMPLE"}, {}, {}, {"HARMLESS": VALUE}),
    # batchfutures' own settings, and the machine's
    ({**START, "BATCHFUTURES_WORKDIR": "/w", "PATH": "/opt/bin:/usr/bin", "LD_PRELOAD": "x.so",
      "PYTEST_CURRENT_TEST": "t", "HOME": "/root2", "no_proxy": "127.0.0.1"}, {},
     {}, {"BATCHFUTURES_WORKDIR": "batchfutures' own setting", "PATH": MACHINE,
          "LD_PRELOAD": MACHINE, "PYTEST_CURRENT_TEST": MACHINE, "HOME": MACHINE,
          "no_proxy": MACHINE}),
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


@pytest.mark.parametrize("name, value, why", [
    # the review's cases, all sent before: now withheld
    ("MYSQL_PWD", "hunter2", NAME),
    ("SMTP_PASS", "hunter2", NAME),
    ("BASIC_AUTH", "u:p", NAME),
    ("DATABASE_URL", "postgres://app:hunter2@db/x", VALUE),
    ("GITHUB_PAT", "ghp_" + "a1B2" * 9, NAME),
    ("X", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", VALUE),
    ("LOWER", "akiaiosfodnn7example", VALUE),
    ("SPACED", " AKIAIOSFODNN7EXAMPLE", VALUE),
    ("SSL_CERT_FILE", "/etc/ssl/cert.pem", MACHINE),
    ("SSL_CERT_DIR", "/etc/ssl/certs", MACHINE),
    ("REQUESTS_CA_BUNDLE", "/home/me/ca.pem", MACHINE),
    ("CURL_CA_BUNDLE", "/home/me/ca.pem", MACHINE),
    # the other name parts, any case
    ("db_passwd", "x", NAME), ("GOOGLE_CREDENTIALS", "{}", NAME), ("SSH_PRIVATE", "x", NAME),
    ("cookie_jar", "x", NAME), ("FLASK_SESSION", "x", NAME), ("SENTRY_DSN", "x", NAME),
    ("MY_PAT", "x", NAME), ("AWS_PROFILE", "dev", NAME),
    # machine names that also match a credential part: the machine's either way
    ("PWD", "/tmp/work", MACHINE), ("SSH_AUTH_SOCK", "/tmp/agent", MACHINE),
    # ordinary variables: still sent
    ("MY_SETTING", "fast", None),
    ("OMP_NUM_THREADS", "4", None),
    ("MODEL_NAME", "resnet", None),
    ("DATA_DIR", "/home/user/projects/my_project/data/train/images", None),
    ("ENDPOINT", "https://api.example.com:8443/v1/models?user=me", None),
    ("PATHWAY", "x", None),  # contains PATH, not a machine name
])
def test_decide_one(name, value, why):
    choice = inherit.decide({name: value}, {})
    if why is None:
        assert choice.send == {name: value} and choice.withheld == {}
    else:
        assert choice.send == {} and choice.withheld == {name: why}


@pytest.mark.parametrize("value, secret", [
    # access key ids, anywhere, any case
    ("AKIAIOSFODNN7EXAMPLE", True), ("akiaiosfodnn7example", True),
    (" AKIAIOSFODNN7EXAMPLE", True), ("id=ASIAIOSFODNN7EXAMPLE;", True),
    # URLs with a user and password
    ("postgres://app:hunter2@db/x", True), ("https://u:p@example.com", True),
    ("redis://:hunter2@cache:6379/0", True), ("mongodb+srv://a:b@c.net/d", True),
    # PEM blocks
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIE...", True), ("-----begin certificate-----", True),
    # known token prefixes
    ("ghp_" + "a1B2" * 9, True), ("gho_abc", True), ("github_pat_11ABC", True),
    ("glpat-xxxxxxxxxxxxxxxxxxxx", True), ("sk-" + "abcdEFGH1234" * 4, True),
    ("sk-proj-abcdefghijklmnop", True), ("xoxb-123-456-abc", True), ("xoxp-1", True),
    ("Bearer ghp_abc", True),
    # high-entropy runs of 32+ base64/hex characters without spaces
    ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", True),
    ("d41d8cd98f00b204e9800998ecf8427e", True),  # 32 hex
    ("key: Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZg==", True),
    ("abc-_ZZ09xyQrStUvWxYz0123456789AbCd", True),  # URL-safe base64
    # ordinary values: kept
    ("fast", False), ("4", False), ("resnet", False), ("", False), ("0.001", False),
    ("12345678901234567890123456789012345678", False),  # a number, however long
    ("/home/user/projects/my_project/data/train/images", False),
    ("/usr/local/lib/python3.11/site-packages", False),
    ("s3://my-bucket/some/long/prefix/to/the/data/files", False),
    ("https://api.example.com:8443/v1/models?user=me", False),  # a URL without userinfo
    ("http://host:8080/path?email=a@b.com", False),  # an @ after the path is not userinfo
    ("user@example.com", False), ("ssh://git@github.com/org/repo", False),
    ("MyApplicationServiceConfigurationName", False),  # a long identifier, no digits
    ("task-runner disk-image", False),  # sk- inside words is not a token
    ("d41d8cd98f00b204e9800998ecf8427", False),  # 31 hex: short of a run
    ("a" * 40, False),  # long but not random
])
def test_looks_secret(value, secret):
    assert inherit.looks_secret(value) is secret


def test_withheld_names_are_logged_once_by_name_never_value(monkeypatch, caplog):
    monkeypatch.setenv("BF_TEST_LOGGED_PASS", "hunter2-value")
    monkeypatch.setenv("BF_TEST_LOGGED_URL", "postgres://app:hunter2@db/x")
    with caplog.at_level(logging.INFO, logger="batchfutures"):
        inherit.inherited()
        inherit.inherited()
    lines = [r.getMessage() for r in caplog.records if "not sent to the calls" in r.getMessage()]
    assert len(lines) == 1
    assert "BF_TEST_LOGGED_PASS (name looks like a credential)" in lines[0]
    assert "BF_TEST_LOGGED_URL (value looks like a credential)" in lines[0]
    assert "environment=" in lines[0] and "hunter2" not in caplog.text


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
    ("MYSQL_PWD", True), ("smtp_pass", True), ("BASIC_AUTH", True), ("GITHUB_PAT", True),
    ("SESSION_ID", True), ("SENTRY_DSN", True), ("PASSPORT", True), ("PATIENCE", False),
    ("MY_VAR", False), ("OMP_NUM_THREADS", False), ("DATA_DIR", False), ("MODEL_NAME", False),
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


def _double(x):
    return 2 * x


REVIEWED = {  # the review's variables, all once sent in SubmitJob: the suffix keeps them this test's
    "MYSQL_PWD": "hunter2", "SMTP_PASS": "hunter2", "BASIC_AUTH": "u:p",
    "DATABASE_URL": "postgres://app:hunter2@db/x", "GITHUB_PAT": "ghp_" + "a1B2" * 9,
    "X": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "LOWER_ID": "akiaiosfodnn7example",
    "SPACED_ID": " AKIAIOSFODNN7EXAMPLE", "SSL_CERT_FILE": "/nowhere/cert.pem",
    "REQUESTS_CA_BUNDLE": "/nowhere/ca.pem", "CURL_CA_BUNDLE": "/nowhere/ca.pem",
}


def test_the_reviewed_variables_stay_out_of_submitjob(local_env, monkeypatch):
    for name, value in REVIEWED.items():
        if inherit.start_environment().get(name) == value:
            pytest.skip(f"{name} was set so before the test: it would not be a change")
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MODEL_NAME", "resnet")
    with BatchExecutor(local_env, dry_run=True) as ex:
        result = ex.submit(_double, 1).exception(timeout=30)
    assert isinstance(result, DryRunResult)
    (request,) = result.requests
    environment = {pair["name"]: pair["value"]
                   for pair in request["containerOverrides"]["environment"]}
    assert environment["MODEL_NAME"] == "resnet"
    assert not set(REVIEWED) & set(environment)
    sent = json.dumps(request)
    assert not [value for value in REVIEWED.values() if len(value) > 6 and value.strip() in sent]
