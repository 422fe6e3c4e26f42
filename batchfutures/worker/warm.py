"""A warm worker: ``python -m batchfutures.worker --warm <pool_url>`` (a long-lived Batch job).

    read <pool_url>/config (sealed "warm-pool": queues, SQS spec, keepalive, visibility, ...)
    start the runner: one forked process that keeps the user's world between calls (the
        initializer's globals, modules a call imported or changed), as a ProcessPoolExecutor
        worker does; the loop itself never runs user code
    loop:
      ReceiveMessage(work queue, 1 message, long poll, VisibilityTimeout=V,
                     ApproximateReceiveCount)        queue gone -> exit 0 (the pool shut down)
        nothing for keepalive seconds -> exit 0
      decode the call (its seal checked; a bad one is deleted unread)
      its result already written (an earlier holder finished)? -> completion only
      received more times than the call's attempts -> the earlier holders died: the call fails
        with HostTerminatedError (warmwire.lost_failure), not run again
      else the runner runs it: the function's pickle is fetched (seal checked) and sent to the
        runner once per worker; every V/3 s while it runs, ChangeMessageVisibility(V)
        the runner dies (exit 137, SIGKILL: out of memory) or passes the call's timeout (killed
        by the loop) -> that call fails (warmwire.runner_failure) and a new runner starts
        (the initializer runs again in it)
      write <pool_url>/results/<n> once (Storage.write_result: a second writer loses)
      SendMessage(completions queue, {n, worker, the sealed result inline when small})
      DeleteMessage(work queue)

The runner reads requests on a pipe: ("fn", url, pickle) once per function, then ("call",
head, blob) -> the packed result (serialization.pack_result: outcomes, usage, each item's
output), so every call's prints are its own (calls.Capture, always on) and usage is measured
per item (calls.Meter), exactly as in a cold job's result.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
import traceback
from multiprocessing.connection import Connection, Pipe
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .. import serialization, sqsapi, warmwire
from ..dependencies import Resolver
from ..errors import IntegrityError
from . import calls

logger = logging.getLogger("batchfutures")
HEARTBEAT_FRACTION = 3  # extend the message's visibility every V / this seconds while it runs


# -- the runner (the forked process that runs user code) --------------------------------------
class _RunnerWorld:
    """What the runner keeps between calls: the functions loaded, the initializer's verdict."""

    def __init__(self, initargs: Optional[bytes], header: Dict[str, Any]) -> None:
        self.initargs = initargs
        self.header = header
        self.functions: Dict[str, Any] = {}
        self.failed: Dict[str, bytes] = {}
        self.initialized = initargs is None
        self.init_failure: Optional[bytes] = None
        self.capture = calls.Capture(True)
        self.meter = calls.Meter()

    def load(self, url: str, payload: bytes) -> None:
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
                items = serialization.unpack_items(blob, head["enc"])
            except MemoryError:
                raise
            except Exception as error:
                items, outcomes = [], [calls.load_failure("the call's arguments", self.header,
                                                          error)] * count
            if items:
                runner = calls.ItemRunner(None, self.header, 0,  # type: ignore[arg-type]
                                          Resolver(None), {0: self.functions[url]}, None,
                                          self.meter)
                outcomes = []
                self.capture.take()  # what was printed between calls is nobody's
                for item in items:
                    try:
                        outcomes.append(runner.run((0, item[1], item[2])))
                        usage.append(runner.usage)
                    finally:
                        self.capture.keep(output, len(outcomes) - 1)
        meta["finished"] = time.time()
        if any(entry is not None for entry in usage):
            meta["usage"] = (usage + [None] * len(outcomes))[:len(outcomes)]
        return serialization.pack_result(outcomes, meta, output)


