"""The job table: every job an emulator can describe, its own and other processes'.

    own jobs      submitted through this instance: live objects, run by its scheduler, written
                  to disk by the Persister (records.py) at most every 0.2 s
    foreign jobs  other instances' or processes' (same folder): read from their records, cached
                  by record version; an unfinished one whose owner process is gone is recovered
                  as FAILED (and that recovery written back)
    TTL           a finished job is forgotten `metadata_ttl` seconds after it stopped: dropped
                  from memory, its record and log files deleted

All reads and writes of records go through records.py (`RecordStore`, `Persister`,
`job_texts`); this module decides what a record means.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from ..statuses import FINISHED, JobStatus
from ..workdir import inside
from .jobstate import Job, Unit
from .logservice import stream_path
from .model import arn_resource
from .records import BadRecord, Persister, RecordStore, job_texts, process_alive
from .runtime.scheduler import now_ms

logger = logging.getLogger("batchfutures")

JOB_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
Signature = Tuple[int, int, int]  # RecordStore.signature: a record's version
EXIT_REASON = "batchfutures emulator: the process that ran this job (pid {pid}) exited before it finished"


class JobTable:
    """Own and foreign jobs by id (see the module doc); `lock` is the emulator's lock."""

    def __init__(self, folder: Path, lock: threading.RLock, owner: List[Any],
                 metadata_ttl: float) -> None:
        self.folder = folder
        self.lock = lock
        self.owner = owner
        self.metadata_ttl = metadata_ttl
        self.store = RecordStore(folder)
        self.own: Dict[str, Job] = {}
        self._foreign: Dict[str, Tuple[Optional[Signature], Job]] = {}  # by record version
        self._rejected: Dict[str, Signature] = {}  # bad records' versions: warned about once, skipped
        self._foreign_lock = threading.Lock()
        self.persister = Persister(self.store, lock, self._snapshot)

    # -- own jobs ----------------------------------------------------------------------------
    def add(self, job: Job) -> None:
        """A new own job (lock held): written at the next flush."""
        job.owner = self.owner
        job.sink = self.persister.dirty
        job.dirty.update(range(job.chunk_count))
        job.touch()
        self.own[job.job_id] = job

    def is_own(self, job: Job) -> bool:
        return self.own.get(job.job_id) is job

    def _snapshot(self, job: Job) -> Optional[Tuple[str, str, Dict[int, str]]]:
        """The texts of a dirty job's record (the lock is held)."""
        if self.own.get(job.job_id) is not job:
            job.dirty.clear()
            return None  # forgotten meanwhile
        chunks = sorted(k for k in job.dirty if k >= 0)
        job.dirty.clear()
        parent, texts = job_texts(job, self.owner, chunks)
        return job.job_id, parent, texts

    def forget_expired(self, finished: Deque[Job]) -> None:
        """Drop own jobs past the TTL, oldest first (`finished`: the scheduler's deque)."""
        now = now_ms()
        with self.lock:
            while finished and (finished[0].stopped is None or self.expired(finished[0], now)):
                job = finished.popleft()
                if self.own.get(job.job_id) is job and self.expired(job, now):
                    del self.own[job.job_id]
                    self.persister.delete(job.job_id, self.log_files(job))

    # -- finding jobs ------------------------------------------------------------------------
    def find(self, raw: str) -> Optional[Tuple[Job, Optional[Unit]]]:
        """The job (and child) an id or ARN names, or None when unknown or forgotten."""
        job_id = arn_resource(raw, "job") or raw
        parent_id, separator, index = job_id.partition(":")  # an array child
        if not separator:
            parent_id, separator, index = job_id.partition("#")  # a node of a multi-node job
        if separator and not (index.isascii() and index.isdigit() and len(index) <= 6):
            return None  # int() of "²" or of 5,000 digits raises; no job has a millionth child
        with self.lock:
            job = self.own.get(parent_id)
        if job is None:
            job = self.load_foreign(parent_id)
        if job is None or self.expired(job, now_ms()):
            return None
        if separator:
            if (separator == "#") != job.is_multinode:
                return None  # "id#n" names nodes only, "id:n" array children only
            unit = job.unit(int(index))
            return (job, unit) if unit is not None else None
        return job, None

    def retag(self, job_id: str, tags: Dict[str, str]) -> None:
        """A foreign job's tags, written into its record (its owner is gone: nobody else
        writes it)."""
        try:
            loaded = self.store.load(job_id)
        except BadRecord:
            return
        if loaded is None:
            return
        record = loaded[0]
        record["spec"]["tags"] = dict(tags)
        self.store.write(job_id, json.dumps(record, separators=(",", ":")), {})
        with self._foreign_lock:
            self._foreign.pop(job_id, None)

    def in_queue(self, queue: str) -> List[Job]:
        """Every job of `queue` not yet forgotten, own and foreign."""
        with self.lock:
            jobs = [j for j in self.own.values() if j.spec.queue == queue]
        for job_id in self.store.job_ids():
            if job_id not in self.own:
                job = self.load_foreign(job_id)
                if job is not None and job.spec.queue == queue:
                    jobs.append(job)
        now = now_ms()
        return [job for job in jobs if not self.expired(job, now)]

    def expired(self, job: Job, now: int) -> bool:
        return (job.status in FINISHED and job.stopped is not None
                and job.stopped < now - self.metadata_ttl * 1000)

    def status_of(self, job_id: str) -> Optional[JobStatus]:
        found = self.find(job_id)
        if found is None:
            return None
        job, unit = found
        return unit.status if unit is not None else job.status

    # -- foreign jobs ------------------------------------------------------------------------
    def load_foreign(self, job_id: str, *, cache: bool = True) -> Optional[Job]:
        """Another instance's (or an earlier process's) job, from its record."""
        if not JOB_ID.fullmatch(job_id):
            return None
        signature = self.store.signature(job_id)
        with self._foreign_lock:
            cached = self._foreign.get(job_id)
            if signature is None:
                self._foreign.pop(job_id, None)
                self._rejected.pop(job_id, None)
                return None
            if cached is not None and cached[0] == signature:
                job = cached[1]
            elif self._rejected.get(job_id) == signature:
                return None  # this version of the record was found bad already
            else:
                read = self._read_foreign(job_id, signature)
                if read is None:
                    return None
                job = read
                if cache:
                    self._foreign[job_id] = (signature, job)
            unfinished = job.status not in FINISHED or any(u.status not in FINISHED for u in job.units)
            if unfinished and not process_alive(job.owner):
                self._recover(job)
            if self.expired(job, now_ms()):
                self._foreign.pop(job_id, None)
                self.delete_files(job)
                return None
            return job

    def _read_foreign(self, job_id: str, signature: Signature) -> Optional[Job]:
        """The job of a record that passes the schema (schema.py); a bad one is skipped, with
        one warning per version naming the file and the field (caller holds _foreign_lock)."""
        try:
            loaded = self.store.load(job_id)
            if loaded is None:
                return None
            return Job.from_record(*loaded)
        except BadRecord as error:
            problem = str(error)
        except Exception as error:  # the schema let through what Job cannot take: still skip it
            problem = f"{self.store.path(job_id)}: {type(error).__name__}: {error}"
        self._rejected[job_id] = signature
        self._foreign.pop(job_id, None)
        logger.warning("batchfutures emulator: skipped the record of job %s: %s", job_id, problem)
        return None

    def _recover(self, job: Job) -> None:
        """Record as FAILED what a dead process left unfinished (caller holds _foreign_lock)."""
        pid = (job.owner or ["?"])[0]
        reason = EXIT_REASON.format(pid=pid)
        now = now_ms()
        for unit in job.units:
            if unit.status in FINISHED:
                continue
            if unit.current is not None:
                attempt, unit.current = unit.current, None
                attempt.update(stoppedAt=now, statusReason=reason)
                unit.attempts.append(attempt)
            job.move(unit, JobStatus.FAILED, now, reason)
        if job.has_children and job.status not in FINISHED:
            job.finish_parent(JobStatus.FAILED, reason, now)
        parent, chunks = job_texts(job, job.owner, range(job.chunk_count))
        self.store.write(job.job_id, parent, chunks)
        self._foreign[job.job_id] = (self.store.signature(job.job_id), job)

    def sweep(self, closed: Callable[[], bool]) -> None:
        """Recover unfinished records of dead processes, delete expired ones (at start)."""
        try:
            for job_id in list(self.store.job_ids()):
                if closed():
                    return
                with self.lock:
                    own = job_id in self.own
                if not own:
                    self.load_foreign(job_id, cache=False)
        except Exception:
            logger.exception("batchfutures emulator: sweeping old records failed")

    # -- files -------------------------------------------------------------------------------
    def log_files(self, job: Job) -> List[Path]:
        """The log files of a job's attempts: only stream names that are plain names under
        <folder>/logs (a record naming ``../..`` or a symlinked folder is skipped, with a warning)."""
        folder = self.folder / "logs"
        files = []
        for unit in job.units:
            for attempt in unit.attempts + ([unit.current] if unit.current else []):
                stream = (attempt.get("container") or {}).get("logStreamName")
                if not stream:
                    continue
                path = stream_path(folder, stream) if isinstance(stream, str) else None
                if path is None or not inside(folder, path):
                    logger.warning("batchfutures emulator: the record of %s names the log stream "
                                   "%r, not a file under %s: skipped", job.job_id, stream, folder)
                    continue
                files.append(path)
        return files

    def delete_files(self, job: Job) -> None:
        files = self.log_files(job)  # first: its warnings come before the record is seen gone
        self.store.delete(job.job_id)
        for path in files:
            try:
                path.unlink()
            except OSError:
                pass

    def close(self) -> None:
        self.persister.close()
