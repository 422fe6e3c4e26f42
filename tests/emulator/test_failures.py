"""Limits and failures, with Batch's own strings: memory, timeout, exit codes, signals."""

import pytest
from emulator_harness import py

OOM = "OutOfMemoryError: Container killed due to memory usage"
EXITED = "Essential container in task exited"
TIMEOUT = "Job attempt duration exceeded timeout"
MiB = 1024 * 1024

# What the worker does: an allocation over the limit raises MemoryError at once (RLIMIT_DATA, the
# fallback) and the worker turns it into exit status 137; in a cgroup the kernel kills it first.
ALLOCATE = ("import sys\n"
            "try:\n"
            "    len(bytearray({n}))\n"
            "except MemoryError:\n"
            "    sys.exit(137)\n")

# Memory RLIMIT_DATA does not count (shared mappings), held and growing until killed.
GROW_SHARED = ("import mmap, time\n"
               "held = []\n"
               "while True:\n"
               "    block = mmap.mmap(-1, 16 * 1024 * 1024)\n"
               "    block.write(b'x' * len(block))\n"
               "    held.append(block)\n"
               "    time.sleep(0.005)\n")

# A tree of processes each under the limit, together over it; the main process fails when one
# of its children was killed (a kernel OOM kill in a cgroup kills one process, not the tree).
GROW_TREE = ("import subprocess, sys\n"
             "child = ('import time\\nheld = []\\n'\n"
             "         'for _ in range(200):\\n'\n"
             "         '    held.append(bytearray(8 * 1024 * 1024))\\n'\n"
             "         '    time.sleep(0.01)\\n'\n"
             "         '    held = held[:22]\\n')\n"
             "procs = [subprocess.Popen([sys.executable, '-S', '-c', child]) for _ in range(3)]\n"
             "sys.exit(1 if any([p.wait() for p in procs]) else 0)\n")

ISOLATIONS = ["auto", "rlimit"]  # auto: cgroups on a machine where they can be made


@pytest.fixture(params=ISOLATIONS)
def isolated(request, make_emulator):
    return make_emulator(isolation=request.param)


def assert_oom(detail, memory):
    assert detail["status"] == "FAILED"
    [attempt] = detail["attempts"]
    assert attempt["container"]["exitCode"] == 137
    assert attempt["container"]["reason"] == OOM
    assert attempt["statusReason"] == EXITED
    assert detail["container"]["exitCode"] == 137
    assert detail["container"]["reason"] == OOM
    assert detail["statusReason"] == EXITED
    assert {"type": "MEMORY", "value": str(memory)} in detail["container"]["resourceRequirements"]


@pytest.mark.slow
def test_an_allocation_over_the_limit_is_out_of_memory(isolated):
    detail = isolated.run(py(ALLOCATE.format(n=600 * MiB)), memory=256)
    assert_oom(detail, 256)


@pytest.mark.slow
def test_memory_held_and_growing_is_killed(isolated):
    detail = isolated.run(py(GROW_SHARED), memory=128)
    assert_oom(detail, 128)


@pytest.mark.slow
def test_the_whole_process_tree_counts(isolated):
    # each child stays near 176 MiB (under 256 alone); three of them are over
    detail = isolated.run(py(GROW_TREE), memory=256)
    assert detail["status"] == "FAILED"
    [attempt] = detail["attempts"]
    assert attempt["container"]["reason"] == OOM
    assert attempt["container"]["exitCode"] != 0


@pytest.mark.slow
def test_a_job_that_stays_under_its_memory_is_not_killed(isolated):
    code = ("import time\n"
            "held = bytearray(160 * 1024 * 1024)\n"
            "for i in range(0, len(held), 4096): held[i] = 1\n"
            "time.sleep(0.3)\n"
            "print('kept', len(held) // (1024 * 1024))\n")
    detail = isolated.run(py(code), memory=256)
    assert detail["status"] == "SUCCEEDED", detail
    assert isolated.log_lines(detail) == ["kept 160"]


