"""The fork server: what it preloads (and what it never does), and each attempt's own environment."""

import importlib
import os
import sys

import pytest

from batchfutures import BatchExecutor, LocalEnvironment
from batchfutures.emulator.runtime import forkserver

# Standard-library modules a test process is unlikely to have imported already.
UNUSUAL = ("colorsys", "tabnanny", "netrc", "sched", "graphlib", "zipapp", "plistlib")


def not_yet_imported():
    for name in UNUSUAL:
        if name not in sys.modules:
            return name
    pytest.skip("every candidate module is imported already")


def test_only_standard_library_modules_without_import_side_effects_are_preloadable():
    assert forkserver.preloadable("statistics")
    assert forkserver.preloadable("email.mime.text")
    assert forkserver.preloadable("_statistics")
    for name in ("this", "antigravity", "readline", "tkinter.ttk", "idlelib", "__main__"):
        assert not forkserver.preloadable(name), name
    for name in ("batchfutures", "batchfutures.worker", "pytest", "s3fs", "numpy"):
        assert not forkserver.preloadable(name), name


@pytest.mark.skipif(sys.version_info < (3, 10), reason="sys.stdlib_module_names is 3.10+")
def test_preload_imports_standard_library_modules_only_from_the_library(tmp_path, monkeypatch):
    folders = forkserver._library_folders()
    wanted = not_yet_imported()
    assert forkserver._preload([wanted, "this", "not_a_module_at_all"], folders)
    assert wanted in sys.modules
    assert "this" not in sys.modules  # it prints the Zen of Python when imported
    assert not forkserver._preload([wanted], folders)  # nothing new
    # a module of the client's own folders that shadows a library name is not run in the server
    shadowed = not_yet_imported()
    (tmp_path / f"{shadowed}.py").write_text("raise RuntimeError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert not forkserver._preload([shadowed], folders)
    assert shadowed not in sys.modules


@pytest.mark.skipif(sys.version_info < (3, 10), reason="sys.stdlib_module_names is 3.10+")
def test_an_attempt_reports_the_library_modules_it_imported_in_one_short_line():
    read, write = os.pipe()
    recorder = forkserver.ImportRecorder()
    sys.meta_path.insert(0, recorder)
    try:
        wanted = not_yet_imported()
        importlib.import_module(wanted)
        import json  # already imported: the finders are not asked, nothing is noted

        assert json and "json" not in recorder.names
        sys.meta_path.remove(recorder)
        recorder.names.append("bf_not_a_library_module")  # never reported: not the library's
        forkserver._report_imports(write, recorder)
        line = os.read(read, 65536)
        assert line.endswith(b"\n") and len(line) < 4096
        assert wanted in line.decode().split() and b"bf_not" not in line
        forkserver._report_imports(write, forkserver.ImportRecorder())  # nothing new: nothing written
        os.set_blocking(read, False)
        with pytest.raises(BlockingIOError):
            os.read(read, 10)
    finally:
        if recorder in sys.meta_path:
            sys.meta_path.remove(recorder)
        os.close(read)
        os.close(write)


def environment_of_attempt(name):
    return os.environ.get(name), os.environ.get("AWS_BATCH_JOB_ARRAY_INDEX")


def import_by_name(name):
    importlib.import_module(name)
    return name


def modules_at_start(names):
    return {name: name in sys.modules for name in names}


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info < (3, 10), reason="sys.stdlib_module_names is 3.10+")
def test_attempts_get_the_jobs_environment_and_the_library_modules_attempts_imported(tmp_path,
                                                                                  monkeypatch):
    # the fork server's, not a container's; credential-like, so the executor does not pass it
    # on either (os.environ's changes since start reach the calls, such names excepted)
    monkeypatch.setenv("BF_TEST_CLIENT_ONLY_TOKEN", "client")
    executor = BatchExecutor(LocalEnvironment(tmp_path / "work", max_vcpus=2),
                             environment={"BF_TEST_JOB": "before"})
    try:
        assert list(executor.map(environment_of_attempt, ["BF_TEST_CLIENT_ONLY_TOKEN", "BF_TEST_JOB"])) == [
            (None, "0"), ("before", "1")]
        view = executor.with_settings(environment={"BF_TEST_JOB": "after"})
        assert list(view.map(environment_of_attempt, ["BF_TEST_JOB"] * 2)) == [
            ("after", "0"), ("after", "1")]
        wanted = not_yet_imported()
        [before] = executor.map(modules_at_start, [[wanted]])
        assert before == {wanted: False}  # the client's own imports are not the attempts'
        assert list(executor.map(import_by_name, [wanted])) == [wanted]
        assert wanted not in sys.modules
        # an attempt imported it: the server learned it, and the attempts after it have it
        [seen] = executor.map(modules_at_start, [[wanted, "this", "s3fs"]])
        assert seen == {wanted: True, "this": False, "s3fs": False}  # s3fs: only for s3:// jobs
    finally:
        executor.shutdown()


