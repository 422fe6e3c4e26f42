"""The storage library the worker needs: s3fs new enough for exclusive (conditional) writes.

A result is written with ``If-None-Match: *`` (`Storage.put_bytes(exclusive=True)`), so that a
retried or duplicated attempt never replaces a result already read; s3fs sends it only from
2024.12.0 on (``pipe_file(mode="create")``). An older s3fs would fall back to a check-then-write,
which two attempts can race, so the worker refuses to run on one:

    from batchfutures.worker.storagelib import check_storage_library
    check_storage_library(job_url)     # EnvironmentMismatchError for s3:// with an old s3fs

The worker image pins the client's own versions (`batchfutures image`, templates/Dockerfile);
this is the guard for an image built otherwise.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import Optional, Tuple

from ..errors import EnvironmentMismatchError

__all__ = ["S3FS_MINIMUM", "check_storage_library", "parse_version", "s3fs_version"]

S3FS_MINIMUM: Tuple[int, int, int] = (2024, 12, 0)  # the first s3fs with pipe_file(mode="create")


def parse_version(text: str) -> Tuple[int, ...]:
    """The leading numbers of a version: "2024.12.0" -> (2024, 12, 0), "2025.3.0rc1" -> (2025, 3, 0)."""
    numbers = []
    for part in text.strip().split("."):
        match = re.match(r"\d+", part)
        if match is None:
            break
        numbers.append(int(match.group()))
        if match.end() != len(part):  # "0rc1", "0+local": nothing after counts
            break
    return tuple(numbers)


def s3fs_version() -> Optional[str]:
    """The installed s3fs's version, None when s3fs is not installed (read without importing it)."""
    try:
        return metadata.version("s3fs")
    except metadata.PackageNotFoundError:
        return None


def check_storage_library(job_url: str, version: Optional[str] = None) -> None:
    """Refuse an s3:// job when s3fs is missing or older than `S3FS_MINIMUM`.

    ``version``: the s3fs version to judge (default: the installed one). A job on another
    storage (file://, the local emulator's) needs no s3fs.
    """
    if not str(job_url).startswith("s3://"):
        return
    found = version if version is not None else s3fs_version()
    need = ".".join(map(str, S3FS_MINIMUM))
    if found is None:
        raise EnvironmentMismatchError(
            f"this worker has no s3fs, and its job is in S3 ({job_url}): install s3fs>={need}, "
            f"or rebuild the image with `batchfutures image`")
    if parse_version(found) < S3FS_MINIMUM:
        raise EnvironmentMismatchError(
            f"this worker has s3fs {found}; batchfutures writes results with a conditional PUT "
            f"(If-None-Match), which needs s3fs>={need}: rebuild the image with `batchfutures "
            f"image` (it pins the client's s3fs)")