def _serve(connection: Connection, initargs: Optional[bytes], header: Dict[str, Any]) -> None:
    """The runner's loop (in the forked process); a MemoryError ends it with 137."""
    world = _RunnerWorld(initargs, header)
    while True:
        try:
            request = serialization.loads(connection.recv_bytes())
        except EOFError:
            os._exit(0)
        try:
            if request[0] == "fn":
                world.load(request[1], request[2])
                continue
            connection.send_bytes(world.run(request[1], request[2]))
        except MemoryError:
            break
    calls.flush_output()
    os.write(2, b"batchfutures.worker: MemoryError in a warm call; its process ends with 137\n")
    os._exit(calls.OOM_EXIT_STATUS)


class Runner:
    """The loop's handle on the runner process."""

    def __init__(self, initargs: Optional[bytes], header: Dict[str, Any]) -> None:
        self._initargs, self._header = initargs, header
        self.sent: set = set()  # function URLs loaded in this runner
        parent, child = Pipe()
        calls.flush_output()
        pid = os.fork()
        if pid == 0:  # the runner
            parent.close()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                _serve(child, initargs, header)
            finally:
                os._exit(1)
        child.close()
        self.pid, self.connection = pid, parent

    def load(self, url: str, payload: Any) -> None:
        if url not in self.sent:
            self.connection.send_bytes(serialization.dumps(("fn", url, bytes(payload))))
            self.sent.add(url)

    def run(self, head: Dict[str, Any], blob: bytes, timeout: Optional[float],
            heartbeat: Any, every: float) -> Tuple[Optional[bytes], Optional[int], bool]:
        """(packed result, None, False), or (None, its exit status, timed out) when it died."""
        self.connection.send_bytes(serialization.dumps(("call", head, blob)))
        started = time.monotonic()
        beat = started + every
        while True:
            now = time.monotonic()
            wait = beat - now
            if timeout is not None:
                wait = min(wait, started + timeout - now)
            try:
                if self.connection.poll(max(0.0, wait)):
                    return self.connection.recv_bytes(), None, False
            except (EOFError, OSError):
                return None, self.reap(), False
            now = time.monotonic()
            if timeout is not None and now - started >= timeout:
                self.kill()
                return None, self.reap(), True
            if now >= beat:
                heartbeat()
                beat = now + every

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def reap(self) -> int:
        """The runner's exit status as subprocess shows it (-N: killed by signal N)."""
        _, status = os.waitpid(self.pid, 0)
        self.connection.close()
        return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def close(self) -> None:
        try:
            self.connection.close()
        finally:
            self.kill()
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass


