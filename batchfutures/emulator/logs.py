"""CloudWatch-Logs-shaped reading of the emulator's log files.

Stream `<definition>/default/<task id>` lives in `<folder>/logs/<definition>/default/<task id>`.
Tokens are line offsets: `f/<n>` forward, `b/<n>` backward; as in CloudWatch, the end is reached
when `nextForwardToken` comes back unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Optional

from botocore.exceptions import ClientError

GROUP = "/aws/batch/job"
DEFAULT_LIMIT = 10_000


def stream_path(folder: Path, stream: str) -> Path:
    parts = [p for p in stream.split("/") if p not in ("", ".", "..")]
    return folder.joinpath(*parts)


class LogsService:
    def __init__(self, folder: Path, service: Any = None) -> None:
        self.folder = folder
        self._service = service

    def get_log_events(self, *, logGroupName: Optional[str] = None, logStreamName: str,
                       startFromHead: Optional[bool] = None, nextToken: Optional[str] = None,
                       limit: Optional[int] = None, startTime: Optional[int] = None,
                       endTime: Optional[int] = None, **_: Any) -> Dict[str, Any]:
        if self._service is not None:
            self._service.faults.maybe_raise("GetLogEvents")
        path = stream_path(self.folder, logStreamName)
        if (logGroupName not in (None, GROUP)) or not path.is_file():
            raise ClientError({"Error": {"Code": "ResourceNotFoundException",
                                         "Message": "The specified log stream does not exist."},
                               "ResponseMetadata": {"HTTPStatusCode": 400}}, "GetLogEvents")
        with open(path, "rb") as handle:
            lines = handle.read().decode("utf-8", "replace").splitlines()
        stamp = int(os.path.getmtime(path) * 1000)
        limit = min(int(limit or DEFAULT_LIMIT), DEFAULT_LIMIT)
        total = len(lines)
        if nextToken:
            direction, _, offset = nextToken.partition("/")
            offset = int(offset or 0)
            if direction == "b":
                start, end = max(0, offset - limit), offset
            else:
                start, end = offset, min(total, offset + limit)
        elif startFromHead:
            start, end = 0, min(total, limit)
        else:
            start, end = max(0, total - limit), total
        events = [{"timestamp": stamp, "message": line, "ingestionTime": stamp}
                  for line in lines[start:end]]
        return {"events": events, "nextForwardToken": f"f/{end}", "nextBackwardToken": f"b/{start}"}
