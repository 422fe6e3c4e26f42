"""A warm worker: ``python -m batchfutures.worker --warm <pool_url>`` (a long-lived Batch job).

Two processes: the supervisor (the job's command) and the runner it forks, which keeps the
user's world between calls (the initializer's globals, modules a call imported or changed), as
a ProcessPoolExecutor worker does.

    supervisor                                    runner (forked; again after each death)
    ----------                                    ------
    read <pool_url>/config (sealed "warm-pool":   loop:
      queues, SQS spec, keepalive, visibility,      ReceiveMessage(work queue, 1, long poll,
      timeout, attempts)                              VisibilityTimeout V, receive count)
    fork the runner; then wait on its pidfd,          queue gone, or idle for keepalive: exit 0
      waking at least every second:                 decode the call (seal checked; a bad one
                                                      is deleted unread)
      the call held (Holding, shared memory) <───── hold(n, items, receipt handle)
        past its timeout: SIGKILL the runner        result already there (an earlier holder
        every V/3 s: ChangeMessageVisibility(V)       finished)? completion only
                                                    received more often than its attempts?
                                                      HostTerminatedError (lost_failure)
                                                    else run it here (calls.ItemRunner, its
                                                      prints captured, usage metered)
                                                    release(); then, on one of 4 threads
                                                      while the next call is taken and run:
                                                    PUT results/<n> once (exclusive; on
                                                      the local queues only a large one:
                                                      warmwire.results_in_messages)
                                                    SendMessage(completions, {n, worker,
                                                      the sealed result when small})
                                                    DeleteMessage
      the runner died holding call n (exit 137 or
        SIGKILL: out of memory; killed: timeout):
        write that call's failure result
        (warmwire.runner_failure), its completion,
        DeleteMessage; another death, with
        attempts left: the message visible again
        at once (runner_death_retried); then fork
        a new runner (the initializer runs again)
      the runner exited 0 holding nothing: exit 0
      SIGTERM (a Spot notice, TerminateJob): passed  (checkpoints.on_sigterm: a call that used
        to the runner; the call held is leased       checkpoint/restored/interrupted goes on,
        NOTICE_LEASE s at a time, so the kill that   interrupted() true; any other ends the
        follows leaves it to another worker at       runner at once); no new call is taken,
        once; a runner that ends holding it puts     the runner exits 0 once the call is done
        it back in the queue (the worker lost);
        no new runner: exit

Each call runs as attempt r, its message's receive count (warmwire module doc): a call under a
Retries policy that raised a listed exception with attempts left (retrypolicy.Retrying asked,
checkpoints.request_retry) is released, its retry notice sent and its message left to come
back after the policy's delay (ChangeMessageVisibility, warmwire.retry_visibility): the worker
takes its next call at once. `checkpoint()` in a call stores at the call's own key,
checkpoints.checkpoint_url(<pool_url>, n, item) (a call resent for memory keeps its first key),
and `restored()` reads it on the call's next attempt.

With echo_output="live" (the config's "live", a token) the runner's stdout and stderr are
line-buffered and share one pipe, and each call it runs is written between two marker lines,
``batchfutures.call: <token> <n> begin`` and ``... end`` (warmwire.call_marker; the supervisor
writes the end of a call whose runner died): the client splits the worker's log stream by call
(warmlive.py). What is printed between calls is nobody's, as the calls' capture treats it.

The pool's queues gone while a call is held (its executor shut down between the call's start
and its completion or DeleteMessage, or the supervisor's failure of a dead runner's call) is
the pool's end too, not a failure: exit 0, a debug line (sqsapi.is_queue_gone).

The runner's path has no round trip to the supervisor (a call costs no pipe write and no
context switch): the supervisor only reads the small shared record of the call held.
The runner makes its own SQS client and storage after the fork (boto3's and s3fs's are not
fork-safe).
"""

from __future__ import annotations

