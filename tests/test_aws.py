"""The AWS path end to end: stock boto3 against the emulator's HTTP endpoint, S3 on moto's server.

Nothing of ours is mocked: AWSBatchEnvironment builds real boto3 `batch` and `logs` clients
(pointed at the emulator through AWS_ENDPOINT_URL_BATCH / _CLOUDWATCH_LOGS, as a user would point
them at any compatible endpoint) and real s3fs storage; the workers read and write the same moto
S3 server. All traffic goes to 127.0.0.1.
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import time
import uuid

import boto3
import botocore.session
import pytest
from botocore.validate import ParamValidator
from s3server import emulator_endpoint, emulator_environment, new_bucket

from batchfutures import (
    BatchExecutor,
    ConfigurationError,
    JobTimeoutError,
    MemoryLimitExceeded,
)

REGION = "us-east-1"


def square(x):
    return x * x


@pytest.fixture(scope="module")
def aws(tmp_path_factory, s3_endpoint):
    """An emulator behind its HTTP endpoint, and the variables that point boto3 at it."""
    with emulator_endpoint(tmp_path_factory.mktemp("aws-emulator"), max_vcpus=2) as emulator:
        yield emulator


@pytest.fixture
def bucket(s3_endpoint):
    return new_bucket()


@pytest.fixture
def requests_seen():
    """Every SubmitJob / RegisterJobDefinition request boto3 sends, captured by an event hook."""
    seen = []

    def capture(params, model, **_):
        seen.append((model.name, json.loads(json.dumps(params))))
    original = boto3.session.Session.client

    def client(self, service, *args, **kwargs):
        made = original(self, service, *args, **kwargs)
        if service == "batch":
            made.meta.events.register("provide-client-params.batch.*", capture)
        return made
    boto3.session.Session.client = client
    yield seen
    boto3.session.Session.client = original


environment = emulator_environment


def test_map_on_the_aws_path(aws, bucket, requests_seen):
    with BatchExecutor(environment(bucket)) as executor:
        assert list(executor.map(square, range(20), chunksize=3)) == [x * x for x in range(20)]
        future = executor.submit(print, "hello over http")
        future.result(timeout=60)
        assert "hello over http" in future.log()
    keys = [o["Key"] for o in boto3.client("s3", region_name=REGION).list_objects_v2(
        Bucket=bucket)["Contents"]]
    assert any(k.startswith("batchfutures/runs/") and k.endswith("/inputs") for k in keys)
    assert any("/results/" in k for k in keys)
    submits = [params for name, params in requests_seen if name == "SubmitJob"]
    assert submits and all(p["jobQueue"] == "batchfutures" for p in submits)


def plus_one(x):
    return x + 1


def fail_on_two(x):
    if x == 2:
        raise ValueError("two")
    return x


def test_a_pipeline_on_the_aws_path(aws, bucket, requests_seen):
    from batchfutures import DependencyFailedError

    with BatchExecutor(environment(bucket)) as executor:
        first = executor.map_futures(square, range(4))              # 0 1 4 9
        second = executor.map_futures(plus_one, first)              # 1 2 5 10
        third = executor.map_futures(fail_on_two, second)           # 1 ValueError 5 10
        fourth = executor.map_futures(plus_one, third)              # 2 DependencyFailed 6 11
        total = executor.submit(sum, [fourth[0], fourth[2], fourth[3]])
        assert total.result(timeout=180) == 2 + 6 + 11
        error = fourth[1].exception(timeout=180)
        assert type(third[1].exception()) is ValueError
    assert type(error) is DependencyFailedError
    assert type(error.__cause__) is ValueError and error.__cause__.args == ("two",)
    submits = [params for name, params in requests_seen if name == "SubmitJob"]
    assert len(submits) == 5  # every stage sent at once, Batch holds them
    for stage in submits[1:4]:  # equal layouts: child i waits for child i only
        assert [d.get("type") for d in stage["dependsOn"]] == ["N_TO_N"]
    assert submits[4]["dependsOn"] == [{"jobId": fourth[0].job_id.split(":")[0]}]


def test_requests_fit_the_model_and_aws_limits(aws, bucket, requests_seen):
    model = botocore.session.get_session().get_service_model("batch")
    with BatchExecutor(environment(bucket, job_definition=None, image="example/worker:py3.11"),
                       tags={"team": "science"}) as executor:
        executor.submit(square, 3).result(timeout=60)
        big = executor.map_futures(square, range(100_000), chunksize=10)  # 10,000 children
        executor.shutdown(wait=True, cancel_futures=True)
        assert sum(f.cancelled() for f in big) > 90_000
    assert {name for name, _ in requests_seen} >= {"SubmitJob", "RegisterJobDefinition"}
    for name, params in requests_seen:
        if name not in ("SubmitJob", "RegisterJobDefinition"):
            continue
        report = ParamValidator().validate(params, model.operation_model(name).input_shape)
        assert not report.has_errors(), report.generate_report()
        assert len(json.dumps(params)) < 30 * 1024
        if name == "SubmitJob":
            assert len(json.dumps(params["containerOverrides"])) < 8192
            assert params["tags"]["team"] == "science" and params["propagateTags"] is True
            assert params["tags"]["batchfutures:version"]
            rules = params["retryStrategy"]["evaluateOnExit"]
            # what fails the same way again exits; anything else (crash, lost host) retries
            assert {"onReason": "OutOfMemoryError*", "action": "EXIT"} in rules
            assert len(rules) <= 5 and all(rule["action"] == "EXIT" for rule in rules)


def test_job_definition_is_registered_once_and_reused(aws, bucket, requests_seen):
    image = f"example/worker:{uuid.uuid4().hex[:8]}"
    for _ in range(2):
        with BatchExecutor(environment(bucket, job_definition=None, image=image)) as executor:
            assert executor.submit(square, 5).result(timeout=60) == 25
    registrations = [p for name, p in requests_seen if name == "RegisterJobDefinition"]
    assert len(registrations) == 1
    assert registrations[0]["containerProperties"]["image"] == image


def test_out_of_memory_on_the_aws_path(aws, bucket):
    with BatchExecutor(environment(bucket), memory=256) as executor:
        error = executor.submit(lambda: len(bytearray(600 * 1024 * 1024))).exception(timeout=60)
    assert isinstance(error, MemoryLimitExceeded) and error.memory_mib == 256


def test_timeout_on_the_aws_path(aws, bucket):
    # AWS refuses timeouts under 60 s from the client, so the short timeout lives in the
    # job definition, as it may on AWS too.
    batch = boto3.client("batch", region_name=REGION)
    name = f"short-{uuid.uuid4().hex[:8]}"
    batch.register_job_definition(
        jobDefinitionName=name, type="container", timeout={"attemptDurationSeconds": 1},
        containerProperties={"image": "local", "command": ["python", "-m", "batchfutures.worker"],
                             "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                                      {"type": "MEMORY", "value": "2048"}]})
    with BatchExecutor(environment(bucket, job_definition=name)) as executor:
        error = executor.submit(time.sleep, 30).exception(timeout=60)
    assert isinstance(error, JobTimeoutError)


def test_timeout_under_a_minute_is_refused(aws, bucket):
    with pytest.raises(ConfigurationError):
        BatchExecutor(environment(bucket), timeout=10)


def test_throttled_endpoint_is_retried(aws, bucket):
    aws.inject_faults(0.3, seed=3)
    try:
        with BatchExecutor(environment(bucket)) as executor:
            futures = executor.map_futures(square, range(12), chunksize=2)
            done, _ = concurrent.futures.wait(futures, timeout=90)
            assert [f.result() for f in futures] == [x * x for x in range(12)]
        assert aws.faults.injected > 0
    finally:
        aws.inject_faults(0)


def test_disabled_queue_is_refused_before_any_upload(aws, bucket):
    batch = boto3.client("batch", region_name=REGION)
    batch.update_job_queue(jobQueue="batchfutures", state="DISABLED")
    try:
        executor = BatchExecutor(environment(bucket))
        with pytest.raises(ConfigurationError, match="DISABLED"):
            executor.map(square, [1, 2, 3])
        executor.shutdown()
    finally:
        batch.update_job_queue(jobQueue="batchfutures", state="ENABLED")
    assert "Contents" not in boto3.client("s3", region_name=REGION).list_objects_v2(Bucket=bucket)


def test_missing_bucket_is_a_configuration_error(aws):
    executor = BatchExecutor(environment(f"missing-{uuid.uuid4().hex[:8]}"))
    with pytest.raises(ConfigurationError, match="bucket|storage"):
        executor.map(square, [1, 2])
    executor.shutdown()


def test_log_reading_follows_pagination(aws, bucket):
    def chatty():
        for i in range(12_000):  # more than one page of GetLogEvents (10,000 events)
            print(f"line {i}")
    with BatchExecutor(environment(bucket)) as executor:
        future = executor.submit(chatty)
        future.result(timeout=60)
        lines = future.log().splitlines()
    assert lines[0] == "line 0" and lines[-1] == "line 11999" and len(lines) == 12_000


def run_check(bucket, definition="batchfutures-worker", queue="batchfutures"):
    env = dict(os.environ, BATCHFUTURES_JOB_QUEUE=queue, BATCHFUTURES_JOB_DEFINITION=definition,
               BATCHFUTURES_IO_BUCKET=bucket, AWS_DEFAULT_REGION=REGION)
    completed = subprocess.run([sys.executable, "-m", "batchfutures", "check"], env=env,
                               capture_output=True, text=True, timeout=120)
    return completed.returncode, completed.stdout.splitlines()


def test_check_reports_each_broken_part(aws, bucket):
    code, lines = run_check(bucket)
    assert code == 0 and all(line.startswith("ok") for line in lines), lines
    code, lines = run_check(f"missing-{uuid.uuid4().hex[:8]}", definition="no-such-definition",
                            queue="no-such-queue")
    assert code == 1
    verdicts = {line.split(":")[0].split(None, 1)[1]: line.split()[0] for line in lines}
    assert verdicts == {"credentials": "ok", "region": "ok", "job queue": "FAIL",
                        "signing key": "ok", "bucket": "FAIL", "job definition": "FAIL",
                        "image": "FAIL"}, lines  # no definition: no image to look at


# -- one session's clients, credentials, retries and S3 guards (issues 11.4-11.6, 13.2) --------
def refreshing_session(first_key, next_keys, *, lifetime, secrets=None):
    """A boto3 Session whose credentials are botocore RefreshableCredentials: ``first_key``
    first, then each refresh hands out the next of ``next_keys``, valid ``lifetime`` seconds.
    A key's secret is ``secrets[key]`` if given there, else ``"secret-" + key``."""
    import datetime
    import itertools

    from botocore.credentials import CredentialProvider, RefreshableCredentials

    keys = itertools.chain([first_key], next_keys)

    def metadata():
        key = next(keys)
        expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=lifetime)
        secret = (secrets or {}).get(key, "secret-" + key)
        return {"access_key": key, "secret_key": secret, "token": "token-" + key,
                "expiry_time": expiry.isoformat()}

    credentials = RefreshableCredentials.create_from_metadata(metadata(), metadata, "expiring")

    class Expiring(CredentialProvider):
        METHOD = CANONICAL_NAME = "expiring"

        def load(self):
            return credentials

    core = botocore.session.get_session()
    core.get_component("credential_provider").insert_before("env", Expiring())
    return boto3.session.Session(botocore_session=core, region_name=REGION)


