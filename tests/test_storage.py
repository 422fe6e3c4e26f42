"""Storage on real backends: local files (tmp_path) and S3 (moto's server through real s3fs)."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
import s3server

from batchfutures import IntegrityError, serialization, wire
from batchfutures.signing import TAG_SIZE
from batchfutures.storage import Storage, _transient
from batchfutures.wire import INPUTS_MAGIC, PREFIX_READ

# moto S3 fixtures (tests/s3server.py), registered for this module
moto_server, aws_env, s3_bucket, s3_root = (
    s3server.moto_server, s3server.aws_env, s3server.s3_bucket, s3server.s3_root)


class S3Requests:
    """Every HTTP request s3fs sends, seen through botocore's event hooks (nothing replaced)."""

    def __init__(self, storage: Storage) -> None:
        self.events = storage.fs.s3.meta.events
        self.sent: List[Tuple[str, str, Optional[str]]] = []
        self.events.register("before-send.s3", self._record)

    def _record(self, request: Any, **_: Any) -> None:
        value = request.headers.get("Range")
        self.sent.append((request.method, request.url,
                          value.decode() if isinstance(value, bytes) else value))

    def clear(self) -> None:
        self.sent.clear()

    def close(self) -> None:
        self.events.unregister("before-send.s3", self._record)


@pytest.fixture
def s3_requests(storage: Storage) -> Iterator[Optional[S3Requests]]:
    if storage.local:
        yield None
        return
    recorder = S3Requests(storage)
    yield recorder
    recorder.close()


