"""A child of a job with N vCPUs runs its items on N processes (batchfutures/worker/pool.py).

The pool runner is tested in this process (it forks real sub-processes), then in the real
worker command, then end to end on the emulator.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest
from test_worker import make_job, results, run_worker

from batchfutures import BatchExecutor, InitializerFailedError, RemoteError, serialization, wire
from batchfutures.storage import Storage
from batchfutures.worker import calls, pool
from batchfutures.worker import main as worker

needs_fork = pytest.mark.skipif(not pool.FORK_AVAILABLE, reason="the pool forks on Linux only")


# -- how many processes (pure) ------------------------------------------------------------------
@pytest.mark.parametrize("value, expected", [
    (None, 1), ("", 1), ("1", 1), ("2", 2), ("4", 4), ("2.0", 2), ("3.75", 3), ("0.25", 1),
    ("-2", 1), ("nan", 1), ("inf", 1), ("lots", 1), (" 2 ", 2),
])
def test_requested_processes_from_the_job_vcpus(value, expected):
    environ = {} if value is None else {pool.VCPUS_VARIABLE: value}
    assert pool.requested_processes(environ) == expected


@pytest.mark.parametrize("text, expected", [
    ("max 100000\n", None), ("200000 100000\n", 2.0), ("150000 100000", 1.5), ("50000 100000", 0.5),
    ("", None), ("garbage", None), ("0 100000", None), ("100000 0", None),
])
def test_cgroup_v2_cpu_max(text, expected):
    assert pool.parse_cpu_max(text) == expected


@pytest.mark.parametrize("quota, period, expected", [
    ("-1\n", "100000\n", None), ("400000", "100000", 4.0), ("x", "100000", None), ("50000", "100000", 0.5),
])
def test_cgroup_v1_cfs_quota(quota, period, expected):
    assert pool.parse_cfs_quota(quota, period) == expected


@needs_fork
def test_processes_capped_by_items_and_cpus():
    cpus = pool.usable_cpus()
    assert cpus >= 1
    assert pool.processes_for(10, {pool.VCPUS_VARIABLE: "64"}) == min(64, cpus, 10)
    assert pool.processes_for(1, {pool.VCPUS_VARIABLE: "64"}) == 1  # one item: no pool
    assert pool.processes_for(10, {}) == 1
    assert pool.processes_for(10, {pool.VCPUS_VARIABLE: "1"}) == 1


# -- the pool runner, in this process -------------------------------------------------------------
Call = Tuple[Callable[..., Any], tuple, dict]


def prepare(storage: Storage, calls: Sequence[Call], *, initializer: Optional[Callable] = None,
            initargs: tuple = (), legacy: bool = False
            ) -> Tuple[Dict[str, Any], List[Tuple[int, tuple, dict]]]:
    """The header and unpacked items worker.run_items would hold, payloads in storage.

    With an initializer, as the client pickles it: in each function's pickle, the initargs
    apart (header "initargs"); ``legacy``: as written before the initializer travelled in each
    function's pickle, one pickle of both (header "initializer") and the functions alone."""
    run_id = "run-" + uuid.uuid4().hex[:8]
    functions: List[Callable] = []
    items = []
    for fn, args, kwargs in calls:
        if not any(fn is known for known in functions):
            functions.append(fn)
        items.append((next(i for i, known in enumerate(functions) if known is fn), args, kwargs))
    bundled = None if legacy else initializer
    header: Dict[str, Any] = {
        "functions": [storage.put_function(run_id, serialization.dumps_function(fn, bundled))
                      for fn in functions],
        "items": len(items), "chunksize": len(items), "encoding": wire.CALLS,
    }
    if initializer is not None and legacy:
        header["initializer"] = storage.put_function(run_id, serialization.dumps((initializer, initargs)))
    elif initializer is not None:
        header["initargs"] = storage.put_function(run_id, serialization.dumps(initargs))
    header.update(serialization.payload_stamp())
    return header, items


def decoded(outcomes: Sequence[bytes]) -> List[Tuple[bool, Any]]:
    return [wire.outcome_result(outcome) for outcome in outcomes]


def pid_after(seconds: float, x: Any) -> Tuple[Any, int]:
    time.sleep(seconds)
    return x, os.getpid()


