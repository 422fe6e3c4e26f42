"""Fixtures of the emulator's tests: real emulators on tmp_path folders, real job processes."""

from __future__ import annotations

import os
from typing import Any, List, Optional

import pytest
from emulator_harness import Harness

from batchfutures.emulator import BatchEmulator


@pytest.fixture
def make_emulator(tmp_path):
    """Start emulators on a tmp_path folder (the same one unless told); all closed at the end."""
    started: List[BatchEmulator] = []

    def make(folder: Optional[os.PathLike] = None, **kwargs: Any) -> Harness:
        kwargs.setdefault("max_vcpus", 2)
        emulator = BatchEmulator(folder or tmp_path / "emulator", **kwargs)
        started.append(emulator)
        return Harness(emulator)

    yield make
    for emulator in reversed(started):
        emulator.close()


@pytest.fixture
def emu(make_emulator) -> Harness:
    return make_emulator()
