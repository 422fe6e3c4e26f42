"""The emulator's HTTP endpoint serves only requests signed with its own credentials.

Issue 19.1: the endpoint runs commands (SubmitJob's containerOverrides.command), so a request
from a web page (cross-site, or through DNS rebinding), or from anyone without the endpoint's
pair, must be refused with 4xx before anything runs. Every refusal below is checked by what it
would have done: no job is listed afterwards and the command's marker file does not exist.
"""

from __future__ import annotations

import datetime
import http.client
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from batchfutures.emulator import BatchEmulator
from batchfutures.emulator.__main__ import main
from batchfutures.emulator.server import EmulatorServer

QUEUE, DEFINITION, GROUP, REGION = "batchfutures", "batchfutures-worker", "/aws/batch/job", "us-east-1"
REPO = Path(__file__).resolve().parents[2]
NO_RETRIES = Config(retries={"mode": "standard", "max_attempts": 0})
LOGS_JSON = "application/x-amz-json-1.1"


def client(name, server, key_id=None, secret=None):
    return boto3.client(name, endpoint_url=server.endpoint_url, region_name=REGION,
                        aws_access_key_id=key_id or server.access_key_id,
                        aws_secret_access_key=secret or server.secret_access_key,
                        config=NO_RETRIES)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    service = BatchEmulator(tmp_path_factory.mktemp("auth-emulator"), max_vcpus=1)
    yield service
    service.close()


@pytest.fixture(scope="module")
def server(emulator):
    with EmulatorServer(emulator) as running:  # a pair made for it
        yield running


@pytest.fixture
def marker(tmp_path):
    return tmp_path / "pwned"


def submit_document(marker):
    """SubmitJob's body for a job whose command creates `marker`."""
    return json.dumps({"jobName": "attack", "jobQueue": QUEUE, "jobDefinition": DEFINITION,
                       "containerOverrides": {"command": ["sh", "-c", f"touch {marker}"]}})


def signed(server, method, path, body=b"", headers=None, *, key_id=None, secret=None,
           host=None, service="batch"):
    """Headers for a request signed as botocore signs it (with this pair and Host)."""
    headers = dict(headers or {})
    host = host or f"127.0.0.1:{server.port}"
    request = AWSRequest(method=method, url=f"http://{host}{path}", data=body, headers=headers)
    credentials = Credentials(key_id or server.access_key_id, secret or server.secret_access_key)
    SigV4Auth(credentials, service, REGION).add_auth(request)
    out = dict(request.headers.items())
    out["Host"] = host
    return out


def send(server, method, path, body=b"", headers=None):
    """The status, headers and body of one raw HTTP request, headers exactly as given."""
    body = body.encode() if isinstance(body, str) else body
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host="Host" in (headers or {}),
                              skip_accept_encoding=True)
        for key, value in (headers or {}).items():
            connection.putheader(key, value)
        if body or method == "POST":
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body or None)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def assert_nothing_ran(server, marker, name="attack"):
    time.sleep(0.3)  # a job, had one been made, would be on its way
    batch = client("batch", server)
    listed = [j for status in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING",
                               "SUCCEEDED", "FAILED")
              for j in batch.list_jobs(jobQueue=QUEUE, jobStatus=status)["jobSummaryList"]
              if j["jobName"] == name]
    assert listed == []
    assert not marker.exists()


