"""The executor's initializer and its calls share one module namespace in a child (issue 18).

What ``initializer(*initargs)`` sets with ``global`` is what the calls read, as under
ProcessPoolExecutor: for functions of the user's script (``__main__``, pickled by value), of a
module shipped by value and of a module the worker imports, on the sequential path and on the
inner pool (vcpus > 1). Each test runs a real script in a fresh interpreter on the emulator.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from batchfutures.worker import pool

pytestmark = pytest.mark.slow

# the issue's script: ProcessPoolExecutor gives [0, 10, 20, 30]; before the fix, every
# BatchExecutor call said "uninitialized"
PREDICT = """
    model = None

    def init(scale):
        global model
        model = scale

    def predict(x):
        return "uninitialized" if model is None else model * x
"""


def run_script(tmp_path, body, *, pythonpath=None):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    environment = {**os.environ, "BATCHFUTURES_WORKDIR": str(tmp_path / "work")}
    if pythonpath is not None:
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [
            str(pythonpath), environment.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return done


def lines_with(prefix, text):
    return [line[len(prefix):].strip() for line in text.splitlines() if line.startswith(prefix)]


def test_the_issues_script_matches_process_pool_executor(tmp_path):
    done = run_script(tmp_path, PREDICT + """
    from concurrent.futures import ProcessPoolExecutor
    from batchfutures import BatchExecutor

    if __name__ == "__main__":
        with ProcessPoolExecutor(2, initializer=init, initargs=(10,)) as ex:
            print("ppe:", list(ex.map(predict, range(4))))
        with BatchExecutor(None, 2, initializer=init, initargs=(10,)) as ex:
            print("map:", list(ex.map(predict, range(4))))
            print("chunks:", list(ex.map(predict, range(4), chunksize=2)))
            print("submit:", [f.result() for f in [ex.submit(predict, x) for x in range(4)]])
            print("futures:", [f.result() for f in ex.map_futures(predict, range(4))])
    """)
    assert lines_with("ppe:", done.stdout) == ["[0, 10, 20, 30]"]
    for kind in ("map:", "chunks:", "submit:", "futures:"):
        assert lines_with(kind, done.stdout) == ["[0, 10, 20, 30]"], (kind, done.stdout)


@pytest.mark.skipif(not pool.FORK_AVAILABLE, reason="the inner pool forks on Linux only")
def test_the_inner_pool_shares_the_namespace_in_each_sub_process(tmp_path):
    done = run_script(tmp_path, PREDICT + """
    import os
    from batchfutures import BatchExecutor

    calls = 0

    def counted_init(scale):
        global calls
        calls += 1
        init(scale)

    def predict_where(x):
        return predict(x), calls, os.getpid()

    if __name__ == "__main__":
        # vcpus=2: each child's 6 items run on 2 forked sub-processes (batchfutures/worker/pool.py)
        with BatchExecutor(None, initializer=counted_init, initargs=(10,), vcpus=2) as ex:
            results = list(ex.map(predict_where, range(6), chunksize=6))
        print("values:", [value for value, _, _ in results])
        print("init calls seen:", sorted({seen for _, seen, _ in results}))
        print("processes:", len({pid for _, _, pid in results}))
    """)
    assert lines_with("values:", done.stdout) == ["[0, 10, 20, 30, 40, 50]"], done.stdout
    # the initializer ran once in each process, in the namespace the calls read
    assert lines_with("init calls seen:", done.stdout) == ["[1]"]
    assert lines_with("processes:", done.stdout) == ["2" if pool.usable_cpus() >= 2 else "1"]


def test_a_module_shipped_by_value_shares_the_namespace(tmp_path):
    # a module of the user's own (outside site-packages): pickled by value, as __main__ is
    modules = tmp_path / "mine"
    modules.mkdir()
    (modules / "scorer.py").write_text(textwrap.dedent(PREDICT))
    done = run_script(tmp_path, """
    import scorer
    from batchfutures import BatchExecutor

    if __name__ == "__main__":
        with BatchExecutor(None, initializer=scorer.init, initargs=(3,)) as ex:
            print("map:", list(ex.map(scorer.predict, range(4))))
            print("submit:", ex.submit(scorer.predict, 5).result())
    """, pythonpath=modules)
    assert lines_with("map:", done.stdout) == ["[0, 3, 6, 9]"], done.stdout
    assert lines_with("submit:", done.stdout) == ["15"]


def test_a_module_the_worker_imports_shares_the_namespace(tmp_path):
    # ship_local_modules=False: the module goes by reference and the worker imports it (the
    # job's PYTHONPATH has it, as an image's site-packages would): one module, one namespace
    modules = tmp_path / "installed"
    modules.mkdir()
    (modules / "scorer_ref.py").write_text(textwrap.dedent(PREDICT))
    done = run_script(tmp_path, f"""
    import scorer_ref
    from batchfutures import BatchExecutor

    if __name__ == "__main__":
        with BatchExecutor(None, initializer=scorer_ref.init, initargs=(7,),
                           ship_local_modules=False,
                           environment={{"PYTHONPATH": {str(modules)!r}}}) as ex:
            print("map:", list(ex.map(scorer_ref.predict, range(3))))
    """, pythonpath=modules)
    assert lines_with("map:", done.stdout) == ["[0, 7, 14]"], done.stdout


def test_an_initializer_defined_in_the_script_for_a_function_of_another_script_function(tmp_path):
    # the function reads the namespace through a helper and a class of the script; the
    # initializer's failure still breaks only its children, with the initializer's exception
    done = run_script(tmp_path, """
    import concurrent.futures
    from batchfutures import BatchExecutor, InitializerFailedError

    settings = {}

    class Model:
        def __init__(self, scale):
            self.scale = scale

    def load(scale):
        settings["model"] = Model(scale)

    def current():
        return settings.get("model")

    def predict(x):
        model = current()
        return None if model is None else model.scale * x

    def broken():
        raise RuntimeError("no model here")

    if __name__ == "__main__":
        with BatchExecutor(None, initializer=load, initargs=(2,)) as ex:
            print("map:", list(ex.map(predict, range(3))))
        with BatchExecutor(None, initializer=broken) as ex:
            error = ex.submit(predict, 1).exception(timeout=120)
            print("failure:", type(error).__name__, isinstance(error, concurrent.futures.BrokenExecutor),
                  repr(error.__cause__))
    """)
    assert lines_with("map:", done.stdout) == ["[0, 2, 4]"], done.stdout
    assert lines_with("failure:", done.stdout) == [
        "InitializerFailedError True RuntimeError('no model here')"]
