"""Another local user, for the tests of issue 29: uid/gid 65534 (nobody). The suite runs as root,
so a test can start a command as that user, or chown a folder to it; `shared_folder()` is a
folder like /tmp (mode 1777) that user can reach, as pytest's tmp_path (inside a 0700 folder of
root's) is not."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

OTHER_UID = 65534


def as_other_user(script: str) -> subprocess.CompletedProcess:
    """``sh -c script`` run as uid/gid 65534, without root's groups."""
    def drop() -> None:
        os.setgroups([])
        os.setgid(OTHER_UID)
        os.setuid(OTHER_UID)
    return subprocess.run(["/bin/sh", "-c", script], preexec_fn=drop, capture_output=True,
                          text=True, timeout=30)


@contextlib.contextmanager
def shared_folder() -> Iterator[Path]:
    base = tempfile.mkdtemp(prefix="bf-issue29-", dir="/tmp")
    os.chmod(base, 0o1777)
    yield Path(base)
    shutil.rmtree(base, ignore_errors=True)