def fail(x):
    raise ValueError("bad item", x)


def leave(code):
    raise SystemExit(code)


@pytest.mark.slow
@needs_fork
def test_pool_outcomes_in_order_one_failure_fails_only_its_item(local):
    calls: List[Call] = [(pid_after, (0.02, x), {}) for x in range(6)]
    calls[2] = (fail, (2,), {})
    calls[4] = (leave, (7,), {})  # SystemExit from an item is that item's outcome
    header, items = prepare(local, calls)

    outcomes = pool.run_items(local, header, items, 0, processes=2)

    values = decoded(outcomes)
    assert len(values) == 6
    assert [v[1][0] for i, v in enumerate(values) if i not in (2, 4)] == [0, 1, 3, 5]
    assert all(ok for i, (ok, _) in enumerate(values) if i not in (2, 4))
    ok, error = values[2]
    assert not ok and type(error) is ValueError and error.args == ("bad item", 2)
    ok, error = values[4]
    assert not ok and type(error) is SystemExit and error.code == 7
    pids = {v[1][1] for i, v in enumerate(values) if i not in (2, 4)}
    assert len(pids) == 2 and os.getpid() not in pids  # two sub-processes ran them, not this one


@pytest.mark.slow
@needs_fork
def test_pool_encodes_each_outcome_as_the_sequential_worker(local, monkeypatch):
    def unpicklable():
        return (x for x in range(1))  # a generator: cannot be pickled

    calls: List[Call] = [(abs, (-3,), {}), (fail, (1,), {}), (divmod, (7, 2), {}), (unpicklable, (), {})]
    header, items = prepare(local, calls)
    monkeypatch.setenv(pool.VCPUS_VARIABLE, "1")  # worker.run_items: the sequential path
    sequential = worker.run_items(local, header, wire.pack_items(items), 0)
    pooled = pool.run_items(local, header, items, 0, processes=2)
    assert [wire.outcome_kind(o) for o in pooled] == ["ok", "error", "ok", "error"]
    assert [wire.outcome_kind(o) for o in pooled] == [
        wire.outcome_kind(o) for o in sequential]
    assert pooled[0] == sequential[0] and pooled[2] == sequential[2]
    assert decoded(pooled)[0] == (True, 3) and decoded(pooled)[2] == (True, (3, 1))
    ok, error = decoded(pooled)[3]
    assert not ok and "could not be pickled" in str(getattr(error, "__notes__", [""])[0])


@pytest.mark.slow
@needs_fork
def test_initializer_runs_once_in_each_process_before_its_items(local, tmp_path):
    marks = tmp_path / "initialized"
    marks.mkdir()

    def initializer(folder):
        with open(os.path.join(folder, str(os.getpid())), "a") as handle:
            handle.write("x")

    def initialized_here(x):
        return x, os.getpid(), os.path.exists(os.path.join(str(marks), str(os.getpid())))

    header, items = prepare(local, [(initialized_here, (x,), {}) for x in range(8)],
                            initializer=initializer, initargs=(str(marks),))
    values = decoded(pool.run_items(local, header, items, 3, processes=2))

    assert [v[0] for _, v in values] == list(range(8))
    assert all(ok and v[2] for ok, v in values)  # each item ran after its process's initializer
    initialized = {int(name): (marks / name).read_text() for name in os.listdir(marks)}
    assert len(initialized) == 2 and set(initialized.values()) == {"x"}  # once in each of 2
    assert {v[1] for _, v in values} <= set(initialized)


@pytest.mark.slow
@needs_fork
@pytest.mark.parametrize("legacy", [False, True])
def test_a_failing_initializer_fails_every_item(local, legacy):
    def broken():
        print("connecting...")
        raise RuntimeError("no database")

    header, items = prepare(local, [(abs, (-x,), {}) for x in range(4)], initializer=broken,
                            legacy=legacy)
    output: Dict[int, Any] = {}
    values = decoded(pool.run_items(local, header, items, 0, processes=2, output=output))
    assert len(values) == 4
    for ok, error in values:
        assert not ok and isinstance(error, InitializerFailedError)
        assert isinstance(error.__cause__, RuntimeError) and error.__cause__.args == ("no database",)
    assert output == {0: ["connecting...\n", "", 0, 0]}  # what it printed, with the first item


