"""CloudWatch-Logs-shaped reading of the emulator's log files.

Batch names an attempt's stream `<job definition name>/default/<task id>` in the group
`/aws/batch/job`; here the stream is the file `<folder>/logs/<job definition name>/default/<task
id>`, written directly by the attempt's process. Each line is one event. Tokens are byte offsets
into the file (`f/<offset>` reads forward from it, `b/<offset>` backward); as in CloudWatch the end
is reached when `nextForwardToken` comes back unchanged. Only complete lines are returned: the
emulator ends an attempt's file with a newline when the attempt ends.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..workdir import inside, open_private
from .model import LOG_GROUP, client_error, validate_request

GROUP = LOG_GROUP
DEFAULT_LIMIT = 10_000
MAX_BYTES = 1024 * 1024  # CloudWatch returns at most 1 MB of events per call
_PART = re.compile(r"^[A-Za-z0-9_.\-]+$")
_TOKEN = re.compile(r"^([fb])/(\d+)$")


def stream_path(folder: Path, stream: str) -> Optional[Path]:
    """The file of a stream name, or None when the name cannot be a stream of this folder (every
    part a plain name: no ``..``, no empty part, so the path stays under ``folder``)."""
    parts = stream.split("/")
    if not parts or any(p in ("", ".", "..") or not _PART.fullmatch(p) for p in parts):
        return None
    return Path(folder).joinpath(*parts)


def _lines(data: bytes) -> List[bytes]:
    return data.split(b"\n")[:-1] if data else []


class LogsService:
    """`get_log_events` over the log files under `folder`."""

    def __init__(self, folder: Path, service: Any = None) -> None:
        self.folder = Path(folder)
        self._service = service  # the emulator, for its fault injector

    def get_log_events(self, **params: Any) -> Dict[str, Any]:
        operation = "GetLogEvents"
        if self._service is not None:
            self._service.faults.maybe_raise(operation)
        validate_request(operation, params, service="logs")
        group = params.get("logGroupName") or params.get("logGroupIdentifier")
        stream = params["logStreamName"]
        if group is not None and group.rsplit(":log-group:", 1)[-1] != GROUP:
            raise client_error("The specified log group does not exist.",
                               "ResourceNotFoundException", 400, operation)
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

    @staticmethod
    def _complete_size(handle: Any, size: int) -> int:
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
    def _forward(handle: Any, offset: int, size: int, limit: int) -> Tuple[int, int, List[bytes]]:
        handle.seek(offset)
        data = handle.read(min(MAX_BYTES, size - offset))
        lines = _lines(data)[:limit]
        end = offset + sum(len(line) + 1 for line in lines)
        if not lines and len(data) == MAX_BYTES:  # one line longer than a response: cut it
            lines, end = [data], offset + len(data)
        return offset, end, lines

    @staticmethod
    def _backward(handle: Any, offset: int, limit: int) -> Tuple[int, int, List[bytes]]:
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
