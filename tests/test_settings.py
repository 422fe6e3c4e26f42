"""Job settings are validated when the executor or a view is made, before any upload."""

import pytest

from batchfutures import AWSBatchEnvironment, BatchExecutor, ConfigurationError, LocalEnvironment
from batchfutures.settings import JobSettings, parse_memory


@pytest.mark.parametrize("text, mib", [
    (512, 512), ("512MiB", 512), ("512 MB", 512), ("8GiB", 8192), ("8G", 8192),
    ("1.5GiB", 1536), ("1TiB", 1024 * 1024), ("2048", 2048),
])
def test_memory_strings(text, mib):
    assert parse_memory(text) == mib


@pytest.mark.parametrize("bad", ["lots", "", "12 parsecs", -1, 0, 2, True, None, [1]])
def test_bad_memory_is_a_configuration_error(bad):
    with pytest.raises(ConfigurationError):
        parse_memory(bad)


@pytest.mark.parametrize("kwargs", [
    {"vcpus": -1}, {"vcpus": 0}, {"vcpus": "two"}, {"memory": "lots"}, {"retries": 11},
    {"retries": 0}, {"gpus": -1}, {"gpus": 1.5}, {"timeout": 0}, {"timeout": -5},
    {"priority": 10000}, {"tags": ["a"]}, {"environment": {"AWS_BATCH_JOB_ID": "x"}},
    {"environment": {"1BAD": "x"}}, {"colour": "blue"},
])
def test_invalid_settings_raise_when_the_executor_is_made(kwargs, tmp_path):
    with pytest.raises(ConfigurationError):
        BatchExecutor(LocalEnvironment(tmp_path), **kwargs)


def test_invalid_settings_raise_when_a_view_is_made(tmp_path):
    env = LocalEnvironment(tmp_path)
    executor = BatchExecutor(env)
    with pytest.raises(ConfigurationError):
        executor.with_settings(memory="lots")
    view = executor.with_settings(memory="4GiB", vcpus=2)
    assert view.settings.memory == 4096 and view.settings.vcpus == 2
    assert executor.settings.memory is None  # the parent keeps its own settings
    assert not any(p.is_file() for p in (tmp_path / "storage").rglob("*"))  # nothing uploaded
    executor.shutdown()


def test_configuration_error_is_a_value_error():
    assert issubclass(ConfigurationError, ValueError)


def test_default_memory_follows_the_contract():
    assert JobSettings().memory_mib() == 2048
    assert JobSettings.from_kwargs(vcpus=4).memory_mib() == 4096
    assert JobSettings.from_kwargs(gpus=2).memory_mib() == 8192
    assert JobSettings.from_kwargs(vcpus=1).memory_mib(definition_memory=3000) == 3000
    assert JobSettings.from_kwargs(memory="1GiB").memory_mib(definition_memory=3000) == 1024


def test_aws_refuses_a_timeout_under_a_minute():
    env = AWSBatchEnvironment(job_queue="q", io_bucket="bucket", job_definition="d",
                              region_name="us-east-1")
    with pytest.raises(ConfigurationError, match="60"):
        BatchExecutor(env, timeout=30)
    executor = BatchExecutor(env, timeout=60)
    with pytest.raises(ConfigurationError):
        executor.with_settings(timeout=59)


def test_local_accepts_short_timeouts(tmp_path):
    executor = BatchExecutor(LocalEnvironment(tmp_path), timeout=0.5)
    assert executor.settings.timeout == 0.5
    executor.shutdown()


def test_fargate_combinations_are_checked_before_submit():
    env = AWSBatchEnvironment(job_queue="q", io_bucket="bucket", image="repo/worker:3.11",
                              execution_role_arn="arn:aws:iam::1:role/x", platform="FARGATE",
                              region_name="us-east-1")
    BatchExecutor(env, vcpus=1, memory="2GiB")
    BatchExecutor(env, vcpus=0.5, memory=1024)
    for bad in ({"vcpus": 1, "memory": 512}, {"vcpus": 3}, {"gpus": 1, "vcpus": 1, "memory": 4096}):
        with pytest.raises(ConfigurationError):
            BatchExecutor(env, **bad)
