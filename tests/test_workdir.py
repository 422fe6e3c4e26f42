"""CONTRACT 9, the local workdir is the user's alone: made 0700 with files 0600 whatever the
umask; a foreign, group/other-writable or symlinked workdir, folder or key file refused before
anything runs; cleanup and the emulator's sweep never follow a symlink or a path out of their
folder, and cleanup removes only names of the run-id shape. The suite runs as root: "another
user" is uid 65534, set with chown."""

import json
import os
import stat
import time

import pytest

from batchfutures import BatchExecutor, LocalEnvironment, cleanup, signing, workdir
from batchfutures.cleanup import Decision, RunReport
from batchfutures.emulator import BatchEmulator
from batchfutures.errors import ConfigurationError
from batchfutures.storage import Storage

OTHER_UID = 65534
RUN = "20240101T000000-0123456789"


def py(code):
    return ["python", "-S", "-c", code]


def wait_until(predicate, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def square(x):
    return x * x


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture
def no_env_key(monkeypatch):
    monkeypatch.delenv(signing.KEY_VARIABLE, raising=False)
    monkeypatch.delenv(signing.SOURCE_VARIABLE, raising=False)


@pytest.mark.slow
def test_workdir_folders_0700_and_files_0600_under_umask_022(tmp_path, umask_022, no_env_key):
    env = LocalEnvironment(tmp_path / "work", max_vcpus=2)
    try:
        with BatchExecutor(env) as executor:
            assert executor.submit(square, 7).result(timeout=120) == 49
    finally:
        env.emulator.close()
    root = tmp_path / "work"
    assert mode(root) == 0o700
    for name in ("storage", "emulator", "storage/runs", "storage/jobs", "emulator/jobs"):
        assert mode(root / name) == 0o700, name
    assert mode(root / signing.KEY_FILE_NAME) == 0o600
    checked = 0
    for place in (root / "storage", root / "emulator" / "jobs", root / "emulator" / "queues",
                  root / "emulator" / "definitions"):
        for folder, _folders, files in os.walk(place):
            assert mode(folder) == 0o700, folder
            for name in files:
                assert mode(os.path.join(folder, name)) == 0o600, os.path.join(folder, name)
                checked += 1
    assert checked >= 4  # function, inputs, result, job pointer, records...


def test_workdir_helpers_make_private_files_and_folders(tmp_path, umask_022):
    folder = workdir.secure_folder(tmp_path / "a" / "b", "workdir")
    assert mode(tmp_path / "a") == mode(folder) == 0o700
    os.close(workdir.open_private(folder / "f", os.O_WRONLY | os.O_CREAT))
    assert mode(folder / "f") == 0o600
    local = Storage((tmp_path / "s").as_uri())
    local.put_bytes(local.url("runs", RUN, "x", "y"), b"data")
    assert mode(tmp_path / "s" / "runs" / RUN / "x") == 0o700
    assert mode(tmp_path / "s" / "runs" / RUN / "x" / "y") == 0o600
    os.symlink(folder / "f", folder / "link")
    with pytest.raises(OSError):
        workdir.open_private(folder / "link", os.O_RDONLY)


def test_an_existing_readable_workdir_is_narrowed_to_0700(tmp_path, no_env_key):
    root = tmp_path / "work"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    LocalEnvironment(root).secure_workdir()
    assert mode(root) == 0o700


@pytest.mark.parametrize("what", ["", "storage", "emulator", "storage/runs"])
def test_a_folder_of_another_user_is_refused_before_any_job_runs(tmp_path, what, no_env_key):
    root = tmp_path / "work"
    (root / what).mkdir(parents=True, exist_ok=True)
    os.chown(root / what, OTHER_UID, OTHER_UID)
    env = LocalEnvironment(root)
    with pytest.raises(ConfigurationError, match=f"{root / what}.*uid {OTHER_UID}.*Fix: .*chown"):
        BatchExecutor(env).submit(square, 2)
    assert not (root / "emulator" / "jobs").exists() or not os.listdir(root / "emulator" / "jobs")


@pytest.mark.parametrize("bits", [0o020, 0o002])
@pytest.mark.parametrize("what", ["", "storage", "emulator"])
def test_a_group_or_other_writable_folder_is_refused(tmp_path, what, bits, no_env_key):
    root = tmp_path / "work"
    (root / what).mkdir(parents=True, exist_ok=True)
    os.chmod(root / what, 0o700 | bits)
    with pytest.raises(ConfigurationError, match=f"{root / what}.*writable.*chmod 700"):
        _ = LocalEnvironment(root).storage


def test_a_symlinked_storage_folder_is_refused(tmp_path, no_env_key):
    root, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    root.mkdir(mode=0o700)
    elsewhere.mkdir()
    os.symlink(elsewhere, root / "storage")
    with pytest.raises(ConfigurationError, match="symbolic link"):
        _ = LocalEnvironment(root).storage


def test_a_key_file_of_another_user_is_refused_before_any_job_runs(tmp_path, no_env_key):
    root = tmp_path / "work"
    root.mkdir(mode=0o700)
    key = root / signing.KEY_FILE_NAME
    key.write_text("ab" * 32 + "\n")
    os.chmod(key, 0o600)
    os.chown(key, OTHER_UID, OTHER_UID)  # planted: 0600 but someone else's
    env = LocalEnvironment(root)
    with pytest.raises(ConfigurationError, match=f"{key}.*uid {OTHER_UID}"):
        BatchExecutor(env).submit(square, 2)
    with pytest.raises(ConfigurationError, match="uid"):
        signing.read_key_file(key, create=False)


@pytest.mark.parametrize("bits", [0o060, 0o006, 0o020])
def test_a_key_file_open_to_others_is_refused(tmp_path, bits, no_env_key):
    root = tmp_path / "work"
    root.mkdir(mode=0o700)
    key = root / signing.KEY_FILE_NAME
    key.write_text("ab" * 32 + "\n")
    os.chmod(key, 0o600 | bits)
    with pytest.raises(ConfigurationError, match=str(key)):
        _ = LocalEnvironment(root).storage


def test_a_symlinked_key_file_is_refused(tmp_path, no_env_key):
    root = tmp_path / "work"
    root.mkdir(mode=0o700)
    target = tmp_path / "their.key"
    target.write_text("ab" * 32 + "\n")
    os.chmod(target, 0o600)
    os.symlink(target, root / signing.KEY_FILE_NAME)
    with pytest.raises(ConfigurationError, match="symbolic link"):
        _ = LocalEnvironment(root).storage
    with pytest.raises(ConfigurationError, match="symbolic link"):
        _ = signing.local_signer(root).key
    # a dangling link is not followed to create a key elsewhere either
    os.unlink(root / signing.KEY_FILE_NAME)
    os.symlink(tmp_path / "new.key", root / signing.KEY_FILE_NAME)
    with pytest.raises(ConfigurationError):
        _ = signing.local_signer(root).key
    assert not (tmp_path / "new.key").exists()


def removable(run_id):
    return RunReport(run_id, "", 10 * 86400.0, decision=Decision(True, "test"))


def test_cleanup_never_follows_a_symlinked_runs_folder(tmp_path):
    victim = tmp_path / "victim"
    (victim / RUN).mkdir(parents=True)
    (victim / RUN / "precious").write_text("keep")
    root = tmp_path / "storage"
    root.mkdir(mode=0o700)
    os.symlink(victim, root / "runs")  # planted
    local = Storage(root.as_uri())
    assert cleanup.remove(local, [removable(RUN)]) == []
    assert (victim / RUN / "precious").read_text() == "keep"
    # nor a run folder that is itself a link
    os.unlink(root / "runs")
    (root / "runs").mkdir(mode=0o700)
    os.symlink(victim / RUN, root / "runs" / RUN)
    assert cleanup.remove(local, [removable(RUN)]) == []
    assert (victim / RUN / "precious").read_text() == "keep"


def test_cleanup_removes_only_names_of_the_run_id_shape(tmp_path):
    local = Storage((tmp_path / "storage").as_uri())
    names = [RUN, "notes", "2024", "20240101T000000-XYZ", "..", "20240101T000000-0123456789x"]
    for name in names[:4] + names[5:]:
        local.put_bytes(local.url("runs", name, "f"), b"x")
    removed = cleanup.remove(local, [removable(name) for name in names])
    assert removed == [RUN]
    left = sorted(os.listdir(tmp_path / "storage" / "runs"))
    assert left == sorted(n for n in names if n not in (RUN, ".."))
    assert workdir.is_run_id(RUN) and not workdir.is_run_id("../" + RUN)


@pytest.mark.slow
def test_a_record_naming_a_log_stream_outside_the_folder_deletes_nothing_there(tmp_path, caplog):
    folder = tmp_path / "a" / "b" / "emulator"
    target = tmp_path / "a" / "x"  # folder/logs/../../../x
    folder.parent.mkdir(parents=True)
    target.write_text("not the emulator's")
    first = BatchEmulator(folder, max_vcpus=1)
    try:
        job_id = first.submit_job(jobName="j", jobQueue="batchfutures",
                                  jobDefinition="batchfutures-worker",
                                  containerOverrides={"command": py("pass")})["jobId"]
        wait_until(lambda: (first.describe_jobs(jobs=[job_id])["jobs"] or [{}])[0].get("status")
                   in ("SUCCEEDED", "FAILED"), "the job to end")
    finally:
        first.close()
    record = folder / "jobs" / f"{job_id}.json"

    def plant(value):
        if isinstance(value, dict):
            return {k: ("../../../x" if k == "logStreamName" else plant(v)) for k, v in value.items()}
        if isinstance(value, list):
            return [plant(v) for v in value]
        return value
    text = json.dumps(plant(json.loads(record.read_text())))
    assert "../../../x" in text
    record.write_text(text)
    time.sleep(1.2)
    second = BatchEmulator(folder, max_vcpus=1, metadata_ttl=1)  # its sweep forgets the job
    try:
        wait_until(lambda: not record.exists(), "the expired record to be swept")
    finally:
        second.close()
    assert target.read_text() == "not the emulator's"
    assert "'../../../x', not a file under" in caplog.text  # skipped, with a warning


def test_inside():
    assert workdir.inside("/a/b", "/a/b/c")
    assert not workdir.inside("/a/b", "/a/b/../c")
    assert not workdir.inside("/a/b", "/a/b")
    assert not workdir.inside("/a/b", "/a/bc")
