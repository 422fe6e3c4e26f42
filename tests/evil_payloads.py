"""A pickle that leaves a mark when it is loaded: the probe of every "nothing was unpickled" test.

    from evil_payloads import evil_pickle
    data = evil_pickle(tmp_path / "loaded")   # a live payload; the marker appears if anyone loads it
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any


class Evil:
    """Pickles to ``open(marker, "w")``: loading it anywhere creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> Any:
        return (open, (self.marker, "w"))


def evil_pickle(marker: Path) -> bytes:
    data = pickle.dumps(Evil(marker))
    pickle.loads(data).close()  # the payload is live: loading it does create the marker...
    assert marker.exists()
    marker.unlink()  # ...so a marker seen later means someone loaded it
    return data
