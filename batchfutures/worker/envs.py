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
        sys.path.insert(0, folder)
        importlib.invalidate_caches()
    return folder


def _unpack(storage: "Storage", url: str, root: str, folder: str) -> None:
    data = storage.read_sealed(url, envarchive.SEAL_KIND)  # seal checked before any byte is used
    if data is None:
        raise IntegrityError(f"the environment archive {storage.name_of(url)} is missing")
    fresh = os.path.join(root, f".unpacking-{uuid.uuid4().hex}")
    os.mkdir(fresh, 0o700)
    try:
        try:
            names = envarchive.unpack(data, fresh)
        except envarchive.ArchiveRefused as error:
            raise IntegrityError(f"refusing the environment archive {storage.name_of(url)}: "
                                 f"{error}") from None
        del data
        try:
            os.rename(fresh, folder)
        except OSError:  # another job on this host unpacked it first: theirs is the same
            if not os.path.isdir(folder):
                raise
            return
        logger.info("environment %s: unpacked %d files", os.path.basename(folder), len(names))
    finally:
        if os.path.isdir(fresh):
            shutil.rmtree(fresh, ignore_errors=True)

