"""Issue 28 point 4: a kernel OOM kill on AL2023 (cgroup v2, no OutOfMemoryError reason) is typed.

The worker runs the attempt in one forked child (worker/oomguard.py); when the kernel kills the
child for memory, the worker writes the out-of-memory marker and exits 137, so the client's
marker path makes it a MemoryLimitExceeded. Table tests of the decision and of the cgroup files
read; then real workers in a real memory cgroup (root on Linux), and a real job on the emulator.
"""

from __future__ import annotations

import os
import signal

import pytest
from test_worker import make_job, results, run_worker

from batchfutures import BatchExecutor, MemoryLimitExceeded
from batchfutures.worker import oomguard
from batchfutures.worker.oomguard import parse_oom_kills, verdict

KILL, TERM, SEGV = signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV


def _never_asked():
    raise AssertionError("the result is looked for only after an OOM kill")


# -- how the worker ends, from how its child ended --------------------------------------------------
@pytest.mark.parametrize("exit_status, signal_number, before, after, written, expected", [
    (0, None, 0, 0, _never_asked, ("exit", 0)),
    (1, None, 0, 0, _never_asked, ("exit", 1)),              # storage unreachable: unchanged
    (137, None, 0, 0, _never_asked, ("exit", 137)),          # the child's MemoryError: its marker
    (3, None, 0, 1, _never_asked, ("exit", 3)),              # os._exit(3) in a call: unchanged
    (None, KILL, 0, 1, lambda: False, ("oom", 137)),         # the kernel's OOM kill
    (None, KILL, 4, 5, lambda: False, ("oom", 137)),         # counted since an earlier kill
    (None, KILL, None, None, lambda: False, ("oom", 137)),   # no count to read: a SIGKILL is one
    (None, KILL, 0, None, lambda: False, ("oom", 137)),
    (None, KILL, 0, 0, _never_asked, ("signal", KILL)),      # a SIGKILL no OOM kill counted
    (None, KILL, 2, 2, _never_asked, ("signal", KILL)),
    (None, KILL, 0, 1, lambda: True, ("signal", KILL)),      # its result written: no marker
    (None, TERM, 0, 1, _never_asked, ("signal", TERM)),      # docker stop's SIGTERM: unchanged
    (None, SEGV, None, None, _never_asked, ("signal", SEGV)),  # a crash: 139 as before
])
def test_the_worker_ends_as_its_child_did_unless_the_kernel_killed_it_for_memory(
        exit_status, signal_number, before, after, written, expected):
    assert verdict(exit_status, signal_number, before, after, written) == expected


@pytest.mark.parametrize("text, count", [
    ("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n", 2),       # v2 memory.events
    ("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n", 7),                      # v1 memory.oom_control
    ("oom_kill_disable 0\nunder_oom 0\n", None),                               # v1 before 4.13
    ("", None),
])
def test_the_oom_kill_count_is_the_oom_kill_line(text, count):
    assert parse_oom_kills(text) == count


@pytest.mark.parametrize("cgroup, files", [
    ("0::/\n", ["R/memory.events", "R/memory.events"]),                      # v2, a container's
    ("0::/system.slice/x.scope\n", ["R/system.slice/x.scope/memory.events", "R/memory.events"]),
    ("4:memory:/ecs/task/c1\n0::/\n",                                         # v1 (and hybrid)
     ["R/memory/ecs/task/c1/memory.oom_control", "R/memory/memory.oom_control",
      "R/memory.events", "R/memory.events"]),
    ("5:cpu,cpuacct:/a\n", []),
])
def test_the_counts_are_looked_for_in_the_processs_own_cgroup_first(cgroup, files):
    assert list(oomguard._event_files(cgroup, "R")) == files


ECS = {"ECS_CONTAINER_METADATA_URI_V4": "http://169.254.170.2/v4/abc"}


