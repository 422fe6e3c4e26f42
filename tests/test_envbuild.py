"""envbuild.py and worker/envs.py: an environment built by pip for the job's platform from local
wheels (no package index), stored once under R/envs/, unpacked by the worker after its seal."""

from __future__ import annotations

import logging
import os
import sys
import threading

import pytest
from envtools import make_wheel, offline_pip, tiny_wheels

from batchfutures import envarchive, envbuild, signing
from batchfutures.errors import ConfigurationError, EnvironmentBuildError, IntegrityError
from batchfutures.storage import Storage
from batchfutures.worker import envs

X86 = envbuild.Target("x86_64", (3, 11), (2, 28))


@pytest.mark.parametrize("machine, glibc, first, count", [
    ("x86_64", (2, 28), "manylinux_2_28_x86_64", 13),
    ("X86_64", (2, 17), "manylinux_2_17_x86_64", 2),
    ("ARM64", (2, 31), "manylinux_2_31_aarch64", 16),
    ("aarch64", (2, 28), "manylinux_2_28_aarch64", 13),
    ("amd64", (2, 36), "manylinux_2_36_x86_64", 21),
])
def test_platform_tags(machine, glibc, first, count):
    tags = envbuild.platform_tags(machine, glibc)
    assert tags[0] == first and len(tags) == count
    assert tags[-1].startswith("manylinux2014_") and tags[-2].startswith("manylinux_2_17_")


@pytest.mark.parametrize("machine, glibc, words", [
    ("s390x", (2, 28), "architecture"),
    ("x86_64", (2, 5), "older than"),
])
def test_platform_refused(machine, glibc, words):
    with pytest.raises(ConfigurationError, match=words):
        envbuild.platform_tags(machine, glibc)


@pytest.mark.parametrize("definition, machine", [
    (None, "x86_64"),
    ({"containerProperties": {"image": "x"}}, "x86_64"),
    ({"containerProperties": {"runtimePlatform": {"cpuArchitecture": "ARM64"}}}, "aarch64"),
    ({"containerProperties": {"runtimePlatform": {"cpuArchitecture": "X86_64",
                                                  "operatingSystemFamily": "LINUX"}}}, "x86_64"),
    ({"type": "multinode", "nodeProperties": {}}, "x86_64"),
])
def test_definition_machine(definition, machine):
    assert envbuild.definition_machine(definition) == machine


def test_pip_options_name_the_target():
    options = envbuild.Target("aarch64", (3, 12), (2, 28)).pip_options()
    assert options[:5] == ["--only-binary=:all:", "--implementation", "cp", "--python-version",
                           "3.12"]
    assert options.count("--platform") == 13 and "manylinux2014_aarch64" in options


@pytest.mark.parametrize("pins, target, same", [
    (["b==1", "a==2"], X86, True),                                  # order does not matter
    (["a==2", "b==1"], envbuild.Target("aarch64", (3, 11), (2, 28)), False),
    (["a==2", "b==1"], envbuild.Target("x86_64", (3, 12), (2, 28)), False),
    (["a==2", "b==1"], envbuild.Target("x86_64", (3, 11), (2, 31)), False),
    (["a==2", "b==1.0.1"], X86, False),
])
def test_environment_digest(pins, target, same):
    base = envbuild.environment_digest(["a==2", "b==1"], X86)
    assert (envbuild.environment_digest(pins, target) == base) == same
    assert len(base) == 64


@pytest.mark.parametrize("stderr, package", [
    ("ERROR: Could not find a version that satisfies the requirement nowheel==1.0 (from "
     "versions: none)\nERROR: No matching distribution found for nowheel==1.0\n", "nowheel==1.0"),
    ("ERROR: No matching distribution found for torch\n", "torch"),
    ("ERROR: Could not find a version that satisfies the requirement numpy>=9 (from versions: "
     "1.26.4)\n", "numpy>=9"),
    ("ERROR: Cannot install a and b because these package versions have conflicting "
     "dependencies.\n", None),
])
def test_missing_wheel(stderr, package):
    assert envbuild.missing_wheel(stderr) == package
    error = envbuild.pip_failure(stderr, X86, "resolve the requirements")
    assert isinstance(error, EnvironmentBuildError) and isinstance(error, ConfigurationError)
    if package is not None:
        assert package in str(error) and "worker image" in str(error) and "wheel" in str(error)


@pytest.mark.slow  # runs pip (or the interpreter) in a subprocess
def test_interpreter_target_is_this_machine():
    target = envbuild.interpreter_target(sys.executable)
    assert target.python == sys.version_info[:2]
    assert target.machine == envbuild.normalize_machine(os.uname().machine)


