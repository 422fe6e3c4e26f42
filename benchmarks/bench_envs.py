"""`requirements=`: building an environment of numpy and pandas, and unpacking it in the worker,
side by side with `pip install` of the same wheels into a fresh venv (docs/environments.md).

    python benchmarks/bench_envs.py [--wheels DIR] [--requirements numpy pandas] [--repeats 3]

pip reads the wheels from DIR (PIP_NO_INDEX, PIP_FIND_LINKS: the same wheels for both sides;
without --wheels, from wherever this machine's pip configuration points). Per repeat, in fresh
temporary folders:

    build          envbuild.prepare: resolve for this interpreter's platform, pip --target,
                   pack, seal, store (the first job of a new requirement set pays this)
    reuse          the same again from a new process's point of view (memo cleared): the
                   archive is found, nothing built or uploaded (the uploads are counted)
    worker unpack  worker/envs.activate into an empty cache folder: sealed read, checks, unpack
    worker reuse   activate again on the same host (the cache folder is there)
    venv + pip     python -m venv, then pip install of the same pins into it (what building a
                   per-job environment the usual way costs)
    pip only       pip install of the same pins into a fresh venv made beforehand
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchfutures import envarchive, envbuild, signing  # noqa: E402
from batchfutures.storage import Storage  # noqa: E402
from batchfutures.worker import envs  # noqa: E402


class Local:
    image_python = sys.executable


class CountingStorage(Storage):
    uploads = 0

    def put_bytes(self, url: str, data: bytes, *, exclusive: bool = False) -> bool:
        type(self).uploads += 1
        return super().put_bytes(url, data, exclusive=exclusive)


def timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def one_round(specs: List[str]) -> Dict[str, float]:
    times: Dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-envs-") as folder:
        root = Path(folder) / "storage"
        root.mkdir()
        storage = CountingStorage(root.as_uri(), signer=signing.Signer(lambda: b"k" * 32, "bench"))
        envbuild._prepared.clear()
        envbuild._stored.clear()
        urls: List[str] = []
        times["build"] = timed(lambda: urls.append(envbuild.prepare(Local(), storage, tuple(specs))))
        url = urls[0]
        size = os.path.getsize(storage._path(url))
        target = envbuild.interpreter_target(sys.executable)
        pins = envbuild.resolve(tuple(specs), target)
        envbuild._prepared.clear()
        envbuild._stored.clear()
        before = CountingStorage.uploads
        times["reuse"] = timed(lambda: envbuild.prepare(Local(), storage, tuple(specs)))
        times["reuse uploads"] = CountingStorage.uploads - before
        environ = {envarchive.POINTER_VARIABLE: url, envs.CACHE_VARIABLE: f"{folder}/cache"}
        saved = list(sys.path)
        times["worker unpack"] = timed(lambda: envs.activate(storage, environ))
        times["worker reuse"] = timed(lambda: envs.activate(storage, environ))
        sys.path[:] = saved
        probe = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, "
                                f"{envs.cache_root(environ) + '/' + envarchive.digest_of(url)!r}); "
                                "import numpy, pandas; print(numpy.__file__)"],
                               capture_output=True, text=True)
        assert folder in probe.stdout, probe.stderr  # the unpacked copies are the ones imported
        venv = Path(folder) / "venv"

        def venv_and_pip() -> None:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                            "--no-deps", *pins], check=True)

        times["venv + pip"] = timed(venv_and_pip)
        fresh = Path(folder) / "venv2"
        subprocess.run([sys.executable, "-m", "venv", str(fresh)], check=True)
        times["pip only"] = timed(lambda: subprocess.run(
            [str(fresh / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", *pins],
            check=True))
        times["archive MiB"] = size / 2 ** 20
        times["pins"] = len(pins)
        print("  pins:", " ".join(pins), flush=True)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", help="a folder of wheels pip reads (no index)")
    parser.add_argument("--requirements", nargs="+", default=["numpy", "pandas"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.wheels:
        os.environ.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=os.path.abspath(args.wheels))
    rounds = [one_round(args.requirements) for _ in range(args.repeats)]
    print(f"requirements={args.requirements} on {envbuild.interpreter_target(sys.executable).describe()}, "
          f"{args.repeats} rounds (median, min..max)")
    for name in rounds[0]:
        values = [r[name] for r in rounds]
        unit = "" if name in ("reuse uploads", "pins", "archive MiB") else " s"
        print(f"  {name:<16} {statistics.median(values):>9.3f}{unit}   "
              f"({min(values):.3f}..{max(values):.3f})")


if __name__ == "__main__":
    main()
