"""Drop-in, third pass: what a script sees of its calls is what ProcessPoolExecutor shows.

Each test runs one script twice, with ProcessPoolExecutor and with BatchExecutor (the embedded
emulator: real worker processes), and compares: a remote traceback's frames and source lines,
the records of the calls' `logging`, the variables the script set in os.environ.
"""

import linecache
import logging
import os
import subprocess
import sys
import textwrap
import traceback

import pytest

from batchfutures import BatchExecutor, DryRunResult

slow = pytest.mark.slow

HEADER = """\
import concurrent.futures, logging, os, sys, traceback
from batchfutures import BatchExecutor


def executor(kind):
    if kind == "batch":
        return BatchExecutor()
    return concurrent.futures.ProcessPoolExecutor(1)
"""


def run_both(tmp_path, body):
    """The script's stdout under ProcessPoolExecutor ("ppe") and BatchExecutor ("batch")."""
    script = tmp_path / "script.py"
    script.write_text(HEADER + textwrap.dedent(body))
    outputs = {}
    for kind in ("ppe", "batch"):
        environment = {**os.environ, "BATCHFUTURES_WORKDIR": str(tmp_path / "work")}
        done = subprocess.run([sys.executable, str(script), kind], cwd=tmp_path, env=environment,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr
        outputs[kind] = done.stdout
    return script, outputs


@slow
def test_remote_traceback_names_the_scripts_file_line_and_source(tmp_path):
    script, outputs = run_both(tmp_path, """
        def helper(x):
            return 1 / x


        def check(x):
            return helper(x)


        if __name__ == "__main__":
            with executor(sys.argv[1]) as ex:
                try:
                    ex.submit(check, 0).result()
                except ZeroDivisionError as error:
                    print("".join(traceback.format_exception(error)))
                    print("CAUSE:", type(error.__cause__).__name__)
    """)
    lines = script.read_text().splitlines()
    check_line = lines.index("    return helper(x)") + 1
    helper_line = lines.index("    return 1 / x") + 1
    for kind, text in outputs.items():
        assert f'File "{script}", line {check_line}, in check\n    return helper(x)\n' in text, kind
        assert f'File "{script}", line {helper_line}, in helper\n    return 1 / x\n' in text, kind
        assert "<dynamic-code>" not in text
        assert "CAUSE: " in text and "RemoteTraceback" in text, kind  # __cause__ keeps the text


@slow
def test_the_clients_line_is_shown_where_the_worker_has_no_file(local_env):
    # a notebook cell: its source is in the client's linecache only, never on disk (as IPython
    # registers cells); the worker prints the frame without a line, the client adds it
    filename = "/nonexistent/notebook-cell-7.py"
    source = "def cell_function(x):\n    raise KeyError(f'no {x} here')\n"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    try:
        with BatchExecutor(local_env) as ex:
            error = ex.submit(namespace["cell_function"], "key").exception(timeout=120)
        text = "".join(traceback.format_exception(error))
        assert f'File "{filename}", line 2, in cell_function\n' in text
        assert "    raise KeyError(f'no {x} here')\n" in text
        assert isinstance(error, KeyError) and error.args == ("no key here",)
    finally:
        linecache.cache.pop(filename, None)


@slow
def test_logging_records_reach_the_clients_handlers(tmp_path):
    _, outputs = run_both(tmp_path, """
        log = logging.getLogger("app")


        def work(x):
            log.debug("debug %s", x)
            log.info("info %s", x)
            log.warning("warning %s", x)
            return x


        if __name__ == "__main__":
            logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                                format="%(levelname)s|%(name)s|%(filename)s:%(funcName)s|%(message)s")
            with executor(sys.argv[1]) as ex:
                assert list(ex.map(work, range(3))) == [0, 1, 2]
                if sys.argv[1] == "batch":  # the container's log: only what the level lets through
                    future = ex.submit(work, 9)
                    future.result()
                    print("LOG:", future.log().replace("\\n", " / "))
    """)

    def records(text):
        return sorted(line for line in text.splitlines() if "|app|" in line and "9" not in line)

    assert records(outputs["batch"]) == records(outputs["ppe"])
    assert "INFO|app|script.py:work|info 1" in records(outputs["batch"])
    assert not any("debug" in line for line in records(outputs["batch"]))
    (log_line,) = [line for line in outputs["batch"].splitlines() if line.startswith("LOG:")]
    assert "info 9" in log_line and "warning 9" in log_line and "debug 9" not in log_line


@slow
def test_logged_records_are_tagged_with_their_call(local_env):
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    handler = Keep()
    logger = logging.getLogger("tagged_app")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with BatchExecutor(local_env) as ex:
            assert list(ex.map(_log_twice, range(3))) == [0, 1, 2]
    finally:
        logger.removeHandler(handler)
    mapped = [r for r in seen if r.name == "tagged_app"]
    by_call = {}
    for record in mapped:
        by_call.setdefault(record.call_index, []).append(record.getMessage())
    # each call's records in the order it made them, tagged with its child's index
    assert by_call == {i: [f"first {i}", f"second {i}"] for i in range(3)}
    assert len({r.job_id for r in mapped}) == 1 and mapped[0].job_id
    assert all(r.processName == f"{r.job_id}:{r.call_index}" for r in mapped)


def _log_twice(x):
    logging.getLogger("tagged_app").info("first %s", x)
    logging.getLogger("tagged_app").info("second %s", x)
    return x


@slow
def test_environment_the_script_set_reaches_its_calls(tmp_path):
    _, outputs = run_both(tmp_path, """
        def read(name):
            return os.environ.get(name)


        if __name__ == "__main__":
            os.environ["MY_SETTING"] = "from the script"
            os.environ["MY_API_TOKEN"] = "t0k3n"
            with executor(sys.argv[1]) as ex:
                print("VALUES:", list(ex.map(read, ["MY_SETTING", "MY_API_TOKEN"])))
    """)
    assert "VALUES: ['from the script', 't0k3n']" in outputs["ppe"]
    # a credential-like name needs environment=: its value would be in SubmitJob
    assert "VALUES: ['from the script', None]" in outputs["batch"]


def _double(x):
    return 2 * x


def test_inherited_variables_show_in_the_dry_run(local_env, monkeypatch):
    monkeypatch.setenv("BF_INHERITED_SETTING", "visible")
    monkeypatch.setenv("BF_INHERITED_PASSWORD", "hidden")
    with BatchExecutor(local_env, dry_run=True, environment={"EXPLICIT": "1"}) as ex:
        result = ex.submit(_double, 1).exception(timeout=30)
    assert isinstance(result, DryRunResult)
    (request,) = result.requests
    environment = {pair["name"]: pair["value"]
                   for pair in request["containerOverrides"]["environment"]}
    assert environment["BF_INHERITED_SETTING"] == "visible" and environment["EXPLICIT"] == "1"
    assert "BF_INHERITED_PASSWORD" not in environment


@slow
def test_traceback_through_a_helper_module_shipped_by_value(tmp_path):
    # the script's own module beside it (not installed: shipped by value, docs/environments.md)
    (tmp_path / "helpers.py").write_text("def parse(text):\n    return int(text)\n")
    script, outputs = run_both(tmp_path, """
        import helpers


        def load(text):
            return helpers.parse(text)


        if __name__ == "__main__":
            with executor(sys.argv[1]) as ex:
                try:
                    list(ex.map(load, ["1", "two"]))
                except ValueError as error:
                    print("".join(traceback.format_exception(error)))
    """)
    helpers = tmp_path / "helpers.py"
    for kind, text in outputs.items():
        assert f'File "{helpers}", line 2, in parse\n    return int(text)\n' in text, kind
        assert f'File "{script}", line ' in text and "return helpers.parse(text)" in text, kind


@slow
def test_warm_workers_make_records_at_the_clients_levels(local_env):
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep()
    logger = logging.getLogger("tagged_app")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # a warm worker's loggers default to WARNING: INFO must travel
    try:
        with BatchExecutor(local_env, keepalive=30) as ex:
            assert ex.submit(_log_twice, 4).result(timeout=120) == 4
    finally:
        logger.removeHandler(handler)
    assert seen == ["first 4", "second 4"]
