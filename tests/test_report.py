"""The run report: one self-contained HTML page (batchfutures.report)."""

import html.parser
import re

import pytest

from batchfutures import report
from batchfutures.usage import JobUsage, Totals

T0 = 1_700_000_000.0


class Page(html.parser.HTMLParser):
    """What a browser would build: elements with their attributes, and the text."""

    def __init__(self, text):
        super().__init__()
        self.elements = []
        self.text = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def all(self, tag, **attrs):
        return [a for t, a in self.elements if t == tag
                and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())]


def _job(**changes):
    rows = [
        report.CallRow(0, "SUCCEEDED", T0 + 1, T0 + 5, 0, None, 1, 4.0, 3.5, 120.0),
        report.CallRow(1, "FAILED", T0 + 2, T0 + 3, 137, "OutOfMemoryError: Container killed"),
        report.CallRow(2, "RUNNING", T0 + 4, None),
        report.CallRow(3, "RUNNABLE"),
        # Batch says SUCCEEDED (the worker wrote the outcomes), but the call's function raised
        report.CallRow(4, "SUCCEEDED", T0 + 2, T0 + 4, 0, None, 1, 2.0, 1.0, 90.0, raised=1),
    ]
    totals = Totals()
    totals.calls, totals.cpu_s, totals.wall_s, totals.peak_memory_mib = 1, 3.5, 4.0, 120.0
    job = report.JobReport(
        job_id="job-1", name="map-square", status="RUNNING", created=T0, started=T0 + 1,
        counts={"SUCCEEDED": 2, "FAILED": 1, "RUNNING": 1, "RUNNABLE": 1}, rows=rows,
        failures=[report.Failure(1, None, "FAILED", "OutOfMemoryError: Container killed",
                                 "allocating <10 GiB>\nKilled"),
                  report.Failure(4, 4, "ValueError", "bad <input>",
                                 'Traceback (most recent call last):\n  File "/u/script.py", line 3')],
        usage=JobUsage.of(totals, 1.0, 2048, 9.0, ended=False), cost_usd=0.0001,
        cost_basis="Fargate x86_64, test prices")
    for name, value in changes.items():
        setattr(job, name, value)
    return job


def test_page_shows_counts_timeline_usage_failures_and_children():
    page = Page(report.render([_job()], title="my run", now=T0 + 10))
    text = "".join(page.text)
    # the status counts
    counts = {a["data-status"] for a in page.all("span") if "data-status" in a}
    assert counts == {"SUCCEEDED", "FAILED", "RUNNING", "RUNNABLE", "CALLS_RAISED"}
    assert "FAILED: 1" in text and "SUCCEEDED: 2" in text and "calls raised: 1" in text
    # the timeline: a run bar for each started child, coloured by status, or by its call's
    # outcome where Batch says SUCCEEDED and the call raised; none for a queued one
    bars = {a["data-child"]: a for a in page.all("rect") if a.get("class") == "run"}
    assert set(bars) == {"0", "1", "2", "4"}
    assert bars["1"]["fill"] == report.STATUS_COLOURS["FAILED"]
    assert bars["0"]["fill"] == report.STATUS_COLOURS["SUCCEEDED"]
    assert bars["4"]["fill"] == report.RAISED_COLOUR
    assert bars["4"]["data-status"] == "SUCCEEDED" and bars["4"]["data-calls-raised"] == "1"
    # the legend names each colour drawn, the raising call's too
    legend = [a["style"] for a in page.all("span") if a.get("class") == "swatch"]
    assert legend.count(f"background:{report.RAISED_COLOUR}") == 2  # its count and its key
    assert "SUCCEEDED in Batch, a call raised" in text
    assert "SUCCEEDED (1 call raised)" in text  # the children's table
    # a running child is drawn up to now, so it ends at the right edge
    assert float(bars["2"]["x"]) + float(bars["2"]["width"]) == pytest.approx(60 + 900)
    # usage and advice, failures with their detail (escaped), the children's table
    assert "1 calls measured: CPU 3.50 s" in text
    assert "estimated cost: $0.000100 (Fargate x86_64, test prices)" in text
    assert "memory='256MiB' would hold it" in text
    assert "OutOfMemoryError: Container killed" in text and "allocating <10 GiB>" in text
    assert 'File "/u/script.py", line 3' in text and "bad <input>" in text
    assert {a["data-child"] for a in page.all("tr") if "data-child" in a} == {"0", "1", "2", "3", "4"}


def test_page_is_self_contained():
    page_text = report.render([_job()], now=T0 + 10)
    page = Page(page_text)
    assert not page.all("script") and not page.all("link") and not page.all("img")
    # nothing is fetched at view time: no URL anywhere, no url() in the CSS
    assert not re.search(r"(https?:)?//[a-z]", page_text.replace("<!DOCTYPE html>", ""))
    assert "url(" not in page_text and "@import" not in page_text


def test_user_text_is_escaped():
    job = _job(name="<script>alert(1)</script>", reason='"><img src=x>')
    page = Page(report.render([job], now=T0 + 10))
    assert not page.all("script") and not page.all("img")