def signing_key(request):
    """The access key a SigV4-signed request was signed with."""
    authorization = request.header("Authorization") or ""
    if "Credential=" not in authorization:
        return None
    return authorization.split("Credential=", 1)[1].split("/", 1)[0]


def s3_round_trip(storage):
    url = storage.url("probe", uuid.uuid4().hex)
    storage.put_bytes(url, b"one")
    assert storage.get_bytes(url) == b"one"
    assert storage.exists(url)
    job_url = storage.job_url("run-1", "key-1")
    storage.write_inputs(job_url, {"children": 1}, [b"blob"])
    assert storage.list_results(job_url) == set()
    storage.delete(url)
    storage.delete_job(job_url)


@pytest.fixture
def s3_proxy(s3_endpoint, monkeypatch):
    """A loopback proxy in front of moto's S3 for the client process; yields it (rule settable)."""
    from loopback_proxy import LoopbackProxy

    with LoopbackProxy(s3_endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
        yield proxy


def test_s3_signs_with_the_sessions_refreshed_credentials(bucket, s3_proxy):
    session = refreshing_session("AKIDFIRST", (f"AKIDREFRESHED{i:04d}" for i in range(1000)),
                                 lifetime=60)  # inside botocore's refresh window: every use refreshes
    env = environment(bucket, session=session)
    assert not {"key", "secret", "token"} & set(env.storage_options())  # no keys copied
    s3_round_trip(env.storage)
    keys = [signing_key(r) for r in s3_proxy.requests]
    assert keys and all(key.startswith("AKIDREFRESHED") for key in keys), keys
    assert len(set(keys)) > 1  # later calls used newer credentials
    batch_key = env.batch._request_signer._credentials.get_frozen_credentials().access_key
    assert batch_key.startswith("AKIDREFRESHED")  # Batch signs from the very same object


def test_expired_token_refreshes_and_is_not_a_permission_error(bucket, s3_proxy):
    from loopback_proxy import Answer, Forward

    expired = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ExpiredToken</Code>'
               b'<Message>The provided token has expired.</Message></Error>')
    s3_proxy.rule = lambda request: Answer(400, expired, {"Content-Type": "application/xml"}) \
        if signing_key(request) == "AKIDREVOKED" else Forward()
    session = refreshing_session("AKIDREVOKED", (f"AKIDNEW{i}" for i in range(100)), lifetime=7200)
    env = environment(bucket, session=session)
    s3_round_trip(env.storage)  # no PermissionError
    keys = [signing_key(r) for r in s3_proxy.requests]
    assert keys[0] == "AKIDREVOKED" and set(keys[1:]) == {"AKIDNEW0"}, keys
    assert env._clients.expired_token_retry.refreshes == 1