class LocalReads:
    """Every read of the local filesystem: (start, end, bytes returned)."""

    def __init__(self, storage: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: List[Tuple[Optional[int], Optional[int], int]] = []
        real = storage.fs.cat_file

        def cat_file(path: str, start: Optional[int] = None, end: Optional[int] = None, **kw: Any):
            data = real(path, start=start, end=end, **kw)
            self.reads.append((start, end, len(data)))
            return data
        monkeypatch.setattr(storage.fs, "cat_file", cat_file)
        plain = storage._local_bytes  # local reads: opened without following links

        def local_bytes(url: str, path: str, start: Optional[int], end: Optional[int]) -> Any:
            data = plain(url, path, start, end)
            self.reads.append((start, end, 0 if data is None else len(data)))
            return data
        monkeypatch.setattr(storage, "_local_bytes", local_bytes)
        verified = storage._read_verified  # signed ranges are streamed, not read by cat_file

        def read_verified(url: str, make: Any, start: Optional[int] = None,
                          end: Optional[int] = None) -> Any:
            sink = verified(url, make, start, end)
            self.reads.append((start, end, 0 if sink is None else len(sink.head) + len(sink.payload)))
            return sink
        monkeypatch.setattr(storage, "_read_verified", read_verified)


def parse_inputs(data: bytes) -> Tuple[Dict[str, Any], List[int]]:
    """The inputs object read the way wire.py's docstring describes it."""
    assert data[:8] == INPUTS_MAGIC
    (length,) = struct.unpack_from("<Q", data, 8)
    import json

    header = json.loads(data[16:16 + length])
    n = header["children"]
    offsets = list(struct.unpack_from(f"<{n + 1}Q", data, 16 + length))
    assert offsets[-1] == len(data)
    return header, offsets


def all_files(root) -> List[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, _, files in os.walk(root) for f in files)


# -- urls ---------------------------------------------------------------------------------------
def test_layout_and_from_url(tmp_path):
    root = (tmp_path / "storage").as_uri()
    storage = Storage(root)
    job = storage.job_url("run1", "key1")
    assert job == f"{root}/runs/run1/jobs/key1"
    assert storage.run_url("run1") == f"{root}/runs/run1"
    assert storage.result_url(job, 3) == f"{job}/results/00003"
    assert Storage.from_url(job).root_url == root
    assert Storage.from_url("s3://bkt/runs/x/runs/r/jobs/k").root_url == "s3://bkt/runs/x"
    with pytest.raises(ValueError):
        Storage.from_url("s3://bkt/nothing-here")


# -- functions ----------------------------------------------------------------------------------
def test_function_is_content_addressed_and_uploaded_once(storage, s3_requests, tmp_path):
    def puts() -> int:
        return sum(method == "PUT" for method, _, _ in s3_requests.sent)

    payload = serialization.dumps(lambda x: x + 1)
    url = storage.put_function("run1", payload)
    assert url == storage.url("runs", "run1", "functions", hashlib.sha256(payload).hexdigest() + ".pkl")
    assert storage.get_function(url) == payload
    if storage.local:
        path = storage._path(url)
        before = os.stat(path)
        assert storage.put_function("run1", payload) == url
        after = os.stat(path)  # a rewrite renames a new file into place: a new inode
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    else:
        s3_requests.clear()
        assert storage.put_function("run1", payload) == url
        assert s3_requests.sent == []  # no request at all, let alone a PUT
    other = serialization.dumps(lambda x: x + 2)
    assert storage.put_function("run1", other) != url
    assert storage.put_function("run2", payload) != url  # once per run, not across runs
    # once the run is deleted, the function is uploaded again (the dedupe forgets it)
    storage.delete_run("run1")
    assert storage.get_bytes(url) is None
    if s3_requests is not None:
        s3_requests.clear()
    assert storage.put_function("run1", payload) == url
    assert storage.get_function(url) == payload
    if s3_requests is not None:
        assert puts() == 1
        s3_requests.clear()
        assert storage.put_function("run1", payload) == url and puts() == 0


# -- inputs -------------------------------------------------------------------------------------
def children_items(n: int) -> List[List[Tuple[int, tuple, dict]]]:
    # children of different sizes, each with recognisable items
    return [[(i % 3, (i, j, "x" * (i % 50)), {"child": i}) for j in range(1 + i % 4)]
            for i in range(n)]


def test_thousand_children_each_reads_exactly_its_own_items(storage, s3_requests):
    children = children_items(1000)
    blobs = [wire.pack_items(items) for items in children]
    job = storage.job_url("run1", "job1")
    storage.write_inputs(job, {"functions": ["a", "b", "c"], "note": "é"}, blobs)
    offsets = [PREFIX_READ]
    for blob in blobs:  # each child's range: its 32-byte tag, then its blob
        offsets.append(offsets[-1] + TAG_SIZE + len(blob))

    def check(index: int) -> None:
        header, blob = storage.read_child_inputs(job, index)
        assert header["children"] == 1000 and header["note"] == "é"
        assert blob == blobs[index]
        assert wire.unpack_items(blob) == children[index]
    # every child on local files (its reads are checked one by one in the next test); on S3
    # every 10th child and the last, since moto answers some 50 to 100 requests a second
    indices = list(range(1000)) if storage.local else [*range(0, 1000, 10), 1, 999]
    if s3_requests is not None:
        s3_requests.clear()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(check, indices))
    if s3_requests is not None:
        # two GETs per child in all: one of the prefix, and one of exactly its own range
        assert [method for method, _, _ in s3_requests.sent] == ["GET"] * (2 * len(indices))
        expected = [f"bytes=0-{PREFIX_READ - 1}"] * len(indices) + [
            f"bytes={offsets[i]}-{offsets[i + 1] - 1}" for i in indices]
        assert sorted(rng for _, _, rng in s3_requests.sent) == sorted(expected)
    assert storage.read_header(job)["functions"] == ["a", "b", "c"]
    with pytest.raises(IndexError):
        storage.read_child_inputs(job, 1000)


def test_a_local_child_reads_only_the_prefix_and_its_own_range(local, monkeypatch):
    blobs = [wire.pack_items(items) for items in children_items(1000)]
    job = local.job_url("run1", "job1")
    local.write_inputs(job, {"functions": ["f"]}, blobs)
    with open(local._path(job + "/inputs"), "rb") as handle:
        _, offsets = parse_inputs(handle.read())
    data_start = offsets[0]
    assert data_start >= PREFIX_READ  # the prefix never holds a child's blob
    reads = LocalReads(local, monkeypatch)
    for index in (0, 1, 500, 999):
        reads.reads.clear()
        _, blob = local.read_child_inputs(job, index)
        assert blob == blobs[index]
        (p_start, p_end, p_len), (b_start, b_end, b_len) = reads.reads
        assert (p_start, p_end) == (0, PREFIX_READ) and p_len <= data_start
        assert (b_start, b_end) == (offsets[index], offsets[index + 1])
        assert b_len == TAG_SIZE + len(blobs[index])  # its tag and its blob