import collections
import json
import logging
import mmap
import os
import queue
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .. import checkpoints, serialization, sqsapi, warmwire, wire
from ..awsclients import worker_storage_options
from ..batchlimits import OOM_EXIT_STATUS
from ..dependencies import Resolver
from ..errors import IntegrityError
from ..signing import job_signer
from ..storage import Storage, size_limit
from . import calls, envs

logger = logging.getLogger("batchfutures")
TAIL_THREADS = 4  # calls whose tails are sent at once
TAIL_BACKLOG = 8  # calls run whose tails are not sent yet, at most
HEARTBEAT_FRACTION = 3  # extend the held message's visibility every V / this seconds
SUPERVISOR_TICK = 1.0  # the supervisor looks at the call held at least this often
# after SIGTERM, the call held stays hidden this many seconds at a time (renewed every tick):
# the kill that follows leaves it to another worker after this, not the visibility timeout
NOTICE_LEASE = 3


# -- the call held, shared between runner and supervisor ---------------------------------------
class Holding:
    """The runner's one call in progress, in shared memory: a seqlock'ed record the supervisor
    reads without a lock (a write in progress makes the sequence odd; the reader tries again)."""

    _HEAD = struct.Struct("<QqdIIH")  # sequence, call number (-1: none), started, items,
    # receives, handle length
    SIZE = 4096

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, self.SIZE)  # anonymous and shared: the fork sees the same
        self._sequence = 0
        self._write(-1, 0.0, 0, 0, b"")

    def _write(self, number: int, started: float, items: int, receives: int,
               handle: bytes) -> None:
        self._sequence += 1  # odd: being written
        self._map[:8] = struct.pack("<Q", self._sequence)
        self._map[8:self._HEAD.size] = self._HEAD.pack(0, number, started, items, receives,
                                                       len(handle))[8:]
        self._map[self._HEAD.size:self._HEAD.size + len(handle)] = handle
        self._sequence += 1  # even: complete
        self._map[:8] = struct.pack("<Q", self._sequence)

    def hold(self, number: int, items: int, receives: int, handle: str) -> None:
        self._write(number, time.time(), items, receives,
                    handle.encode()[:self.SIZE - self._HEAD.size])

    def release(self) -> None:
        self._write(-1, 0.0, 0, 0, b"")

    def read(self) -> Optional[Tuple[int, float, int, int, str]]:
        """(call number, started, items, receives, receipt handle) of the call held, or None."""
        while True:
            before = struct.unpack_from("<Q", self._map)[0]
            _, number, started, items, receives, length = self._HEAD.unpack_from(self._map)
            handle = bytes(self._map[self._HEAD.size:self._HEAD.size + length])
            if before % 2 == 0 and struct.unpack_from("<Q", self._map)[0] == before:
                return None if number < 0 else (number, started, items, receives,
                                                 handle.decode())
            time.sleep(0.0001)  # the runner is writing it


# -- echo_output="live": the calls' lines in order in the log, each call between markers ------
def live_output() -> None:
    """The runner's stdout and stderr line-buffered (as a cold job's under header "live") and
    its stderr the same pipe as its stdout: the container runtime reads the two apart, and a
    line of one could pass a marker written to the other (the log has both in one stream)."""
    calls.line_buffered_output()
    calls.flush_output()
    try:
        os.dup2(1, 2)
    except OSError as error:  # no stdout to share: the order is as the runtime reads it
        logger.debug("could not share stdout with stderr: %s", error)


def write_marker(token: str, number: Any, edge: str) -> None:
    """The line that marks where call ``number`` begins or ends in the log (warmwire.call_marker),
    written past the calls' capture (never part of a call's output), after what they printed."""
    if not token:
        return
    calls.flush_output()
    try:
        os.write(1, (warmwire.call_marker(token, int(number), edge) + "\n").encode())
    except OSError:  # a closed stdout: nothing streams anyway
        pass


