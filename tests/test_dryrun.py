"""Dry run: the requests and objects a run would send, and nothing sent."""

import pytest
from botocore.session import get_session
from botocore.validate import ParamValidator

from batchfutures import AWSBatchEnvironment, BatchExecutor, DryRunResult

MODEL = get_session().get_service_model("batch")


def _double(x):
    return 2 * x


def _assert_valid(request):
    report = ParamValidator().validate(request, MODEL.operation_model("SubmitJob").input_shape)
    assert not report.has_errors(), report.generate_report()


def test_dry_run_on_the_emulator_sends_nothing(local_env):
    with BatchExecutor(local_env, dry_run=True, memory="1GiB") as ex:
        futures = ex.map_futures(_double, range(10), chunksize=3)
        errors = [f.exception(timeout=30) for f in futures]
        submitted = ex.submit(_double, 1).exception(timeout=30)
    assert all(isinstance(e, DryRunResult) for e in errors + [submitted])
    (request,) = errors[0].requests
    _assert_valid(request)
    assert request["arrayProperties"] == {"size": 4}  # 10 items, 3 per child
    assert {"type": "MEMORY", "value": "1024"} in request["containerOverrides"]["resourceRequirements"]
    keys = [key for key, _ in errors[0].objects]
    assert any("/functions/" in key for key in keys) and any(key.endswith("/inputs") for key in keys)
    assert all(size > 0 for _, size in errors[0].objects)
    assert isinstance(submitted, DryRunResult) and "arrayProperties" not in submitted.requests[0]
    storage_root = local_env.workdir / "storage"
    assert not storage_root.exists() or not any(storage_root.rglob("inputs"))
    assert local_env.emulator.list_jobs(jobQueue=local_env.job_queue)["jobSummaryList"] == []


def test_dry_run_on_aws_needs_no_reachable_service(monkeypatch):
    # every endpoint is a closed port: any request would fail, so a DryRunResult proves none left
    for service in ("BATCH", "S3", "LOGS", "STS"):
        monkeypatch.setenv(f"AWS_ENDPOINT_URL_{service}", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    env = AWSBatchEnvironment("arn:aws:batch:us-east-1:123456789012:job-queue/q", "my-bucket",
                              image="example/worker:1")
    with BatchExecutor(env, dry_run=True, timeout=120) as ex:
        error = ex.submit(_double, 21).exception(timeout=30)
    assert isinstance(error, DryRunResult), repr(error)
    (request,) = error.requests
    _assert_valid(request)
    assert request["jobDefinition"].startswith("batchfutures-")  # named as it would be registered
    assert request["timeout"] == {"attemptDurationSeconds": 120}
    assert all(key.startswith("my-bucket/") for key, _ in error.objects)


def test_dry_run_still_refuses_what_cannot_be_pickled(local_env):
    import threading

    from batchfutures import SerializationError

    with BatchExecutor(local_env, dry_run=True) as ex:
        with pytest.raises(SerializationError):
            ex.submit(_double, threading.Lock())


def test_dry_run_of_a_multinode_job(local_env):
    with BatchExecutor(local_env, dry_run=True) as ex:
        error = ex.with_settings(nodes=2).submit(_double, 1).exception(timeout=30)
    assert isinstance(error, DryRunResult), repr(error)
    (request,) = error.requests
    _assert_valid(request)
    assert request["nodeOverrides"]["numNodes"] == 2 and "containerOverrides" not in request
