"""``BatchExecutor(..., echo_output="live")``: what running calls print, on the client's terminal
while they run, each line prefixed by its call.

    worker  header "live": its stdout and stderr line-buffered (calls.initialize), so each line
            reaches the container's log (CloudWatch Logs; the emulator's log files) as printed
    client  one LiveTail thread per executor, a round every INTERVAL seconds:
              the session's outstanding jobs -> their RUNNING children (ListJobs of at most
              LISTINGS_PER_ROUND array jobs a round, taking turns; DescribeJobs for the plain
              ones, 100 ids a request) -> each new child's log stream (DescribeJobs, once)
            then one of two readers (``reader_for``):
            StartLiveTail (AWS)  one session per log group in use, by the group's ARN (the
                   child's job ARN gives partition, Region and account), filtered to the stream
                   prefixes of the definitions in use (Batch names a stream <definition>/default/
                   <task id>; at most MAX_PREFIXES, else the whole group) and, on the client, to
                   the children followed; a thread per session hands each sessionUpdate's events
                   to their child. A child's earlier lines, and those of a gap between two
                   sessions, are read once with GetLogEvents after its session has started
                   ("catch-up"); a line both read that way and streamed is shown once (``fresh``).
                   CloudWatch samples a session past 500 events a second: said once. A session
                   times out after 3 hours: reopened (``after_end``); closed when its group has
                   no child followed (it is billed per minute).
            GetLogEvents  (the emulator; a group where StartLiveTail is refused: ``refusal``)
                   each followed child's stream from its kept forward token, at most
                   STREAMS_PER_ROUND streams a round (GetLogEvents' quota is 10 requests a second
                   per account and Region): beyond that the children take turns (``choose``) and
                   a note says the output is sampled
            a child seen ended is read on (GetLogEvents, from its last line shown) until a
            read brings nothing, at most SETTLE_READS rounds (CloudWatch's lag), then dropped

Warm workers (keepalive=) are followed in the same rounds and budget, known RUNNING from their
pool's own watch, each line routed to its call (``add_source``: warmlive.py).

The lines batchfutures' own worker writes (``batchfutures.``: its notes, the logging records it
keeps for the client) are not shown; a record's line (``batchfutures.log: `` and its JSON) is
replayed through the client's handlers where it falls among the call's lines
(logforward.replay_line); a warm call's records reach them when it resolves. What was streamed
is not echoed or replayed again when the call resolves; a call's last lines may follow its
future's resolution by one round.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from itertools import islice
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Deque,
    Dict,
    Iterable,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    cast,
)
from urllib.parse import urlsplit

from botocore.exceptions import EndpointConnectionError

from . import batchapi, jobdetail, logforward
from .logs import NOT_FOUND, SETTLE_READS, Cursor, LiveTailAPI, events_after, log_group_of
from .statuses import JobStatus

if TYPE_CHECKING:
    from .environments import Environment

__all__ = ["LIVE", "INTERVAL", "STREAMS_PER_ROUND", "LiveTail", "choose", "shown", "prefixed",
           "POLL", "LIVE_TAIL", "reader_for", "stream_prefix", "group_arn", "session_request",
           "session_plan", "refusal", "after_end", "fresh", "settled", "SETTLE_READS"]

logger = logging.getLogger("batchfutures")

LIVE = "live"  # echo_output's value
INTERVAL = 1.0
STREAMS_PER_ROUND = 5
LISTINGS_PER_ROUND = 5  # array jobs listed a round (ListJobs): the poller's Batch budget is shared
_OWN_PREFIX = "batchfutures."

POLL, LIVE_TAIL = "GetLogEvents", "StartLiveTail"  # the two readers
# logStreamNamePrefixes named in one session (botocore's model allows 100; a run uses one or two
# definitions, and beyond this the session takes the whole group, filtered here)
MAX_PREFIXES = 5
MAX_FAILURES = 3  # sessions in a row that fail before starting: the group falls back to POLL
SEEN_WINDOW_MS = 60_000  # lines shown are remembered this long (by their time) to show each once
PENDING_STREAMS = 100  # streams not (yet) followed whose streamed events are kept, the latest
READ_PART = 1000  # events of a GetLogEvents read shown at a time
PENDING_UPDATES = 60  # updates kept per such stream, the latest (a minute's: one a second)
# error codes that mean StartLiveTail will not serve this group: read it with GetLogEvents
REFUSALS = frozenset({
    "AccessDeniedException", "AccessDenied",  # the policy has no logs:StartLiveTail on the group
    "LimitExceededException",  # the account's concurrent Live Tail sessions are all in use
    "InvalidOperationException", "InvalidParameterException", "ResourceNotFoundException",
    "UnknownOperationException", "NotImplemented", "404", "501",  # an endpoint without it
})
ENDED, TIMED_OUT, FAILED = "ended", "timed out", "failed"  # how a session ended
REOPEN, FALL_BACK = "reopen", "fall back"


# -- decisions (pure) ------------------------------------------------------------------------
def choose(keys: Sequence[str], start: int, budget: int) -> Tuple[List[str], int]:
    """Up to ``budget`` of ``keys``, taking turns from ``start``; (chosen, next start) (pure)."""
    if not keys or budget <= 0:
        return [], 0
    if len(keys) <= budget:
        return list(keys), 0
    start %= len(keys)
    chosen = [keys[(start + i) % len(keys)] for i in range(budget)]
    return chosen, (start + budget) % len(keys)


def shown(line: str) -> bool:
    """Whether a log line is the call's own output (not the worker's notes or kept records)."""
    return not line.startswith(_OWN_PREFIX)


def prefixed(child_id: str, line: str) -> str:
    return f"[{child_id}] {line}"


def _aws_suffixes() -> Tuple[str, ...]:
    """The DNS suffixes of AWS's endpoints, every partition's (botocore's partitions data)."""
    from botocore.loaders import create_loader  # start-up: ~130 ms; read once, on AWS only

    suffixes: Set[str] = set()
    for partition in create_loader().load_data("partitions")["partitions"]:
        outputs = partition.get("outputs") or {}
        suffixes.update(filter(None, (outputs.get("dnsSuffix"), outputs.get("dualStackDnsSuffix"))))
    return tuple(sorted(suffixes))


def reader_for(is_local: bool, endpoint_url: str, inject_host_prefix: bool,
               aws_suffixes: Iterable[str]) -> Tuple[str, str]:
    """(POLL or LIVE_TAIL, why). StartLiveTail's requests go to its host prefix on the Logs
    endpoint (``stream-logs.<region>.amazonaws.com``; botocore's model says "stream-", older
    SDKs "streaming-"): on an endpoint of the user's own (AWS_ENDPOINT_URL...) that names
    another host, so it is tried there only with botocore's AWS_DISABLE_HOST_PREFIX_INJECTION."""
    if is_local:
        return POLL, "the emulator's logs"
    host = (urlsplit(endpoint_url).hostname or "").lower()
    on_aws = any(host == suffix or host.endswith("." + suffix) for suffix in aws_suffixes)
    if inject_host_prefix and not on_aws:
        return POLL, (f"StartLiveTail's host prefix does not reach the Logs endpoint {endpoint_url} "
                      f"(set AWS_DISABLE_HOST_PREFIX_INJECTION=true if it serves StartLiveTail)")
    return LIVE_TAIL, "StartLiveTail"


def stream_prefix(stream: str) -> str:
    """The prefix of the streams of a stream's definition: Batch names a job's stream
    ``<definition name>/default/<task id>``, so ``<definition name>/``."""
    head, slash, _ = stream.partition("/")
    return head + slash if slash else stream


def group_arn(job_arn: str, group: str) -> Optional[str]:
    """The log group's ARN in the job's partition, Region and account (StartLiveTail names
    groups by ARN); None when ``job_arn`` is not an ARN."""
    parts = (job_arn or "").split(":")
    if len(parts) < 6 or parts[0] != "arn":
        return None
    partition, region, account = parts[1], parts[3], parts[4]
    if not (partition and region and account):
        return None
    return f"arn:{partition}:logs:{region}:{account}:log-group:{group}"


def session_request(arn: str, prefixes: Iterable[str]) -> Dict[str, Any]:
    """The StartLiveTail request of one group's session: its streams of the definitions in use,
    or the whole group past MAX_PREFIXES (the client keeps the children's lines only)."""
    wanted = sorted(set(prefixes))
    request: Dict[str, Any] = {"logGroupIdentifiers": [arn]}
    if 0 < len(wanted) <= MAX_PREFIXES:
        request["logStreamNamePrefixes"] = wanted
    return request


def session_plan(open_request: Optional[Dict[str, Any]], arn: Optional[str],
                 prefixes: Iterable[str]) -> str:
    """What a group's session should do now: "keep", "open", "reopen" (its request no longer
    covers the definitions in use) or "close" (no child followed in the group)."""
    wanted = set(prefixes)
    if arn is None or not wanted:
        return "close" if open_request is not None else "keep"
    if open_request is None:
        return "open"
    if open_request["logGroupIdentifiers"] != [arn]:
        return "reopen"
    named = open_request.get("logStreamNamePrefixes")
    if named is None:  # the whole group: covers any prefix; narrowed again once few enough
        return "reopen" if len(wanted) <= MAX_PREFIXES else "keep"
    return "keep" if wanted <= set(named) else "reopen"


def refusal(error: BaseException) -> Optional[str]:
    """Why StartLiveTail will not serve (the group is then read with GetLogEvents), or None for
    a failure worth another session (throttling, a broken connection, a server error)."""
    if isinstance(error, AttributeError):
        return "this botocore has no StartLiveTail"
    code = batchapi.error_code(error)
    if code in REFUSALS:
        return code
    if batchapi.http_status(error) == 403:  # an answer botocore could not parse: forbidden
        return "AccessDenied (HTTP 403)"
    if isinstance(error, EndpointConnectionError):
        return f"its endpoint is not reachable ({error})"
    return None


def after_end(how: str, failures: int) -> str:
    """After a session ended ``how``, with ``failures`` sessions in a row that failed before
    starting: REOPEN, or FALL_BACK to GetLogEvents."""
    if how in (ENDED, TIMED_OUT):  # the 3-hour timeout, or the stream closed: a new session
        return REOPEN
    return FALL_BACK if failures >= MAX_FAILURES else REOPEN


EventKey = Tuple[int, int, str]  # timestamp, ingestionTime, message


def fresh(events: Sequence[Dict[str, Any]], seen: Dict[EventKey, int],
          counts: Optional[Counter] = None) -> Tuple[List[Dict[str, Any]], Dict[EventKey, int]]:
    """The events of one batch (one read, or one session update) not shown before, and what is
    seen after them. An event is known by its time, ingestion time and text; a batch holding
    the same one n times shows as many as the largest earlier batch did not (so a line both
    read and streamed shows once, and two equal lines printed at once both show). Events older
    than SEEN_WINDOW_MS before the batch's newest are forgotten, the first seen first (about
    time order). ``seen`` is updated where it is and returned (a copy a part would make a long
    read quadratic). ``counts``: the batch's so far, when it comes in parts (a read's pages),
    updated and forgotten with ``seen`` (a read is not kept whole)."""
    counts = counts if counts is not None else Counter()
    new: List[Dict[str, Any]] = []
    newest: Optional[int] = None
    for event in events:
        key = (int(event.get("timestamp") or 0), int(event.get("ingestionTime") or 0),
               str(event.get("message", "")))
        newest = key[0] if newest is None else max(newest, key[0])
        counts[key] += 1
        if counts[key] > seen.get(key, 0):
            seen[key] = counts[key]
            new.append(event)
    stale: List[EventKey] = []
    if newest is not None:  # one pass a batch (an iterator per key rescans the emptied front)
        for key in seen:
            if key[0] >= newest - SEEN_WINDOW_MS:
                break
            stale.append(key)
    for key in stale:
        del seen[key]
        counts.pop(key, None)
    return new, seen


# -- the thread ------------------------------------------------------------------------------
def settled(got: int, reads_after_end: int) -> bool:
    """Whether an ended child's stream is read to its end: its last read brought nothing, or
    it was read SETTLE_READS times since it ended (CloudWatch Logs may show a job's last lines
    a little after it ended; logs.follow waits for them the same way) (pure)."""
    return got == 0 or reads_after_end >= SETTLE_READS


@dataclass
class _Followed:
    group: str
    stream: str
    arn: Optional[str] = None  # the group's ARN (StartLiveTail), None: read with GetLogEvents
    cursor: Cursor = field(default_factory=Cursor)
    seen: Dict[EventKey, int] = field(default_factory=dict)
    last_ms: Optional[int] = None  # the time of the last line shown
    ended: bool = False
    caught_up: bool = False  # read up to its group's session's start: its streamed lines show
    started: Optional[int] = None  # its attempt's startedAt, as a round first saw it running
    reads_after_end: int = 0


class LiveTail:
    """The thread that streams running calls' output (see the module docstring)."""

    def __init__(self, env: "Environment", outstanding: Callable[[], List[Any]], *,
                 write: Optional[Callable[[str], None]] = None, interval: float = INTERVAL,
                 streams_per_round: int = STREAMS_PER_ROUND) -> None:
        self._env = env
        self._outstanding = outstanding  # () -> the session's TrackedJobs not finished
        self._write = write or _write_stdout
        self._interval = interval
        self._budget = streams_per_round
        self._followed: Dict[str, _Followed] = {}
        self._turn = 0
        self._job_turn = 0
        self._listed: Dict[str, Set[str]] = {}  # array job -> its children RUNNING when last listed
        self._started: Dict[str, int] = {}  # child -> its attempt's startedAt, as this round saw it
        self._sampled_said = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._streamed: Set[str] = set()  # children followed: not echoed when they resolve
        self._echoed: Set[str] = set()  # children echoed as they resolved: never followed
        # add_source: jobs followed besides the outstanding jobs' children (warm workers), each
        # with the router of its lines (a raw line -> the text to write, or None): warmlive.py
        self._sources: List[Callable[[], Dict[str, Callable[[str], Optional[str]]]]] = []
        self._routes: Dict[str, Callable[[str], Optional[str]]] = {}
        # StartLiveTail: the sessions, and what they hand over (under _show_lock)
        self._show_lock = threading.RLock()
        self._sessions: Dict[str, _Session] = {}
        self._refused: Dict[str, str] = {}  # group -> why StartLiveTail does not serve it
        self._by_stream: Dict[Tuple[str, str], str] = {}  # (group, stream) -> child
        self._done: Set[Tuple[str, str]] = set()  # streams of children dropped: ignored
        # each update's events kept apart: `fresh` counts equal lines within one update
        self._pending: "OrderedDict[Tuple[str, str], Deque[List[Dict[str, Any]]]]" = OrderedDict()
        self._live_sampled_said = False
        self.counts: Counter = Counter()  # sessions started, events streamed, lines shown by reader
        self.reader: Optional[str] = None  # POLL or LIVE_TAIL, decided at the first read
        self._live_logs: Optional[LiveTailAPI] = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="batchfutures-live",
                                                daemon=True)
                self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """Stop after a last round (the ended calls' last lines); ``wait``: until it is done."""
        self._stop.set()
        thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)
        if thread is None:
            self._close_sessions()

    def add_source(self, routes: Callable[[], Dict[str, Callable[[str], Optional[str]]]]) -> None:
        """More jobs to follow, in the same rounds and budget: each round ``routes()`` gives
        those running now, each with the router its lines go through (warm workers)."""
        with self._lock:
            self._sources.append(routes)

    def echo_at_end(self, child_id: str) -> bool:
        """As a call resolves: True when its output was not streamed (the caller echoes it;
        it is then never streamed), False when it was (its records were replayed as read)."""
        with self._lock:
            if child_id in self._streamed:
                return False
            self._echoed.add(child_id)
            return True

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._round_logged(final=False)
                self._stop.wait(self._interval)
            # the calls followed, read to their end (settled: a few rounds at most)
            for _ in range(SETTLE_READS):
                self._round_logged(final=True)
                if not self._followed:
                    break
                # the emulator's logs are whole once a process ended; CloudWatch's lag
                time.sleep(0 if self._env.is_local else self._interval)
        finally:
            self._close_sessions()

    def _round_logged(self, final: bool) -> None:
        try:
            self.round(final=final)
        except Exception:  # a refused or failed read: the next round tries again
            logger.debug("live output: a round failed", exc_info=True)

    # -- one round ---------------------------------------------------------------------------
    def _running(self) -> Set[str]:
        """The child job ids running now, of the outstanding jobs, and the sources' jobs."""
        batch = self._env.batch
        running: Set[str] = set()
        plain: List[str] = []
        arrays: List[str] = []
        for job in self._outstanding():
            (arrays if getattr(job, "array", False) else plain).append(job.job_id)
        listed, self._job_turn = choose(arrays, self._job_turn, LISTINGS_PER_ROUND)
        self._started = {}
        for job_id in listed:
            self._listed[job_id] = set()
            for summary in batchapi.list_children(batch, job_id, JobStatus.RUNNING.value):
                if summary.get("jobId"):
                    self._listed[job_id].add(summary["jobId"])
                    self._started[summary["jobId"]] = int(summary.get("startedAt") or 0)
        for job_id in list(self._listed):
            if job_id in arrays:  # not listed this round: as it was when last listed
                running |= self._listed[job_id]
            else:
                del self._listed[job_id]
        for description in batchapi.describe_jobs(batch, plain) if plain else []:
            if description.get("status") == JobStatus.RUNNING.value:
                running.add(description.get("jobId", ""))
                self._started[description.get("jobId", "")] = int(description.get("startedAt") or 0)
        with self._lock:
            sources = list(self._sources)
        for source in sources:
            routes = source()
            with self._show_lock:
                self._routes.update(routes)
            running |= set(routes)
        return running

    def round(self, final: bool = False) -> None:
        running = self._running() if not final else set()
        with self._lock:
            new = sorted(child for child in running
                         if child and child not in self._followed and child not in self._echoed)
        for description in batchapi.describe_jobs(self._env.batch, new) if new else []:
            stream = jobdetail.log_stream(description)
            with self._lock:  # from now on its output is this thread's to show, when it has a
                # stream (a multi-node job has none: its nodes do; echoed as it resolves)
                stream = stream if description["jobId"] not in self._echoed else None
                if stream:
                    self._streamed.add(description["jobId"])
            if stream:
                group = log_group_of(description, self._env.log_group)
                self.follow(description["jobId"], group, stream,
                            job_arn=str(description.get("jobArn") or ""))
        # a child Batch retried between two rounds (its attempt's start moved): the last
        # attempt's stream is read to its end now, the next one followed from the next round
        # (or echoed, should it resolve before)
        with self._lock, self._show_lock:
            for child, followed in self._followed.items() if not final else []:
                now = self._started.get(child) or None
                if followed.started is None:
                    followed.started = now
                elif now is not None and now != followed.started:
                    running.discard(child)
                    self._streamed.discard(child)
        self.set_running(running)
        self.read_round()

    # -- reading (the round's second half; the AWS-path tests drive it directly) -------------
    def _decide(self) -> str:
        """Which reader serves this environment (once, on this thread: it makes the client)."""
        if self.reader is None:
            self.reader, why = POLL, "the emulator's logs"
            if not self._env.is_local:
                # an AWS environment's logs are boto3's client: the one place it is taken as the
                # LiveTail seam (a botocore without the operation is refused at its first session)
                client = cast(LiveTailAPI, self._env.logs)
                self.reader, why = reader_for(False, str(client.meta.endpoint_url),
                                              bool(client.meta.config.inject_host_prefix),
                                              _aws_suffixes())
                self._live_logs = client if self.reader == LIVE_TAIL else None
            logger.debug("live output reads with %s (%s)", self.reader, why)
        return self.reader

    def follow(self, child: str, group: str, stream: str, *, job_arn: str = "") -> None:
        """Show ``child``'s lines from now on (its stream ``group``/``stream``)."""
        arn = group_arn(job_arn, group) if self._decide() == LIVE_TAIL else None
        with self._show_lock:
            self._followed[child] = _Followed(group, stream, arn)
            self._by_stream[(group, stream)] = child
            self._done.discard((group, stream))

    def set_running(self, running: Set[str]) -> None:
        """The children running now: the others followed have ended (read to their end next)."""
        with self._show_lock:
            for child, followed in self._followed.items():
                followed.ended = child not in running

    def read_round(self) -> None:
        """One round's reads: sessions opened or closed for the groups in use, the children's
        catch-up reads, the polled ones (taking turns), the ended ones to their end."""
        self._plan_sessions()
        with self._show_lock:
            ended = [child for child, f in self._followed.items() if f.ended]
            live = [child for child, f in self._followed.items() if not f.ended]
            streaming = [child for child in live if self._streaming(self._followed[child])]
            catch_up = [child for child in streaming if not self._followed[child].caught_up
                        and self._sessions[self._followed[child].group].starts]
            polled = [child for child in live if child not in streaming]
        # catch-up reads share the GetLogEvents budget (at least one a round); the rest wait,
        # their streamed lines kept
        catch_up = catch_up[:max(1, self._budget - len(ended))]
        budget = max(0, self._budget - len(ended) - len(catch_up))
        chosen, self._turn = choose(polled, self._turn, budget)
        if len(polled) > len(chosen) and not self._sampled_said:
            self._sampled_said = True
            self._write(f"[batchfutures: {len(polled)} calls print at once; their live output is "
                        f"sampled, {self._budget} streams a second (future.log() has all of it)]\n")
        got: Dict[str, int] = {}
        for child in ended + catch_up + chosen:
            try:
                got[child] = self._read(child)
            except Exception:  # one child's failing read (a group the policy may not read)
                # holds up no other's; an ended one is dropped all the same
                logger.debug("live output: reading %s failed", child, exc_info=True)
        with self._show_lock:
            for child in ended:
                followed = self._followed[child]
                followed.reads_after_end += 1
                if not settled(got.get(child, 0), followed.reads_after_end):
                    continue  # its last lines may still be on their way: read again next round
                del self._followed[child]
                self._routes.pop(child, None)
                self._by_stream.pop((followed.group, followed.stream), None)
                self._done.add((followed.group, followed.stream))
                self._pending.pop((followed.group, followed.stream), None)

    def _streaming(self, followed: _Followed) -> bool:
        session = self._sessions.get(followed.group)
        return session is not None and followed.group not in self._refused

    def _read(self, child: str) -> int:
        """GetLogEvents of a child's stream from where its lines shown end; then, for a child
        whose session has started, the streamed events kept for it, and it is caught up. The
        number of events the read brought."""
        got = 0
        with self._show_lock:
            followed = self._followed.get(child)
            if followed is None:
                return got
            session = self._sessions.get(followed.group)
            # after its session's start (the last one, or one since ended: the next start asks
            # for another catch-up), what the read missed is streamed or kept
            started = session is not None and session.starts > 0 and self._streaming(followed)
            counts: Counter = Counter()  # one read, shown part by part (never held whole)
            events = events_after(self._env.logs, followed.group, followed.stream,
                                  followed.cursor, start_time_ms=followed.last_ms)
            try:
                while part := list(islice(events, READ_PART)):
                    got += len(part)
                    self._show(child, followed, part, POLL, counts)
            except Exception as error:
                if batchapi.error_code(error) != NOT_FOUND:
                    raise
                # no stream yet (made with the attempt's first line): nothing to show
            if started:
                for update in self._pending.pop((followed.group, followed.stream), None) or []:
                    self._show(child, followed, update, LIVE_TAIL)
                followed.caught_up = True
        return got

    def _show(self, child: str, followed: _Followed, events: List[Dict[str, Any]],
              reader: str, counts: Optional[Counter] = None) -> None:
        if self.reader == POLL:  # the one reader, each read going on from its forward token:
            new = list(events)  # nothing read twice (the emulator's stamps are its file's time)
        else:
            new, followed.seen = fresh(events, followed.seen, counts)
        if not new:
            return
        followed.last_ms = max(int(e.get("timestamp") or 0) for e in new)
        if reader == LIVE_TAIL:
            followed.cursor = Cursor()  # the next read goes on from last_ms, not the old token
        lines = [str(e.get("message", "")) for e in new]
        route = self._routes.get(child)  # a source's job (add_source): its router says
        self.counts[f"lines by {reader}"] += len(lines)
        if route:  # a warm worker's stream: its router prefixes each call's lines
            lines = [routed for line in lines if (shown_lines := route(line)) is not None
                     for routed in shown_lines.split("\n")]
        pending: List[str] = []  # a call's own stream: a record's line is replayed where it falls
        for line in lines:
            if route and not line.startswith(logforward.LINE_PREFIX):
                pending.append(line + "\n")  # prefixed by the router
            elif line.startswith(logforward.LINE_PREFIX):
                if pending:
                    self._write("".join(pending))
                pending = []
                logforward.replay_line(line)  # through the client's handlers (its records)
            elif shown(line):
                pending.append(prefixed(child, line) + "\n")
        if pending:
            self._write("".join(pending))

    # -- StartLiveTail sessions --------------------------------------------------------------
    def _plan_sessions(self) -> None:
        if self._live_logs is None:
            return
        with self._show_lock:
            groups: Dict[str, Tuple[Optional[str], Set[str]]] = {}
            for followed in self._followed.values():
                if followed.ended or followed.arn is None or followed.group in self._refused:
                    continue
                _, prefixes = groups.setdefault(followed.group, (followed.arn, set()))
                prefixes.add(stream_prefix(followed.stream))
            for group in set(self._sessions) | set(groups):
                session = self._sessions.get(group)
                arn, prefixes = groups.get(group, (None, set()))
                plan = session_plan(session.request if session else None, arn, prefixes)
                if plan in ("close", "reopen") and session is not None:
                    session.close()
                    del self._sessions[group]
                if plan in ("open", "reopen") and arn is not None:
                    self._sessions[group] = _Session(self, self._live_logs, group,
                                                     session_request(arn, prefixes)).begin()
                    for followed in self._followed.values():
                        if followed.group == group:
                            followed.caught_up = False

    def _session_started(self, session: "_Session") -> None:
        with self._show_lock:
            self.counts["sessions"] += 1
            session.starts += 1
            for followed in self._followed.values():  # the gap before it: read once more
                if followed.group == session.group:
                    followed.caught_up = False

    def _dispatch(self, session: "_Session", update: Dict[str, Any]) -> None:
        """A sessionUpdate: each event to its child (a child not caught up yet, or a stream not
        followed yet, keeps it for later); the sampling said once."""
        by_stream: Dict[str, List[Dict[str, Any]]] = {}
        for event in update.get("sessionResults") or []:
            by_stream.setdefault(str(event.get("logStreamName", "")), []).append(event)
        with self._show_lock:
            if self._sessions.get(session.group) is not session:
                return  # closed or replaced: its successor reads on
            sampled = (update.get("sessionMetadata") or {}).get("sampled")
            if sampled and not self._live_sampled_said:
                self._live_sampled_said = True
                self._write("[batchfutures: more than 500 lines a second; CloudWatch Live Tail "
                            "samples the live output (future.log() has all of it)]\n")
            for stream, events in by_stream.items():
                key = (session.group, stream)
                self.counts["events streamed"] += len(events)
                child = self._by_stream.get(key)
                followed = self._followed.get(child) if child else None
                if followed is not None and followed.caught_up:
                    self._show(cast(str, child), followed, events, LIVE_TAIL)
                elif key not in self._done:
                    kept = self._pending.pop(key, None) or deque(maxlen=PENDING_UPDATES)
                    kept.append(events)
                    self._pending[key] = kept  # the latest streams last
                    while len(self._pending) > PENDING_STREAMS:
                        self._pending.popitem(last=False)

    def _refuse(self, session: "_Session", why: str) -> None:
        with self._show_lock:
            if self._sessions.get(session.group) is session:
                del self._sessions[session.group]
            self._refused[session.group] = why
            for followed in self._followed.values():
                if followed.group == session.group:
                    followed.cursor = Cursor()  # read on from the last line shown
        logger.info("live output of log group %s: StartLiveTail refused (%s); reading it with "
                    "GetLogEvents", session.group, why)

    def _close_sessions(self) -> None:
        with self._show_lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.close()


