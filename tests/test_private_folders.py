"""Issue 29, point 1: every folder batchfutures makes or uses, the emulator server's included,
goes through one check (workdir.secure_folder): owned by the user, not writable by group or
others, not a symlink, made 0700 whatever the umask; files 0600; attempts start with umask 077;
the start-up sweep removes only what it can prove it made.

The suite runs as root: "another user" is uid 65534 (nobody), either owning a folder the test
chowns to it or running a command the test starts with that uid."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from other_user import OTHER_UID, as_other_user, shared_folder

from batchfutures import LocalEnvironment, workdir
from batchfutures.cli.app import main as cli_main
from batchfutures.emulator import BatchEmulator
from batchfutures.emulator.runtime.container import Scratch
from batchfutures.errors import ConfigurationError

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS / "emulator"))
from emulator_harness import Harness, py  # noqa: E402


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def shared_tmp():
    with shared_folder() as folder:
        yield folder


@pytest.fixture
def umask_000():
    old = os.umask(0)
    yield
    os.umask(old)


@pytest.mark.slow
def test_other_user_can_act_here(shared_tmp):
    """The premise of the tests below: uid 65534 really writes where the mode lets it."""
    open_folder = shared_tmp / "open"
    open_folder.mkdir()
    os.chmod(open_folder, 0o777)
    done = as_other_user(f"touch {open_folder}/x")
    assert done.returncode == 0, done.stderr
    assert os.stat(open_folder / "x").st_uid == OTHER_UID


# -- the server's folder ---------------------------------------------------------------------
@pytest.mark.slow
def test_emulator_folder_made_0700_under_umask_000_and_other_user_cannot_plant(shared_tmp,
                                                                                umask_000):
    folder = shared_tmp / "batch"  # the docs' `/tmp/batch`
    emulator = BatchEmulator(folder, max_vcpus=1)
    try:
        for path in (folder, folder / "logs", folder / "scratch", folder / "definitions"):
            if path.exists():
                assert mode(path) == 0o700, path
        assert mode(folder) == 0o700 and mode(folder / "logs") == 0o700
        assert mode(folder / "scratch") == 0o700
        # the attack of the issue: another user swaps in a job definition
        done = as_other_user(f"mkdir -p {folder}/definitions && echo evil > {folder}/definitions/x")
        assert done.returncode != 0
        assert "Permission denied" in done.stderr
        assert not (folder / "definitions" / "x").exists()
    finally:
        emulator.close()


@pytest.mark.parametrize("attack", ["other_owner", "group_writable", "symlink"])
def test_emulator_refuses_a_folder_it_cannot_trust(shared_tmp, attack):
    folder = shared_tmp / "batch"
    if attack == "symlink":
        real = shared_tmp / "real"
        real.mkdir(mode=0o700)
        folder.symlink_to(real)
    else:
        folder.mkdir(mode=0o700)
        if attack == "other_owner":  # the folder another user made first
            os.chown(folder, OTHER_UID, OTHER_UID)
        else:
            os.chmod(folder, 0o777)
    with pytest.raises(ConfigurationError, match="refusing the batchfutures emulator folder"):
        BatchEmulator(folder, max_vcpus=1)
    with pytest.raises(ConfigurationError):
        BatchEmulator.shared(folder, max_vcpus=1)


@pytest.mark.slow
def test_emulator_refuses_another_users_folder_made_by_that_user(shared_tmp):
    """As it happens: another user makes /tmp/.../batch before the victim starts."""
    folder = shared_tmp / "batch"
    done = as_other_user(f"mkdir -m 777 {folder}")
    assert done.returncode == 0, done.stderr
    with pytest.raises(ConfigurationError, match="owned by uid 65534"):
        BatchEmulator(folder, max_vcpus=1)


@pytest.mark.parametrize("below", ["logs", "scratch"])
def test_emulator_refuses_a_symlinked_logs_or_scratch(tmp_path, below):
    folder = tmp_path / "emulator"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep")
    (victim / "123-456").mkdir()  # a `<digits>-*` entry the scratch sweep would have taken
    os.symlink(victim, folder / below)
    with pytest.raises(ConfigurationError, match="symbolic link"):
        BatchEmulator(folder, max_vcpus=1)
    assert (victim / "precious.txt").read_text() == "keep"
    assert (victim / "123-456").is_dir()


@pytest.mark.slow
def test_server_command_refuses_another_users_folder(shared_tmp):
    folder = shared_tmp / "batch"
    folder.mkdir(mode=0o700)
    os.chown(folder, OTHER_UID, OTHER_UID)
    done = subprocess.run([sys.executable, "-m", "batchfutures.emulator", "--folder", str(folder)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "owned by uid 65534" in done.stderr
    assert done.stdout == ""


# -- the start-up sweep ----------------------------------------------------------------------
def test_scratch_sweep_never_follows_a_symlinked_scratch(tmp_path):
    victim = tmp_path / "documents"
    (victim / "123-456").mkdir(parents=True)
    (victim / "123-456" / "thesis.tex").write_text("keep")
    folder = tmp_path / "emulator"
    folder.mkdir(mode=0o700)
    os.symlink(victim, folder / "scratch")
    Scratch(folder, [os.getpid(), "1"]).sweep(lambda owner: False)  # every owner "dead"
    assert (victim / "123-456" / "thesis.tex").read_text() == "keep"


def test_scratch_sweep_removes_only_its_own_shapes_and_folders(tmp_path):
    folder = tmp_path / "emulator"
    scratch = folder / "scratch"
    scratch.mkdir(parents=True, mode=0o700)
    os.chmod(folder, 0o700)
    for name in ("123-456", "124-None", "125-456x", "notes", "126-789"):
        (scratch / name).mkdir()
    os.chown(scratch / "126-789", OTHER_UID, OTHER_UID)  # not made by this user
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    os.symlink(outside, scratch / "127-1")  # a link of the owner shape
    Scratch(folder, [os.getpid(), "1"]).sweep(lambda owner: False)
    assert sorted(os.listdir(scratch)) == ["125-456x", "126-789", "127-1", "notes"]
    assert (outside / "keep").read_text() == "keep"


@pytest.mark.parametrize("base, path, expected", [
    ("logs", "logs/a.txt", True),
    ("logs_link", "logs_link/precious.txt", False),  # the issue: the link's own realpath
    ("logs", "logs/sub_link/precious.txt", False),
    ("logs", "logs/../victim/precious.txt", False),
])
def test_inside_takes_the_folder_where_it_is(tmp_path, base, path, expected):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.txt").write_text("")
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "precious.txt").write_text("keep")
    os.symlink(tmp_path / "victim", tmp_path / "logs_link")
    os.symlink(tmp_path / "victim", tmp_path / "logs" / "sub_link")
    assert workdir.inside(tmp_path / base, tmp_path / path) is expected


def test_make_private_dirs_refuses_a_link_planted_below_its_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", root / "owner")
    with pytest.raises(ConfigurationError, match="symbolic link"):
        workdir.make_private_dirs(root / "owner" / "task", root=root)
    assert os.listdir(tmp_path / "elsewhere") == []


# -- the LocalEnvironment path, --create, and attempts -----------------------------------------
def test_local_environment_logs_and_scratch_0700_under_umask_022(tmp_path):
    old = os.umask(0o022)
    try:
        env = LocalEnvironment(tmp_path / "work", max_vcpus=1)
        try:
            env.emulator  # noqa: B018 (starting it makes its folders)
        finally:
            env.emulator.close()
    finally:
        os.umask(old)
    for name in ("emulator", "emulator/logs", "emulator/scratch"):
        assert mode(tmp_path / "work" / name) == 0o700, name


def test_cli_create_makes_the_workdir_0700_under_umask_022(tmp_path, capsys):
    target = tmp_path / "new" / "work"
    old = os.umask(0o022)
    try:
        code = cli_main(["--workdir", str(target), "--create", "jobs"])
    finally:
        os.umask(old)
    assert code == 0, capsys.readouterr()
    assert mode(target) == 0o700 and mode(target.parent) == 0o700


@pytest.mark.slow
def test_attempts_write_with_umask_077(tmp_path, umask_000):
    """What a job writes in its working folder is its user's alone, even under umask 000."""
    emulator = BatchEmulator(tmp_path / "emulator", max_vcpus=1)
    try:
        harness = Harness(emulator)
        code = ("import os; open('f', 'w').close(); os.mkdir('d'); "
                "print(oct(os.stat('f').st_mode & 0o777), oct(os.stat('d').st_mode & 0o777))")
        detail = harness.run(py(code))
        assert detail["status"] == "SUCCEEDED", detail
        assert harness.log_lines(detail) == ["0o600 0o700"]
        stream = detail["attempts"][-1]["container"]["logStreamName"]
        log = tmp_path / "emulator" / "logs" / stream
        assert mode(log) == 0o600
        assert mode(log.parent) == 0o700 and mode(log.parent.parent) == 0o700
    finally:
        emulator.close()
