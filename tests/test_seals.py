"""Every seal before any code, the storage root in every MAC, and a size limit on every read.

Issue 19, points 3 and 4 ("Secure by default"). Each finding is reproduced as the attack it
describes, on real parts: ``python -m batchfutures.worker`` processes and jobs on the local
emulator (the inner pool with vcpus=2 and BATCHFUTURES_VCPUS=2, as benchmarks/bench_local.py
case (d), and the sequential path), over local files and moto's S3.

- A stored function, initializer, initargs or inputs object replaced by one that would leave a
  marker file when loaded: the worker refuses the job before the initializer runs (it would
  leave a marker too), on both paths, and every future raises IntegrityError.
- A job copied whole, byte for byte, to another prefix or folder under the same key: nothing of
  it verifies there.
- An object over the size limit: refused with ObjectTooLargeError (size and limit in it) before
  any of its body is read.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest
import s3server
from evil_payloads import evil_pickle

from batchfutures import (
    BatchExecutor,
    ConfigurationError,
    IntegrityError,
    LocalEnvironment,
    serialization,
    signing,
    wire,
)
from batchfutures import storage as storage_module
from batchfutures.signing import SOURCE_VARIABLE, Signer
from batchfutures.storage import SIZE_VARIABLE, ObjectTooLargeError, Storage

moto_server, aws_env, s3_bucket, s3_root = (
    s3server.moto_server, s3server.aws_env, s3server.s3_bucket, s3server.s3_root)

OTHER_KEY = b"o" * 32
WAIT = 120  # seconds any wait on a real process may take before the test fails


def _by_value() -> Any:
    # defined in a function, so cloudpickle ships them by value: a worker cannot import tests/
    def init(folder: str) -> None:  # the executor's initializer: leaves a marker when it runs
        import os

        open(os.path.join(folder, f"initializer-ran-{os.getpid()}"), "w").close()

    def make_work(folder: str) -> Callable[[int], int]:
        def work(x: int) -> int:
            import os

            open(os.path.join(folder, f"item-ran-{x}"), "w").close()
            return os.getpid()
        return work

    def wait_for_file(path: str) -> str:
        import os
        import time

        deadline = time.monotonic() + 120
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise TimeoutError(path)
            time.sleep(0.02)
        return "released"
    return init, make_work, wait_for_file


init, make_work, wait_for_file = _by_value()


def forger(storage: Storage) -> Storage:
    """Who can write the bucket but has not got the key: signs with another one."""
    return Storage(storage.root_url, signer=Signer.from_key(OTHER_KEY))


def markers(folder: Path) -> List[str]:
    return sorted(os.listdir(folder))


# -- every seal before any code: real workers ---------------------------------------------------
def make_job(storage: Storage, folder: Path, items: int, *, legacy: bool = False) -> str:
    """A job of ``items`` calls of work in one child, with an executor initializer: in its
    own object (header "initializer", as written before the initializer travelled in each
    function's pickle) when ``legacy``, else in the function's pickle with the initargs apart
    (header "initargs")."""
    run_id, job_key = "run-" + uuid.uuid4().hex[:8], uuid.uuid4().hex
    work = make_work(str(folder))
    header: Dict[str, Any] = {"items": items, "chunksize": items, "run_id": run_id,
                              "job_key": job_key}
    if legacy:
        function = serialization.dumps(work)
        header["initializer"] = storage.put_function(
            run_id, serialization.dumps((init, (str(folder),))))
    else:
        function = serialization.dumps_function(work, init)
        header["initargs"] = storage.put_function(run_id, serialization.dumps((str(folder),)))
    header["functions"] = [storage.put_function(run_id, function)]
    header.update(serialization.payload_stamp())
    job_url = storage.job_url(run_id, job_key)
    storage.write_inputs(job_url, header,
                         [wire.pack_items([(0, (x,), {}) for x in range(items)])])
    return job_url


def run_worker(job_url: str, source: str, vcpus: Optional[int],
               extra: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("BATCHFUTURES_SIGNING_KEY", "AWS_BATCH_JOB_ARRAY_INDEX", "BATCHFUTURES_VCPUS")}
    env[SOURCE_VARIABLE] = source
    if vcpus is not None:
        env["BATCHFUTURES_VCPUS"] = str(vcpus)
    env.update(extra or {})
    return subprocess.run([sys.executable, "-m", "batchfutures.worker", job_url], env=env,
                          capture_output=True, text=True, timeout=WAIT)


@pytest.fixture
def signed(storage: Storage, tmp_path: Path) -> Tuple[Storage, str]:
    """The storage fixture (local files and moto S3) signing with a key file of this test."""
    key_file = tmp_path / "keys" / "signing.key"
    return Storage(storage.root_url, signer=Signer.from_key_file(key_file, create=True)), \
        f"file:{key_file}"


PATHS = {"sequential": None, "inner pool": 2}


@pytest.mark.slow
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("legacy", [False, True], ids=["initargs", "legacy initializer"])
def test_untampered_jobs_take_the_path_under_test(signed, tmp_path, path, legacy):
    # the control of the attacks below: the same jobs, untouched, run on the path named
    storage, source = signed
    folder = tmp_path / "markers"
    folder.mkdir()
    job = make_job(storage, folder, 4, legacy=legacy)
    done = run_worker(job, source, PATHS[path])
    assert done.returncode == 0, done.stderr
    meta, outcomes = wire.unpack_result(storage.read_result(job, 0))
    assert signing.REFUSED not in meta
    pids = {wire.decode_outcome(outcome) for outcome in outcomes}
    ran = markers(folder)
    assert [name for name in ran if name.startswith("item-ran-")] == [
        f"item-ran-{x}" for x in range(4)]
    initialized = {int(name.rpartition("-")[2]) for name in ran
                   if name.startswith("initializer-ran-")}
    assert initialized == pids  # the initializer ran in every process that ran items
    assert len(pids) == (2 if path == "inner pool" else 1)


@pytest.mark.slow
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("target, legacy", [
    ("function", False), ("initargs", False), ("inputs", False),
    # the initializer in its own object: before, it ran before the function's seal was checked
    ("function", True), ("initializer", True)])
@pytest.mark.parametrize("forgery", ["unsigned", "another key"])
def test_a_tampered_payload_is_refused_before_the_initializer_or_anything_runs(
        signed, tmp_path, path, target, legacy, forgery):
    storage, source = signed
    folder, marker = tmp_path / "markers", tmp_path / "evil-loaded"
    folder.mkdir()
    job = make_job(storage, folder, 4, legacy=legacy)
    header = storage.read_header(job)
    evil = evil_pickle(marker)
    if target == "inputs":
        if forgery == "unsigned":
            storage.put_bytes(storage.inputs_url(job), evil)
        else:
            forger(storage).write_inputs(job, header, [evil])
    else:
        url = header["functions"][0] if target == "function" else header[target]
        storage.put_bytes(url, evil if forgery == "unsigned" else forger(storage).signer.seal(
            "function", storage.name_of(url), evil, root=storage.mac_root))
    done = run_worker(job, source, PATHS[path])
    assert done.returncode == 0, done.stderr
    assert "refusing this job" in done.stderr
    assert not marker.exists()  # nothing unverified was unpickled
    assert markers(folder) == []  # neither the initializer nor any item ran
    meta, outcomes = wire.unpack_result(storage.read_result(job, 0))
    assert outcomes == [] and meta[signing.REFUSED]  # the job's refusal, not per-item failures


# -- every seal before any code: jobs on the emulator --------------------------------------------
def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("target", ["function", "initargs", "inputs"])
def test_on_the_emulator_every_future_of_a_tampered_job_raises_integrity_error(
        tmp_path, monkeypatch, path, target):
    monkeypatch.delenv("BATCHFUTURES_SIGNING_KEY", raising=False)
    folder, marker, gate = tmp_path / "markers", tmp_path / "evil-loaded", tmp_path / "gate"
    folder.mkdir()
    evil = evil_pickle(marker)
    env = LocalEnvironment(tmp_path / "work", max_vcpus=2)
    vcpus = PATHS[path] or 1
    settings: Dict[str, Any] = {"vcpus": vcpus}
    if PATHS[path]:  # as benchmarks/bench_local.py case (d)
        settings["environment"] = {"BATCHFUTURES_VCPUS": str(vcpus)}
    blocker_executor = BatchExecutor(env, vcpus=2)
    executor = BatchExecutor(env, initializer=init, initargs=(str(folder),), **settings)
    try:
        blocker = blocker_executor.submit(wait_for_file, str(gate))
        until(lambda: blocker.status == "RUNNING", "the blocker to run")
        futures = executor.map_futures(make_work(str(folder)), range(4), chunksize=4)
        until(lambda: futures[0].job_id is not None, "the job to be submitted")
        (description,) = env.batch.describe_jobs(jobs=[futures[0].job_id.split(":")[0]])["jobs"]
        assert description["status"] in ("SUBMITTED", "PENDING", "RUNNABLE")  # still held
        job = description["container"]["command"][-1]
        storage = env.storage
        header = storage.read_header(job)
        if target == "inputs":
            forger(storage).write_inputs(job, header, [evil])
        else:
            url = header["functions"][0] if target == "function" else header[target]
            storage.put_bytes(url, forger(storage).signer.seal(
                "function", storage.name_of(url), evil, root=storage.mac_root))
        gate.write_text("go")
        assert blocker.result(timeout=WAIT) == "released"
        errors = [future.exception(timeout=WAIT) for future in futures]
        assert all(isinstance(error, IntegrityError) for error in errors), errors
        assert not marker.exists() and markers(folder) == []
        assert "refusing this job" in futures[0].log()
    finally:
        gate.write_text("go")
        executor.shutdown(wait=True)
        blocker_executor.shutdown(wait=True)
        env.emulator.close()


# -- the MAC binds the storage root --------------------------------------------------------------
def copy_root(source: Storage, target: Storage) -> int:
    """Copy every object under ``source``'s root to the same key under ``target``'s."""
    count = 0
    for path in source.fs.find(source.root):
        relative = path[len(source.root):].lstrip("/")
        target.put_bytes(target.url(relative), source.get_bytes(source.url(relative)))
        count += 1
    return count


@pytest.mark.slow
def test_a_job_copied_to_another_root_under_the_same_key_does_not_verify(signed, tmp_path):
    storage, source = signed
    folder = tmp_path / "markers"
    folder.mkdir()
    job = make_job(storage, folder, 2)
    storage.write_job_pointer("job-1", job)
    assert storage.write_result(job, 0, wire.pack_result([], {"attempt": "1"}))
    if storage.local:
        other_root = (tmp_path / "elsewhere" / "storage").as_uri()
    else:  # the same bucket, another prefix
        other_root = storage.root_url.rpartition("/")[0] + "/elsewhere"
    copy = Storage(other_root, signer=storage.signer)  # the same key
    assert copy.mac_root != storage.mac_root
    assert copy_root(storage, copy) >= 5  # function, initargs, inputs, result, pointer
    copied_job = copy.url(storage.name_of(job))
    header = storage.read_header(job)
    reads: Dict[str, Callable[[], Any]] = {
        "header": lambda: copy.read_header(copied_job),
        "inputs": lambda: copy.read_child_inputs(copied_job, 0),
        "function": lambda: copy.get_function(copy.url(storage.name_of(header["functions"][0]))),
        "initargs": lambda: copy.get_function(copy.url(storage.name_of(header["initargs"]))),
        "result": lambda: copy.read_result(copied_job, 0),
        "pointer": lambda: copy.read_job_pointer("job-1"),
    }
    for what, read in reads.items():
        with pytest.raises(IntegrityError):
            read()
            pytest.fail(f"the copied {what} verified")
    # in place, the same objects verify
    assert storage.read_job_pointer("job-1") == job
    assert storage.read_child_inputs(job, 0)[0] == header
    # a real worker given the copy refuses it and runs nothing (the copy has no result yet)
    copy.delete(copy.result_url(copied_job, 0))
    done = run_worker(copied_job, source, None)
    assert done.returncode == 0 and "refusing this job" in done.stderr, done.stderr
    assert markers(folder) == []


@pytest.mark.slow  # moto's S3
def test_the_mac_root_names_bucket_and_prefix_or_folder(tmp_path, s3_root):
    local = Storage((tmp_path / "a").as_uri())
    assert local.mac_root == f"file://{tmp_path / 'a'}"
    assert Storage(s3_root).mac_root == s3_root.rstrip("/")
    key = b"k" * 32
    # the root is its own field: root + name never collide with another split of the same text
    assert signing.mac(key, "result", "b/c", root="s3://x/a") != \
        signing.mac(key, "result", "c", root="s3://x/a/b")
    assert signing.mac(key, "result", "n", root="") != signing.mac(key, "result", "n", root="s3://x")


# -- size limit, checked before reading; MAC verified while reading -------------------------------
class Feeds:
    """Counts the bytes the verifying reader was given (0: the body was never read)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fed = 0
        real = storage_module._Verifying.feed

        def feed(sink: Any, chunk: bytes) -> None:
            self.fed += len(chunk)
            real(sink, chunk)
        monkeypatch.setattr(storage_module._Verifying, "feed", feed)


@pytest.mark.slow  # moto's S3
def test_an_oversized_object_is_refused_before_it_is_read(storage, monkeypatch):
    limit = 4096
    small = Storage(storage.root_url, signer=Signer.from_key(b"k" * 32), max_object_size=limit)
    run_id = "run-" + uuid.uuid4().hex[:8]
    function_url = small.put_function(run_id, b"f" * (2 * limit))
    job = small.job_url(run_id, "job")
    small.write_result(job, 0, b"r" * limit)  # sealed: over the limit by its magic and tag
    small.write_job_pointer("job-1", job + "/" + "x" * limit)
    small.write_inputs(job, {"functions": [function_url]}, [b"a", b"b" * (2 * limit)])
    feeds = Feeds(monkeypatch)
    reads = {
        "function": (lambda: small.get_function(function_url), 8 + 32 + 2 * limit),
        "result": (lambda: small.read_result(job, 0), 8 + 32 + limit),
        "pointer": (lambda: small.read_job_pointer("job-1"), 8 + 32 + len(job) + 1 + limit),
        "inputs child": (lambda: small.read_child_inputs(job, 1), 32 + 2 * limit),
    }
    for what, (read, size) in reads.items():
        with pytest.raises(ObjectTooLargeError) as refused:
            read()
        assert isinstance(refused.value, IntegrityError), what
        assert (refused.value.size, refused.value.limit) == (size, limit), what
        assert str(size) in str(refused.value) and SIZE_VARIABLE in str(refused.value)
    assert feeds.fed == 0  # not a byte of any of them was read
    # under the limit, the same storage reads what it wrote
    assert small.read_child_inputs(job, 0)[1] == b"a"
    bigger = Storage(storage.root_url, signer=small.signer, max_object_size=4 * limit)
    assert bigger.get_function(function_url) == b"f" * (2 * limit)
    assert bigger.read_child_inputs(job, 1)[1] == b"b" * (2 * limit)


def test_a_planted_huge_local_file_is_refused_at_once_with_its_size(local):
    job = local.job_url("run1", "job")
    assert local.write_result(job, 0, b"x")
    path = local._path(local.result_url(job, 0))
    huge = 64 * 1024 ** 3  # sparse: no disk used, but 64 GiB to whoever reads it whole
    os.truncate(path, huge)
    with pytest.raises(ObjectTooLargeError) as refused:
        local.read_result(job, 0)
    assert refused.value.size == huge and refused.value.limit == storage_module.MAX_OBJECT_SIZE


def test_the_limit_is_configurable_by_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(SIZE_VARIABLE, "12345")
    assert Storage((tmp_path / "s").as_uri()).max_object_size == 12345
    assert Storage((tmp_path / "s").as_uri(), max_object_size=7).max_object_size == 7
    for wrong in ("lots", "0", "-5"):
        monkeypatch.setenv(SIZE_VARIABLE, wrong)
        with pytest.raises(ConfigurationError, match=SIZE_VARIABLE):
            Storage((tmp_path / "s").as_uri())
    monkeypatch.delenv(SIZE_VARIABLE)
    assert Storage((tmp_path / "s").as_uri()).max_object_size == storage_module.MAX_OBJECT_SIZE
    error = ObjectTooLargeError("s3://b/p/x", 10, 5)
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), again.url, again.size, again.limit) == (ObjectTooLargeError, "s3://b/p/x", 10, 5)