@pytest.mark.parametrize("argv, environ, forks", [
    (["s3://b/runs/a/jobs/b"], ECS, True),                            # on Batch (ECS, Fargate)
    (["s3://b/runs/a/jobs/b"], {"ECS_CONTAINER_METADATA_URI": "http://x/v3"}, True),
    (["file:///r/runs/a/jobs/b"], {}, False),                         # the emulator: its reason
    (["file:///r/runs/a/jobs/b"], {"BATCHFUTURES_OOM_GUARD": "auto"}, False),
    (["s3://b/runs/a/jobs/b"], dict(ECS, BATCHFUTURES_OOM_GUARD="0"), False),
    (["s3://b/runs/a/jobs/b"], dict(ECS, BATCHFUTURES_OOM_GUARD="off"), False),
    (["file:///r/runs/a/jobs/b"], {"BATCHFUTURES_OOM_GUARD": "1"}, True),
    ([], ECS, False),                     # the usage error: main says it, here
    (["a", "b"], ECS, False),
])
def test_the_attempt_forks_once_unless_told_not_to(argv, environ, forks):
    assert oomguard.fork_available(argv, environ, threads=1) == forks
    assert not oomguard.fork_available(argv, environ, threads=2)  # never a threaded process


# -- real workers in a real memory cgroup ------------------------------------------------------------
def allocate(mib):
    return len(bytearray(mib * 1024 * 1024)) // (1024 * 1024)


def kill_myself():
    os.kill(os.getpid(), signal.SIGKILL)


def exit_three():
    os._exit(3)


@pytest.fixture
def memory_cgroup():
    """A cgroup of 128 MiB (the emulator's code makes it); the worker joins it before it runs."""
    from batchfutures.emulator.runtime import cgroups

    found = cgroups.detect()
    if found is None:
        pytest.skip("needs cgroups (root on Linux)")
    group = found.create(128, 1.0)

    def join():
        for procs in group.procs:
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))

    yield join
    group.remove()


def _run(job, join, **env):
    env.setdefault("BATCHFUTURES_OOM_GUARD", "1")  # as in an ECS container
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        return run_worker(job, preexec=join)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.mark.slow
def test_a_kernel_oom_kill_of_the_calls_is_recorded_and_exits_137(local, memory_cgroup):
    job = make_job(local, [[(allocate, (400,), {})]])
    done = _run(job, memory_cgroup)
    assert done.returncode == 137, done.stderr  # an exit, not a death: the worker survived
    assert "killed for memory" in done.stderr
    assert local.list_oom_markers(job) == {0} and local.read_oom_marker(job, 0)["attempt"] == "1"
    assert local.read_result(job, 0) is None


@pytest.mark.slow
def test_without_the_fork_the_kill_is_a_bare_sigkill(local, memory_cgroup):
    # what AL2023 showed before: the worker itself killed, nothing recorded
    job = make_job(local, [[(allocate, (400,), {})]])
    done = _run(job, memory_cgroup, BATCHFUTURES_OOM_GUARD="0")
    assert done.returncode == -signal.SIGKILL
    assert local.list_oom_markers(job) == set()


@pytest.mark.slow
def test_a_sigkill_the_kernel_did_not_count_is_no_oom(local, memory_cgroup):
    job = make_job(local, [[(kill_myself, (), {})]])
    done = _run(job, memory_cgroup)
    assert done.returncode == -signal.SIGKILL  # the worker died of it too, as before
    assert local.list_oom_markers(job) == set()


@pytest.mark.slow
def test_ordinary_ends_keep_their_exit_status(local, memory_cgroup):
    job = make_job(local, [[(exit_three, (), {})]])
    assert _run(job, memory_cgroup).returncode == 3
    fine = make_job(local, [[(allocate, (16,), {}), (abs, (-2,), {})]])
    done = _run(fine, memory_cgroup)
    assert done.returncode == 0, done.stderr
    assert results(local, fine)[1] == [(True, 16), (True, 2)]
    assert local.list_oom_markers(fine) == set()


def allocate_on_the_second(position, mib):
    return allocate(mib) if position == 1 else position


def kill_my_process_on_the_second(position):
    if position == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return position


@pytest.mark.slow
def test_on_the_inner_pool_the_kernels_kill_is_recorded_and_another_sigkill_is_not(local,
                                                                                  memory_cgroup):
    # a child of 2 vCPUs runs its items on 2 forked processes (pool.py): the same rule there
    oom = make_job(local, [[(allocate_on_the_second, (i, 400), {}) for i in range(2)]])
    done = _run(oom, memory_cgroup, BATCHFUTURES_VCPUS="2")
    assert done.returncode == 137, done.stderr
    assert local.list_oom_markers(oom) == {0} and local.read_result(oom, 0) is None
    killed = make_job(local, [[(kill_my_process_on_the_second, (i,), {}) for i in range(2)]])
    done = _run(killed, memory_cgroup, BATCHFUTURES_VCPUS="2")
    assert done.returncode == 137, done.stderr  # the sub-process's status, as before...
    assert local.list_oom_markers(killed) == set()  # ...but the count says it was no OOM kill