# -- what runs a call: the user's world ------------------------------------------------------
class World:
    """What the runner keeps between calls: the functions loaded, the initializer's verdict."""

    def __init__(self, initargs: Optional[bytes], header: Dict[str, Any],
                 storage: Optional[Storage] = None, live: str = "") -> None:
        self.initargs = initargs
        self.live = live  # echo_output="live": the pool's marker token (warmlive.py)
        self.header = header
        self.storage = storage  # where a map item's argument that is a done job's result is
        self.functions: Dict[str, Any] = {}
        self.failed: Dict[str, bytes] = {}
        self.initialized = initargs is None
        self.init_failure: Optional[bytes] = None
        self.capture = calls.Capture(True)
        self.meter = calls.Meter()

    def load(self, url: str, payload: Any) -> None:
        try:
            if self.initargs is not None:  # (initializer, fn) from one dumps: one namespace
                initializer, function = serialization.loads(payload)
                if not self.initialized:
                    self.initialized = True
                    self.init_failure = calls._call_initializer(
                        initializer, serialization.loads(self.initargs), 0)
            else:
                function = serialization.loads(payload)
            self.functions[url] = function
        except MemoryError:
            raise
        except Exception as error:
            self.failed[url] = calls.load_failure("the function", self.header, error)

    def run(self, head: Dict[str, Any], blob: bytes) -> bytes:
        """The call's packed result (wire.pack_result): outcomes, usage, output."""
        url = head["fn"]
        meta: Dict[str, Any] = {"index": head["n"], "started": time.time(),
                                "host": socket.gethostname(), "pid": os.getpid(),
                                "worker": serialization.payload_stamp()}
        output: Dict[int, Any] = {}
        usage: List[Any] = []
        count = int(head["items"])
        if self.init_failure is not None:
            outcomes = [self.init_failure] * count
        elif url in self.failed:
            outcomes = [self.failed[url]] * count
        else:
            try:
                items = wire.unpack_items(blob, head["enc"])
            except MemoryError:
                raise
            except Exception as error:
                items, outcomes = [], [calls.load_failure("the call's arguments", self.header,
                                                          error)] * count
            resolver = Resolver(self.storage)
            if items:
                try:  # a map's item may be a future done by then: its result is read first
                    resolver.preload(items)
                except IntegrityError as error:  # nothing of it unpickled; the call fails
                    items, outcomes = [], [calls.load_failure("an argument's result",
                                                              self.header, error)] * count
            if items:
                runner = calls.ItemRunner(None, self.header, 0,  # type: ignore[arg-type]
                                          resolver, {0: self.functions[url]}, None,
                                          self.meter)
                outcomes = []
                self.capture.take()  # what was printed between calls is nobody's
                write_marker(self.live, head["n"], warmwire.CALL_BEGIN)
                if self.live:  # the marker ended the line the last call may have left open
                    self.capture.line_ended()
                try:
                    for item in items:
                        checkpoints.at_item(len(outcomes))  # checkpoint() of this item: its key
                        try:
                            outcomes.append(runner.run((0, item[1], item[2])))
                            usage.append(runner.usage)
                        finally:
                            self.capture.keep(output, len(outcomes) - 1)
                finally:
                    write_marker(self.live, head["n"], warmwire.CALL_END)
        meta["finished"] = time.time()
        if any(entry is not None for entry in usage):
            meta["usage"] = (usage + [None] * len(outcomes))[:len(outcomes)]
        return wire.pack_result(outcomes, meta, output)


