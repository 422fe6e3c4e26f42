"""A run's report: one self-contained HTML file (``ex.report(PATH)``, ``batchfutures report JOB
-o FILE.html``), as Nextflow's ``-with-timeline``/``-with-report`` or a Dask performance report.

    gather(env, job_id)  DescribeJobs + ListJobs (jobview.describe_in), each child's result
                         object (its meta's usage, its outcomes: which calls raised and their
                         remote tracebacks; at most MAX_RESULTS_READ objects), the log tail of
                         each child Batch failed (at most MAX_LOG_TAILS)  ->  JobReport
    render(reports)      JobReport(s) -> HTML (pure): per job the status counts, a timeline of
                         every child (queued from the job's creation to its start, then running
                         to its end, coloured by bar_colour: Batch's status, or "a call raised"
                         for a child Batch calls SUCCEEDED whose result holds a call's
                         exception: an inline SVG), usage and memory
                         advice (usage.JobUsage), the calls' estimated cost (costs.estimate of
                         their measured wall time), a table of the children (times, exit code,
                         wall, CPU, peak memory), and each failure with its reason and its log
                         tail or traceback

The file needs nothing at view time: inline CSS and SVG, no script, no link, no font.
"""

from __future__ import annotations

import html
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from . import costs, jobview, wire
from .spending import pricing_of
from .statuses import STATUS_ORDER, JobStatus
from .usage import JobUsage, Totals

if TYPE_CHECKING:
    from .environments import Environment
    from .storage import Storage

__all__ = ["CallRow", "Failure", "JobReport", "MAX_RESULTS_READ", "MAX_LOG_TAILS", "MAX_ROWS",
           "bar_colour", "gather", "render", "write"]

MAX_RESULTS_READ = 1000  # result objects read per job (one GET each)
MAX_LOG_TAILS = 20  # failed children whose log tail is read (one GetLogEvents each)
LOG_TAIL_LINES = 30
MAX_ROWS = 10_000  # children drawn and listed per job
STATUS_COLOURS: Dict[str, str] = {
    "SUBMITTED": "#b0b7c3", "PENDING": "#b0b7c3", "RUNNABLE": "#d9c36b", "STARTING": "#8fb3e0",
    "RUNNING": "#3d7fd9", "SUCCEEDED": "#3a9e5c", "FAILED": "#d0463b",
}
QUEUED_COLOUR = "#e3e6eb"
# a child Batch calls SUCCEEDED (its worker wrote the outcomes) in which a call's function raised:
# the user's failure, which Batch's status does not show
RAISED_COLOUR = "#e8871e"


@dataclass(frozen=True)
class CallRow:
    """One child: Batch's view and, from its result object, what its calls used."""

    index: int
    status: str
    started: Optional[float] = None
    stopped: Optional[float] = None
    exit_code: Optional[int] = None
    reason: Optional[str] = None
    calls: int = 0  # calls measured
    wall_s: Optional[float] = None
    cpu_s: Optional[float] = None
    peak_mib: Optional[float] = None
    raised: int = 0  # calls whose function raised, read from the result object


@dataclass(frozen=True)
class Failure:
    """A child Batch failed (``child`` set, ``item`` None), or a call whose function raised."""

    child: int
    item: Optional[int]
    kind: str  # the exception's type, or Batch's status
    message: str
    detail: str = ""  # the remote traceback, or the log's tail


@dataclass
class JobReport:
    job_id: str
    name: str
    status: str
    created: Optional[float] = None
    started: Optional[float] = None
    stopped: Optional[float] = None
    reason: Optional[str] = None
    counts: Dict[str, int] = field(default_factory=dict)
    rows: List[CallRow] = field(default_factory=list)
    failures: List[Failure] = field(default_factory=list)
    usage: Optional[JobUsage] = None
    notes: List[str] = field(default_factory=list)  # what was left out, and why
    cost_usd: Optional[float] = None  # the calls' measured wall time priced (costs.estimate)
    cost_basis: str = ""

    @property
    def calls_raised(self) -> int:
        return sum(row.raised for row in self.rows)


# -- reading (Batch, storage, logs) -------------------------------------------------------------
def _child_usage(entries: Optional[Sequence[Any]]) -> Totals:
    totals = Totals()
    totals.add_raw(entries or ())
    return totals


