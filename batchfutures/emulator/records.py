"""Job records on disk, so another emulator instance (or process) can describe past jobs.

    <folder>/jobs/<job id>.json           {"format": 2, "owner": [pid, start ticks, instance],
                                            "spec": ..., "unit": ... (plain job) or
                                            "job": ... (array parent), "chunks": n}
    <folder>/jobs/<job id>.d/<k>.json     children k*500 .. k*500+499 of an array
    <folder>/control/<instance>/<x>.json  CancelJob/TerminateJob requests from other processes
    <folder>/queues/<name>.json           a job queue: state, priority, time limit actions
    <folder>/definitions/<name>/<r>.json  revision r of a job definition

Every file is written atomically (temporary name, then os.replace), mode 0600 and never through a
symlink (O_NOFOLLOW); folders are made 0700 (workdir.py's rules). A path built from a job id or an
instance id (which a record on disk names) must be one plain name under its folder: anything else
is refused (ValueError) or, when listing, skipped. The `Persister` writes the
records of jobs that changed at most every 0.2 s, and only the chunks of children that changed,
so a 10,000-child array costs a few small writes per interval, not one big file per transition.
A parent file is rewritten after its chunks whenever anything in the job changed, so a reader
that sees the parent's new version also sees the children it summarises.

The owner (pid, the process's start time from /proc, the instance's id) tells a reader whether
the job's process is still alive; a job left unfinished by a dead owner is recovered as FAILED.

Every record read back is checked against schema.py before it is used: a job record that fails
raises `BadRecord` (naming the file and the field; table.py skips the job with one warning); a
bad queue, definition or control file is skipped with a warning, once per version of the file.
A file over `schema.MAX_RECORD_BYTES` is refused before it is read.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple

from ..workdir import inside, make_private_dirs, open_private
from . import schema
from .schema import RecordProblem

if TYPE_CHECKING:  # pragma: no cover
    from .jobstate import Job

logger = logging.getLogger("batchfutures")

PERSIST_EVERY = 0.2


def _stat(pid: int) -> Optional[List[bytes]]:
    """The fields of /proc/<pid>/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    fields = _stat(pid)
    return fields[19].decode() if fields and len(fields) > 19 else None


def owner_token(instance: str = "") -> List[Any]:
    pid = os.getpid()
    return [pid, _start_time(pid), instance]


def process_alive(owner: Any) -> bool:
    """Whether the process that wrote a record still runs (a reused pid is another process)."""
    if not owner:
        return False
    pid = int(owner[0])
    started = owner[1] if len(owner) > 1 else None
    if pid != os.getpid():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        fields = _stat(pid)
        if fields is not None and fields[0] in (b"Z", b"X"):
            return False  # dead, only not yet reaped by its parent
    return started is None or _start_time(pid) == started


def safe_name(name: str, what: str = "job id") -> str:
    """``name`` when it can be one file name in a folder (no separator, not hidden, not .. )."""
    if (not isinstance(name, str) or not name or name.startswith(".") or "/" in name
            or "\\" in name or "\x00" in name):
        raise ValueError(f"{name!r} is not a valid {what} for a record path")
    return name


def under(folder: Path, path: Path) -> Path:
    """``path`` when it stays under ``folder``; ValueError otherwise."""
    if not inside(folder, path):
        raise ValueError(f"{str(path)!r} is not under {str(folder)!r}")
    return path


