"""The job's environment (`requirements=`), made ready before any payload is unpickled.

    BATCHFUTURES_ENVIRONMENT = R/envs/<sha256>.zip   (absent: the image as it is)
      -> <cache>/<sha256> there (an earlier job on this host unpacked it)?  use it
      -> else read the archive through Storage's sealed read (its size and seal checked while it
         streams in: IntegrityError before a byte is unpacked), unpack it into a fresh folder
         beside it (envarchive.unpack: every member checked first) and rename that folder to
         <cache>/<sha256> (two jobs at once: the first rename wins, the other's is removed)
      -> put <cache>/<sha256> first on sys.path

<cache> is BATCHFUTURES_ENVIRONMENT_CACHE when set (a host volume: the next job on the host
reuses what this one unpacked), else <tmp>/batchfutures-envs-<uid>: this user's alone, made 0700
or refused (workdir.secure_folder), as a folder anyone could write into could plant code.
A folder found under <cache> was checked when it was unpacked, and is trusted by its name after:
so it is used only when it is a real folder of this user's that group and others cannot write
(`cached_folder_problem`); else, and when the host cache itself is not this user's alone, the
archive is unpacked again in the private temp folder.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import site
import stat
import sys
import tempfile
import uuid
import zipfile
from typing import TYPE_CHECKING, Mapping, Optional

from .. import envarchive
from ..errors import ConfigurationError, IntegrityError
from ..workdir import secure_folder

if TYPE_CHECKING:  # pragma: no cover
    from ..storage import Storage

logger = logging.getLogger("batchfutures")

CACHE_VARIABLE = envarchive.CACHE_VARIABLE


def private_root() -> str:
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"batchfutures-envs-{uid}")


def cache_root(environ: Mapping[str, str]) -> str:
    return environ.get(CACHE_VARIABLE) or private_root()


def cached_folder_problem(mode: int, uid: int, my_uid: int) -> Optional[str]:
    """Why a folder found in the cache (lstat's mode and owner) must not be trusted, or None:
    anything but a real folder (a link could point anywhere), another user's, or one that
    group or others could have written into (a planted module would run as this job)."""
    if stat.S_ISLNK(mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(mode):
        return "it is not a folder"
    if uid != my_uid:
        return f"it is owned by uid {uid}, not this job's {my_uid}"
    if mode & 0o022:
        return f"it is writable by group or others (mode {stat.S_IMODE(mode):o})"
    return None


def activate(storage: "Storage", environ: Mapping[str, str],
             pointer: Optional[str] = None) -> Optional[str]:
    """Make the job's environment importable (first on sys.path); its folder, None without one.
    `pointer`: the archive's URL (a warm pool's config), else the job's variable.

    IntegrityError: the archive is missing, unsigned, altered or refused (nothing of it is
    used); ConfigurationError: the private temp folder is not this user's alone."""
    url = pointer or environ.get(envarchive.POINTER_VARIABLE)
    if not url:
        return None
    digest = envarchive.digest_of(url)
    if digest is None or not url.startswith(storage.url(envarchive.FOLDER) + "/"):
        raise IntegrityError(f"{envarchive.POINTER_VARIABLE}={url!r} is not an environment "
                             f"archive of this job's storage")
    roots = list(dict.fromkeys([cache_root(environ), private_root()]))
    for position, given in enumerate(roots):
        last = position == len(roots) - 1
        try:
            root = str(secure_folder(given, "environment cache folder"))
        except (ConfigurationError, OSError) as error:  # not this user's alone, or not makeable
            if last:
                raise
            logger.warning("environment %s: not using the host cache (%s); unpacking it in a "
                           "private temp folder", digest[:12], error)
            continue
        folder = os.path.join(root, digest)
        try:
            info = os.lstat(folder)
        except FileNotFoundError:
            _unpack(storage, url, root, folder)
            break
        problem = cached_folder_problem(info.st_mode, info.st_uid, os.geteuid())
        if problem is None:
            logger.info("environment %s: reusing %s", digest[:12], folder)
            break
        if last:
            raise ConfigurationError(f"refusing the cached environment {folder}: {problem}; "
                                     f"remove it (and check nothing was planted in it)")
        logger.warning("environment %s: not trusting the cached %s (%s); unpacking it in a "
                       "private temp folder", digest[:12], folder, problem)
    if folder not in sys.path:
        first_on_path(folder)
    return folder


def first_on_path(folder: str) -> None:
    """`folder` first on sys.path, with what its .pth files add (as site-packages would have)."""
    before = list(sys.path)
    site.addsitedir(folder)  # appends the folder and its .pth entries
    added = [entry for entry in sys.path if entry not in before]
    sys.path[:] = added + before
    importlib.invalidate_caches()


def _unpack(storage: "Storage", url: str, root: str, folder: str) -> None:
    data = storage.read_sealed(url, envarchive.SEAL_KIND)  # seal checked before any byte is used
    if data is None:
        raise IntegrityError(f"the environment archive {storage.name_of(url)} is missing")
    fresh = os.path.join(root, f".unpacking-{uuid.uuid4().hex}")
    os.mkdir(fresh, 0o700)
    archive = fresh + ".zip"  # on disk, so the payload's one copy in memory is freed first
    try:
        with open(os.open(archive, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(data)
        del data
        try:
            names = envarchive.unpack(archive, fresh)
        except (envarchive.ArchiveRefused, zipfile.BadZipFile, OSError) as error:
            # signed yet unusable (sizes that lie, a member twice): refused, its half removed below
            raise IntegrityError(f"refusing the environment archive {storage.name_of(url)}: "
                                 f"{error}") from None
        try:
            os.rename(fresh, folder)
        except OSError:  # another job on this host unpacked it first: theirs is the same
            if not os.path.isdir(folder):
                raise
            return
        logger.info("environment %s: unpacked %d files", os.path.basename(folder), len(names))
    finally:
        if os.path.lexists(archive):
            os.remove(archive)
        if os.path.isdir(fresh):
            shutil.rmtree(fresh, ignore_errors=True)