def test_an_s3_child_sends_two_range_gets(s3_root):
    storage = Storage(s3_root)
    s3_requests = S3Requests(storage)
    blobs = [wire.pack_items(items) for items in children_items(1000)]
    job = storage.job_url("run1", "job1")
    storage.write_inputs(job, {"functions": ["f"]}, blobs)
    _, offsets = parse_inputs(storage.get_bytes(job + "/inputs"))
    for index in (0, 1, 999):
        s3_requests.clear()
        assert storage.read_child_inputs(job, index)[1] == blobs[index]
        assert [(method, rng) for method, _, rng in s3_requests.sent] == [
            ("GET", f"bytes=0-{PREFIX_READ - 1}"),
            ("GET", f"bytes={offsets[index]}-{offsets[index + 1] - 1}"),
        ]
    s3_requests.close()


def test_plain_job_is_not_padded_and_reads_once(local, monkeypatch):
    blob = wire.pack_items([(0, (1, 2), {})])
    job = local.job_url("run1", "plain")
    local.write_inputs(job, {"functions": ["f"]}, [blob])
    assert os.path.getsize(local._path(job + "/inputs")) < 1024
    reads = LocalReads(local, monkeypatch)
    assert local.read_child_inputs(job, 0)[1] == blob
    assert len(reads.reads) == 1


def test_index_and_header_beyond_the_prefix(local, monkeypatch):
    blobs = [b"%d" % i for i in range(10_000)]  # 80 KB of index: later entries need a read
    job = local.job_url("run1", "wide")
    local.write_inputs(job, {"functions": ["f"]}, blobs)
    reads = LocalReads(local, monkeypatch)
    for index in (0, 5000, 9000, 9999):
        reads.reads.clear()
        assert local.read_child_inputs(job, index)[1] == blobs[index]
        assert len(reads.reads) == (2 if index < 8000 else 3)
    big = {"functions": ["file:///f/%06d.pkl" % i for i in range(10_000)]}  # a 200 KB header
    job2 = local.job_url("run1", "bigheader")
    local.write_inputs(job2, big, [b"a", b"bc"])
    header, blob = local.read_child_inputs(job2, 1)
    assert header["functions"] == big["functions"] and blob == b"bc"

def test_a_header_over_64_kib_costs_one_more_read_on_s3(s3_root):
    storage = Storage(s3_root)
    requests = S3Requests(storage)
    big = {"functions": ["s3://bucket/f/%06d.pkl" % i for i in range(10_000)]}  # about 250 KB
    job = storage.job_url("run1", "bigheader")
    blobs = [b"first", b"second", b"third"]
    storage.write_inputs(job, big, blobs)
    data = storage.get_bytes(job + "/inputs")
    header, offsets = parse_inputs(data)
    length = struct.unpack_from("<Q", data, 8)[0]
    assert length > PREFIX_READ and header["functions"] == big["functions"]
    requests.clear()
    got_header, blob = storage.read_child_inputs(job, 2)
    # the header as signed: without its own MAC field
    assert got_header == {k: v for k, v in header.items() if k != "hmac"} and blob == b"third"
    # the prefix, the rest of the header, child 2's index entries, its blob
    assert [rng for _, _, rng in requests.sent] == [
        f"bytes=0-{PREFIX_READ - 1}", f"bytes={PREFIX_READ}-{16 + length - 1}",
        f"bytes={16 + length + 16}-{16 + length + 32 - 1}",
        f"bytes={offsets[2]}-{offsets[3] - 1}"]
    requests.close()


def test_missing_or_foreign_inputs(local):
    job = local.job_url("run1", "nothing")
    with pytest.raises(FileNotFoundError):
        local.read_child_inputs(job, 0)
    local.put_bytes(job + "/inputs", b"not an inputs object at all")
    with pytest.raises(IntegrityError, match="not a batchfutures inputs object"):
        local.read_child_inputs(job, 0)


