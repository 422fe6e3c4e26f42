"""CloudWatch-Logs-shaped reading of the emulator's log files: GetLogEvents, FilterLogEvents,
DescribeLogStreams, DescribeLogGroups.

Batch names an attempt's stream `<job definition name>/default/<task id>` in the group
`/aws/batch/job`; here the stream is the file `<folder>/logs/<job definition name>/default/<task
id>`, written directly by the attempt's process. Each line is one event. Tokens are byte offsets
into the file (`f/<offset>` reads forward from it, `b/<offset>` backward); as in CloudWatch the end
is reached when `nextForwardToken` comes back unchanged. Only complete lines are returned: the
emulator ends an attempt's file with a newline when the attempt ends.

FilterLogEvents searches the group's streams (named, by prefix, or all) in timestamp order (a
stream's events all carry its file's modification time), with CloudWatch's unstructured filter
patterns: terms that must all appear, "quoted phrases", ?terms of which one must appear, -terms
that must not, and %regular expression%. JSON (`{...}`) and space-delimited (`[...]`) patterns
are refused as not emulated. Its token names the stream and byte offset to go on from.

DescribeLogStreams lists the group's streams (the files), by name or by last event time (a
file's modification time), with a prefix (not with LastEventTime, as CloudWatch refuses);
its token names the last stream of the page. DescribeLogGroups knows the one group.
"""

from __future__ import annotations

import base64
import json
import os
import re
import stat as stat_module
import zlib
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Protocol, Tuple

from ..workdir import inside, open_private
from .model import ACCOUNT, LOG_GROUP, REGION, client_error, validate_request

if TYPE_CHECKING:  # pragma: no cover
    from .faults import FaultInjector

GROUP = LOG_GROUP
DEFAULT_LIMIT = 10_000
DESCRIBE_LIMIT = 50  # DescribeLogStreams and DescribeLogGroups: at most (and by default) 50
GROUP_ARN = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{GROUP}"
MAX_BYTES = 1024 * 1024  # CloudWatch returns at most 1 MB of events per call
_PART = re.compile(r"^[A-Za-z0-9_.\-]+$")
_TOKEN = re.compile(r"^([fb])/(\d+)$")
_TERM = re.compile(r'([?-]?)(?:"((?:[^"\\]|\\.)*)"|(\S+))')


def stream_path(folder: Path, stream: str) -> Optional[Path]:
    """The file of a stream name, or None when the name cannot be a stream of this folder (every
    part a plain name: no ``..``, no empty part, so the path stays under ``folder``)."""
    parts = stream.split("/")
    if not parts or any(p in ("", ".", "..") or not _PART.fullmatch(p) for p in parts):
        return None
    return Path(folder).joinpath(*parts)


def _lines(data: bytes) -> List[bytes]:
    return data.split(b"\n")[:-1] if data else []


class FaultSource(Protocol):
    """What the logs service needs of its emulator (a BatchEmulator): its fault injector."""

    @property
    def faults(self) -> FaultInjector: ...


