"""Warm workers' pure parts: the sealed messages, the failure a dead call gets, how many workers."""

import base64
import os

import pytest

from batchfutures import wire
from batchfutures.errors import (
    HostTerminatedError,
    IntegrityError,
    JobFailedError,
    JobTimeoutError,
    MemoryLimitExceeded,
)
from batchfutures.settings import JobSettings
from batchfutures.signing import Signer
from batchfutures.warmpool import VISIBILITY_TIMEOUT, completions_to_delete, workers_to_start
from batchfutures.warmwire import (
    decode_call,
    decode_completion,
    encode_call,
    encode_completion,
    encode_pointer,
    lost_failure,
    runner_failure,
)

SIGNER = Signer.from_key("k" * 40)
ROOT = "file:///tmp/storage"
POOL = "runs/r1/warm/abcd"


@pytest.mark.parametrize("returncode, timed_out, expected", [
    (137, False, MemoryLimitExceeded),  # a MemoryError in the runner (exit 137)
    (-9, False, MemoryLimitExceeded),  # the kernel's OOM killer (SIGKILL)
    (-9, True, JobTimeoutError),  # the worker killed it past its timeout
    (1, False, JobFailedError),
    (-11, False, JobFailedError),  # a segfault is no memory verdict
])
def test_a_call_whose_process_died_fails_with_the_typed_error(returncode, timed_out, expected):
    error = runner_failure(returncode, timed_out=timed_out, timeout=2.0, worker="job-1",
                           memory_mib=512)
    assert type(error) is expected
    assert error.job_id == "job-1"


def test_a_call_whose_workers_died_fails_as_host_lost():
    error = lost_failure(receives=3, attempts=2)
    assert isinstance(error, HostTerminatedError) and "2 time(s)" in str(error)


@pytest.mark.parametrize("live, outstanding, most, start", [
    (0, 1, 4, 1), (0, 8, 2, 2), (1, 8, 2, 1), (2, 8, 2, 0), (3, 1, 4, 0), (0, 0, 4, 0)])
def test_workers_are_started_for_the_calls_up_to_max_workers(live, outstanding, most, start):
    assert workers_to_start(live, outstanding, most) == start


def test_a_call_message_round_trips_and_binds_its_pool_and_number():
    blob = wire.pack_items([(0, (1, 2), {})])
    sealed = encode_call(SIGNER, ROOT, POOL, 7, "file:///f.pkl", wire.CALLS, 1, blob)
    body = base64.b64encode(sealed).decode()
    head, got = decode_call(SIGNER, ROOT, POOL, body)
    assert head == {"n": 7, "fn": "file:///f.pkl", "enc": wire.CALLS, "items": 1}
    assert got == blob
    for signer, root, pool in [(Signer.from_key("x" * 40), ROOT, POOL),  # another key
                               (SIGNER, "s3://other", POOL),  # another storage
                               (SIGNER, ROOT, "runs/r1/warm/other")]:  # another pool
        with pytest.raises(IntegrityError):
            decode_call(signer, root, pool, body)
    altered = bytearray(sealed)
    altered[-1] ^= 1
    with pytest.raises(IntegrityError):
        decode_call(SIGNER, ROOT, POOL, base64.b64encode(bytes(altered)).decode())
    with pytest.raises(IntegrityError):
        decode_call(SIGNER, ROOT, POOL, "not base64!")


def test_a_pointer_message_names_where_the_large_call_is():
    sealed = encode_pointer(SIGNER, ROOT, POOL, 3, "file:///tmp/storage/runs/r1/warm/abcd/calls/3")
    head, blob = decode_call(SIGNER, ROOT, POOL, base64.b64encode(sealed).decode())
    assert head == {"n": 3, "url": "file:///tmp/storage/runs/r1/warm/abcd/calls/3"} and blob == b""


@pytest.mark.parametrize("size, inline", [(10, True), (200 * 1024, False)])
def test_a_completion_carries_the_sealed_result_when_small(size, inline):
    number, worker, sealed = decode_completion(encode_completion(5, "job-9", b"r" * size))
    assert (number, worker) == (5, "job-9")
    assert (sealed == b"r" * size) if inline else sealed is None


@pytest.mark.parametrize("value, expected", [(None, 0), (0, 0), (2, 2), (0.5, 0.5)])
def test_keepalive_is_a_job_setting(value, expected):
    settings = JobSettings.from_kwargs(keepalive=value)
    assert settings.keepalive == expected
    assert ("keepalive" in settings.as_dict()) == bool(expected)


@pytest.mark.parametrize("value", [-1, "5", float("inf"), True])
def test_a_bad_keepalive_is_refused(value):
    with pytest.raises(Exception, match="keepalive"):
        JobSettings.from_kwargs(keepalive=value)


@pytest.mark.parametrize("returncode, timed_out, receives, attempts, retried", [
    (1, False, 1, 2, True),  # a crash, attempts left: again
    (1, False, 2, 2, False),  # none left
    (-11, False, 1, 3, True),
    (137, False, 1, 3, False),  # out of memory: it would happen again (Batch's rules say EXIT)
    (-9, False, 1, 3, False),
    (-9, True, 1, 3, False),  # timeout: EXIT too
])
def test_a_dead_calls_retry_follows_batchs_retry_rules(returncode, timed_out, receives,
                                                       attempts, retried):
    from batchfutures.warmwire import runner_death_retried

    assert runner_death_retried(returncode, timed_out=timed_out, receives=receives,
                                attempts=attempts) is retried


