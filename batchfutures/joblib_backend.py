"""joblib's ``"batchfutures"`` backend: joblib's batches as a BatchExecutor's (array) jobs.

    register_joblib() ──> joblib.register_parallel_backend("batchfutures", BatchBackend)

    with joblib.parallel_config(backend="batchfutures", executor=ex):  # or env=..., vcpus=...:
        GridSearchCV(..., n_jobs=-1).fit(X, y)                           # one executor per block
          │
        Parallel ─ configure(n_jobs) ─> effective_n_jobs: -1 -> ex._max_workers (-2 -> one less)
          │  joblib cuts the calls into batches (BatchedCalls; sizes from AutoBatchingMixin) and
          │  keeps pre_dispatch (2 x n_jobs) batches in flight
          ├─ submit(batch, callback) ─> ex.submit(batch) ─> Coalescer: batches dispatched close
          │                             together become one array job, one child per batch
          │                                                          worker: batch() runs its
          │                                                          calls, PUT results/<i>
          │  BatchFuture done (poller thread) ─> callback ─> retrieve_result_callback:
          │      future.result(): the batch's list of results, or a call's exception as itself;
          │      joblib then dispatches the next batch from that callback
          ├─ abort_everything() (a call failed) ─> cancel what has not started, abort the rest
          └─ terminate() (the Parallel call ends) ─> the executor stays, for the block's next call

Nested ``Parallel`` calls inside a batch run where the batch runs (joblib's default nested
backend: threads at the first level, then sequential), not as more Batch jobs.
``n_jobs=1`` runs in the client, as joblib does for every backend.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Optional, Set

import joblib  # type: ignore[import-untyped]
from joblib._parallel_backends import (  # type: ignore[import-untyped]
    AutoBatchingMixin,
    ParallelBackendBase,
)

from .executor import BatchExecutor
from .futures import BatchFuture

__all__ = ["BatchBackend", "register_joblib", "BACKEND_NAME"]

BACKEND_NAME = "batchfutures"


class BatchBackend(AutoBatchingMixin, ParallelBackendBase):
    """Runs joblib's batches on ``executor`` (a BatchExecutor); without one, on a BatchExecutor
    made from the other keywords (``env``, ``max_workers``, job settings) at the first
    ``Parallel`` call of the block and shut down when the block's backend is dropped."""

    default_n_jobs = -1  # Parallel(n_jobs=None) in the block: every worker the executor has
    supports_retrieve_callback = True
    uses_threads = False
    supports_sharedmem = False  # require="sharedmem" makes joblib use its threads instead

    def __init__(self, executor: Any = None, nesting_level: Optional[int] = None,
                 inner_max_num_threads: Optional[int] = None, **executor_options: Any) -> None:
        super().__init__(nesting_level=nesting_level,
                         inner_max_num_threads=inner_max_num_threads)
        if executor is not None and executor_options:
            raise TypeError(f"give executor= or the keywords of a BatchExecutor "
                            f"({', '.join(sorted(executor_options))}), not both")
        self._executor = executor
        self._options = executor_options
        self._running: Set[BatchFuture] = set()
        self.parallel: Any = None

    @property
    def executor(self) -> Any:
        if self._executor is None:
            self._executor = BatchExecutor(**self._options)
            weakref.finalize(self, self._executor.shutdown, wait=False)
        return self._executor

    def effective_n_jobs(self, n_jobs: Optional[int]) -> int:
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            n_jobs = self.default_n_jobs
        if n_jobs < 0:  # -1: every worker, -2: all but one, ...
            return max(self.executor._max_workers + 1 + n_jobs, 1)
        return n_jobs

    def configure(self, n_jobs: Optional[int] = 1, parallel: Any = None, prefer: Any = None,
                  require: Any = None, **backend_kwargs: Any) -> int:
        self.parallel = parallel
        return self.effective_n_jobs(n_jobs)

    def submit(self, func: Callable[[], Any],
               callback: Optional[Callable[[Any], None]] = None) -> BatchFuture:
        future = self.executor.submit(func)
        self._running.add(future)
        future.add_done_callback(self._running.discard)
        if callback is not None:
            future.add_done_callback(callback)
        return future

    apply_async = submit  # the name joblib < 1.5 calls

    def retrieve_result_callback(self, future: BatchFuture) -> Any:
        return future.result()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """A call failed: its Parallel stops; the batches it no longer wants are stopped."""
        for future in list(self._running):
            if not future.cancel():
                future.abort("joblib stopped the Parallel call")
        self._running.clear()

    def terminate(self) -> None:
        self.reset_batch_stats()


def register_joblib() -> None:
    """Register the joblib backend ``"batchfutures"`` (`BatchBackend`)."""
    joblib.register_parallel_backend(BACKEND_NAME, BatchBackend)
