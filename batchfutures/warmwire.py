"""What travels between a warm pool's client and its workers (warmpool.py, worker/warm.py).

    pool config   <pool_url>/config, sealed ("warm-pool"): the queues, the SQS spec, keepalive,
                  visibility timeout, per-call timeout, attempts, the initargs' URL, the stamp
    call          a work queue message: base64 of a sealed ("warm-call", named
                  <pool>/calls/<n>) CALL: JSON head {n, fn, enc, items} + the items' blob
                  (wire.pack_items/pack_arguments); a CALL over INLINE_LIMIT is
                  stored at <pool_url>/calls/<n> (sealed the same) and the message is that
                  sealed pointer {n, url} instead
    completion    a completions queue message: JSON {n, worker, result}: ``result`` the
                  base64 of the result object exactly as write_result sealed it (kind "result",
                  <pool_url>/results/<n>), or null when larger than INLINE_LIMIT (then the
                  client reads it from storage). ``worker`` (the worker's Batch job id) is not
                  authenticated and is only shown (future.job_id)

A message whose seal does not check is dropped by its reader, never unpickled.

``runner_failure`` is the pure decision of what a call whose process ended without an outcome
failed with: killed by the kernel or ended by a MemoryError (128 + SIGKILL) -> MemoryLimitExceeded;
past its ``timeout`` -> JobTimeoutError; any other death is tried again while the call has
attempts left (``runner_death_retried``, Batch's retry rules), then JobFailedError; the call's
message seen more times than its attempts (the workers holding it died: host lost, Spot reclaim,
stopped job) -> HostTerminatedError.
"""

from __future__ import annotations

import base64
import json
import signal
import struct
from typing import Any, Dict, Optional, Tuple

from .batchlimits import OOM_EXIT_STATUS
from .errors import (
    OOM_REASON_PREFIX,
    TIMEOUT_REASON,
    HostTerminatedError,
    IntegrityError,
    JobFailedError,
    JobTimeoutError,
    MemoryLimitExceeded,
)
from .signing import Signer

__all__ = ["INLINE_LIMIT", "CALL_KIND", "CONFIG_KIND", "call_name", "encode_call",
           "decode_call", "encode_pointer", "encode_completion", "decode_completion",
           "runner_failure", "runner_death_retried", "lost_failure", "results_in_messages"]

# SQS's message limit is 256 KiB; base64 makes 4 bytes of 3, with room for the JSON around it
INLINE_LIMIT = 180 * 1024
CALL_KIND = "warm-call"
CONFIG_KIND = "warm-pool"
_LENGTH = struct.Struct("<I")


def call_name(pool_name: str, number: int) -> str:
    """What a call's seal binds it to: its pool (the pool URL's name) and its number."""
    return f"{pool_name}/calls/{int(number)}"


def encode_call(signer: Signer, root: str, pool_name: str, number: int, function_url: str,
                encoding: str, items: int, blob: bytes) -> bytes:
    """The sealed CALL (see module doc); the caller sends its base64 or stores it."""
    head = json.dumps({"n": number, "fn": function_url, "enc": encoding, "items": items},
                      separators=(",", ":")).encode()
    payload = _LENGTH.pack(len(head)) + head + blob
    return signer.seal(CALL_KIND, call_name(pool_name, number), payload, root=root)


def encode_pointer(signer: Signer, root: str, pool_name: str, number: int, url: str) -> bytes:
    head = json.dumps({"n": number, "url": url}, separators=(",", ":")).encode()
    return signer.seal(CALL_KIND, call_name(pool_name, number) + "/pointer",
                       _LENGTH.pack(len(head)) + head, root=root)


def decode_call(signer: Signer, root: str, pool_name: str, body: str
                ) -> Tuple[Dict[str, Any], bytes]:
    """(head, blob) of a message's CALL, or of a pointer ({n, url}, b""); IntegrityError when
    its seal does not check (nothing of it is then unpickled)."""
    try:
        sealed = base64.b64decode(body, validate=True)
        number = _peek_number(signer, sealed)
    except (ValueError, TypeError) as error:
        raise IntegrityError(f"a warm call message is not a sealed call: {error}") from None
    for name in (call_name(pool_name, number), call_name(pool_name, number) + "/pointer"):
        try:
            payload = signer.unseal(CALL_KIND, name, sealed, root=root)
        except IntegrityError:
            continue
        return split_call(payload)
    raise IntegrityError(f"warm call {number} of {pool_name}: its seal does not check")


