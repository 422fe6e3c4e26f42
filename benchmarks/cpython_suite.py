"""Run CPython's own concurrent.futures tests against BatchExecutor (docs/errors.md says which).

    python benchmarks/cpython_suite.py PATH [-k SUBSTRING] [--timeout S] [--list]

PATH is a CPython checkout (or a git mirror of one, read with ``git show``): the runner takes
``Lib/test/test_concurrent_futures/`` (the package of 3.12+) or ``Lib/test/test_concurrent_futures.py``
(the single module of 3.11 and older) from it. Nothing of CPython is kept in this repository: the
files are copied at run time into a temporary folder, next to a few stand-ins for the
``test.support`` helpers they import (this interpreter may have no ``test`` package), and removed
afterwards.

For each executor mixin CPython's suite defines (ExecutorTest / ProcessPoolExecutorTest,
InitializerMixin, FailingInitializerMixin, ExecutorShutdownTest / ProcessPoolShutdownTest,
WaitTests, AsCompletedTests), a test case class is made the way CPython's
``create_executor_tests`` makes them, with ``BatchExecutor`` on a ``LocalEnvironment`` in a
temporary workdir as the executor type (``LocalBatchExecutor`` below: ProcessPoolExecutor's
signature, ``max_workers`` first). The scripts CPython runs in a child interpreter
(test_interpreter_shutdown, test_hang_gh83386) do ``from concurrent.futures import
LocalBatchExecutor``; a ``sitecustomize`` in the temporary folder provides that name there.
Each test runs on its own; the table at the end gives its outcome and, when it did not pass,
the reason. See docs/errors.md, "CPython's concurrent.futures tests".
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
import unittest
from pathlib import Path

PACKAGE = "Lib/test/test_concurrent_futures"
SINGLE = "Lib/test/test_concurrent_futures.py"

# The mixins to run, in the order of the table. A later name that subclasses an earlier one
# replaces it (ProcessPoolExecutorTest holds ExecutorTest's tests, ProcessPoolShutdownTest
# ExecutorShutdownTest's).
MIXINS = [
    ("ExecutorTest", "ProcessPoolExecutorTest"),
    ("InitializerMixin",),
    ("FailingInitializerMixin",),
    ("ExecutorShutdownTest", "ProcessPoolShutdownTest"),
    ("WaitTests",),
    ("AsCompletedTests",),
]

# --- stand-ins for the test.support helpers the suite imports ------------------------------
SUPPORT = '''\
"""Stand-ins for the parts of CPython's test.support that test_concurrent_futures uses."""
import contextlib
import gc
import io
import os
import sys
import time
import unittest

verbose = False
SHORT_TIMEOUT = 30.0
LONG_TIMEOUT = 300.0
Py_GIL_DISABLED = False


def _identity(obj):
    return obj


def import_module(name, *args, **kwargs):
    import importlib
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise unittest.SkipTest(str(exc))


def requires_resource(resource):
    return _identity          # every resource is enabled outside regrtest, as in CPython


cpython_only = _identity
force_not_colorized = _identity


def requires_gil_enabled(msg=""):
    return _identity


def check_sanitizer(**kwargs):
    return False


def gc_collect():
    for _ in range(3):
        gc.collect()


def reap_children():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except OSError:
            return
        if not pid:
            return


@contextlib.contextmanager
def captured_output(name):
    orig = getattr(sys, name)
    setattr(sys, name, io.StringIO())
    try:
        yield getattr(sys, name)
    finally:
        setattr(sys, name, orig)


def captured_stderr():
    return captured_output("stderr")


def captured_stdout():
    return captured_output("stdout")


@contextlib.contextmanager
def swap_attr(obj, attr, new_val):
    missing = not hasattr(obj, attr)
    old = getattr(obj, attr, None)
    setattr(obj, attr, new_val)
    try:
        yield old
    finally:
        if missing:
            delattr(obj, attr)
        else:
            setattr(obj, attr, old)


def setswitchinterval(interval):
    sys.setswitchinterval(interval)


def sleeping_retry(timeout, err_msg=None, /, *, init_delay=0.010, max_delay=1.0, error=True):
    deadline = time.monotonic() + timeout
    delay = init_delay
    while True:
        yield
        if time.monotonic() >= deadline:
            if error:
                raise AssertionError(f"timeout ({timeout:.1f} seconds): {err_msg or ''}")
            break
        time.sleep(delay)
        delay = min(delay * 2, max_delay)


