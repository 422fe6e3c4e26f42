"""Where the embedded default keeps its emulator, payloads and key, and the rules that keep it the
user's alone (CONTRACT 9): one definition, imported by environments.py, storage.py, cleanup.py,
the emulator's records, and the worker's side of signing.py (so it pulls in nothing heavy).

    rule                                              helper
    ------------------------------------------------  -----------------------------------------
    folders made 0700 whatever the umask; an existing  secure_folder(path, label) (checks, or
      one must be a real folder (not a symlink), owned   makes): THE check, for every root
      by this user, not writable by group or others      (workdir, storage, emulator, --create);
                                                         make_private_dirs(path, root=) for the
                                                         folders under a checked one (no link
                                                         followed below the root)
    the emulator's folder, its logs and scratch         secure_emulator_folder(path)
    the start-up sweep removes only what it made:      owned_folder(path)
      a real folder (not a link), owned by this user
    job attempts start with umask 077                  ATTEMPT_UMASK (the launchers)
    files made 0600, opened without following a        open_private(path, flags)
      symlink (O_NOFOLLOW)
    a file (the key) owned by this user, 0600          check_private_file(descriptor, path, label)
    a path built from a record, a job id or a stream   inside(base, path)
      name stays under its folder
    cleanup removes only names of the run-id shape     is_run_id(name)
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Optional, Union

from .errors import ConfigurationError

__all__ = ["default_workdir", "secure_folder", "secure_emulator_folder", "make_private_dirs",
           "owned_folder", "open_private", "check_private_file", "inside", "is_run_id", "RUN_ID",
           "FOLDER_MODE", "FILE_MODE", "ATTEMPT_UMASK"]

FOLDER_MODE = 0o700
FILE_MODE = 0o600
ATTEMPT_UMASK = 0o077  # what a job's attempt writes is its user's alone
# session.py: time.strftime("%Y%m%dT%H%M%S") + "-" + uuid4().hex[:10]
RUN_ID = re.compile(r"^\d{8}T\d{6}-[0-9a-f]{10}$")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
PathLike = Union[str, "os.PathLike[str]"]


def default_workdir() -> Path:
    """A per-user cache folder: $BATCHFUTURES_WORKDIR, else $XDG_CACHE_HOME/batchfutures."""
    explicit = os.environ.get("BATCHFUTURES_WORKDIR")
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "batchfutures"


def _refuse(label: str, path: PathLike, problem: str, fix: str) -> ConfigurationError:
    return ConfigurationError(
        f"refusing the batchfutures {label} {os.fspath(path)}: {problem}, so another user could "
        f"read or replace the payloads, results and key it holds. Fix: {fix}")


def _check_owner_and_mode(info: os.stat_result, path: PathLike, label: str, *, folder: bool) -> None:
    euid = os.geteuid()
    if info.st_uid != euid:
        raise _refuse(label, path, f"it is owned by uid {info.st_uid}, not by you (uid {euid})",
                      "use a workdir of your own (LocalEnvironment(workdir=...) or "
                      f"BATCHFUTURES_WORKDIR), or, if it is yours, `chown -R {euid} "
                      f"{os.fspath(path)}`")
    if info.st_mode & 0o022:
        want = "700" if folder else "600"
        raise _refuse(label, path, f"it is writable by group or others (mode "
                                   f"{stat.S_IMODE(info.st_mode):o})",
                      f"`chmod {want} {os.fspath(path)}` (and check nothing was planted in it)")


def secure_folder(path: PathLike, label: str = "folder", *, create: bool = True) -> Path:
    """``path`` as a private folder: made 0700 (whatever the umask) when missing, else checked.

    An existing folder must not be a symbolic link, must be owned by this user and not writable by
    group or others (ConfigurationError naming it and the fix); one readable by others (made by an
    older version under umask 022) is narrowed to 0700.
    """
    folder = Path(path)
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        if not create:
            return folder
        make_private_dirs(folder)
        info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode):
        raise _refuse(label, folder, "it is a symbolic link (to "
                                     f"{os.readlink(folder)!r}), which batchfutures never follows",
                      f"remove the link (`rm {folder}`) and give the real folder instead")
    if not stat.S_ISDIR(info.st_mode):
        raise _refuse(label, folder, "it is not a folder", f"remove or rename {folder}")
    _check_owner_and_mode(info, folder, label, folder=True)
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(folder, FOLDER_MODE, follow_symlinks=False)
    return folder


def make_private_dirs(path: PathLike, root: Optional[PathLike] = None) -> None:
    """``os.makedirs`` where every folder it makes is 0700 (set explicitly, not from the umask).

    With ``root`` (a folder secure_folder checked), ``path`` must lie under it and every part
    between them that exists must be a real folder of this user: a symlink planted below the
    root is refused (ConfigurationError), never followed."""
    folder = os.fspath(path)
    if root is not None:
        _check_below(os.fspath(root), folder)
    missing = []
    while folder and not os.path.lexists(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    for made in reversed(missing):
        try:
            os.mkdir(made, FOLDER_MODE)
        except FileExistsError:
            continue  # another thread or process made it
        os.chmod(made, FOLDER_MODE, follow_symlinks=False)


def _check_below(root: str, path: str) -> None:
    """Each existing part of ``path`` below ``root``: lstat'ed, a real folder owned by us."""
    base, target = os.path.abspath(root), os.path.abspath(path)
    if os.path.commonpath([base, target]) != base:
        raise ConfigurationError(f"{target} is not under the batchfutures folder {base}")
    current = base
    for part in os.path.relpath(target, base).split(os.sep):
        if part in ("", "."):
            continue
        current = os.path.join(current, part)
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise _refuse("folder", current, "it is a symbolic link or not a folder, which "
                                             "batchfutures never follows", f"remove {current}")
        if info.st_uid != os.geteuid():
            raise _refuse("folder", current, f"it is owned by uid {info.st_uid}, not by you",
                          f"remove {current}")