@pytest.mark.parametrize("status, calls_raised, colour", [
    ("SUCCEEDED", 0, report.STATUS_COLOURS["SUCCEEDED"]),
    ("SUCCEEDED", 1, report.RAISED_COLOUR),  # the worker wrote the call's exception: Batch succeeded
    ("SUCCEEDED", 3, report.RAISED_COLOUR),
    ("FAILED", 0, report.STATUS_COLOURS["FAILED"]),  # Batch's failure stays Batch's colour
    ("FAILED", 1, report.STATUS_COLOURS["FAILED"]),
    ("RUNNING", 0, report.STATUS_COLOURS["RUNNING"]),
    ("STARTING", 0, report.STATUS_COLOURS["STARTING"]),
    ("SOMETHING_NEW", 0, "#888"),  # a status this version does not know
])
def test_bar_colour(status, calls_raised, colour):
    assert report.bar_colour(status, calls_raised) == colour


def test_the_colours_are_distinct():
    colours = [report.QUEUED_COLOUR, report.RAISED_COLOUR, *report.STATUS_COLOURS.values()]
    assert len(set(colours)) == len(colours) - 1  # SUBMITTED and PENDING share their grey


@pytest.mark.parametrize("raised, expected", [
    ([0, 0], None),
    ([1, 0], "calls raised: 1<"),
    ([2, 1], "calls raised: 3 (in 2 of the children)"),
])
def test_count_of_calls_raised(raised, expected):
    rows = [report.CallRow(i, "SUCCEEDED", T0 + 1, T0 + 2, 0, raised=n) for i, n in enumerate(raised)]
    text = report.render([_job(rows=rows)], now=T0 + 10)
    if expected is None:
        assert "calls raised" not in text and report.RAISED_COLOUR not in text
    else:
        assert expected in text


@pytest.mark.parametrize("rows, expected", [
    ([], "No child has started yet"),
    ([report.CallRow(0, "RUNNABLE")], None),  # queued since the job's creation: a grey bar
])
def test_timeline_before_anything_ran(rows, expected):
    job = _job(rows=rows, failures=[], created=T0 if rows else None)
    text = report.render([job], now=T0 + 10)
    if expected:
        assert expected in text
    else:
        assert report.QUEUED_COLOUR in text and 'class="run"' not in text


def test_several_jobs_one_page():
    page = Page(report.render([_job(), _job(job_id="job-2", failures=[])], now=T0 + 10))
    assert [a["data-job"] for a in page.all("section")] == ["job-1", "job-2"]
    assert "No failures." in "".join(page.text)


# -- end to end on the embedded emulator ----------------------------------------------------------
def _maybe_fail(x):
    if x == 2:
        raise ValueError(f"item {x} is bad")
    return x


def _die(x):
    import os

    print("about to die", flush=True)
    os._exit(3)  # the container exits non-zero: Batch fails the child


@pytest.mark.slow
def test_report_of_a_real_run(local_env, tmp_path):
    from batchfutures import BatchExecutor

    with BatchExecutor(local_env) as ex:
        futures = ex.map_futures(_maybe_fail, range(4))
        [f.exception(timeout=120) for f in futures]
        died = ex.submit(_die, 0)
        died.exception(timeout=120)
        path = ex.report(tmp_path / "run.html")
    page_text = open(path, encoding="utf-8").read()
    page = Page(page_text)
    text = "".join(page.text)
    jobs = [a["data-job"] for a in page.all("section")]
    assert len(jobs) == 2
    # the map: four children, one bar each, one call that raised with its remote traceback
    bars = [a for a in page.all("rect") if a.get("class") == "run"]
    assert len(bars) == 5
    # the child whose call raised: SUCCEEDED in Batch, drawn in the "call raised" colour
    raised = [a for a in bars if a["data-calls-raised"] != "0"]
    assert [(a["data-status"], a["data-calls-raised"], a["fill"]) for a in raised] == [
        ("SUCCEEDED", "1", report.RAISED_COLOUR)]
    assert [a["fill"] for a in bars].count(report.STATUS_COLOURS["SUCCEEDED"]) == 3
    assert "calls raised: 1" in text
    assert "ValueError: item 2 is bad" in text
    assert 'raise ValueError(f"item {x} is bad")' in text  # the traceback's source line
    assert "calls measured" in text  # usage read from the result objects
    assert "estimated cost: $" in text and "local emulator" in text
    # the child Batch failed: its reason
    assert [a["data-status"] for a in bars].count("FAILED") == 1
    assert "FAILED: Essential container in task exited" in text
    assert "about to die" in text  # the failed child's log tail


@pytest.mark.slow
def test_cli_report_writes_the_same_page(local_env, tmp_path):
    import subprocess
    import sys

    from batchfutures import BatchExecutor

    with BatchExecutor(local_env) as ex:
        futures = ex.map_futures(_maybe_fail, range(3))
        [f.exception(timeout=120) for f in futures]
        (job_id,) = ex._session.submitter.submitted_jobs
    out = tmp_path / "cli.html"
    done = subprocess.run([sys.executable, "-m", "batchfutures", "report", job_id, "-o", str(out),
                           "--workdir", str(local_env.workdir)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    page = Page(out.read_text())
    assert [a["data-job"] for a in page.all("section")] == [job_id]
    assert "ValueError: item 2 is bad" in "".join(page.text)
