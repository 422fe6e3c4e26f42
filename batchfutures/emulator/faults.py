"""Faults on demand: answer a fraction of calls as throttled, so retry paths run for real."""

from __future__ import annotations

import random
import threading
from typing import Optional, Set

from botocore.exceptions import ClientError


class FaultInjector:
    def __init__(self) -> None:
        self.rate = 0.0
        self.code = "TooManyRequestsException"
        self.operations: Optional[Set[str]] = None
        self.injected = 0
        self._random = random.Random()
        self._lock = threading.Lock()

    def configure(self, rate: float, *, code: str = "TooManyRequestsException",
                  operations: Optional[Set[str]] = None, seed: Optional[int] = None) -> None:
        if not 0 <= rate <= 1:
            raise ValueError("rate must be between 0 and 1")
        with self._lock:
            self.rate, self.code = float(rate), code
            self.operations = set(operations) if operations else None
            if seed is not None:
                self._random.seed(seed)

    def maybe_raise(self, operation: str) -> None:
        with self._lock:
            if not self.rate or (self.operations and operation not in self.operations):
                return
            if self._random.random() >= self.rate:
                return
            self.injected += 1
            code = self.code
        status = 429 if code in ("TooManyRequestsException", "ThrottlingException") else 500
        raise ClientError({"Error": {"Code": code, "Message": "Too Many Requests (injected)"},
                           "ResponseMetadata": {"HTTPStatusCode": status}}, operation)
