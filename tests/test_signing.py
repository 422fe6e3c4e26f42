"""Signed payloads (signing.py): nothing a worker or the client unpickles is trusted unsigned.

The pure sign/verify functions first (one flipped byte anywhere is refused), then the key
sources, then real workers (``python -m batchfutures.worker`` processes, local files and moto's
S3) and real jobs on the emulator, each given a stored function, inputs object or result object
replaced by a pickle that would create a marker file when loaded. The marker never appears and
the future raises IntegrityError.
"""

from __future__ import annotations

import logging
import os
import pickle
import stat
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional

import boto3
import pytest
import s3server
from evil_payloads import evil_pickle

from batchfutures import (
    AWSBatchEnvironment,
    BatchExecutor,
    ConfigurationError,
    IntegrityError,
    LocalEnvironment,
    serialization,
    signing,
    wire,
)
from batchfutures.signing import SEAL_MAGIC, SOURCE_VARIABLE, TAG_SIZE, Signer
from batchfutures.storage import Storage

moto_server, aws_env, s3_bucket, s3_root = (
    s3server.moto_server, s3server.aws_env, s3server.s3_bucket, s3server.s3_root)

KEY = b"k" * 32
OTHER_KEY = b"o" * 32
WAIT = 120  # seconds any wait on a real process may take before the test fails


# -- the pure functions -------------------------------------------------------------------------
def test_seal_round_trip_and_every_flipped_byte_is_refused():
    payload = pickle.dumps({"some": "payload", "n": list(range(20))})
    sealed = signing.seal(KEY, "result", "runs/r/jobs/j/results/0", payload)
    assert sealed[:8] == SEAL_MAGIC and len(sealed) == 8 + TAG_SIZE + len(payload)
    assert signing.unseal(KEY, "result", "runs/r/jobs/j/results/0", sealed) == payload
    for position in range(len(sealed)):
        for bit in (0x01, 0x80):
            tampered = bytearray(sealed)
            tampered[position] ^= bit
            with pytest.raises(IntegrityError):
                signing.unseal(KEY, "result", "runs/r/jobs/j/results/0", bytes(tampered))


@pytest.mark.parametrize("change", ["key", "kind", "name", "truncated", "extended", "unsigned",
                                    "empty"])
def test_unseal_refuses_another_key_place_kind_and_unsigned_bytes(change):
    payload = b"\x80\x05payload"
    key, kind, name = KEY, "function", "runs/r/functions/abc.pkl"
    sealed = signing.seal(key, kind, name, payload)
    if change == "key":
        key = OTHER_KEY
    elif change == "kind":
        kind = "result"
    elif change == "name":
        name = "runs/other/functions/abc.pkl"  # a valid object copied to another place
    elif change == "truncated":
        sealed = sealed[:-1]
    elif change == "extended":
        sealed += b"\x00"
    elif change == "unsigned":
        sealed = payload
    elif change == "empty":
        sealed = b""
    with pytest.raises(IntegrityError, match="nothing was unpickled"):
        signing.unseal(key, kind, name, sealed)


def test_mac_fields_are_length_prefixed():
    # moving a byte from one field to the next changes the MAC
    assert signing.mac(KEY, "k", "ab", b"c") != signing.mac(KEY, "k", "a", b"bc")
    assert signing.mac(KEY, "k", "n", b"a", b"b") != signing.mac(KEY, "k", "n", b"ab")
    assert len(signing.mac(KEY, "k", "n")) == TAG_SIZE


def test_signer_repr_and_job_environment_never_hold_the_key(tmp_path):
    signer = Signer.from_key(KEY)
    assert KEY.decode() not in repr(signer) and signer.job_environment() == {SOURCE_VARIABLE: "env"}
    file_signer = Signer.from_key_file(tmp_path / "signing.key", create=True)
    key_text = file_signer.key.hex()
    assert key_text not in repr(file_signer) + str(file_signer.job_environment())
    assert file_signer.job_environment() == {SOURCE_VARIABLE: f"file:{tmp_path / 'signing.key'}"}
    with pytest.raises(ConfigurationError, match="at least 32"):
        assert Signer.from_key(b"short").key


