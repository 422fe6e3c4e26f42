"""requirements= on warm workers (keepalive=), on the embedded default with a bare image: the
pool's environment is built once, its pointer goes in the pool's config and each warm worker
puts it first on sys.path before it unpickles anything."""

from __future__ import annotations

import os
import sys

import boto3
import pytest
from envtools import install_here, make_wheel
from s3server import emulator_endpoint, emulator_environment, new_bucket
from test_environment_shipping import _alter_archive, _archives, _executor, env, image, tinypkg  # noqa: F401

from batchfutures import BatchExecutor, EnvironmentBuildError, IntegrityError, envarchive, envbuild

pytestmark = pytest.mark.slow


def _warm(env, tmp_path, **settings):  # noqa: F811
    return _executor(env, tmp_path, keepalive=30, max_workers=1, **settings)


def test_warm_pool_runs_calls_with_its_environment(env, tinypkg, tmp_path):  # noqa: F811
    with _warm(env, tmp_path, requirements=["tinypkg==1.0"]) as ex:
        assert ex.submit(tinypkg.double, 21).result(timeout=120) == 42
        assert list(ex.map(tinypkg.double, [1, 2, 3], timeout=120)) == [2, 4, 6]
        [pool] = ex._session.warm_pools.values()
        assert pool.workers  # the calls ran on warm workers, not as Batch jobs of their own
    assert len(_archives(env)) == 1
    envbuild._prepared.clear()  # another client: the archive is found, not built again
    envbuild._stored.clear()
    with _warm(env, tmp_path, requirements=["tinypkg==1.0"]) as ex:
        assert ex.submit(tinypkg.double, 5).result(timeout=120) == 10
    assert len(_archives(env)) == 1


def test_warm_pool_refuses_an_altered_archive(env, tinypkg, tmp_path):  # noqa: F811
    with _warm(env, tmp_path, requirements=["tinypkg==1.0"]) as ex:
        assert ex.submit(tinypkg.double, 1).result(timeout=120) == 2
    name = _alter_archive(env)
    with _warm(env, tmp_path / "other-host", requirements=["tinypkg==1.0"]) as ex:
        futures = [ex.submit(tinypkg.double, n) for n in range(2)]
        for future in futures:
            with pytest.raises(IntegrityError, match="environment"):
                future.result(timeout=120)
    assert not (tmp_path / "other-host" / "cache" / envarchive.digest_of(name)).exists()


def test_auto_on_a_warm_pool_is_its_first_calls(env, tinypkg, tmp_path, monkeypatch):  # noqa: F811
    wheels = tmp_path / "wheels"  # where the tinypkg fixture's wheels are (pip's find-links)
    make_wheel(wheels, "otherpkg", "2.0", {"otherpkg/__init__.py": "def triple(x):\n"
                                           "    return 3 * x\n"})
    install_here(monkeypatch, wheels, tmp_path / "client-site-2", "otherpkg==2.0")
    monkeypatch.delitem(sys.modules, "otherpkg", raising=False)
    import otherpkg

    with _warm(env, tmp_path, requirements="auto") as ex:
        assert ex.submit(tinypkg.double, 4).result(timeout=120) == 8
        assert ex.submit(tinypkg.double, 5).result(timeout=120) == 10  # covered: runs
        with pytest.raises(EnvironmentBuildError, match=r"otherpkg==2\.0") as caught:
            ex.submit(otherpkg.triple, 1)
        assert "tinypkg==1.0" in str(caught.value)  # the explicit list it suggests
    with _warm(env, tmp_path, requirements=["tinypkg==1.0", "otherpkg==2.0"]) as ex:
        assert ex.submit(otherpkg.triple, 2).result(timeout=120) == 6


def test_a_warm_dry_run_records_the_archive(tmp_path, tinypkg):  # noqa: F811
    from batchfutures import DryRunResult, LocalEnvironment

    local = LocalEnvironment(tmp_path / "work")
    with BatchExecutor(local, dry_run=True, keepalive=30, requirements=["tinypkg==1.0"]) as ex:
        with pytest.raises(DryRunResult) as caught:
            ex.submit(abs, -1).result(timeout=60)
    recorded = [path for path, _size in caught.value.objects]
    assert any("/envs/" in path and envarchive.digest_of(path) for path in recorded)
    assert not os.path.exists(local.storage._path(local.storage.url(envarchive.FOLDER)))
    with BatchExecutor(local, dry_run=True, keepalive=30, requirements=["nowheel==1.0"]) as ex:
        with pytest.raises(EnvironmentBuildError, match="nowheel"):
            ex.submit(abs, -1).result(timeout=60)


@pytest.fixture(scope="module")
def aws(tmp_path_factory, s3_endpoint):
    with emulator_endpoint(tmp_path_factory.mktemp("aws-warm-env"), max_vcpus=2) as emulator:
        yield emulator


def test_warm_pool_environment_on_the_aws_path(aws, image, tinypkg, tmp_path):  # noqa: F811
    """moto's S3 and SQS, the emulator's endpoint: the worker finds the archive the pool's
    config points to under the same bucket prefix."""
    bucket = new_bucket()
    remote = emulator_environment(bucket, job_definition=None, image=image)
    with _warm(remote, tmp_path, requirements="auto") as ex:
        assert ex.submit(tinypkg.double, 21).result(timeout=120) == 42
        assert list(ex.map(tinypkg.double, [1, 2], timeout=120)) == [2, 4]
    listed = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix="batchfutures/envs/")
    assert len(listed.get("Contents", [])) == 1