# -- what both processes share: the pool, its queues and storage -----------------------------
class Pool:
    """The pool's config and the clients of one process (the supervisor's, or a runner's)."""

    def __init__(self, pool_url: str, environ: Mapping[str, str]) -> None:
        self.pool_url = pool_url  # a process of its own: the key is where os.environ says
        self._environ = environ
        self.storage = Storage.from_url(pool_url, signer=job_signer(),
                                        storage_options=worker_storage_options(dict(environ))
                                        or None, max_object_size=size_limit(environ))
        raw = self.storage.read_sealed(f"{pool_url}/config", warmwire.CONFIG_KIND)
        if raw is None:
            raise FileNotFoundError(f"the warm pool's config {pool_url}/config is missing")
        self.config = json.loads(bytes(raw))
        self.pool_name = self.storage.name_of(pool_url)
        self.worker_id = environ.get("AWS_BATCH_JOB_ID")
        self.live = str(self.config.get("live") or "")  # echo_output="live": the marker token
        # requirements=: the pool's environment first on sys.path before anything is unpickled
        # (the runner inherits it); refused (altered, missing): every call fails with it, unrun
        self.refused: Optional[IntegrityError] = None
        if self.config.get("environment"):
            try:
                envs.activate(self.storage, environ, pointer=self.config["environment"])
            except IntegrityError as error:
                logger.error("refusing the warm pool's environment (no call will run): %s", error)
                self.refused = error
        self.initargs: Optional[bytes] = None
        if self.config.get("initargs"):
            self.initargs = bytes(self.storage.get_function(self.config["initargs"]))
        if self.config.get("files"):  # files=: into the working directory the runner inherits
            calls.write_files(self.storage.get_function(self.config["files"]))
        self.header = {k: v for k, v in self.config.items()
                       if k in ("python", "cloudpickle", "log_levels")}  # (calls.ItemRunner's)
        self.counts: "collections.Counter[str]" = collections.Counter({"storage:GET": 1})
        self.sqs: sqsapi.SQSAPI = self.new_sqs()

    def renew_after_fork(self) -> None:
        """Clients of the forked process's own: s3fs's and boto3's are not fork-safe (the
        signer keeps the key it already loaded)."""
        self.storage = Storage.from_url(
            self.pool_url, signer=self.storage.signer,
            storage_options=worker_storage_options(dict(self._environ)) or None,
            max_object_size=size_limit(self._environ))
        self.sqs = self.new_sqs()

    def storage_request(self, kind: str) -> bool:
        """Count a storage request (and wait the latency a benchmark injects); True."""
        self.counts[f"storage:{kind}"] += 1
        latency = float(self.config.get("storage_latency") or 0)
        if latency:
            time.sleep(latency)
        return True

    def new_sqs(self) -> sqsapi.SQSAPI:
        """A client of this process's own (after a fork: boto3's are not fork-safe)."""
        client, counter = sqsapi.counted(sqsapi.client_for(self.config["sqs"]))
        self._sqs_counter = counter
        return client

    def request_counts(self) -> "collections.Counter[str]":
        counts = collections.Counter(self.counts)
        counts.update({f"sqs:{k}": v for k, v in self._sqs_counter.counts.items()})
        return counts

    def failure(self, number: int, items: int, error: BaseException) -> bytes:
        outcome = wire.encode_error(error, "".join(
            traceback.format_exception_only(type(error), error)))
        return wire.pack_result([outcome] * items,
                                         {"index": number, "finished": time.time()})

    def finish(self, number: int, data: Optional[bytes], handle: str,
               attempt: Optional[Dict[str, Any]] = None) -> None:
        """Write call ``number``'s result once (``data``: None when already written), send its
        completion (with ``attempt``, warmwire.attempt_record), delete its message."""
        storage, config = self.storage, self.config
        sealed: Optional[bytes] = None
        if data is not None:
            url = storage.result_url(self.pool_url, number)
            sealed = storage.signer.seal("result", storage.name_of(url), data,
                                         root=storage.mac_root)
            # stored first, once, unless its completion message is the record
            # (warmwire.results_in_messages); a large one always
            if len(sealed) > warmwire.INLINE_LIMIT or not config.get("results_in_messages"):
                self.storage_request("PUT")
                if not storage.put_bytes(url, sealed, exclusive=True):
                    sealed = None  # another holder wrote it first: the client reads that one
        self.sqs.send_message(QueueUrl=config["completions"],
                              MessageBody=warmwire.encode_completion(number, self.worker_id,
                                                                     sealed, attempt))
        self.sqs.delete_message(QueueUrl=config["queue"], ReceiptHandle=handle)

    def retry_later(self, number: int, handle: str, attempt: Dict[str, Any],
                    delay: float) -> None:
        """Attempt ``attempt`` of call ``number`` ended for another: its retry notice (the
        client lists the attempt), then its message back in the queue after ``delay`` s
        (notice first: the next attempt's completion comes after it)."""
        self.sqs.send_message(QueueUrl=self.config["completions"],
                              MessageBody=warmwire.encode_completion(
                                  number, self.worker_id, None, attempt, retry=True))
        try:
            self.sqs.change_message_visibility(QueueUrl=self.config["queue"],
                                               ReceiptHandle=handle,
                                               VisibilityTimeout=warmwire.retry_visibility(delay))
        except Exception as error:  # past SQS's 12 hours in all: back after its visibility
            logger.warning("call %d: its retry's delay was refused (%s); it comes back after "
                           "the queue's visibility timeout", number, error)


