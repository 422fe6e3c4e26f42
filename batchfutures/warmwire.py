"""What travels between a warm pool's client and its workers (warmpool.py, worker/warm.py).

    pool config   <pool_url>/config, sealed ("warm-pool"): the queues, the SQS spec, keepalive,
                  visibility timeout, per-call timeout, attempts, the initargs' URL, the stamp
    call          a work queue message: base64 of a sealed ("warm-call", named
                  <pool>/calls/<n>) CALL: JSON head {n, fn, enc, items[, key]} + the items' blob
                  (wire.pack_items/pack_arguments); a CALL over INLINE_LIMIT is
                  stored at <pool_url>/calls/<n> (sealed the same) and the message is that
                  sealed pointer {n, url} instead
    completion    a completions queue message: JSON {n, worker, result, attempt}: ``result``
                  the base64 of the result object exactly as write_result sealed it (kind
                  "result", <pool_url>/results/<n>), or null when larger than INLINE_LIMIT (then
                  the client reads it from storage). ``worker`` (the worker's Batch job id) and
                  ``attempt`` (the attempt that ended: {r: its receive count, s/e: started and
                  stopped, x: exit status or null, why}) are not authenticated and are only
                  shown (future.job_id, future.attempts)
    retry notice  a completions queue message {n, worker, attempt, retry: true}: that attempt
                  ended for another (a listed exception with attempts left, a crash); the call
                  is not settled, its message comes back to the queue (retry_visibility)

A message whose seal does not check is dropped by its reader, never unpickled.

``runner_failure`` is the pure decision of what a call whose process ended without an outcome
failed with: killed by the kernel or ended by a MemoryError (128 + SIGKILL) -> MemoryLimitExceeded;
past its ``timeout`` -> JobTimeoutError; any other death is tried again while the call has
attempts left (``runner_death_retried``, Batch's retry rules), then JobFailedError; the call's
message seen more times than its attempts (the workers holding it died: host lost, Spot reclaim,
stopped job) -> HostTerminatedError.

A call's attempt is its message's receive count (ApproximateReceiveCount): a retry by exception
(retrypolicy.retry_in_worker decides, in the call's process, as on the cold path), a crash and a
lost worker each use one, up to ``retries``. The client lists the attempts (`attempts_listed`),
an attempt no worker reported (its worker was lost) as `lost_attempt`; the worker that fails a
call seen more times than its attempts says its last was lost (`lost_record`).
"""

from __future__ import annotations

import base64
import json
import math
import signal
import struct
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

from .batchlimits import OOM_EXIT_STATUS
from .callattempts import Attempt
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
           "runner_failure", "runner_death_retried", "lost_failure", "results_in_messages",
           "Completion", "read_completion", "attempt_record", "attempt_of", "lost_attempt",
           "attempts_listed", "retry_visibility", "LOST_REASON", "MAX_VISIBILITY", "lost_record",
           "CALL_MARKER", "CALL_BEGIN", "CALL_END", "call_marker"]

# SQS's message limit is 256 KiB; base64 makes 4 bytes of 3, with room for the JSON around it
INLINE_LIMIT = 180 * 1024
CALL_KIND = "warm-call"
CONFIG_KIND = "warm-pool"
_LENGTH = struct.Struct("<I")
MAX_VISIBILITY = 43200  # SQS: a message's visibility timeout is 0 to 12 hours, whole seconds
# an attempt whose worker ended before it finished (the reason Batch gives a lost host's attempt:
# spot.is_reclaim counts it, as lost_failure's)
LOST_REASON = "Host EC2 (instance) terminated."


# echo_output="live": the line a worker writes to its log before and after each call it runs
# (the pool's config "live" is the token); warmlive.py splits a worker's stream by them
CALL_MARKER = "batchfutures.call: "
CALL_BEGIN, CALL_END = "begin", "end"


def call_marker(token: str, number: int, edge: str) -> str:
    return f"{CALL_MARKER}{token} {number} {edge}"


def call_name(pool_name: str, number: int) -> str:
    """What a call's seal binds it to: its pool (the pool URL's name) and its number."""
    return f"{pool_name}/calls/{int(number)}"