# -- built with pip from local wheels ------------------------------------------------------------
@pytest.fixture
def wheels(tmp_path, monkeypatch):
    folder = tmp_path / "wheels"
    tiny_wheels(folder)  # nowheel: a wheel for another platform only, nothing for Linux
    make_wheel(folder, "tinypkg", "0.9", {"tinypkg/__init__.py": "OLD = True\n"})
    offline_pip(monkeypatch, folder)
    envbuild._prepared.clear()
    envbuild._stored.clear()
    return folder


@pytest.fixture
def storage(tmp_path):
    root = tmp_path / "storage"
    root.mkdir()
    return Storage(root.as_uri(), signer=signing.Signer(lambda: b"k" * 32, "test"))


class Local:
    """What envbuild asks of a LocalEnvironment: the interpreter its attempts run on."""

    image_python = sys.executable


def _archives(storage):
    return storage.list_names(storage.url(envarchive.FOLDER))


@pytest.mark.slow  # runs pip (or the interpreter) in a subprocess
def test_resolve_a_list_to_exact_versions(wheels):
    target = envbuild.interpreter_target(sys.executable)
    assert envbuild.resolve(("tinypkg",), target) == ["tinydep==0.2", "tinypkg==1.0"]
    assert envbuild.resolve(("tinypkg<1",), target) == ["tinypkg==0.9"]


@pytest.mark.slow  # runs pip (or the interpreter) in a subprocess
def test_resolve_a_requirements_file(wheels, tmp_path):
    path = tmp_path / "requirements.txt"
    path.write_text("# pinned by hand\ntinypkg==1.0\n")
    target = envbuild.interpreter_target(sys.executable)
    assert envbuild.resolve(str(path), target) == ["tinydep==0.2", "tinypkg==1.0"]


@pytest.mark.slow  # runs pip (or the interpreter) in a subprocess
def test_stored_once_then_reused(wheels, storage, caplog):
    caplog.set_level(logging.INFO, logger="batchfutures")
    url = envbuild.prepare(Local(), storage, ("tinypkg==1.0",))
    assert url is not None and envarchive.digest_of(url) is not None
    assert _archives(storage) == [url.rpartition("/")[2]]
    stored = os.stat(storage._path(url))
    envbuild._prepared.clear()  # another client process: nothing remembered
    envbuild._stored.clear()
    caplog.clear()
    assert envbuild.prepare(Local(), storage, ("tinypkg==1.0",)) == url
    assert "reused" in caplog.text and "stored" not in caplog.text
    assert os.stat(storage._path(url)).st_mtime_ns == stored.st_mtime_ns
    assert len(_archives(storage)) == 1


