"""`BatchExecutor`: a `concurrent.futures.Executor` whose workers are AWS Batch jobs.

    BatchExecutor(env, **settings) ──holds──> Session (environment, storage, poller, buffers)
        │  with_settings(**overrides) ──> another BatchExecutor on the same Session
        │
        ├─ submit(fn, *args)  ──> Session.submit: coalesced with neighbours into one array job
        ├─ map(fn, *its)      ──> slices of up to 10,000 children x chunksize items, submitted as
        │                         the iterator is consumed (a bounded look-ahead), results in order;
        │                         buffersize=N: at most N items submitted ahead of the last yielded
        ├─ map_futures(...)   ──> the same layout, every slice at once, one future per item
        ├─ attach(job_id)     ──> futures of an earlier job, from Batch and from storage
        ├─ shutdown()         ──> flush, optionally cancel, wait, stop the poller
        ├─ terminate_workers(), kill_workers() ──> Session.terminate: TerminateJob per unfinished
        │                         job, every unfinished future fails (JobAbortedError), shut down
        └─ _max_workers       ──> max_workers, else the environment's vCPUs at once / job vCPUs
                                  (what Dask and the joblib backend size their fan-out by)

The executor is a thin layer: map's pipeline (slices, the cache path, map's iterator) is
`mapping.py`'s; the job state lives in `session.Session` and the parts it holds
(`coalescer.Coalescer`, `submission.Submitter`, `poller.Poller`, `jobs.TrackedJob`).
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from typing import Any, Callable, Iterable, Iterator, List, Literal, Optional, Sequence, Union

from . import inherit, mapping, shipfiles
from .environments import EnvironmentLike, resolve_environment
from .futures import BatchFuture
from .logsearch import search as search_logs
from .progress import for_map as progress_for_map
from .session import Session
from .settings import JobSettings
from .spending import check_max_cost

__all__ = ["BatchExecutor"]


class BatchExecutor(concurrent.futures.Executor):
    """Run calls as AWS Batch (array) jobs; with no environment, on the embedded emulator."""

    def __init__(self, env: EnvironmentLike = None, max_workers: Optional[int] = None,
                 mp_context: Any = None, initializer: Optional[Callable[..., Any]] = None,
                 initargs: tuple = (), *, max_tasks_per_child: Optional[int] = None,
                 ship_local_modules: bool = True, dry_run: bool = False,
                 echo_output: Union[bool, str] = True,
                 cache: bool = False, files: Optional[Sequence[Any]] = None,
                 max_cost: Optional[float] = None, **settings: Any) -> None:
        """``ProcessPoolExecutor``'s parameters, after ``env``, then the job settings.

        ``max_workers`` bounds how many of this executor's children run at once (submissions
        are paced; see docs/architecture.md). ``initializer(*initargs)`` runs once in each
        child process before its items. ``mp_context`` and ``max_tasks_per_child`` are
        accepted for compatibility and have no effect: every attempt is a fresh process.
        ``ship_local_modules``: pickle functions and classes of the client's own modules
        (outside the standard library and site-packages) by value, since the worker's image
        does not have them. ``dry_run``: build every request and object as it would be sent,
        send nothing; the futures raise ``DryRunResult`` (see batchfutures.dryrun).
        ``echo_output``: what a call prints to stdout and stderr is written to this process's
        sys.stdout and sys.stderr when its future resolves (the job's log has it either way);
        ``"live"``: streamed, each line prefixed by its call, while the call runs (livetail.py).
        ``cache``: a call identical (function, arguments, job environment, as pickled) to one
        that succeeded before in this storage resolves from its stored result, with
        ``future.cached`` True, instead of running again (see docs/caching.md).
        ``files``: local files and folders (paths as the script opens them, under its working
        directory) shipped with the run into each call's working directory (batchfutures.shipfiles).
        ``max_cost``: USD; once the estimated cost of the calls that ended (``ex.cost``)
        reaches it, nothing more is sent and the calls not sent fail with BudgetExceededError
        (docs/cost.md).
        """
        budget = check_max_cost(max_cost)  # ConfigurationError before anything starts
        if max_workers is not None:
            if isinstance(max_workers, bool) or not isinstance(max_workers, int):
                raise TypeError(f"max_workers must be an integer, not {type(max_workers).__name__}")
            if max_workers <= 0:
                raise ValueError("max_workers must be greater than 0")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if max_tasks_per_child is not None:
            if not isinstance(max_tasks_per_child, int):
                raise TypeError("max_tasks_per_child must be an integer")
            if max_tasks_per_child <= 0:
                raise ValueError("max_tasks_per_child must be >= 1")
        del mp_context  # every attempt is a fresh process: there is no start method to choose
        if isinstance(echo_output, str) and echo_output != "live":
            raise ValueError(f"echo_output must be True, False or 'live', not {echo_output!r}")
        # read now, as the script's working directory has them (files= later edits do not ship)
        shipped = shipfiles.pack(shipfiles.collect(files, os.getcwd())) if files else None
        # os.environ's changes since start reach the calls, as a process pool's children inherit
        # them (inherit.py: not credential-like names; environment= wins)
        self._settings = JobSettings.from_kwargs(**inherit.with_inherited(settings))
        environment = resolve_environment(env)
        environment.validate_settings(self._settings)
        self._session = Session(environment, max_workers=max_workers, initializer=initializer,
                                initargs=tuple(initargs), ship_local_modules=ship_local_modules,
                                dry_run=dry_run, echo_output=bool(echo_output),
                                live=echo_output == "live",
                                cache=bool(cache), files=shipped)
        self._session.submitter.spending.max_cost = budget

    @property
    def cost(self) -> float:
        """The estimated USD of this executor's calls that ended (the sum of their
        ``future.cost``; docs/cost.md)."""
        return self._session.submitter.spending.total

    @classmethod
    def _view(cls, session: Session, settings: JobSettings) -> "BatchExecutor":
        view = cls.__new__(cls)
        view._settings = settings
        view._session = session
        return view

    @property
    def environment(self) -> Any:
        return self._session.env

    @property
    def settings(self) -> JobSettings:
        return self._settings

    def with_settings(self, **overrides: Any) -> "BatchExecutor":
        """An executor view with other job settings, sharing environment, storage and poller."""
        if "environment" in overrides:  # a new environment=: os.environ's changes under it
            overrides = inherit.with_inherited(overrides)
        settings = JobSettings.from_kwargs(self._settings, **overrides)
        self._session.env.validate_settings(settings)
        return self._view(self._session, settings)

    # -- submit ------------------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> BatchFuture:
        if not callable(fn):
            raise TypeError(f"submit() needs a callable, not {type(fn).__name__}")
        return self._session.submit(self._settings, fn, args, kwargs)

    # -- map ---------------------------------------------------------------------------------
    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any], timeout: Optional[float] = None,
            chunksize: Union[int, str] = 1, buffersize: Optional[int] = None,
            progress: Union[bool, str] = False) -> Iterator[Any]:
        """Like the built-in map, run as array jobs; results in input order.

        When the call on item k raised, items 0..k-1 are yielded and then item k's exception.
        ``timeout`` counts from this call and raises concurrent.futures.TimeoutError.
        ``chunksize="auto"``: about a minute of work per child, at least N = floor(vcpus) items
        (one per process the child runs them on). Unless this executor timed ``fn`` before, the
        first child is sent alone as a sample of N items, and the rest once it has finished,
        sized from its run time in its container (see docs/performance.md).
        ``progress``: True shows Batch's counts for this map on stderr, "auto" only on a terminal.
        ``buffersize`` (Python 3.14's ``Executor.map``): at most that many items are submitted
        ahead of the one last yielded, in children of ``min(chunksize, buffersize)`` items, so
        an endless iterable works; without it, slices of up to 10,000 children are submitted
        a few slices ahead.
        """
        if buffersize is not None:
            if not isinstance(buffersize, int):
                raise TypeError("buffersize must be an integer or None")
            if buffersize < 1:
                raise ValueError("buffersize must be None or > 0")
        end_time = None if timeout is None else time.monotonic() + timeout
        budget = None if buffersize is None else mapping.Budget(buffersize)
        slices = mapping.slices(self._session, self._settings, fn, iterables, chunksize,
                                per_child=True, deadline=end_time, budget=budget)
        shown = progress_for_map(progress, fn)  # None unless progress is asked for
        if shown is not None:
            slices = shown.follow(slices)
        # The first slices go now, as ProcessPoolExecutor.map submits at once: bad input raises
        # here, and a map nobody iterates still runs. Later slices follow as results are taken.
        return mapping.map_iterator(slices, chunksize, budget, end_time, shown)

    def map_futures(self, fn: Callable[..., Any], *iterables: Iterable[Any],
                    chunksize: Union[int, str] = 1) -> List[BatchFuture]:
        """The layout of map(), every slice submitted now, one future per item.

        ``chunksize="auto"``: as map's when this executor timed ``fn`` before (an earlier auto
        map), otherwise N = floor(vcpus) items per child: every future is returned at once,
        with no sample to wait for.
        """
        return mapping.every_future(mapping.slices(self._session, self._settings, fn, iterables,
                                                   chunksize))

    # -- attach, shutdown ----------------------------------------------------------------------
    def attach(self, job_id: str) -> Union[BatchFuture, List[BatchFuture]]:
        """The future(s) of a job submitted earlier, possibly by another process."""
        futures = self._session.attach(job_id)
        return futures[0] if len(futures) == 1 else futures

    def job(self, job_id: str) -> Any:
        """The Batch job as a whole (a `jobview.JobInfo`): status, reason, child count and, per
        child, status, exit code and reason, from DescribeJobs and ListJobs; ``.log()`` reads
        its log; ``.usage`` (read from storage when first asked) its calls' CPU summed, their
        largest peak memory, and the vCPU- and GiB-seconds it reserved (docs/usage.md). For
        arrays and plain jobs alike; ``"<array id>:<i>"`` names one child."""
        # start-up: jobview costs ~3.5 ms after the executor's imports; only .job() needs it
        from .jobview import describe_in

        return describe_in(self._session.env, job_id)

    def logs(self, search: Optional[str] = None, *, failed_only: bool = False) -> List[Any]:
        """The log lines of this executor's calls so far, across every child of its jobs, that
        contain ``search`` (all lines when None), as ``logsearch.LogLine`` (job_id, index,
        timestamp, message); ``failed_only``: only children Batch failed or with a call that
        raised. One FilterLogEvents per 100 children (batchfutures.logsearch)."""
        return list(search_logs(self._session.env, list(self._session.submitter.submitted_jobs),
                                search, failed_only))

    def report(self, path: Any) -> str:
        """Write one self-contained HTML page about this executor's jobs so far to ``path``: a
        timeline of every child, status counts, usage and memory advice, each failure with its
        reason and log tail or traceback (batchfutures.report; ``batchfutures report JOB -o
        FILE.html`` writes the same); returns the path."""
        # start-up: report (jobview, html) costs ~6.5 ms; only .report() needs it
        from .report import write

        return write(self._session.env, list(self._session.submitter.submitted_jobs), path)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._session.shutdown(wait=wait, cancel_futures=cancel_futures)

    def terminate_workers(self) -> None:
        """Python 3.14's ``ProcessPoolExecutor.terminate_workers``: stop every unfinished job of
        this executor now (TerminateJob), fail its futures with ``JobAbortedError``, shut down.

        On AWS, TerminateJob stops a running container as ECS does (SIGTERM, then SIGKILL after
        the stop timeout); the local emulator kills the attempt's processes at once (SIGKILL).
        """
        self._session.terminate("terminate_workers")

    def kill_workers(self) -> None:
        """Python 3.14's ``ProcessPoolExecutor.kill_workers``: as ``terminate_workers`` (Batch
        has one way to stop a job, TerminateJob)."""
        self._session.terminate("kill_workers")

    @property
    def _max_workers(self) -> int:
        """How many calls can run at once (the attribute Dask reads to size its fan-out):
        ``max_workers`` when given, else the vCPUs the environment runs at once (the local
        ``max_vcpus`` or CPUs; on AWS the queue's compute environments' maxvCpus, read once)
        divided by the vCPUs of one job of these settings (all its nodes)."""
        given = self._session.submitter.max_workers
        if given is not None:
            return int(given)
        settings = self._settings
        env = self._session.env
        per_job = settings.vcpus * max(1, settings.nodes)
        workers = int(env.max_vcpus_at_once() / per_job + 1e-9)
        gpus = env.gpus  # None: the environment does not count GPUs (AWS: its queue decides)
        if settings.gpus and gpus is not None:
            workers = min(workers, gpus // (settings.gpus * max(1, settings.nodes)))
        return max(1, workers)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> Literal[False]:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            # Ctrl-C: stop what this executor started (cancel, terminate), say which jobs, and
            # leave now; a second Ctrl-C interrupts even that
            self._session.interrupt()
            return False
        try:
            self.shutdown(wait=True)
        except KeyboardInterrupt:  # Ctrl-C while waiting for the block's work
            self._session.interrupt()
            raise
        return False

    def __repr__(self) -> str:
        return f"BatchExecutor({self._session.env!r}, {self._settings.as_dict()!r})"
