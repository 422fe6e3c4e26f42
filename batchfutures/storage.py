"""Storage: one layout for every environment, through fsspec (local files, or S3 via s3fs).

    R = file:///.../storage  or  s3://bucket/prefix

    R/runs/<run_id>/functions/<sha256>.pkl     cloudpickled callable, content-addressed
    R/runs/<run_id>/jobs/<job_key>/inputs       one object per Batch job (format below)
    R/runs/<run_id>/jobs/<job_key>/results/<i>  one object per child i (0 for a plain job)
    R/jobs/<batch job id>                       the job's URL, so attach() works after Batch forgot it

Inputs object, so a child reads its own byte range and nothing else:

    b"BFINPUT1" | uint64 LE header length H | H bytes of JSON header
    | (children + 1) uint64 LE offsets, relative to the data start | data (child blobs, in order)

A child reads the first 64 KiB (usually the header, its index entries and its blob too), then
at most one more range. Writes are atomic from a reader's view: a local file is written under a
temporary name in the same folder and renamed; an object store PUT is atomic by itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import uuid
from typing import Any, Dict, List, Optional, Set, Tuple

import fsspec
from fsspec.implementations.local import LocalFileSystem
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

MAGIC = b"BFINPUT1"
PREFIX_READ = 64 * 1024
_U64 = struct.Struct("<Q")


def _transient(error: BaseException) -> bool:
    return isinstance(error, (OSError, TimeoutError)) and not isinstance(
        error, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError))


_retry = retry(retry=retry_if_exception(_transient), stop=stop_after_attempt(4),
               wait=wait_random_exponential(multiplier=0.2, max=5), reraise=True)


class Storage:
    """Reads and writes the payloads of every job under one root URL."""

    def __init__(self, root_url: str, *, storage_options: Optional[Dict[str, Any]] = None) -> None:
        options = dict(storage_options or {})
        if root_url.startswith(("s3://", "s3a://")):
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            if endpoint:
                options.setdefault("client_kwargs", {}).setdefault("endpoint_url", endpoint)
        self.fs, path = fsspec.core.url_to_fs(root_url, **options)
        self.root = path.rstrip("/")
        self.root_url = root_url.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)
        self._uploaded: Set[str] = set()
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str) -> "Storage":
        """A Storage rooted at the R of a job URL ``R/runs/<run>/jobs/<key>``."""
        root, sep, _ = url.rpartition("/runs/")
        if not sep:
            raise ValueError(f"{url!r} is not a batchfutures job URL")
        return cls(root)

    # -- URLs and paths ----------------------------------------------------------------------
    def url(self, *parts: str) -> str:
        return "/".join((self.root_url,) + parts)

    def run_url(self, run_id: str) -> str:
        return self.url("runs", run_id)

    def job_url(self, run_id: str, job_key: str) -> str:
        return self.url("runs", run_id, "jobs", job_key)

    def _path(self, url: str) -> str:
        if url.startswith(self.root_url):
            return self.root + url[len(self.root_url):]
        return self.fs._strip_protocol(url)

    # -- primitive, atomic operations --------------------------------------------------------
    @_retry
    def put_bytes(self, url: str, data: bytes) -> None:
        path = self._path(url)
        if self.local:
            folder = os.path.dirname(path)
            os.makedirs(folder, exist_ok=True)
            temporary = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
            try:
                with open(temporary, "wb") as handle:
                    handle.write(data)
                os.replace(temporary, path)
            except BaseException:
                try:
                    os.unlink(temporary)
                except FileNotFoundError:
                    pass
                raise
        else:
            self.fs.pipe_file(path, data)

    @_retry
    def get_bytes(self, url: str, start: Optional[int] = None, end: Optional[int] = None) -> Optional[bytes]:
        try:
            return self.fs.cat_file(self._path(url), start=start, end=end)
        except FileNotFoundError:
            return None

    def exists(self, url: str) -> bool:
        path = self._path(url)
        if not self.local:
            self.fs.invalidate_cache(path)
        return self.fs.exists(path)

    def _names(self, url: str) -> List[str]:
        path = self._path(url)
        if not self.local:
            self.fs.invalidate_cache(path)  # s3fs caches listings; results appear over time
        try:
            return [entry.rstrip("/").rpartition("/")[2] for entry in self.fs.ls(path, detail=False)]
        except FileNotFoundError:
            return []

    def delete(self, url: str) -> None:
        path = self._path(url)
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    # -- functions ---------------------------------------------------------------------------
    def put_function(self, run_id: str, payload: bytes) -> str:
        """Upload a pickled callable under its content hash, once per run."""
        digest = hashlib.sha256(payload).hexdigest()
        url = self.url("runs", run_id, "functions", f"{digest}.pkl")
        with self._lock:
            if url in self._uploaded:
                return url
        self.put_bytes(url, payload)
        with self._lock:
            self._uploaded.add(url)
        return url

    def get_function(self, url: str) -> bytes:
        data = self.get_bytes(url)
        if data is None:
            raise FileNotFoundError(f"the function payload {url} is missing")
        return data

    # -- inputs ------------------------------------------------------------------------------
    def write_inputs(self, job_url: str, header: Dict[str, Any], child_blobs: List[bytes]) -> None:
        header_bytes = json.dumps(header, sort_keys=True).encode()
        offsets = [0]
        for blob in child_blobs:
            offsets.append(offsets[-1] + len(blob))
        table = struct.pack(f"<{len(offsets)}Q", *offsets)
        data = b"".join([MAGIC, _U64.pack(len(header_bytes)), header_bytes, table, *child_blobs])
        self.put_bytes(f"{job_url}/inputs", data)

    def read_header(self, job_url: str) -> Dict[str, Any]:
        return self._read_prefix(job_url)[0]

    def _read_prefix(self, job_url: str) -> Tuple[Dict[str, Any], bytes, int]:
        prefix = self.get_bytes(f"{job_url}/inputs", 0, PREFIX_READ)
        if prefix is None:
            raise FileNotFoundError(f"the inputs of {job_url} are missing")
        if prefix[:8] != MAGIC:
            raise ValueError(f"{job_url}/inputs is not a batchfutures inputs object")
        (length,) = _U64.unpack_from(prefix, 8)
        if 16 + length > len(prefix):
            prefix = prefix + self.get_bytes(f"{job_url}/inputs", len(prefix), 16 + length)
        header = json.loads(prefix[16:16 + length])
        return header, prefix, 16 + length

    def read_child_inputs(self, job_url: str, index: int) -> Tuple[Dict[str, Any], bytes]:
        """The header and child ``index``'s blob, reading only the ranges it needs."""
        header, prefix, table_start = self._read_prefix(job_url)
        children = int(header["children"])
        if not 0 <= index < children:
            raise IndexError(f"child {index} out of range: the job has {children} children")
        entry = table_start + 8 * index
        if entry + 16 <= len(prefix):
            begin, end = struct.unpack_from("<2Q", prefix, entry)
        else:
            begin, end = struct.unpack("<2Q", self.get_bytes(f"{job_url}/inputs", entry, entry + 16))
        data_start = table_start + 8 * (children + 1)
        start, stop = data_start + begin, data_start + end
        if stop <= len(prefix):
            return header, prefix[start:stop]
        return header, self.get_bytes(f"{job_url}/inputs", start, stop)

    # -- results -----------------------------------------------------------------------------
    def result_url(self, job_url: str, index: int) -> str:
        return f"{job_url}/results/{index}"

    def write_result(self, job_url: str, index: int, data: bytes) -> None:
        self.put_bytes(self.result_url(job_url, index), data)

    def read_result(self, job_url: str, index: int) -> Optional[bytes]:
        return self.get_bytes(self.result_url(job_url, index))

    def has_result(self, job_url: str, index: int) -> bool:
        return self.exists(self.result_url(job_url, index))

    def list_results(self, job_url: str) -> Set[int]:
        """Indices of the children whose result is written (one listing)."""
        return {int(name) for name in self._names(f"{job_url}/results") if name.isdigit()}

    # -- job pointers, runs, cleanup ---------------------------------------------------------
    def write_job_pointer(self, job_id: str, job_url: str) -> None:
        self.put_bytes(self.url("jobs", job_id), job_url.encode())

    def read_job_pointer(self, job_id: str) -> Optional[str]:
        data = self.get_bytes(self.url("jobs", job_id))
        return data.decode() if data is not None else None

    def delete_job(self, job_url: str) -> None:
        self.delete(job_url)

    def delete_run(self, run_id: str) -> None:
        self.delete(self.run_url(run_id))

    def list_runs(self) -> List[Tuple[str, Optional[float]]]:
        """(run id, last modification time as epoch seconds or None) for every stored run."""
        runs = []
        path = self._path(self.url("runs"))
        if not self.local:
            self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
        for entry in entries:
            name = entry["name"].rstrip("/").rpartition("/")[2]
            modified = entry.get("mtime") or entry.get("LastModified")
            if hasattr(modified, "timestamp"):
                modified = modified.timestamp()
            runs.append((name, float(modified) if modified else None))
        return runs
