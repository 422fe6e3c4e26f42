"""The container's world, not the client's: what an attempt sees of the machine that submitted it.

A forked worker attempt is indistinguishable from `python -m batchfutures.worker <url>` exec'd
in the same place: compared field by field with the exec'd command itself.
"""

import json
import os
import sys

import pytest
from emulator_harness import wait_until

from batchfutures import BatchExecutor, LocalEnvironment

PROBE = ("import json, os, sys\n"
         "out = {'cwd': os.getcwd(), 'path': sys.path, 'env': dict(os.environ)}\n"
         "try:\n"
         "    import emulator_harness  # importable only through the client's sys.path\n"
         "    out['client_module'] = True\n"
         "except ImportError:\n"
         "    out['client_module'] = False\n"
         "print(json.dumps(out))\n")


def probe(emu, **kwargs):
    detail = emu.run(["python", "-c", PROBE], **kwargs)
    assert detail["status"] == "SUCCEEDED", emu.log_lines(detail)
    return json.loads(emu.log_lines(detail)[-1])


@pytest.mark.slow
def test_an_attempt_gets_the_jobs_environment_not_the_clients(make_emulator, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # needed to reach storage
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("MY_CLIENT_ONLY", "secret")  # a container would not have it
    monkeypatch.setenv("PYTHONPATH", os.path.dirname(__file__))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    emu = make_emulator()
    seen = probe(emu, vcpus=2, env={"MY_JOB_VARIABLE": "from the job"})
    env = seen["env"]
    assert env["AWS_ENDPOINT_URL_S3"] == "http://127.0.0.1:9"
    assert env["AWS_ACCESS_KEY_ID"] == "testing"
    assert env["MY_JOB_VARIABLE"] == "from the job"
    assert env["AWS_BATCH_JQ_NAME"] == "batchfutures"
    assert "MY_CLIENT_ONLY" not in env
    assert env["OMP_NUM_THREADS"] == "2"  # thread pools sized to the job's vCPUs
    assert "PYTHONPATH" not in env or os.path.dirname(__file__) not in env["PYTHONPATH"]


@pytest.mark.slow
def test_an_attempt_has_neither_the_clients_import_path_nor_its_directory(make_emulator, tmp_path,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    emu = make_emulator()
    seen = probe(emu)
    assert seen["client_module"] is False  # this test's own helper module is the client's
    assert seen["cwd"] != str(tmp_path)
    assert os.path.dirname(__file__) not in seen["path"]
    scratch = seen["cwd"]
    assert scratch.startswith(str(emu.emulator.folder / "scratch"))
    wait_until(lambda: not os.path.exists(scratch), "the scratch folder to be removed")


@pytest.mark.slow
def test_inherit_client_path_is_the_explicit_way_back(make_emulator, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    emu = make_emulator(inherit_client_path=True)
    seen = probe(emu)
    assert seen["client_module"] is True
    assert seen["cwd"] == str(tmp_path)
    assert "MY_CLIENT_ONLY" not in seen["env"]


def report():  # the function each attempt runs: what the interpreter looks like from inside
    import os
    import sys

    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    return {
        "main_name": getattr(spec, "name", None), "main_file": getattr(main, "__file__", None),
        "main_globals": sorted(k for k in vars(main) if not k.startswith("__")),
        "argv0": sys.argv[0], "argc": len(sys.argv), "orig_argv": sys.orig_argv[:3],
        "path_tail": sys.path[1:], "path0_is_cwd": sys.path[0] == os.getcwd(),
        "env": sorted(k for k in os.environ if not k.startswith("AWS_BATCH_JOB_ID")),
        "main_imported": "batchfutures.worker.__main__" in sys.modules,
        "cwd_parent": os.path.dirname(os.path.dirname(os.getcwd())),
        "stdin": os.readlink("/proc/self/fd/0"),
    }


@pytest.mark.slow
def test_a_forked_attempt_is_indistinguishable_from_python_m_batchfutures_worker(tmp_path, monkeypatch):
    found = {}
    for forked in (True, False):
        monkeypatch.setenv("BATCHFUTURES_EMULATOR_FORKSERVER", "1" if forked else "0")
        env = LocalEnvironment(tmp_path / ("forked" if forked else "exec"), max_vcpus=1)
        with BatchExecutor(env) as executor:
            found[forked] = executor.submit(report).result(timeout=120)
    forked, execd = found[True], found[False]
    assert execd["main_name"] == "batchfutures.worker.__main__"  # -m of a package runs its __main__
    assert forked["cwd_parent"].endswith("scratch") and execd["cwd_parent"].endswith("scratch")
    for result in (forked, execd):
        result.pop("cwd_parent")
    assert forked == execd
    assert forked["orig_argv"] == [sys.executable, "-m", "batchfutures.worker"]