class LogsService:
    """`get_log_events` over the log files under `folder`."""

    def __init__(self, folder: Path, service: Optional[FaultSource] = None) -> None:
        self.folder = Path(folder)
        self._service = service  # the emulator, for its fault injector

    def _begin(self, operation: str, params: Dict[str, Any]) -> None:
        """What every call does first: the fault profile's injected errors, then botocore's
        validation of the request."""
        if self._service is not None:
            self._service.faults.maybe_raise(operation)
        validate_request(operation, params, service="logs")

    def get_log_events(self, **params: Any) -> Dict[str, Any]:
        operation = "GetLogEvents"
        self._begin(operation, params)
        group = params.get("logGroupName") or params.get("logGroupIdentifier")
        stream = params["logStreamName"]
        _check_group(group, operation)
        path = stream_path(self.folder, stream)
        try:  # a plain file under the folder, opened without following a symlink
            if path is None or not inside(self.folder, path) or not path.is_file():
                raise FileNotFoundError(stream)
            handle = os.fdopen(open_private(path, os.O_RDONLY), "rb")
        except OSError:
            raise client_error("The specified log stream does not exist.",
                               "ResourceNotFoundException", 400, operation) from None
        limit = min(int(params.get("limit") or DEFAULT_LIMIT), DEFAULT_LIMIT)
        token = params.get("nextToken")
        with handle:
            size = self._complete_size(handle, handle.seek(0, os.SEEK_END))
            stamp = int(os.fstat(handle.fileno()).st_mtime * 1000)
            if token:
                match = _TOKEN.fullmatch(token)
                if match is None:
                    raise client_error("The specified nextToken is invalid.",
                                       "InvalidParameterException", 400, operation)
                forward, offset = match.group(1) == "f", min(int(match.group(2)), size)
            else:
                forward = bool(params.get("startFromHead"))
                offset = 0 if forward else size
            if forward:
                start, end, lines = self._forward(handle, offset, size, limit)
            else:
                start, end, lines = self._backward(handle, offset, limit)
        start_time, end_time = params.get("startTime"), params.get("endTime")
        if (start_time is not None and stamp < start_time) or (end_time is not None and stamp >= end_time):
            lines = []
        events = [{"timestamp": stamp, "message": line.decode("utf-8", "replace").rstrip("\r"),
                   "ingestionTime": stamp} for line in lines]
        return {"events": events, "nextForwardToken": f"f/{end}", "nextBackwardToken": f"b/{start}"}

    def filter_log_events(self, **params: Any) -> Dict[str, Any]:
        operation = "FilterLogEvents"
        self._begin(operation, params)
        _one_group(params, operation)
        names, prefix = params.get("logStreamNames"), params.get("logStreamNamePrefix")
        if names is not None and prefix is not None:
            raise client_error("logStreamNames and logStreamNamePrefix cannot both be specified.",
                               "InvalidParameterException", 400, operation)
        match = _pattern(params.get("filterPattern") or "", operation)
        limit = int(params.get("limit") or DEFAULT_LIMIT)
        forward = params.get("startFromHead", True) is not False
        resume: Optional[Tuple[str, int, int]] = None  # stream, its stamp then, byte offset
        if params.get("nextToken"):
            forward, resume = _read_token(params["nextToken"], operation)
        start_time, end_time = params.get("startTime"), params.get("endTime")
        streams = [(stamp, stream, path) for stamp, stream, path in self._streams(names, prefix)
                   if (start_time is None or stamp >= start_time)
                   and (end_time is None or stamp <= end_time)]
        streams.sort(key=lambda item: (item[0], item[1]), reverse=not forward)
        offsets: Dict[str, int] = {}
        if resume is not None:  # the token's stream from its offset, then the ones after it
            key = (resume[1], resume[0])
            later = [s for s in streams if ((s[0], s[1]) > key if forward else (s[0], s[1]) < key)
                     and s[1] != resume[0]]
            again = [s for s in streams if s[1] == resume[0]]
            streams, offsets = again + later, {resume[0]: resume[2]}
        events: List[Dict[str, Any]] = []
        budget = MAX_BYTES  # bytes of events a page holds (CloudWatch counts 26 per event)
        for index, (stamp, stream, path) in enumerate(streams):
            try:
                handle = os.fdopen(open_private(path, os.O_RDONLY), "rb")
            except OSError:
                continue  # deleted since it was listed (the job's record expired)
            with handle:
                size = self._complete_size(handle, handle.seek(0, os.SEEK_END))
                offset = min(offsets.get(stream, 0 if forward else size), size)
                full = False
                while not full and (offset < size if forward else offset > 0):
                    spans = self._spans(handle, offset, size, forward)
                    for begin, end, line in spans:
                        cost = len(line) + 26
                        if len(events) >= limit or (events and cost > budget):
                            full = True
                            break
                        message = line.decode("utf-8", "replace").rstrip("\r")
                        if match(message):
                            budget -= cost
                            events.append({"logStreamName": stream, "timestamp": stamp,
                                           "message": message, "ingestionTime": stamp,
                                           "eventId": _event_id(stamp, stream, begin)})
                        offset = end if forward else begin
                    if not spans:
                        break
                unread = offset < size if forward else offset > 0
            full = full or len(events) >= limit
            if full and (unread or index + 1 < len(streams)):
                following = streams[index + 1] if index + 1 < len(streams) else None
                position = ((stream, stamp, offset) if unread or following is None
                            else (following[1], following[0], -1))
                return {"events": events, "searchedLogStreams": [],
                        "nextToken": _write_token(forward, position)}
        return {"events": events, "searchedLogStreams": []}

    def describe_log_streams(self, **params: Any) -> Dict[str, Any]:
        operation = "DescribeLogStreams"
        self._begin(operation, params)
        _one_group(params, operation)
        prefix = params.get("logStreamNamePrefix")
        by_time = params.get("orderBy") == "LastEventTime"
        if by_time and prefix is not None:
            raise client_error("Cannot order by LastEventTime with a logStreamNamePrefix.",
                               "InvalidParameterException", 400, operation)
        limit = _describe_limit(params.get("limit"), operation)
        descending = bool(params.get("descending"))
        streams = sorted(((stamp if by_time else 0, stream, path)
                          for stamp, stream, path in self._streams(None, prefix)),
                         key=lambda item: (item[0], item[1]), reverse=descending)
        if params.get("nextToken"):  # the streams after the token's, in this order
            after = _read_page_token(params["nextToken"], by_time, descending, operation)
            streams = [s for s in streams
                       if ((s[0], s[1]) < after if descending else (s[0], s[1]) > after)]
        page = streams[:limit]
        found = [self._stream_detail(stream, path) for _, stream, path in page]
        response: Dict[str, Any] = {"logStreams": [f for f in found if f is not None]}
        if len(streams) > limit:
            last = page[-1]
            response["nextToken"] = _page_token(by_time, descending, (last[0], last[1]))
        return response

    def _stream_detail(self, stream: str, path: Path) -> Optional[Dict[str, Any]]:
        """A LogStream: its times from the file (every event carries the modification time)."""
        try:
            found = os.lstat(path)
        except OSError:
            return None  # deleted since it was listed (the job's record expired)
        stamp = int(found.st_mtime * 1000)
        detail: Dict[str, Any] = {
            "logStreamName": stream,
            "creationTime": min(stamp, int(found.st_ctime * 1000)),
            "arn": f"{GROUP_ARN}:log-stream:{stream}",
            "storedBytes": 0,  # CloudWatch has reported 0 here since 2019
        }
        if found.st_size:
            detail.update(firstEventTimestamp=stamp, lastEventTimestamp=stamp,
                          lastIngestionTime=stamp)
        return detail

    def describe_log_groups(self, **params: Any) -> Dict[str, Any]:
        operation = "DescribeLogGroups"
        self._begin(operation, params)
        prefix, pattern = params.get("logGroupNamePrefix"), params.get("logGroupNamePattern")
        identifiers = params.get("logGroupIdentifiers")
        if sum(value is not None for value in (prefix, pattern, identifiers)) > 1:
            raise client_error("Only one of logGroupNamePrefix, logGroupNamePattern and "
                               "logGroupIdentifiers may be specified.",
                               "InvalidParameterException", 400, operation)
        _describe_limit(params.get("limit"), operation)
        if params.get("nextToken"):  # no answer ever has one: the one group fits any page
            raise client_error("The specified nextToken is invalid.",
                               "InvalidParameterException", 400, operation)
        wanted = ((prefix is None or GROUP.startswith(prefix))
                  and (pattern is None or pattern.lower() in GROUP.lower())
                  and (identifiers is None or any(i in (GROUP, GROUP_ARN, f"{GROUP_ARN}:*")
                                                  for i in identifiers))
                  and ACCOUNT in (params.get("accountIdentifiers") or [ACCOUNT])
                  and params.get("logGroupClass", "STANDARD") == "STANDARD")
        if not wanted:
            return {"logGroups": []}
        try:
            created = int(os.stat(self.folder).st_ctime * 1000)
        except OSError:
            created = 0
        return {"logGroups": [{
            "logGroupName": GROUP, "creationTime": created, "metricFilterCount": 0,
            "arn": f"{GROUP_ARN}:*", "logGroupArn": GROUP_ARN, "storedBytes": 0,
            "logGroupClass": "STANDARD",
        }]}

    def _spans(self, handle: IO[bytes], offset: int, size: int, forward: bool
               ) -> List[Tuple[int, int, bytes]]:
        """(start, end, line) of the next lines from `offset`, in reading order."""
        if forward:
            start, stop, lines = self._forward(handle, offset, size, 1000)
        else:
            start, stop, lines = self._backward(handle, offset, 1000)
        spans, position = [], start
        for line in lines:
            end = min(position + len(line) + 1, stop)  # (a cut line has no newline)
            spans.append((position, end, line))
            position = end
        return spans if forward else spans[::-1]

    def _streams(self, names: Optional[List[str]], prefix: Optional[str]
                 ) -> Iterator[Tuple[int, str, Path]]:
        """(timestamp, name, path) of each stream asked for that exists: a plain file under
        the folder, never reached through a symlink."""
        if names is not None:
            candidates: Iterator[str] = iter(dict.fromkeys(names))
        else:
            candidates = self._stream_names(prefix or "")
        for stream in candidates:
            path = stream_path(self.folder, stream)
            if path is None or not inside(self.folder, path):
                continue
            try:
                found = os.lstat(path)
            except OSError:
                continue
            if stat_module.S_ISREG(found.st_mode):
                yield int(found.st_mtime * 1000), stream, path

    def _stream_names(self, prefix: str) -> Iterator[str]:
        """Stream names starting with `prefix`, walking only the folder its full parts name."""
        parts = prefix.split("/")[:-1]  # the complete folder names of the prefix
        if any(p in ("", ".", "..") or not _PART.fullmatch(p) for p in parts):
            return
        top = self.folder.joinpath(*parts)
        for root, folders, files in os.walk(top, followlinks=False):
            folders[:] = sorted(f for f in folders if not f.startswith("."))
            base = os.path.relpath(root, self.folder).replace(os.sep, "/")
            for file in sorted(files):
                stream = file if base == "." else f"{base}/{file}"
                if not file.startswith(".") and stream.startswith(prefix):
                    yield stream

    @staticmethod
    def _complete_size(handle: IO[bytes], size: int) -> int:
        """Bytes up to the last newline: what follows is a line still being written."""
        position = size
        while position > 0:
            block = min(position, 64 * 1024)
            handle.seek(position - block)
            newline = handle.read(block).rfind(b"\n")
            if newline >= 0:
                return position - block + newline + 1
            position -= block
        return 0

    @staticmethod
    def _forward(handle: IO[bytes], offset: int, size: int, limit: int) -> Tuple[int, int, List[bytes]]:
        handle.seek(offset)
        data = handle.read(min(MAX_BYTES, size - offset))
        lines = _lines(data)[:limit]
        end = offset + sum(len(line) + 1 for line in lines)
        if not lines and len(data) == MAX_BYTES:  # one line longer than a response: cut it
            lines, end = [data], offset + len(data)
        return offset, end, lines

    @staticmethod
    def _backward(handle: IO[bytes], offset: int, limit: int) -> Tuple[int, int, List[bytes]]:
        begin = max(0, offset - MAX_BYTES)
        handle.seek(begin)
        data = handle.read(offset - begin)
        if begin > 0:  # the first line read may be cut: start after its end
            cut = data.find(b"\n")
            data = data[cut + 1:] if cut >= 0 else b""
            begin = offset - len(data)
        lines = _lines(data)[-limit:] if limit else []
        start = offset - sum(len(line) + 1 for line in lines)
        return start, offset, lines