class _Session:
    """One StartLiveTail session of a log group, on its own thread: opened again when it ends
    (after INTERVAL), until closed or refused."""

    def __init__(self, owner: LiveTail, logs: LiveTailAPI, group: str,
                 request: Dict[str, Any]) -> None:
        self.owner, self.logs, self.group, self.request = owner, logs, group, request
        self.starts = 0  # sessionStart events received
        self._closed = threading.Event()
        self._stream: Any = None

    def begin(self) -> "_Session":
        threading.Thread(target=self._run, name=f"batchfutures-live-tail {self.group}",
                         daemon=True).start()
        return self

    def close(self) -> None:
        """End the session (closing its stream ends it on the service: no StopLiveTail)."""
        self._closed.set()
        stream = self._stream
        if stream is not None:
            try:
                stream.close()
            except Exception:  # already closed by the service
                pass

    def _run(self) -> None:
        failures = 0
        while not self._closed.is_set():
            how = ENDED
            try:
                response = batchapi.call(self.logs.start_live_tail, **self.request)
                self._stream = response["responseStream"]
                if self._closed.is_set():
                    self._stream.close()
                    return
                for event in self._stream:
                    if self._closed.is_set():
                        return
                    if "sessionStart" in event:
                        failures = 0
                        self.owner._session_started(self)
                    elif "sessionUpdate" in event:
                        self.owner._dispatch(self, event["sessionUpdate"])
            except Exception as error:
                if self._closed.is_set():
                    return
                why = refusal(error)
                if why is not None:
                    self.owner._refuse(self, why)
                    return
                code = batchapi.error_code(error)
                how = TIMED_OUT if code == "SessionTimeoutException" else FAILED
                failures += 0 if how == TIMED_OUT else 1
                logger.debug("live output: the session of %s %s", self.group, how, exc_info=True)
            finally:
                self._stream = None
            if after_end(how, failures) == FALL_BACK:
                self.owner._refuse(self, f"{failures} sessions in a row failed")
                return
            self._closed.wait(self.owner._interval)


def _write_stdout(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except Exception:  # a closed terminal: the output stays in the job's log
        pass
