"""Job records on disk, so another emulator instance (or process) can describe past jobs.

    <folder>/jobs/<job id>.json   {"owner": [pid, start time], "detail": JobDetail of the job,
                                   "children": [[status, statusReason, startedAt, stoppedAt,
                                                 attempts], ...]}

Children are stored compactly and rebuilt from the parent's detail, so a 10,000-child array is
one small file. Files are written atomically (temporary name, then os.replace). A record still
active whose owner process is gone is reported FAILED with a reason that says so.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

ORPHAN_REASON = ("batchfutures emulator: the process that ran this job (pid {pid}) exited "
                 "before it finished")
TERMINAL = ("SUCCEEDED", "FAILED")


def _start_time(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def owner_token() -> List[Any]:
    pid = os.getpid()
    return [pid, _start_time(pid)]


def process_alive(owner: List[Any]) -> bool:
    pid, started = owner[0], owner[1] if len(owner) > 1 else None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return started is None or _start_time(pid) == started  # a reused pid is another process


class RecordStore:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def path(self, job_id: str) -> Path:
        return self.folder / f"{job_id}.json"

    def write(self, job_id: str, record: Dict[str, Any]) -> None:
        target = self.path(job_id)
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        with open(temporary, "w") as handle:
            json.dump(record, handle, separators=(",", ":"))
        os.replace(temporary, target)

    def load(self, job_id: str) -> Optional[Dict[str, Any]]:
        try:
            with open(self.path(job_id)) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return None

    def describe(self, job_id: str, horizon_ms: float) -> Optional[Dict[str, Any]]:
        """The JobDetail of ``job_id`` ("<id>" or "<id>:<i>") from its record, or None."""
        parent_id, _, index = job_id.partition(":")
        record = self.load(parent_id)
        if record is None:
            return None
        detail = record["detail"]
        if detail["status"] not in TERMINAL and not process_alive(record["owner"]):
            record = self._orphaned(parent_id, record)
            detail = record["detail"]
        if detail["status"] in TERMINAL and detail.get("stoppedAt", 0) < horizon_ms:
            return None
        if not index:
            return detail
        if not index.isdigit() or int(index) >= len(record["children"]):
            return None
        status, reason, started, stopped, attempts, container = record["children"][int(index)]
        child = json.loads(json.dumps(detail))
        child.update(jobId=job_id, jobArn=detail["jobArn"] + f":{index}", status=status,
                     attempts=attempts, arrayProperties={"index": int(index)}, startedAt=started or 0)
        child["container"].update(container)
        for key, value in (("statusReason", reason), ("stoppedAt", stopped)):
            if value is None:
                child.pop(key, None)
            else:
                child[key] = value
        return child

    def _orphaned(self, job_id: str, record: Dict[str, Any]) -> Dict[str, Any]:
        reason = ORPHAN_REASON.format(pid=record["owner"][0])
        stopped = int(time.time() * 1000)
        detail = record["detail"]
        detail.update(status="FAILED", statusReason=reason, stoppedAt=stopped)
        counts = {}
        for child in record["children"]:
            if child[0] not in TERMINAL:
                child[0], child[1], child[3] = "FAILED", reason, stopped
            counts[child[0]] = counts.get(child[0], 0) + 1
        if "arrayProperties" in detail and record["children"]:
            summary = detail["arrayProperties"].get("statusSummary") or {}
            for key in summary:
                summary[key] = counts.get(key, 0)
        self.write(job_id, record)
        return record

    def purge(self, horizon_ms: float, known_expired: Set[str]) -> None:
        """Delete records of jobs finished before the horizon."""
        for job_id in known_expired:
            try:
                self.path(job_id).unlink()
            except FileNotFoundError:
                pass
        try:
            entries = list(os.scandir(self.folder))
        except FileNotFoundError:
            return
        for entry in entries:
            if not entry.name.endswith(".json"):
                continue
            try:
                if entry.stat().st_mtime * 1000 >= horizon_ms:
                    continue
            except FileNotFoundError:
                continue
            record = self.load(entry.name[:-5])
            if record and record["detail"]["status"] in TERMINAL and \
                    record["detail"].get("stoppedAt", 0) < horizon_ms:
                try:
                    os.unlink(entry.path)
                except FileNotFoundError:
                    pass
