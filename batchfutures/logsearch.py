"""``ex.logs(search=TEXT, failed_only=True)``: the lines of a run's logs, across its children.

    the executor's jobs ─> jobview.describe_in: each job's children (failed_only: those Batch
                           failed and those with a call that raised, from the result objects)
        ─> DescribeJobs (100 ids a request): each child's log stream (its latest attempt's)
        ─> FilterLogEvents (CloudWatch Logs; the emulator's LogsService alike), 100 streams a
           request, the text as a quoted term (``filter_pattern``) so CloudWatch returns only
           matching events; every page (nextToken), bounded by batchapi.Pages
        ─> LogLine(job_id, index, timestamp, message), in job, child and time order

The text is matched as a literal substring, case-sensitive, as CloudWatch matches a quoted
term; each line CloudWatch returns is checked again here. Text CloudWatch cannot quote (with a
double quote or a backslash) is filtered here only: every event of the streams is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple

from . import batchapi, jobdetail
from .logforward import readable_line
from .logs import log_group_of
from .statuses import JobStatus

if TYPE_CHECKING:
    from .environments import Environment

__all__ = ["LogLine", "filter_pattern", "children_to_search", "search", "STREAMS_PER_REQUEST"]

STREAMS_PER_REQUEST = 100  # FilterLogEvents' logStreamNames: at most 100
MAX_PAGES = 10_000


@dataclass(frozen=True)
class LogLine:
    """One line of a call's log: the child's job id, its array index (None for a plain job),
    when CloudWatch stamped it (epoch seconds) and the line."""

    job_id: str
    index: Optional[int]
    timestamp: Optional[float]
    message: str

    def __str__(self) -> str:
        return f"{self.job_id}: {self.message}"


def filter_pattern(text: Optional[str]) -> Optional[str]:
    """FilterLogEvents' filterPattern for a literal ``text`` (a quoted term), or None to read
    every event (no text, or text a quoted term cannot hold)."""
    if not text or '"' in text or "\\" in text:
        return None
    return f'"{text}"'


def children_to_search(size: int, failed_children: Iterable[int], failed_only: bool) -> List[int]:
    """The array indices whose logs are read (pure): all, or only the failed ones, in order."""
    if failed_only:
        return sorted({i for i in failed_children if 0 <= i < max(size, 1)})
    return list(range(size))


def _targets(env: "Environment", job_id: str, failed_only: bool) -> List[Tuple[str, Optional[int]]]:
    """(child job id, index) of one job whose logs are read."""
    # start-up: jobview costs ~2.7 ms on `from batchfutures import BatchExecutor`, which imports
    # this module for search_logs; only a search reads a job's view
    from .jobview import describe_in, failed_calls

    info = describe_in(env, job_id)
    failed = [c.index for c in info.children if c.status == JobStatus.FAILED]
    if failed_only:
        calls = failed_calls(env.storage, info)
        if calls is not None:
            failed += [call.child for call in calls.failed]
    if not info.is_array:
        wanted = not failed_only or info.status == JobStatus.FAILED or bool(failed)
        return [(info.job_id, info.array_index)] if wanted else []
    return [(f"{info.parent_id}:{i}", i) for i in children_to_search(info.size, failed, failed_only)]


def search(env: "Environment", job_ids: Iterable[str], text: Optional[str] = None,
           failed_only: bool = False) -> List[LogLine]:
    """The log lines of the jobs' children (see the module docstring) containing ``text`` (all
    lines when None)."""
    targets: List[Tuple[str, Optional[int]]] = []
    for job_id in job_ids:
        targets += _targets(env, job_id, failed_only)
    streams: Dict[str, Dict[str, Tuple[int, str, Optional[int]]]] = {}  # group -> stream -> who
    order = {child: position for position, (child, _) in enumerate(targets)}
    indices = dict(targets)
    for description in batchapi.describe_jobs(env.batch, [child for child, _ in targets]):
        child = description.get("jobId", "")
        stream = jobdetail.log_stream(description)
        if not stream or child not in order:
            continue
        group = log_group_of(description, env.log_group)
        streams.setdefault(group, {})[stream] = (order[child], child, indices.get(child))
    pattern = filter_pattern(text)
    found: List[Tuple[int, float, LogLine]] = []
    for group, named in streams.items():
        names = sorted(named)
        for start in range(0, len(names), STREAMS_PER_REQUEST):
            request: Dict[str, Any] = {"logGroupName": group,
                                       "logStreamNames": names[start:start + STREAMS_PER_REQUEST]}
            if pattern is not None:
                request["filterPattern"] = pattern
            for page in batchapi.paginate(env.logs.filter_log_events, max_pages=MAX_PAGES, **request):
                for event in page.get("events", []):
                    message = readable_line(str(event.get("message", "")).rstrip("\n"))
                    if text and text not in message:
                        continue
                    who = named.get(event.get("logStreamName", ""))
                    if who is None:
                        continue
                    stamp = event.get("timestamp")
                    seconds = stamp / 1000.0 if isinstance(stamp, (int, float)) else None
                    found.append((who[0], seconds or 0.0,
                                  LogLine(who[1], who[2], seconds, message)))
    found.sort(key=lambda item: (item[0], item[1]))
    return [line for _, _, line in found]