def _merge(into: Totals, other: Totals) -> None:
    into.calls += other.calls
    into.wall_s += other.wall_s
    into.cpu_s += other.cpu_s
    peak = other.peak_memory_mib
    if peak is not None and (into.peak_memory_mib is None or peak > into.peak_memory_mib):
        into.peak_memory_mib = peak


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def gather(env: Environment, job_id: str, *, now: Optional[float] = None,
           pricing: Any = None) -> JobReport:
    """What the report shows of one job (see the module docstring); ``pricing``: a
    costs.Pricing (spending.pricing_of(env) when None)."""
    info = jobview.describe_in(env, job_id)
    report = JobReport(info.job_id, info.name, info.status, info.created_at, info.started_at,
                       info.stopped_at, info.status_reason, dict(info.status_counts))
    if info.is_array:
        spans = [(c.index, c.status, c.started_at, c.stopped_at, c.exit_code, c.status_reason)
                 for c in info.children]
    else:
        spans = [(info.array_index or 0, info.status, info.started_at, info.stopped_at,
                  info.exit_code, info.container_reason or info.status_reason)]
        report.counts = {info.status: 1}
    storage = env.storage
    job_url = info.job_url
    if job_url is None and storage is not None:
        job_url = storage.read_job_pointer(info.parent_id)
    chunksize = 1
    if job_url and storage is not None:
        try:
            chunksize = max(1, int(storage.read_header(job_url).get("chunksize") or 1))
        except (FileNotFoundError, ValueError):
            job_url = None
    all_calls = Totals()
    read = 0
    tails = 0
    if len(spans) > MAX_ROWS:
        report.notes.append(f"the first {MAX_ROWS} of {len(spans)} children are shown")
    for index, status, started, stopped, exit_code, reason in spans[:MAX_ROWS]:
        used, raised = Totals(), 0
        if job_url and storage is not None and status == JobStatus.SUCCEEDED:
            if read < MAX_RESULTS_READ:
                read += 1
                used, raised = _read_result(storage, job_url, index, chunksize, report)
            elif read == MAX_RESULTS_READ:
                read += 1
                report.notes.append(f"the result objects of the first {MAX_RESULTS_READ} "
                                    f"children were read: usage and failures cover those")
        if status == JobStatus.FAILED:
            detail = ""
            if tails < MAX_LOG_TAILS:
                tails += 1
                try:
                    detail = _tail(info.log(index if info.is_array else None))
                except Exception as error:  # a log not there (yet), expired, refused
                    detail = f"(the log could not be read: {type(error).__name__})"
            report.failures.append(Failure(index, None, status, reason or "failed", detail))
        _merge(all_calls, used)
        if status == JobStatus.SUCCEEDED:  # ECS's "Essential container in task exited": noise
            reason = None
        report.rows.append(CallRow(index, status, started, stopped, exit_code, reason, used.calls,
                                   used.wall_s if used.calls else None,
                                   used.cpu_s if used.calls else None, used.peak_memory_mib,
                                   raised))
    if all_calls.calls:  # the calls' measured wall time, priced as what ran them
        estimate = costs.estimate(all_calls.wall_s, info.vcpus or 1.0, info.memory_mib or 2048,
                                  pricing if pricing is not None else pricing_of(env))
        report.cost_usd, report.cost_basis = estimate.usd, estimate.basis
    report.usage = JobUsage.of(all_calls, info.vcpus, info.memory_mib,
                               info.run_seconds(time.time() if now is None else now),
                               ended=info.ended)
    return report


def _read_result(storage: Storage, job_url: str, child: int, chunksize: int,
                 report: JobReport) -> Tuple[Totals, int]:
    """One child's result object: its calls' usage and how many raised; those calls join the
    failures."""
    data = storage.read_result(job_url, child)
    if data is None:
        return Totals(), 0
    try:
        meta, outcomes = wire.unpack_result(data)
    except ValueError as error:
        report.failures.append(Failure(child, child * chunksize, "RemoteError",
                                       f"the result object could not be read: {error}"))
        return Totals(), 0
    raised_calls = 0
    for position, outcome in enumerate(outcomes):
        if wire.outcome_kind(outcome) == wire.OK:
            continue
        raised_calls += 1
        _, raised = wire.outcome_result(outcome)
        cause = getattr(raised, "__cause__", None)
        detail = str(cause).strip().strip('"').strip() if cause is not None else ""
        if not detail:
            detail = getattr(raised, "traceback", None) or ""
        report.failures.append(Failure(child, child * chunksize + position, type(raised).__name__,
                                       str(raised), detail))
    usage = meta.get("usage")
    return _child_usage(usage[:len(outcomes)] if isinstance(usage, list) else None), raised_calls


