"""Which stored runs are finished and may be removed, and removing them.

    storage.list_runs() ─────────────────> run id, newest write in the run
    storage.list_job_pointers() + read ──> Batch job id -> (run id, job key), pointer's time
    storage.run_job_keys(run) ───────────> the job payloads a run holds
    DescribeJobs(every recorded job id) ─> ended, still active, or unknown to Batch
                  │
                  v
    decide(states, age, horizon, all_finished)      pure, table-tested
                  │
                  v
    storage.delete_run(run, its job ids)            payloads, results and job pointers
    cache.forget_runs(removed runs)                 their cache index objects (R/cache/...)

A run is never removed while one of its jobs is active. A run whose jobs have all ended goes
once it is older than the horizon (or at once with ``all_finished``: `cleanup --all`). A run
Batch cannot vouch for (a job it no longer knows, a payload with no job id recorded: being
submitted right now, or a failed submit) goes only once it is older than the horizon and than
UNCERTAIN_MIN_AGE, whatever ``all_finished`` says: DescribeJobs may miss a job for a while
after SubmitJob, and a payload is written before its job is submitted.

A dead client's warm queues (warmpool.py: ``<stack>-warm-<run>-<key>-work``/``-done``, tagged
``batchfutures:run``) go with their run:

    ListQueues(QueueNamePrefix=<stack>-warm-, paged) ──> queue URLs
    ListQueueTags(each) ───────────────────────────────> its run id
    decide_queue(run's decision, run's age, horizon)      pure, table-tested
    DeleteQueue                                           remove_queues

A queue goes when its run is removed by the decision above, or when its run is no longer in
storage (removed before, or expired by the bucket's lifecycle rule) and the run started longer
ago than the horizon and UNCERTAIN_MIN_AGE (its id says when); it stays while its run is kept
(in progress, or too new), and a queue without the tag is never touched.

`remove_finished_runs(env)` is what an executor on `LocalEnvironment` calls when its session
starts, so local storage stays bounded (BATCHFUTURES_LOCAL_RETENTION_DAYS, default 7). On S3 the
CloudFormation template's lifecycle rule expires payloads instead.
"""

from __future__ import annotations

import calendar
import concurrent.futures
import enum
import logging
import os
import stat
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import batchapi, sqsapi, workdir
from .batchapi import BatchAPI
from .cache import forget_runs
from .errors import ConfigurationError
from .sqsapi import SQSAPI, is_queue_gone
from .statuses import FINISHED

if TYPE_CHECKING:
    from .environments import Environment
    from .storage import Storage

__all__ = ["JobState", "Decision", "RunReport", "decide", "job_state", "survey", "remove",
           "remove_finished_runs", "local_retention_seconds", "RETENTION_VARIABLE",
           "QueueReport", "RUN_TAG", "decide_queue", "run_started", "warm_queue_prefix",
           "list_queue_urls", "survey_queues", "remove_queues", "sqs_client_for"]

logger = logging.getLogger("batchfutures")

RETENTION_VARIABLE = "BATCHFUTURES_LOCAL_RETENTION_DAYS"
DEFAULT_RETENTION_DAYS = 7.0
# A run Batch cannot vouch for is at least this old before it goes (longer than DescribeJobs'
# lag after SubmitJob, and than any upload-then-submit).
UNCERTAIN_MIN_AGE = 3600.0
POINTER_SLACK = 3600.0  # how much later than its run's newest write a pointer may be written
_POINTER_READERS = 16  # parallel GETs of job pointers on an object store


class JobState(enum.Enum):
    """What cleanup knows of one job payload of a run."""

    ACTIVE = "active"  # Batch says it has not ended
    ENDED = "ended"  # SUCCEEDED or FAILED
    UNKNOWN = "unknown"  # a job id is recorded, but Batch does not know it (expired, or too new)
    UNSUBMITTED = "unsubmitted"  # a payload with no job id recorded (being submitted, or failed)


def job_state(status: Optional[str]) -> JobState:
    """The state of a recorded job from its Batch status (None: DescribeJobs left it out)."""
    if status is None:
        return JobState.UNKNOWN
    return JobState.ENDED if status in FINISHED else JobState.ACTIVE


@dataclass(frozen=True)
class Decision:
    remove: bool
    reason: str


def _age_text(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 60:.0f} minutes"


