"""Faults on demand: answer a fraction of API calls with an error, so retry paths run for real."""

from __future__ import annotations

import random
import threading
from typing import Iterable, Optional, Set

from .model import client_error


class FaultInjector:
    """Decides, call by call, whether to fail it; off (rate 0) until `configure` says otherwise."""

    def __init__(self) -> None:
        self.rate = 0.0
        self.code = "TooManyRequestsException"
        self.operations: Optional[Set[str]] = None
        self.injected = 0  # how many calls were failed so far (tests read it)
        self._random = random.Random()
        self._lock = threading.Lock()

    def configure(self, rate: float, *, code: str = "TooManyRequestsException",
                  operations: Optional[Iterable[str]] = None, seed: Optional[int] = None) -> None:
        if not 0 <= rate <= 1:
            raise ValueError(f"fault rate {rate!r} must be between 0 and 1")
        with self._lock:
            self.rate, self.code = float(rate), code
            self.operations = set(operations) if operations is not None else None
            if seed is not None:
                self._random.seed(seed)

    def maybe_raise(self, operation: str) -> None:
        """Raise the configured ClientError for this call of `operation`, or return."""
        with self._lock:
            if not self.rate or (self.operations is not None and operation not in self.operations):
                return
            if self._random.random() >= self.rate:
                return
            self.injected += 1
            code = self.code
        # Throttling is HTTP 429 whatever its code; the service's own error codes keep theirs.
        status = {"ServerException": 500, "ClientException": 400}.get(code, 429)
        raise client_error(f"Rate exceeded (fault injected into {operation})", code, status, operation)
