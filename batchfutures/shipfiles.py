"""``BatchExecutor(..., files=[paths])``: small local files and folders shipped with the run, into
each call's working directory, so a relative path the script opens resolves as on the client.

    client, when the executor is made           worker, before the initializer
    collect(paths, cwd)  which files, by the     calls.unpack_files: the archive (its seal checked
      name relative to the working directory     with the other payloads, calls.Prefetched) into
    pack(entries)  one tar archive (bounded:     the working directory: regular files and folders
      MAX_BYTES, MAX_FILES)                      only (tarfile's "data" filter), never over a
    Submitter: put once per run, sealed, as      file that is there already (a local attempt that
      the initargs are (Storage.put_function);   runs in the client's own folder keeps the client's)
      the header's "files" names it              a file there already that differs (an image's
                                                 stale copy) is replaced, with a warning

A path is taken as the script would open it: relative to the working directory (or absolute,
inside it); one outside the working directory is refused (the call could not open it by the
same name). Read when the executor is made: later edits are not shipped. A link (DVC and
git-annex data folders are links) ships its content, as a regular file under the link's name;
a link to a folder is followed, one back to a folder it is in refused.

``missing_file_note``: a call's FileNotFoundError for a file that exists here says to use files=.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .errors import ConfigurationError

__all__ = ["MAX_BYTES", "MAX_FILES", "CLIENT_FOLDER_HEADER", "collect", "pack", "cache_part",
           "missing_file_note"]

MAX_BYTES = 64 * 1024 * 1024  # the files' sizes summed: beyond, an image or S3 is the way
MAX_FILES = 10_000
# the archive's global header naming the client's folder: the emulator may run a call there
CLIENT_FOLDER_HEADER = "BATCHFUTURES.client_folder"

Entry = Tuple[str, str]  # (name in the call's working directory, path here)


def _inside(path: str, cwd: str) -> Optional[str]:
    """``path``'s name relative to ``cwd``, or None when it is not inside it."""
    absolute = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
    relative = os.path.relpath(absolute, cwd)
    if relative == os.curdir or relative.startswith(os.pardir + os.sep) or relative == os.pardir:
        return None
    return relative


def _walk(top: str, given: str) -> List[str]:
    """Every file under the folder ``top``, by the names under it; links to folders followed
    (DVC, git-annex data folders), a link back to a folder it is in refused."""
    walked = []
    # each folder to walk: the real folders it is in, itself last
    chains: Dict[str, Tuple[str, ...]] = {top: (os.path.realpath(top),)}
    for folder, folders, files in os.walk(top, followlinks=True):
        folders.sort()
        chain = chains.pop(folder)
        for sub in folders:
            real = os.path.realpath(os.path.join(folder, sub))
            if real in chain:
                raise ConfigurationError(
                    f"files=: {given!r} holds a link back to a folder it is in "
                    f"({os.path.join(folder, sub)!r}); remove the loop or name its files")
            chains[os.path.join(folder, sub)] = chain + (real,)
        walked += [os.path.join(folder, f) for f in sorted(files)]
    return walked