@pytest.mark.slow
def test_the_server_preloads_every_batchfutures_module_the_worker_imports():
    # an attempt of a file:// job imports nothing of batchfutures itself (~10 ms each time)
    import ast
    import json
    import subprocess

    import batchfutures.worker.main

    tree = ast.parse(open(batchfutures.worker.main.__file__).read())
    wanted = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level in (1, 2):
            package = "batchfutures.worker" if node.level == 1 else "batchfutures"
            names = [node.module] if node.module else [a.name for a in node.names]
            wanted.update(f"{package}.{name}" for name in names)
    # a warm worker (`--warm <pool_url>`) forks from the server too: worker.warm is preloaded
    assert forkserver.is_forkable(["python", "-m", "batchfutures.worker", "--warm", "u"])
    assert "batchfutures.worker.warm" in wanted
    done = subprocess.run(
        [sys.executable, "-c", "import importlib, json, sys\n"
         "from batchfutures.emulator.runtime import forkserver\n"
         "for name in forkserver.WORKER_IMPORTS: importlib.import_module(name)\n"
         "print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True)
    preloaded = set(json.loads(done.stdout))
    assert wanted and not wanted - preloaded
    assert "multiprocessing.connection" in preloaded  # what pool.py imports


def test_the_workers_code_is_compiled_once_and_used_while_its_file_is_unchanged():
    worker = forkserver.WorkerCode()
    worker.refresh()
    compiled, spec = worker.current()
    assert compiled.co_filename == spec.origin and spec.name == forkserver.WORKER_MAIN
    worker.refresh()
    assert worker.current()[0] is compiled  # not compiled again
    worker.stamp = (0, 0)  # as if the file changed since: the child runs it as -m does
    assert worker.current() == (None, None)


PYTHON = sys.executable


@pytest.mark.parametrize("argv, one_attempt, warm", [
    ([PYTHON, "-m", "batchfutures.worker", "file:///w/job"], True, False),
    ([PYTHON, "-m", "batchfutures.worker", "--warm", "file:///w/warm/0"], False, True),
    (["python3", "-m", "batchfutures.worker", "--warm", "s3://b/runs/r/warm/1"], False, True),
    ([PYTHON, "-m", "batchfutures.worker", "--warm"], False, False),  # no pool URL
    ([PYTHON, "-m", "batchfutures.worker", "--cold", "u"], False, False),
    ([PYTHON, "-m", "batchfutures.worker", "--warm", "u", "extra"], False, False),
    ([PYTHON, "-m", "other.module", "--warm", "u"], False, False),
    (["sh", "-m", "batchfutures.worker", "--warm", "u"], False, False),
    (["sh", "-c", "echo hi"], False, False),
])
def test_which_commands_the_fork_server_runs(argv, one_attempt, warm):
    assert forkserver.is_worker_command(argv) is one_attempt  # launcher="threads" runs these
    assert forkserver.is_warm_worker_command(argv) is warm
    assert forkserver.is_forkable(argv) is (one_attempt or warm)


def ancestry(_item):
    """This process's parent's parent (a warm call runs in the worker's runner, whose parent is
    the worker): its pid and command line."""
    def parent_of(pid):
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rpartition(")")[2].split()[1])

    worker = os.getppid()
    grandparent = parent_of(worker)
    with open(f"/proc/{grandparent}/cmdline", "rb") as cmdline:
        command = cmdline.read().split(b"\0")
    with open(f"/proc/{worker}/cmdline", "rb") as cmdline:
        worker_command = cmdline.read().split(b"\0")
    return grandparent, [c.decode() for c in command if c], [c.decode() for c in worker_command if c]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_a_warm_worker_forks_from_the_preloaded_server(tmp_path):
    executor = BatchExecutor(LocalEnvironment(tmp_path / "work", max_vcpus=2), keepalive=30,
                             max_workers=1)
    try:
        [(grandparent, command, worker_command)] = list(executor.map(ancestry, [None]))
    finally:
        executor.shutdown()
    assert grandparent != os.getpid()  # not exec'd by this (the emulator's) process
    assert command[1:] == ["-m", "batchfutures.emulator.runtime.forkserver"]
    # forked, the worker's command line is the server's, not `-m batchfutures.worker --warm`
    assert worker_command == command