# -- results ------------------------------------------------------------------------------------
def test_results_write_once_list_and_read(storage):
    job = storage.job_url("run1", "job1")
    assert storage.list_results(job) == set()
    assert storage.read_result(job, 0) is None
    for index in (0, 2, 5):
        assert storage.write_result(job, index, b"result %d" % index) is True
    assert storage.list_results(job) == {0, 2, 5}
    assert storage.read_result(job, 2) == b"result 2"
    assert storage.has_result(job, 5) and not storage.has_result(job, 1)
    # a later attempt never replaces a finished result...
    assert storage.write_result(job, 2, b"a retry") is False
    assert storage.read_result(job, 2) == b"result 2"
    # ...unless asked to
    assert storage.write_result(job, 2, b"replaced", overwrite=True) is True
    assert storage.read_result(job, 2) == b"replaced"
    if storage.local:
        assert not [f for f in all_files(storage.root) if os.path.basename(f).startswith(".")]


def test_results_are_listed_from_a_child_on_with_pages_of_only_the_later_keys(storage, s3_requests):
    """Result names sort as their indices (results/00042), so the poller lists only the results
    from the lowest child still waiting: on S3 one ListObjectsV2 with StartAfter."""
    job = storage.job_url("run1", "job1")
    for index in (0, 3, 9, 10, 11, 100, 1234):
        storage.write_result(job, index, b"r")
    assert storage.result_url(job, 42).endswith("/results/00042")
    assert storage.list_results(job, 10) == {10, 11, 100, 1234}
    assert storage.list_results(job, 1235) == set()
    assert storage.list_results(job) == {0, 3, 9, 10, 11, 100, 1234}
    if s3_requests is not None:  # the later keys only came back, not every result of the job
        s3_requests.clear()
        assert storage.list_results(job, 11) == {11, 100, 1234}
        (listing,) = [url for _, url, _ in s3_requests.sent if "list-type=2" in url]
        assert "start-after=" in listing and "results%2F00010&" in listing


def test_readers_never_see_a_partial_object(storage):
    job = storage.job_url("run1", "job1")
    rounds = 40 if storage.local else 12
    stop = threading.Event()
    seen: List[Optional[bytes]] = []

    def payload(i: int) -> bytes:
        body = bytes([i % 251]) * (100_000 + 23_000 * i)
        return hashlib.sha256(body).digest() + body

    def reader() -> None:
        while not stop.is_set():
            seen.append(storage.read_result(job, 0))
    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(rounds):
            storage.write_result(job, 0, payload(i), overwrite=True)
    finally:
        stop.set()
        thread.join()
    seen.append(storage.read_result(job, 0))
    assert seen[-1] == payload(rounds - 1)
    for data in seen:
        assert data is None or hashlib.sha256(data[32:]).digest() == data[:32]


