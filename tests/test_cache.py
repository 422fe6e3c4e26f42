"""cache=True: calls that succeeded before are not run again (docs/caching.md).

Every call appends a line to a file, so each test counts, per call, how often it really ran.
"""

import collections
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from batchfutures import BatchExecutor, DryRunResult
from batchfutures.cleanup import remove_finished_runs


def counted(log, x):
    with open(log, "a") as handle:
        handle.write(f"{x}\n")
    return x * 10


def counted_other(log, x):  # another body: another function
    with open(log, "a") as handle:
        handle.write(f"{x}\n")
    return x * 10 + 1


def fails_on_two(log, x):
    with open(log, "a") as handle:
        handle.write(f"{x}\n")
    if x == 2:
        raise ValueError(f"no {x}")
    return x


def runs(log):
    if not os.path.exists(log):
        return collections.Counter()
    with open(log) as handle:
        return collections.Counter(int(line) for line in handle if line.strip())


@pytest.mark.slow
def test_a_second_map_takes_what_succeeded_from_the_cache(local_env, tmp_path):
    log = str(tmp_path / "calls.log")
    with BatchExecutor(local_env, cache=True) as ex:
        assert list(ex.map(counted, [log] * 6, range(6), chunksize=2)) == [x * 10 for x in range(6)]
    with BatchExecutor(local_env, cache=True) as ex:
        futures = ex.map_futures(counted, [log] * 9, range(9), chunksize=2)
        assert [f.result(timeout=120) for f in futures] == [x * 10 for x in range(9)]
        assert [f.cached for f in futures] == [True] * 6 + [False] * 3
        # map's iterator too, in order, with hits and runs interleaved
        assert list(ex.map(counted, [log] * 10, [9, 0, 10, 1], chunksize=3)) == [90, 0, 100, 10]
        assert ex.submit(counted, log, 3).result(timeout=120) == 30
    assert runs(log) == collections.Counter({x: 1 for x in range(11)})


@pytest.mark.slow
def test_without_cache_everything_runs_and_no_index_is_written(local_env, tmp_path):
    log = str(tmp_path / "calls.log")
    for _ in range(2):
        with BatchExecutor(local_env) as ex:
            futures = ex.map_futures(counted, [log] * 3, range(3))
            assert [f.result(timeout=120) for f in futures] == [0, 10, 20]
            assert not any(f.cached for f in futures)
    assert runs(log) == collections.Counter({0: 2, 1: 2, 2: 2})
    assert not (local_env.workdir / "storage" / "cache").exists()


@pytest.mark.slow
def test_failed_calls_are_never_cached_and_raise_as_a_run_does(local_env, tmp_path):
    log = str(tmp_path / "calls.log")
    for _ in range(2):
        with BatchExecutor(local_env, cache=True) as ex:
            results = ex.map(fails_on_two, [log] * 4, range(4))
            assert [next(results), next(results)] == [0, 1]
            with pytest.raises(ValueError, match="no 2"):
                next(results)
            failed = ex.submit(fails_on_two, log, 2)
            assert isinstance(failed.exception(timeout=120), ValueError)
            assert not failed.cached
    counts = runs(log)
    assert counts[0] == counts[1] == 1  # cached the second time
    assert counts[2] == 4  # failed: run every time (map and submit, twice)


@pytest.mark.slow
def test_a_changed_function_argument_or_environment_is_another_call(local_env, tmp_path):
    log = str(tmp_path / "calls.log")
    with BatchExecutor(local_env, cache=True) as ex:
        assert ex.submit(counted, log, 1).result(timeout=120) == 10
    with BatchExecutor(local_env, cache=True) as ex:
        same = ex.submit(counted, log, 1)
        other_body = ex.submit(counted_other, log, 1)
        other_argument = ex.submit(counted, log, 2)
        other_environment = ex.with_settings(environment={"MODE": "b"}).submit(counted, log, 1)
        assert [f.result(timeout=120) for f in (same, other_body, other_argument,
                                                 other_environment)] == [10, 11, 20, 10]
        assert [f.cached for f in (same, other_body, other_argument, other_environment)] == \
            [True, False, False, False]
    assert runs(log) == collections.Counter({1: 3, 2: 1})


@pytest.mark.slow
def test_identical_calls_in_flight_run_once(local_env, tmp_path):
    log = str(tmp_path / "calls.log")
    with BatchExecutor(local_env, cache=True) as ex:
        submitted = [ex.submit(counted, log, 7) for _ in range(3)]
        assert list(ex.map(counted, [log] * 5, [1, 1, 2, 1, 2], chunksize=2)) == [10, 10, 20, 10, 20]
        assert [f.result(timeout=120) for f in submitted] == [70] * 3
        assert [f.cached for f in submitted] == [False, True, True]
    assert runs(log) == collections.Counter({7: 1, 1: 1, 2: 1})


