"""The command line as a user runs it: the installed `batchfutures` entry point in a subprocess,
against a LocalEnvironment workdir whose jobs this test process runs. Plus the pure parts
(cleanup's policy, the exit-code table, the parser) as table tests."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from batchfutures import BatchExecutor, LocalEnvironment, cleanup, jobview
from batchfutures.cli import app, jobcommands, output
from batchfutures.errors import ConfigurationError, JobFailedError, JobMetadataExpired

DAY = 86400.0


def entry_point():
    installed = Path(sys.executable).parent / "batchfutures"
    return [str(installed)] if installed.exists() else [sys.executable, "-m", "batchfutures"]


def cli_env():
    env = dict(os.environ)
    for name in ("BATCHFUTURES_JOB_QUEUE", "BATCHFUTURES_JOB_DEFINITION", "BATCHFUTURES_IO_BUCKET"):
        env.pop(name, None)
    return env


def run_cli(workdir, *args, check=True, workdir_first=True):
    where = ["--workdir", str(workdir)] if workdir is not None else []
    argv = [*where, *args] if workdir_first else [*args, *where]
    completed = subprocess.run(entry_point() + argv, capture_output=True, text=True, timeout=120,
                               env=cli_env())
    if check:
        assert completed.returncode == 0, completed.stderr + completed.stdout
    return completed


def assert_clean_error(completed, code, *words):
    """One line on stderr, no traceback, the documented exit code."""
    assert completed.returncode == code, (completed.returncode, completed.stderr, completed.stdout)
    assert "Traceback" not in completed.stderr
    assert completed.stderr.strip().count("\n") == 0, completed.stderr
    for word in words:
        assert word in completed.stderr, completed.stderr


# -- functions the jobs run ----------------------------------------------------------------------
def shout(text):
    print(f"the job says {text}")
    return text.upper()


def picky(x):
    if x % 3 == 2:
        raise ValueError(f"no {x}")
    return x


def wait_for(gate, *lines):
    """Print each line, then wait for the gate file '<gate>.<i>' before the next."""
    for i, line in enumerate(lines):
        print(line, flush=True)
        while not os.path.exists(f"{gate}.{i}"):
            time.sleep(0.05)
    return "done"


def big(x):
    return "x" * 2000


def open_gate(gate, i):
    Path(f"{gate}.{i}").write_text("")


def wait_status(env, job_id, wanted, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = env.batch.describe_jobs(jobs=[job_id])["jobs"]
        if found and found[0]["status"] in wanted:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"{job_id} never reached {wanted}")


@pytest.fixture
def finished_job(tmp_path):
    env = LocalEnvironment(tmp_path)
    with BatchExecutor(env) as executor:
        future = executor.submit(shout, "hello")
        assert future.result(timeout=60) == "HELLO"
    return tmp_path, future.job_id


@pytest.fixture
def live(tmp_path):
    """An executor in this process whose jobs the CLI observes from another process."""
    env = LocalEnvironment(tmp_path / "work")
    executor = BatchExecutor(env)
    yield env, executor, tmp_path / "work"
    executor.shutdown(wait=False, cancel_futures=True)
    env.emulator.close()


# -- the parser, exit codes, matching (pure) ----------------------------------------------------
def test_every_option_has_help_and_help_shows_exit_codes():
    parser = app.build_parser()
    subparsers = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"][0]
    for name, sub in list(subparsers.choices.items()) + [("batchfutures", parser)]:
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
        assert "exit codes" in sub.format_help() and "4    timed out" in sub.format_help()


@pytest.mark.parametrize("argv", [
    ["--workdir", "w", "--output", "json", "status", "J"],
    ["status", "J", "--workdir", "w", "--output", "json"],
    ["--output", "json", "status", "--workdir", "w", "J"],
    ["status", "-o", "JSON", "J", "--workdir", "w"],
])
def test_global_options_before_or_after_the_command(argv):
    args = app.parse_args(argv)
    assert (args.workdir, args.output, args.job, args.debug) == ("w", output.OutputFormat.JSON, "J", False)


def test_global_defaults():
    args = app.parse_args(["jobs"])
    assert (args.workdir, args.output, args.create, args.debug) == (None, output.OutputFormat.TEXT,
                                                                    False, False)


def client_error(code, message, status=400):
    return ClientError({"Error": {"Code": code, "Message": message},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "TerminateJob")


@pytest.mark.parametrize("error, code, text", [
    (output.CLIError("x", output.ExitCode.TIMEOUT), output.ExitCode.TIMEOUT, "x"),
    (JobMetadataExpired("gone"), output.ExitCode.NOT_FOUND, "gone"),
    (ConfigurationError("bad"), output.ExitCode.USAGE, "bad"),
    (JobFailedError("boom"), output.ExitCode.FAILED, "JobFailedError: boom"),
    (client_error("ClientException", "Job nope does not exist"), output.ExitCode.NOT_FOUND,
     "TerminateJob: Job nope does not exist"),
    (client_error("ServerException", "oops", 500), output.ExitCode.FAILED, "TerminateJob: oops"),
    (RuntimeError("odd"), output.ExitCode.FAILED, "--debug"),
])
def test_errors_map_to_the_exit_code_table(error, code, text):
    got_code, message = app.classify(error)
    assert got_code == code and text in message


@pytest.mark.parametrize("job, status, matches", [
    ({"status": "RUNNING"}, "RUNNING", True),
    ({"status": "PENDING"}, "RUNNING", False),
    ({"status": "PENDING", "arrayProperties": {"statusSummary": {"RUNNING": 2}}}, "RUNNING", True),
    ({"status": "PENDING", "arrayProperties": {"statusSummary": {"RUNNING": 0}}}, "RUNNING", False),
    ({"status": "SUCCEEDED"}, None, True),
])
def test_jobs_status_matches_children_too(job, status, matches):
    assert jobcommands.job_matches(job, status) is matches


def test_table_has_headers_and_aligned_columns():
    text = output.render_table(["A", "LONGER"], [["xyz", None], ["1", 2]])
    assert text.splitlines() == ["A    LONGER", "xyz  -", "1    2"]


# -- the command line, end to end ------------------------------------------------------------
@pytest.mark.slow
def test_demo_prints_its_job_id_and_the_commands_that_inspect_it(tmp_path):
    out = run_cli(tmp_path, "demo", "--items", "6", "--chunksize", "2").stdout
    assert "[0, 1, 4, 9, 16, 25]" in out
    line = next(line for line in out.splitlines() if line.startswith("job "))
    job_id = line.split()[1]
    assert f"status {job_id}" in out and f"logs {job_id}:0" in out and f"result {job_id}" in out
    assert run_cli(tmp_path, "result", job_id).stdout.split() == ["0", "1", "4", "9", "16", "25"]


@pytest.mark.slow
def test_status_of_a_job_another_process_ran(finished_job):
    workdir, job_id = finished_job
    status = json.loads(run_cli(workdir, "status", job_id, "--output", "json").stdout)
    assert status["jobId"] == job_id and status["status"] == "SUCCEEDED"
    assert status["exitCode"] == 0 and status["failedCalls"] == [] and status["callsRead"] == 1
    text = run_cli(workdir, "status", job_id).stdout
    assert "SUCCEEDED" in text and "exit code  0" in text
    table = run_cli(workdir, "status", job_id, "-o", "table").stdout.splitlines()
    assert table[0].split()[:3] == ["JOB", "ID", "NAME"] and job_id in table[1]


@pytest.mark.slow
def test_result_and_logs_of_a_job_another_process_ran(finished_job):
    workdir, job_id = finished_job
    assert run_cli(workdir, "result", job_id).stdout.strip() == "'HELLO'"
    assert json.loads(run_cli(workdir, "result", job_id, "-o", "json").stdout) == [
        {"index": 0, "ok": True, "repr": "'HELLO'", "value": "HELLO"}]
    assert "the job says hello" in run_cli(workdir, "logs", job_id).stdout


@pytest.mark.slow
def test_status_of_an_array_shows_children_and_failed_calls(tmp_path):
    env = LocalEnvironment(tmp_path)
    with BatchExecutor(env) as executor:
        futures = executor.map_futures(picky, range(6), chunksize=2)
        for future in futures:
            future.exception(timeout=60)
    job_id = futures[0].job_id.partition(":")[0]
    wait_status(env, job_id, ("SUCCEEDED", "FAILED"))  # Batch's view may lag the futures
    completed = run_cli(tmp_path, "status", job_id, check=False)
    assert completed.returncode == 1, completed.stderr  # Batch says SUCCEEDED, two calls raised
    out = completed.stdout
    assert "children  3: SUCCEEDED 3" in out
    assert "item 2" in out and "ValueError: no 2" in out and "ValueError: no 5" in out
    data = json.loads(run_cli(tmp_path, "status", job_id, "-o", "json", check=False).stdout)
    assert data["size"] == 3 and data["statusCounts"]["SUCCEEDED"] == 3
    assert [c["index"] for c in data["children"]] == [0, 1, 2]
    assert [(f["item"], f["error"]) for f in data["failedCalls"]] == [(2, "ValueError"),
                                                                     (5, "ValueError")]
    result = run_cli(tmp_path, "result", job_id, check=False)
    assert result.returncode == 1 and result.stdout.splitlines() == [
        "0", "1", "ValueError: no 2", "3", "4", "ValueError: no 5"]
    assert "2 of 6 call(s)" in result.stderr
    # one child of the array: its own status; logs of the array ask for an index
    assert run_cli(tmp_path, "status", f"{job_id}:1", check=False).returncode == 1
    assert_clean_error(run_cli(tmp_path, "logs", job_id, check=False), 2, f"{job_id}:<index>",
                       "--all")
    every = run_cli(tmp_path, "logs", job_id, "--all").stdout
    assert [line for line in every.splitlines() if line.startswith("==>")] == [
        f"==> {job_id}:{i} <==" for i in range(3)]


@pytest.mark.slow
def test_logs_prints_what_is_there_and_exits_while_the_job_runs(live):
    env, executor, workdir = live
    gate = workdir.parent / "gate"
    future = executor.submit(wait_for, str(gate), "first line", "second line")
    executor._session.flush_all()
    wait_status(env, future.job_id, ("RUNNING",))
    deadline = time.monotonic() + 30
    while "first line" not in run_cli(workdir, "logs", future.job_id).stdout:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert not future.done()  # it ended while the job still runs
    open_gate(gate, 0)
    open_gate(gate, 1)
    assert future.result(timeout=60) == "done"


@pytest.mark.slow
def test_logs_follow_keeps_its_place_and_ends_with_the_job(live):
    env, executor, workdir = live
    gate = workdir.parent / "gate"
    future = executor.submit(wait_for, str(gate), "line one", "line two", "line three")
    executor._session.flush_all()
    follower = subprocess.Popen(entry_point() + ["logs", future.job_id, "--follow", "--interval",
                                                 "0.2", "--workdir", str(workdir)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=cli_env())
    try:
        seen = []
        for i in range(3):
            seen.append(follower.stdout.readline().rstrip("\n"))
            open_gate(gate, i)
        rest, errors = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, errors
    assert seen == ["line one", "line two", "line three"] and rest == ""
    assert future.result(timeout=60) == "done"


@pytest.mark.slow
def test_ctrl_c_ends_logs_follow_at_once_and_leaves_the_job_running(live):
    env, executor, workdir = live
    gate = workdir.parent / "gate"
    future = executor.submit(wait_for, str(gate), "started")
    executor._session.flush_all()
    follower = subprocess.Popen(entry_point() + ["--workdir", str(workdir), "logs", "-f",
                                                 future.job_id],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=cli_env())
    try:
        assert follower.stdout.readline().strip() == "started"
        follower.send_signal(signal.SIGINT)
        _, errors = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 130 and "Traceback" not in errors and "interrupted" in errors
    assert env.batch.describe_jobs(jobs=[future.job_id])["jobs"][0]["status"] == "RUNNING"
    open_gate(gate, 0)
    assert future.result(timeout=60) == "done"


CRASH_ONCE = """
import os, sys, time
attempt = os.environ["AWS_BATCH_JOB_ATTEMPT"]
print("attempt", attempt, "here", flush=True)
if attempt == "1":
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    sys.exit(3)
"""


@pytest.mark.slow
def test_logs_follow_reads_a_retried_job_from_each_attempts_start(live):
    env, executor, workdir = live
    gate = workdir.parent / "gate"
    # a plain Batch job that crashes once and is retried (retryStrategy without rules)
    job_id = env.batch.submit_job(
        jobName="crash-once", jobQueue=env.job_queue, jobDefinition=env.job_definition,
        containerOverrides={"command": ["python", "-c", CRASH_ONCE, str(gate)]},
        retryStrategy={"attempts": 2})["jobId"]
    follower = subprocess.Popen(entry_point() + ["logs", job_id, "-f", "--interval", "0.2",
                                                 "--workdir", str(workdir)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=cli_env())
    try:
        first = follower.stdout.readline()
        gate.write_text("")
        rest, errors = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, errors
    assert [first.strip()] + rest.splitlines() == ["attempt 1 here", "attempt 2 here"]
    assert "attempt 2 started" in errors
    assert wait_status(env, job_id, ("SUCCEEDED", "FAILED"))["status"] == "SUCCEEDED"


@pytest.mark.slow
def test_result_timeout_stops_with_a_message_and_leaves_the_job_running(live):
    env, executor, workdir = live
    gate = workdir.parent / "gate"
    future = executor.submit(wait_for, str(gate), "waiting")
    executor._session.flush_all()
    wait_status(env, future.job_id, ("RUNNING",))
    completed = run_cli(workdir, "result", future.job_id, "--timeout", "1", check=False)
    assert_clean_error(completed, 4, "timed out after 1 s", future.job_id, "RUNNING")
    assert env.batch.describe_jobs(jobs=[future.job_id])["jobs"][0]["status"] == "RUNNING"
    open_gate(gate, 0)
    assert future.result(timeout=60) == "done"
    assert run_cli(workdir, "result", future.job_id, "--timeout", "30").stdout.strip() == "'done'"


@pytest.mark.slow
def test_status_watch_refreshes_until_the_job_ends(live):
    env, executor, workdir = live
    gate = workdir.parent / "gate"
    futures = executor.map_futures(wait_for, [str(gate)] * 2, ["hi"] * 2)
    job_id = futures[0].job_id.partition(":")[0]
    watcher = subprocess.Popen(entry_point() + ["--workdir", str(workdir), "status", job_id,
                                                "--watch", "--interval", "0.2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=cli_env())
    try:
        first = watcher.stdout.readline()
        assert first.startswith(job_id) and "RUNNABLE" in first and "SUCCEEDED" in first
        open_gate(gate, 0)
        rest, errors = watcher.communicate(timeout=60)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 0, errors
    lines = [first.rstrip()] + rest.splitlines()
    assert any(line.startswith(job_id) and "SUCCEEDED 2" in line for line in lines)
    assert "children  2: SUCCEEDED 2" in rest


@pytest.mark.slow
def test_jobs_status_matches_running_children(live):
    env, executor, workdir = live
    gate = workdir.parent / "gate"
    futures = executor.map_futures(wait_for, [str(gate)] * 2, ["hi"] * 2)
    job_id = futures[0].job_id.partition(":")[0]
    wait_status(env, f"{job_id}:0", ("RUNNING",))
    assert job_id in run_cli(workdir, "jobs", "--status", "RUNNING").stdout
    rows = json.loads(run_cli(workdir, "jobs", "--status", "running", "-o", "json").stdout)
    assert [row["jobId"] for row in rows] == [job_id] and rows[0]["size"] == 2
    assert job_id not in run_cli(workdir, "jobs", "--status", "FAILED").stdout
    open_gate(gate, 0)
    for future in futures:
        assert future.result(timeout=60) == "done"


@pytest.mark.slow
def test_jobs_lists_this_librarys_jobs(finished_job):
    workdir, job_id = finished_job
    out = run_cli(workdir, "jobs").stdout
    assert job_id in out and "SUCCEEDED" in out and "bf-shout" in out
    table = run_cli(workdir, "jobs", "-o", "table").stdout.splitlines()
    assert table[0].split() == ["JOB", "ID", "NAME", "STATUS", "CHILDREN", "CREATED", "(UTC)",
                                "DURATION"]
    empty = run_cli(workdir, "jobs", "--status", "FAILED")
    assert job_id not in empty.stdout and "no batchfutures jobs" in empty.stderr


@pytest.mark.slow
def test_clean_errors_and_exit_codes(finished_job, tmp_path_factory):
    workdir, job_id = finished_job
    assert_clean_error(run_cli(workdir, "status", "nope-123", check=False), 3, "nope-123")
    assert_clean_error(run_cli(workdir, "result", "nope-123", check=False), 3, "nope-123")
    assert_clean_error(run_cli(workdir, "logs", "nope-123", check=False), 3, "nope-123")
    assert_clean_error(run_cli(workdir, "cancel", "nope-123", check=False), 3, "nope-123")
    finished = run_cli(workdir, "cancel", job_id, check=False)
    assert_clean_error(finished, 1, job_id, "already SUCCEEDED")
    demo = run_cli(workdir, "demo", "--chunksize", "0", check=False)
    assert demo.returncode == 2 and "--chunksize: 0 must be at least 1" in demo.stderr
    assert "Traceback" not in demo.stderr
    a_file = tmp_path_factory.mktemp("f") / "passwd"
    a_file.write_text("root:x:0:0\n")
    assert_clean_error(run_cli(a_file, "status", job_id, check=False), 2, str(a_file), "not a folder")
    missing = tmp_path_factory.mktemp("m") / "typo"
    assert_clean_error(run_cli(missing, "jobs", check=False), 2, str(missing), "--create")
    assert not missing.exists()
    assert_clean_error(run_cli(missing, "status", "x-1", "--create", check=False), 3, "x-1")
    assert missing.is_dir()
    debug = run_cli(workdir, "status", "nope-123", "--debug", check=False)
    assert debug.returncode == 3 and "Traceback" in debug.stderr


@pytest.mark.slow
def test_result_into_a_closed_pipe_ends_quietly(tmp_path):
    env = LocalEnvironment(tmp_path)
    with BatchExecutor(env) as executor:
        futures = executor.map_futures(big, range(200), chunksize=50)
        for future in futures:
            future.result(timeout=60)
    job_id = futures[0].job_id.partition(":")[0]
    reader = subprocess.Popen(entry_point() + ["--workdir", str(tmp_path), "result", job_id],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    first = reader.stdout.readline()
    reader.stdout.close()  # as `| head -1` does
    errors = reader.stderr.read().decode()
    reader.wait(timeout=60)
    assert first.startswith(b"'xxxx")
    assert reader.returncode == output.ExitCode.BROKEN_PIPE
    assert "Traceback" not in errors and "BrokenPipeError" not in errors and errors == ""


@pytest.mark.slow
def test_check_reports_each_part(tmp_path):
    done = run_cli(tmp_path, "check")
    out = done.stdout.splitlines()
    assert done.returncode == 0
    assert [line.split(":")[0] for line in out] == [
        "ok   credentials", "ok   region", "ok   job queue", "ok   signing key", "ok   bucket",
        "ok   job definition", "ok   image"]
    assert f"signing key: key file {tmp_path.resolve() / 'signing.key'}" in done.stdout
    assert "(a signed object written, read back, deleted)" in done.stdout
    key = (tmp_path / "signing.key").read_text().strip()
    assert key not in done.stdout  # the key is never printed


@pytest.mark.slow
def test_check_exits_1_naming_a_broken_part(tmp_path):
    env = dict(cli_env(), BATCHFUTURES_SIGNING_KEY="too short")  # the key, else the key file
    done = subprocess.run(entry_point() + ["--workdir", str(tmp_path), "check"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == output.ExitCode.FAILED
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert [line.split(":")[0] for line in failed] == ["FAIL signing key"], done.stdout
    assert "too short for a signing key" in failed[0]
    assert "an unsigned object written" in done.stdout  # the bucket is still probed
    assert done.stderr == ("batchfutures: 1 of 7 checks failed: fix the FAIL lines, then run "
                           "`batchfutures check` again\n")


# -- cleanup, end to end -------------------------------------------------------------------------
def age_run(workdir, run_id, seconds):
    """Make a run (and its job pointers) look ``seconds`` old, as time would."""
    then = time.time() - seconds
    storage = workdir / "storage"
    folder = storage / "runs" / run_id
    for path in [*folder.rglob("*"), folder]:
        os.utime(path, (then, then))
    for pointer in (storage / "jobs").iterdir():
        if f"/runs/{run_id}/".encode() in pointer.read_bytes():  # a sealed pointer: bytes
            os.utime(pointer, (then, then))


@pytest.mark.slow
def test_cleanup_removes_finished_runs_and_their_pointers(finished_job):
    workdir, job_id = finished_job
    assert "1 run(s) to remove" in run_cli(workdir, "cleanup", "--all", "--dry-run").stdout
    assert list((workdir / "storage" / "runs").iterdir())
    assert "1 run(s) removed" in run_cli(workdir, "cleanup", "--all").stdout
    assert not list((workdir / "storage" / "runs").iterdir())
    assert not list((workdir / "storage" / "jobs").iterdir())


@pytest.mark.slow
def test_cleanup_keeps_recent_runs(finished_job):
    workdir, _ = finished_job
    out = run_cli(workdir, "cleanup", "--older-than", "1").stdout
    assert "0 run(s) removed" in out and "keeping" in out


@pytest.mark.slow
def test_cleanup_all_never_removes_a_run_in_progress(live):
    env, executor, workdir = live
    done = BatchExecutor(env)
    assert done.submit(shout, "old").result(timeout=60) == "OLD"
    done.shutdown()
    gate = workdir.parent / "gate"
    futures = executor.map_futures(wait_for, [str(gate)] * 3, ["hi"] * 3)
    running_run = executor._session.run_id
    age_run(workdir, running_run, 30 * DAY)  # even an old-looking run is kept while it runs
    out = run_cli(workdir, "cleanup", "--all").stdout
    assert "1 run(s) removed" in out and "in progress" in out
    assert [p.name for p in (workdir / "storage" / "runs").iterdir()] == [running_run]
    open_gate(gate, 0)
    assert [f.result(timeout=60) for f in futures] == ["done"] * 3  # their inputs were kept


@pytest.mark.slow
def test_remove_finished_runs_bounds_local_storage(live, monkeypatch):
    env, executor, workdir = live
    runs = {}
    for name in ("old", "recent"):
        ex = BatchExecutor(env)
        assert ex.submit(shout, name).result(timeout=60) == name.upper()
        ex.shutdown()
        runs[name] = ex._session.run_id
    age_run(workdir, runs["old"], 8 * DAY)
    gate = workdir.parent / "gate"
    running = executor.submit(wait_for, str(gate), "hi")
    executor._session.flush_all()
    age_run(workdir, executor._session.run_id, 30 * DAY)
    # an abandoned payload no job was recorded for, untouched for 10 days
    orphan = workdir / "storage" / "runs" / "20200101T000000-abad0bed00" / "jobs" / "k" / "inputs"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"x")
    age_run(workdir, "20200101T000000-abad0bed00", 10 * DAY)

    monkeypatch.setenv(cleanup.RETENTION_VARIABLE, "7")
    removed = cleanup.remove_finished_runs(env)
    assert sorted(removed) == sorted([runs["old"], "20200101T000000-abad0bed00"])
    left = {p.name for p in (workdir / "storage" / "runs").iterdir()}
    assert left == {runs["recent"], executor._session.run_id}
    assert cleanup.remove_finished_runs(env, 0.0) == [runs["recent"]]
    monkeypatch.setenv(cleanup.RETENTION_VARIABLE, "off")
    assert cleanup.remove_finished_runs(env) == []
    open_gate(gate, 0)
    assert running.result(timeout=60) == "done"


# -- jobview, in process -------------------------------------------------------------------------
@pytest.mark.slow
def test_jobview_describes_plain_and_array_jobs(local_env):
    with BatchExecutor(local_env) as executor:
        plain = executor.submit(shout, "hey")
        array = executor.map_futures(picky, range(4), chunksize=1)
        plain.result(timeout=60)
        for future in array:
            future.exception(timeout=60)
    # a future resolves from its stored result, which can be before Batch shows its child ended
    parent = array[0].job_id.partition(":")[0]
    for job_id in (plain.job_id, parent):
        wait_status(local_env, job_id, ("SUCCEEDED", "FAILED"))
    info = jobview.describe_in(local_env, plain.job_id)
    assert (info.job_id, info.status, info.exit_code, info.size, info.is_array) == (
        plain.job_id, "SUCCEEDED", 0, 0, False)
    assert info.created_at and info.started_at and info.stopped_at
    assert info.stopped_at >= info.started_at  # a job ends after it starts
    assert "the job says hey" in info.log()
    whole = jobview.describe_in(local_env, parent)
    assert whole.is_array and whole.size == 4 and whole.status_counts["SUCCEEDED"] == 4
    assert [(c.index, c.status, c.exit_code) for c in whole.children] == [
        (i, "SUCCEEDED", 0) for i in range(4)]
    assert whole.log(0) == ""
    with pytest.raises(ValueError, match="child index"):
        whole.log()
    calls = jobview.failed_calls(local_env.storage, whole)
    assert calls.calls_read == 4 and [(f.item, f.error_type) for f in calls.failed] == [
        (2, "ValueError")]
    child = jobview.describe_in(local_env, f"{parent}:2")
    assert child.array_index == 2 and not child.is_array
    assert [f.item for f in jobview.failed_calls(local_env.storage, child).failed] == [2]
    with pytest.raises(JobMetadataExpired, match="nope-123"):
        jobview.describe_in(local_env, "nope-123")


# -- the AWS path: real boto3 clients against the emulator's HTTP endpoint, S3 on moto --------
@pytest.mark.slow
def test_the_commands_on_the_aws_path(tmp_path, s3_endpoint):
    import boto3
    from s3server import emulator_endpoint

    from batchfutures import AWSBatchEnvironment

    bucket = f"bf-cli-{os.urandom(6).hex()}"
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=bucket)
    with emulator_endpoint(tmp_path / "emulator", max_vcpus=2):
        settings = {"BATCHFUTURES_JOB_QUEUE": "batchfutures", "BATCHFUTURES_IO_BUCKET": bucket,
                    "BATCHFUTURES_JOB_DEFINITION": "batchfutures-worker",
                    "AWS_DEFAULT_REGION": "us-east-1"}
        env = AWSBatchEnvironment(job_queue="batchfutures", io_bucket=bucket,
                                  job_definition="batchfutures-worker", region_name="us-east-1")
        with BatchExecutor(env) as executor:
            futures = executor.map_futures(picky, range(4), chunksize=2)
            for future in futures:
                future.exception(timeout=60)
        job_id = futures[0].job_id.partition(":")[0]

        def aws_cli(*args):
            return subprocess.run(entry_point() + list(args), capture_output=True, text=True,
                                  timeout=120, env={**os.environ, **settings})

        status = aws_cli("status", job_id, "-o", "json")
        assert status.returncode == 1, status.stderr
        data = json.loads(status.stdout)
        assert data["statusCounts"]["SUCCEEDED"] == 2
        assert [f["item"] for f in data["failedCalls"]] == [2]
        result = aws_cli("result", job_id)
        assert result.returncode == 1 and result.stdout.splitlines() == ["0", "1", "ValueError: no 2",
                                                                       "3"]
        logs = aws_cli("logs", f"{job_id}:1", "--follow")
        assert logs.returncode == 0, logs.stderr
        assert job_id in aws_cli("jobs", "--status", "SUCCEEDED").stdout
        assert_clean_error(aws_cli("cancel", "nope-123"), 3, "nope-123")
        dry = aws_cli("cleanup", "--all", "--dry-run")
        assert dry.returncode == 0 and "1 run(s) to remove" in dry.stdout
        assert f"s3://{bucket}/batchfutures/runs/" in dry.stdout


@pytest.mark.slow
def test_demo_dry_run_prints_the_request_and_sends_nothing(tmp_path):
    workdir = tmp_path / "work"
    done = run_cli(workdir, "--create", "demo", "--dry-run", "--items", "4")
    assert "nothing was sent" in done.stdout and '"arrayProperties"' in done.stdout
    assert "/inputs" in done.stdout
    assert not (workdir / "storage").exists() or not any((workdir / "storage").rglob("inputs"))