def _one_group(params: Dict[str, Any], operation: str) -> None:
    """A call that names its group by name or by identifier, exactly one of them, and ours."""
    name, identifier = params.get("logGroupName"), params.get("logGroupIdentifier")
    if (name is None) == (identifier is None):
        raise client_error("Specify either logGroupName or logGroupIdentifier, but not both.",
                           "InvalidParameterException", 400, operation)
    _check_group(name or identifier, operation)


def _check_group(group: Optional[str], operation: str) -> None:
    if group is not None and group.rsplit(":log-group:", 1)[-1] != GROUP:
        raise client_error("The specified log group does not exist.",
                           "ResourceNotFoundException", 400, operation)


def _event_id(stamp: int, stream: str, offset: int) -> str:
    """A stable, unique event id of digits, as CloudWatch's: time, stream, byte offset."""
    return f"{stamp:013d}{zlib.crc32(stream.encode()):010d}{offset:016d}"


def _write_token(forward: bool, position: Tuple[str, int, int]) -> str:
    stream, stamp, offset = position
    text = json.dumps({"d": "f" if forward else "b", "s": stream, "t": stamp, "o": offset})
    return base64.urlsafe_b64encode(text.encode()).decode("ascii")


def _read_token(token: str, operation: str) -> Tuple[bool, Tuple[str, int, int]]:
    """(forward, (stream, stamp, offset)) of a FilterLogEvents token (offset -1: the start of
    the stream in the token's direction)."""
    try:
        found = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
        forward, stream, stamp, offset = found["d"] == "f", found["s"], found["t"], found["o"]
        if not (isinstance(stream, str) and isinstance(stamp, int) and isinstance(offset, int)):
            raise ValueError(token)
    except (ValueError, KeyError, TypeError):
        raise client_error("The specified nextToken is invalid.",
                           "InvalidParameterException", 400, operation) from None
    if offset < 0:  # the stream's start in this direction
        offset = 0 if forward else 2 ** 62
    return forward, (stream, stamp, offset)