# -- the inputs object: every byte is covered where it matters -----------------------------------
@pytest.mark.parametrize("children", [1, 3])
def test_every_flipped_byte_of_an_inputs_object_is_refused_or_harmless(local, children):
    signed = Storage(local.root_url, signer=Signer.from_key(KEY))
    blobs = [wire.pack_items([(0, (i, "x" * i), {})]) for i in range(children)]
    job = signed.job_url("run1", "job1")
    url = signed.write_inputs(job, {"functions": ["f"]}, blobs)
    original = signed.get_bytes(url)
    header_end = 16 + int.from_bytes(original[8:16], "little")
    table = header_end
    offsets = [int.from_bytes(original[table + 8 * i:table + 8 * i + 8], "little")
               for i in range(children + 1)]
    assert offsets[-1] == len(original)
    # every byte but the zero padding (not read by anyone), and a few padding bytes too
    positions = [p for p in range(len(original)) if p < table + 8 * (children + 1) or p >= offsets[0]]
    positions += list(range(table + 8 * (children + 1), offsets[0], 4099))
    for position in positions:
        tampered = bytearray(original)
        tampered[position] ^= 0x01
        signed.put_bytes(url, bytes(tampered))
        for index in range(children):
            own = position < header_end or offsets[index] <= position < offsets[index + 1] or (
                table + 8 * index <= position < table + 8 * index + 16)
            try:
                _, blob = signed.read_child_inputs(job, index)
            except IntegrityError:
                continue
            # a child whose own bytes were touched never gets through; others read their own blob
            assert not own, f"byte {position} flipped, child {index} was not refused"
            assert blob == blobs[index]
    signed.put_bytes(url, original)
    assert [signed.read_child_inputs(job, i)[1] for i in range(children)] == blobs


def test_inputs_ranges_moved_between_children_or_jobs_are_refused(local):
    signed = Storage(local.root_url, signer=Signer.from_key(KEY))
    blobs = [b"child-zero", b"child-one!"]  # the same length: a swap keeps every offset valid
    job = signed.job_url("run1", "job1")
    url = signed.write_inputs(job, {"functions": ["f"]}, blobs)
    data = signed.get_bytes(url)
    start = len(data) - 2 * (TAG_SIZE + len(blobs[0]))
    middle = start + TAG_SIZE + len(blobs[0])
    swapped = data[:start] + data[middle:] + data[start:middle]
    signed.put_bytes(url, swapped)
    for index in (0, 1):
        with pytest.raises(IntegrityError):
            signed.read_child_inputs(job, index)
    other_job = signed.job_url("run1", "job2")  # a whole valid object copied to another job
    signed.put_bytes(signed.inputs_url(other_job), data)
    with pytest.raises(IntegrityError):
        signed.read_header(other_job)


def test_everything_is_refused_under_another_key(local):
    writer = Storage(local.root_url, signer=Signer.from_key(KEY))
    reader = Storage(local.root_url, signer=Signer.from_key(OTHER_KEY))
    job = writer.job_url("run1", "job1")
    writer.write_inputs(job, {"functions": ["f"]}, [b"a", b"b"])
    function_url = writer.put_function("run1", b"function pickle")
    writer.write_result(job, 0, b"result bytes")
    writer.write_job_pointer("job-id-1", job)
    for read in (lambda: reader.read_header(job), lambda: reader.read_child_inputs(job, 1),
                 lambda: reader.get_function(function_url), lambda: reader.read_result(job, 0),
                 lambda: reader.read_job_pointer("job-id-1")):
        with pytest.raises(IntegrityError):
            read()
    assert writer.read_result(job, 0) == b"result bytes"
    assert writer.read_job_pointer("job-id-1") == job


# -- keys --------------------------------------------------------------------------------------
def test_the_key_file_is_created_0600_once_and_shared(tmp_path):
    path = tmp_path / "work" / "signing.key"
    signers = [Signer.from_key_file(path, create=True) for _ in range(8)]
    keys: List[bytes] = []
    threads = [threading.Thread(target=lambda s=s: keys.append(s.key)) for s in signers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(keys)) == 1 and len(keys[0]) == 32  # created once, whoever came first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["signing.key"]  # no temporary left
    assert Signer.from_key_file(path).key == keys[0]


def test_the_key_file_is_0600_even_under_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        assert Signer.from_key_file(tmp_path / "signing.key", create=True).key
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "signing.key").stat().st_mode) == 0o600


