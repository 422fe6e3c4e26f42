"""Submission: a prepared job's children become one Batch job, now or as workers free up.

    PendingJob (settings, function pickles, one blob + futures per child)
        │  max_workers? wait in the queue until submitting keeps at most max_workers children
        │  unfinished; then as many children per Batch job as may start (Submitter.submit_paced)
        v
    Submitter.submit_now:
        1. the queue is checked once (ENABLED and VALID) before the first upload
        2. functions uploaded content-addressed, once per run (with an executor initializer,
           each function's pickle holds it too, serialization.dumps_function, and the initargs
           are uploaded once per session: header "initargs")
        3. one inputs object per Batch job (every child's items, indexed by byte range)
        4. SubmitJob from build_request (a pure function): only the worker command and a
           pointer to the inputs travel; sent exactly once (submit_exactly_once: after an
           ambiguous failure, looked up for the environment's describe_grace); on failure the
           inputs are deleted
        5. a pointer R/jobs/<job id> for attach, and a TrackedJob handed to the poller

Pacing is in the client, the same on the emulator and on AWS (see docs/architecture.md for why
not SEQUENTIAL arrays). A finished child's futures wake the poller, whose loop calls
`submit_paced` again.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import getpass
import json
import logging
import math
import random
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Tuple

from . import batchapi, logforward, reruns, serialization, wire
from ._version import __version__
from .batchlimits import MAX_ARRAY_SIZE, MAX_SUBMIT_PAYLOAD
from .callattempts import AttemptsReader
from .errors import (
    ABORT_REASON_PREFIX,
    OOM_REASON_PREFIX,
    TIMEOUT_REASON,
    BatchError,
    BudgetExceededError,
    ConfigurationError,
)
from .jobdefinitions import check_tags, definition_with_secrets, multinode_definition_from
from .jobs import TrackedJob, settle
from .settings import JobSettings
from .spending import PricingWhenAsked, Spending
from .spot import SpotFallback

if TYPE_CHECKING:
    from .environments import Environment
    from .storage import Storage

logger = logging.getLogger("batchfutures")

_UNREAD = object()
_JOB_NAME_BAD = re.compile(r"[^A-Za-z0-9_-]+")

# `retries` means retries: Batch tries a failed attempt again when no rule matches, so a crash
# (non-zero exit), a lost host, a Spot interruption and Batch's transient start failures (Task
# failed to start, CannotPullContainer, ResourceInitializationError) are retried by default.
# What would fail the same way again exits: an out-of-memory kill, a timeout (Batch itself does
# not retry those) and a termination this client asked for. An exception raised by the function
# is an outcome, not a failure: the worker exits 0. At most 5 rules (Batch's limit).
# Batch's own retries see exit codes and reasons only. A worker's MemoryError is exit 137 with no
# reason (its out-of-memory marker is in storage, which Batch cannot read): no rule matches, so
# Batch retries it like a crash within `retries`; an `onExitCode: 137` EXIT rule would also stop
# the retries of every plain SIGKILL. The client classifies it as MemoryLimitExceeded from the
# marker once the attempts are spent (docs/errors.md, "Retries").
RETRY_RULES = [
    {"onReason": f"{OOM_REASON_PREFIX}*", "action": "EXIT"},
    {"onStatusReason": f"{TIMEOUT_REASON}*", "action": "EXIT"},
    {"onStatusReason": f"{ABORT_REASON_PREFIX}*", "action": "EXIT"},
]


def job_name_for(fn: Any) -> str:
    """A Batch job name from a callable: letters, digits, '-' and '_', at most 128."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    name = _JOB_NAME_BAD.sub("-", str(name)).strip("-_") or "call"
    return f"bf-{name}"[:128]


def user_tag() -> str:
    try:
        return _JOB_NAME_BAD.sub("-", getpass.getuser())[:64] or "unknown"
    except Exception:
        return "unknown"


