"""Which environment BatchExecutor runs on: an instance, a mapping, or the process environment."""

import os
import subprocess
import sys
import textwrap

import pytest

from batchfutures import AWSBatchEnvironment, BatchExecutor, ConfigurationError, LocalEnvironment
from batchfutures.environments import resolve_environment


def test_no_environment_means_the_embedded_default():
    executor = BatchExecutor()
    try:
        assert isinstance(executor.environment, LocalEnvironment)
        # conftest points BATCHFUTURES_WORKDIR at a private folder: the default honours it
        assert str(executor.environment.workdir) == str(
            os.path.realpath(os.environ["BATCHFUTURES_WORKDIR"]))
        assert executor.submit(sum, [1, 2, 3]).result(timeout=60) == 6
    finally:
        executor.shutdown()


def test_a_mapping_means_aws():
    env = resolve_environment({"job_queue": "q", "job_definition": "d:1", "io_bucket": "bucket",
                               "region_name": "us-east-1"})
    assert isinstance(env, AWSBatchEnvironment)
    assert (env.job_queue, env.job_definition, env.io_bucket) == ("q", "d:1", "bucket")
    assert env.storage.root_url == "s3://bucket/batchfutures"


def test_the_process_environment_means_aws(monkeypatch):
    monkeypatch.setenv("BATCHFUTURES_JOB_QUEUE", "arn:aws:batch:us-east-1:123456789012:job-queue/q")
    monkeypatch.setenv("BATCHFUTURES_JOB_DEFINITION", "def")
    monkeypatch.setenv("BATCHFUTURES_IO_BUCKET", "bkt")
    monkeypatch.setenv("BATCHFUTURES_IO_PREFIX", "runs-here")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    env = resolve_environment(None)
    assert isinstance(env, AWSBatchEnvironment)
    assert env.storage.root_url == "s3://bkt/runs-here"


@pytest.mark.parametrize("bad", [{"job_queue": "q"}, {"io_bucket": "b", "job_definition": "d"},
                                 {"job_queue": "q", "io_bucket": "b"},
                                 {"job_queue": "q", "io_bucket": "b", "job_definition": "d",
                                  "colour": "red"}, 42])
def test_bad_environments_are_configuration_errors(bad):
    with pytest.raises(ConfigurationError):
        BatchExecutor(bad)


def test_bad_local_settings(tmp_path):
    with pytest.raises(ConfigurationError):
        LocalEnvironment(tmp_path, max_vcpus=0)
    with pytest.raises(ConfigurationError):
        LocalEnvironment(tmp_path, metadata_ttl=0)


def test_a_script_with_main_module_functions_and_lambdas(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        from batchfutures import BatchExecutor, LocalEnvironment
        SCALE = 3

        def scaled(x):
            return SCALE * x

        if __name__ == "__main__":
            import sys
            with BatchExecutor(LocalEnvironment(sys.argv[1])) as ex:
                print(list(ex.map(scaled, range(5), chunksize=2)))
                print(ex.submit(lambda: SCALE + 1).result())
    """))
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "work")], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[0, 3, 6, 9, 12]", "4"]
