"""``echo_output="live"`` on warm workers (``keepalive=``): what a warm call prints, on the
client's terminal while it runs, each line prefixed by its call.

A warm worker runs many calls one after another, all in one log stream. With live on (the
pool's config carries a token, ``live``), the worker writes a marker line before and after
each call it runs (worker/warm.py), and its runner's stdout and stderr are line-buffered and
share one pipe, so the lines keep their order in the log:

    batchfutures.call: <token> <n> begin
    ...what call n printed...
    batchfutures.call: <token> <n> end

``CallSplitter`` (pure) splits a worker's stream by call: the lines between a call's begin and
its end are that call's; lines between calls (a new runner's initializer, the worker's notes)
are nobody's; a begin while a call is open (its runner died before its end) opens the new call.
A marker is recognized only with the pool's token, so a call that prints something that looks
like one stays that call's line; a marker at the end of a line (the call's last line had no
newline) still counts, the text before it being the call's.

``WarmLive`` (one per warm pool) is what the session's one LiveTail reads: each round, the
pool's RUNNING workers (as the pool's own DescribeJobs watch last saw them: no request of its
own) and, per worker, a line router that labels each line of a call with what the user knows
it by (``item k`` of a map, ``call n`` of a submit). Which way a call's output reaches the
client is decided once, under its lock: a call that resolves on a worker the LiveTail already
follows is not echoed again (its lines come from the stream, the last ones up to a round after
its result); a call that resolves on a worker not followed yet is echoed then, and its lines
are skipped if the worker is followed later.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from . import warmwire
from .logforward import LINE_PREFIX
from .statuses import FINISHED, JobStatus

__all__ = ["read_marker", "CallSplitter", "label_for", "WarmLive", "LABELS_KEPT"]

# the markers' format is the pool's and the worker's (warmwire.call_marker); it starts with
# batchfutures' own prefix, so LiveTail's shown() hides a marker too
MARKER, BEGIN, END = warmwire.CALL_MARKER, warmwire.CALL_BEGIN, warmwire.CALL_END
LABELS_KEPT = 100_000  # labels of the latest calls kept for the router (older: "call <n>")

Route = Callable[[str], Optional[str]]  # a raw log line -> the text to write, or None


def read_marker(line: str, token: str) -> Tuple[str, Optional[Tuple[int, str]]]:
    """(the text before the marker, (call number, edge)) when ``line`` ends with a well-formed
    marker of ``token``; else (``line``, None). Only the pool's token counts (a call printing
    a marker-like line without it stays that call's line)."""
    if not token:
        return line, None
    head = f"{MARKER}{token} "
    at = line.rfind(head)
    if at < 0:
        return line, None
    fields = line[at + len(head):].split(" ")
    if len(fields) != 2 or fields[1] not in (BEGIN, END) or not fields[0].isdigit() or \
            not fields[0].isascii():
        return line, None
    return line[:at], (int(fields[0]), fields[1])


class CallSplitter:
    """One worker's stream split by call (pure; keeps its place across reads: a read may end
    in the middle of a call)."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.current: Optional[int] = None  # the call open (between its begin and its end)

    def split(self, lines: Iterable[str]) -> List[Tuple[int, str]]:
        """(call number, line) for the lines of calls, in order; the others dropped."""
        found: List[Tuple[int, str]] = []
        for line in lines:
            before, marker = read_marker(line, self.token)
            if marker is None:
                if self.current is not None:
                    found.append((self.current, line))
                continue
            if before and self.current is not None:  # the call's last line, without newline
                found.append((self.current, before))
            number, edge = marker
            if edge == BEGIN:  # also when a call is open: its runner died before its end
                self.current = number
            elif number == self.current:  # an end closes only its own call
                self.current = None
        return found


def label_for(mapped: bool, number: int, first_item: int, items: int) -> str:
    """What a call's lines are prefixed with: a map's child by its items' positions (``item
    k``, ``items k-m`` for a chunk), a submit by the pool's call number (``call n``)."""
    if not mapped:
        return f"call {number}"
    if items <= 1:
        return f"item {first_item}"
    return f"items {first_item}-{first_item + items - 1}"


class WarmLive:
    """One warm pool's side of the session's LiveTail (see module doc)."""

    def __init__(self, token: str, statuses: Callable[[], Dict[str, str]],
                 shown: Callable[[str], bool]) -> None:
        self.token = token
        self._statuses = statuses  # () -> the pool's workers' last statuses (none once closed)
        self._shown = shown  # livetail.shown: batchfutures' own lines are not the call's
        self._lock = threading.Lock()
        self._labels: "collections.OrderedDict[int, str]" = collections.OrderedDict()
        self._routes: Dict[str, Route] = {}  # workers followed and RUNNING: their routers
        self._followed: Set[str] = set()  # workers ever handed to the LiveTail
        self._echoed: Dict[str, Set[int]] = {}  # per worker not followed yet: calls echoed

    def label(self, number: int, label: str) -> None:
        """Call ``number``'s label (as it is sent)."""
        with self._lock:
            self._labels[number] = label
            while len(self._labels) > LABELS_KEPT:
                self._labels.popitem(last=False)

    def label_of(self, number: int) -> str:
        with self._lock:
            return self._labels.get(number) or f"call {number}"

    def echo_at_end(self, number: int, worker: Optional[str]) -> bool:
        """As call ``number`` resolves (it ran on ``worker``): True when its output is echoed
        now (its worker is not followed: its lines are skipped if it is later), False when it
        comes from the stream."""
        with self._lock:
            if worker is not None and worker in self._followed:
                return False
            if worker is not None:
                self._echoed.setdefault(worker, set()).add(number)
            return True

    def routes(self) -> Dict[str, Route]:
        """The pool's workers RUNNING now, each with its line router (the same one every
        round); from its first round a worker's calls' output is the stream's."""
        statuses = self._statuses()
        with self._lock:
            for worker, status in statuses.items():
                if status == JobStatus.RUNNING and worker not in self._routes:
                    self._routes[worker] = self._router(
                        worker, frozenset(self._echoed.pop(worker, ())))
                    self._followed.add(worker)
            for worker in [w for w in self._routes if statuses.get(w) != JobStatus.RUNNING]:
                del self._routes[worker]  # ended: the LiveTail reads it to its end once more
            for worker in [w for w in self._echoed if statuses.get(w) in FINISHED or
                           w not in statuses]:  # ended before it was ever followed
                del self._echoed[worker]
            return dict(self._routes)

    def _router(self, worker: str, skipped: FrozenSet[int]) -> Route:
        splitter = CallSplitter(self.token)

        def route(line: str) -> Optional[str]:
            # a call's logging record's line goes on as it is (LiveTail replays it through the
            # client's handlers, in order with the prints); the call's own lines get its prefix
            shown = [text if text.startswith(LINE_PREFIX) else
                     f"[{worker} {self.label_of(number)}] {text}"
                     for number, text in splitter.split([line])
                     if number not in skipped and (self._shown(text) or text.startswith(LINE_PREFIX))]
            return "\n".join(shown) if shown else None

        return route