# -- the loop --------------------------------------------------------------------------------
class WarmWorker:
    """One warm worker's loop over its pool's work queue (see module doc)."""

    def __init__(self, pool_url: str, environ: Mapping[str, str]) -> None:
        from ..awsclients import worker_storage_options
        from ..signing import job_signer
        from ..storage import Storage, size_limit

        self.pool_url = pool_url  # a process of its own: the key is where os.environ says
        self.storage = Storage.from_url(pool_url, signer=job_signer(),
                                        storage_options=worker_storage_options(dict(environ))
                                        or None, max_object_size=size_limit(environ))
        raw = self.storage.read_sealed(f"{pool_url}/config", warmwire.CONFIG_KIND)
        if raw is None:
            raise FileNotFoundError(f"the warm pool's config {pool_url}/config is missing")
        self.config = json.loads(bytes(raw))
        self.sqs = sqsapi.client_for(self.config["sqs"])
        self.pool_name = self.storage.name_of(pool_url)
        self.worker_id = environ.get("AWS_BATCH_JOB_ID")
        initargs = None
        if self.config.get("initargs"):
            initargs = bytes(self.storage.get_function(self.config["initargs"]))
        self.header = {k: v for k, v in self.config.items() if k in ("python", "cloudpickle")}
        self._initargs = initargs
        self.runner = Runner(initargs, self.header)

    def serve(self) -> int:
        config = self.config
        keepalive = float(config["keepalive"])
        idle_since = time.monotonic()
        while True:
            idle = time.monotonic() - idle_since
            if idle >= keepalive:
                logger.info("warm worker idle for %.0f s (keepalive): exiting", idle)
                return 0
            try:
                answer = self.sqs.receive_message(
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
                self.handle(message)
                idle_since = time.monotonic()

    def handle(self, message: Dict[str, Any]) -> None:
        config, storage = self.config, self.storage
        handle = message["ReceiptHandle"]
        try:
            head, blob = warmwire.decode_call(storage.signer, storage.mac_root, self.pool_name,
                                              message["Body"])
            if "url" in head:  # a large call: stored beside the pool
                stored = storage.get_bytes(head["url"])
                if stored is None:
                    raise IntegrityError(f"the stored call {head['url']} is missing")
                head, blob = warmwire.split_call(storage.signer.unseal(
                    warmwire.CALL_KIND, warmwire.call_name(self.pool_name, head["n"]),
                    stored, root=storage.mac_root))
        except IntegrityError as refused:
            logger.error("refusing a warm call message (nothing of it ran or was unpickled): %s",
                         refused)
            self.sqs.delete_message(QueueUrl=config["queue"], ReceiptHandle=handle)
            return
        number = int(head["n"])
        receives = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
        data: Optional[bytes] = None
        if receives > 1 and storage.has_result(self.pool_url, number):
            data = None  # an earlier holder finished: its completion may be lost, send again
        elif receives > int(config["attempts"]):
            data = self._failure(head, warmwire.lost_failure(receives, int(config["attempts"])))
        else:
            data = self._run(head, blob, handle)
        sealed: Optional[bytes] = None
        if data is not None:
            url = storage.result_url(self.pool_url, number)
            sealed = storage.signer.seal("result", storage.name_of(url), data,
                                         root=storage.mac_root)
            if not storage.put_bytes(url, sealed, exclusive=True):
                sealed = None  # another holder wrote it first: the client reads that one
        self.sqs.send_message(QueueUrl=config["completions"],
                              MessageBody=warmwire.encode_completion(number, self.worker_id,
                                                                     sealed))
        self.sqs.delete_message(QueueUrl=config["queue"], ReceiptHandle=handle)

    def _run(self, head: Dict[str, Any], blob: bytes, handle: str) -> bytes:
        config, storage = self.config, self.storage
        url = head["fn"]
        if url not in self.runner.sent:
            try:
                self.runner.load(url, storage.get_function(url))
            except IntegrityError:
                raise
            except Exception as error:
                return self._failure(head, error)
        visibility = int(config["visibility"])

        def heartbeat() -> None:
            self.sqs.change_message_visibility(QueueUrl=config["queue"], ReceiptHandle=handle,
                                               VisibilityTimeout=visibility)

        timeout = config.get("timeout")
        data, status, timed_out = self.runner.run(head, blob, timeout, heartbeat,
                                                  visibility / HEARTBEAT_FRACTION)
        if data is not None:
            return bytes(data)
        logger.warning("call %s: its process ended (status %s%s); starting a new one",
                       head["n"], status, ", past its timeout" if timed_out else "")
        self.runner = Runner(self._initargs, self.header)
        return self._failure(head, warmwire.runner_failure(
            status, timed_out=timed_out, timeout=timeout, worker=self.worker_id,
            memory_mib=config.get("memory_mib")))

    @staticmethod
    def _failure(head: Dict[str, Any], error: BaseException) -> bytes:
        outcome = serialization.encode_error(error, "".join(
            traceback.format_exception_only(type(error), error)))
        meta = {"index": head["n"], "finished": time.time()}
        return serialization.pack_result([outcome] * int(head["items"]), meta)

    def close(self) -> None:
        self.runner.close()


def main(pool_url: str, environ: Optional[Mapping[str, str]] = None) -> int:
    """The warm worker's exit status: 0 once idle for keepalive or its queue is gone."""
    worker = WarmWorker(pool_url, os.environ if environ is None else environ)
    try:
        return worker.serve()
    finally:
        worker.close()
        sys.stderr.flush()
