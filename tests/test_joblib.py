"""The joblib backend "batchfutures": joblib's batches (and scikit-learn's n_jobs) as this
executor's array jobs, on the embedded emulator."""

import gc
import os

import joblib
import pytest
from joblib import Parallel, delayed
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV

import batchfutures
from batchfutures.joblib_backend import BatchBackend


@pytest.fixture(autouse=True, scope="module")
def registered():
    batchfutures.register_joblib()


def where(x):
    return x, os.getpid()


def fail_on_three(x):
    if x == 3:
        raise ArithmeticError("three", x)
    return x


@pytest.mark.slow
def test_parallel_runs_as_the_executors_jobs(executor):
    with joblib.parallel_config(backend="batchfutures", executor=executor):
        results = Parallel(n_jobs=2)(delayed(where)(i) for i in range(6))
    assert [x for x, _ in results] == list(range(6))
    assert os.getpid() not in {pid for _, pid in results}  # run by workers, not here
    assert executor._session.submitted_jobs  # through this executor


@pytest.mark.slow
def test_a_calls_exception_is_raised_as_itself(executor):
    with joblib.parallel_config(backend="batchfutures", executor=executor):
        with pytest.raises(ArithmeticError) as caught:
            Parallel(n_jobs=2)(delayed(fail_on_three)(i) for i in range(6))
    assert type(caught.value) is ArithmeticError
    assert caught.value.args == ("three", 3)


def test_n_jobs_minus_one_is_max_workers(executor):
    backend = BatchBackend(executor=executor)
    assert executor._max_workers == 2  # local_env: max_vcpus=2
    assert backend.effective_n_jobs(-1) == 2
    assert backend.effective_n_jobs(-2) == 1
    assert backend.effective_n_jobs(None) == 2
    assert backend.effective_n_jobs(5) == 5
    with pytest.raises(ValueError):
        backend.effective_n_jobs(0)
    with joblib.parallel_config(backend="batchfutures", executor=executor):
        assert joblib.effective_n_jobs(-1) == 2


@pytest.mark.slow
def test_keywords_make_an_executor_for_the_block(local_env):
    with joblib.parallel_config(backend="batchfutures", env=local_env, memory="512MiB"):
        results = Parallel(n_jobs=-1)(delayed(where)(i) for i in range(4))
        backend, _ = joblib.parallel.get_active_backend()
        made = backend.executor
        del backend
    assert [x for x, _ in results] == list(range(4))
    assert os.getpid() not in {pid for _, pid in results}
    assert made.environment is local_env and made.settings.memory_mib() == 512
    gc.collect()
    with pytest.raises(RuntimeError):  # the block's executor is shut down with it
        made.submit(where, 0)


def test_executor_and_keywords_together_are_refused(executor):
    with pytest.raises(TypeError):
        BatchBackend(executor=executor, vcpus=2)


@pytest.mark.slow
def test_grid_search_matches_a_local_fit(executor):
    X, y = load_iris(return_X_y=True)
    grid = {"C": [0.1, 1.0, 10.0]}

    def search(n_jobs):
        return GridSearchCV(LogisticRegression(max_iter=500), grid, cv=3, n_jobs=n_jobs)

    local = search(None).fit(X, y)  # in this process, one fit after the other
    with joblib.parallel_config(backend="batchfutures", executor=executor):
        remote = search(-1).fit(X, y)
    assert remote.best_params_ == local.best_params_
    assert remote.best_score_ == local.best_score_
    assert executor._session.submitted_jobs  # the fits ran as Batch jobs