def load_package_tests(pkg_dir, loader, standard_tests, pattern):
    return standard_tests
'''

THREADING_HELPER = '''\
import threading
import time


def threading_setup():
    return (threading.active_count(),)


def threading_cleanup(*original):
    # CPython marks the test run "env changed" for threads left over; it does not fail.
    deadline = time.monotonic() + 1.0
    while threading.active_count() > original[0] and time.monotonic() < deadline:
        time.sleep(0.01)


def join_thread(thread, timeout=None):
    thread.join(30.0 if timeout is None else timeout)
    if thread.is_alive():
        raise AssertionError(f"failed to join the thread in {timeout} seconds")


def requires_working_threading(*, module=False):
    return lambda obj: obj
'''

WARNINGS_HELPER = '''\
def ignore_fork_in_thread_deprecation_warnings():
    return lambda obj: obj
'''

HASHLIB_HELPER = '''\
def requires_hashdigest(digestname, openssl=None, usedforsecurity=True):
    return lambda obj: obj
'''

IMPORT_HELPER = '''\
from test.support import import_module  # noqa: F401
'''

# assert_python_ok as CPython's script_helper has it, with one difference: CPython runs the
# child isolated (-I), which finds the `test` package in the stdlib. Here that package is in
# the temporary folder, so the child runs with it on PYTHONPATH instead (and no -I).
SCRIPT_HELPER = '''\
import collections
import os
import subprocess
import sys

_PythonRunResult = collections.namedtuple("_PythonRunResult", ("rc", "out", "err"))


def run_python_until_end(*args, **env_vars):
    env = os.environ.copy()
    env.update(env_vars)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.environ["BATCHFUTURES_CPYTHON_SUITE"], env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-X", "faulthandler", *args]
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env, timeout=300)
    return _PythonRunResult(proc.returncode, proc.stdout, proc.stderr), cmd


def assert_python_ok(*args, **env_vars):
    res, cmd = run_python_until_end(*args, **env_vars)
    if res.rc:
        raise AssertionError(
            f"Process return code is {res.rc}\\ncommand: {cmd!r}\\n"
            f"stdout: {res.out.decode(errors='replace')}\\n"
            f"stderr: {res.err.decode(errors='replace')}")
    return res


def assert_python_failure(*args, **env_vars):
    res, cmd = run_python_until_end(*args, **env_vars)
    if not res.rc:
        raise AssertionError(f"Process return code is 0\\ncommand: {cmd!r}")
    return res
'''

IMPORTLIB_FIXTURES = '''\
import functools


def parameterize(*args_set):
    """Run the decorated test once per keyword set (CPython's test_importlib helper)."""
    def wrapper(func):
        @functools.wraps(func)
        def _inner(self):
            for args in args_set:
                with self.subTest(**args):
                    func(self, **args)
        return _inner
    return wrapper
'''

# The executor type the tests get, importable in child interpreters as
# concurrent.futures.LocalBatchExecutor (sitecustomize below).
BATCH_MODULE = '''\
"""BatchExecutor on a LocalEnvironment, with ProcessPoolExecutor's signature."""
import os
import tempfile
import concurrent.futures
import concurrent.futures.process

from batchfutures import BatchExecutor, LocalEnvironment


def _workdir():
    path = os.environ.get("BATCHFUTURES_CPYTHON_WORKDIR")
    if not path:
        path = tempfile.mkdtemp(prefix="bf-cpython-")
        os.environ["BATCHFUTURES_CPYTHON_WORKDIR"] = path
    return path


class LocalBatchExecutor(BatchExecutor):
    def __init__(self, max_workers=None, mp_context=None, initializer=None, initargs=(), *,
                 max_tasks_per_child=None):
        # max_vcpus: let max_workers bound the calls running at once, as a process pool's
        # size does whatever the CPU count (the emulator's default is the CPU count)
        super().__init__(LocalEnvironment(_workdir(), max_vcpus=16), max_workers, mp_context,
                         initializer, initargs, max_tasks_per_child=max_tasks_per_child)


