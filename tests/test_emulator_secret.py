"""Issue 29, point 2: the emulator endpoint's secret is never in argv nor on stdout. It comes
from BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY, from --secret-access-key-file (a 0600 file whose
owner is checked), or is made at start and written only to the 0600 endpoint.json; a secret in
argv is refused with a message that says how to pass it; off the loopback a secret shorter than
20 characters is refused. "Another local user" is uid 65534 (tests/other_user.py)."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from other_user import OTHER_UID, as_other_user, shared_folder

from batchfutures.emulator import BatchEmulator
from batchfutures.emulator.__main__ import main, write_endpoint_file
from batchfutures.emulator.auth import check_secret_strength
from batchfutures.emulator.server import EmulatorServer
from batchfutures.errors import ConfigurationError

REPO = Path(__file__).resolve().parents[1]
SECRET = "Zq8-very-long-random-secret-Xv3pL9"
VARIABLES = ("BATCHFUTURES_EMULATOR_ACCESS_KEY_ID", "BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY")


@pytest.fixture(autouse=True)
def no_emulator_variables(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def shared_tmp():
    with shared_folder() as folder:
        yield folder


@pytest.mark.parametrize("flags", [
    ["--secret-access-key", SECRET],
    [f"--secret-access-key={SECRET}"],
    ["--secret-access-key"],
])
def test_a_secret_in_argv_is_refused_with_how_to_pass_it(tmp_path, capsys, flags):
    assert main(["--folder", str(tmp_path / "e"), "--access-key-id", "AKIDARGV", *flags]) == 2
    captured = capsys.readouterr()
    assert "refusing --secret-access-key" in captured.err
    assert "BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY" in captured.err
    assert "--secret-access-key-file" in captured.err
    assert SECRET not in captured.err + captured.out  # not echoed either
    assert not (tmp_path / "e").exists()  # refused before anything was made


def private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize("attack", ["other_owner", "group_readable", "world_writable", "symlink",
                                    "fifo", "oversized", "empty"])
def test_a_secret_file_it_cannot_trust_is_refused(tmp_path, capsys, attack):
    path = tmp_path / "secret"
    if attack == "other_owner":  # another user's file: she knows (or chooses) the secret
        private_file(path, SECRET)
        os.chown(path, OTHER_UID, OTHER_UID)
    elif attack == "group_readable":
        private_file(path, SECRET, 0o640)
    elif attack == "world_writable":
        private_file(path, SECRET, 0o666)
    elif attack == "symlink":
        private_file(tmp_path / "real", SECRET)
        path.symlink_to(tmp_path / "real")
    elif attack == "fifo":  # would block a plain open() forever
        os.mkfifo(path, 0o600)
    elif attack == "oversized":
        private_file(path, "x" * 5000)
    else:
        private_file(path, "\n")
    code = main(["--folder", str(tmp_path / "e"), "--access-key-id", "AKIDFILE",
                 "--secret-access-key-file", str(path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "batchfutures emulator:" in err and SECRET not in err
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("secret, host, refused", [
    ("short", "127.0.0.1", False),          # the loopback: only this machine's users, who are
    ("short", "::1", False),                # refused by the endpoint file's mode
    ("short", "0.0.0.0", True),
    ("a" * 40, "192.0.2.1", True),          # long but 1 distinct character
    ("nineteen-characters", "0.0.0.0", True),
    ("twenty-characters-ok", "0.0.0.0", False),
    (SECRET, "::", False),
])
def test_off_the_loopback_a_secret_must_have_20_characters(secret, host, refused):
    if refused:
        with pytest.raises(ValueError, match="at least 20 random characters"):
            check_secret_strength(secret, host)
    else:
        check_secret_strength(secret, host)


def test_the_server_and_the_module_refuse_a_weak_secret_off_the_loopback(tmp_path, capsys,
                                                                           monkeypatch):
    emulator = BatchEmulator(tmp_path / "e", max_vcpus=1)
    try:
        with pytest.raises(ValueError, match="not a loopback address"):
            EmulatorServer(emulator, host="0.0.0.0", access_key_id="AKID", secret_access_key="x")
    finally:
        emulator.close()
    monkeypatch.setenv("BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY", "weak-secret")
    assert main(["--host", "0.0.0.0", "--folder", str(tmp_path / "f"),
                 "--access-key-id", "AKID"]) == 2
    assert "at least 20 random characters" in capsys.readouterr().err
    assert not (tmp_path / "f").exists()


def test_the_endpoint_file_never_follows_a_planted_link(tmp_path):
    folder = tmp_path / "e"
    folder.mkdir(mode=0o700)
    victim = private_file(tmp_path / "victim.txt", "keep", 0o644)
    (folder / "endpoint.json").symlink_to(victim)  # planted before the start
    path = write_endpoint_file(folder, "http://127.0.0.1:1", "AKID", SECRET)
    assert victim.read_text() == "keep"
    info = os.lstat(path)
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert json.loads(path.read_text())["aws_secret_access_key"] == SECRET
    assert sorted(os.listdir(folder)) == ["endpoint.json"]  # nothing left aside


def test_the_endpoint_file_is_not_written_into_another_users_folder(tmp_path):
    folder = tmp_path / "e"
    folder.mkdir(mode=0o700)
    os.chown(folder, OTHER_UID, OTHER_UID)
    with pytest.raises(ConfigurationError, match="owned by uid 65534"):
        write_endpoint_file(folder, "http://127.0.0.1:1", "AKID", SECRET)
    assert os.listdir(folder) == []


def start(folder, *flags, env=None):
    path = [str(REPO), os.environ.get("PYTHONPATH")]
    variables = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    variables.update(env or {}, PYTHONPATH=os.pathsep.join(p for p in path if p))
    return subprocess.Popen([sys.executable, "-m", "batchfutures.emulator", "--folder", str(folder),
                             "--max-vcpus", "1", *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=variables)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["variable", "file", "made"])
def test_another_local_user_cannot_learn_the_secret(shared_tmp, how):
    """As the issue's attacker: another user reads the server's /proc/<pid>/cmdline, its
    environment, its stdout and its folder, and finds the secret nowhere she can read."""
    folder = shared_tmp / "batch"
    secret_file = private_file(shared_tmp / "secret", SECRET)
    flags = {"variable": ["--access-key-id", "AKIDVAR"],
             "file": ["--access-key-id", "AKIDFILE", "--secret-access-key-file", str(secret_file)],
             "made": []}[how]
    env = {"BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY": SECRET} if how == "variable" else {}
    process = start(folder, *flags, env=env)
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url or process.stderr.read()
        found = json.loads((folder / "endpoint.json").read_text())
        secret = found["aws_secret_access_key"]
        if how != "made":
            assert secret == SECRET
        batch = boto3.client("batch", endpoint_url=url, region_name="us-east-1",
                             aws_access_key_id=found["aws_access_key_id"],
                             aws_secret_access_key=secret)
        assert batch.describe_job_queues()["jobQueues"]
        cmdline = as_other_user(f"tr '\\0' ' ' < /proc/{process.pid}/cmdline")
        assert cmdline.returncode == 0 and "batchfutures.emulator" in cmdline.stdout
        assert secret not in cmdline.stdout
        for readable_only_by_its_user in (f"/proc/{process.pid}/environ", f"{folder}/endpoint.json",
                                          str(secret_file)):
            attempt = as_other_user(f"cat {readable_only_by_its_user}")
            assert attempt.returncode != 0 and secret not in attempt.stdout
            assert "Permission denied" in attempt.stderr
    finally:
        process.terminate()
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert out == "" and secret not in err  # the URL was stdout's only line
    assert "endpoint.json" in err and "never printed" in err  # where the pair is, on stderr