@pytest.mark.slow
def test_a_job_over_its_timeout_is_stopped_and_not_retried(emu):
    detail = emu.run(py("import time; time.sleep(60)"), timeout={"attemptDurationSeconds": 1},
                     retryStrategy={"attempts": 3})
    assert detail["status"] == "FAILED"
    assert detail["statusReason"] == TIMEOUT
    [attempt] = detail["attempts"]  # Batch never retries a timed-out attempt
    assert attempt["statusReason"] == TIMEOUT
    assert "reason" not in attempt["container"]
    assert detail["timeout"] == {"attemptDurationSeconds": 1}


@pytest.mark.slow
def test_the_timeout_counts_per_attempt_from_running(emu):
    # attempt 1 fails fast; attempt 2 runs well within its own timeout
    code = "import os, sys; sys.exit(3 if os.environ['AWS_BATCH_JOB_ATTEMPT'] == '1' else 0)"
    detail = emu.run(py(code), timeout={"attemptDurationSeconds": 30}, retryStrategy={"attempts": 2})
    assert detail["status"] == "SUCCEEDED"
    assert [a["container"]["exitCode"] for a in detail["attempts"]] == [3, 0]


@pytest.mark.slow
@pytest.mark.parametrize("code", [1, 2, 42, 255])
def test_a_non_zero_exit_fails_with_its_code(emu, code):
    detail = emu.run(py(f"raise SystemExit({code})"))
    assert detail["status"] == "FAILED"
    assert detail["statusReason"] == EXITED
    [attempt] = detail["attempts"]
    assert attempt["container"]["exitCode"] == code
    assert attempt["statusReason"] == EXITED
    assert "reason" not in attempt["container"]


@pytest.mark.slow
@pytest.mark.parametrize("signal_number", [15, 6, 11])
def test_death_by_signal_is_128_plus_n(emu, signal_number):
    detail = emu.run(py(f"import os; os.kill(os.getpid(), {signal_number})"))
    assert detail["status"] == "FAILED"
    [attempt] = detail["attempts"]
    assert attempt["container"]["exitCode"] == 128 + signal_number
    assert attempt["statusReason"] == EXITED
    assert "reason" not in attempt["container"]


@pytest.mark.slow
def test_a_sigkill_under_the_limit_is_exit_137_without_an_out_of_memory_reason(isolated):
    # as on Batch: exit status 137 is not an OOM kill; only hitting the limit is
    detail = isolated.run(py("import os; os.kill(os.getpid(), 9)"), memory=512)
    assert detail["status"] == "FAILED"
    [attempt] = detail["attempts"]
    assert attempt["container"]["exitCode"] == 137
    assert "reason" not in attempt["container"]
    assert detail["statusReason"] == EXITED


@pytest.mark.slow
def test_exit_status_137_is_out_of_memory_only_where_the_worker_says_so(isolated):
    # In the RLIMIT fallback the worker exits 137 on MemoryError: that is its OOM report. In a
    # cgroup the kernel's own count decides, and a plain exit(137) is just an exit status.
    detail = isolated.run(py("raise SystemExit(137)"), memory=512)
    [attempt] = detail["attempts"]
    assert attempt["container"]["exitCode"] == 137
    if isolated.cgroups is None:
        assert attempt["container"]["reason"] == OOM
    else:
        assert "reason" not in attempt["container"]


@pytest.mark.slow
def test_limits_hold_without_setpriv_too(make_emulator, monkeypatch):
    # without util-linux's setpriv the launcher sets the limits between fork and exec instead
    from batchfutures.emulator.runtime import launcher

    monkeypatch.setattr(launcher, "_setpriv_path", None)
    emu = make_emulator(isolation="rlimit")
    assert_oom(emu.run(py(ALLOCATE.format(n=600 * MiB)), memory=256), 256)
    assert emu.run(py("print('fine')"), memory=256)["status"] == "SUCCEEDED"