# Names CPython's suite of a newer Python reads at import time, absent from older ones: a
# placeholder lets the module import (the tests that use them then fail or skip on their own).
if "InterpreterPoolExecutor" not in dir(concurrent.futures):
    try:
        concurrent.futures.InterpreterPoolExecutor
    except AttributeError:
        class InterpreterPoolExecutor:  # placeholder, never run
            pass
        concurrent.futures.InterpreterPoolExecutor = InterpreterPoolExecutor
for _name in ("terminate_workers", "kill_workers"):
    if not hasattr(concurrent.futures.ProcessPoolExecutor, _name):
        def _missing(self, _name=_name):
            raise NotImplementedError(f"ProcessPoolExecutor.{_name} (Python 3.14)")
        _missing.__name__ = _name
        setattr(concurrent.futures.ProcessPoolExecutor, _name, _missing)

concurrent.futures.LocalBatchExecutor = LocalBatchExecutor
'''

SITECUSTOMIZE = '''\
import os
if os.environ.get("BATCHFUTURES_CPYTHON_SUITE"):
    import _cpython_batch  # noqa: F401  (concurrent.futures.LocalBatchExecutor)
'''


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def copy_sources(source: Path, dest: Path) -> str:
    """Copy CPython's test_concurrent_futures from ``source`` into ``dest/test``; say from where."""
    target = dest / "test"
    if source.name == "test_concurrent_futures" and source.is_dir():
        source = source.parent.parent.parent  # given Lib/test/test_concurrent_futures itself
    if (source / PACKAGE).is_dir():
        shutil.copytree(source / PACKAGE, target / "test_concurrent_futures",
                        ignore=shutil.ignore_patterns("__pycache__"))
        return str(source / PACKAGE)
    if (source / SINGLE).is_file():
        shutil.copy(source / SINGLE, target / "test_concurrent_futures.py")
        return str(source / SINGLE)
    gitdir = source / ".git" if (source / ".git").exists() else source
    if not (gitdir / "HEAD").exists():
        raise SystemExit(f"{source}: no {PACKAGE}/ nor {SINGLE} there, and no git directory")
    git = ["git", f"--git-dir={gitdir}"]
    listing = subprocess.run([*git, "ls-tree", "-r", "--name-only", "HEAD", "Lib/test/"],
                             capture_output=True, text=True, check=True).stdout.split()
    names = [n for n in listing if n == SINGLE or n.startswith(PACKAGE + "/")]
    if not names:
        raise SystemExit(f"{gitdir}: HEAD has no {PACKAGE}/ nor {SINGLE}")
    for name in names:  # a mirror (as the fetch tool brings it) has no work tree: git show
        blob = subprocess.run([*git, "show", f"HEAD:{name}"], capture_output=True,
                              check=True).stdout
        path = dest / name[len("Lib/"):]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    return f"{gitdir} (HEAD {head})"


def build_tree(dest: Path) -> None:
    _write(dest / "test" / "__init__.py", "")
    _write(dest / "test" / "support" / "__init__.py", SUPPORT)
    _write(dest / "test" / "support" / "threading_helper.py", THREADING_HELPER)
    _write(dest / "test" / "support" / "warnings_helper.py", WARNINGS_HELPER)
    _write(dest / "test" / "support" / "hashlib_helper.py", HASHLIB_HELPER)
    _write(dest / "test" / "support" / "import_helper.py", IMPORT_HELPER)
    _write(dest / "test" / "support" / "script_helper.py", SCRIPT_HELPER)
    for part in ("test_importlib", "test_importlib/metadata"):
        _write(dest / "test" / part / "__init__.py", "")
    _write(dest / "test" / "test_importlib" / "metadata" / "fixtures.py", IMPORTLIB_FIXTURES)
    _write(dest / "_cpython_batch.py", BATCH_MODULE)
    _write(dest / "sitecustomize.py", SITECUSTOMIZE)


class FileEvent:
    """A cross-process event for the tests' ``create_event()``: a file that exists once set.

    CPython gives process pools a multiprocessing Manager's Event, whose proxy authenticates
    with the parent's authkey; a Batch job is no child of the client and has no such key.
    """

    def __init__(self, folder: str) -> None:
        fd, self.path = tempfile.mkstemp(prefix="event-", dir=folder)
        os.close(fd)
        os.unlink(self.path)

    def set(self) -> None:
        with open(self.path, "w"):
            pass

    def is_set(self) -> bool:
        return os.path.exists(self.path)

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not os.path.exists(self.path):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True


def find_mixins() -> dict:
    """CPython's mixin classes, by name, from whichever of its modules defines them."""
    import importlib
    import pkgutil

    import test.test_concurrent_futures as package
    modules = [package]
    if hasattr(package, "__path__"):
        for info in pkgutil.iter_modules(package.__path__):
            if info.name in ("test_deadlock", "test_future", "test_thread_pool",
                             "test_interpreter_pool"):
                continue  # no executor mixin (or ProcessPoolExecutor internals only)
            try:
                modules.append(importlib.import_module(f"{package.__name__}.{info.name}"))
            except Exception as exc:  # noqa: BLE001 - reported, the rest still runs
                print(f"could not import {info.name}: {type(exc).__name__}: {exc}")
    found = {}
    for module in modules:
        for names in MIXINS:
            for name in names:
                if hasattr(module, name):
                    found[name] = getattr(module, name)
    return found


def make_cases(found: dict, event_folder: str) -> list:
    from _cpython_batch import LocalBatchExecutor
    util = sys.modules.get("test.test_concurrent_futures.util") or sys.modules[
        "test.test_concurrent_futures"]
    import multiprocessing

    class BatchMixin(util.ExecutorMixin):
        executor_type = LocalBatchExecutor

        # no `ctx`: the executor is made without mp_context (it has no effect on Batch), and
        # the tests take the branches of an executor whose children share no parent process
        def get_context(self):
            return multiprocessing.get_context("spawn")

        def create_event(self):
            event = FileEvent(event_folder)
            self.__dict__.setdefault("_batch_events", []).append(event)
            return event

        def tearDown(self):
            # A test that failed before setting its events would leave their jobs waiting, and
            # the shutdown(wait=True) of tearDown with them (CPython's process tests kill the
            # worker instead): set them, as the tests' own `finally:` blocks do.
            release(self)
            super().tearDown()

    def strip(name: str) -> str:
        if name.endswith(("Mixin", "Tests")):
            return name[:-5]
        if name.endswith("Test"):
            return name[:-4]
        return name

    cases = []
    for names in MIXINS:
        present = [n for n in names if n in found]
        if not present:
            print(f"not in this CPython version: {', '.join(names)}")
            continue
        mixin = found[present[-1]]
        cls = type(f"Batch{strip(mixin.__name__)}Test", (mixin, BatchMixin, util.BaseTestCase),
                   {"__module__": __name__})
        for test_name in unittest.TestLoader().getTestCaseNames(cls):
            if makes_its_own_pool(cls, test_name):
                setattr(cls, test_name, unittest.skip(STDLIB_ONLY)(getattr(cls, test_name)))
            cases.append(cls(test_name))
    return cases


STDLIB_ONLY = "n/a: makes a stdlib ProcessPoolExecutor itself, never the executor type"


def makes_its_own_pool(cls: type, test_name: str) -> bool:
    """Whether the test (or a self._helper it calls) builds futures.ProcessPoolExecutor(...).

    Such tests (test_context_manager_shutdown, test_del_shutdown, ... of ProcessPoolShutdownTest)
    test the interpreter's own pool whatever the executor type; on an older Python they can even
    hang at exit on the bugs they test for.
    """
    import inspect
    import re
    try:
        source = inspect.getsource(getattr(cls, test_name))
        for helper in set(re.findall(r"self\.(_\w+)\(", source)):
            if callable(getattr(cls, helper, None)):
                source += inspect.getsource(getattr(cls, helper))
    except (OSError, TypeError):
        return False
    return "futures.ProcessPoolExecutor(" in source


class Outcome(unittest.TestResult):
    def __init__(self) -> None:
        super().__init__()
        self.status = "pass"
        self.reasons: list = []

    def _fail(self, err, label="") -> None:
        self.status = "FAIL"
        lines = traceback.format_exception(*err)
        last = lines[-1].strip() if lines else "?"
        for line in reversed(lines):  # the assertion's own line is the most telling
            if line.strip() and not line.startswith(" "):
                last = line.strip()
                break
        self.reasons.append((label + " " if label else "") + last)

    def addError(self, test, err) -> None:
        super().addError(test, err)
        self._fail(err)

    def addFailure(self, test, err) -> None:
        super().addFailure(test, err)
        self._fail(err)

    def addSubTest(self, test, subtest, err) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._fail(err, subtest._subDescription())

    def addSkip(self, test, reason) -> None:
        super().addSkip(test, reason)
        self.status = "skip"
        self.reasons.append(reason)


def run_case(case: unittest.TestCase, timeout: float) -> tuple:
    outcome = Outcome()
    timer = threading.Timer(timeout, _interrupt)
    timer.daemon = True
    start = time.monotonic()
    timer.start()
    try:
        case.run(outcome)
    except KeyboardInterrupt:
        timer.cancel()
        outcome.status = "FAIL"
        outcome.reasons.append(f"did not finish in {timeout:.0f} s (interrupted)")
        release(case)
        executor = getattr(case, "executor", None)
        if executor is not None:
            executor.kill_workers()
    finally:
        timer.cancel()
    return outcome.status, time.monotonic() - start, "; ".join(outcome.reasons)


def _interrupt() -> None:
    # a real signal to the main thread, so that a blocked lock acquire wakes up (EINTR)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def release(case: unittest.TestCase) -> None:
    for event in case.__dict__.get("_batch_events", ()):
        event.set()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cpython", type=Path,
                        help="a CPython checkout (or its git mirror), or its "
                             "Lib/test/test_concurrent_futures folder")
    parser.add_argument("-k", action="append", default=[],
                        help="run only tests whose id contains this (repeatable)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds one test may take before it is interrupted")
    parser.add_argument("--list", action="store_true", help="list the tests, run nothing")
    parser.add_argument("--width", type=int, default=110, help="width of the reason column")
    parser.add_argument("--inner", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner is not None:
        return run_tests(args.inner, args)

    # The tests run in a child process, so that the emulator of their executors has ended
    # (and written its last records) before the temporary folder is removed.
    tmp = Path(tempfile.mkdtemp(prefix="bf-cpython-suite-"))
    try:
        build_tree(tmp)
        origin = copy_sources(args.cpython.resolve(), tmp)
        print(f"CPython tests from {origin}", flush=True)
        return subprocess.call([sys.executable, __file__, *sys.argv[1:], "--inner", str(tmp)])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_tests(tmp: Path, args: argparse.Namespace) -> int:
    os.environ["BATCHFUTURES_CPYTHON_SUITE"] = str(tmp)
    os.environ["BATCHFUTURES_CPYTHON_WORKDIR"] = str(tmp / "workdir")
    (tmp / "workdir").mkdir(mode=0o700)
    (tmp / "events").mkdir(mode=0o700)
    sys.path.insert(0, str(tmp))
    import _cpython_batch  # noqa: F401 - the placeholders must exist before CPython's import

    print(f"Python {sys.version.split()[0]}, executor: BatchExecutor(LocalEnvironment(<tmp>))")
    cases = make_cases(find_mixins(), str(tmp / "events"))
    if args.k:
        cases = [c for c in cases if any(k in c.id() for k in args.k)]
    if args.list:
        for case in cases:
            print(case.id())
        return 0

    rows = []
    for case in cases:
        name = f"{type(case).__name__}.{case._testMethodName}"
        status, seconds, reason = run_case(case, args.timeout)
        rows.append((name, status, seconds, reason))
        print(f"  {status:4} {seconds:6.1f}s {name}", flush=True)

    width = max(len(r[0]) for r in rows) if rows else 10
    print()
    print(f"{'test':{width}}  result  time    reason")
    print(f"{'-' * width}  ------  ------  {'-' * 6}")
    for name, status, seconds, reason in rows:
        wrapped = textwrap.shorten(reason, args.width) if reason else ""
        print(f"{name:{width}}  {status:6}  {seconds:5.1f}s  {wrapped}")
    counts = {s: sum(1 for r in rows if r[1] == s) for s in ("pass", "FAIL", "skip")}
    print()
    print(f"{len(rows)} tests: {counts['pass']} passed, {counts['FAIL']} failed, "
          f"{counts['skip']} skipped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
