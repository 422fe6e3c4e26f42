"""Helpers of the emulator's tests: a checked emulator with submit/wait helpers, bounded waits.

Every wait is a bounded loop on an observable condition (never a fixed sleep), and nothing is
asserted about how long anything took.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, List, Optional

from model_check import Checked

QUEUE = "batchfutures"
DEFINITION = "batchfutures-worker"
TERMINAL = ("SUCCEEDED", "FAILED")
ORDER = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")
WAIT = 60.0  # seconds: generous, only hit when something is broken


def py(code: str) -> List[str]:
    """A job command running ``code`` in a fresh interpreter (-S: no site, starts faster)."""
    return ["python", "-S", "-c", code]


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Poll ``predicate`` until it returns something true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.01)


def pid_gone(pid: int) -> bool:
    """The process no longer runs (gone, or a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except OSError:
        return True


class Harness(Checked):
    """A checked emulator plus the few helpers every test needs."""

    def job(self, command: List[str], *, name: str = "job", size: Optional[int] = None,
            memory: Optional[int] = None, vcpus: Optional[float] = None,
            env: Optional[Dict[str, str]] = None, queue: str = QUEUE,
            definition: str = DEFINITION, **params: Any) -> str:
        """Submit a job running ``command``; its id."""
        overrides: Dict[str, Any] = {"command": command}
        requirements = []
        if vcpus is not None:
            requirements.append({"type": "VCPU", "value": str(vcpus)})
        if memory is not None:
            requirements.append({"type": "MEMORY", "value": str(memory)})
        if requirements:
            overrides["resourceRequirements"] = requirements
        if env:
            overrides["environment"] = [{"name": k, "value": v} for k, v in env.items()]
        request: Dict[str, Any] = dict(jobName=name, jobQueue=queue, jobDefinition=definition,
                                       containerOverrides=overrides, **params)
        if size is not None:
            request["arrayProperties"] = {"size": size}
        return self.submit_job(**request)["jobId"]

    def detail(self, job_id: str) -> Optional[Dict[str, Any]]:
        jobs = self.describe_jobs(jobs=[job_id])["jobs"]
        assert len(jobs) <= 1
        return jobs[0] if jobs else None

    def status(self, job_id: str) -> Optional[str]:
        found = self.detail(job_id)
        return found["status"] if found else None

    def wait(self, job_id: str, statuses: Iterable[str] = TERMINAL, timeout: float = WAIT,
             check: Optional[Callable[[Dict[str, Any]], bool]] = None) -> Dict[str, Any]:
        wanted = tuple(statuses)

        def reached() -> Optional[Dict[str, Any]]:
            found = self.detail(job_id)
            if found and found["status"] in wanted and (check is None or check(found)):
                return found
            return None

        return wait_until(reached, f"{job_id} to reach {wanted}", timeout)

    def run(self, command: List[str], **kwargs: Any) -> Dict[str, Any]:
        """Submit and wait until the job ends; its final JobDetail."""
        return self.wait(self.job(command, **kwargs))

    def log_lines(self, detail: Dict[str, Any], attempt: int = -1) -> List[str]:
        stream = detail["attempts"][attempt]["container"]["logStreamName"]
        lines, token = [], None
        while True:
            request: Dict[str, Any] = {"logGroupName": "/aws/batch/job", "logStreamName": stream,
                                       "startFromHead": True}
            if token:
                request["nextToken"] = token
            page = self.logs.get_log_events(**request)
            lines.extend(event["message"] for event in page["events"])
            if page["nextForwardToken"] == token:
                return lines
            token = page["nextForwardToken"]
