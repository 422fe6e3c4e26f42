"""SQS's API shape over a private folder, shared by every process that opens the folder.

The warm workers (batchfutures/warmpool.py) take calls from a work queue and send completions
to the client through SQS on AWS. Locally the client and the workers are separate processes,
so the queue lives in a folder (warmpool.local_queue_folder: a private one in memory,
$XDG_RUNTIME_DIR or /dev/shm, else the workdir's emulator folder) and every operation is a
rename, which one process wins:

    <folder>/<QueueName>/
        queue.json         attributes and tags (0600), written once by CreateQueue (TagQueue
                           rewrites it atomically)
        ready/<visible_at_ns>.<MessageId>.<receives>     one 0600 file per message: its JSON
                           (MessageId, Body, MD5OfMessageBody, SentTimestamp); visible once
                           visible_at_ns has passed (DelaySeconds)
        inflight/<receipt handle>                        a received message, renamed out of
                           ready/: the receipt handle is the file's name
                           (<seq>.<MessageId>.<receives>.<nonce>), its mtime the end of its
                           visibility timeout
        tmp/               messages being written (renamed into ready/ when complete)
        bells/<token>      one FIFO (0600) per receiver in a long poll, its doorbell: a sender
                           writes a byte to each after its rename into ready/, so a waiting
                           receiver wakes at once instead of at its next look at the folder

    SendMessage(Batch)      write tmp/x (0600), rename to ready/<now>.<id>.0
    ReceiveMessage          first in-flight messages past their deadline go back to ready/
                            (receives kept); then for each ready file in name order: set its
                            mtime to now + VisibilityTimeout, rename it to inflight/<...>.<n+1>.
                            <nonce> (losing the rename race to another receiver: skip it).
                            WaitTimeSeconds: block on the receiver's doorbell (bells/),
                            looking at the folder again at least every 0.1 s (a message made
                            visible by its delay or its visibility timeout rings no bell);
                            where no FIFO can be made, look again 1 ms apart at first, then up
                            to 20 ms (wait_steps: no inotify in the standard library)
    ChangeMessageVisibility set the in-flight file's mtime (0: rename back to ready/)
    DeleteMessage(Batch)    unlink inflight/<handle>; a handle no longer in flight succeeds
                            and deletes nothing, as on AWS
    DeleteQueue             rename the queue's folder aside, ring its bells, then remove it:
                            receivers see QueueDoesNotExist at once

Every request is checked against botocore's SQS model first (``model.validate_request``, as the
Batch facade does) and errors are the ClientErrors boto3 raises for AWS's answers, with the codes
boto3 shows for SQS's query-compatible errors (``AWS.SimpleQueueService.NonExistentQueue``, ...).
Not emulated: FIFO queues, message attributes (accepted, not returned), dead-letter queues,
retention (a message is never dropped for age), ApproximateNumberOfMessages and the other
queue statistics. Queue URLs are ``<endpoint>/<account>/<QueueName>``.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import re
import select
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from ..workdir import make_private_dirs
from .model import ACCOUNT, client_error, validate_request

__all__ = ["LocalSQS", "QUEUE_GONE", "LOCAL_ENDPOINT"]

LOCAL_ENDPOINT = "http://sqs.localhost"
QUEUE_GONE = "AWS.SimpleQueueService.NonExistentQueue"
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_HANDLE = re.compile(r"^[0-9]{20}\.[0-9a-f]{32}\.[0-9]{1,6}\.[0-9a-f]{16}$")
MAX_BODY = 256 * 1024  # a queue's MaximumMessageSize by default
MAX_BATCH = 1024 * 1024  # SendMessageBatch's total (SQS's batch actions page: 1 MiB)
DEFAULT_ATTRIBUTES = {"VisibilityTimeout": "30", "ReceiveMessageWaitTimeSeconds": "0",
                      "MessageRetentionPeriod": "345600", "DelaySeconds": "0",
                      "MaximumMessageSize": str(MAX_BODY)}
FIRST_POLL = 0.001  # long polling looks again this soon, then backs off to MAX_POLL
MAX_POLL = 0.02
BELL_POLL = 0.1  # a receiver blocked on its doorbell still looks at the folder this often
# (for what rings no bell: a delay or a visibility timeout ending; an idle worker: 10 looks a s)


def _now_ns() -> int:
    return time.time_ns()


def wait_steps(waited: float) -> float:
    """How long a long poll sleeps before it looks at the folder again, having waited ``waited``
    seconds: 1 ms for the first 0.1 s (a warm pool's next call is usually that close), then
    growing to 20 ms (an idle worker costs ~50 directory reads a second)."""
    if waited < 0.1:
        return FIRST_POLL
    return min(MAX_POLL, FIRST_POLL * (1 + waited * 20))


def _request(method: Callable[..., Dict[str, Any]]) -> Callable[..., Dict[str, Any]]:
    """A request of the API: first the latency injected, if any (as AWS's round trip)."""
    @functools.wraps(method)
    def request(self: "LocalSQS", **params: Any) -> Dict[str, Any]:
        if self.latency:
            time.sleep(self.latency)
        return method(self, **params)

    return request


class LocalSQS:
    """The methods of boto3's SQS client the package uses, over ``folder`` (see module doc)."""

    def __init__(self, folder: Union[str, os.PathLike], *, endpoint: str = LOCAL_ENDPOINT,
                 account: str = ACCOUNT, latency: float = 0.0) -> None:
        """``latency``: seconds each request waits first (benchmarks: AWS's round trip)."""
        self.folder = Path(folder)
        self.latency = latency
        self.endpoint = endpoint.rstrip("/")
        self.account = account
        self._known: Dict[Path, Dict[str, Any]] = {}
        self._bells: Dict[Path, List["_Bell"]] = {}  # free doorbells by queue (see _Bell)
        self._bells_lock = threading.Lock()
        self._ringers: Dict[Path, Dict[str, int]] = {}  # open write ends of bells, by queue
        self._paths: Dict[str, Path] = {}  # queue URL -> its folder (pathlib is slow per call)
        make_private_dirs(self.folder)

    def __repr__(self) -> str:
        return f"LocalSQS({str(self.folder)!r})"

    # -- queues ------------------------------------------------------------------------------
    def _url(self, name: str) -> str:
        return f"{self.endpoint}/{self.account}/{name}"

    def _queue(self, url: str, operation: str) -> Path:
        """The folder of the queue at ``url``; QueueDoesNotExist when there is none."""
        path = self._paths.get(url)
        if path is None:
            prefix = f"{self.endpoint}/{self.account}/"
            name = url[len(prefix):] if url.startswith(prefix) else ""
            if not _QUEUE_NAME.match(name):
                raise client_error("The specified queue does not exist.", QUEUE_GONE, 400,
                                   operation)
            if len(self._paths) >= 4096:  # a server's client may name many
                self._paths.clear()
            path = self._paths[url] = self.folder / name
        if not os.path.isfile(f"{path}/queue.json"):
            raise client_error("The specified queue does not exist.", QUEUE_GONE, 400, operation)
        return path

    @_request
    def create_queue(self, **params: Any) -> Dict[str, Any]:
        validate_request("CreateQueue", params, "sqs")
        name = params["QueueName"]
        if not _QUEUE_NAME.match(name):
            raise client_error("Can only include alphanumeric characters, hyphens, or "
                               "underscores. 1 to 80 in length", "InvalidParameterValue", 400,
                               "CreateQueue")
        attributes = {**DEFAULT_ATTRIBUTES, **params.get("Attributes", {})}
        path = self.folder / name
        if (path / "queue.json").is_file():
            return {"QueueUrl": self._url(name)}  # as SQS: the same name again is the same queue
        staging = self.folder / f".new-{name}-{uuid.uuid4().hex}"
        for part in ("ready", "inflight", "tmp", "bells"):
            make_private_dirs(staging / part)
        _write_json(staging / "queue.json", {"Attributes": attributes,
                                             "Tags": params.get("tags", {}),
                                             "Created": time.time()})
        try:
            os.rename(staging, path)
        except OSError:  # created by another process meanwhile: that one stands
            shutil.rmtree(staging, ignore_errors=True)
        return {"QueueUrl": self._url(name)}

    @_request
    def get_queue_url(self, **params: Any) -> Dict[str, Any]:
        validate_request("GetQueueUrl", params, "sqs")
        url = self._url(params["QueueName"])
        self._queue(url, "GetQueueUrl")
        return {"QueueUrl": url}

    @_request
    def list_queues(self, **params: Any) -> Dict[str, Any]:
        validate_request("ListQueues", params, "sqs")
        prefix = params.get("QueueNamePrefix", "")
        names = sorted(entry.name for entry in os.scandir(self.folder)
                       if _QUEUE_NAME.match(entry.name) and entry.name.startswith(prefix))
        answer: Dict[str, Any] = {}
        if "MaxResults" in params:  # paged, as SQS pages only when asked: the token is the
            after = params.get("NextToken", "")  # last name given, so no name is given twice
            names = [name for name in names if name > after]
            most = int(params["MaxResults"])
            if not 1 <= most <= 1000:
                raise client_error("Value for parameter MaxResults is invalid. Reason: Must be "
                                   "between 1 and 1000.", "InvalidParameterValue", 400,
                                   "ListQueues")
            if len(names) > most:
                names = names[:most]
                answer["NextToken"] = names[-1]
        if names:
            answer["QueueUrls"] = [self._url(name) for name in names]
        return answer

    @_request
    def delete_queue(self, **params: Any) -> Dict[str, Any]:
        validate_request("DeleteQueue", params, "sqs")
        path = self._queue(params["QueueUrl"], "DeleteQueue")
        aside = self.folder / f".deleted-{path.name}-{uuid.uuid4().hex}"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            raise client_error("The specified queue does not exist.", QUEUE_GONE, 400,
                               "DeleteQueue") from None
        _ring_once(aside)  # its waiting receivers wake and find it gone
        self._forget(path)
        shutil.rmtree(aside, ignore_errors=True)
        return {}

    @_request
    def get_queue_attributes(self, **params: Any) -> Dict[str, Any]:
        validate_request("GetQueueAttributes", params, "sqs")
        record = self._record(self._queue(params["QueueUrl"], "GetQueueAttributes"))
        wanted = params.get("AttributeNames", [])
        attributes = record["Attributes"]
        if "All" not in wanted:
            attributes = {k: v for k, v in attributes.items() if k in wanted}
        return {"Attributes": attributes}

    @_request
    def tag_queue(self, **params: Any) -> Dict[str, Any]:
        validate_request("TagQueue", params, "sqs")
        path = self._queue(params["QueueUrl"], "TagQueue")
        record = self._record(path)
        record["Tags"] = {**record.get("Tags", {}), **params["Tags"]}
        _write_json(path / "queue.json", record, folder=path / "tmp")
        return {}

    @_request
    def list_queue_tags(self, **params: Any) -> Dict[str, Any]:
        validate_request("ListQueueTags", params, "sqs")
        tags = self._record(self._queue(params["QueueUrl"], "ListQueueTags")).get("Tags", {})
        return {"Tags": dict(tags)} if tags else {}

    def _attributes(self, path: Path) -> Dict[str, Any]:
        """The queue's attributes, read once per queue and client (only TagQueue rewrites the
        record, and it changes no attribute)."""
        known = self._known.get(path)
        if known is None:
            known = self._known[path] = self._record(path)["Attributes"]
        return known

    @staticmethod
    def _record(path: Path) -> Dict[str, Any]:
        with open(path / "queue.json", "rb") as file:
            record = json.loads(file.read(1024 * 1024))
        if not isinstance(record, dict) or not isinstance(record.get("Attributes"), dict):
            raise client_error("the queue's record is damaged", "InternalError", 500)
        return record

    # -- sending -----------------------------------------------------------------------------
    @_request
    def send_message(self, **params: Any) -> Dict[str, Any]:
        validate_request("SendMessage", params, "sqs")
        path = self._queue(params["QueueUrl"], "SendMessage")
        body = params["MessageBody"]
        _check_body(body, "SendMessage")
        message_id, digest = self._put(path, body, int(params.get("DelaySeconds", 0)))
        self._ring(path)
        return {"MessageId": message_id, "MD5OfMessageBody": digest}

    @_request
    def send_message_batch(self, **params: Any) -> Dict[str, Any]:
        validate_request("SendMessageBatch", params, "sqs")
        path = self._queue(params["QueueUrl"], "SendMessageBatch")
        entries = params["Entries"]
        _check_batch(entries, "SendMessageBatch")
        if sum(len(e["MessageBody"].encode("utf-8")) for e in entries) > MAX_BATCH:
            raise client_error(f"Batch requests cannot be longer than {MAX_BATCH} bytes.",
                               "AWS.SimpleQueueService.BatchRequestTooLong", 400,
                               "SendMessageBatch")
        successful = []
        for entry in entries:
            _check_body(entry["MessageBody"], "SendMessageBatch")
            message_id, digest = self._put(path, entry["MessageBody"],
                                           int(entry.get("DelaySeconds", 0)))
            successful.append({"Id": entry["Id"], "MessageId": message_id,
                               "MD5OfMessageBody": digest})
        # once, when all are in place: a ring per entry (or on the first) wakes receivers that
        # take the sender's CPU while it writes the rest, and find one message between them
        self._ring(path)
        return {"Successful": successful, "Failed": []}

    @staticmethod
    def _put(path: Path, body: str, delay: int) -> Tuple[str, str]:
        message_id = uuid.uuid4().hex
        digest = hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()
        now = _now_ns()
        record = {"MessageId": message_id, "Body": body, "MD5OfMessageBody": digest,
                  "SentTimestamp": str(now // 1_000_000)}
        visible = now + delay * 1_000_000_000
        temporary = f"{path}/tmp/{message_id}.tmp"
        _write_json(temporary, record)
        try:
            os.rename(temporary, f"{path}/ready/{visible:020d}.{message_id}.0")
        except FileNotFoundError:  # the queue was deleted meanwhile
            raise client_error("The specified queue does not exist.", QUEUE_GONE, 400,
                               "SendMessage") from None
        return message_id, digest

    # -- receiving ---------------------------------------------------------------------------
    @_request
    def receive_message(self, **params: Any) -> Dict[str, Any]:
        validate_request("ReceiveMessage", params, "sqs")
        url = params["QueueUrl"]
        path = self._queue(url, "ReceiveMessage")
        attributes = self._attributes(path)
        most = int(params.get("MaxNumberOfMessages", 1))
        if not 1 <= most <= 10:
            raise client_error("Value for parameter MaxNumberOfMessages is invalid. Reason: "
                               "Must be between 1 and 10.", "InvalidParameterValue", 400,
                               "ReceiveMessage")
        visibility = int(params.get("VisibilityTimeout", attributes.get("VisibilityTimeout", 30)))
        wait = float(params.get("WaitTimeSeconds",
                                attributes.get("ReceiveMessageWaitTimeSeconds", 0)))
        if not 0 <= wait <= 20:
            raise client_error("Value for parameter WaitTimeSeconds is invalid. Reason: Must "
                               ">= 0 and <= 20.", "InvalidParameterValue", 400, "ReceiveMessage")
        wanted = set(params.get("AttributeNames", [])) | set(
            params.get("MessageSystemAttributeNames", []))
        started = time.monotonic()
        bell = self._take_bell(path) if wait > 0 else None
        try:
            while True:
                if bell is not None:
                    bell.drain()  # before the look: a message sent after it rings again
                try:
                    messages = self._take(path, most, visibility, wanted)
                except FileNotFoundError:  # the queue's folder went away while we looked
                    raise client_error("The specified queue does not exist.", QUEUE_GONE, 400,
                                       "ReceiveMessage") from None
                waited = time.monotonic() - started
                if messages or waited >= wait:
                    return {"Messages": messages} if messages else {}
                if bell is not None:
                    bell.wait(min(BELL_POLL, wait - waited))
                else:
                    time.sleep(min(wait_steps(waited), max(0.0, wait - waited)))
                if not os.path.isfile(f"{path}/queue.json"):
                    raise client_error("The specified queue does not exist.", QUEUE_GONE, 400,
                                       "ReceiveMessage")
        except BaseException:
            if bell is not None:
                bell.close()  # the queue may be gone: a new bell next time
                bell = None
            raise
        finally:
            if bell is not None:
                self._give_bell(path, bell)

    def _take_bell(self, path: Path) -> Optional["_Bell"]:
        """A doorbell of this client's for the queue at ``path`` (one per concurrent receiver,
        kept between receives); None where no FIFO can be made (then the folder is polled)."""
        with self._bells_lock:
            free = self._bells.get(path, [])
            while free:
                bell = free.pop()
                if bell.registered():
                    return bell
                bell.close()  # the queue was deleted (and perhaps made again) meanwhile
        return _Bell.open(path)

    def _forget(self, path: Path) -> None:
        """Close this client's bells and write ends of the queue at ``path`` (deleted)."""
        with self._bells_lock:
            bells = self._bells.pop(path, [])
            ringers = self._ringers.pop(path, {})
        for bell in bells:
            bell.close()
        for fd in ringers.values():
            os.close(fd)

    def _give_bell(self, path: Path, bell: "_Bell") -> None:
        if not bell.registered():  # its queue was deleted meanwhile
            bell.close()
            return
        with self._bells_lock:
            self._bells.setdefault(path, []).append(bell)

    def _ring(self, path: Path) -> None:
        """Wake the receivers waiting on the queue at ``path`` (see _Bell): a byte to each bell
        there, through write ends kept open between rings (a ring is then one write a bell)."""
        try:
            names = os.listdir(f"{path}/bells")
        except OSError:  # the queue is gone
            names = []
        with self._bells_lock:
            ringers = self._ringers.setdefault(path, {})
            for name in set(ringers) - set(names):  # its receiver closed it, or the queue went
                os.close(ringers.pop(name))
            for name in names:
                fd = ringers.get(name)
                if fd is None:
                    fd = _open_bell(f"{path}/bells/{name}")
                    if fd is None:
                        continue
                    ringers[name] = fd
                try:
                    os.write(fd, b"!")
                except BlockingIOError:  # full: it wakes anyway
                    pass
                except OSError:  # no reader left: its receiver died
                    os.close(ringers.pop(name))
                    _unlink(f"{path}/bells/{name}")

    def _take(self, path: Path, most: int, visibility: int, wanted: set) -> List[Dict[str, Any]]:
        ready, inflight = f"{path}/ready", f"{path}/inflight"
        now = _now_ns()
        _return_expired(ready, inflight, now)
        messages: List[Dict[str, Any]] = []
        for name in sorted(os.listdir(ready)):
            if len(messages) >= most:
                break
            parts = name.split(".")
            if len(parts) != 3 or int(parts[0]) > now:  # not visible yet (DelaySeconds)
                continue
            receives = int(parts[2]) + 1
            handle = f"{parts[0]}.{parts[1]}.{receives}.{uuid.uuid4().hex[:16]}"
            deadline = time.time() + visibility
            try:
                os.utime(f"{ready}/{name}", (deadline, deadline))
                os.rename(f"{ready}/{name}", f"{inflight}/{handle}")
            except FileNotFoundError:
                continue  # another receiver took it first
            with open(f"{inflight}/{handle}", "rb") as file:
                # bounded, without a buffer of that bound allocated per message
                if os.fstat(file.fileno()).st_size > 2 * MAX_BODY:
                    continue  # not one of ours (planted): left in flight, never read
                record = json.loads(file.read())
            message = {"MessageId": record["MessageId"], "ReceiptHandle": handle,
                       "MD5OfBody": record["MD5OfMessageBody"], "Body": record["Body"]}
            if wanted:
                attributes = {"ApproximateReceiveCount": str(receives),
                              "SentTimestamp": record["SentTimestamp"]}
                if "All" not in wanted:
                    attributes = {k: v for k, v in attributes.items() if k in wanted}
                if attributes:
                    message["Attributes"] = attributes
            messages.append(message)
        return messages

    @_request
    def change_message_visibility(self, **params: Any) -> Dict[str, Any]:
        validate_request("ChangeMessageVisibility", params, "sqs")
        path = self._queue(params["QueueUrl"], "ChangeMessageVisibility")
        handle = _handle(params["ReceiptHandle"], "ChangeMessageVisibility")
        seconds = int(params["VisibilityTimeout"])
        if not 0 <= seconds <= 43200:
            raise client_error("Value for parameter VisibilityTimeout is invalid. Reason: "
                               "Must be >= 0 and <= 43200.", "InvalidParameterValue", 400,
                               "ChangeMessageVisibility")
        held = path / "inflight" / handle
        try:
            if seconds == 0:
                seq, message_id, receives, _ = handle.split(".")
                os.rename(held, path / "ready" / f"{_now_ns():020d}.{message_id}.{receives}")
                self._ring(path)
            else:
                deadline = time.time() + seconds
                os.utime(held, (deadline, deadline))
        except FileNotFoundError:
            raise client_error("Message does not exist or is not available for visibility "
                               "timeout change.", "AWS.SimpleQueueService.MessageNotInflight",
                               400, "ChangeMessageVisibility") from None
        return {}

    @_request
    def delete_message(self, **params: Any) -> Dict[str, Any]:
        validate_request("DeleteMessage", params, "sqs")
        path = self._queue(params["QueueUrl"], "DeleteMessage")
        _unlink(f"{path}/inflight/{_handle(params['ReceiptHandle'], 'DeleteMessage')}")
        return {}

    @_request
    def delete_message_batch(self, **params: Any) -> Dict[str, Any]:
        validate_request("DeleteMessageBatch", params, "sqs")
        path = self._queue(params["QueueUrl"], "DeleteMessageBatch")
        entries = params["Entries"]
        _check_batch(entries, "DeleteMessageBatch")
        successful, failed = [], []
        for entry in entries:
            if not _HANDLE.match(entry["ReceiptHandle"]):
                failed.append({"Id": entry["Id"], "SenderFault": True,
                               "Code": "ReceiptHandleIsInvalid",
                               "Message": "The input receipt handle is invalid."})
                continue
            _unlink(f"{path}/inflight/{entry['ReceiptHandle']}")
            successful.append({"Id": entry["Id"]})
        return {"Successful": successful, "Failed": failed}


class _Bell:
    """A receiver's doorbell: a FIFO in the queue's bells/ folder, held open for reading (and
    for writing by itself, so it never reads as closed); senders write a byte to every FIFO
    there (``_ring``). A bell whose process died has no reader: its first ringer removes it."""

    def __init__(self, fifo: Path, reader: int, keeper: int) -> None:
        self.fifo = fifo
        self.reader = reader
        self.keeper = keeper
        self.inode = os.fstat(reader).st_ino

    @classmethod
    def open(cls, queue: Path) -> Optional["_Bell"]:
        """A new bell, made in tmp/ and renamed into bells/ once open (a ringer never sees it
        without its reader)."""
        token = uuid.uuid4().hex
        staging, fifo = queue / "tmp" / f"{token}.bell", queue / "bells" / token
        reader = keeper = -1
        try:
            os.makedirs(queue / "bells", mode=0o700, exist_ok=True)
            os.mkfifo(staging, 0o600)
            reader = os.open(staging, os.O_RDONLY | os.O_NONBLOCK)
            keeper = os.open(staging, os.O_WRONLY | os.O_NONBLOCK)
            os.rename(staging, fifo)
        except (OSError, AttributeError):  # no FIFOs here (or no os.mkfifo): the folder is polled
            _unlink(staging)
            for fd in (reader, keeper):
                if fd >= 0:
                    os.close(fd)
            return None
        return cls(fifo, reader, keeper)

    def registered(self) -> bool:
        """Whether senders still find this bell (its queue was not deleted)."""
        try:
            return os.stat(self.fifo).st_ino == self.inode
        except OSError:
            return False

    def drain(self) -> None:
        try:
            while os.read(self.reader, 4096):
                pass
        except BlockingIOError:
            pass

    def wait(self, seconds: float) -> None:
        select.select([self.reader], [], [], max(0.0, seconds))

    def close(self) -> None:
        _unlink(self.fifo)
        for fd in (self.reader, self.keeper):
            os.close(fd)


def _open_bell(fifo: str) -> Optional[int]:
    """A write end of the bell ``fifo``; None when it has no reader (its receiver died: the
    bell is removed) or is gone."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ENXIO:
            _unlink(fifo)
        return None


def _ring_once(path: Path) -> None:
    """Ring every bell of the queue at ``path`` through write ends opened for this once."""
    try:
        names = os.listdir(path / "bells")
    except OSError:
        return
    for name in names:
        fd = _open_bell(f"{path}/bells/{name}")
        if fd is not None:
            try:
                os.write(fd, b"!")
            except OSError:  # full, or no reader left: nothing to wake
                pass
            os.close(fd)


def _return_expired(ready: str, inflight: str, now_ns: int) -> None:
    """In-flight messages whose visibility timeout ended are visible again (receives kept)."""
    now = now_ns / 1e9
    with os.scandir(inflight) as entries:
        for entry in entries:
            try:
                if entry.stat().st_mtime > now:
                    continue
                _seq, message_id, receives, _nonce = entry.name.split(".")
                os.rename(entry.path, f"{ready}/{now_ns:020d}.{message_id}.{receives}")
            except (FileNotFoundError, ValueError):
                continue  # deleted, or taken back by another receiver meanwhile


def _handle(value: str, operation: str) -> str:
    """A receipt handle is one of our file names, never a path."""
    if not _HANDLE.match(value):
        raise client_error("The input receipt handle is invalid.", "ReceiptHandleIsInvalid",
                           400, operation)
    return value


def _unlink(path: Union[str, Path]) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass  # no longer in flight: AWS answers success and deletes nothing


def _check_body(body: str, operation: str) -> None:
    if len(body.encode("utf-8")) > MAX_BODY:
        raise client_error(f"One or more parameters are invalid. Reason: Message must be "
                           f"shorter than {MAX_BODY} bytes.", "InvalidParameterValue", 400,
                           operation)
    if not body:
        raise client_error("The request must contain the parameter MessageBody.",
                           "MissingParameter", 400, operation)


def _check_batch(entries: List[Dict[str, Any]], operation: str) -> None:
    if not entries:
        raise client_error("There should be at least one SendMessageBatchRequestEntry in the "
                           "request.", "AWS.SimpleQueueService.EmptyBatchRequest", 400, operation)
    if len(entries) > 10:
        raise client_error(f"Maximum number of entries per request are 10. You have sent "
                           f"{len(entries)}.", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                           400, operation)
    if len({e["Id"] for e in entries}) != len(entries):
        raise client_error("Id's of BatchRequestEntry should be unique.",
                           "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400, operation)


def _write_json(path: Union[str, Path], record: Dict[str, Any],
                folder: Optional[Path] = None) -> None:
    """``record`` at ``path``, 0600, whole or not at all (through a temporary in ``folder``)."""
    data = json.dumps(record, separators=(",", ":")).encode("utf-8")
    if folder is None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        return
    temporary = folder / f"{uuid.uuid4().hex}.tmp"
    _write_json(temporary, record)
    os.replace(temporary, path)