# -- the runner ------------------------------------------------------------------------------
def tails_in_background(config: Mapping[str, Any]) -> bool:
    """Whether calls' tails go to threads: when their requests take round trips (SQS over the
    network, or latency a benchmark injects), not for the emulator's folder on this machine,
    where the threads would only take the CPU from the calls."""
    spec = config.get("sqs") or {}
    return "local" not in spec or bool(spec.get("latency")) or \
        bool(config.get("storage_latency"))



class Runner:
    """The runner's loop (in the forked process): take, run, record, complete; see module doc."""

    def __init__(self, pool: Pool, holding: Holding) -> None:
        self.pool = pool
        self.holding = holding
        self.world = World(pool.initargs, pool.header, pool.storage, pool.live)
        self.calls = 0
        # a call's tail (its result PUT, completion, DeleteMessage) is sent by these threads
        # while the next call is taken and run: three round trips off each call's path, and
        # the tails of calls shorter than their round trips in parallel
        self._tails: "queue.Queue[Optional[Tuple[int, Optional[bytes], str, Any]]]" = \
            queue.Queue(maxsize=TAIL_BACKLOG)
        threads = TAIL_THREADS if tails_in_background(pool.config) else 0
        self._tail_threads = [threading.Thread(target=self._send_tails, name="warm-tails",
                                               daemon=True) for _ in range(threads)]
        for thread in self._tail_threads:
            thread.start()

    def _send_tails(self) -> None:
        while True:
            tail = self._tails.get()
            if tail is None:
                return
            try:
                self.pool.finish(*tail)
            except Exception as error:  # its message comes back after the visibility timeout
                if sqsapi.is_queue_gone(error):  # the pool shut down: nobody waits for it
                    logger.debug("warm call %s not recorded: the pool's queue is gone", tail[0])
                    continue
                logger.exception("could not record warm call %s", tail[0])

    def serve(self) -> int:
        try:
            return self._serve()
        finally:
            for _thread in self._tail_threads:  # the calls run are recorded before it ends
                self._tails.put(None)
            for thread in self._tail_threads:
                thread.join()

    def _serve(self) -> int:
        pool, config = self.pool, self.pool.config
        keepalive = float(config["keepalive"])
        idle_since = time.monotonic()
        while True:
            if checkpoints.interrupted():  # SIGTERM: the call it held is done; no new one
                logger.info("warm worker asked to stop (SIGTERM): taking no more calls")
                return 0
            idle = time.monotonic() - idle_since
            if idle >= keepalive:
                logger.info("warm worker idle for %.0f s (keepalive): exiting", idle)
                return 0
            try:
                answer = pool.sqs.receive_message(
                    QueueUrl=config["queue"], MaxNumberOfMessages=1,
                    WaitTimeSeconds=int(max(1, min(20, keepalive - idle))),
                    VisibilityTimeout=int(config["visibility"]),
                    AttributeNames=["ApproximateReceiveCount"])
            except Exception as error:
                if sqsapi.is_queue_gone(error):
                    logger.info("the warm pool's queue is gone (shut down): exiting")
                    return 0
                raise
            for message in answer.get("Messages", []):
                try:
                    if checkpoints.interrupted():  # asked to stop while it waited: another's
                        pool.sqs.change_message_visibility(
                            QueueUrl=config["queue"], ReceiptHandle=message["ReceiptHandle"],
                            VisibilityTimeout=0)
                        continue
                    self.handle(message)
                except Exception as error:
                    # the pool shut down while a call was held (its completion or DeleteMessage
                    # refused): the pool's end, as an idle worker's, not the runner's failure
                    if not sqsapi.is_queue_gone(error):
                        raise
                    self.holding.release()
                    logger.debug("the warm pool's queue went away during a call: exiting")
                    return 0
                idle_since = time.monotonic()

    def handle(self, message: Dict[str, Any]) -> None:
        pool = self.pool
        storage, config = pool.storage, pool.config
        handle = message["ReceiptHandle"]
        try:
            head, blob = self._decode(message["Body"])
        except IntegrityError as refused:
            logger.error("refusing a warm call message (nothing of it ran or was unpickled): %s",
                         refused)
            pool.sqs.delete_message(QueueUrl=config["queue"], ReceiptHandle=handle)
            return
        number, items = int(head["n"]), int(head["items"])
        receives = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
        self.calls += 1
        self.holding.hold(number, items, receives, handle)
        started = time.time()
        data: Optional[bytes]
        retry: Optional[Tuple[float, str]] = None
        attempt: Optional[Dict[str, Any]] = None  # what future.attempts shows of this receipt
        if receives > 1 and pool.storage_request("HEAD") and \
                storage.has_result(pool.pool_url, number):
            data = None  # an earlier holder finished: its completion may be lost, send again
        elif receives > int(config["attempts"]):
            data = pool.failure(number, items,
                                warmwire.lost_failure(receives, int(config["attempts"])))
            # not an attempt: the last one was the lost worker's (those before it are listed
            # as lost too, warmwire.attempts_listed)
            attempt = warmwire.lost_record(receives - 1)
        else:
            data, retry = self._attempt(head, blob, receives)
            attempt = warmwire.attempt_record(receives, started, time.time(), None, None)
        if retry is not None:  # a listed exception, attempts left: this worker goes on
            self.holding.release()
            delay, why = retry
            logger.warning("call %d: attempt %d raised %s, which its retries=Retries(on=...) "
                           "lists; back in the queue in %g s", number, receives, why, delay)
            pool.retry_later(number, handle, warmwire.attempt_record(
                receives, started, time.time(), None, f"retried: {why}"), delay)
            return
        if not self._tail_threads:  # a local folder's: ~0.3 ms of CPU, nothing to overlap
            pool.finish(number, data, handle, attempt)
            self.holding.release()
            return
        # released before its tail is sent: a death now leaves the message to come back after
        # the visibility timeout (its result written once, whichever holder writes it)
        self.holding.release()
        self._tails.put((number, data, handle, attempt))

    def _attempt(self, head: Dict[str, Any], blob: bytes, receives: int
                 ) -> Tuple[bytes, Optional[Tuple[float, str]]]:
        """Attempt ``receives`` of a call: its result, and (delay, exception) when its Retries
        policy asked for another attempt instead (retrypolicy.Retrying)."""
        key_url, key_child = head.get("key") or (self.pool.pool_url, head["n"])
        checkpoints.begin_call(self.pool.storage, str(key_url), int(key_child), str(receives))
        try:
            data = self._run(head, blob)
            delay = checkpoints.retry_requested()
            if delay is None:
                return data, None
            return data, (delay, checkpoints.retry_reason() or "a listed exception")
        finally:
            checkpoints.end_call()

    def _decode(self, body: str) -> Tuple[Dict[str, Any], bytes]:
        pool = self.pool
        storage = pool.storage
        head, blob = warmwire.decode_call(storage.signer, storage.mac_root, pool.pool_name, body)
        if "url" in head:  # a large call: stored beside the pool
            pool.storage_request("GET")
            stored = storage.get_bytes(head["url"])
            if stored is None:
                raise IntegrityError(f"the stored call {head['url']} is missing")
            head, blob = warmwire.split_call(storage.signer.unseal(
                warmwire.CALL_KIND, warmwire.call_name(pool.pool_name, head["n"]), stored,
                root=storage.mac_root))
        return head, blob

    def _run(self, head: Dict[str, Any], blob: bytes) -> bytes:
        world, pool = self.world, self.pool
        if pool.refused is not None:  # nothing of the call (nor the initializer) is unpickled
            return pool.failure(int(head["n"]), int(head["items"]), pool.refused)
        url = head["fn"]
        if url not in world.functions and url not in world.failed:
            try:
                pool.storage_request("GET")
                payload = pool.storage.get_function(url)
            except IntegrityError:
                raise
            except Exception as error:
                return pool.failure(int(head["n"]), int(head["items"]), error)
            world.load(url, payload)
        return world.run(head, blob)