@pytest.mark.slow  # runs pip (or the interpreter) in a subprocess
def test_two_clients_store_one(wheels, storage):
    target = envbuild.interpreter_target(sys.executable)
    pins = envbuild.resolve(("tinypkg==1.0",), target)
    digest = envbuild.environment_digest(pins, target)
    urls = []
    threads = [threading.Thread(target=lambda: urls.append(
        envbuild.store(storage, pins, target, digest))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(urls)) == 1 and len(_archives(storage)) == 1


@pytest.mark.slow  # runs pip (or the interpreter) in a subprocess
def test_no_wheel_for_the_platform_fails_before_any_upload(wheels, storage):
    with pytest.raises(EnvironmentBuildError, match="no wheel of nowheel") as caught:
        envbuild.prepare(Local(), storage, ("tinypkg==1.0", "nowheel==1.0"))
    assert "worker image" in str(caught.value)
    assert _archives(storage) == []


@pytest.mark.slow  # runs pip (or the interpreter) in a subprocess
def test_nothing_to_ship_is_no_pointer(wheels, storage):
    assert envbuild.prepare(Local(), storage, ()) is None


# -- the worker's side -----------------------------------------------------------------------------
@pytest.fixture
def fresh_path(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("tinypkg", "tinydep"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def _environ(url, cache):
    return {envarchive.POINTER_VARIABLE: url, envs.CACHE_VARIABLE: str(cache)}


@pytest.mark.slow  # runs pip (or the interpreter) in a subprocess
def test_worker_unpacks_then_reuses(wheels, storage, tmp_path, fresh_path, caplog):
    caplog.set_level(logging.INFO, logger="batchfutures")
    url = envbuild.prepare(Local(), storage, ("tinypkg==1.0",))
    cache = tmp_path / "cache"
    folder = envs.activate(storage, _environ(url, cache))
    assert folder == str(cache / envarchive.digest_of(url)) and sys.path[0] == folder
    import tinypkg

    assert tinypkg.double(21) == 42
    assert "unpacked" in caplog.text
    caplog.clear()
    os.remove(storage._path(url))  # the next job on this host does not read it again
    assert envs.activate(storage, _environ(url, cache)) == folder
    assert "reusing" in caplog.text and sys.path.count(folder) == 1
    assert os.stat(cache).st_mode & 0o777 == 0o700


def test_no_pointer_nothing_done(storage, fresh_path):
    before = list(sys.path)
    assert envs.activate(storage, {}) is None and sys.path == before


def _store_raw(storage, url, payload, *, name=None, key=None):
    signer = signing.Signer(lambda: key, "other") if key else storage.signer
    sealed = signer.seal(envarchive.SEAL_KIND, name or storage.name_of(url), payload,
                         root=storage.mac_root)
    storage.put_bytes(url, sealed)


@pytest.mark.parametrize("how", ["other key", "other name", "altered", "unsigned"])
def test_seal_checked_before_anything_is_unpacked(storage, tmp_path, fresh_path, how):
    source = tmp_path / "site"
    (source / "tinypkg").mkdir(parents=True)
    (source / "tinypkg" / "__init__.py").write_text("EVIL = True\n")
    payload = envarchive.pack(source)
    url = storage.url(envarchive.FOLDER, envarchive.archive_name("ab" * 32))
    if how == "other key":
        _store_raw(storage, url, payload, key=b"o" * 32)
    elif how == "other name":
        _store_raw(storage, url, payload, name=f"{envarchive.FOLDER}/{'cd' * 32}.zip")
    elif how == "altered":
        _store_raw(storage, url, payload)
        data = bytearray(open(storage._path(url), "rb").read())
        data[-30] ^= 1
        storage.put_bytes(url, bytes(data))
    else:
        storage.put_bytes(url, payload)
    cache = tmp_path / "cache"
    with pytest.raises(IntegrityError):
        envs.activate(storage, _environ(url, cache))
    assert os.listdir(cache) == []  # nothing unpacked, not even half


def test_hostile_archive_refused_whole(storage, tmp_path, fresh_path):
    import io
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("ok/__init__.py", "")
        archive.writestr("../../escape.py", "EVIL = True\n")
    url = storage.url(envarchive.FOLDER, envarchive.archive_name("ef" * 32))
    _store_raw(storage, url, out.getvalue())  # signed: only the member checks stand in the way
    cache = tmp_path / "cache"
    with pytest.raises(IntegrityError, match="leaves the folder"):
        envs.activate(storage, _environ(url, cache))
    assert os.listdir(cache) == [] and not (tmp_path / "escape.py").exists()


def _short_sized_archive():
    import io
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("ok/__init__.py", "VALUE = 1\n" * 100)
        archive.filelist[0].file_size = 10  # the directory declares less than the member holds
    return out.getvalue()


def _duplicate_member_archive():
    import io
    import warnings
    import zipfile

    out = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name: wanted here
        with zipfile.ZipFile(out, "w") as archive:
            archive.writestr("ok/__init__.py", "VALUE = 1\n")
            archive.writestr("ok/__init__.py", "VALUE = 2\n")
    return out.getvalue()


@pytest.mark.parametrize("payload, words", [
    (_short_sized_archive, "Bad CRC"),
    (_duplicate_member_archive, "File exists"),
])
def test_signed_but_broken_archive_is_an_integrity_error(storage, tmp_path, fresh_path,
                                                          payload, words):
    url = storage.url(envarchive.FOLDER, envarchive.archive_name("12" * 32))
    _store_raw(storage, url, payload())
    cache = tmp_path / "cache"
    with pytest.raises(IntegrityError, match=words):
        envs.activate(storage, _environ(url, cache))
    assert os.listdir(cache) == []  # the half-unpacked folder is removed


@pytest.mark.parametrize("url", [
    "file:///elsewhere/envs/" + "ab" * 32 + ".zip",
    "{root}/runs/" + "ab" * 32 + ".zip",
    "{root}/envs/not-a-digest.zip",
])
def test_pointer_outside_the_storage_refused(storage, tmp_path, url):
    with pytest.raises(IntegrityError, match="not an environment archive"):
        envs.activate(storage, _environ(url.format(root=storage.root_url), tmp_path / "c"))