# -- signed with the pair: served, as before ------------------------------------------------
@pytest.mark.slow
def test_a_signed_boto3_client_works_for_batch_and_logs(server, tmp_path):
    batch = client("batch", server)
    assert [q["jobQueueName"] for q in batch.describe_job_queues()["jobQueues"]] == [QUEUE]
    job_id = batch.submit_job(jobName="signed", jobQueue=QUEUE, jobDefinition=DEFINITION,
                              containerOverrides={"command": ["python", "-c", "print('hi')"]})["jobId"]
    deadline = time.monotonic() + 60
    while (job := batch.describe_jobs(jobs=[job_id])["jobs"][0])["status"] not in ("SUCCEEDED", "FAILED"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert job["status"] == "SUCCEEDED"
    logs = client("logs", server)
    stream = job["attempts"][-1]["container"]["logStreamName"]
    page = logs.get_log_events(logGroupName=GROUP, logStreamName=stream, startFromHead=True)
    assert [e["message"] for e in page["events"]] == ["hi"]
    # a GET and a DELETE without a body (no content type) get past the check too
    batch.tag_resource(resourceArn=job["jobArn"], tags={"k": "v", "keep": "1"})
    batch.untag_resource(resourceArn=job["jobArn"], tagKeys=["k"])
    assert batch.list_tags_for_resource(resourceArn=job["jobArn"])["tags"] == {"keep": "1"}


def test_each_server_makes_its_own_pair_unless_given_one(emulator):
    first, second = EmulatorServer(emulator), EmulatorServer(emulator)
    assert first.access_key_id != second.access_key_id
    assert first.secret_access_key != second.secret_access_key
    given = EmulatorServer(emulator, access_key_id="AKIDGIVEN", secret_access_key="s3cret")
    assert (given.access_key_id, given.secret_access_key) == ("AKIDGIVEN", "s3cret")
    assert given.credentials == {"aws_access_key_id": "AKIDGIVEN", "aws_secret_access_key": "s3cret"}
    assert "s3cret" not in repr(given)
    with pytest.raises(ValueError):
        EmulatorServer(emulator, access_key_id="AKIDHALF")


# -- refused, running nothing ---------------------------------------------------------------
def test_a_cross_site_browser_post_is_refused(server, marker):
    """Exactly what a web page's fetch(..., {method: "POST", mode: "no-cors", body}) sends."""
    status, _, _ = send(server, "POST", "/v1/submitjob", submit_document(marker), {
        "Host": f"127.0.0.1:{server.port}", "Origin": "http://evil.example",
        "Content-Type": "text/plain;charset=UTF-8", "Accept": "*/*",
        "User-Agent": "Mozilla/5.0", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Site": "cross-site"})
    assert 400 <= status < 500
    assert_nothing_ran(server, marker)


@pytest.mark.parametrize("how", ["unsigned", "wrong key", "wrong secret", "expired", "origin",
                                 "text/plain", "altered body", "dns rebinding"])
def test_a_request_without_a_valid_signature_or_from_a_page_is_refused(server, marker, how):
    body = submit_document(marker)
    json_type = {"Content-Type": "application/json"}
    if how == "unsigned":
        headers = dict(json_type, Host=f"127.0.0.1:{server.port}")
    elif how == "wrong key":
        headers = signed(server, "POST", "/v1/submitjob", body, json_type, key_id="AKIDOTHER")
    elif how == "wrong secret":
        headers = signed(server, "POST", "/v1/submitjob", body, json_type, secret="not-the-secret")
    elif how == "expired":
        then = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=16)
        with mock.patch("botocore.auth.get_current_datetime", return_value=then):
            headers = signed(server, "POST", "/v1/submitjob", body, json_type)
    elif how == "origin":  # signed, even: a browser's request carries an Origin
        headers = signed(server, "POST", "/v1/submitjob", body,
                         dict(json_type, Origin="http://evil.example"))
    elif how == "text/plain":
        headers = signed(server, "POST", "/v1/submitjob", body, {"Content-Type": "text/plain"})
    elif how == "altered body":
        headers = signed(server, "POST", "/v1/submitjob", body.replace("attack", "benign"), json_type)
    else:  # a name rebound to 127.0.0.1: the browser sends its own Host
        headers = signed(server, "POST", "/v1/submitjob", body, json_type,
                         host=f"rebound.evil.example:{server.port}")
    status, response_headers, _ = send(server, "POST", "/v1/submitjob", body, headers)
    expected = {"text/plain": 415, "dns rebinding": 400}.get(how, 403)
    assert status == expected, (how, status, response_headers)
    assert response_headers.get("x-amzn-ErrorType")
    assert_nothing_ran(server, marker)


def test_boto3_with_the_wrong_pair_is_refused(server, marker):
    for key_id, secret in (("AKIDWRONG", server.secret_access_key),
                           (server.access_key_id, "wrong-secret")):
        with pytest.raises(ClientError) as refused:
            client("batch", server, key_id, secret).submit_job(
                jobName="attack", jobQueue=QUEUE, jobDefinition=DEFINITION,
                containerOverrides={"command": ["sh", "-c", f"touch {marker}"]})
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(ClientError) as refused:
        client("logs", server, "AKIDWRONG", "x").describe_log_streams(logGroupName=GROUP)
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert_nothing_ran(server, marker)


def test_logs_takes_only_its_own_json_type(server):
    body = json.dumps({"logGroupName": GROUP, "logStreamName": "no/such/stream"})
    target = {"X-Amz-Target": "Logs_20140328.GetLogEvents"}
    for content_type, expected in ((LOGS_JSON, 400), ("application/json", 415), ("text/plain", 415)):
        headers = signed(server, "POST", "/", body, dict(target, **{"Content-Type": content_type}),
                         service="logs")
        status, _, answer = send(server, "POST", "/", body, headers)
        assert status == expected, (content_type, status, answer)
    # the one served: answered as the service answers (the stream does not exist)
    headers = signed(server, "POST", "/", body, dict(target, **{"Content-Type": LOGS_JSON}),
                     service="logs")
    assert json.loads(send(server, "POST", "/", body, headers)[2])["__type"] == "ResourceNotFoundException"


def test_a_body_over_the_limit_is_413(emulator, marker):
    with EmulatorServer(emulator, max_body=4096) as small:
        body = submit_document(marker)[:-1] + ', "padding": "' + "x" * 5000 + '"}'
        headers = signed(small, "POST", "/v1/submitjob", body, {"Content-Type": "application/json"})
        assert send(small, "POST", "/v1/submitjob", body, headers)[0] == 413
        assert_nothing_ran(small, marker)
    with EmulatorServer(emulator) as server:  # the default limit, without sending the body
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
            connection.sendall(f"POST /v1/submitjob HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                               "Content-Type: application/json\r\n"
                               f"Content-Length: {1 << 30}\r\n\r\n".encode())
            assert connection.recv(4096).startswith(b"HTTP/1.1 413")


# -- python -m batchfutures.emulator --------------------------------------------------------
def start(folder, *flags, env=None):
    path = [str(REPO), os.environ.get("PYTHONPATH")]
    variables = {k: v for k, v in os.environ.items() if not k.startswith("BATCHFUTURES_EMULATOR_")}
    variables.update(env or {}, PYTHONPATH=os.pathsep.join(p for p in path if p))
    return subprocess.Popen([sys.executable, "-m", "batchfutures.emulator", "--folder", str(folder),
                             "--max-vcpus", "1", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=variables)


def stop(process):
    process.terminate()
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    return out


class Endpoint:
    def __init__(self, url, key_id, secret):
        self.endpoint_url, self.access_key_id, self.secret_access_key = url, key_id, secret


@pytest.mark.slow
def test_the_module_makes_a_pair_and_writes_it_only_to_endpoint_json(tmp_path):
    """Issue 29: a pair made at start is never printed (a `> emulator.log` under umask 022 is
    world-readable); it is in endpoint.json, mode 0600, and nowhere else."""
    process = start(tmp_path)
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url or process.stderr.read()
        written = tmp_path / "endpoint.json"
        assert stat.S_IMODE(written.stat().st_mode) == 0o600
        found = json.loads(written.read_text())
        assert set(found) == {"endpoint_url", "aws_access_key_id", "aws_secret_access_key"}
        assert found["endpoint_url"] == url
        assert [p for p in os.listdir(tmp_path) if p.startswith(".endpoint")] == []
        endpoint = Endpoint(url, found["aws_access_key_id"], found["aws_secret_access_key"])
        assert client("batch", endpoint).describe_job_queues()["jobQueues"]
        with pytest.raises(ClientError) as refused:
            client("batch", endpoint, "AKIDWRONG", "wrong").describe_job_queues()
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        # the AWS CLI, pointed at it with the pair of endpoint.json
        aws = shutil.which("aws")
        if aws is not None:
            cli = subprocess.run(
                [aws, "--endpoint-url", url, "--region", REGION, "batch", "describe-job-queues"],
                capture_output=True, text=True, timeout=120,
                env=dict(os.environ, AWS_ACCESS_KEY_ID=found["aws_access_key_id"],
                         AWS_SECRET_ACCESS_KEY=found["aws_secret_access_key"]))
            assert cli.returncode == 0, cli.stderr
            assert json.loads(cli.stdout)["jobQueues"][0]["jobQueueName"] == QUEUE
    finally:
        out = stop(process)
    assert out == ""  # the URL was the only line


@pytest.mark.slow
def test_the_module_takes_its_pair_from_a_file_or_the_environment(tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text("flag-secret\n")
    os.chmod(secret_file, 0o600)
    for flags, env in ((("--access-key-id", "AKIDFLAG", "--secret-access-key-file",
                         str(secret_file)), {}),
                       ((), {"BATCHFUTURES_EMULATOR_ACCESS_KEY_ID": "AKIDFLAG",
                             "BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY": "flag-secret"})):
        process = start(tmp_path / str(len(flags)), *flags, env=env)
        try:
            url = process.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:"), url or process.stderr.read()
            endpoint = Endpoint(url, "AKIDFLAG", "flag-secret")
            assert client("batch", endpoint).describe_job_queues()["jobQueues"]
        finally:
            assert stop(process) == ""  # a pair it was given is not printed


def test_a_non_loopback_host_needs_explicit_credentials(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("BATCHFUTURES_EMULATOR_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY", raising=False)
    for host in ("0.0.0.0", "192.0.2.1", "::"):
        assert main(["--host", host, "--folder", str(tmp_path / "refused")]) == 2
        assert "--access-key-id" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()  # refused before anything was made
    assert main(["--folder", str(tmp_path / "half"), "--access-key-id", "AKIDHALF"]) == 2