def decide(states: Sequence[JobState], age_seconds: Optional[float], horizon_seconds: float, *,
           all_finished: bool = False) -> Decision:
    """Whether a run may be removed, and why (the whole cleanup policy; no I/O).

    ``states``: one per job payload of the run; ``age_seconds``: since its newest write (None
    when storage gives no time); ``all_finished``: remove every run whose jobs have all ended,
    whatever its age.
    """
    active = sum(state is JobState.ACTIVE for state in states)
    if active:
        return Decision(False, f"in progress: {active} job(s) have not ended")
    age = -1.0 if age_seconds is None else age_seconds  # no time known: never "old"
    uncertain = sum(state in (JobState.UNKNOWN, JobState.UNSUBMITTED) for state in states)
    if uncertain or not states:
        what = (f"{uncertain} job(s) Batch does not know or that were never submitted"
                if states else "no job recorded")
        wait = max(horizon_seconds, UNCERTAIN_MIN_AGE)
        if age >= wait:
            return Decision(True, f"{what}, untouched for {_age_text(age)}")
        return Decision(False, f"{what}: kept until it is older than {_age_text(wait)}")
    if all_finished:
        return Decision(True, f"finished: all {len(states)} job(s) ended")
    if age >= horizon_seconds:
        return Decision(True, f"finished {_age_text(age)} ago")
    return Decision(False, f"finished, but newer than {_age_text(horizon_seconds)}")


@dataclass
class RunReport:
    """One run, what Batch says of its jobs, and the decision."""

    run_id: str
    url: str
    age_seconds: Optional[float]
    job_ids: List[str] = field(default_factory=list)
    states: List[JobState] = field(default_factory=list)
    decision: Decision = Decision(False, "")

    def as_dict(self) -> Dict[str, Any]:
        return {"run": self.run_id, "url": self.url, "ageSeconds": self.age_seconds,
                "jobs": self.job_ids, "remove": self.decision.remove,
                "reason": self.decision.reason}


def _read_pointers(storage: Storage, job_ids: Sequence[str]) -> Dict[str, Optional[str]]:
    if storage.local or len(job_ids) < 2:
        return {job_id: storage.read_job_pointer(job_id) for job_id in job_ids}
    with concurrent.futures.ThreadPoolExecutor(_POINTER_READERS) as pool:
        return dict(zip(job_ids, pool.map(storage.read_job_pointer, job_ids)))


def _statuses(batch: BatchAPI, job_ids: Sequence[str]) -> Dict[str, str]:
    return {job["jobId"]: job.get("status", "") for job in batchapi.describe_jobs(batch, list(job_ids))}


def survey(storage: Storage, batch: BatchAPI, *, horizon_seconds: float, all_finished: bool = False,
           now: Optional[float] = None) -> List[RunReport]:
    """Every stored run with its decision. Only runs that could be removed are asked about.

    A run younger than the horizon is not described to Batch unless ``all_finished`` (the
    decision keeps it anyway), so the automatic local cleanup costs listings only, mostly.
    """
    now = time.time() if now is None else now
    runs = dict(storage.list_runs())
    any_old = any(t is not None and now - t >= horizon_seconds for t in runs.values())
    pointers = storage.list_job_pointers() if all_finished or any_old else []
    if not all_finished:
        # A pointer is written right after SubmitJob, right after its inputs: a run old enough
        # to go has only old pointers, so the young ones (most, in a busy folder) are not read.
        limit = now - horizon_seconds + POINTER_SLACK
        pointers = [(job_id, t) for job_id, t in pointers if t is None or t <= limit]
    targets = _read_pointers(storage, [job_id for job_id, _ in pointers])
    pointer_time = dict(pointers)
    jobs_of: Dict[str, Dict[str, str]] = {}  # run -> job key -> job id
    newest: Dict[str, float] = {}
    for job_id, job_url in targets.items():
        where = storage.split_job_url(job_url) if job_url else None
        if where is None:
            continue
        run_id, job_key = where
        jobs_of.setdefault(run_id, {})[job_key] = job_id
        written = pointer_time.get(job_id)
        if written is not None:
            newest[run_id] = max(newest.get(run_id, written), written)
    reports: List[RunReport] = []
    candidates: List[Tuple[RunReport, List[Optional[str]]]] = []
    for run_id, modified in sorted(runs.items()):
        times = [t for t in (modified, newest.get(run_id)) if t is not None]
        age = now - max(times) if times else None
        report = RunReport(run_id, storage.run_url(run_id), age)
        reports.append(report)
        could_go = all_finished or (age is not None and age >= horizon_seconds)
        if not could_go:
            report.decision = Decision(False, f"newer than {_age_text(horizon_seconds)}")
            continue
        keys = storage.run_job_keys(run_id)
        recorded = jobs_of.get(run_id, {})
        report.job_ids = sorted(recorded.values())
        candidates.append((report, [recorded.get(key) for key in keys]))
    statuses = _statuses(batch, sorted({j for _, ids in candidates for j in ids if j}))
    for report, ids in candidates:
        report.states = [JobState.UNSUBMITTED if job_id is None else job_state(statuses.get(job_id))
                         for job_id in ids]
        report.decision = decide(report.states, report.age_seconds, horizon_seconds,
                                 all_finished=all_finished)
    return reports


