"""What this machine offers jobs: CPUs, memory and GPUs (the emulator's compute environment)."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Optional


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def memory_mib() -> Optional[int]:
    """The machine's memory (MemTotal), or None where /proc/meminfo cannot be read."""
    try:
        with open("/proc/meminfo", "rb") as handle:
            for line in handle:
                if line.startswith(b"MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def gpu_count() -> int:
    """NVIDIA GPUs of this machine: /proc/driver/nvidia/gpus, else `nvidia-smi -L`; 0 if none."""
    try:
        return len([n for n in os.listdir("/proc/driver/nvidia/gpus") if not n.startswith(".")])
    except OSError:
        pass
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return 0
    try:
        done = subprocess.run([tool, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return 0
    if done.returncode != 0:
        return 0
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))