def wait_for_sigterm(ready, handle):
    import signal as signals
    import time

    got = []
    if handle:  # a call that cleans up on docker stop's SIGTERM
        signals.signal(signals.SIGTERM, lambda *_: got.append(1))
    with open(ready, "w") as flag:
        flag.write("ready")
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    return "got SIGTERM" if got else "no SIGTERM"


@pytest.mark.slow
@pytest.mark.parametrize("handle", [True, False])
def test_docker_stops_sigterm_reaches_the_calls(local, tmp_path, handle):
    import subprocess
    import sys
    import time

    ready = tmp_path / "ready"
    job = make_job(local, [[(wait_for_sigterm, (str(ready), handle), {})]])
    env = dict(os.environ, AWS_BATCH_JOB_ARRAY_INDEX="0", AWS_BATCH_JOB_ATTEMPT="1",
               BATCHFUTURES_OOM_GUARD="1")
    worker = subprocess.Popen([sys.executable, "-m", "batchfutures.worker", job], env=env,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not ready.exists() and worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.send_signal(signal.SIGTERM)  # to the container's main process, as docker stop does
    _, stderr = worker.communicate(timeout=60)
    if handle:  # the call's handler ran in the child, which then finished and wrote its result
        assert worker.returncode == 0, stderr
        assert results(local, job)[1] == [(True, "got SIGTERM")]
    else:  # the default: the call's process ends of it, and the worker of the same signal
        assert worker.returncode == -signal.SIGTERM
        assert local.read_result(job, 0) is None and local.list_oom_markers(job) == set()


# -- a real job on the emulator ----------------------------------------------------------------------
@pytest.mark.slow
def test_on_the_emulator_the_kernels_kill_of_the_calls_is_typed_and_marked(local_env):
    from batchfutures.emulator.runtime import cgroups

    if cgroups.detect() is None:
        pytest.skip("needs cgroups (root on Linux): under RLIMIT the allocation is a MemoryError")
    with BatchExecutor(local_env, memory=256) as ex:
        guarded = ex.with_settings(environment={"BATCHFUTURES_OOM_GUARD": "1"})  # as on ECS
        future = guarded.submit(allocate, 600)
        error = future.exception(timeout=120)
        retried = guarded.with_settings(retry_on_oom=2).submit(allocate, 300)
        assert retried.result(timeout=180) == 300
    assert type(error) is MemoryLimitExceeded and error.memory_mib == 256
    # the emulator's own account (the cgroup's count) still gives the reason...
    [description] = local_env.batch.describe_jobs(jobs=[future.job_id])["jobs"]
    assert description["attempts"][-1]["container"]["reason"].startswith("OutOfMemoryError")
    # ...and the worker survived its child's kill and recorded it, as it does on AL2023
    storage = local_env.storage
    job_url = storage.read_job_pointer(future.job_id)
    assert storage.list_oom_markers(job_url) == {0}


@pytest.mark.slow
def test_on_the_aws_path_the_worker_records_the_kill_in_the_bucket(tmp_path, s3_endpoint):
    # the emulator's endpoint as Batch and moto's S3: the worker's parent writes the marker
    # through s3fs after its child's kill, and retry_on_oom retries from it
    from s3server import emulator_endpoint, emulator_environment, new_bucket
    from test_oom_marker import _oom_keys

    from batchfutures.emulator.runtime import cgroups

    if cgroups.detect() is None:
        pytest.skip("needs cgroups (root on Linux)")
    with emulator_endpoint(tmp_path / "emulator", max_vcpus=2, isolation="cgroups"):
        env = emulator_environment(new_bucket())
        with BatchExecutor(env, memory=256) as ex:
            guarded = ex.with_settings(environment={"BATCHFUTURES_OOM_GUARD": "1"})
            error = guarded.submit(allocate, 600).exception(timeout=180)
            retried = guarded.with_settings(retry_on_oom=2).submit(allocate, 300)
            assert retried.result(timeout=180) == 300
    assert type(error) is MemoryLimitExceeded and error.memory_mib == 256
    assert len(_oom_keys(env.io_bucket)) >= 2  # the failed call's and the retried call's first try
