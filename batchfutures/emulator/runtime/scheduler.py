"""The scheduler: one thread moving the emulator's own jobs through Batch's lifecycle.

    SUBMITTED -> PENDING -> RUNNABLE -> STARTING -> RUNNING -> SUCCEEDED | FAILED
                (dependsOn)  (vCPUs)   (process   (exit, timeout,  (retry: back to RUNNABLE)
                                        started)   memory, kill)

Each tick advances every unit at most one step, processing the stages from last to first, so
each status lasts at least one tick and the listeners, called after every tick that changed
something, see it. While a step is due the next tick follows TICK (2 ms) later; otherwise the
thread sleeps until something wakes it (a submission, a process's exit, a stop), until the
nearest attempt timeout, or for IDLE (housekeeping). The work of a tick is proportional to what
changes, never to the number of jobs: units move between queues (`_new`, `_ready`, the RUNNABLE
heap ordered by submission, `_launched`, `_running`), dependencies are counters decremented by
the job they wait for (dependencies.py: no re-scan of waiting jobs), and an array's status
summary is maintained incrementally by `Job.move`. What an attempt's end means is decided by
outcomes.attempt_outcome; what its process gets (environment, path, directory) by container.py;
its memory and CPU limits by its cgroup (cgroups.py) or, without one, RLIMIT_DATA and the
monitor (monitor.py). Jobs held RUNNABLE for a reason are cancelled by their queue's
jobStateTimeLimitActions; attempts marked by the fault profile lose their host while RUNNING.

All state is guarded by the emulator's lock; processes are launched outside it. Launching
happens on this thread only: PR_SET_PDEATHSIG ties each process's life to the thread that
forked it, and this thread lives as long as the emulator.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import os
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from ...errors import time_limit_status_reason  # one wording, read back by classify_failure
from .. import retries
from ..dependson import Dependencies
from ..faults import FaultInjector
from ..jobstate import (
    ACTIVE,
    BEFORE_START,
    CHILD_FAILED,
    DEPENDENCY_FAILED,
    EXITED,
    FINAL,
    MAIN_NODE_EXITED,
    MAX_TAGS,
    MISCONFIGURED,
    Job,
    JobStatus,
    Unit,
    too_many_tags,
)
from ..model import task_arn
from . import container
from .attempts import (
    AttemptHandle,
    AttemptLauncher,
    AttemptMonitor,
    KillReason,
    LaunchRequest,
    cleanup_done,
)
from .cgroups import Cgroups
from .launcher import client_python_path
from .outcomes import AttemptEnd, attempt_outcome
from .placement import Ask, Host, fits_now, never_fits, queue_key

logger = logging.getLogger("batchfutures")

TICK = 0.002
IDLE = 0.25
HOUSEKEEPING_EVERY = 0.25




def now_ms() -> int:
    return int(time.time() * 1000)


def ask_of(unit: Unit) -> Ask:
    """What one unit asks of the host (a node's own, in a multi-node job)."""
    spec = unit.job.spec
    node = spec.node(unit.index if unit.job.is_multinode else None)
    vcpus = float(node["vcpus"] or 1) if unit.job.is_multinode else spec.vcpus or 1.0
    return Ask(vcpus=vcpus, total_vcpus=spec.total_vcpus(), memory_mib=node["memory"],
               gpus=node["gpus"] or 0)


class Scheduler:
    """Runs the lifecycle of the jobs handed to `add`; every public method wants the lock held."""

    def __init__(self, *, lock: threading.RLock, launcher: AttemptLauncher,
                 monitor: AttemptMonitor, max_vcpus: float,
                 host_memory_mib: Optional[int], compute_environment: str, logs_folder: Path,
                 host_gpus: int = 0,
                 on_change: Callable[[], None], housekeeping: Callable[[], None],
                 foreign_status: Callable[[str], Optional[JobStatus]],
                 cgroups: Optional[Cgroups] = None,
                 scratch: Optional[container.Scratch] = None, inherit_client_path: bool = False,
                 faults: Optional[FaultInjector] = None,
                 queue_actions: Callable[[str], List[Dict[str, Any]]] = lambda queue: []) -> None:
        self.lock = lock
        self.launcher = launcher
        self.monitor = monitor
        self.cgroups = cgroups  # None: RLIMIT_DATA and the monitor
        self.scratch = scratch
        self.inherit_client_path = inherit_client_path
        self.faults = faults or FaultInjector()
        self._queue_actions = queue_actions
        self._stuck: List[Unit] = []  # RUNNABLE with a reason that keeps them there
        self.max_vcpus = float(max_vcpus)
        self.host = Host(max_vcpus=self.max_vcpus, memory_mib=host_memory_mib, gpus=host_gpus)
        self.compute_environment = compute_environment
        self.logs_folder = Path(logs_folder)
        self._on_change = on_change
        self._housekeeping = housekeeping
        self._new: List[Job] = []
        self._ready: List[Unit] = []
        # (seq, place, order, unit): seq is never None for an own job (submission.build_spec)
        self._heap: List[Tuple[Optional[int], int, int, Unit]] = []
        self._order = itertools.count()
        self._launched: List[Unit] = []
        self._running: Set[Unit] = set()
        self.dependencies = Dependencies(
            foreign_status=foreign_status, ready=self._ready.append,
            fail=lambda unit: self._finalize(unit, JobStatus.FAILED, DEPENDENCY_FAILED))
        self.finished: Deque[Job] = deque()  # own jobs in the order they ended (for the TTL)
        self.used_vcpus = 0.0
        self._tick_no = 0
        self.changed = False
        self._stopping = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bf-emulator-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    # -- requests from the API (lock held) ---------------------------------------------------
    def add(self, job: Job) -> None:
        self._new.append(job)
        self.changed = True
        self._wake.set()

    def cancel(self, job: Job, unit: Optional[Unit], reason: str) -> None:
        """CancelJob: fail what has not started; what has started goes on."""
        self._stop(job, unit, reason, terminate=False)

    def terminate(self, job: Job, unit: Optional[Unit], reason: str) -> None:
        """TerminateJob: kill what runs, fail what has not started."""
        self._stop(job, unit, reason, terminate=True)

    def _stop(self, job: Job, unit: Optional[Unit], reason: str, *, terminate: bool) -> None:
        flag = "terminated" if terminate else "cancelled"
        if unit is None and job.has_children and job.status not in FINAL:
            setattr(job, flag, True)
            job.stop_reason = reason
            job.touch()
        for target in ([unit] if unit is not None else job.units):
            if target.status in BEFORE_START:
                setattr(target, flag, True)
                self._finalize(target, JobStatus.FAILED, reason)
            elif terminate and target.status in ACTIVE:
                target.terminated, target.stop_reason = True, reason
                job.touch(target)
                if target.handle is not None:
                    target.handle.kill(KillReason.TERMINATE)
                else:  # being launched right now: killed as soon as it exists
                    target.kill_pending = KillReason.TERMINATE
        self.dependencies.drain()
        self._wake.set()

    # -- the thread --------------------------------------------------------------------------
    def _next_wait(self) -> float:
        """How long the thread may sleep: TICK while a step is due, else until a deadline."""
        if self._new or self._ready or self._launched:
            return TICK
        while self._heap and self._heap[0][3].status != JobStatus.RUNNABLE:
            heapq.heappop(self._heap)  # cancelled while queued
        if self._heap:
            unit = self._heap[0][3]  # strict FIFO: only the head can start next
            if fits_now(ask_of(unit), self.used_vcpus, self.host):
                return TICK
        deadlines = [d for u in self._running for d in (u.deadline, u.host_loss_at) if d is not None]
        if deadlines:
            return min(IDLE, max(0.0, min(deadlines) - time.monotonic()))
        return IDLE

    def _run(self) -> None:
        last_housekeeping = 0.0
        while not self._stopping:
            with self.lock:
                wait = self._next_wait()
            self._wake.wait(wait)
            self._wake.clear()
            if self._stopping:
                break
            try:
                self._tick()
            except Exception:  # a bug in one step must not stop every job
                logger.exception("batchfutures emulator: scheduler step failed")
            if time.monotonic() - last_housekeeping >= HOUSEKEEPING_EVERY:
                last_housekeeping = time.monotonic()
                try:
                    self._housekeeping()
                except Exception:
                    logger.exception("batchfutures emulator: housekeeping failed")
            with self.lock:
                changed, self.changed = self.changed, False
            if changed:
                self._on_change()

    def check_time_limits(self) -> None:
        """The queues' jobStateTimeLimitActions: cancel jobs held RUNNABLE for their reason."""
        with self.lock:
            if not self._stuck:
                return
            now = time.monotonic()
            still = []
            for unit in self._stuck:
                if unit.status != JobStatus.RUNNABLE or unit.runnable_since is None:
                    continue
                action = next((a for a in self._queue_actions(unit.job.spec.queue)
                               if a.get("state") == JobStatus.RUNNABLE and a.get("action") == "CANCEL"
                               and (unit.reason or "").startswith(str(a.get("reason") or ""))), None)
                if action is not None and now - unit.runnable_since >= action["maxTimeSeconds"]:
                    unit.cancelled = True
                    self._finalize(unit, JobStatus.FAILED,
                                   time_limit_status_reason(str(action["reason"])))
                else:
                    still.append(unit)
            self._stuck = still
            self.dependencies.drain()

    def _tick(self) -> None:
        with self.lock:
            self._tick_no += 1
            self._collect()            # RUNNING/STARTING -> SUCCEEDED | FAILED | RUNNABLE
            self._mark_running()       # STARTING -> RUNNING
            launches = self._dispatch()  # RUNNABLE -> STARTING
            self._make_runnable()      # PENDING -> RUNNABLE
            self._admit()              # SUBMITTED -> PENDING
            self.dependencies.drain()
        for unit, request in launches:
            self._launch(unit, request)

    # -- SUBMITTED -> PENDING: dependencies are wired here -----------------------------------
    def _admit(self) -> None:
        jobs, self._new = self._new, []
        now = now_ms()
        for job in jobs:
            if job.status in FINAL:
                continue
            live = [u for u in job.units if u.status == JobStatus.SUBMITTED]
            if too_many_tags(job.spec):  # as Batch: FAILED before any child exists
                self._fail_unspawned(job, now)
                continue
            if job.has_children:
                job.status = JobStatus.PENDING
                job.touch()
            for unit in live:
                if unit.index is not None:
                    unit.created = now  # a child is created when its parent spawns it
                job.move(unit, JobStatus.PENDING, now)
                unit.tick = self._tick_no
            self.changed = True
            for unit in self.dependencies.wire(job, live):
                self._ready.append(unit)

    def _fail_unspawned(self, job: Job, now: int) -> None:
        """Fail a job at admission, before it has children (an array keeps none)."""
        reason = (f"ClientException: the job and its job definition have more than {MAX_TAGS} "
                  "tags to propagate")
        if job.has_children:
            job.drop_children()
            job.finish_parent(JobStatus.FAILED, reason, now)
            self.dependencies.ended(job, False)
            self.finished.append(job)
            self.changed = True
        else:
            self._finalize(job.units[0], JobStatus.FAILED, reason)

    # -- PENDING -> RUNNABLE -----------------------------------------------------------------
    def poll_foreign(self) -> None:
        """Resolve dependencies on other processes' jobs (called from housekeeping)."""
        self.dependencies.poll_foreign(self.lock)

    def _make_runnable(self) -> None:
        ready = list(self._ready)
        self._ready.clear()  # in place: the dependency graph appends to this very list
        for unit in ready:
            if unit.status == JobStatus.PENDING and unit.tick < self._tick_no:
                self._queue(unit)
            elif unit.status == JobStatus.PENDING:
                self._ready.append(unit)

    def _queue(self, unit: Unit) -> None:
        spec = unit.job.spec
        now = now_ms()
        unit.tick = self._tick_no
        unit.runnable_at = now
        self.changed = True
        if never_fits(ask_of(unit), self.host):  # as Batch: RUNNABLE, saying why, until stopped
            unit.job.move(unit, JobStatus.RUNNABLE, now, MISCONFIGURED)
            unit.runnable_since = time.monotonic()
            self._stuck.append(unit)
            return
        unit.job.move(unit, JobStatus.RUNNABLE, now, None)
        seq, place = queue_key(spec.seq, unit.index, unit.is_main_node)
        heapq.heappush(self._heap, (seq, place, next(self._order), unit))

    def front_of_queue(self, queue: str, limit: int) -> List[Unit]:
        """The first `limit` RUNNABLE units of `queue`'s own jobs, in the order they would start
        (lock held): submission order, a main node first; jobs held RUNNABLE for a reason keep
        their place, as on Batch (where they block the queue's head)."""
        units = {id(entry[3]): entry[3] for entry in self._heap}
        units.update((id(unit), unit) for unit in self._stuck)
        found = [u for u in units.values()
                 if u.status == JobStatus.RUNNABLE and u.job.spec.queue == queue]

        return heapq.nsmallest(limit, found, key=lambda unit: queue_key(
            unit.job.spec.seq, unit.index, unit.is_main_node))

    # -- RUNNABLE -> STARTING: vCPUs, in submission order ------------------------------------
    def _dispatch(self) -> List[Tuple[Unit, LaunchRequest]]:
        launches: List[Tuple[Unit, LaunchRequest]] = []
        if self._stopping:
            return launches
        now = now_ms()
        while self._heap:
            unit = self._heap[0][3]
            if unit.status != JobStatus.RUNNABLE:
                heapq.heappop(self._heap)  # cancelled while queued
                continue
            if unit.tick == self._tick_no:
                break  # became RUNNABLE in this tick: next tick
            ask = ask_of(unit)
            if not fits_now(ask, self.used_vcpus, self.host):
                break
            need = ask.vcpus
            heapq.heappop(self._heap)
            self.used_vcpus += need
            unit.reserved = need
            task_id = uuid.uuid4().hex
            stream = f"{unit.job.spec.definition_name}/default/{task_id}"
            unit.current = {"container": {"logStreamName": stream,
                                          "taskArn": task_arn(self.compute_environment, task_id)}}
            unit.job.move(unit, JobStatus.STARTING, now, None)
            unit.tick = self._tick_no
            unit.host_loss_in = self.faults.host_loss_delay()
            self.changed = True
            launches.append((unit, self._request(unit, stream)))
        return launches

    def _request(self, unit: Unit, stream: str) -> LaunchRequest:
        """What the attempt's process gets: the container's world (container.py)."""
        spec = unit.job.spec
        node = spec.node(unit.index if unit.job.is_multinode else None)
        batch = dict(AWS_BATCH_JOB_ID=unit.job_id, AWS_BATCH_JOB_ATTEMPT=str(unit.attempt_number),
                     AWS_BATCH_JQ_NAME=spec.queue, AWS_BATCH_CE_NAME=self.compute_environment)
        if unit.job.is_array:
            batch["AWS_BATCH_JOB_ARRAY_INDEX"] = str(unit.index)
            batch["AWS_BATCH_JOB_ARRAY_SIZE"] = str(spec.array_size)
        if unit.job.is_multinode:  # every node on this machine: the main node is 127.0.0.1
            batch.update(AWS_BATCH_JOB_NODE_INDEX=str(unit.index),
                         AWS_BATCH_JOB_NUM_NODES=str(spec.num_nodes),
                         AWS_BATCH_JOB_MAIN_NODE_INDEX=str(spec.main_node))
            if not unit.is_main_node:  # as Batch: only the other nodes are told its address
                batch["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = "127.0.0.1"
        if self.inherit_client_path:  # the explicit way back to the client's world
            python_path, cwd = [client_python_path()], os.getcwd()
        else:
            python_path = container.image_python_path() if self.launcher.in_processes else []
            cwd = ""  # a scratch folder
        vcpus = float(node["vcpus"] or 1)
        env = container.environment(os.environ, node["environment"] or [], batch, vcpus=vcpus,
                                    python_path=python_path)
        log_path = str(self.logs_folder.joinpath(*stream.split("/")))
        return LaunchRequest(argv=container.container_argv(list(node["command"] or [])), env=env,
                             cwd=cwd, log_path=log_path, memory_mib=node["memory"], vcpus=vcpus)

    def _prepare(self, request: LaunchRequest) -> None:
        """Outside the lock: the attempt's scratch folder (named for its task) and cgroup."""
        if not request.cwd:
            if self.scratch is not None:
                request.cwd = request.scratch = self.scratch.make(os.path.basename(request.log_path))
                request.recycle = self.scratch.recycle
            else:
                request.cwd = os.path.abspath(os.sep)
        if self.cgroups is not None:
            try:
                request.cgroup = self.cgroups.create(request.memory_mib, request.vcpus)
            except OSError as error:  # e.g. the cgroup folder went away: this attempt falls back
                logger.warning("batchfutures emulator: cannot create a cgroup (%s); this attempt "
                               "runs with RLIMIT_DATA and sampling", error)

    def _launch(self, unit: Unit, request: LaunchRequest) -> None:
        handle, error = None, None
        try:
            self._prepare(request)
            handle = self.launcher.start(request, self._exited)
        except Exception as exc:  # the "image" cannot run this command
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if request.cgroup is not None:
                request.cgroup.remove(timeout=0.5)
            container.Scratch.remove(request.scratch)
        with self.lock:
            if handle is None:
                self._end_attempt(unit, start_error=error)
            else:
                unit.handle = handle
                self._running.add(unit)
                self._launched.append(unit)
                if request.memory_mib and request.cgroup is None:
                    self.monitor.watch(handle, request.memory_mib)
                if unit.kill_pending:
                    handle.kill(unit.kill_pending)
            self.dependencies.drain()
            self.changed = True
        self._wake.set()

    def _exited(self, handle: AttemptHandle) -> None:
        self._wake.set()

    # -- STARTING -> RUNNING -----------------------------------------------------------------
    def _mark_running(self) -> None:
        launched, self._launched = self._launched, []
        for unit in launched:
            if unit.status == JobStatus.STARTING:
                self._to_running(unit)

    def _to_running(self, unit: Unit) -> None:
        now = now_ms()
        unit.started = now
        assert unit.current is not None  # set when it became STARTING (_dispatch)
        unit.current["startedAt"] = now
        unit.job.move(unit, JobStatus.RUNNING, now)
        unit.tick = self._tick_no
        timeout = unit.job.spec.timeout
        unit.deadline = time.monotonic() + timeout if timeout else None
        if unit.host_loss_in is not None:
            unit.host_loss_at = time.monotonic() + unit.host_loss_in
        self.changed = True

    # -- the end of an attempt ---------------------------------------------------------------
    def _collect(self) -> None:
        now = time.monotonic()
        for unit in list(self._running):
            handle = unit.handle
            assert handle is not None  # a running unit has its handle (_launch)
            if not handle.running:
                self._end_attempt(unit)
            elif unit.deadline is not None and now >= unit.deadline:
                handle.kill(KillReason.TIMEOUT)
                unit.deadline = None  # killed: its exit wakes the thread (no tick until then)
            elif unit.host_loss_at is not None and now >= unit.host_loss_at:
                handle.kill(KillReason.HOST_LOST)  # a fault: the instance went away
                unit.host_loss_at = None

    def _end_attempt(self, unit: Unit, start_error: Optional[str] = None) -> None:
        spec = unit.job.spec
        now = now_ms()
        handle = unit.handle
        self._running.discard(unit)
        unit.handle, unit.deadline, unit.kill_pending = None, None, None
        unit.host_loss_in = unit.host_loss_at = None
        if handle is not None:
            self.monitor.unwatch(handle)
        self.used_vcpus = max(0.0, self.used_vcpus - unit.reserved)
        unit.reserved = 0.0
        attempt = unit.current or {"container": {}}
        unit.current = None
        container = attempt["container"]
        self._close_log(container.get("logStreamName"))
        if start_error is None and "startedAt" not in attempt:
            unit.started = attempt["startedAt"] = now  # ended before it was seen running
        killed = handle.kill_reason if handle is not None else None
        # a node stopped because its main node ended (not by TerminateJob) ends by its own
        # exit code, as on AWS: 0 (it had finished, or left on SIGTERM) is SUCCEEDED
        with_main = killed is KillReason.TERMINATE and unit.job.is_multinode and not unit.terminated
        outcome = attempt_outcome(AttemptEnd(
            exit_code=handle.exit_code() if handle is not None else None,
            killed=None if with_main else killed,
            memory_exceeded=handle.memory_exceeded if handle is not None else False,
            start_error=start_error, stop_reason=unit.stop_reason))
        if with_main and not outcome.succeeded:
            outcome = dataclasses.replace(outcome, status_reason=unit.stop_reason or EXITED)
        container.update(outcome.container)
        attempt["stoppedAt"] = now
        attempt["statusReason"] = outcome.status_reason
        unit.attempts.append(attempt)
        if outcome.succeeded:
            self._finalize(unit, JobStatus.SUCCEEDED, EXITED)
        elif (outcome.retryable and not unit.job.is_multinode and not unit.cancelled and not unit.terminated
              and not self._stopping and len(unit.attempts) < spec.max_attempts
              and retries.should_retry(spec.exit_rules, exit_code=container.get("exitCode"),
                                       reason=container.get("reason"),
                                       status_reason=outcome.status_reason)):
            self._queue(unit)
        else:
            self._finalize(unit, JobStatus.FAILED, outcome.status_reason)
        self.changed = True

    def _close_log(self, stream: Optional[str]) -> None:
        """End the stream with a newline, so its last line counts as a complete event."""
        if not stream:
            return
        try:
            with open(self.logs_folder.joinpath(*stream.split("/")), "rb+") as handle:
                if handle.seek(0, os.SEEK_END) > 0:
                    handle.seek(-1, os.SEEK_END)
                    if handle.read(1) != b"\n":
                        handle.write(b"\n")
        except OSError:
            pass

    # -- final states and what follows from them ---------------------------------------------
    def _finalize(self, unit: Unit, status: JobStatus, reason: Optional[str]) -> None:
        job = unit.job
        now = now_ms()
        job.move(unit, status, now, reason)
        self.dependencies.ended(unit, status == JobStatus.SUCCEEDED)
        if job.is_array:
            if job.status not in FINAL and job.all_children_done:
                failed = job.counts[JobStatus.FAILED] > 0
                parent_reason = None
                if failed:
                    parent_reason = job.stop_reason or (
                        DEPENDENCY_FAILED if job.gate_failed else CHILD_FAILED)
                job.finish_parent(JobStatus.FAILED if failed else JobStatus.SUCCEEDED, parent_reason, now)
                self.dependencies.ended(job, not failed)
                self.finished.append(job)
        elif job.is_multinode:
            if unit.is_main_node and job.status not in FINAL:
                self._end_multinode(job, unit, status, reason, now)
        else:
            self.finished.append(job)
        self.changed = True

    def _end_multinode(self, job: Job, main: Unit, status: JobStatus, reason: Optional[str],
                       now: int) -> None:
        """The main node's end is the job's: its status and reason; the other nodes stop."""
        job.cancelled = job.cancelled or main.cancelled
        job.terminated = job.terminated or main.terminated
        job.finish_parent(status, reason, now)
        self.dependencies.ended(job, status == JobStatus.SUCCEEDED)
        self.finished.append(job)
        why = job.stop_reason or MAIN_NODE_EXITED  # CancelJob/TerminateJob's, else the main's end
        for node in job.units:
            if node is main or node.status in FINAL:
                continue
            if node.status in BEFORE_START:
                self._finalize(node, JobStatus.FAILED, why)
            else:
                node.stop_reason = why
                if node.handle is not None:
                    node.handle.kill(KillReason.TERMINATE)
                else:
                    node.kill_pending = KillReason.TERMINATE

    # -- shutdown ----------------------------------------------------------------------------
    def shutdown(self, jobs: List[Job], reason: str) -> None:
        """Kill every attempt, fail every unfinished unit with `reason`; the lock is NOT held."""
        with self.lock:
            self._stopping = True
            handles = []
            for unit in list(self._running) + self._launched:
                unit.stop_reason = reason
                if unit.handle is not None:
                    unit.handle.kill(KillReason.SHUTDOWN)
                    handles.append(unit.handle)
            for job in jobs:  # attempts being launched right now are killed when they exist
                for unit in job.units:
                    if unit.status == JobStatus.STARTING and unit.handle is None:
                        unit.stop_reason, unit.kill_pending = reason, KillReason.SHUTDOWN
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        deadline = time.monotonic() + 5
        with self.lock:
            handles += [u.handle for u in self._running if u.handle is not None and u.handle not in handles]
        while any(h.running for h in handles) and time.monotonic() < deadline:
            time.sleep(0.01)  # (only `running` is part of the handle interface)
        with self.lock:
            for unit in list(self._running):
                self._end_attempt(unit)
            now = now_ms()
            for job in jobs:
                for unit in job.units:
                    if unit.status not in FINAL:
                        if unit.current is not None:  # never got a process
                            attempt, unit.current = unit.current, None
                            attempt.update(stoppedAt=now, statusReason=reason)
                            unit.attempts.append(attempt)
                        self.used_vcpus = max(0.0, self.used_vcpus - unit.reserved)
                        unit.reserved = 0.0
                        self._finalize(unit, JobStatus.FAILED, reason)
                if job.has_children and job.status not in FINAL:  # (a parent of no live children)
                    job.finish_parent(JobStatus.FAILED, reason, now)
            self.dependencies.drain()
        cleanup_done()  # the attempts' cgroups and scratch folders are gone when close returns
        if self.scratch is not None:
            self.scratch.close()