def collect(paths: Iterable[Any], cwd: str) -> List[Entry]:
    """The files ``paths`` name (folders: every regular file under them), sorted by name;
    ConfigurationError for a path outside ``cwd``, missing, or too much in all."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise ConfigurationError("files= takes a list of paths, not one path: files=[...]")
    found = {}
    total = 0
    for given in paths:
        path = os.fsdecode(os.fspath(given))
        name = _inside(path, cwd)
        if name is None:
            raise ConfigurationError(
                f"files=: {path!r} is not inside the working directory {cwd}; a call opens "
                f"files by the same relative name there, so only paths under it can be shipped")
        local = os.path.join(cwd, name)
        if os.path.isdir(local):
            walked = _walk(local, path)
        elif os.path.isfile(local):
            walked = [local]
        elif os.path.islink(local):
            raise ConfigurationError(f"files=: {path!r} is a link to nothing (in {cwd}); "
                                     f"fetch its data first (dvc pull, git annex get)")
        else:
            raise ConfigurationError(f"files=: {path!r} does not exist (in {cwd})")
        for file_path in walked:
            try:
                info = os.stat(file_path)  # a link's target: its content is what is shipped
            except FileNotFoundError:
                raise ConfigurationError(
                    f"files=: {os.path.relpath(file_path, cwd)!r} is a link to nothing (in "
                    f"{cwd}); fetch its data first (dvc pull, git annex get)") from None
            if not stat.S_ISREG(info.st_mode):
                continue  # sockets, devices, FIFOs: nothing to ship
            relative = os.path.relpath(file_path, cwd)
            if relative not in found:
                total += info.st_size
                found[relative] = file_path
    if len(found) > MAX_FILES:
        raise ConfigurationError(f"files=: {len(found)} files; at most {MAX_FILES} are shipped "
                                 f"(an archive of them, or the image, is the way for more)")
    if total > MAX_BYTES:
        raise ConfigurationError(
            f"files=: {total / 2**20:.1f} MiB in all; at most {MAX_BYTES // 2**20} MiB are shipped "
            f"with a run (put larger data in S3 and read it in the call, or in the image)")
    return sorted(found.items())


def pack(entries: Iterable[Entry], folder: Optional[str] = None) -> bytes:
    """One uncompressed tar of the entries: regular files, owner root, mode kept (rwx bits).
    ``folder`` (default: this working directory, the one collect named them in) is recorded
    (CLIENT_FOLDER_HEADER): a worker running in it never writes over the client's own files."""
    buffer = io.BytesIO()
    total = 0
    client_folder = {CLIENT_FOLDER_HEADER: os.path.realpath(folder or os.getcwd())}
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT,
                      pax_headers=client_folder) as archive:
        for name, local in entries:
            with open(local, "rb") as handle:
                # from the open file (fstat): a link's content as a regular file, never the
                # link itself (the worker writes no links: the file would not arrive)
                info = archive.gettarinfo(arcname=name.replace(os.sep, "/"), fileobj=handle)
                if not info.isreg():
                    continue  # opened something else than a file since collect: nothing to ship
                total += info.size
                if total > MAX_BYTES:  # grown since collect counted it
                    raise ConfigurationError(
                        f"files=: more than {MAX_BYTES // 2**20} MiB in all; put larger data "
                        f"in S3 and read it in the call, or in the image")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode &= 0o755
                archive.addfile(info, handle)
    return buffer.getvalue()


def cache_part(initargs: Optional[bytes], files: Optional[bytes]) -> Optional[bytes]:
    """What cache=True digests as the initargs: with files=, their archive's hash too, so a call
    whose data files changed is not served an earlier result (cache.environment_digest)."""
    if files is None:
        return initargs
    return (initargs or b"") + b"\0files=" + hashlib.sha256(files).hexdigest().encode()


def missing_file_note(error: BaseException, cwd: str,
                      exists: Callable[[str], bool] = os.path.exists) -> Optional[str]:
    """For a call's FileNotFoundError naming a file that exists here: what to do (pure)."""
    if not isinstance(error, FileNotFoundError):
        return None
    filename = error.filename
    if not isinstance(filename, str) or not filename:
        return None
    if os.path.isabs(filename):
        if not exists(filename):
            return None
        name = _inside(filename, cwd)
        if name is None:
            return (f"batchfutures: {filename!r} exists on this machine, not in the call's "
                    f"container; open it by a path relative to the working directory and ship it "
                    f"with BatchExecutor(..., files=[...]), or put it in S3")
        return (f"batchfutures: {filename!r} exists on this machine, not in the call's container; "
                f"open it as {name!r} and ship it with BatchExecutor(..., files=[{name!r}])")
    if not exists(os.path.join(cwd, filename)):
        return None
    return (f"batchfutures: {filename!r} exists here (in {cwd}), not in the call's working "
            f"directory; ship it with BatchExecutor(..., files=[{filename!r}])")
