"""Issue 29, point 5: the CLI escapes control characters in every field it prints (text, table
and JSON alike), so a stop reason, an error message or a log line with terminal control
sequences never reaches the terminal of whoever runs `status`, `logs` or `result`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from batchfutures import BatchExecutor, LocalEnvironment
from batchfutures.cli import output

# a window title, a cleared screen, a C1 CSI, a carriage return over a forged line, a newline
# that starts a forged row, a right-to-left override, DEL, a bell
EVIL = "\x1b]0;owned\x07\x1b[2J\x9b31m\rFAKE: SUCCEEDED\nFORGED ROW\u202eevil\x7f"
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def entry_point():
    installed = Path(sys.executable).parent / "batchfutures"
    return [str(installed)] if installed.exists() else [sys.executable, "-m", "batchfutures"]


def run_cli(workdir, *args):
    return subprocess.run(entry_point() + ["--workdir", str(workdir), *args], capture_output=True,
                          text=True, timeout=120)


def assert_clean(text: str) -> None:
    assert RAW.search(text) is None, repr(text)
    assert not any(line.startswith(("FAKE", "FORGED")) for line in text.splitlines()), text


@pytest.mark.parametrize("text, field, line", [
    ("plain", "plain", "plain"),
    ("a\x1b[2Jb", "a\\x1b[2Jb", "a\\x1b[2Jb"),
    ("a\nb\tc", "a\\nb\\tc", "a\nb\tc"),
    ("r\rx", "r\\rx", "r\\rx"),
    ("\x9b31m", "\\x9b31m", "\\x9b31m"),
    ("\u202eevil", "\\u202eevil", "\\u202eevil"),
    ("del\x7f", "del\\x7f", "del\\x7f"),
    ("é ü 日本", "é ü 日本", "é ü 日本"),  # printable text stays as it is
])
def test_escape_makes_every_control_character_visible(text, field, line):
    assert output.escape(text) == field
    assert output.escape(text, keep_lines=True) == line


def test_tables_and_json_escape_each_field(capsys):
    table = output.render_table(["NAME", "REASON"], [["job", EVIL]])
    assert len(table.splitlines()) == 2
    assert_clean(table)
    output.print_json({"reason": EVIL})
    printed = capsys.readouterr().out
    assert_clean(printed)
    assert json.loads(printed) == {"reason": EVIL}  # the same text, for a program to read
    output.out(f"status  {EVIL}")
    output.note(EVIL)
    captured = capsys.readouterr()
    assert RAW.search(captured.out + captured.err) is None


def says_and_fails(text):
    print(text)
    raise ValueError(text)


def naps(seconds):
    time.sleep(seconds)


@pytest.mark.slow
def test_status_logs_and_result_of_a_hostile_job_print_nothing_raw(tmp_path):
    env = LocalEnvironment(tmp_path / "work", max_vcpus=2)
    try:
        with BatchExecutor(env) as executor:
            failing = executor.submit(says_and_fails, EVIL)
            assert isinstance(failing.exception(timeout=120), Exception)
            stopped = executor.submit(naps, 60)
            deadline = time.monotonic() + 60
            while stopped.status not in ("RUNNING",) and time.monotonic() < deadline:
                time.sleep(0.05)
            env.emulator.terminate_job(jobId=stopped.job_id, reason=EVIL)  # its stop reason
            stopped.exception(timeout=120)
    finally:
        env.emulator.close()
    workdir = tmp_path / "work"
    for job_id in (failing.job_id, stopped.job_id):
        for form in ("text", "table", "json"):
            shown = run_cli(workdir, "status", job_id, "-o", form)
            assert shown.stdout, shown.stderr
            assert_clean(shown.stdout + shown.stderr)
            if form == "json" and job_id == stopped.job_id:  # the same text, for programs
                assert json.loads(shown.stdout)["statusReason"] == EVIL
    reason = run_cli(workdir, "status", stopped.job_id).stdout
    assert "\\x1b]0;owned\\x07" in reason  # shown, escaped
    logs = run_cli(workdir, "logs", failing.job_id)
    assert "\\rFAKE: SUCCEEDED" in logs.stdout  # the job's own line, its controls escaped
    assert RAW.search(logs.stdout + logs.stderr) is None  # (its newline made two log lines)
    for form in ("text", "table", "json"):
        result = run_cli(workdir, "result", failing.job_id, "-o", form)
        assert_clean(result.stdout + result.stderr)
