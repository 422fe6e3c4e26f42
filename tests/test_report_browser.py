"""The run report in a real browser: headless Chromium (Debian's package; `.ci/run` installs it)
lays out the page of a real run on the embedded default, and the test checks what it shows: the
DOM after parsing, the screenshot's pixels (the timeline's bars in report.py's colours: Batch's
status, or the "call raised" colour for the child whose call raised) and that the browser
fetched nothing while showing it."""

import html.parser
import http.server
import os
import shutil
import struct
import subprocess
import threading
import urllib.parse
import zlib

import pytest

from batchfutures import BatchExecutor, report

pytestmark = pytest.mark.slow

WINDOW = (1200, 1600)
BAR_HEIGHT = 11  # report._timeline: 12 px a line for up to 50 children, a 1 px gap between lines


def _chromium():
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("Chromium is missing: .ci/run installs it (apt-get install chromium)")
    pytest.skip("Chromium is not installed: `apt-get install --no-install-recommends chromium` "
                "(Debian/Ubuntu; .ci/run does it) to render the report in a browser")


# Chromium's own requests (network time, sign-in, search preconnect, component updates), made
# whatever the page and, depending on its version, not all switched off by flags: Google's
# services. A page fetching from those hosts is caught by the DOM check (nothing to fetch).
BROWSER_OWN = (".google.com", ".gvt1.com", ".googleapis.com")
FETCHING_ATTRIBUTES = {"src", "href", "srcset", "poster", "data", "action", "background"}


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A proxy that answers nothing: every request the browser makes comes here, and the page's
    (any host but the browser's own) are kept."""

    seen: list

    def _refuse(self):
        target = self.path if self.command == "CONNECT" else urllib.parse.urlsplit(self.path).netloc
        host = target.rsplit(":", 1)[0] if ":" in target else target
        if not ("." + host).endswith(BROWSER_OWN):
            self.seen.append(f"{self.command} {self.path}")
        self.send_error(502)

    do_GET = do_HEAD = do_POST = do_CONNECT = _refuse

    def log_message(self, *args):
        pass


@pytest.fixture
def proxy():
    seen = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def _render(chromium, page, work, proxy_url, *extra):
    """Chromium, offline: names resolve nowhere and every request goes to the recording proxy
    (loopback included). Returns what it printed on stdout."""
    done = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-features=NetworkTimeServiceQuerying",
         "--force-color-profile=srgb", "--hide-scrollbars",
         f"--user-data-dir={work / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
         f"--proxy-server={proxy_url}", "--proxy-bypass-list=<-loopback>",
         *extra, page.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _screenshot(chromium, page, work, proxy_url):
    png = work / "shot.png"
    _render(chromium, page, work, proxy_url, f"--screenshot={png}",
            f"--window-size={WINDOW[0]},{WINDOW[1]}")
    return _decode_png(png.read_bytes())


def _decode_png(data):
    """8-bit RGB or RGBA PNG -> (width, height, rows of RGB bytes). Standard library only."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, idat = 8, []
    while position < len(data):
        (length,), kind = struct.unpack(">I", data[position:position + 4]), data[position + 4:position + 8]
        body = data[position + 8:position + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
        elif kind == b"IDAT":
            idat.append(body)
        position += 12 + length
    raw = zlib.decompress(b"".join(idat))
    bpp = 3 if colour == 2 else 4
    stride = width * bpp
    rows, previous = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if kind == 1:  # Sub
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif kind == 2:  # Up
            line = bytearray((a + b) & 255 for a, b in zip(line, previous))
        elif kind == 3:  # Average
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 255
        elif kind == 4:  # Paeth
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = previous[i], (previous[i - bpp] if i >= bpp else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        previous = line
        rows.append(bytes(line) if bpp == 3 else bytes(v for i, v in enumerate(line) if i % 4 != 3))
    return width, height, rows


def _rgb(colour):
    return bytes.fromhex(colour.lstrip("#"))


def _bars(rows, colour, min_width=20):
    """The horizontal bands of rows holding a run of at least ``min_width`` pixels of exactly
    ``colour``: (first row, rows) each. A bar of the timeline is one band BAR_HEIGHT rows high;
    a status swatch (10 px) is too narrow, a table border one row high."""
    pattern = _rgb(colour) * min_width
    hits = []
    for y, row in enumerate(rows):
        at = row.find(pattern)
        while at != -1 and at % 3:
            at = row.find(pattern, at + 1)
        if at != -1:
            hits.append(y)
    bands = []
    for y in hits:
        if bands and bands[-1][0] + bands[-1][1] == y:
            bands[-1][1] += 1
        else:
            bands.append([y, 1])
    return [tuple(band) for band in bands]


class _Dom(html.parser.HTMLParser):
    def __init__(self, text):
        super().__init__()
        self.elements, self.text = [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


# -- a real run: a map (one call raises) and a job Batch fails ------------------------------------
def _slow_maybe_fail(x):
    import time

    time.sleep(0.5)  # long enough to be a wide bar next to the time queued
    if x == 2:
        raise ValueError(f"item {x} is bad")
    return x


def _slow_die(x):
    import os
    import time

    time.sleep(0.5)
    print("about to die", flush=True)
    os._exit(3)  # the container exits non-zero: Batch fails the child


@pytest.fixture
def run_page(local_env, tmp_path):
    with BatchExecutor(local_env) as ex:
        futures = ex.map_futures(_slow_maybe_fail, range(4))
        assert [type(f.exception(timeout=120)).__name__ for f in futures] == [
            "NoneType", "NoneType", "ValueError", "NoneType"]
        died = ex.submit(_slow_die, 0)
        died.exception(timeout=120)
        return ex.report(tmp_path / "run.html")


def test_the_browser_lays_out_every_part_of_the_page(run_page, tmp_path, proxy):
    from pathlib import Path

    proxy_url, seen = proxy
    laid_out = _render(_chromium(), Path(run_page), tmp_path, proxy_url, "--dump-dom")
    dom = _Dom(laid_out)
    text = " ".join(dom.text)
    elements = dom.elements
    assert len([a for t, a in elements if t == "section"]) == 2
    bars = [a for t, a in elements if t == "rect" and a.get("class") == "run"]
    assert sorted(a["data-status"] for a in bars) == ["FAILED"] + ["SUCCEEDED"] * 4
    # Batch says SUCCEEDED for the child whose call raised; the report says the call raised
    assert [(a["data-child"], a["fill"]) for a in bars if a["data-calls-raised"] == "1"] == [
        ("2", report.RAISED_COLOUR)]
    assert "SUCCEEDED: 4" in text and "FAILED: 1" in text and "calls raised: 1" in text
    assert "ValueError: item 2 is bad" in text
    assert "Essential container in task exited" in text and "about to die" in text
    assert "calls measured" in text and "estimated cost: $" in text
    # self-contained: nothing on the page names anything to fetch, and nothing was fetched
    assert not [t for t, a in elements if t in ("script", "link", "img", "iframe", "object")]
    assert not [a for t, a in elements if FETCHING_ATTRIBUTES & set(a)]
    assert "url(" not in laid_out and "@import" not in laid_out
    assert seen == [], seen


def test_the_screenshot_shows_the_timeline_in_the_report_colours(run_page, tmp_path, proxy):
    from pathlib import Path

    proxy_url, seen = proxy
    width, height, rows = _screenshot(_chromium(), Path(run_page), tmp_path, proxy_url)
    assert (width, height) == WINDOW
    # not blank: text and shapes in many colours, a good part of the page drawn on
    white = _rgb("#ffffff")
    drawn = sum(1 for row in rows for i in range(0, len(row), 3) if row[i:i + 3] != white)
    assert drawn > width * height // 50
    assert len({row[i:i + 3] for row in rows[::8] for i in range(0, len(row), 24)}) > 20
    # the timeline: one bar per child in its status's colour (the child whose call raised in
    # the "call raised" colour, though Batch says SUCCEEDED), the time queued in grey
    succeeded = _bars(rows, report.STATUS_COLOURS["SUCCEEDED"])
    raised = _bars(rows, report.RAISED_COLOUR)
    failed = _bars(rows, report.STATUS_COLOURS["FAILED"])
    queued = _bars(rows, report.QUEUED_COLOUR)
    assert [h for _, h in succeeded] == [BAR_HEIGHT] * 3, succeeded
    assert [h for _, h in raised] == [BAR_HEIGHT], raised
    assert [h for _, h in failed] == [BAR_HEIGHT], failed
    assert any(h == BAR_HEIGHT for _, h in queued), queued
    # the map's bars come one under the other, child 2's (the call that raised) third, above
    # the failed job's
    line = BAR_HEIGHT + 1
    tops = [y for y, _ in succeeded]
    assert [y - tops[0] for y in tops] == [0, line, 3 * line], succeeded
    assert raised[0][0] == tops[0] + 2 * line, (raised, succeeded)
    assert failed[0][0] > tops[-1]
    assert seen == [], seen


def test_the_network_check_sees_a_page_that_fetches(tmp_path, proxy):
    """The control: a page with a remote image is caught by the same rendering."""
    proxy_url, seen = proxy
    page = tmp_path / "fetches.html"
    page.write_text('<!DOCTYPE html><p>hi</p><img src="http://report.invalid/x.png">')
    _render(_chromium(), page, tmp_path, proxy_url, "--dump-dom")  # waits for the image's load
    assert any("report.invalid" in line for line in seen), seen
