"""The scheduler: one thread moving the emulator's own jobs through Batch's lifecycle.

    SUBMITTED -> PENDING -> RUNNABLE -> STARTING -> RUNNING -> SUCCEEDED | FAILED
                (dependsOn)  (vCPUs)   (process   (exit, timeout,  (retry: back to RUNNABLE)
                                        started)   memory, kill)

Each tick advances every unit at most one step, processing the stages from last to first, so
each status lasts at least one tick and the listeners, called after every tick that changed
something, see it. While a step is due the next tick follows TICK (2 ms) later; otherwise the
thread sleeps until something wakes it (a submission, a process's exit, a stop), until the
nearest attempt timeout, or for IDLE (housekeeping; both in deadlines.py). The work of a tick is
proportional to what changes, never to the number of jobs: units move between queues (`_new`,
`_ready`, the RUNNABLE queue, `_launched`, `_running`), dependencies are counters decremented by
the job they wait for (dependson.py: no re-scan of waiting jobs), and an array's status
summary is maintained incrementally by `Job.move`. The decisions live elsewhere; this class
applies them:

    runqueue.py    the RUNNABLE queue: submission order, units held (never fit), vCPUs in use
    placement.py   what fits this host, now or ever (pure)
    deadlines.py   attempt timeouts, lost hosts (a fault), queue time limits, sleep (pure)
    container.py   what an attempt's process gets: command, environment, folder, log stream
    outcomes.py    what an attempt's end means (pure)
    endings.py     retry or final status (pure); a job's end after its units'; `finished`
    stopping.py    CancelJob, TerminateJob, the emulator's close: what is killed, what fails
    dependson.py   dependsOn as counters

Memory and CPU limits are the attempt's cgroup's (cgroups.py) or, without one, RLIMIT_DATA's
and the monitor's (monitor.py).

All state is guarded by the emulator's lock; processes are launched outside it. Launching
happens on this thread only: PR_SET_PDEATHSIG ties each process's life to the thread that
forked it, and this thread lives as long as the emulator.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ...statuses import FINISHED, JobStatus
from ..dependson import Dependencies
from ..faults import FaultInjector
from ..jobstate import DEPENDENCY_FAILED, Job, Unit, too_many_tags
from . import container
from .attempts import AttemptHandle, AttemptLauncher, AttemptMonitor, KillReason, LaunchRequest, cleanup_done
from .cgroups import Cgroups
from .deadlines import attempt_deadlines, kill_due, sleep_for
from .endings import Endings, end_of, record_end
from .placement import Host
from .runqueue import Gate, RunQueue
from .stopping import abandon_attempt, kill_for_shutdown, stop, wait_for_exits

logger = logging.getLogger("batchfutures")

HOUSEKEEPING_EVERY = 0.25


def now_ms() -> int:
    return int(time.time() * 1000)


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
                 queue_actions: Callable[[str], List[Dict[str, Any]]] = lambda queue: [],
                 lane_of: Callable[[Unit], str] = lambda unit: "",
                 lane_limit: Callable[[str], Tuple[Optional[float], bool]] = lambda lane: (None, True),
                 gate: Optional[Gate] = None,
                 spot_type: Callable[[str], Optional[str]] = lambda lane: None,
                 images: Optional[container.ImageEntryPoints] = None) -> None:
        self.lock = lock
        self.launcher = launcher
        self.monitor = monitor
        self.cgroups = cgroups  # None: RLIMIT_DATA and the monitor
        self.scratch = scratch
        self.inherit_client_path = inherit_client_path
        self.images = container.image_entry_points(images)  # a commandless job's entry point
        self.faults = faults or FaultInjector()
        self._queue_actions = queue_actions
        self.max_vcpus = float(max_vcpus)
        self.runnable = RunQueue(Host(max_vcpus=self.max_vcpus, memory_mib=host_memory_mib,
                                      gpus=host_gpus), lane_of=lane_of, lane_limit=lane_limit,
                                 gate=gate)
        self._spot_type = spot_type  # a compute environment's Spot type (None: not Spot)
        self.compute_environment = compute_environment
        self.logs_folder = Path(logs_folder)
        self._on_change = on_change
        self._housekeeping = housekeeping
        self._new: List[Job] = []
        self._ready: List[Unit] = []
        self._launched: List[Unit] = []
        self._running: Set[Unit] = set()
        self.dependencies = Dependencies(
            foreign_status=foreign_status, ready=self._ready.append,
            fail=lambda unit: self._finalize(unit, JobStatus.FAILED, DEPENDENCY_FAILED))
        self.endings = Endings(self.dependencies, now_ms)
        self.finished = self.endings.finished  # own jobs in the order they ended (for the TTL)
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
        stop(job, unit, reason, terminate=terminate, finalize=self._finalize)
        self.dependencies.drain()
        self._wake.set()

    def front_of_queue(self, queue: str, limit: int) -> List[Unit]:
        """The first `limit` RUNNABLE units of `queue`'s own jobs, in the order they would start."""
        return self.runnable.front(queue, limit)

    # -- the thread --------------------------------------------------------------------------
    def _next_wait(self) -> float:
        """How long the thread may sleep: TICK while a step is due, else until a deadline."""
        step_due = bool(self._new or self._ready or self._launched) or self.runnable.head_fits()
        deadlines = (d for u in self._running for d in (u.deadline, u.host_loss_at, u.reclaim_at)
                     if d is not None)
        return sleep_for(step_due, deadlines, time.monotonic())

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
            due = self.runnable.past_time_limit(self._queue_actions, time.monotonic())
            for unit, reason in due:
                if unit.status == JobStatus.RUNNABLE:  # not ended with its main node meanwhile
                    unit.cancelled = True
                    self._finalize(unit, JobStatus.FAILED, reason)
            if due:
                self.dependencies.drain()

    def poll_foreign(self) -> None:
        """Resolve dependencies on other processes' jobs (called from housekeeping)."""
        self.dependencies.poll_foreign(self.lock)

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
            if job.status in FINISHED:
                continue
            live = [u for u in job.units if u.status == JobStatus.SUBMITTED]
            if too_many_tags(job.spec):  # as Batch: FAILED before any child exists
                self.endings.fail_unspawned(job, now)
                self.changed = True
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

    # -- PENDING -> RUNNABLE -----------------------------------------------------------------
    def _make_runnable(self) -> None:
        ready = list(self._ready)
        self._ready.clear()  # in place: the dependency graph appends to this very list
        for unit in ready:
            if unit.status == JobStatus.PENDING and unit.tick < self._tick_no:
                self._queue(unit)
            elif unit.status == JobStatus.PENDING:
                self._ready.append(unit)

    def _queue(self, unit: Unit) -> None:
        now = now_ms()
        unit.tick = self._tick_no
        unit.runnable_at = now
        self.changed = True
        queued = self.runnable.add(unit, time.monotonic())
        # as Batch: one that never fits stays RUNNABLE, saying why, until stopped
        unit.job.move(unit, JobStatus.RUNNABLE, now,
                      None if queued else self.runnable.held_reason(unit))

    # -- RUNNABLE -> STARTING: vCPUs, in submission order ------------------------------------
    def _dispatch(self) -> List[Tuple[Unit, LaunchRequest]]:
        launches: List[Tuple[Unit, LaunchRequest]] = []
        if self._stopping:
            return launches
        now = now_ms()
        while (unit := self.runnable.take(self._tick_no)) is not None:
            unit.current = container.attempt_record(unit.job.spec.definition_name,
                                                    self.compute_environment)
            unit.job.move(unit, JobStatus.STARTING, now, None)
            unit.tick = self._tick_no
            unit.host_loss_in = self.faults.host_loss_delay()
            lane = unit.lane or ""
            spot = self._spot_type(lane)
            reclaim = self.faults.spot_reclaim(unit.job.spec.queue, spot, on_demand=(
                spot is None and lane not in ("", self.compute_environment)))
            unit.reclaim_in, unit.spot_platform = reclaim if reclaim else (None, None)
            self.changed = True
            python_path, cwd = container.import_path_and_directory(self.inherit_client_path,
                                                                   self.launcher.in_processes)
            launches.append((unit, container.launch_request(
                unit, unit.current["container"]["logStreamName"], python_path=python_path, cwd=cwd,
                compute_environment=self.compute_environment, logs_folder=self.logs_folder,
                images=self.images)))
        return launches

    def _launch(self, unit: Unit, request: LaunchRequest) -> None:
        handle, error = None, None
        try:
            container.prepare(request, self.scratch, self.cgroups)
            handle = self.launcher.start(request, self._exited)
        except Exception as exc:  # the "image" cannot run this command
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            container.discard(request)
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
        unit.deadline, unit.host_loss_at = attempt_deadlines(
            unit.job.spec.timeout, unit.host_loss_in, time.monotonic())
        unit.reclaim_at = (time.monotonic() + unit.reclaim_in
                           if unit.reclaim_in is not None else None)
        self.changed = True

    # -- the end of an attempt ---------------------------------------------------------------
    def _collect(self) -> None:
        now = time.monotonic()
        for unit in list(self._running):
            handle = unit.handle
            assert handle is not None  # a running unit has its handle (_launch)
            if not handle.running:
                self._end_attempt(unit)
            elif unit.reclaim_at is not None and now >= unit.reclaim_at:
                unit.reclaim_at = None  # SIGTERM now, SIGKILL after the interruption notice
                handle.kill(KillReason.SPOT_RECLAIM, grace=self.faults.spot_notice)
            elif (due := kill_due(unit.deadline, unit.host_loss_at, now)) is not None:
                handle.kill(due)  # its exit wakes the thread (no tick until then)
                if due is KillReason.TIMEOUT:
                    unit.deadline = None
                else:
                    unit.host_loss_at = None

    def _end_attempt(self, unit: Unit, start_error: Optional[str] = None) -> None:
        now = now_ms()
        handle = unit.handle
        self._running.discard(unit)
        unit.handle, unit.deadline, unit.kill_pending = None, None, None
        unit.host_loss_in = unit.host_loss_at = None
        platform, unit.spot_platform = unit.spot_platform, None
        unit.reclaim_in = unit.reclaim_at = None
        if handle is not None:
            self.monitor.unwatch(handle)
        self.runnable.release(unit)
        attempt = unit.current or {"container": {}}
        unit.current = None
        stream = attempt["container"].get("logStreamName")
        if stream:
            container.close_log(container.log_file(self.logs_folder, stream))
        status, reason = record_end(unit, attempt,
                                    end_of(handle, start_error, unit.stop_reason, platform),
                                    now=now, stopping=self._stopping)
        if status == JobStatus.RUNNABLE:
            self._queue(unit)  # a retry
        else:
            self._finalize(unit, status, reason)
        self.changed = True

    def _finalize(self, unit: Unit, status: JobStatus, reason: Optional[str]) -> None:
        self.endings.finalize(unit, status, reason)
        self.changed = True

    # -- shutdown ----------------------------------------------------------------------------
    def shutdown(self, jobs: List[Job], reason: str) -> None:
        """Kill every attempt, fail every unfinished unit with `reason`; the lock is NOT held."""
        with self.lock:
            self._stopping = True
            handles = kill_for_shutdown(list(self._running) + self._launched, jobs, reason)
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        with self.lock:
            handles += [u.handle for u in self._running if u.handle is not None and u.handle not in handles]
        wait_for_exits(handles, seconds=5)
        with self.lock:
            for unit in list(self._running):
                self._end_attempt(unit)
            now = now_ms()
            for job in jobs:
                for unit in job.units:
                    if unit.status not in FINISHED:
                        abandon_attempt(unit, reason, now)
                        self.runnable.release(unit)
                        self._finalize(unit, JobStatus.FAILED, reason)
                if job.has_children and job.status not in FINISHED:  # (a parent of no live children)
                    job.finish_parent(JobStatus.FAILED, reason, now)
            self.dependencies.drain()
        cleanup_done()  # the attempts' cgroups and scratch folders are gone when close returns
        if self.scratch is not None:
            self.scratch.close()