def test_a_key_file_others_can_read_is_refused_and_a_worker_never_creates_one(tmp_path):
    path = tmp_path / "signing.key"
    with pytest.raises(ConfigurationError, match="does not exist"):
        assert Signer.from_key_file(path).key  # create=False: what a worker does
    assert not path.exists()
    assert Signer.from_key_file(path, create=True).key
    path.chmod(0o644)
    with pytest.raises(ConfigurationError, match="chmod 600"):
        assert Signer.from_key_file(path).key


def test_local_environment_keeps_its_key_in_its_workdir(tmp_path, monkeypatch):
    monkeypatch.delenv("BATCHFUTURES_SIGNING_KEY", raising=False)
    env = LocalEnvironment(tmp_path / "work")
    signer = env.storage.signer
    assert signer.job_environment() == {SOURCE_VARIABLE: f"file:{env.workdir / 'signing.key'}"}
    assert signer.key
    assert stat.S_IMODE((env.workdir / "signing.key").stat().st_mode) == 0o600
    monkeypatch.setenv("BATCHFUTURES_SIGNING_KEY", "e" * 40)  # the user's own key wins
    assert LocalEnvironment(tmp_path / "other").storage.signer.key == b"e" * 40


def test_aws_environment_reads_its_key_from_secrets_manager(aws_env, s3_bucket, monkeypatch):
    monkeypatch.delenv("BATCHFUTURES_SIGNING_KEY", raising=False)
    client = boto3.client("secretsmanager", region_name=s3server.REGION)
    arn = client.create_secret(Name=f"bf-key-{uuid.uuid4().hex[:8]}",
                               SecretString="s" * 48)["ARN"]
    env = AWSBatchEnvironment("q", s3_bucket, "d", region_name=s3server.REGION)
    env.signing_secret = arn  # the constructor argument arrives with another branch
    assert env.storage.signer.key == b"s" * 48
    assert env.storage.signer.job_environment() == {SOURCE_VARIABLE: f"secretsmanager:{arn}"}

    missing = AWSBatchEnvironment("q", s3_bucket, "d", region_name=s3server.REGION)
    missing.signing_secret = arn + "-gone"
    with pytest.raises(ConfigurationError, match="cannot read the signing key"):
        missing.storage.put_function("run1", b"payload")
    keyless = AWSBatchEnvironment("q", s3_bucket, "d", region_name=s3server.REGION)
    with pytest.raises(ConfigurationError, match="signing_secret"):
        keyless.storage.put_function("run1", b"payload")
    monkeypatch.setenv("BATCHFUTURES_SIGNING_KEY", "v" * 40)
    from_variable = AWSBatchEnvironment("q", s3_bucket, "d", region_name=s3server.REGION)
    assert from_variable.storage.signer.key == b"v" * 40
    assert from_variable.storage.signer.job_environment() == {SOURCE_VARIABLE: "env"}


# -- real workers on real storage ---------------------------------------------------------------
def make_job(storage: Storage, fn: Callable[..., Any], *args: Any) -> str:
    run_id, job_key = "run-" + uuid.uuid4().hex[:8], uuid.uuid4().hex
    function_url = storage.put_function(run_id, serialization.dumps(fn))
    header: Dict[str, Any] = {"functions": [function_url], "items": 1, "chunksize": 1,
                              "run_id": run_id, "job_key": job_key}
    header.update(serialization.payload_stamp())
    job_url = storage.job_url(run_id, job_key)
    storage.write_inputs(job_url, header, [wire.pack_items([(0, args, {})])])
    return job_url