# -- the page (pure) ----------------------------------------------------------------------------
def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _when(epoch: Optional[float]) -> str:
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch))


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2330}
h1{font-size:20px}h2{font-size:17px;margin-top:32px}
table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 10px;border-bottom:1px solid #e3e6eb;
text-align:left;vertical-align:top}th{background:#f4f6f8}
.counts>span,.legend>span{display:inline-block;margin-right:14px}
.legend{font-size:13px;font-weight:normal;margin-left:18px}.swatch{display:inline-block;width:10px;
height:10px;margin-right:4px;border-radius:2px}
pre{background:#f4f6f8;padding:8px;overflow:auto;max-height:320px;font-size:12px}
.note{color:#6b7280}.num{text-align:right;font-variant-numeric:tabular-nums}
"""


def bar_colour(status: str, calls_raised: int) -> str:
    """A child's colour on the timeline: RAISED_COLOUR for a child Batch calls SUCCEEDED in which
    a call raised (what the user sees as a failure), else its Batch status's colour."""
    if status == JobStatus.SUCCEEDED and calls_raised:
        return RAISED_COLOUR
    return STATUS_COLOURS.get(status, "#888")


def _swatch(colour: str) -> str:
    return f'<span class="swatch" style="background:{colour}"></span>'


def _counts(report: JobReport) -> str:
    """Batch's status counts, then how many calls raised (inside children Batch calls
    SUCCEEDED), each with its colour on the timeline."""
    parts = []
    for status in STATUS_ORDER:
        count = report.counts.get(status, 0)
        if count:
            parts.append(f'<span class="status-count" data-status="{_e(status)}">'
                         f"{_swatch(STATUS_COLOURS[status])}{_e(status)}: {count}</span>")
    raised = report.calls_raised
    if raised:
        children = sum(1 for row in report.rows if row.raised)
        parts.append(f'<span class="status-count" data-status="CALLS_RAISED">'
                     f"{_swatch(RAISED_COLOUR)}calls raised: {raised}"
                     f'{"" if children == raised else f" (in {children} of the children)"}</span>')
    return f'<p class="counts">{"".join(parts) or "no children counted"}</p>'


def _legend(report: JobReport) -> str:
    """The colours the timeline draws, named."""
    drawn = {(row.status, bar_colour(row.status, row.raised)) for row in report.rows
             if row.started is not None}
    keys = [("queued", QUEUED_COLOUR)]
    keys += [(status, STATUS_COLOURS[status]) for status in STATUS_ORDER
             if (status, STATUS_COLOURS[status]) in drawn]
    if (JobStatus.SUCCEEDED.value, RAISED_COLOUR) in drawn:
        keys.append(("SUCCEEDED in Batch, a call raised", RAISED_COLOUR))
    return '<span class="legend note">' + "".join(
        f'<span class="key">{_swatch(colour)}{_e(name)}</span>' for name, colour in keys) + "</span>"


def _timeline(report: JobReport, now: float) -> str:
    """An SVG: one line per child, queued (grey, from the job's creation) then running."""
    rows = report.rows
    starts = [r.started for r in rows if r.started is not None]
    origin = min([t for t in [report.created, *starts] if t is not None], default=None)
    if origin is None or not rows:
        return '<p class="note">No child has started yet: no timeline.</p>'
    ends = [r.stopped if r.stopped is not None else now for r in rows if r.started is not None]
    end = max([origin + 1e-3, *ends])
    span = end - origin
    width, left, line = 900, 60, max(2, min(12, 600 // max(1, len(rows))))
    height = line * len(rows) + 30

    def x(epoch: float) -> float:
        return left + (epoch - origin) / span * width

    shapes = []
    for position, row in enumerate(rows):
        y = 20 + position * line
        queued_from = report.created if report.created is not None else origin
        queued_to = row.started if row.started is not None else now
        if queued_to > queued_from:
            shapes.append(f'<rect x="{x(queued_from):.1f}" y="{y}" '
                          f'width="{x(queued_to) - x(queued_from):.1f}" '
                          f'height="{max(1, line - 1)}" fill="{QUEUED_COLOUR}"/>')
        if row.started is not None:
            stop = row.stopped if row.stopped is not None else now
            raised = f", {_raised(row.raised)}" if row.raised else ""
            shapes.append(f'<rect class="run" data-child="{row.index}" data-status="{_e(row.status)}" '
                          f'data-calls-raised="{row.raised}" x="{x(row.started):.1f}" y="{y}" '
                          f'width="{max(1.0, x(stop) - x(row.started)):.1f}" height="{max(1, line - 1)}" '
                          f'fill="{bar_colour(row.status, row.raised)}"><title>child {row.index}: '
                          f'{_e(row.status)}{raised}, {_seconds(stop - row.started)} s</title></rect>')
    axis = (f'<text x="{left}" y="12" font-size="11">0 s</text>'
            f'<text x="{left + width}" y="12" font-size="11" text-anchor="end">{span:.1f} s</text>')
    return (f'<svg class="timeline" width="{left + width + 20}" height="{height}" '
            f'role="img" aria-label="timeline of {len(rows)} children">{axis}{"".join(shapes)}</svg>')


def _raised(count: int) -> str:
    return f"{count} call{'' if count == 1 else 's'} raised"


def _usage(report: JobReport) -> str:
    if report.usage is None:
        return ""
    lines = "".join(f"<li>{_e(line)}</li>" for line in report.usage.lines())
    if report.cost_usd is not None:
        lines += (f'<li class="cost">estimated cost: ${report.cost_usd:.6f} '
                  f"({_e(report.cost_basis)})</li>")
    return f'<ul class="usage">{lines}</ul>'


def _rows(report: JobReport) -> str:
    head = ("<tr><th>child</th><th>status</th><th>started (UTC)</th><th>ended (UTC)</th>"
            "<th>exit</th><th>wall s</th><th>CPU s</th><th>peak MiB</th><th>reason</th></tr>")
    body = "".join(
        f'<tr data-child="{r.index}"><td class="num">{r.index}</td><td>{_e(r.status)}'
        f'{f" ({_raised(r.raised)})" if r.raised else ""}</td>'
        f"<td>{_when(r.started)}</td><td>{_when(r.stopped)}</td>"
        f'<td class="num">{"-" if r.exit_code is None else r.exit_code}</td>'
        f'<td class="num">{_seconds(r.wall_s)}</td><td class="num">{_seconds(r.cpu_s)}</td>'
        f'<td class="num">{"-" if r.peak_mib is None else f"{r.peak_mib:.0f}"}</td>'
        f"<td>{_e(r.reason or '')}</td></tr>" for r in report.rows)
    return f'<table class="children">{head}{body}</table>'


def _failures(report: JobReport) -> str:
    if not report.failures:
        return '<p class="failures none">No failures.</p>'
    parts = []
    for failure in report.failures:
        where = f"child {failure.child}" + (f", call {failure.item}" if failure.item is not None else "")
        detail = f"<pre>{_e(failure.detail)}</pre>" if failure.detail else ""
        parts.append(f'<div class="failure" data-child="{failure.child}"><p><b>{_e(where)}</b>: '
                     f"{_e(failure.kind)}: {_e(failure.message)}</p>{detail}</div>")
    return "".join(parts)


def render(reports: Sequence[JobReport], *, title: str = "batchfutures run",
           now: Optional[float] = None) -> str:
    """The HTML page of one or more jobs' reports (pure: ``now`` is the time a running child
    is drawn up to)."""
    now = time.time() if now is None else now
    sections = []
    for report in reports:
        notes = "".join(f'<p class="note">{_e(note)}</p>' for note in report.notes)
        reason = f"<p>{_e(report.reason)}</p>" if report.reason else ""
        sections.append(
            f'<section class="job" data-job="{_e(report.job_id)}">'
            f"<h2>{_e(report.name)} <small>{_e(report.job_id)}</small>: {_e(report.status)}</h2>"
            f"{reason}<p>created {_when(report.created)} UTC, started {_when(report.started)}, "
            f"ended {_when(report.stopped)}</p>{_counts(report)}"
            f"<h3>Timeline {_legend(report)}</h3>{_timeline(report, now)}"
            f"<h3>Usage</h3>{_usage(report)}"
            f"<h3>Failures</h3>{_failures(report)}"
            f"<h3>Children</h3>{notes}{_rows(report)}</section>")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{_e(title)}</h1><p class=\"note\">{len(reports)} job(s); written "
            f"{_when(now)} UTC.</p>{''.join(sections)}</body></html>")


def write(env: Environment, job_ids: Sequence[str], path: Any, *, title: Optional[str] = None) -> str:
    """Gather each job and write the page to ``path``; returns the path written."""
    now = time.time()
    pricing = pricing_of(env)  # read once (on AWS: the queue's compute environments)
    reports = [gather(env, job_id, now=now, pricing=pricing) for job_id in job_ids]
    page = render(reports, title=title or f"batchfutures run: {', '.join(job_ids) or 'no jobs'}",
                  now=now)
    target = os.fspath(path)
    with open(target, "w", encoding="utf-8") as handle:
        handle.write(page)
    return target