# module-level: pickled by value (tests/ is not site-packages), as a script's functions are
_scale: Optional[int] = None


def _set_scale(value: int) -> None:
    global _scale
    _scale = value


def _scaled(x: int) -> Any:
    return "uninitialized" if _scale is None else _scale * x


@pytest.mark.slow
@needs_fork
@pytest.mark.parametrize("processes", [1, 2])
def test_the_initializer_and_the_calls_share_one_namespace(local, monkeypatch, processes):
    header, items = prepare(local, [(_scaled, (x,), {}) for x in range(4)],
                            initializer=_set_scale, initargs=(10,))
    if processes == 1:
        monkeypatch.setenv(pool.VCPUS_VARIABLE, "1")  # worker.run_items: the sequential path
        outcomes = worker.run_items(local, header, wire.pack_items(items), 0)
    else:
        outcomes = pool.run_items(local, header, items, 0, processes=2)
    assert decoded(outcomes) == [(True, 0), (True, 10), (True, 20), (True, 30)]
    assert _scale is None  # this process's module is not theirs
    # before the initializer travelled in each function's pickle (one pickle of the initializer
    # and its initargs, the functions apart),
    # the calls had a namespace of their own: still run as it was
    legacy, items = prepare(local, [(_scaled, (x,), {}) for x in range(2)],
                            initializer=_set_scale, initargs=(10,), legacy=True)
    assert decoded(pool.run_items(local, legacy, items, 0, processes=2)) == [
        (True, "uninitialized")] * 2


@pytest.mark.slow
@needs_fork
def test_each_items_output_comes_back_from_its_sub_process(local):
    def init():
        print(f"init {os.getpid()}")

    def item(x):
        print(f"item {x}")
        if x % 2:
            print(f"odd {x}", file=sys.stderr)
        return os.getpid()

    header, items = prepare(local, [(item, (x,), {}) for x in range(6)], initializer=init)
    output: Dict[int, Any] = {}
    pids = [value for _, value in decoded(pool.run_items(local, header, items, 0, processes=2,
                                                         output=output))]
    assert set(output) == set(range(6))
    for x in range(6):
        out, err, out_cut, err_cut = output[x][:4]
        assert out.endswith(f"item {x}\n") and err == (f"odd {x}\n" if x % 2 else "")
        if x % 2:  # stdout then stderr, in the order written (the runs: outputorder)
            assert output[x][5] == [[0, len(out)], [1, len(err)]]
        assert out_cut == err_cut == 0
    # each sub-process's initializer output comes with the first item it ran
    inits = [output[x][0].split("\n")[0] for x in range(6) if output[x][0].startswith("init ")]
    assert sorted(inits) == sorted(f"init {pid}" for pid in set(pids))


@pytest.mark.slow
@needs_fork
def test_a_function_that_does_not_load_fails_its_items_only(local):
    header, items = prepare(local, [(abs, (-1,), {}), (fail, (2,), {}), (abs, (-3,), {})])
    header["functions"][1] = header["functions"][1].replace(".pkl", "-missing.pkl")
    values = decoded(pool.run_items(local, header, items, 0, processes=2))
    assert values[0] == (True, 1) and values[2] == (True, 3)
    assert not values[1][0] and isinstance(values[1][1], RemoteError)
    assert "could not load the function" in str(values[1][1])


@pytest.mark.slow
@needs_fork
def test_a_memory_error_in_a_sub_process_ends_the_child_with_137(local):
    def out_of_memory():
        raise MemoryError

    header, items = prepare(local, [(pid_after, (0.0, 1), {}), (out_of_memory, (), {}),
                                    (pid_after, (5.0, 3), {})])
    with pytest.raises(pool.SubProcessEnded) as ended:
        pool.run_pool(items, header, 0, calls.Prefetched(local, header["functions"]), 2)
    assert ended.value.exit_status == worker.OOM_EXIT_STATUS
    with pytest.raises(MemoryError):  # what the worker turns into exit status 137
        pool.run_items(local, header, items, 0, processes=2)