def run_worker(job_url: str, source: Optional[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "BATCHFUTURES_SIGNING_KEY"}
    env.pop("AWS_BATCH_JOB_ARRAY_INDEX", None)
    if source is None:
        env.pop(SOURCE_VARIABLE, None)
    else:
        env[SOURCE_VARIABLE] = source
    return subprocess.run([sys.executable, "-m", "batchfutures.worker", job_url], env=env,
                          capture_output=True, text=True, timeout=WAIT)


def _by_value() -> Any:
    # defined in a function, so cloudpickle ships them by value: a worker cannot import tests/
    def touch(path: str) -> str:
        with open(path, "w") as handle:
            handle.write("ran")
        return "ran"

    def wait_for_file(path: str) -> str:
        import os
        import time

        deadline = time.monotonic() + 120
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise TimeoutError(path)
            time.sleep(0.02)
        return "released"
    return touch, wait_for_file


touch, wait_for_file = _by_value()


@pytest.fixture
def signed(storage, tmp_path):
    """The storage fixture (local files and moto S3) signing with a key file of this test."""
    key_file = tmp_path / "keys" / "signing.key"
    signer = Signer.from_key_file(key_file, create=True)
    return Storage(storage.root_url, signer=signer), f"file:{key_file}"


def forged(storage: Storage) -> Storage:
    """Who can write the bucket but has not got the key: signs with another one."""
    return Storage(storage.root_url, signer=Signer.from_key(OTHER_KEY))


@pytest.mark.slow
@pytest.mark.parametrize("forgery", ["unsigned", "another key"])
def test_a_worker_refuses_a_replaced_function_and_runs_nothing(signed, tmp_path, forgery):
    storage, source = signed
    marker, ran = tmp_path / "evil-loaded", tmp_path / "ran"
    job = make_job(storage, touch, str(ran))
    function_url = storage.read_header(job)["functions"][0]
    evil = evil_pickle(marker)
    if forgery == "unsigned":
        storage.put_bytes(function_url, evil)
    else:
        storage.put_bytes(function_url, forged(storage).signer.seal(
            "function", storage.name_of(function_url), evil))
    done = run_worker(job, source)
    assert done.returncode == 0, done.stderr
    assert "refusing this job" in done.stderr and "function object" in done.stderr
    assert not marker.exists() and not ran.exists()
    meta, outcomes = wire.unpack_result(storage.read_result(job, 0))
    assert outcomes == [] and "function object" in meta[signing.REFUSED]


@pytest.mark.slow
@pytest.mark.parametrize("forgery", ["unsigned", "another key", "old unsigned format"])
def test_a_worker_refuses_replaced_inputs_and_runs_nothing(signed, tmp_path, forgery):
    storage, source = signed
    marker, ran = tmp_path / "evil-loaded", tmp_path / "ran"
    job = make_job(storage, touch, str(ran))
    header = storage.read_header(job)
    evil = evil_pickle(marker)
    if forgery == "unsigned":
        storage.put_bytes(storage.inputs_url(job), evil)
    elif forgery == "another key":
        forged(storage).write_inputs(job, dict(header), [evil])
    else:  # the unsigned layout of earlier versions, with the evil pickle as child 0's blob
        import json
        import struct

        text = json.dumps(dict(header, children=1)).encode()
        start = 16 + len(text) + 16
        storage.put_bytes(storage.inputs_url(job), b"".join([
            b"BFINPUT2", struct.pack("<Q", len(text)), text,
            struct.pack("<2Q", start, start + len(evil)), evil]))
    done = run_worker(job, source)
    assert done.returncode == 0, done.stderr
    assert "refusing this job" in done.stderr
    assert not marker.exists() and not ran.exists()
    meta, outcomes = wire.unpack_result(storage.read_result(job, 0))
    assert outcomes == [] and meta[signing.REFUSED]


@pytest.mark.slow
def test_a_worker_with_another_key_refuses_and_its_refusal_does_not_verify_either(signed, tmp_path):
    storage, _ = signed
    ran = tmp_path / "ran"
    job = make_job(storage, touch, str(ran))
    other = tmp_path / "other.key"
    done = run_worker(job, f"file:{other}")  # no such file: a worker never makes a key
    assert done.returncode == 1 and "does not exist" in done.stderr and not other.exists()
    assert Signer.from_key_file(other, create=True).key
    done = run_worker(job, f"file:{other}")
    assert done.returncode == 0 and "refusing this job" in done.stderr and not ran.exists()
    with pytest.raises(IntegrityError):  # signed with the worker's key, not the client's
        storage.read_result(job, 0)


@pytest.mark.slow
def test_a_worker_refuses_a_function_of_another_run_and_with_the_right_key_runs(signed, tmp_path):
    storage, source = signed
    ran = tmp_path / "ran"
    job = make_job(storage, touch, str(ran))
    function_url = storage.read_header(job)["functions"][0]
    copied = function_url.replace("/runs/run-", "/runs/copy-")  # a valid object, elsewhere
    storage.put_bytes(copied, storage.get_bytes(function_url))
    with pytest.raises(IntegrityError):
        storage.get_function(copied)
    done = run_worker(job, source)  # the untouched job runs
    assert done.returncode == 0, done.stderr
    assert ran.read_text() == "ran"
    _, outcomes = wire.unpack_result(storage.read_result(job, 0))
    assert wire.outcome_result(outcomes[0]) == (True, "ran")


@pytest.mark.slow
def test_a_worker_reads_its_key_from_secrets_manager(aws_env, s3_root, tmp_path):
    client = boto3.client("secretsmanager", region_name=s3server.REGION)
    arn = client.create_secret(Name=f"bf-key-{uuid.uuid4().hex[:8]}",
                               SecretString="m" * 40)["ARN"]
    storage = Storage(s3_root, signer=Signer.from_key("m" * 40))
    ran = tmp_path / "ran"
    job = make_job(storage, touch, str(ran))
    done = run_worker(job, f"secretsmanager:{arn}")
    assert done.returncode == 0, done.stderr
    assert ran.exists()
    _, outcomes = wire.unpack_result(storage.read_result(job, 0))
    assert wire.outcome_result(outcomes[0]) == (True, "ran")


# -- real jobs on the emulator ------------------------------------------------------------------
def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def held(tmp_path, monkeypatch):
    """An executor on one vCPU whose next job waits RUNNABLE behind a running blocker until
    ``release()``: the window in which someone with write access to storage tampers."""
    monkeypatch.delenv("BATCHFUTURES_SIGNING_KEY", raising=False)
    env = LocalEnvironment(tmp_path / "work", max_vcpus=1)
    executor = BatchExecutor(env)
    gate = tmp_path / "gate"
    blocker = executor.submit(wait_for_file, str(gate))
    until(lambda: blocker.status == "RUNNING", "the blocker to run")

    def release() -> None:
        gate.write_text("go")
        assert blocker.result(timeout=WAIT) == "released"
    yield env, executor, release
    gate.write_text("go")
    executor.shutdown(wait=True)
    env.emulator.close()


def submitted_job_url(env: LocalEnvironment, future: Any) -> str:
    until(lambda: future.job_id is not None, "the job to be submitted")
    (description,) = env.batch.describe_jobs(jobs=[future.job_id.split(":")[0]])["jobs"]
    assert description["status"] in ("SUBMITTED", "PENDING", "RUNNABLE")  # still held
    return description["container"]["command"][-1]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["function", "inputs", "result"])