def _run_in_child(pool: Pool, holding: Holding) -> None:
    """The runner process's body; never returns."""
    status = 1
    try:
        checkpoints.install_sigterm_handler()  # SIGTERM (passed on by the supervisor): interrupted()
        pool.renew_after_fork()
        if pool.live:
            live_output()
        runner = Runner(pool, holding)
        try:
            status = runner.serve()
        finally:
            logger.info("warm worker: %d calls; requests: %s", runner.calls, ", ".join(
                f"{name}={count}" for name, count in sorted(pool.request_counts().items())))
    except MemoryError:
        status = OOM_EXIT_STATUS
        os.write(2, b"batchfutures.worker: MemoryError in a warm call; its runner ends with 137\n")
    except BaseException:  # noqa: B036 - whatever happens, the forked process ends here
        logger.exception("the warm worker's runner failed")
    finally:
        calls.flush_output()
        os._exit(status)


# -- the supervisor --------------------------------------------------------------------------
class Supervisor:
    """The job's own process: forks the runner, watches the call it holds, outlives its death."""

    def __init__(self, pool_url: str, environ: Mapping[str, str]) -> None:
        self.pool = Pool(pool_url, environ)
        self.holding = Holding()
        self.pid = 0
        self.pidfd: Optional[int] = None
        self.own_pid = os.getpid()
        self.stopping = False  # SIGTERM came: finish or give back the call held, then exit
        self.lease_now = False
        self.told = 0  # the runner SIGTERM was passed to
        # the SIGTERM handler wakes _wait through this pipe: the lease is set at once, not at
        # the next tick (the kill may come within a second)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)

    def on_sigterm(self, signum: int = signal.SIGTERM, frame: Any = None) -> None:
        if os.getpid() != self.own_pid:  # a runner just forked, before its own handler
            checkpoints.on_sigterm(signum, frame)
            return
        self.stopping = self.lease_now = True
        try:
            os.write(self._wake_write, b"!")
        except OSError:  # full: a wake is pending anyway
            pass
        self.tell_runner()

    def tell_runner(self) -> None:
        """Pass SIGTERM on to the runner, once (again from the loop: the signal may have come
        between a fork and ``self.pid``)."""
        pid = self.pid
        if pid and self.told != pid:
            self.told = pid
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def start(self) -> None:
        calls.flush_output()
        pid = os.fork()
        if pid == 0:
            _run_in_child(self.pool, self.holding)
        self.pid = pid
        self.pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None

    def _wait(self, seconds: float) -> Optional[int]:
        """The runner's exit status (-N: signal N) if it ended within ``seconds``, else None."""
        if self.pidfd is not None:
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            poller.register(self._wake_read, select.POLLIN)
            ready = {fd for fd, _ in poller.poll(max(0, int(seconds * 1000)))}
            if self._wake_read in ready:
                os.read(self._wake_read, 64)
            if self.pidfd not in ready:
                return None
        else:
            deadline = time.monotonic() + seconds
            while True:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
                if pid or time.monotonic() >= deadline or self.lease_now:
                    break
                time.sleep(0.05)
        pid, status = os.waitpid(self.pid, 0 if self.pidfd is not None else os.WNOHANG)
        if pid == 0:
            return None
        self.pid = 0  # reaped: never signalled again (the number may be reused)
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def serve(self) -> int:
        pool, config = self.pool, self.pool.config
        visibility = int(config["visibility"])
        timeout = config.get("timeout")
        if threading.current_thread() is threading.main_thread():  # (signals: only there)
            signal.signal(signal.SIGTERM, self.on_sigterm)
        self.start()
        watched: Optional[int] = None  # the call number whose deadlines are being kept
        next_beat = 0.0
        timed_out: Optional[int] = None
        while True:
            held = self.holding.read()
            now = time.time()
            wait = SUPERVISOR_TICK
            if self.stopping:  # the kill follows: the call held is leased a little at a time
                visibility = NOTICE_LEASE
                self.tell_runner()
            if held is not None:
                number, started, _items, _receives, handle = held
                if number != watched:
                    watched, next_beat = number, started + visibility / HEARTBEAT_FRACTION
                if self.lease_now:
                    self.lease_now, next_beat = False, now
                if timeout is not None:
                    if now - started >= timeout and timed_out != number and self.pid:
                        timed_out = number
                        os.kill(self.pid, signal.SIGKILL)
                    wait = min(wait, max(0.0, started + timeout - now))
                if now >= next_beat:
                    self._extend(handle, visibility)
                    next_beat = now + visibility / HEARTBEAT_FRACTION
                wait = min(wait, max(0.0, next_beat - now))
            status = self._wait(wait)
            if status is None:
                continue
            held = self.holding.read()
            if held is None:
                if status != 0 and not self.stopping:
                    logger.error("the warm worker's runner ended with status %s", status)
                return 0 if self.stopping else status
            number, started, items, receives, handle = held
            write_marker(pool.live, number, warmwire.CALL_END)  # the runner could not
            if self.stopping:  # asked to stop: as a worker lost, the call goes to another
                logger.warning("call %s: its process ended (status %s) after SIGTERM; back in "
                               "the queue", number, status)
                self._extend(handle, 0)
                self.holding.release()
                return 0
            logger.warning("call %s: its process ended (status %s%s); starting a new one",
                           number, status, ", past its timeout" if timed_out == number else "")
            why = f"the call's process ended with status {status}"
            if warmwire.runner_death_retried(status, timed_out=timed_out == number,
                                             receives=receives,
                                             attempts=int(config["attempts"])):
                try:  # the attempt, for future.attempts; then back in the queue now
                    pool.retry_later(number, handle, warmwire.attempt_record(
                        receives, started, time.time(), status, why), 0)
                except Exception:
                    self._extend(handle, 0)
            else:
                error = warmwire.runner_failure(status, timed_out=timed_out == number,
                                                timeout=timeout, worker=pool.worker_id,
                                                memory_mib=config.get("memory_mib"))
                try:
                    pool.finish(number, pool.failure(number, items, error), handle,
                                warmwire.attempt_record(receives, started, time.time(), status,
                                                        error.status_reason or why))
                except Exception as failed:  # the pool shut down: nobody waits for the call
                    if not sqsapi.is_queue_gone(failed):
                        raise
                    logger.debug("call %s not failed: the warm pool's queue is gone", number)
                    self.holding.release()
                    return 0
            self.holding.release()
            if self.stopping:
                return 0
            self.start()

    def _extend(self, handle: str, visibility: int) -> None:
        try:
            self.pool.sqs.change_message_visibility(QueueUrl=self.pool.config["queue"],
                                                    ReceiptHandle=handle,
                                                    VisibilityTimeout=visibility)
        except Exception as error:  # finished meanwhile, or the queue is gone
            logger.debug("could not extend the visibility of a call: %s", error)

    def close(self) -> None:
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def main(pool_url: str, environ: Optional[Mapping[str, str]] = None) -> int:
    """The warm worker's exit status: 0 once idle for keepalive or its queue is gone."""
    supervisor = Supervisor(pool_url, os.environ if environ is None else environ)
    try:
        return supervisor.serve()
    finally:
        supervisor.close()
        sys.stderr.flush()