def secure_emulator_folder(path: PathLike) -> Path:
    """The emulator's folder (``BatchEmulator(F)``, ``--folder F``, the workdir's ``emulator``)
    and the folders it writes below it, ``logs`` and ``scratch``, through secure_folder:
    refused when another user's, open to writing or a symlink, else made or narrowed to 0700.
    Returns the folder's absolute, resolved path (its own links were refused first)."""
    folder = secure_folder(Path(path).expanduser().absolute(), "emulator folder")
    for name in ("logs", "scratch"):
        secure_folder(folder / name, f"emulator {name} folder")
    return folder.resolve()


def owned_folder(path: PathLike) -> bool:
    """Whether ``path`` is a real folder (lstat: not a symlink) owned by this user: what the
    start-up sweep may remove as its own leftovers."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()


def open_private(path: PathLike, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open`` without following a symlink at ``path``; a file it creates is exactly 0600."""
    descriptor = os.open(path, flags | _NOFOLLOW | _CLOEXEC, mode)
    if flags & os.O_CREAT:
        try:
            os.fchmod(descriptor, mode)
        except BaseException:
            os.close(descriptor)
            raise
    return descriptor


def check_private_file(descriptor: int, path: PathLike, label: str) -> None:
    """ConfigurationError unless the open file is owned by this user and private to them."""
    info = os.fstat(descriptor)
    _check_owner_and_mode(info, path, label, folder=False)
    if info.st_mode & 0o077:
        raise ConfigurationError(
            f"the {label} {os.fspath(path)} is readable or writable by other users "
            f"(mode {stat.S_IMODE(info.st_mode):o}); `chmod 600` it")


def inside(base: PathLike, path: PathLike) -> bool:
    """Whether ``path`` stays under the folder ``base``, both as written (no ``..`` escapes) and
    once symlinks are resolved. ``base`` is taken where it is (its parent resolved, itself
    not): when ``base`` is a symlink, nothing is inside it."""
    root, target = os.path.abspath(base), os.path.abspath(path)
    if os.path.commonpath([root, target]) != root or target == root:
        return False
    real_root = os.path.join(os.path.realpath(os.path.dirname(root)), os.path.basename(root))
    real_target = os.path.realpath(path)
    return os.path.commonpath([real_root, real_target]) == real_root and real_target != real_root


def is_run_id(name: str) -> bool:
    """Whether ``name`` has the shape of a run id (``%Y%m%dT%H%M%S-<10 hex>``)."""
    return bool(RUN_ID.fullmatch(name))