def encode_call(signer: Signer, root: str, pool_name: str, number: int, function_url: str,
                encoding: str, items: int, blob: bytes,
                key: Optional[Tuple[str, int]] = None) -> bytes:
    """The sealed CALL (see module doc); the caller sends its base64 or stores it. ``key``:
    (pool URL, call number) of its checkpoints when not its own (a call resent for memory)."""
    fields: Dict[str, Any] = {"n": number, "fn": function_url, "enc": encoding, "items": items}
    if key is not None:
        fields["key"] = [key[0], int(key[1])]
    head = json.dumps(fields, separators=(",", ":")).encode()
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


def encode_completion(number: int, worker: Optional[str], sealed_result: Optional[bytes],
                      attempt: Optional[Dict[str, Any]] = None, retry: bool = False) -> str:
    """A completion (``retry``: a retry notice, no result); ``attempt``: attempt_record's."""
    inline = sealed_result is not None and len(sealed_result) <= INLINE_LIMIT
    record: Dict[str, Any] = {"n": number, "worker": worker,
                              "result": base64.b64encode(sealed_result).decode() if inline
                              and sealed_result is not None else None}
    if attempt is not None:
        record["attempt"] = attempt
    if retry:
        record["retry"] = True
    return json.dumps(record, separators=(",", ":"))


class Completion(NamedTuple):
    number: int
    worker: Optional[str]
    result: Optional[bytes]  # the sealed result, None when stored (or a retry notice)
    attempt: Optional[Attempt]  # the attempt that ended, when the worker said
    receives: int  # that attempt's number (its message's receive count), 0 when not said
    retry: bool  # a retry notice: the call goes on


def read_completion(body: str) -> Completion:
    """A completions queue message; ValueError (KeyError, TypeError) when malformed."""
    record = json.loads(body)
    number = record["n"]
    if not isinstance(number, int):
        raise ValueError("bad call number")
    result = record.get("result")
    worker = record.get("worker")
    worker = worker if isinstance(worker, str) else None
    raw = record.get("attempt")
    attempt = attempt_of(raw, worker) if isinstance(raw, dict) else None
    receives = raw.get("r") if isinstance(raw, dict) else 0
    return Completion(number, worker,
                      base64.b64decode(result, validate=True) if isinstance(result, str) else None,
                      attempt, receives if isinstance(receives, int) and receives > 0 else 0,
                      record.get("retry") is True)


def decode_completion(body: str) -> Tuple[int, Optional[str], Optional[bytes]]:
    """(call number, worker job id, sealed result or None); ValueError when malformed."""
    completion = read_completion(body)
    return completion.number, completion.worker, completion.result


def attempt_record(receives: int, started: Optional[float], stopped: Optional[float],
                   exit_code: Optional[int], reason: Optional[str]) -> Dict[str, Any]:
    """What a worker says of an attempt that ended (the completion's ``attempt``)."""
    return {"r": int(receives), "s": started, "e": stopped, "x": exit_code,
            "why": None if reason is None else str(reason)[:1024]}


def lost_record(receives: int) -> Dict[str, Any]:
    """The record of attempt ``receives``, whose worker was lost (said by the next holder)."""
    return {"r": int(receives), "lost": True}


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def attempt_of(record: Mapping[str, Any], worker: Optional[str]) -> Attempt:
    """The callattempts.Attempt of a worker's record (its fields checked: not authenticated);
    a lost worker's attempt (``lost``, said by the worker that took the call next) is
    lost_attempt: not the reporting worker's."""
    if record.get("lost") is True:
        return lost_attempt()
    code = record.get("x")
    why = record.get("why")
    return Attempt(_number(record.get("s")), _number(record.get("e")),
                   code if isinstance(code, int) and not isinstance(code, bool) else None,
                   why if isinstance(why, str) else None, worker)


def lost_attempt() -> Attempt:
    """An attempt no worker reported: the worker holding the call ended before it finished."""
    return Attempt(None, None, None, LOST_REASON, None)


def attempts_listed(reported: Mapping[int, Attempt]) -> List[Attempt]:
    """A call's attempts in order, from those its workers reported by receive count: a
    number missing below the highest is an attempt whose worker was lost (lost_attempt)."""
    if not reported:
        return []
    return [reported.get(receive) or lost_attempt() for receive in range(1, max(reported) + 1)]


def retry_visibility(delay: float) -> int:
    """The visibility timeout that brings a call's message back after ``delay`` seconds (the
    Retries policy's, retrypolicy.delay_after): whole seconds, rounded up, as SQS counts them."""
    if not delay > 0:
        return 0
    return min(MAX_VISIBILITY, math.ceil(delay))


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
        f"allows no further attempt", status_reason=LOST_REASON)