def test_every_s3_request_names_the_expected_owner(bucket, s3_proxy):
    env = environment(bucket)
    s3_round_trip(env.storage)
    owners = {(r.method, r.header("x-amz-expected-bucket-owner")) for r in s3_proxy.requests}
    methods = {method for method, _ in owners}
    assert methods >= {"PUT", "GET", "HEAD", "POST"}, owners  # writes, reads, listings, deletes
    assert {owner for _, owner in owners} == {"123456789012"}, owners  # moto's account, from STS


def test_a_bucket_of_another_account_is_refused(aws, bucket, s3_proxy):
    from loopback_proxy import Answer, Forward

    denied = b'<?xml version="1.0"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>'
    # As S3 does: a request whose ExpectedBucketOwner is not the bucket's owner is refused.
    s3_proxy.rule = lambda request: Forward() if request.header(
        "x-amz-expected-bucket-owner") in (None, "123456789012") else Answer(
            403, denied, {"Content-Type": "application/xml"})
    executor = BatchExecutor(environment(bucket, expected_bucket_owner="111122223333"))
    with pytest.raises(ConfigurationError, match="bucket"):
        executor.map(square, [1, 2])
    executor.shutdown()
    assert s3_proxy.requests and all(r.header("x-amz-expected-bucket-owner") == "111122223333"
                                     for r in s3_proxy.requests)


