"""Processes from /proc: a session's members, a process tree, resident and proportional memory.

An attempt runs in its own session (its leader's pid is the session id and the process group),
so "the container's processes" are the live processes of that session.
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, List

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def session_members(sessions: Iterable[int]) -> Dict[int, List[int]]:
    """The live pids of each session (or process group) id in `sessions`."""
    members: Dict[int, List[int]] = {sid: [] for sid in sessions}
    if not members:
        return members
    try:
        names = os.listdir("/proc")
    except OSError:
        return members
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) < 4 or fields[0] == b"Z":
            continue
        group, session = int(fields[2]), int(fields[3])
        key = session if session in members else group if group in members else None
        if key is not None:
            members[key].append(int(name))
    return members


def process_tree(root: int) -> List[int]:
    """The live pid `root` and its descendants (children of every thread), or [] when gone."""
    pids: List[int] = []
    queue = [root]
    while queue:
        pid = queue.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        pids.append(pid)
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                    queue.extend(int(child) for child in handle.read().split())
            except (OSError, ValueError):
                continue
    return pids


HAS_CHILDREN_LISTS = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def resident_bytes(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as handle:
                total += int(handle.read().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


def proportional_bytes(pids: Iterable[int]) -> int:
    """Anonymous and shared memory, shared pages divided among their users."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
                text = handle.read()
        except OSError:
            continue
        values: Dict[bytes, int] = {}
        for line in text.splitlines():
            key, _, rest = line.partition(b":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key] = int(parts[0]) * 1024
        if b"Pss_Anon" in values:
            total += values[b"Pss_Anon"] + values.get(b"Pss_Shmem", 0)
        else:
            total += values.get(b"Pss", 0)
    return total