@pytest.mark.slow
def test_dry_run_shows_which_calls_would_come_from_the_cache(local_env, tmp_path):
    log = str(tmp_path / "calls.log")
    with BatchExecutor(local_env, cache=True) as ex:
        assert [f.result(timeout=120) for f in ex.map_futures(counted, [log] * 2, range(2))] == [0, 10]
    with BatchExecutor(local_env, cache=True, dry_run=True) as ex:
        futures = ex.map_futures(counted, [log] * 3, range(3))
        errors = [f.exception(timeout=30) for f in futures]
    assert all(isinstance(e, DryRunResult) for e in errors)
    assert [f.cached for f in futures] == [True, True, False]
    assert all("cache" in str(e) for e in errors[:2])
    (request,) = errors[2].requests  # only the third call would be submitted
    assert "arrayProperties" not in request
    assert any("/cache/" in key for key, _ in errors[2].objects)  # with its index object
    assert runs(log) == collections.Counter({0: 1, 1: 1})


@pytest.mark.slow
def test_cleanup_removes_the_index_with_the_runs_it_points_to(local_env, tmp_path):
    log = str(tmp_path / "calls.log")
    with BatchExecutor(local_env, cache=True) as ex:
        assert ex.submit(counted, log, 5).result(timeout=120) == 50
    index = local_env.workdir / "storage" / "cache"
    assert len(list(index.rglob("*.*"))) == 1
    assert remove_finished_runs(local_env, older_than_seconds=0)
    assert list(index.rglob("*.*")) == []
    with BatchExecutor(local_env, cache=True) as ex:
        future = ex.submit(counted, log, 5)
        assert future.result(timeout=120) == 50 and not future.cached
    assert runs(log) == collections.Counter({5: 2})


SCRIPT = textwrap.dedent("""
    import os, sys, time
    from batchfutures import BatchExecutor, LocalEnvironment

    def slow_square(log, x):
        with open(log, "a") as handle:
            handle.write(f"{x}\\n")
        deadline = time.monotonic() + 60
        while x >= 4 and os.path.exists(log + ".hold") and time.monotonic() < deadline:
            time.sleep(0.05)  # the kill lands while these run (the test removes the file after)
        return x * x

    if __name__ == "__main__":
        workdir, log, out = sys.argv[1:4]
        with BatchExecutor(LocalEnvironment(workdir, max_vcpus=2), cache=True) as ex:
            results = list(ex.map(slow_square, [log] * 12, range(12)))
        with open(out, "w") as handle:
            handle.write(repr(results))
""")


@pytest.mark.slow
def test_a_script_killed_mid_map_runs_again_only_what_was_not_stored(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    log, out = str(tmp_path / "calls.log"), tmp_path / "out.txt"
    command = [sys.executable, str(script), str(tmp_path / "work"), log, str(out)]
    hold = tmp_path / "calls.log.hold"  # items from 4 on wait while it exists
    hold.touch()
    first = subprocess.Popen(command, start_new_session=True)
    try:
        # two vCPUs: once 4 and 5 run (and wait), items 0-3 have finished
        while runs(log)[4] == 0 or runs(log)[5] == 0:
            assert first.poll() is None, "the script ended before it was killed"
            time.sleep(0.05)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        hold.unlink()
    before = runs(log)
    assert not out.exists()
    subprocess.run(command, check=True, timeout=600)
    assert out.read_text() == repr([x * x for x in range(12)])
    after = runs(log)
    assert set(after) == set(range(12))
    # the calls that had finished ran once; those in flight at the kill at most twice
    assert all(after[x] == 1 for x in range(4))
    assert all(after[x] <= before[x] + 1 for x in range(12))


def square_logged(x):
    print(f"ran {x}")  # in the job's log: the AWS path has no shared file to count in
    return x * x


@pytest.mark.slow
def test_the_cache_on_the_aws_path(tmp_path_factory, s3_endpoint):
    import boto3
    from s3server import emulator_endpoint, emulator_environment, new_bucket

    bucket = new_bucket()
    with emulator_endpoint(tmp_path_factory.mktemp("aws-emulator"), max_vcpus=2):
        with BatchExecutor(emulator_environment(bucket), cache=True) as ex:
            assert list(ex.map(square_logged, range(5), chunksize=2)) == [x * x for x in range(5)]
            jobs_before = len(ex._session.submitted_jobs)
        with BatchExecutor(emulator_environment(bucket), cache=True) as ex:
            futures = ex.map_futures(square_logged, range(7), chunksize=2)
            assert [f.result(timeout=120) for f in futures] == [x * x for x in range(7)]
            assert [f.cached for f in futures] == [True] * 5 + [False] * 2
            (job,) = ex._session.submitted_jobs  # only items 5 and 6 were sent
    assert jobs_before == 1
    keys = [o["Key"] for o in boto3.client("s3", region_name="us-east-1").list_objects_v2(
        Bucket=bucket)["Contents"]]
    assert sum(k.startswith("batchfutures/cache/") for k in keys) == 2  # one index per job
