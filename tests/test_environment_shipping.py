"""requirements= end to end on the embedded default with a bare image: LocalEnvironment(image=)
runs the attempts on a venv's interpreter that has only the worker's own dependencies, so a
library the client has and the image lacks is missing there, as on AWS. Offline: the wheels
are written here and pip reads only them (PIP_NO_INDEX, PIP_FIND_LINKS)."""

from __future__ import annotations

import concurrent.futures
import os
import sys

import boto3
import pytest
from envtools import bare_python, install_here, offline_pip, tiny_wheels
from s3server import emulator_endpoint, emulator_environment, new_bucket

from batchfutures import (
    BatchExecutor,
    ConfigurationError,
    EnvironmentBuildError,
    EnvironmentMismatchError,
    IntegrityError,
    LocalEnvironment,
    envarchive,
    envbuild,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    return bare_python(tmp_path_factory.mktemp("image"))


@pytest.fixture
def tinypkg(tmp_path, monkeypatch):
    """tinypkg 1.0 (which needs tinydep) installed here, in a folder of this process's path."""
    wheels = tmp_path / "wheels"
    tiny_wheels(wheels)
    offline_pip(monkeypatch, wheels)
    install_here(monkeypatch, wheels, tmp_path / "client-site", "tinypkg==1.0")
    for name in ("tinypkg", "tinydep"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    envbuild._prepared.clear()
    envbuild._stored.clear()
    import tinypkg

    return tinypkg


@pytest.fixture
def env(tmp_path, image):
    made = LocalEnvironment(tmp_path / "work", image=image, max_vcpus=2)
    yield made
    made.emulator.close()


def _executor(env, tmp_path, **settings):
    # by reference, as a library in site-packages is: tinypkg's folder is not the client's own code
    return BatchExecutor(env, ship_local_modules=False, echo_output=False,
                         environment={"BATCHFUTURES_ENVIRONMENT_CACHE": str(tmp_path / "cache")},
                         **settings)


def _archives(env):
    return env.storage.list_names(env.storage.url(envarchive.FOLDER))


def _alter_archive(env):
    """Flip one bit of the stored archive's last bytes (its seal no longer checks) and forget
    this process's builds, as another client would; the archive's name."""
    [name] = _archives(env)
    path = env.storage._path(env.storage.url(envarchive.FOLDER, name))
    data = bytearray(open(path, "rb").read())
    data[-10] ^= 1
    os.chmod(path, 0o600)
    with open(path, "wb") as handle:
        handle.write(data)
    envbuild._prepared.clear()
    envbuild._stored.clear()
    return name


def test_image_is_the_interpreter_given(env, image):
    with BatchExecutor(env, echo_output=False) as ex:  # this module travels by value
        assert ex.submit(_executable).result(timeout=120) == image


def _executable():
    return sys.executable


def test_image_definition_named_as_planned(env, image):
    """The definition registered for the image is the one a dry run or the cache names."""
    assert env.job_definition.rpartition("/")[2].partition(":")[0] == env.planned_definition()
    assert env.describe_definition()["containerProperties"]["image"] == image


def test_missing_library_without_requirements(env, tinypkg, tmp_path):
    with _executor(env, tmp_path) as ex:
        future = ex.submit(tinypkg.double, 21)
        with pytest.raises(EnvironmentMismatchError, match="tinypkg"):
            future.result(timeout=120)


@pytest.mark.parametrize("requirements", [["tinypkg==1.0"], "auto"])
def test_requirements_ship_the_library(env, tinypkg, tmp_path, requirements):
    with concurrent.futures.ProcessPoolExecutor(1) as pool:
        expected = pool.submit(tinypkg.double, 21).result(timeout=60)
    with _executor(env, tmp_path, requirements=requirements) as ex:
        assert ex.submit(tinypkg.double, 21).result(timeout=120) == expected == 42
        assert list(ex.map(tinypkg.double, [1, 2, 3], timeout=120)) == [2, 4, 6]
    assert len(_archives(env)) == 1
    envbuild._prepared.clear()  # a later client: the archive is found, not built again
    envbuild._stored.clear()
    with _executor(env, tmp_path).with_settings(requirements=requirements) as ex:
        assert ex.submit(tinypkg.double, 5).result(timeout=120) == 10
    assert len(_archives(env)) == 1


def test_altered_archive_refused_by_the_worker(env, tinypkg, tmp_path):
    with _executor(env, tmp_path, requirements=["tinypkg==1.0"]) as ex:
        assert ex.submit(tinypkg.double, 1).result(timeout=120) == 2
    name = _alter_archive(env)
    # a host that has not unpacked it yet (another cache folder) reads it, and refuses it
    with _executor(env, tmp_path / "other-host", requirements=["tinypkg==1.0"]) as ex:
        with pytest.raises(IntegrityError, match="environment"):
            ex.submit(tinypkg.double, 1).result(timeout=120)
    assert not (tmp_path / "other-host" / "cache" / envarchive.digest_of(name)).exists()


def test_no_wheel_fails_before_any_job(env, tinypkg, tmp_path):
    with _executor(env, tmp_path, requirements=["tinypkg==1.0", "nowheel==1.0"]) as ex:
        future = ex.submit(tinypkg.double, 21)
        with pytest.raises(EnvironmentBuildError, match="nowheel") as caught:
            future.result(timeout=120)
    assert isinstance(caught.value, ConfigurationError)
    assert env.emulator.list_jobs(jobQueue=env.job_queue)["jobSummaryList"] == []
    assert _archives(env) == []
    assert env.storage.list_names(env.storage.url("runs")) == [] or all(
        not env.storage.list_names(env.storage.url("runs", run, "functions"))
        for run in env.storage.list_names(env.storage.url("runs")))


def test_image_must_be_an_interpreter(tmp_path):
    with pytest.raises(ConfigurationError, match="image"):
        LocalEnvironment(tmp_path / "work", image=str(tmp_path / "no-such-python"))


# -- the AWS path: stock boto3 against the emulator's endpoint, the archive in moto's S3 ------------
@pytest.fixture(scope="module")
def aws(tmp_path_factory, s3_endpoint):
    with emulator_endpoint(tmp_path_factory.mktemp("aws-emulator"), max_vcpus=2) as emulator:
        yield emulator


def test_requirements_on_the_aws_path(aws, image, tinypkg, tmp_path):
    bucket = new_bucket()
    # a definition registered from an image: here the bare interpreter (the emulator runs it)
    env = emulator_environment(bucket, job_definition=None, image=image)
    with _executor(env, tmp_path, requirements="auto") as ex:
        assert ex.submit(tinypkg.double, 21).result(timeout=120) == 42
    envbuild._prepared.clear()
    envbuild._stored.clear()
    with _executor(env, tmp_path, requirements="auto") as ex:  # reused: still one archive
        assert ex.submit(tinypkg.double, 4).result(timeout=120) == 8
    listed = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix="batchfutures/envs/")
    keys = [item["Key"] for item in listed.get("Contents", [])]
    assert len(keys) == 1 and envarchive.digest_of(keys[0]) is not None


def test_a_dry_run_records_the_archive_and_shows_a_missing_wheel(tmp_path, tinypkg):
    from batchfutures import DryRunResult

    env = LocalEnvironment(tmp_path / "work")
    with BatchExecutor(env, dry_run=True, requirements=["tinypkg==1.0"]) as ex:
        with pytest.raises(DryRunResult) as caught:
            ex.submit(abs, -1).result(timeout=60)
    recorded = [path for path, _size in caught.value.objects]
    assert any("/envs/" in path and envarchive.digest_of(path) for path in recorded)
    assert not os.path.exists(env.storage._path(env.storage.url(envarchive.FOLDER)))
    with BatchExecutor(env, dry_run=True, requirements=["nowheel==1.0"]) as ex:
        with pytest.raises(EnvironmentBuildError, match="nowheel"):
            ex.submit(abs, -1).result(timeout=60)


def test_auto_is_worked_out_once_per_set_of_modules(tmp_path, tinypkg, monkeypatch):
    import cloudpickle

    env = LocalEnvironment(tmp_path / "work")
    payload = cloudpickle.dumps(tinypkg.double)
    url = envbuild.prepare(env, env.storage, "auto", [payload])
    assert url is not None
    # no longer installed here: a job naming the same modules still gets what was worked out
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "client-site" not in p])
    assert envbuild.prepare(env, env.storage, "auto", [payload]) == url
    envbuild._prepared.clear()  # worked out again: nothing installed to ship now
    assert envbuild.prepare(env, env.storage, "auto", [payload]) is None