def test_every_object_written_is_encrypted_with_the_kms_key(bucket, s3_proxy):
    key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    env = environment(bucket, kms_key_id=key)
    s3_round_trip(env.storage)
    writes = [r for r in s3_proxy.requests if r.method == "PUT"]
    assert writes
    for request in writes:
        assert request.header("x-amz-server-side-encryption") == "aws:kms"
        assert request.header("x-amz-server-side-encryption-aws-kms-key-id") == key
        assert request.header("x-amz-server-side-encryption-bucket-key-enabled") == "true"


def test_clients_are_made_once_under_concurrency(bucket):
    import collections
    import threading

    made = collections.Counter()
    original = boto3.session.Session.client

    def counting(self, service, *args, **kwargs):
        made[service] += 1
        return original(self, service, *args, **kwargs)

    env = environment(bucket)
    services = ["batch", "logs", "sts", "secretsmanager"] * 4
    barrier = threading.Barrier(len(services))
    got = collections.defaultdict(set)

    def ask(service):
        barrier.wait()
        got[service].add(id(env.client(service)))

    boto3.session.Session.client = counting
    try:
        threads = [threading.Thread(target=ask, args=(s,)) for s in services]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        boto3.session.Session.client = original
    assert made == {s: 1 for s in set(services)}
    assert all(len(ids) == 1 for ids in got.values())
    assert env.batch.unbudgeted is env.client("batch") and env.logs is env.client("logs")


def test_retries_do_not_stack(aws, bucket):
    from batchfutures.batchapi import RetryBudget, describe_jobs

    env = environment(bucket)
    sent = []
    env.batch.meta.events.register("before-send.batch.DescribeJobs", lambda **kw: sent.append(1))
    aws.inject_faults(1.0, operations=["DescribeJobs"])
    try:
        with pytest.raises(botocore.exceptions.ClientError):
            describe_jobs(env.batch, ["nope"], budget=RetryBudget(attempts=3, first_wait=0.01,
                                                                  max_wait=0.01))
    finally:
        aws.inject_faults(0)
    assert len(sent) == 3  # tenacity's three, botocore's own retries off (not 3 x 8)


def test_expired_token_on_batch_refreshes_too(aws, bucket, monkeypatch):
    from loopback_proxy import Answer, Forward, LoopbackProxy

    expired = b'{"message": "The security token included in the request is expired"}'
    rule = lambda request: Answer(403, expired, {"x-amzn-ErrorType": "ExpiredTokenException"}) \
        if signing_key(request) == "AKIDREVOKED" else Forward()  # noqa: E731
    with LoopbackProxy(os.environ["AWS_ENDPOINT_URL_BATCH"], rule) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_BATCH", proxy.url)
        # refreshed to the emulator's own pair, which its endpoint requires (the revoked key
        # never reaches it: the proxy answers for AWS)
        key, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
        session = refreshing_session("AKIDREVOKED", iter([key]), lifetime=7200,
                                     secrets={key: secret})
        env = environment(bucket, session=session)
        env.check_queue()  # no error: refreshed and sent once more
    keys = [signing_key(r) for r in proxy.requests]
    assert keys == ["AKIDREVOKED", key], keys