def _no_symlink_below(root: str, *parts: str) -> bool:
    """Whether root/parts... exists as written, no component of it below ``root`` a symlink
    (lstat, never followed), and stays under ``root``."""
    path = root
    for part in parts:
        path = os.path.join(path, part)
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                return False
        except FileNotFoundError:
            return True  # nothing there to remove (or to follow)
    return workdir.inside(root, path)


def _removable(storage: Storage, run_id: str, job_ids: Sequence[str]) -> bool:
    """Only a run id of the run-id shape, and on local disk only through no symlink."""
    if not workdir.is_run_id(run_id):
        logger.warning("batchfutures: cleanup skips %r: not a run id (%s)", run_id, workdir.RUN_ID.pattern)
        return False
    if getattr(storage, "local", False):
        root = storage.root
        paths = [("runs", run_id)] + [("jobs", job_id) for job_id in job_ids]
        if not all(_no_symlink_below(root, *parts) for parts in paths):
            logger.warning("batchfutures: cleanup skips the run %s: a symbolic link in its path "
                           "under %s (cleanup never follows one)", run_id, root)
            return False
    return True


def remove(storage: Storage, reports: Iterable[RunReport]) -> List[str]:
    """Delete the runs decided removable (payloads, results, job pointers); their ids.

    Only names of the run-id shape are removed, and on local disk never through a symbolic link
    (a planted ``storage/runs`` link is skipped, its target untouched)."""
    removed = []
    for report in reports:
        if report.decision.remove and _removable(storage, report.run_id, report.job_ids):
            storage.delete_run(report.run_id, report.job_ids)
            removed.append(report.run_id)
    if removed:  # their cache index objects point at nothing now (batchfutures.cache)
        forget_runs(storage, removed)
    return removed


def local_retention_seconds(environ: Mapping[str, str] = os.environ) -> Optional[float]:
    """The local horizon from BATCHFUTURES_LOCAL_RETENTION_DAYS (days; "off" keeps everything)."""
    text = environ.get(RETENTION_VARIABLE, "").strip()
    if not text:
        return DEFAULT_RETENTION_DAYS * 86400
    if text.lower() in ("off", "never", "none"):
        return None
    try:
        days = float(text)
    except ValueError:
        days = -1.0
    if not days >= 0:  # also refuses nan
        raise ConfigurationError(
            f"{RETENTION_VARIABLE}={text!r}: give a number of days (0 or more), or 'off'")
    return days * 86400


def remove_finished_runs(env: Environment, older_than_seconds: Optional[float] = None) -> List[str]:
    """Remove the runs of ``env``'s storage that are finished and older than the horizon.

    ``older_than_seconds`` None reads BATCHFUTURES_LOCAL_RETENTION_DAYS (default 7 days; "off"
    removes nothing). Never removes a run in progress; never raises for a storage or Batch
    hiccup (it logs and leaves the runs in place). Returns the removed run ids.
    """
    horizon = local_retention_seconds() if older_than_seconds is None else older_than_seconds
    if horizon is None:
        return []
    try:
        reports = survey(env.storage, env.batch, horizon_seconds=horizon)
        removed = remove(env.storage, reports)
    except Exception as error:  # housekeeping must never stop the user's work
        logger.warning("batchfutures: the cleanup of finished runs in %s failed: %s",
                       env.storage.root_url, error)
        return []
    if removed:
        logger.info("batchfutures: removed %d finished run(s) older than %s from %s",
                    len(removed), _age_text(horizon), env.storage.root_url)
    return removed


# -- the warm pools' queues -------------------------------------------------------------------
RUN_TAG = "batchfutures:run"  # warmpool.py tags its queues with their run id
_QUEUE_PAGE = 1000  # ListQueues' MaxResults at most


