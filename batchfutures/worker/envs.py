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
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import site
import sys
import tempfile
import uuid
from typing import TYPE_CHECKING, Mapping, Optional

from .. import envarchive
from ..errors import IntegrityError
from ..workdir import secure_folder

if TYPE_CHECKING:  # pragma: no cover
    from ..storage import Storage

logger = logging.getLogger("batchfutures")

CACHE_VARIABLE = "BATCHFUTURES_ENVIRONMENT_CACHE"


def cache_root(environ: Mapping[str, str]) -> str:
    given = environ.get(CACHE_VARIABLE)
    if given:
        return given
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"batchfutures-envs-{uid}")


def activate(storage: "Storage", environ: Mapping[str, str]) -> Optional[str]:
    """Make the job's environment importable (first on sys.path); its folder, None without one.

    IntegrityError: the archive is missing, unsigned, altered or refused (nothing of it is
    used); ConfigurationError: the cache folder is not this user's alone."""
    url = environ.get(envarchive.POINTER_VARIABLE)
    if not url:
        return None
    digest = envarchive.digest_of(url)
    if digest is None or not url.startswith(storage.url(envarchive.FOLDER) + "/"):
        raise IntegrityError(f"{envarchive.POINTER_VARIABLE}={url!r} is not an environment "
                             f"archive of this job's storage")
    root = str(secure_folder(cache_root(environ), "environment cache folder"))
    folder = os.path.join(root, digest)
    if not os.path.isdir(folder) or os.path.islink(folder):
        _unpack(storage, url, root, folder)
    else:
        logger.info("environment %s: reusing %s", digest[:12], folder)
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
        except envarchive.ArchiveRefused as error:
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