class BadRecord(ValueError):
    """A record file that cannot be used: `path` is the file, `problem` what is wrong where."""

    def __init__(self, path: Path, problem: RecordProblem) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def read_json(path: Path) -> Any:
    """A record file's JSON, never through a symlink; RecordProblem when it is too big or not
    JSON, OSError when it cannot be opened (e.g. missing)."""
    # O_NONBLOCK: a FIFO planted under a record's name must not hang the reader in open()
    with os.fdopen(open_private(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise RecordProblem("", "not a regular file")
        size = info.st_size
        if size > schema.MAX_RECORD_BYTES:  # refused before a byte is read: no allocation of its size
            raise RecordProblem("", f"{size} bytes, more than {schema.MAX_RECORD_BYTES}")
        data = handle.read(size + 1)  # read(n) allocates n bytes up front: the size, not the cap
    if len(data) > size:  # grew while read (a record is replaced, never appended to)
        raise RecordProblem("", f"grew past {size} bytes while read")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as error:  # RecursionError: "[[[[..." deeper than C's stack
        raise RecordProblem("", f"not JSON ({type(error).__name__})") from None


def read_checked(path: Path, rule: schema.Rule, warned: Dict[Path, Any], version: Any) -> Optional[Any]:
    """A queue, definition or control file that `rule` allows, or None (missing or being
    replaced: silently; bad: with one warning per `version` of the file, kept in `warned`)."""
    value: Any = None
    try:
        value = read_json(path)
        found = schema.problem(rule, value)
    except OSError:
        return None
    except RecordProblem as error:
        found = error
    if found is None:
        return value
    if path not in warned or warned[path] != version:
        warned[path] = version
        logger.warning("batchfutures emulator: skipped the record %s: %s", path, found)
    return None


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        descriptor = open_private(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def _dumps(record: Dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))


def create_exclusively(path: Path, record: Dict[str, Any]) -> bool:
    """Write a new record file; False when one of that name exists (O_EXCL: of two writers
    of one name, exactly one wins)."""
    try:
        fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(_dumps(record))
    return True


def record_names(folder: Path) -> List[str]:
    """The names of the record files (<name>.json) in `folder`, not the dot files being
    written; none when it cannot be listed."""
    try:
        return [n[:-5] for n in os.listdir(folder) if n.endswith(".json") and not n.startswith(".")]
    except OSError:
        return []


def read_record(path: Path, rule: schema.Rule, warned: Dict[Path, Any]) -> Optional[Dict[str, Any]]:
    """A record file that `rule` allows, as a dict; None when missing, being replaced or bad
    (warned about once per version of the file, kept in `warned`)."""
    try:
        info = path.stat()
    except OSError:
        return None
    found = read_checked(path, rule, warned, (info.st_ino, info.st_mtime_ns))
    return found if isinstance(found, dict) else None


def job_texts(job: Job, owner: Optional[List[Any]], chunks: Iterable[int]) -> Tuple[str, Dict[int, str]]:
    """The one serialisation of a job's record: its parent file and the given chunks' files."""
    return _dumps(job.parent_record(owner)), {k: _dumps(job.chunk_record(k)) for k in chunks}


class RecordStore:
    """The files under <folder>/jobs and <folder>/control."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.jobs = self.folder / "jobs"
        self.control = self.folder / "control"
        make_private_dirs(self.jobs)

    def path(self, job_id: str) -> Path:
        return self.jobs / f"{safe_name(job_id)}.json"  # one plain name: stays under jobs/

    def chunk_path(self, job_id: str, chunk: int) -> Path:
        return self.jobs / f"{safe_name(job_id)}.d" / f"{int(chunk)}.json"

    # -- writing -----------------------------------------------------------------------------
    def write(self, job_id: str, parent: str, chunks: Dict[int, str]) -> None:
        """Write a job's changed chunks, then its parent file (texts already serialised)."""
        if chunks:
            make_private_dirs(self.jobs / f"{safe_name(job_id)}.d")
        for chunk, text in sorted(chunks.items()):
            write_atomically(self.chunk_path(job_id, chunk), text)
        write_atomically(self.path(job_id), parent)

    def delete(self, job_id: str) -> None:
        try:
            self.path(job_id).unlink()  # unlink never follows a symlink
        except (FileNotFoundError, ValueError):
            return
        chunks = self.jobs / f"{job_id}.d"
        if not chunks.is_symlink():  # rmtree refuses one too; never follow it
            shutil.rmtree(chunks, ignore_errors=True)

    # -- reading -----------------------------------------------------------------------------
    def signature(self, job_id: str) -> Optional[Tuple[int, int, int]]:
        """Changes whenever the record is rewritten (os.replace gives a new inode)."""
        try:
            stat = self.path(job_id).stat()
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return None
        return stat.st_ino, stat.st_mtime_ns, stat.st_size

    def load(self, job_id: str) -> Optional[Tuple[Dict[str, Any], List[Dict[str, Any]]]]:
        """(parent record, chunk records) of a job, None when it has no record (or not yet a
        complete one); BadRecord when a file of it fails the schema."""
        path = self.path(job_id)
        try:
            record = read_json(path)
        except OSError:
            return None
        except RecordProblem as error:
            raise BadRecord(path, error) from None
        if isinstance(record, dict) and record.get("format") != 2:
            return None  # not a record this version understands
        found = schema.job_problem(record, job_id)
        if found is not None:
            raise BadRecord(path, found)
        children = schema.children_of(record["spec"])
        chunks = []
        for chunk in range(record["chunks"]):  # at most 20: the schema bounds it
            path = self.chunk_path(job_id, chunk)
            try:
                loaded = read_json(path)
            except OSError:
                continue  # not written yet: those children show as submitted
            except RecordProblem as error:
                raise BadRecord(path, error) from None
            found = schema.chunk_problem(loaded, chunk, children)
            if found is not None:
                raise BadRecord(path, found)
            chunks.append(loaded)
        return record, chunks

    def job_ids(self) -> Iterator[str]:
        try:
            entries = list(os.scandir(self.jobs))
        except FileNotFoundError:
            return
        for entry in entries:
            name = entry.name
            if name.endswith(".json") and not name.startswith(".") and not entry.is_symlink():
                yield name[:-5]

    # -- requests between processes ----------------------------------------------------------
    def send_control(self, instance: str, request: Dict[str, Any]) -> None:
        folder = under(self.control, self.control / safe_name(instance, "instance id"))
        make_private_dirs(folder)
        write_atomically(folder / f"{uuid.uuid4().hex}.json", _dumps(request))

    def take_control(self, instance: str) -> List[Dict[str, Any]]:
        folder = under(self.control, self.control / safe_name(instance, "instance id"))
        try:
            names = [n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith(".")]
        except FileNotFoundError:
            return []
        requests = []
        for name in sorted(names):
            path = folder / name
            request = read_checked(path, schema.CONTROL_REQUEST, {}, None)  # each file is read once
            try:
                path.unlink()  # a bad request too: it would be skipped again every 0.25 s
            except OSError:
                continue
            if request is not None:
                requests.append(request)
        return requests

    def drop_control(self, instance: str) -> None:
        folder = under(self.control, self.control / safe_name(instance, "instance id"))
        if not folder.is_symlink():
            shutil.rmtree(folder, ignore_errors=True)


class DefinitionStore:
    """Job definitions, one file per revision (<folder>/definitions/<name>/<revision>.json),
    created exclusively (O_EXCL) so two processes registering one name get two revisions; reads
    are cached by file version."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder) / "definitions"
        self._cache: Dict[Path, Tuple[int, Dict[str, Any]]] = {}
        self._warned: Dict[Path, Any] = {}  # bad files, by version: warned about once
        self._lock = threading.Lock()

    def create(self, name: str, revision: int, definition: Dict[str, Any]) -> bool:
        """Write a new revision; False when another writer took that revision first."""
        folder = self.folder / name
        make_private_dirs(folder)
        return create_exclusively(folder / f"{revision}.json", definition)

    def write(self, name: str, revision: int, definition: Dict[str, Any]) -> None:
        write_atomically(self.folder / name / f"{revision}.json", _dumps(definition))

    def _read(self, path: Path) -> Optional[Dict[str, Any]]:
        try:
            stamp = path.stat().st_mtime_ns
        except FileNotFoundError:
            return None
        with self._lock:
            cached = self._cache.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        definition = read_checked(path, schema.DEFINITION_RECORD, self._warned, stamp)
        if definition is None:
            return None  # being written by another process, or bad
        with self._lock:
            self._cache[path] = (stamp, definition)
        return definition

    def names(self) -> List[str]:
        try:
            return sorted(os.listdir(self.folder))
        except FileNotFoundError:
            return []

    def revisions(self, name: str) -> List[Dict[str, Any]]:
        """Every readable revision of `name`, oldest first."""
        try:
            files = [f for f in os.listdir(self.folder / name)
                     if f.endswith(".json") and f[:-5].isdigit()]
        except (FileNotFoundError, NotADirectoryError):
            return []
        found = [self._read(self.folder / name / f) for f in files]
        return sorted((d for d in found if d), key=lambda d: d["revision"])


class QueueStore:
    """Job queues, one file each (<folder>/queues/<name>.json), so every instance on a folder
    sees the same queues and states; reads are cached by file version."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder) / "queues"
        make_private_dirs(self.folder)
        self._cache: Dict[str, Tuple[Any, Dict[str, Any]]] = {}
        self._warned: Dict[Path, Any] = {}  # bad files, by version: warned about once
        self._lock = threading.Lock()

    def create(self, name: str, record: Dict[str, Any]) -> bool:
        """Write a new queue's file; False when the queue exists already."""
        return create_exclusively(self.folder / f"{name}.json", record)

    def write(self, name: str, record: Dict[str, Any]) -> None:
        write_atomically(self.folder / f"{name}.json", _dumps(record))

    def remove(self, name: str) -> None:
        """A deleted queue's file (DeleteJobQueue, once its DELETING status has passed)."""
        try:
            (self.folder / f"{name}.json").unlink()
        except OSError:
            pass
        with self._lock:
            self._cache.pop(name, None)

    def load(self, name: str) -> Optional[Dict[str, Any]]:
        path = self.folder / f"{name}.json"
        try:
            stat = path.stat()
        except OSError:
            return None
        version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        with self._lock:
            cached = self._cache.get(name)
            if cached is not None and cached[0] == version:
                return cached[1]
        record = read_checked(path, schema.QUEUE_RECORD, self._warned, version)
        if record is None:  # being replaced right now, or bad (warned about)
            return cached[1] if cached is not None else None
        with self._lock:
            self._cache[name] = (version, record)
        return record

    def names(self) -> List[str]:
        records = [(self.load(n) or {}, n) for n in record_names(self.folder)]
        return [n for record, n in sorted(records, key=lambda item: (item[0].get("order", 0), item[1]))
                if record]


class Persister:
    """Writes dirty jobs' records at most every PERSIST_EVERY seconds, from its own thread.

    `snapshot(job)` is called under the emulator's lock and returns (job id, parent text,
    {chunk: text}, or None to delete); files are written outside the lock.
    """

    def __init__(self, store: RecordStore, lock: threading.RLock,
                 snapshot: Callable[[Job], Optional[Tuple[str, str, Dict[int, str]]]]) -> None:
        self.store = store
        self.dirty: Set[Job] = set()  # jobs announce themselves here (Job.sink)
        self._lock = lock
        self._snapshot = snapshot
        self._flush_lock = threading.Lock()
        self._deletions: List[Tuple[str, List[Path]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bf-emulator-records", daemon=True)
        self._thread.start()

    def delete(self, job_id: str, extra_files: List[Path]) -> None:
        """Forget a job's record (and files such as its logs) at the next flush."""
        with self._lock:
            self._deletions.append((job_id, extra_files))

    def flush(self) -> None:
        with self._flush_lock:
            with self._lock:
                jobs = list(self.dirty)
                self.dirty.clear()  # cleared in place: jobs hold a reference to this set
                snapshots = [self._snapshot(job) for job in jobs]
                deletions, self._deletions = self._deletions, []
            for item in snapshots:
                if item is None:
                    continue
                job_id, parent, chunks = item
                try:
                    self.store.write(job_id, parent, chunks)
                except OSError:
                    logger.exception("batchfutures emulator: could not write the record of %s", job_id)
            for job_id, files in deletions:
                self.store.delete(job_id)
                for path in files:
                    try:
                        path.unlink()
                    except OSError:
                        pass

    def _run(self) -> None:
        while not self._stop.wait(PERSIST_EVERY):
            try:
                self.flush()
            except Exception:  # a full disk must not stop the emulator
                logger.exception("batchfutures emulator: persisting records failed")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.flush()