def split_call(payload: bytes) -> Tuple[Dict[str, Any], bytes]:
    (length,) = _LENGTH.unpack_from(payload)
    head = json.loads(bytes(payload[4:4 + length]))
    return head, bytes(payload[4 + length:])


def _peek_number(signer: Signer, sealed: bytes) -> int:
    """The call number the (not yet checked) payload claims: only to know which name to check
    the seal against; a lie fails the check."""
    del signer
    offset = 8 + 32  # SEAL_MAGIC + tag
    (length,) = _LENGTH.unpack_from(sealed, offset)
    if length > 4096:
        raise ValueError("head too long")
    head = json.loads(sealed[offset + 4:offset + 4 + length])
    number = head["n"]
    if not isinstance(number, int) or number < 0:
        raise ValueError("bad call number")
    return number


def encode_completion(number: int, worker: Optional[str], sealed_result: Optional[bytes]) -> str:
    inline = sealed_result is not None and len(sealed_result) <= INLINE_LIMIT
    return json.dumps({"n": number, "worker": worker,
                       "result": base64.b64encode(sealed_result).decode() if inline
                       and sealed_result is not None else None}, separators=(",", ":"))


def decode_completion(body: str) -> Tuple[int, Optional[str], Optional[bytes]]:
    """(call number, worker job id, sealed result or None); ValueError when malformed."""
    record = json.loads(body)
    number = record["n"]
    if not isinstance(number, int):
        raise ValueError("bad call number")
    result = record.get("result")
    worker = record.get("worker")
    return (number, worker if isinstance(worker, str) else None,
            base64.b64decode(result, validate=True) if isinstance(result, str) else None)


def results_in_messages(sqs_spec: Dict[str, Any], storage_latency: float) -> bool:
    """Whether a worker's small results travel only in their completion messages, not also as
    a stored object first. On AWS (and where a benchmark injects AWS's latencies) the object is
    written first, once (a second writer loses): it is the record a later holder of the call
    (its first worker died before DeleteMessage) finds and completes instead of running the
    call again. On the emulator's local queues the completion message is that record, as
    durable as a stored object (a file renamed into place in a folder on this machine), and
    the client settles a call by its first completion and drops any later one: a result is
    taken once, and each call costs no file in the workdir. A result over INLINE_LIMIT is
    stored either way."""
    return "local" in sqs_spec and not sqs_spec.get("latency") and not storage_latency


def runner_failure(returncode: Optional[int], *, timed_out: bool, timeout: Optional[float],
                   worker: Optional[str], memory_mib: Optional[int]) -> JobFailedError:
    """The typed error of a call whose process ended without an outcome (see module doc).
    ``returncode``: as subprocess shows it (-9 killed by SIGKILL, or the exit status 128 +
    SIGKILL)."""
    if timed_out:
        return JobTimeoutError(
            f"the call ran longer than its timeout of {timeout:g} s; its warm worker stopped it "
            f"(the worker goes on with other calls)", job_id=worker,
            status_reason=TIMEOUT_REASON)
    if returncode in (OOM_EXIT_STATUS, -signal.SIGKILL):
        return MemoryLimitExceeded(
            f"the call's process was killed for memory (exit {OOM_EXIT_STATUS}; the warm "
            f"worker's memory is {memory_mib} MiB); the worker goes on with other calls",
            job_id=worker, memory_mib=memory_mib,
            status_reason=f"{OOM_REASON_PREFIX}: Container killed due to memory usage",
            exit_code=OOM_EXIT_STATUS)
    return JobFailedError(f"the call's process ended with status {returncode} before it "
                          f"returned", job_id=worker, exit_code=returncode)


def runner_death_retried(returncode: Optional[int], *, timed_out: bool, receives: int,
                         attempts: int) -> bool:
    """Whether a call whose process died goes back to the queue for another attempt, as Batch's
    retry rules (submission.RETRY_RULES) would do with a job: never after an out-of-memory
    kill or a timeout (they would happen again), otherwise while attempts remain."""
    if timed_out or returncode in (OOM_EXIT_STATUS, -signal.SIGKILL):
        return False
    return receives < attempts


def lost_failure(receives: int, attempts: int) -> HostTerminatedError:
    """The call's message came back ``receives`` times: each worker that took it ended before
    it finished (host lost, Spot reclaim, the worker's job stopped or killed)."""
    return HostTerminatedError(
        f"the warm worker(s) running this call ended before it finished, {receives - 1} time(s) "
        f"(host lost, Spot reclaim, or the worker's Batch job was stopped); retries={attempts} "
        f"allows no further attempt", status_reason="Host EC2 (instance) terminated.")
