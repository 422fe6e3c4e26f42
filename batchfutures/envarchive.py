"""An environment archive (`requirements=`): its name, its seal, its pointer, and safe unpacking.

    R/envs/<sha256>.zip    one zip of a pip `--target` folder, sealed as kind "environment"
                           like every stored object; <sha256> covers the pinned set, the
                           platform and the Python (envbuild.environment_digest)

The client builds and stores it (envbuild.py); the job carries only its URL, in the variable
POINTER_VARIABLE; the worker (worker/envs.py) reads it through Storage's sealed read (the seal
checked before a byte is unpacked) and unpacks it here. An archive is refused whole, before
anything is written, when a member is not a plain file or folder (a link, a device), has an
absolute name, a drive, a backslash or a `..` part, when there are more than MAX_MEMBERS
members, or when the sizes it declares add up to more than MAX_UNPACKED bytes (zipfile never
inflates a member past its declared size, and the writes are counted again).

Shared by the client and the worker (the worker may import this module, not envbuild.py).
"""

from __future__ import annotations

import io
import os
import re
import stat
import zipfile
from typing import Iterable, List, Optional, Tuple, Union

POINTER_VARIABLE = "BATCHFUTURES_ENVIRONMENT"  # the job's pointer: the archive's URL
CACHE_VARIABLE = "BATCHFUTURES_ENVIRONMENT_CACHE"  # where the worker unpacks (worker/envs.py)
# The stack's EC2 hosts keep unpacked environments here for the next job on the host: the
# template's launch template makes it (0700, the jobs' uid 1000), its EC2 definitions mount it
HOST_CACHE = "/var/cache/batchfutures/envs"
HOST_CACHE_VOLUME = "batchfutures-envs"
SEAL_KIND = "environment"
FOLDER = "envs"
MAX_MEMBERS = 200_000
MAX_UNPACKED = 8 * 1024 ** 3  # 8 GiB: the archive itself is at most storage.MAX_OBJECT_SIZE
_NAME = re.compile(r"^([0-9a-f]{64})\.zip$")
_CHUNK = 1024 * 1024


def with_host_cache(container: dict) -> None:
    """An EC2 container's properties (RegisterJobDefinition's) given the host's environment
    cache, as the stack's EC2 definitions have it: the host volume, its mount point and
    CACHE_VARIABLE, each added only where the container has none of its name (a copy of the
    stack's definition has them already)."""
    volumes = container.setdefault("volumes", [])
    if not any(volume.get("name") == HOST_CACHE_VOLUME for volume in volumes):
        volumes.append({"name": HOST_CACHE_VOLUME, "host": {"sourcePath": HOST_CACHE}})
    points = container.setdefault("mountPoints", [])
    if not any(point.get("sourceVolume") == HOST_CACHE_VOLUME for point in points):
        points.append({"sourceVolume": HOST_CACHE_VOLUME, "containerPath": HOST_CACHE,
                       "readOnly": False})
    variables = container.setdefault("environment", [])
    if not any(pair.get("name") == CACHE_VARIABLE for pair in variables):
        variables.append({"name": CACHE_VARIABLE, "value": HOST_CACHE})


class ArchiveRefused(ValueError):
    """An environment archive that is not unpacked (a member's problem, or its size)."""


def archive_name(digest: str) -> str:
    return f"{digest}.zip"


def digest_of(url: str) -> Optional[str]:
    """The digest an archive's URL names (None: not an archive's name)."""
    match = _NAME.fullmatch(url.rpartition("/")[2])
    return match.group(1) if match else None


def member_kind(info: zipfile.ZipInfo) -> str:
    """"file", "folder", "link" or "other", from the member's Unix mode (none: by its name)."""
    mode = info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    if kind == 0:
        return "folder" if info.filename.endswith("/") else "file"
    if stat.S_ISREG(kind):
        return "file"
    if stat.S_ISDIR(kind):
        return "folder"
    return "link" if stat.S_ISLNK(kind) else "other"


def member_problem(name: str, kind: str) -> Optional[str]:
    """Why a member may not be unpacked (None: it may)."""
    if kind not in ("file", "folder"):
        return f"{name!r} is a {kind}, not a file or folder"
    if not name or "\0" in name or "\\" in name:
        return f"{name!r} is not a plain relative name"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return f"{name!r} is an absolute name"
    parts = name.rstrip("/").split("/")
    if any(part in ("..", "") for part in parts):
        return f"{name!r} leaves the folder or has an empty part"
    return None


def check_members(members: Iterable[Tuple[str, str, int]], *, max_members: int = MAX_MEMBERS,
                  max_total: int = MAX_UNPACKED) -> None:
    """ArchiveRefused unless every (name, kind, size) may be unpacked and the whole fits."""
    count = total = 0
    for name, kind, size in members:
        problem = member_problem(name, kind)
        if problem is not None:
            raise ArchiveRefused(problem)
        count += 1
        total += max(0, size)
        if count > max_members:
            raise ArchiveRefused(f"more than {max_members} members")
        if total > max_total:
            raise ArchiveRefused(f"more than {max_total} bytes unpacked")


def pack(folder: Union[str, os.PathLike]) -> bytes:
    """A folder's files as one zip (folders implied by their files; links are not followed)."""
    root = os.fspath(folder)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=3) as archive:
        for base, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(base, name)
                if not os.path.isfile(path) or os.path.islink(path):
                    continue
                archive.write(path, os.path.relpath(path, root).replace(os.sep, "/"))
    return out.getvalue()


def unpack(source: Union[bytes, str, os.PathLike], folder: Union[str, os.PathLike], *,
           max_members: int = MAX_MEMBERS, max_total: int = MAX_UNPACKED) -> List[str]:
    """Unpack an archive (its bytes, or its file's path) into the existing, empty `folder`,
    every member checked first (ArchiveRefused: nothing is written); the names written."""
    root = os.fspath(folder)
    try:
        archive = zipfile.ZipFile(io.BytesIO(source) if isinstance(source, bytes)
                                  else os.fspath(source))
    except zipfile.BadZipFile as error:
        raise ArchiveRefused(f"not a zip archive ({error})") from None
    with archive:
        infos = archive.infolist()
        check_members(((i.filename, member_kind(i), i.file_size) for i in infos),
                      max_members=max_members, max_total=max_total)
        written: List[str] = []
        total = 0
        for info in infos:
            target = os.path.join(root, *info.filename.rstrip("/").split("/"))
            if member_kind(info) == "folder":
                os.makedirs(target, mode=0o700, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            executable = (info.external_attr >> 16) & 0o100
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                         0o700 if executable else 0o600)
            with os.fdopen(fd, "wb") as out, archive.open(info) as member:
                while chunk := member.read(_CHUNK):
                    total += len(chunk)
                    if total > max_total:  # never past the declared sizes; counted anyway
                        raise ArchiveRefused(f"more than {max_total} bytes unpacked")
                    out.write(chunk)
            written.append(info.filename)
        return written