@pytest.mark.parametrize("config, background", [
    ({"sqs": {"local": "/f"}}, False),  # the emulator's folder: inline
    ({"sqs": {"local": "/f", "latency": 0.01}}, True),  # latency injected
    ({"sqs": {"local": "/f"}, "storage_latency": 0.03}, True),
    ({"sqs": {"region": "us-east-1"}}, True),  # SQS over the network
])
def test_tails_go_to_threads_only_where_requests_take_round_trips(config, background):
    from batchfutures.worker.warm import tails_in_background

    assert tails_in_background(config) is background


def test_the_local_queues_live_in_a_private_memory_folder(tmp_path):
    from batchfutures.warmpool import local_queue_folder

    workdir = tmp_path / "work"
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    chosen = local_queue_folder(workdir, {"XDG_RUNTIME_DIR": str(runtime)},
                                memory_folder=str(tmp_path / "none"))
    assert chosen.parent == runtime / "batchfutures" and chosen.name.startswith("sqs-")
    assert oct(os.stat(chosen.parent).st_mode & 0o777) == "0o700"
    # the same workdir, the same queues: another process of this user finds them
    assert local_queue_folder(workdir, {"XDG_RUNTIME_DIR": str(runtime)},
                              memory_folder=str(tmp_path / "none")) == chosen
    shm = tmp_path / "shm"
    shm.mkdir()
    planted = shm / f"batchfutures-{os.geteuid()}"
    planted.symlink_to(tmp_path)  # someone's link where our folder would be: not followed
    assert local_queue_folder(workdir, {}, memory_folder=str(shm)) == \
        workdir / "emulator" / "sqs"
    planted.unlink()
    assert local_queue_folder(workdir, {}, memory_folder=str(shm)).parent == planted


RUN = "20261206T012345-0123456789"
LONG = "s" * 70  # CloudFormation allows 128 characters, SQS's names 80 with the suffix


def _hash(stack: str) -> str:
    import hashlib

    return hashlib.sha256(stack.encode()).hexdigest()[:8]


@pytest.mark.parametrize("stack, expected", [
    (None, f"batchfutures-warm-{RUN}-abcd1234"),
    ("bf", f"bf-warm-{RUN}-abcd1234"),
    ("s" * 34, "s" * 34 + f"-warm-{RUN}-abcd1234"),  # the longest kept whole
    ("s" * 35, "s" * 25 + f"-{_hash('s' * 35)}-warm-{RUN}-abcd1234"),  # one more: cut, hashed
    (LONG, "s" * 25 + f"-{_hash(LONG)}-warm-{RUN}-abcd1234"),
    ("p" * 127 + "q", "p" * 25 + f"-{_hash('p' * 127 + 'q')}-warm-{RUN}-abcd1234"),
])
def test_queue_names_start_with_the_stack_and_fit_sqs(stack, expected):
    import re

    from batchfutures.warmpool import queue_base

    base = queue_base(stack, RUN, "abcd1234")
    assert base == expected
    for suffix in ("-work", "-done"):
        assert len(base + suffix) <= 80
        assert re.fullmatch(r"[A-Za-z0-9_-]+", base + suffix)
    assert queue_base(stack, RUN, "abcd1234") == base  # deterministic


@pytest.mark.parametrize("stack", [None, "bf", "s" * 34, "s" * 35, LONG, "x" * 128])
def test_cleanup_recognises_the_queues_of_long_stack_names_by_their_prefix(stack):
    """cleanup lists a stack's warm queues by warm_queue_prefix: every name the stack's pools
    make starts with it, and another stack's that begin alike do not."""
    from batchfutures.cleanup import warm_queue_prefix
    from batchfutures.warmpool import queue_base

    prefix = warm_queue_prefix(stack)
    for run, key in ((RUN, "abcd1234"), ("20300101T000000-9999999999", "0000ffff")):
        assert queue_base(stack, run, key).startswith(prefix)
    other = (stack or "batchfutures") + "z"  # same beginning, another stack
    assert not queue_base(other, RUN, "abcd1234").startswith(prefix)


@pytest.mark.parametrize("sizes, parts", [
    ([10] * 3, [[0, 1, 2]]),
    ([10] * 12, [list(range(10)), [10, 11]]),  # 10 entries a request
    ([400_000, 400_000, 400_000], [[0, 1], [2]]),  # and under SQS's 1 MiB a request
    ([240_000] * 5, [[0, 1, 2, 3], [4]]),
])
def test_sends_are_batched_within_sqss_limits(sizes, parts):
    from batchfutures.warmpool import batches_by_size

    assert batches_by_size(sizes) == parts


@pytest.mark.parametrize("handled, received, oldest, delete", [
    (0, False, 0.0, False),  # nothing to delete
    (3, True, 0.01, False),  # more may come: wait for ten
    (10, True, 0.0, True),  # a full DeleteMessageBatch
    (3, False, 0.0, True),  # the long poll came back empty: idle
    (1, True, VISIBILITY_TIMEOUT / 3, True),  # before it could come back
])
def test_settled_completions_are_deleted_ten_at_a_time_or_when_idle(handled, received,
                                                                      oldest, delete):
    assert completions_to_delete(handled, received, oldest) is delete


@pytest.mark.parametrize("spec, storage_latency, in_messages", [
    ({"local": "/f"}, 0, True),  # the emulator's queues: the completion is the record
    ({"local": "/f", "latency": 0.01}, 0, False),  # AWS's latencies injected: as on AWS
    ({"local": "/f"}, 0.03, False),
    ({"region": "us-east-1"}, 0, False),  # SQS: the result object is written first, once
])
def test_small_results_ride_only_in_their_completions_on_the_local_queues(spec,
                                                                          storage_latency,
                                                                          in_messages):
    from batchfutures.warmwire import results_in_messages

    assert results_in_messages(spec, storage_latency) is in_messages