def build_request(settings: JobSettings, *, name: str, job_queue: str, job_definition: str,
                  command: List[str], size: int, memory_mib: int, run_id: str,
                  user: str, depends_on: Optional[List[Dict[str, str]]] = None,
                  signing_environment: Optional[Dict[str, str]] = None,
                  environment_tags: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """The SubmitJob request of one Batch job (``size`` children), from its settings alone.

    ``signing_environment``: where the worker finds the signing key (never the key itself, see
    signing.py) and the S3 guards; it replaces any user variable of the same name.
    ``environment_tags``: the environment's own (the stack's tag, which its client policy
    requires on SubmitJob and Cancel/TerminateJob); they replace user tags of the same key.
    """
    resources = [
        {"type": "VCPU", "value": _number(settings.vcpus)},
        {"type": "MEMORY", "value": str(memory_mib)},
    ]
    if settings.gpus:
        resources.append({"type": "GPU", "value": str(settings.gpus)})
    # the worker runs a child's items on this many processes (batchfutures.worker.pool)
    given = dict(settings.environment)
    given.setdefault("BATCHFUTURES_VCPUS", _number(settings.vcpus))
    given.update(signing_environment or {})
    environment = [{"name": k, "value": v} for k, v in sorted(given.items())]
    overrides: Dict[str, Any] = {
        "command": command,
        "resourceRequirements": resources,
        "environment": environment,
    }
    tags = {
        "batchfutures:run": run_id,
        "batchfutures:user": user,
        "batchfutures:version": __version__,
    }
    tags.update(dict(settings.tags))
    tags.update(environment_tags or {})
    request: Dict[str, Any] = {
        "jobName": name,
        "jobQueue": job_queue,
        "jobDefinition": job_definition,
        "containerOverrides": overrides,
        # spot_attempts: at most that many attempts on the Spot queue, then spot.SpotFallback
        "retryStrategy": {"attempts": settings.spot_attempts or settings.retries,
                          "evaluateOnExit": RETRY_RULES},
        "tags": tags,
        "propagateTags": True,
    }
    if settings.consumes:  # Batch's consumable resources (licences, connections) it holds
        request["consumableResourcePropertiesOverride"] = {"consumableResourceList": [
            {"consumableResource": name, "quantity": quantity}
            for name, quantity in settings.consumes]}
    if settings.nodes > 1:  # one multi-node parallel job: every node runs the same container
        request["nodeOverrides"] = multinode_overrides(settings.nodes,
                                                       request.pop("containerOverrides"))
    elif size > 1:
        request["arrayProperties"] = {"size": size}
    if depends_on:
        # N_TO_N pairs equal arrays child by child; anything else waits for the whole job
        request["dependsOn"] = [
            dict(entry) if size > 1 or entry.get("type") != "N_TO_N" else {"jobId": entry["jobId"]}
            for entry in depends_on]
    if settings.timeout is not None:
        request["timeout"] = {"attemptDurationSeconds": max(1, int(math.ceil(settings.timeout)))}
    if settings.share_id is not None:
        request["shareIdentifier"] = settings.share_id
    if settings.priority is not None:
        request["schedulingPriorityOverride"] = settings.priority
    return request


# AWS Batch's quotas page: "Maximum job payload size (for SubmitJob API operations): 30 KiB".
# Measured as botocore sends it: the request's JSON body (json.dumps, as its serializer does):
# batchlimits.MAX_SUBMIT_PAYLOAD.
# ECS RunTask: "A total of 8192 characters are allowed for overrides. This limit includes the JSON
# formatting characters of the override structure." Batch turns containerOverrides into the ECS
# task's overrides and adds its own AWS_BATCH_* variables (job id, queue, compute environment,
# attempt, array index: ~700 characters with ARNs): OVERRIDES_RESERVE is our allowance for them.
ECS_OVERRIDES_LIMIT = 8192
OVERRIDES_RESERVE = 1024


def request_size_problem(request: Dict[str, Any]) -> Optional[str]:
    """Why AWS would refuse this SubmitJob request for its size (which limit, how big, what to
    do), or None when it fits. Pure: the request as it will be sent (with its submission mark)."""
    body = len(json.dumps(request).encode("utf-8"))
    if body > MAX_SUBMIT_PAYLOAD:
        return (f"the SubmitJob request is {body:,} bytes, over AWS Batch's limit of 30 KiB "
                f"({MAX_SUBMIT_PAYLOAD:,} bytes) for a job's payload; its largest parts: "
                f"{_largest_parts(request)}. Keep environment= and tags= small: large values "
                f"travel as the function's arguments, which go through storage, not the request")
    overrides = [request.get("containerOverrides")] + [
        entry.get("containerOverrides")
        for entry in (request.get("nodeOverrides") or {}).get("nodePropertyOverrides") or []]
    allowed = ECS_OVERRIDES_LIMIT - OVERRIDES_RESERVE
    for override in filter(None, overrides):
        size = len(json.dumps(override))
        if size > allowed:
            parts = ", ".join(f"{name} {len(json.dumps(override[name])):,}"
                              for name in sorted(override, key=lambda n: -len(json.dumps(override[n]))))
            return (f"the job's container overrides are {size:,} characters; ECS allows 8,192 "
                    f"for a task's overrides, of which AWS Batch's own AWS_BATCH_* variables "
                    f"take up to ~{OVERRIDES_RESERVE:,}, so at most {allowed:,} are ours "
                    f"(by part: {parts}). Pass fewer or shorter environment= variables: large "
                    f"values travel as the function's arguments, through storage")
    return None


def _largest_parts(request: Dict[str, Any]) -> str:
    sizes = {name: len(json.dumps(value).encode("utf-8")) for name, value in request.items()}
    overrides = request.get("containerOverrides") or {}
    for name, value in overrides.items():  # the parts users fill: environment above all
        sizes[f"containerOverrides.{name}"] = len(json.dumps(value).encode("utf-8"))
    sizes.pop("containerOverrides", None)
    biggest = sorted(sizes.items(), key=lambda item: -item[1])[:3]
    return ", ".join(f"{name} {size:,} bytes" for name, size in biggest)


def check_request_size(request: Dict[str, Any]) -> None:
    """ConfigurationError (before anything is uploaded) when AWS would refuse the request's size."""
    problem = request_size_problem(request)
    if problem is not None:
        raise ConfigurationError(problem + "; nothing was uploaded or submitted.")


def multinode_overrides(nodes: int, container_overrides: Dict[str, Any]) -> Dict[str, Any]:
    """SubmitJob's nodeOverrides for ``nodes`` nodes, each with the same containerOverrides
    (a multi-node job takes no containerOverrides of its own, and no arrayProperties)."""
    return {"numNodes": int(nodes),
            "nodePropertyOverrides": [{"targetNodes": "0:",
                                       "containerOverrides": container_overrides}]}


@dataclass
class PendingJob:
    """One Batch job's children, ready to be submitted."""

    settings: JobSettings
    function_pickles: List[bytes]
    blobs: List[bytes]  # each child's items (wire's ``encoding``)
    item_counts: List[int]
    futures: List[List[Any]]  # per child: one future per item, or with ``per_child`` one
    chunksize: int
    name: str
    encoding: str = wire.CALLS
    per_child: bool = False
    depends_on: List[Dict[str, str]] = field(default_factory=list)  # SubmitJob's dependsOn
    # retry_on_oom's resubmissions (Submitter.resubmit, never paced): per child, where its items
    # are stored and its earlier tries; the worker reads them there (header "sources")
    retried: Optional[List[Any]] = None
    # a rerun of dependents (Submitter.rerun): upstream results that moved, (first job_url,
    # child, current job_url, child); the worker's Resolver reads them there (header "redirects")
    redirects: Optional[List[Tuple[str, int, str, int]]] = None
    # a Spot fallback (Submitter.fall_back, never paced): the queue it goes to, and per child
    # its attempts in the job it left (future.attempts lists them first)
    queue: Optional[str] = None
    earlier_attempts: Optional[List[List[Any]]] = None

    def _with(self, keep: List[int], depends_on: List[Dict[str, str]]) -> "PendingJob":
        return PendingJob(self.settings, self.function_pickles, [self.blobs[i] for i in keep],
                          [self.item_counts[i] for i in keep], [self.futures[i] for i in keep],
                          self.chunksize, self.name, self.encoding, self.per_child, depends_on)

    def take(self, count: int) -> "PendingJob":
        """The first ``count`` children as a job of their own; this one keeps the rest.

        A part is no longer the upstream array's twin: N_TO_N becomes a wait for the whole job.
        """
        if count >= len(self.blobs):
            part = self._with(list(range(len(self.blobs))), self.depends_on)
        else:
            self.depends_on = [{"jobId": entry["jobId"]} for entry in self.depends_on]
            part = self._with(list(range(count)), self.depends_on)
        del self.blobs[:count], self.item_counts[:count], self.futures[:count]
        return part

    def wanted(self) -> "PendingJob":
        """Without the children whose every future is already done (cancelled while waiting)."""
        keep = [i for i, group in enumerate(self.futures) if _wanted(group)]
        if len(keep) == len(self.futures):
            return self
        return self._with(keep, [{"jobId": entry["jobId"]} for entry in self.depends_on])


def _wanted(group: List[Any]) -> bool:
    return any(not future.done() for future in group)


def fail_all(futures: List[List[Any]], error: BaseException) -> None:
    """Every future of these children raises ``error`` (wrapped when it is Batch's)."""
    failure = error if isinstance(error, BatchError) else wrap_submit_error(error)
    for group in futures:
        for future in group:
            settle(future, False, failure)


class Submitter:
    """Uploads and submits a session's jobs; paces them under ``max_workers``."""

    def __init__(self, env: Environment, storage: Storage, run_id: str, *,
                 track: Callable[[TrackedJob], None], wake: Callable[[], None],
                 max_workers: Optional[int] = None, initargs: Optional[bytes] = None,
                 echo_output: bool = False) -> None:
        """``initargs``: the executor initializer's arguments, pickled (the functions' pickles
        hold the initializer itself); ``echo_output``: the workers keep what each call prints
        and the client writes it to its sys.stdout/sys.stderr as the future resolves."""
        self._env = env
        self._storage = storage
        self._run_id = run_id
        self._track = track
        self._wake = wake
        self.max_workers = max_workers
        self._initargs = initargs
        self._initargs_url: Optional[str] = None
        self.files: Optional[bytes] = None  # files=: the archive (shipfiles.pack), put once a run
        self.live_tail: Optional[Any] = None  # echo_output="live": the session's livetail.LiveTail
        self._files_url: Optional[str] = None
        self.echo_output = echo_output
        self._queue_checked = False
        self._lock = threading.Lock()
        self._pace_lock = threading.Lock()  # one submitter at a time: free workers stay counted
        # set when the session drops what waits (shutdown with cancel, Ctrl-C, terminate): a
        # throttled SubmitJob stops waiting for the account's budget then
        self._stopped = threading.Event()
        self.submit_budget = batchapi.SUBMIT_BUDGET  # failures other than throttling (tests narrow it)
        self._waiting: Deque[PendingJob] = collections.deque()
        self._in_flight: List[List[List[Any]]] = []  # per paced job: its children's futures
        self.submitted_jobs: List[str] = []
        self._placeable_mib: Any = _UNREAD  # retry_on_oom's cap, read at its first use
        # cache=True: writes the job's cache index before SubmitJob (cache.CallCache.write_index)
        self.before_submit: Optional[Callable[[Any, PendingJob, str], None]] = None
        # max_cost= and ex.cost: the estimate of the calls that ended (spending.py); how the
        # queue's calls are priced (spending.PricingWhenAsked), read when a cost is first asked
        self.spending = Spending()
        self._pricing: Any = _UNREAD

    # -- pacing ----------------------------------------------------------------------------
    def submit(self, job: PendingJob) -> None:
        """Submit now, or with ``max_workers`` queue it and submit what may start now."""
        if job.settings.nodes > 1 and (len(job.blobs) != 1 or job.encoding != wire.CALLS):
            raise ConfigurationError(f"nodes={job.settings.nodes} runs one call on every node of "
                                     f"one multi-node job: use submit(), not map()")
        if self.max_workers is None:
            self.submit_now(job)
            return
        # copies: taking children off a waiting job must not change the caller's lists
        job = job._with(list(range(len(job.blobs))), list(job.depends_on))
        with self._lock:
            self._waiting.append(job)
        self.submit_paced(raise_errors=True)

    def submit_paced(self, *, raise_errors: bool = False) -> None:
        """Submit waiting children, oldest first, while fewer than ``max_workers`` are unfinished."""
        if self.max_workers is None:
            return
        with self._pace_lock:
            while True:
                with self._lock:
                    if not self._waiting:
                        return
                    free = self.max_workers - self._unfinished_children()
                    if free <= 0:
                        return
                    head = self._waiting[0]
                    part = head.take(min(free, MAX_ARRAY_SIZE)).wanted()
                    if not head.blobs:
                        self._waiting.popleft()
                    if not part.blobs:
                        continue
                    self._in_flight.append(part.futures)
                for group in part.futures:  # a finished child frees a worker: submit the next
                    for future in group:
                        future.add_done_callback(self._on_child_done)
                try:
                    self.submit_now(part)
                except BaseException as error:
                    fail_all(part.futures, error)
                    if isinstance(error, BudgetExceededError):  # nothing waiting is sent now
                        with self._lock:
                            dropped, self._waiting = list(self._waiting), collections.deque()
                        for waiting in dropped:
                            fail_all(waiting.futures, error)
                    if raise_errors or not isinstance(error, Exception):
                        raise
                    logger.warning("batchfutures: could not submit %d waiting children: %s",
                                   len(part.futures), error)

    def _unfinished_children(self) -> int:
        self._in_flight = [job for job in self._in_flight if any(_wanted(g) for g in job)]
        return sum(1 for job in self._in_flight for group in job if _wanted(group))

    def _on_child_done(self, _future: Any) -> None:
        self._wake()

    def has_waiting(self) -> bool:
        with self._lock:
            return bool(self._waiting)

    def waiting_futures(self) -> List[Any]:
        with self._lock:
            return [f for job in self._waiting for group in job.futures for f in group]

    def drop_waiting(self) -> List[Any]:
        """Forget the children not sent yet; their futures (for the caller to cancel). A
        SubmitJob waiting out throttling stops waiting (its futures are cancelled)."""
        self._stopped.set()
        with self._lock:
            futures = [f for job in self._waiting for group in job.futures for f in group]
            self._waiting.clear()
        return futures

    # -- one Batch job -----------------------------------------------------------------------
    def submit_now(self, job: PendingJob) -> TrackedJob:
        """Upload one Batch job's payload, submit it, and hand it to the poller."""
        # max_cost reached: BudgetExceededError, before anything is uploaded or sent
        self.spending.check(sum(len(group) for group in job.futures))
        self._check_queue_once()
        storage = self._storage
        job_key = uuid.uuid4().hex
        job_url = storage.job_url(self._run_id, job_key)
        items = sum(job.item_counts)
        memory = job.settings.memory_mib(self._env.definition_memory())
        variables = self._job_environment()
        if job.settings.requirements is not None:  # built or found before anything is uploaded
            # start-up: envbuild costs ~2 ms of the executor's import; only requirements= needs it
            from . import envarchive, envbuild

            pointer = envbuild.prepare(self._env, storage, job.settings.requirements,
                                       job.function_pickles, job.blobs)
            if pointer is not None:
                variables[envarchive.POINTER_VARIABLE] = pointer
        request = build_request(job.settings, name=job.name,
                                job_queue=job.queue or self._queue_for(job.settings),
                                job_definition=self._definition_for(job.settings),
                                command=self._env.worker_command(job_url), size=len(job.blobs),
                                memory_mib=memory, run_id=self._run_id, user=user_tag(),
                                depends_on=job.depends_on,
                                signing_environment=variables,
                                environment_tags=self._env.job_tags())
        # before anything is uploaded: tags Batch would refuse, or fail the job for; a request
        # over SubmitJob's size limits
        check_tags({**request["tags"], batchapi.SUBMISSION_TAG: "x"}, self._env.definition_tags())
        check_request_size(batchapi.with_submission_token(request, uuid.uuid4().hex))
        try:
            function_urls = [storage.put_function(self._run_id, data)  # content-addressed
                             for data in job.function_pickles]
        except (FileNotFoundError, PermissionError) as error:
            raise storage_error(storage, error) from error
        header: Dict[str, Any] = {
            "functions": function_urls,
            "children": len(job.blobs),
            "items": items,
            "chunksize": job.chunksize,
            "encoding": job.encoding,
            "run_id": self._run_id,
            "job_key": job_key,
        }
        if job.settings.nodes > 1:  # attach resolves it from every node's result
            header["nodes"] = job.settings.nodes
        if self._initargs is not None:
            header["initargs"] = self._initargs_location()
        if self.files is not None:  # unpacked into each call's working directory
            header["files"] = self._files_location()
        if self.echo_output:  # the worker keeps each item's stdout/stderr in its result
            header["output"] = True
            # and its logging records, made only at the levels this client keeps
            header["log_levels"] = logforward.client_levels()
        if self.live_tail is not None:  # its lines reach the log as printed: line-buffered
            header["live"] = True
        if job.retried:
            header["sources"] = [list(history.origin) for history in job.retried]
        if job.redirects:
            header["redirects"] = [list(moved) for moved in job.redirects]
        header.update(serialization.payload_stamp())  # the worker checks its versions against these
        try:
            storage.write_inputs(job_url, header, job.blobs)
        except (FileNotFoundError, PermissionError) as error:
            raise storage_error(storage, error) from error
        if self.before_submit is not None:
            self.before_submit(storage, job, job_url)
        def keep_waiting() -> bool:  # throttled: wait while the executor and a future want it
            return not self._stopped.is_set() and any(_wanted(group) for group in job.futures)

        try:
            response = batchapi.submit_exactly_once(self._env.batch, request,
                                                    grace=float(self._env.describe_grace),
                                                    budget=self.submit_budget,
                                                    keep_waiting=keep_waiting)
        except Exception as error:
            storage.delete_job(job_url)
            if batchapi.is_throttling(error) and not keep_waiting():
                for group in job.futures:  # never sent: nothing remote to cancel
                    for future in group:
                        future.cancel()
            raise wrap_submit_error(error) from error
        job_id = response["jobId"]
        try:
            storage.write_job_pointer(job_id, job_url)
        except Exception:  # only attach-after-expiry needs it; the job itself is fine
            logger.warning("batchfutures: could not record the storage pointer of job %s", job_id)
        for group in job.futures:  # where each future's outcome sits in its child's result
            for position, future in enumerate(group):
                future._set_item(position)
        tracked = TrackedJob(job_id, job_url, job.futures, array=len(job.blobs) > 1,
                             memory_mib=memory, nodes=job.settings.nodes,
                             item_counts=job.item_counts if job.per_child else None,
                             runnable_timeout=job.settings.runnable_timeout)
        tracked.echo_output = self.echo_output
        if self.live_tail is not None:
            tracked.echo_at_end = self.live_tail.echo_at_end
        tracked.attempts_reader = AttemptsReader(self._env.batch, job_id, len(job.blobs) > 1,
                                                 job.earlier_attempts)
        if self._pricing is _UNREAD:  # read when a cost is first asked: a submit never waits
            self._pricing = PricingWhenAsked(self._env)
            self.spending.priced_by(self._pricing)  # max_cost: read now, on their own thread
        tracked.pricing = self._pricing.of_call(job.settings.vcpus, memory, job.settings.gpus)
        for group in job.futures:  # each call's cost is counted as it ends (max_cost, ex.cost)
            for future in group:
                future.add_done_callback(self.spending.count)
        if job.settings.retry_on_oom and job.settings.nodes == 1:  # not multi-node jobs
            tracked.retry = self._oom_retry(job)
        if job.settings.spot_attempts and job.settings.nodes == 1:  # reclaimed: on demand next
            tracked.retry = SpotFallback(
                job.settings.spot_attempts, request["jobQueue"],
                job.settings.fallback_queue or self._env.fallback_queue,
                functools.partial(self.fall_back, settings=job.settings, name=job.name),
                inner=tracked.retry)
        if job.depends_on and job.settings.nodes == 1:
            tracked.rerun = functools.partial(self.rerun, settings=job.settings, name=job.name)
        with self._lock:
            self.submitted_jobs.append(job_id)
        logger.debug("submitted Batch job %s (%d children, %d items)", job_id, len(job.blobs),
                     items)
        self._track(tracked)
        return tracked

    # -- retry_on_oom --------------------------------------------------------------------------
    def _oom_retry(self, job: PendingJob) -> Any:
        # start-up: oomretry costs ~2.5 ms; only retry_on_oom, reruns and Spot fallbacks use it
        from .oomretry import OomRetry, placement_of

        if self._placeable_mib is _UNREAD:  # a Placement: the platform and its cap
            self._placeable_mib = placement_of(self._env)
        history = dict(enumerate(job.retried)) if job.retried else {}
        return OomRetry(job.settings, placeable_mib=self._placeable_mib, resubmit=self.resubmit,
                        history=history, name=job.name)

    def resubmit(self, source: TrackedJob, children: List[int], memory_mib: int,
                 histories: List[Any], retry: Any) -> TrackedJob:
        """Children of a submitted job again, as one new Batch job with ``memory_mib``.

        Their futures are re-bound to the new job. Nothing is uploaded but a header: the worker
        reads each child's items from the inputs object named in ``histories[i].origin``.
        """
        counts = [source.items_in(i) for i in children]
        for index in children:
            source.statuses.forget_ending(index)
        per_child = source.item_counts is not None
        futures = [source.children[i] for i in children]
        job = PendingJob(retry.with_memory(memory_mib), [], [b""] * len(children), counts,
                         futures, chunksize=max(counts), name=retry.name, per_child=per_child,
                         retried=list(histories),
                         # a rerun of dependents killed in its turn still reads moved upstreams
                         redirects=reruns.redirects_of([f for group in futures for f in group]))
        return self.submit_now(job)

    def rerun(self, source: TrackedJob, children: List[int], *, settings: JobSettings,
              name: str) -> TrackedJob:
        """Children Batch failed for a dependency that was retried, as one new Batch job.

        No dependsOn (their upstreams are done); the worker reads each child's items from the
        first job's inputs ("sources") and each moved upstream result where it is now
        ("redirects"). Their futures are re-bound to the new job (see reruns.py).
        """
        from .oomretry import ChildHistory  # start-up: as _oom_retry's

        counts = [source.items_in(i) for i in children]
        futures = [source.children[i] for i in children]
        job = PendingJob(settings, [], [b""] * len(children), counts, futures,
                         chunksize=max(counts), name=name,
                         per_child=source.item_counts is not None,
                         retried=[ChildHistory((source.job_url, i), ()) for i in children],
                         redirects=reruns.redirects_of([f for group in futures for f in group]))
        return self.submit_now(job)

    def fall_back(self, source: TrackedJob, children: List[int], queue: str,
                  earlier_attempts: List[List[Any]], *, settings: JobSettings,
                  name: str) -> TrackedJob:
        """Children Spot reclaimed ``spot_attempts`` times, as one new Batch job on ``queue``
        (spot.py). Nothing is uploaded but a header: the worker reads each child's items, and
        its calls their checkpoints, where they were first stored ("sources")."""
        from .oomretry import ChildHistory  # start-up: as _oom_retry's

        history = getattr(source.retry, "history", None) or {}
        counts = [source.items_in(i) for i in children]
        for index in children:
            source.statuses.forget_ending(index)
        futures = [source.children[i] for i in children]
        job = PendingJob(dataclasses.replace(settings, spot_attempts=0), [], [b""] * len(children),
                         counts, futures, chunksize=max(counts), name=name,
                         per_child=source.item_counts is not None,
                         retried=[history[i] if i in history else
                                  ChildHistory((source.job_url, i), ()) for i in children],
                         redirects=reruns.redirects_of([f for group in futures for f in group]),
                         queue=queue, earlier_attempts=earlier_attempts)
        return self.submit_now(job)

    def _definition_for(self, settings: JobSettings) -> str:
        """The job definition, with ``secrets=`` added (SubmitJob cannot carry secrets)."""
        definition = self._env.job_definition
        if settings.nodes > 1:  # a multinode definition (environments' multinode_definition)
            definition = self._env.multinode_definition(settings.nodes)
            if definition == self._env.given_definition:
                # the user's (the stack's -worker, say): a container one takes no nodeOverrides
                definition = multinode_definition_from(self._env.batch, definition,
                                                       stack=self._env.stack)
        if settings.secrets:
            definition = definition_with_secrets(self._env.batch, definition, settings.secrets,
                                                 stack=self._env.stack)
        return definition

    def _queue_for(self, settings: JobSettings) -> str:
        """The job queue; a multi-node job goes to the multi-node queue when there is one."""
        if settings.nodes > 1:
            return multinode_queue(self._env.job_queue, self._env.stack)
        return self._env.job_queue

    def _job_environment(self) -> Dict[str, str]:
        """What the worker must know and the settings cannot change: where the signing key is
        (never the key), and on AWS the bucket owner and KMS key its S3 requests must carry."""
        variables = dict(self._storage.signer.job_environment())
        variables.update(self._env.worker_environment())
        return variables

    def _check_queue_once(self) -> None:
        """The queue's check, once; a check that failed only for throttling (past its retry
        budget) is made again while the executor is open, as a throttled SubmitJob is sent
        again: throttling alone never fails a call."""
        throttled = 0
        while not self._queue_checked:
            try:
                self._env.check_queue()
            except ConfigurationError as error:
                cause = error.__cause__
                if cause is None or not batchapi.is_throttling(cause) or self._stopped.is_set():
                    raise
                throttled += 1
                time.sleep(batchapi.throttle_wait(throttled, self.submit_budget, random.random()))
                continue
            self._queue_checked = True

    def _files_location(self) -> str:
        if self._files_url is None:
            assert self.files is not None
            try:
                self._files_url = self._storage.put_function(self._run_id, self.files)
            except (FileNotFoundError, PermissionError) as error:
                raise storage_error(self._storage, error) from error
        return self._files_url

    def _initargs_location(self) -> str:
        if self._initargs_url is None:
            assert self._initargs is not None
            try:
                self._initargs_url = self._storage.put_function(self._run_id, self._initargs)
            except (FileNotFoundError, PermissionError) as error:
                raise storage_error(self._storage, error) from error
        return self._initargs_url



def multinode_queue(job_queue: str, stack: Optional[str]) -> str:
    """The template's ``<stack>-multinode`` queue in place of its ``<stack>-ec2`` one (Batch runs
    no multi-node job on the EC2 queue's Spot compute environment); any other queue as it is."""
    if not stack:
        return job_queue
    head, slash, name = job_queue.rpartition("/")
    if name != f"{stack}-ec2":
        return job_queue
    return f"{head}{slash}{stack}-multinode"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def storage_error(storage: Storage, error: BaseException) -> ConfigurationError:
    return ConfigurationError(
        f"cannot write job payloads to {storage.root_url}: {error}. Check that the bucket (or "
        f"folder) exists and that these credentials may write to it.")


def wrap_submit_error(error: BaseException) -> BaseException:
    if isinstance(error, BatchError):
        return error
    code = batchapi.error_code(error)
    if code == "ClientException":
        message = (getattr(error, "response", None) or {}).get("Error", {}).get("Message", str(error))
        return ConfigurationError(f"Batch rejected the job: {message}")
    return error
