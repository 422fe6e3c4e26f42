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
the job they wait for (no re-scan of waiting jobs), and an array's status summary is maintained
incrementally by `Job.move`.

All state is guarded by the emulator's lock; processes are launched outside it. Launching
happens on this thread only: PR_SET_PDEATHSIG ties each process's life to the thread that
forked it, and this thread lives as long as the emulator.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from . import retries
from .jobs import (
    ACTIVE,
    BEFORE_START,
    CHILD_FAILED,
    DEPENDENCY_FAILED,
    EXITED,
    FINAL,
    MISCONFIGURED,
    OOM_REASON,
    START_FAILED,
    TIMEOUT_REASON,
    Job,
    Unit,
)
from .launcher import container_argv, python_path_for_children
from .model import task_arn

logger = logging.getLogger("batchfutures")

TICK = 0.002
IDLE = 0.25
HOUSEKEEPING_EVERY = 0.25
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

Request = Tuple[List[str], Dict[str, str], str, Optional[int]]


def now_ms() -> int:
    return int(time.time() * 1000)


class Scheduler:
    """Runs the lifecycle of the jobs handed to `add`; every public method wants the lock held."""

    def __init__(self, *, lock: Any, launcher: Any, monitor: Any, max_vcpus: float,
                 host_memory_mib: Optional[int], compute_environment: str, logs_folder: Path,
                 on_change: Callable[[], None], housekeeping: Callable[[], None],
                 foreign_status: Callable[[str], Optional[str]]) -> None:
        self.lock = lock
        self.launcher = launcher
        self.monitor = monitor
        self.max_vcpus = float(max_vcpus)
        self.host_memory_mib = host_memory_mib
        self.compute_environment = compute_environment
        self.logs_folder = Path(logs_folder)
        self._on_change = on_change
        self._housekeeping = housekeeping
        self._foreign_status = foreign_status
        self._new: List[Job] = []
        self._ready: List[Unit] = []
        self._heap: List[Tuple[int, int, int, Unit]] = []
        self._order = itertools.count()
        self._launched: List[Unit] = []
        self._running: Set[Unit] = set()
        self._foreign: List[Tuple[Any, str]] = []
        self._events: Deque[Tuple[Any, bool]] = deque()
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
        if unit is None and job.is_array and job.status not in FINAL:
            setattr(job, flag, True)
            job.stop_reason = reason
            job.touch()
        for target in ([unit] if unit is not None else job.units):
            if target.status in BEFORE_START:
                setattr(target, flag, True)
                self._finalize(target, "FAILED", reason)
            elif terminate and target.status in ACTIVE:
                target.terminated, target.stop_reason = True, reason
                job.touch(target)
                if target.handle is not None:
                    target.handle.kill("terminate")
                else:  # being launched right now: killed as soon as it exists
                    target.kill_pending = "terminate"
        self._drain()
        self._wake.set()

    # -- the thread --------------------------------------------------------------------------
    def _next_wait(self) -> float:
        """How long the thread may sleep: TICK while a step is due, else until a deadline."""
        if self._new or self._ready or self._launched:
            return TICK
        while self._heap and self._heap[0][3].status != "RUNNABLE":
            heapq.heappop(self._heap)  # cancelled while queued
        if self._heap:
            unit = self._heap[0][3]  # strict FIFO: only the head can start next
            if self.used_vcpus + unit.job.spec.vcpus <= self.max_vcpus + 1e-9:
                return TICK
        deadlines = [u.deadline for u in self._running if u.deadline is not None]
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

    def _tick(self) -> None:
        with self.lock:
            self._tick_no += 1
            self._collect()            # RUNNING/STARTING -> SUCCEEDED | FAILED | RUNNABLE
            self._mark_running()       # STARTING -> RUNNING
            launches = self._dispatch()  # RUNNABLE -> STARTING
            self._make_runnable()      # PENDING -> RUNNABLE
            self._admit()              # SUBMITTED -> PENDING
            self._drain()
        for unit, request in launches:
            self._launch(unit, request)

    # -- SUBMITTED -> PENDING: dependencies are wired here -----------------------------------
    def _admit(self) -> None:
        jobs, self._new = self._new, []
        now = now_ms()
        for job in jobs:
            if job.status in FINAL:
                continue
            live = [u for u in job.units if u.status == "SUBMITTED"]
            if job.is_array:
                job.status = "PENDING"
                job.touch()
            for unit in live:
                if unit.index is not None:
                    unit.created = now  # a child is created when its parent spawns it
                job.move(unit, "PENDING", now)
                unit.tick = self._tick_no
            self.changed = True
            whole = [target for kind, target in job.targets if kind == "whole"]
            if job.is_array:
                outcomes = [self._watch(target, job) for target in whole]
                if "failed" in outcomes:
                    job.gate_failed = True
                    for unit in live:
                        self._finalize(unit, "FAILED", DEPENDENCY_FAILED)
                    continue
                job.unmet = outcomes.count("waiting")
                for unit in live:
                    unit.unmet = 1 if job.unmet else 0
                for kind, target in job.targets:
                    if kind != "n_to_n":
                        continue
                    for unit in live:
                        member = (f"{target}:{unit.index}" if isinstance(target, str)
                                  else target.units[unit.index])
                        self._count(unit, self._watch(member, unit))
                if any(kind == "sequential" for kind, _ in job.targets):
                    for unit in live:
                        if unit.index > 0:
                            self._count(unit, self._watch(job.units[unit.index - 1], unit))
            else:
                for unit in live:
                    for target in whole:
                        self._count(unit, self._watch(target, unit))
            for unit in live:
                if unit.status == "PENDING" and unit.unmet == 0:
                    self._ready.append(unit)

    def _count(self, unit: Unit, outcome: str) -> None:
        if unit.status != "PENDING":
            return
        if outcome == "waiting":
            unit.unmet += 1
        elif outcome == "failed":
            self._finalize(unit, "FAILED", DEPENDENCY_FAILED)

    def _watch(self, target: Any, dependent: Any) -> str:
        """'ok', 'failed', or 'waiting' (then `dependent` hears when `target` ends)."""
        if isinstance(target, str):  # a job of another process: polled from its record
            status = self._foreign_status(target)
            if status in FINAL or status is None:
                return "ok" if status == "SUCCEEDED" else "failed"
            self._foreign.append((dependent, target))
            return "waiting"
        if target.status in FINAL:
            return "ok" if target.status == "SUCCEEDED" else "failed"
        target.dependents.append(dependent)
        return "waiting"

    def poll_foreign(self) -> None:
        """Resolve dependencies on other processes' jobs (called from housekeeping)."""
        with self.lock:
            waits = list(self._foreign)
        if not waits:
            return
        statuses = {target: self._foreign_status(target) for _, target in waits}
        with self.lock:
            still = []
            for dependent, target in self._foreign:
                status = statuses.get(target, "PENDING")
                if status in FINAL or status is None:
                    self._resolve(dependent, status == "SUCCEEDED")
                else:
                    still.append((dependent, target))
            self._foreign = still
            self._drain()

    # -- PENDING -> RUNNABLE -----------------------------------------------------------------
    def _make_runnable(self) -> None:
        ready, self._ready = self._ready, []
        for unit in ready:
            if unit.status == "PENDING" and unit.tick < self._tick_no:
                self._queue(unit)
            elif unit.status == "PENDING":
                self._ready.append(unit)

    def _queue(self, unit: Unit) -> None:
        spec = unit.job.spec
        now = now_ms()
        unit.tick = self._tick_no
        self.changed = True
        too_big = spec.vcpus > self.max_vcpus + 1e-9 or (
            spec.memory and self.host_memory_mib and spec.memory > self.host_memory_mib)
        if too_big:  # as Batch: stays RUNNABLE, saying why, until cancelled or terminated
            unit.job.move(unit, "RUNNABLE", now, MISCONFIGURED)
            return
        unit.job.move(unit, "RUNNABLE", now, None)
        heapq.heappush(self._heap, (spec.seq, unit.index or 0, next(self._order), unit))

    # -- RUNNABLE -> STARTING: vCPUs, in submission order ------------------------------------
    def _dispatch(self) -> List[Tuple[Unit, Request]]:
        launches: List[Tuple[Unit, Request]] = []
        if self._stopping:
            return launches
        now = now_ms()
        while self._heap:
            unit = self._heap[0][3]
            if unit.status != "RUNNABLE":
                heapq.heappop(self._heap)  # cancelled while queued
                continue
            if unit.tick == self._tick_no:
                break  # became RUNNABLE in this tick: next tick
            need = unit.job.spec.vcpus
            if self.used_vcpus + need > self.max_vcpus + 1e-9:
                break
            heapq.heappop(self._heap)
            self.used_vcpus += need
            unit.reserved = need
            task_id = uuid.uuid4().hex
            stream = f"{unit.job.spec.definition_name}/default/{task_id}"
            unit.current = {"container": {"logStreamName": stream,
                                          "taskArn": task_arn(self.compute_environment, task_id)}}
            unit.job.move(unit, "STARTING", now, None)
            unit.tick = self._tick_no
            self.changed = True
            launches.append((unit, self._request(unit, stream)))
        return launches

    def _request(self, unit: Unit, stream: str) -> Request:
        spec = unit.job.spec
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_BATCH_")}
        python_path = python_path_for_children()
        if python_path:
            env["PYTHONPATH"] = python_path
        env.setdefault("PYTHONUNBUFFERED", "1")  # a killed attempt's output is still in its log
        threads = str(max(1, math.ceil(spec.vcpus)))
        for name in THREAD_VARIABLES:  # no 64 thread pools (and their memory) on a 1-vCPU job
            env.setdefault(name, threads)
        for item in spec.environment or []:
            env[item["name"]] = item.get("value", "")
        env.update(AWS_BATCH_JOB_ID=unit.job_id, AWS_BATCH_JOB_ATTEMPT=str(unit.attempt_number),
                   AWS_BATCH_JQ_NAME=spec.queue, AWS_BATCH_CE_NAME=self.compute_environment)
        if unit.index is not None:
            env["AWS_BATCH_JOB_ARRAY_INDEX"] = str(unit.index)
            env["AWS_BATCH_JOB_ARRAY_SIZE"] = str(spec.array_size)
        log_path = str(self.logs_folder.joinpath(*stream.split("/")))
        return container_argv(list(spec.command or [])), env, log_path, spec.memory

    def _launch(self, unit: Unit, request: Request) -> None:
        argv, env, log_path, memory = request
        handle, error = None, None
        try:
            handle = self.launcher.start(argv, env, log_path, memory, self._exited)
        except Exception as exc:  # the "image" cannot run this command
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        with self.lock:
            if handle is None:
                self._end_attempt(unit, start_error=error)
            else:
                unit.handle = handle
                self._running.add(unit)
                self._launched.append(unit)
                if memory:
                    self.monitor.watch(handle, memory)
                if unit.kill_pending:
                    handle.kill(unit.kill_pending)
            self._drain()
            self.changed = True
        self._wake.set()

    def _exited(self, handle: Any) -> None:
        self._wake.set()

    # -- STARTING -> RUNNING -----------------------------------------------------------------
    def _mark_running(self) -> None:
        launched, self._launched = self._launched, []
        for unit in launched:
            if unit.status == "STARTING":
                self._to_running(unit)

    def _to_running(self, unit: Unit) -> None:
        now = now_ms()
        unit.started = now
        unit.current["startedAt"] = now
        unit.job.move(unit, "RUNNING", now)
        unit.tick = self._tick_no
        timeout = unit.job.spec.timeout
        unit.deadline = time.monotonic() + timeout if timeout else None
        self.changed = True

    # -- the end of an attempt ---------------------------------------------------------------
    def _collect(self) -> None:
        now = time.monotonic()
        for unit in list(self._running):
            handle = unit.handle
            if not handle.running:
                self._end_attempt(unit)
            elif unit.deadline is not None and now >= unit.deadline:
                handle.kill("timeout")
                unit.deadline = None  # killed: its exit wakes the thread (no tick until then)

    def _end_attempt(self, unit: Unit, start_error: Optional[str] = None) -> None:
        spec = unit.job.spec
        now = now_ms()
        handle = unit.handle
        self._running.discard(unit)
        unit.handle, unit.deadline, unit.kill_pending = None, None, None
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
        code = handle.exit_code() if handle is not None else None
        retry = True
        if start_error is not None:
            container["reason"] = f"CannotStartContainerError: {start_error}"
            status_reason = START_FAILED
        elif killed in ("terminate", "shutdown"):
            container["exitCode"] = code
            status_reason = unit.stop_reason or EXITED
            retry = False
        elif killed == "timeout":
            container["exitCode"] = 137
            status_reason = TIMEOUT_REASON
            retry = False  # as Batch: an attempt stopped for its timeout is not retried
        elif killed == "memory" or (code == 137 and spec.memory):
            container["exitCode"] = 137
            container["reason"] = OOM_REASON
            status_reason = EXITED
        else:
            container["exitCode"] = code
            status_reason = EXITED
        attempt["stoppedAt"] = now
        attempt["statusReason"] = status_reason
        unit.attempts.append(attempt)
        succeeded = start_error is None and killed is None and code == 0
        if succeeded:
            self._finalize(unit, "SUCCEEDED", EXITED)
        elif (retry and not unit.cancelled and not unit.terminated and not self._stopping
              and len(unit.attempts) < spec.max_attempts
              and retries.should_retry(spec.exit_rules, exit_code=container.get("exitCode"),
                                       reason=container.get("reason"), status_reason=status_reason)):
            self._queue(unit)
        else:
            self._finalize(unit, "FAILED", status_reason)
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
    def _finalize(self, unit: Unit, status: str, reason: Optional[str]) -> None:
        job = unit.job
        now = now_ms()
        job.move(unit, status, now, reason)
        self._events.append((unit, status == "SUCCEEDED"))
        if job.is_array:
            if job.status not in FINAL and job.all_children_done:
                failed = job.counts["FAILED"] > 0
                parent_reason = None
                if failed:
                    parent_reason = job.stop_reason or (
                        DEPENDENCY_FAILED if job.gate_failed else CHILD_FAILED)
                job.finish_parent("FAILED" if failed else "SUCCEEDED", parent_reason, now)
                self._events.append((job, not failed))
                self.finished.append(job)
        else:
            self.finished.append(job)
        self.changed = True

    def _drain(self) -> None:
        """Tell dependents that what they wait for ended (iteratively: chains can be long)."""
        while self._events:
            node, succeeded = self._events.popleft()
            dependents, node.dependents = node.dependents, []
            for dependent in dependents:
                self._resolve(dependent, succeeded)

    def _resolve(self, dependent: Any, succeeded: bool) -> None:
        if isinstance(dependent, Unit):
            if dependent.status != "PENDING":
                return
            if not succeeded:
                self._finalize(dependent, "FAILED", DEPENDENCY_FAILED)
                return
            dependent.unmet -= 1
            if dependent.unmet <= 0:
                self._ready.append(dependent)
            return
        job: Job = dependent  # an array waiting as a whole (its children hold one count each)
        if job.status in FINAL or job.gate_failed:
            return
        if not succeeded:
            job.gate_failed = True
            for unit in job.units:
                if unit.status == "PENDING":
                    self._finalize(unit, "FAILED", DEPENDENCY_FAILED)
            return
        job.unmet -= 1
        if job.unmet == 0:
            for unit in job.units:
                if unit.status == "PENDING":
                    unit.unmet -= 1
                    if unit.unmet <= 0:
                        self._ready.append(unit)

    # -- shutdown ----------------------------------------------------------------------------
    def shutdown(self, jobs: List[Job], reason: str) -> None:
        """Kill every attempt, fail every unfinished unit with `reason`; the lock is NOT held."""
        with self.lock:
            self._stopping = True
            handles = []
            for unit in list(self._running) + self._launched:
                unit.stop_reason = reason
                if unit.handle is not None:
                    unit.handle.kill("shutdown")
                    handles.append(unit.handle)
            for job in jobs:  # attempts being launched right now are killed when they exist
                for unit in job.units:
                    if unit.status == "STARTING" and unit.handle is None:
                        unit.stop_reason, unit.kill_pending = reason, "shutdown"
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
                        self._finalize(unit, "FAILED", reason)
                if job.is_array and job.status not in FINAL:  # (a parent of no live children)
                    job.finish_parent("FAILED", reason, now)
            self._drain()