def record_pid_then_sleep(path: str, seconds: float) -> None:
    with open(path, "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(seconds)
    with open(path + ".done", "w") as handle:  # reached only if nobody stopped it
        handle.write("done")


@pytest.mark.slow
@needs_fork
def test_a_sub_process_that_exits_ends_the_child_with_its_status(local, tmp_path):
    pid_file = tmp_path / "sleeper.pid"
    header, items = prepare(local, [(record_pid_then_sleep, (str(pid_file), 20.0), {}),
                                    (os._exit, (3,), {})])
    with pytest.raises(pool.SubProcessEnded) as ended:
        pool.run_pool(items, header, 0, calls.Prefetched(local, header["functions"]), 2)
    assert ended.value.exit_status == 3
    # the other sub-process was killed, not waited for (its item would sleep 20 s)
    assert not (tmp_path / "sleeper.pid.done").exists()
    if pid_file.exists():
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid_file.read_text()), 0)


# -- the worker command, with BATCHFUTURES_VCPUS set -------------------------------------------
@pytest.mark.slow
@needs_fork
def test_the_worker_command_runs_items_on_two_processes_and_prints_reach_the_log(local, monkeypatch):
    def shout(x):
        import atexit

        print(f"item {x} from {os.getpid()}", flush=False)
        if x == 0:
            atexit.register(print, f"atexit handler of {os.getpid()}")
        time.sleep(0.05)
        return x, os.getpid()

    monkeypatch.setenv(pool.VCPUS_VARIABLE, "2")
    job = make_job(local, [[(shout, (x,), {}) for x in range(6)]])
    done = run_worker(job)
    assert done.returncode == 0, done.stderr
    meta, values = results(local, job)
    assert [v for _, (v, _) in values] == list(range(6))
    pids = {pid for _, (_, pid) in values}
    assert len(pids) == 2 and meta["pid"] not in pids
    for x, pid in (v for _, v in values):
        assert f"item {x} from {pid}" in done.stdout
    assert f"atexit handler of {values[0][1][1]}" in done.stdout  # run where it was registered


@pytest.mark.slow
@needs_fork
def test_the_worker_command_keeps_137_and_crash_statuses(local, monkeypatch):
    def out_of_memory():
        raise MemoryError

    monkeypatch.setenv(pool.VCPUS_VARIABLE, "2")
    job = make_job(local, [[(abs, (-1,), {}), (out_of_memory, (), {}), (abs, (-2,), {})]])
    done = run_worker(job)
    assert done.returncode == 137
    assert "MemoryError" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert local.read_result(job, 0) is None

    job = make_job(local, [[(abs, (-1,), {}), (os._exit, (3,), {})]])
    done = run_worker(job)
    assert done.returncode == 3, done.stderr
    assert local.read_result(job, 0) is None


# -- end to end on the emulator -----------------------------------------------------------------
def index_and_pid(x):
    time.sleep(0.05)
    return x, os.getpid()


@pytest.mark.slow
@needs_fork
def test_a_two_vcpu_child_runs_its_chunk_on_two_processes(local_env):
    # BATCHFUTURES_VCPUS by hand until the client sets it from vcpus (session's request builder)
    with BatchExecutor(local_env, vcpus=2, environment={pool.VCPUS_VARIABLE: "2"}) as ex:
        values = list(ex.map(index_and_pid, range(8), chunksize=4))
    assert [x for x, _ in values] == list(range(8))
    for child in (values[:4], values[4:]):
        assert len({pid for _, pid in child}) == 2  # each child's items ran on two processes
    assert len({pid for _, pid in values}) >= 2


def squared(x):
    return x * x


def plus_one_and_pid(x):
    return x + 1, os.getpid()


@pytest.mark.slow
@needs_fork
def test_the_inner_pool_reads_arguments_that_are_other_calls_results(local_env):
    """Futures mapped over: each sub-process gets the upstream values, read (and their seals
    checked) by the worker before the fork, never the placeholders."""
    with BatchExecutor(local_env, vcpus=2, environment={pool.VCPUS_VARIABLE: "2"}) as ex:
        firsts = ex.map_futures(squared, range(8), chunksize=4)
        seconds = ex.map_futures(plus_one_and_pid, firsts, chunksize=8)  # one child, 2 processes
        values = [future.result(timeout=120) for future in seconds]
    assert [value for value, _ in values] == [x * x + 1 for x in range(8)]
    assert len({pid for _, pid in values}) == 2