@pytest.mark.slow
def test_a_failed_local_write_leaves_nothing(tmp_path):
    # The write fails half-way (the file size limit is hit): neither the target nor the
    # temporary file may remain. Run in a subprocess: the limit is per process.
    root = (tmp_path / "storage").as_uri()
    script = textwrap.dedent(f"""
        import resource, signal
        from batchfutures.storage import Storage
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        storage = Storage({root!r})
        job = storage.job_url("run1", "job1")
        for write in (lambda: storage.write_result(job, 0, b"x" * (4 << 20)),
                      lambda: storage.write_inputs(job, {{}}, [b"y" * (4 << 20)] * 2)):
            try:
                write()
            except OSError as error:
                print("failed", error.errno)
            else:
                print("wrote")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["failed", "27", "failed", "27"]  # EFBIG
    assert all_files(tmp_path / "storage") == []
    storage = Storage(root)
    job = storage.job_url("run1", "job1")
    assert storage.read_result(job, 0) is None and storage.list_results(job) == set()


def test_a_failed_s3_write_leaves_nothing(s3_root, s3_bucket):
    missing = Storage(f"s3://no-such-bucket-{os.getpid()}/x")
    with pytest.raises(FileNotFoundError):  # permanent: raised, not retried into a hang
        missing.write_result(missing.job_url("r", "j"), 0, b"data")
    storage = Storage(s3_root)
    job = storage.job_url("run1", "job1")
    assert storage.list_results(job) == set()


# -- runs, cleanup, pointers --------------------------------------------------------------------
def test_list_and_delete_runs(storage):
    started = time.time()
    for run in ("runA", "runB"):
        job = storage.job_url(run, "job1")
        storage.put_function(run, b"fn " + run.encode())
        storage.write_inputs(job, {}, [b"1", b"2"])
        storage.write_result(job, 1, b"done")
    storage.write_job_pointer("job-id-1", storage.job_url("runA", "job1"))
    runs = dict(storage.list_runs())
    assert set(runs) == {"runA", "runB"}
    for modified in runs.values():
        assert modified is not None and started - 120 < modified < time.time() + 120
    storage.delete_run("runA")
    assert [run for run, _ in storage.list_runs()] == ["runB"]
    assert storage.list_results(storage.job_url("runA", "job1")) == set()
    assert storage.read_result(storage.job_url("runB", "job1"), 1) == b"done"
    assert storage.read_job_pointer("job-id-1") == storage.job_url("runA", "job1")
    assert storage.read_job_pointer("job-id-2") is None
    storage.delete_job(storage.job_url("runB", "job1"))
    assert storage.list_results(storage.job_url("runB", "job1")) == set()
    with pytest.raises(ValueError):
        storage.delete_run("")
    storage.delete_run("never-existed")


def test_list_runs_on_empty_storage(storage):
    assert storage.list_runs() == []


# -- configuration ------------------------------------------------------------------------------
def test_s3_endpoint_comes_from_the_environment(s3_root, aws_env):
    options = {"client_kwargs": {"region_name": "us-east-1"}}
    storage = Storage(s3_root, storage_options=options)
    assert options == {"client_kwargs": {"region_name": "us-east-1"}}  # the caller's dict untouched
    assert storage.storage_options["client_kwargs"] == {
        "region_name": "us-east-1", "endpoint_url": aws_env["AWS_ENDPOINT_URL_S3"]}
    given = Storage(s3_root, storage_options={"endpoint_url": aws_env["AWS_ENDPOINT_URL_S3"]})
    assert "client_kwargs" not in given.storage_options
    storage.put_bytes(storage.url("probe"), b"ok")
    assert given.get_bytes(given.url("probe")) == b"ok"


def test_which_errors_are_retried():
    import errno

    assert _transient(TimeoutError()) and _transient(ConnectionResetError())
    assert _transient(OSError(errno.EBUSY, "SlowDown")) and _transient(OSError("InternalError"))
    for permanent in (FileNotFoundError(), FileExistsError(), PermissionError(),
                      OSError(errno.EINVAL, "bad request"), ValueError("x")):
        assert not _transient(permanent)


def test_results_written_by_another_process_are_seen_despite_listing_caches(storage):
    job = storage.job_url("run1", "job1")
    assert storage.list_results(job) == set() and not storage.has_result(job, 0)
    # a separate filesystem instance (its own listing cache) stands for the workers' processes
    other = Storage(storage.root_url, storage_options={"skip_instance_cache": True})
    assert other.fs is not storage.fs
    seen = []
    for index in (3, 0, 7, 1):  # the poller lists again and again as children finish
        other.write_result(job, index, b"from child %d" % index)
        seen.append(storage.list_results(job))
        assert storage.has_result(job, index)
        assert storage.read_result(job, index) == b"from child %d" % index
    assert seen == [{3}, {0, 3}, {0, 3, 7}, {0, 1, 3, 7}]
    other.delete_job(job)
    assert storage.list_results(job) == set() and not storage.has_result(job, 3)
    assert storage.read_result(job, 3) is None


def test_s3fs_itself_honours_aws_endpoint_url_s3(s3_root, aws_env):
    # botocore >= 1.31 reads AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, and s3fs leaves the endpoint
    # to it; Storage passes the endpoint explicitly anyway (older botocore ignores them).
    import s3fs

    writer = Storage(s3_root)
    writer.put_bytes(writer.url("probe"), b"through moto")
    plain = s3fs.S3FileSystem(skip_instance_cache=True)  # no endpoint given
    assert plain.cat_file(writer._path(writer.url("probe"))) == b"through moto"
