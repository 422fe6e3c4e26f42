"""Test helpers for `requirements=` (no package index anywhere): wheels written here, a bare
interpreter that has only the worker's own dependencies, and pip pointed at a local folder.

    make_wheel(folder, "tinypkg", "1.0", {"tinypkg/__init__.py": "..."}, requires=["tinydep"])
    bare_python(folder)      a venv's bin/python (no pip, no system site-packages) whose one .pth
                             names a folder of links to batchfutures and its dependencies' files
    offline_pip(monkeypatch, wheels)   PIP_NO_INDEX=1, PIP_FIND_LINKS=wheels (pip's own config)
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import importlib.metadata as metadata
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

import batchfutures
from batchfutures import requirements


def make_wheel(folder: Path, name: str, version: str, files: Dict[str, str], *,
               requires: Iterable[str] = (), tag: str = "py3-none-any") -> Path:
    """A wheel of `files` (path in the wheel -> text), as `pip wheel` would leave it."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    contents = dict(files)
    contents[f"{info}/METADATA"] = "".join(
        [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"]
        + [f"Requires-Dist: {item}\n" for item in requires])
    pure = "true" if tag.endswith("-none-any") else "false"
    contents[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: {pure}\n"
                                 f"Tag: {tag}\n")
    records: List[str] = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        records.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    records.append(f"{info}/RECORD,,")
    contents[f"{info}/RECORD"] = "\n".join(records) + "\n"
    wheel = folder / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in contents.items():
            archive.writestr(path, text)
    return wheel


def tiny_wheels(folder: Path) -> None:
    """tinypkg 1.0 (``double(x)``, which needs tinydep>=0.1), tinydep 0.2, and nowheel 1.0 with
    a wheel for Windows only (nothing for Linux)."""
    make_wheel(folder, "tinypkg", "1.0", {"tinypkg/__init__.py": "from tinydep import BASE\n"
                                          "def double(x):\n    return BASE * x\n"},
               requires=["tinydep>=0.1"])
    make_wheel(folder, "tinydep", "0.2", {"tinydep/__init__.py": "BASE = 2\n"})
    make_wheel(folder, "nowheel", "1.0", {"nowheel/__init__.py": ""}, tag="cp311-cp311-win_amd64")


def offline_pip(monkeypatch, wheels: Path) -> None:
    """pip reads only `wheels` (its own configuration variables, as a user would set them)."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")


_installed: Dict[Tuple[Tuple[Tuple[str, str], ...], Tuple[str, ...]], Path] = {}  # see _pip_target


def _members(wheel: Path) -> str:
    """A wheel's files and their CRCs (its bytes hold write times, which differ per test)."""
    with zipfile.ZipFile(wheel) as archive:
        return repr(sorted((info.filename, info.CRC) for info in archive.infolist()))


def _pip_target(wheels: Path, specs: Tuple[str, ...]) -> Path:
    """A folder pip installed `specs` from `wheels` into, once per process for the same wheel
    files and specs (pip takes ~1 s of CPU a run; the fixtures ask for the same install often)."""
    key = (tuple(sorted((wheel.name, _members(wheel)) for wheel in wheels.glob("*.whl"))), specs)
    if key not in _installed:
        site = Path(tempfile.mkdtemp(prefix="envtools-site-"))
        atexit.register(shutil.rmtree, site, True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                        "--disable-pip-version-check", "--find-links", str(wheels), "--target",
                        str(site), *specs], check=True, capture_output=True)
        _installed[key] = site
    return _installed[key]


def install_here(monkeypatch, wheels: Path, site: Path, *specs: str) -> None:
    """Install `specs` from `wheels` into `site` and put it on this process's path, as a
    package the client has installed (importlib.metadata finds it there). `site` gets a copy
    of pip's --target folder for those wheels and specs (RECORD's paths are relative to it)."""
    shutil.copytree(_pip_target(wheels, specs), site, symlinks=True, dirs_exist_ok=True)
    monkeypatch.syspath_prepend(str(site))


def _worker_distributions() -> List[metadata.Distribution]:
    markers = requirements.target_markers(os.uname().machine, sys.version_info[:2])
    names = requirements.closure(["batchfutures"], requirements.installed_requires,
                                 requirements.installed_version, markers)
    found = []
    for name in names:
        if name != "batchfutures":
            found.append(metadata.distribution(name))
    return found


def bare_python(folder: Path) -> str:
    """A venv's interpreter that imports batchfutures and its dependencies, nothing else."""
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    links = folder / "worker-deps"
    links.mkdir()
    (links / "batchfutures").symlink_to(Path(batchfutures.__file__).parent)
    for dist in _worker_distributions():
        base = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in tops:
            source, target = base / top, links / top
            if source.exists() and not target.exists() and not top.endswith(".pth"):
                target.symlink_to(source)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "worker-deps.pth").write_text(f"{links}\n")
    return str(python)