@pytest.mark.slow
def test_a_worker_refuses_a_function_over_its_limit_and_runs_nothing(signed, tmp_path):
    storage, source = signed
    folder = tmp_path / "markers"
    folder.mkdir()
    job = make_job(storage, folder, 2)
    size = len(storage.get_bytes(storage.read_header(job)["functions"][0]))
    done = run_worker(job, source, None, {SIZE_VARIABLE: str(size - 1)})
    assert done.returncode == 0, done.stderr
    assert "refusing this job" in done.stderr and f"is {size} bytes" in done.stderr
    assert markers(folder) == []
    meta, outcomes = wire.unpack_result(storage.read_result(job, 0))
    assert outcomes == [] and "over the limit" in meta[signing.REFUSED]


@pytest.mark.slow  # moto's S3
@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_the_mac_is_checked_over_many_chunks_and_every_flip_is_refused(storage, monkeypatch, chunk):
    monkeypatch.setattr(storage_module, "READ_CHUNK", chunk)
    signed = Storage(storage.root_url, signer=Signer.from_key(b"k" * 32))
    payload = bytes(range(256)) * 3
    job = signed.job_url("run1", "job-" + uuid.uuid4().hex[:6])
    assert signed.write_result(job, 0, payload)
    url = signed.result_url(job, 0)
    assert signed.read_result(job, 0) == payload
    sealed = signed.get_bytes(url)
    for position in (0, 7, 8, 39, 40, 41, len(sealed) // 2, len(sealed) - 1):
        tampered = bytearray(sealed)
        tampered[position] ^= 0x01
        signed.put_bytes(url, bytes(tampered))
        with pytest.raises(IntegrityError):
            signed.read_result(job, 0)
    for cut in (sealed[:-1], sealed + b"\0", sealed[:39], b""):
        signed.put_bytes(url, cut)
        with pytest.raises(IntegrityError):
            signed.read_result(job, 0)


def test_the_calls_blob_names_its_functions_outside_the_pickle():
    items: Sequence[Tuple[int, tuple, dict]] = [(3, (1,), {}), (1, (2,), {"k": 3}), (3, (), {})]
    blob = wire.pack_items(items)
    assert wire.item_functions(blob) == [1, 3]
    assert wire.unpack_items(blob) == list(items)
    assert wire.item_functions(b"anything", wire.ARG) == [0]
    legacy = pickle.dumps(list(items))  # written before the prefix: every function may be used
    assert wire.item_functions(legacy) is None
    assert wire.unpack_items(legacy) == list(items)