@pytest.mark.parametrize("forgery", ["unsigned", "another key"])
def test_a_replaced_object_on_the_emulator_never_loads_and_the_future_raises(held, tmp_path,
                                                                            target, forgery):
    env, executor, release = held
    storage = env.storage
    marker, ran = tmp_path / "evil-loaded", tmp_path / "ran"
    evil = evil_pickle(marker)
    future = executor.submit(touch, str(ran))
    job = submitted_job_url(env, future)
    if target == "function":
        url = storage.read_header(job)["functions"][0]
        storage.put_bytes(url, evil if forgery == "unsigned" else forged(storage).signer.seal(
            "function", storage.name_of(url), evil))
    elif target == "inputs":
        if forgery == "unsigned":
            storage.put_bytes(storage.inputs_url(job), evil)
        else:
            forged(storage).write_inputs(job, storage.read_header(job), [evil])
    else:  # a result planted before the worker writes one: the worker keeps it, runs nothing
        result = wire.pack_result([evil], {"attempt": "1"})
        url = storage.result_url(job, 0)
        storage.put_bytes(url, result if forgery == "unsigned" else forged(storage).signer.seal(
            "result", storage.name_of(url), result))
    release()
    error = future.exception(timeout=WAIT)
    assert isinstance(error, IntegrityError), repr(error)
    assert future.status == "SUCCEEDED"  # the container refused cleanly; nothing ran
    assert not marker.exists() and not ran.exists()
    log = future.log()
    if target == "result":
        assert "already written" in log
    else:
        assert "refusing this job (nothing unverified was unpickled, nothing ran)" in log


