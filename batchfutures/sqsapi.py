"""The SQS seam: the subset of boto3's SQS client the warm pool calls, and where a client comes from.

    SQSAPI                       what warmpool.py (client) and worker/warm.py call, typed
    client_for(spec)             {"local": FOLDER} -> emulator.sqs.LocalSQS over that folder
                                 (the local default: client and worker processes share it;
                                 "latency": seconds injected per request, for benchmarks);
                                 {"region": R[, "endpoint_url": U]} -> boto3's SQS client
    is_queue_gone(error)         QueueDoesNotExist, as boto3 shows it (query-compatible code)

The spec travels in the pool's sealed config object, so a worker reaches the queues its client
made and no others.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Dict, Mapping, Protocol, cast, runtime_checkable

__all__ = ["SQSAPI", "client_for", "is_queue_gone", "QUEUE_GONE_CODES", "Counted", "counted"]

# boto3 shows SQS's query-compatible code; the JSON protocol's own name is the shape's
QUEUE_GONE_CODES = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})


@runtime_checkable
class SQSAPI(Protocol):
    """boto3's SQS client, as far as batchfutures uses it (keyword arguments as boto3's):
    warmpool.py and worker/warm.py send, receive and complete calls, cleanup.py lists and
    deletes a dead client's queues. Implemented by boto3's client and the emulator's
    `emulator.sqs.LocalSQS` (`client_for` returns either: mypy checks LocalSQS against this)."""

    def create_queue(self, **params: Any) -> Dict[str, Any]: ...
    def get_queue_url(self, **params: Any) -> Dict[str, Any]: ...
    def delete_queue(self, **params: Any) -> Dict[str, Any]: ...
    def list_queues(self, **params: Any) -> Dict[str, Any]: ...
    def tag_queue(self, **params: Any) -> Dict[str, Any]: ...
    def list_queue_tags(self, **params: Any) -> Dict[str, Any]: ...
    def send_message(self, **params: Any) -> Dict[str, Any]: ...
    def send_message_batch(self, **params: Any) -> Dict[str, Any]: ...
    def receive_message(self, **params: Any) -> Dict[str, Any]: ...
    def delete_message(self, **params: Any) -> Dict[str, Any]: ...
    def delete_message_batch(self, **params: Any) -> Dict[str, Any]: ...
    def change_message_visibility(self, **params: Any) -> Dict[str, Any]: ...


def client_for(spec: Mapping[str, Any], session: Any = None) -> SQSAPI:
    """The SQS client a pool's spec names (see the module doc); on AWS made from ``session``
    (a boto3 Session: the client's environment's), else from boto3's default chain (a job's
    role)."""
    if "local" in spec:
        # start-up: the emulator's queues cost ~6.5 ms, which a warm worker on AWS never needs
        from .emulator.sqs import LocalSQS

        return LocalSQS(str(spec["local"]), latency=float(spec.get("latency", 0)))
    # start-up: boto3 costs ~70 ms, which a warm worker on the emulator never needs
    import boto3
    from botocore.config import Config

    # botocore's own retries: no SQS request has a retry budget of ours (a send made twice is
    # harmless: a call's result is written once, a second completion is ignored)
    client: SQSAPI = (session or boto3.session.Session()).client(
        "sqs", region_name=spec.get("region"), endpoint_url=spec.get("endpoint_url"),
        config=Config(connect_timeout=10, read_timeout=60,  # over a 20 s long poll
                      retries={"mode": "standard", "total_max_attempts": 4}))
    return client


class Counted:
    """An SQS client that counts its requests by operation (``counts``: what the benchmarks and
    the warm worker's exit line report)."""

    def __init__(self, client: SQSAPI) -> None:
        self._client = client
        self.counts: "collections.Counter[str]" = collections.Counter()

    def __getattr__(self, name: str) -> Callable[..., Dict[str, Any]]:
        method = getattr(self._client, name)

        def call(**params: Any) -> Dict[str, Any]:
            self.counts[name] += 1
            return cast(Dict[str, Any], method(**params))

        return call


def counted(client: SQSAPI) -> "tuple[SQSAPI, Counted]":
    """``client`` counting its requests: (the client to call, the counter)."""
    wrapper = Counted(client)
    return cast(SQSAPI, wrapper), wrapper


def is_queue_gone(error: BaseException) -> bool:
    """Whether ``error`` says the queue does not exist (deleted: the pool was shut down)."""
    response = getattr(error, "response", None)
    code = (response or {}).get("Error", {}).get("Code") if isinstance(response, dict) else None
    return code in QUEUE_GONE_CODES