def _describe_limit(limit: Optional[int], operation: str) -> int:
    if limit is None:
        return DESCRIBE_LIMIT
    if not 1 <= limit <= DESCRIBE_LIMIT:
        raise client_error(f"1 validation error detected: Value '{limit}' at 'limit' failed to "
                           f"satisfy constraint: Member must have value less than or equal to "
                           f"{DESCRIBE_LIMIT}", "InvalidParameterException", 400, operation)
    return limit


def _page_token(by_time: bool, descending: bool, last: Tuple[int, str]) -> str:
    text = json.dumps({"o": "t" if by_time else "n", "d": descending, "t": last[0], "s": last[1]})
    return base64.urlsafe_b64encode(text.encode()).decode("ascii")


def _read_page_token(token: str, by_time: bool, descending: bool, operation: str) -> Tuple[int, str]:
    """(stamp, stream) of the last stream of the page before; the token must come from a
    request with the same order."""
    try:
        found = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
        stamp, stream = found["t"], found["s"]
        if (found["o"] != ("t" if by_time else "n") or found["d"] is not descending
                or not isinstance(stamp, int) or not isinstance(stream, str)):
            raise ValueError(token)
    except (ValueError, KeyError, TypeError):
        raise client_error("The specified nextToken is invalid.",
                           "InvalidParameterException", 400, operation) from None
    return stamp, stream


def _pattern(pattern: str, operation: str) -> Callable[[str], bool]:
    """A matcher for CloudWatch's unstructured filter pattern syntax (see the module doc)."""
    text = pattern.strip()
    if not text or text == '""':
        return lambda message: True
    if text.startswith("{") or text.startswith("["):
        raise client_error("JSON and space-delimited filter patterns are not emulated.",
                           "InvalidParameterException", 400, operation)
    if len(text) > 1 and text.startswith("%") and text.endswith("%"):
        try:
            regex = re.compile(text[1:-1])
        except re.error as error:
            raise client_error(f"Invalid filter pattern: {error}", "InvalidParameterException",
                               400, operation) from None
        return lambda message: regex.search(message) is not None
    required: List[str] = []
    either: List[str] = []
    excluded: List[str] = []
    for sign, quoted, plain in _TERM.findall(text):
        term = re.sub(r"\\(.)", r"\1", quoted) if quoted or not plain else plain
        {"": required, "?": either, "-": excluded}[sign].append(term)

    def match(message: str) -> bool:
        return (all(t in message for t in required)
                and (not either or any(t in message for t in either))
                and not any(t in message for t in excluded))

    return match
