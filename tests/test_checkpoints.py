"""checkpoint/restored/interrupted inside a call, on real local storage with a real key."""

import os
import signal
import threading

import pytest

from batchfutures import checkpoints, signing
from batchfutures.errors import IntegrityError
from batchfutures.storage import Storage


@pytest.fixture
def job(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    job_url = f"file://{root}/runs/r1/jobs/k1"
    storage = Storage.from_url(job_url, signer=signing.Signer(lambda: b"k" * 32, "test"))
    yield storage, job_url
    checkpoints.end_call()


def test_outside_a_call_checkpoint_does_nothing_and_restored_gives_the_default():
    checkpoints.end_call()
    assert checkpoints.checkpoint({"step": 1}) is False
    assert checkpoints.restored("default") == "default"
    assert checkpoints.attempt() == 1


def test_a_checkpoint_is_read_back_on_the_next_attempt_only_and_replaced_by_a_newer_one(job):
    storage, job_url = job
    checkpoints.begin_call(storage, job_url, 3, "1")
    checkpoints.at_item(1)
    assert checkpoints.restored() is None  # the first attempt: nothing saved yet
    assert checkpoints.checkpoint({"step": 10}) and checkpoints.checkpoint({"step": 20})
    assert checkpoints.restored() is None  # read once per attempt: this attempt's start
    checkpoints.begin_call(storage, job_url, 3, "2")  # the next attempt of the same call
    checkpoints.at_item(1)
    assert checkpoints.restored() == {"step": 20} and checkpoints.attempt() == 2
    checkpoints.at_item(0)  # another item of the child: its own key
    assert checkpoints.restored("none") == "none"
    url = checkpoints.checkpoint_url(job_url, 3, 1)
    assert url.endswith("/runs/r1/jobs/k1/checkpoints/00003.1") and storage.exists(url)


def test_an_unsigned_or_altered_checkpoint_is_refused_before_unpickling(job):
    storage, job_url = job
    url = checkpoints.checkpoint_url(job_url, 0, 0)
    checkpoints.begin_call(storage, job_url, 0, "1")
    checkpoints.checkpoint([1, 2, 3])
    sealed = bytearray(storage.get_bytes(url))
    sealed[-1] ^= 1
    storage.put_bytes(url, bytes(sealed))
    checkpoints.begin_call(storage, job_url, 0, "2")
    with pytest.raises(IntegrityError):
        checkpoints.restored()
    other = Storage.from_url(job_url, signer=signing.Signer(lambda: b"o" * 32, "other"))
    checkpoints.begin_call(other, job_url, 0, "1")
    checkpoints.checkpoint("signed with another key")
    checkpoints.begin_call(storage, job_url, 0, "2")
    with pytest.raises(IntegrityError):
        checkpoints.restored()


def test_sigterm_sets_interrupted_and_the_process_goes_on(job):
    storage, job_url = job
    checkpoints.begin_call(storage, job_url, 0, "1")
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert checkpoints.install_sigterm_handler()
        assert not checkpoints.interrupted()  # the call asked: it handles SIGTERM itself
        os.kill(os.getpid(), signal.SIGTERM)
        assert checkpoints.interrupted()  # the handler ran in this (main) thread
    finally:
        signal.signal(signal.SIGTERM, previous)
        checkpoints._sigterm.clear()
        checkpoints._aware.clear()
    result = []
    worker = threading.Thread(target=lambda: result.append(checkpoints.install_sigterm_handler()))
    worker.start()
    worker.join()
    assert result == [False]  # only the main thread sets signal handlers


def test_a_stopped_attempt_in_a_thread_is_interrupted_too(job):
    storage, job_url = job
    stopped = threading.Event()
    checkpoints.begin_call(storage, job_url, 0, "1", stopping=stopped.is_set)
    assert not checkpoints.interrupted()
    stopped.set()
    assert checkpoints.interrupted()


@pytest.mark.slow  # a real process
def test_a_call_that_never_asked_ends_of_sigterm_as_before(tmp_path):
    """In a real process: SIGTERM with the handler installed and no use of the API ends it."""
    import subprocess
    import sys

    code = ("import os, signal, time\n"
            "from batchfutures import checkpoints\n"
            "checkpoints.install_sigterm_handler()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(30)\n"
            "print('still here')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM and "still here" not in done.stdout


_ITEMS_SCRIPT = """
import os, signal, sys, time
from batchfutures import checkpoints, signing
from batchfutures.storage import Storage
job_url = sys.argv[1]
storage = Storage.from_url(job_url, signer=signing.Signer(lambda: b"k" * 32, "test"))
checkpoints.install_sigterm_handler()
checkpoints.begin_call(storage, job_url, 0, "1")
checkpoints.at_item(0)
checkpoints.checkpoint("item 0 asked")
if sys.argv[2] == "during 0":
    os.kill(os.getpid(), signal.SIGTERM)
    print("item 0 went on", checkpoints.interrupted(), flush=True)
checkpoints.at_item(1)  # an item that never asks
print("item 1 started", flush=True)
if sys.argv[2] == "during 1":
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
print("item 1 outlived SIGTERM", flush=True)
"""


@pytest.mark.slow  # a real process
@pytest.mark.parametrize("when, printed", [
    # an earlier item's checkpoint does not make a later item wait past SIGTERM
    ("during 1", ["item 1 started"]),
    # the checkpointing item goes on; the next item, which never asks, does not start
    ("during 0", ["item 0 went on True"]),
])
def test_each_item_decides_for_itself_what_sigterm_means(tmp_path, when, printed):
    import subprocess
    import sys

    root = tmp_path / "store"
    root.mkdir()
    done = subprocess.run([sys.executable, "-c", _ITEMS_SCRIPT, f"file://{root}/runs/r1/jobs/k1", when],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout.splitlines() == printed