@dataclass
class QueueReport:
    """One warm queue, its run, and the decision."""

    url: str
    run_id: Optional[str]
    decision: Decision

    def as_dict(self) -> Dict[str, Any]:
        return {"queue": self.url, "run": self.run_id, "remove": self.decision.remove,
                "reason": self.decision.reason}


def warm_queue_prefix(stack: Optional[str]) -> str:
    """What every warm queue's name of ``stack`` starts with (warmpool.queue_base, whose stack
    part is cut to one length: run ids and pool keys have one length each)."""
    # start-up: warmpool adds ~1.3 ms to a local session's start (it imports this module to
    # clean finished runs up); only the CLI's cleanup of warm queues needs it
    from .warmpool import queue_base

    run, key = "20000101T000000-0000000000", "00000000"
    base = queue_base(stack, run, key)
    return base[:len(base) - len(f"{run}-{key}")]


def run_started(run_id: str) -> Optional[float]:
    """When a run started (epoch seconds): its id begins with the UTC time (session.py)."""
    if not workdir.is_run_id(run_id):
        return None
    return float(calendar.timegm(time.strptime(run_id[:15], "%Y%m%dT%H%M%S")))


def decide_queue(run_id: Optional[str], run_decision: Optional[Decision],
                 run_age_seconds: Optional[float], horizon_seconds: float) -> Decision:
    """Whether a warm queue may be deleted, and why (no I/O).

    ``run_decision``: the decision on its run (None: the run is not in storage);
    ``run_age_seconds``: since the run started, from its id (None: unknown)."""
    if run_id is None or not workdir.is_run_id(run_id):
        return Decision(False, f"no {RUN_TAG} tag of a run id: not a queue batchfutures made")
    if run_decision is not None:
        if run_decision.remove:
            return Decision(True, f"its run {run_id} goes: {run_decision.reason}")
        return Decision(False, f"its run {run_id} stays: {run_decision.reason}")
    wait = max(horizon_seconds, UNCERTAIN_MIN_AGE)
    if run_age_seconds is not None and run_age_seconds >= wait:
        return Decision(True, f"its run {run_id} is gone from storage and started "
                              f"{_age_text(run_age_seconds)} ago")
    return Decision(False, f"its run {run_id} is not in storage: kept until it started more "
                           f"than {_age_text(wait)} ago")


def list_queue_urls(sqs: SQSAPI, prefix: str) -> List[str]:
    """Every queue URL whose name starts with ``prefix`` (ListQueues, page by page)."""
    urls: List[str] = []
    params: Dict[str, Any] = {"QueueNamePrefix": prefix, "MaxResults": _QUEUE_PAGE}
    while True:
        answer = sqs.list_queues(**params)
        urls.extend(answer.get("QueueUrls", []))
        token = answer.get("NextToken")
        if not token:
            return urls
        params["NextToken"] = token


def survey_queues(sqs: SQSAPI, reports: Sequence[RunReport], *, prefix: str,
                  horizon_seconds: float, now: Optional[float] = None) -> List[QueueReport]:
    """Every warm queue named ``prefix``... with its decision, from the runs' ``reports``."""
    now = time.time() if now is None else now
    decisions = {report.run_id: report.decision for report in reports}
    found: List[QueueReport] = []
    for url in list_queue_urls(sqs, prefix):
        try:
            tags = sqs.list_queue_tags(QueueUrl=url).get("Tags", {})
        except Exception as error:
            if is_queue_gone(error):  # deleted meanwhile (its pool shut down)
                continue
            raise
        run_id = tags.get(RUN_TAG)
        started = run_started(run_id) if run_id else None
        age = None if started is None else now - started
        found.append(QueueReport(url, run_id, decide_queue(run_id, decisions.get(run_id or ""),
                                                           age, horizon_seconds)))
    return found


def remove_queues(sqs: SQSAPI, reports: Iterable[QueueReport]) -> List[str]:
    """DeleteQueue for each queue decided removable; their URLs (one gone already counts)."""
    removed = []
    for report in reports:
        if not report.decision.remove:
            continue
        try:
            sqs.delete_queue(QueueUrl=report.url)
        except Exception as error:
            if not is_queue_gone(error):
                raise
        removed.append(report.url)
    return removed


def sqs_client_for(env: Environment) -> SQSAPI:
    """The SQS client ``env``'s warm pools use (the local emulator's folder, or the Region's)."""
    from .warmpool import sqs_spec_for  # start-up: as warm_queue_prefix's

    return sqsapi.client_for(sqs_spec_for(env), session=env.session)