@pytest.mark.slow
def test_a_result_altered_after_the_job_finished_is_refused_on_attach(tmp_path, monkeypatch):
    monkeypatch.delenv("BATCHFUTURES_SIGNING_KEY", raising=False)
    marker = tmp_path / "evil-loaded"
    env = LocalEnvironment(tmp_path / "work", max_vcpus=1)
    try:
        with BatchExecutor(env) as executor:
            future = executor.submit(pow, 2, 10)
            assert future.result(timeout=WAIT) == 1024
            job_id = future.job_id
        job = env.storage.read_job_pointer(job_id)
        sealed = bytearray(env.storage.get_bytes(env.storage.result_url(job, 0)))
        evil = wire.pack_result([evil_pickle(marker)], {})
        # keep its valid tag, swap the payload: exactly what an attacker can do without the key
        env.storage.put_bytes(env.storage.result_url(job, 0), bytes(sealed[:8 + TAG_SIZE]) + evil)
        with BatchExecutor(LocalEnvironment(tmp_path / "work", max_vcpus=1)) as again:
            error = again.attach(job_id).exception(timeout=WAIT)
        assert isinstance(error, IntegrityError) and not marker.exists()
    finally:
        env.emulator.close()


@pytest.mark.slow
def test_no_log_line_holds_a_planted_secret_or_the_key(tmp_path, monkeypatch, caplog):
    planted_key = "planted-signing-key-" + uuid.uuid4().hex
    planted_client = "planted-client-value-" + uuid.uuid4().hex
    planted_job = "planted-job-value-" + uuid.uuid4().hex
    monkeypatch.setenv("BATCHFUTURES_SIGNING_KEY", planted_key)
    monkeypatch.setenv("BATCHFUTURES_TEST_PLANTED", planted_client)
    monkeypatch.setenv("BATCHFUTURES_LOG_LEVEL", "DEBUG")  # the workers log everything they can
    caplog.set_level(logging.DEBUG)
    marker = tmp_path / "evil-loaded"

    def fail(x):
        raise ValueError("failed on purpose", x)

    env = LocalEnvironment(tmp_path / "work", max_vcpus=1)
    try:
        executor = BatchExecutor(env, environment={"PLANTED_SETTING": planted_job})
        gate = tmp_path / "gate"
        futures = [executor.submit(wait_for_file, str(gate))]
        until(lambda: futures[0].status == "RUNNING", "the first job to run")
        futures += [executor.submit(pow, 3, 3), executor.submit(fail, 1)]
        tampered = executor.with_settings(tags={"which": "tampered"}).submit(
            touch, str(tmp_path / "ran"))
        job = submitted_job_url(env, tampered)
        forged(env.storage).write_inputs(job, env.storage.read_header(job), [evil_pickle(marker)])
        gate.write_text("go")
        assert futures[1].result(timeout=WAIT) == 27
        assert isinstance(futures[2].exception(timeout=WAIT), ValueError)
        assert isinstance(tampered.exception(timeout=WAIT), IntegrityError)
        assert not marker.exists()
        executor.shutdown(wait=True)
        logs = [future.log() for future in futures + [tampered]]
        assert "refusing this job" in logs[-1]
        # the job was told where the key is, never the key
        (description,) = env.batch.describe_jobs(jobs=[tampered.job_id])["jobs"]
        variables = {v["name"]: v["value"] for v in description["container"]["environment"]}
        assert variables[SOURCE_VARIABLE] == "env"
        assert planted_key not in str(description)
    finally:
        env.emulator.close()
    lines = caplog.text + "\n".join(logs)
    for planted in (planted_key, planted_client, planted_job):
        assert planted not in lines


def test_an_aws_environment_without_a_key_says_which_variable_step_3_exports(monkeypatch):
    from batchfutures.signing import aws_signer

    monkeypatch.delenv("BATCHFUTURES_SIGNING_KEY", raising=False)
    env = AWSBatchEnvironment(job_queue="q", io_bucket="bucket-without-key",
                              job_definition="d", region_name="us-east-1")
    with pytest.raises(ConfigurationError, match="export BATCHFUTURES_SIGNING_SECRET=") as missing:
        aws_signer(env).key()
    assert "docs/aws.md, step 3" in str(missing.value)
