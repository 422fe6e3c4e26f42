"""The estimated cost where the user looks (issue 33, money): `batchfutures status JOB`'s `cost`
line (costs.of_usage: the estimate future.cost uses) and the progress bar's ` | ~$0.0123`
(progress.cost_of: the finished calls' future.cost, no request)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any, Optional

import pytest

import batchfutures
from batchfutures import BatchExecutor, LocalEnvironment, costs
from batchfutures.costs import Estimate, Pricing
from batchfutures.progress import cost_of, render_line, with_cost


def square(x: int) -> int:
    return x * x


@pytest.mark.parametrize("usd, text", [
    (0.0123, "~$0.0123"), (0.01234567, "~$0.0123"), (0.5, "~$0.5000"), (1.0, "~$1.00"),
    (1234.567, "~$1,234.57"), (0.00005, "<$0.0001"), (0.0, ""), (None, ""), (-1.0, ""),
])
def test_usd_text(usd: Optional[float], text: str) -> None:
    assert costs.usd_text(usd) == text


@pytest.mark.parametrize("why, usd, line", [
    ("", 0.0123, "square: 95/100 children | RUNNING 5, SUCCEEDED 95 | ~$0.0123"),
    ("waiting: 3rd in queue", 0.0123,
     "square: 95/100 children | RUNNING 5, SUCCEEDED 95 | waiting: 3rd in queue | ~$0.0123"),
    ("waiting: 3rd in queue", 0.0,  # nothing measured yet: no cost shown
     "square: 95/100 children | RUNNING 5, SUCCEEDED 95 | waiting: 3rd in queue"),
    ("", 0.0, "square: 95/100 children | RUNNING 5, SUCCEEDED 95"),
])
def test_the_progress_line_ends_with_the_cost(why: str, usd: float, line: str) -> None:
    assert render_line({"RUNNING": 5, "SUCCEEDED": 95}, "square", with_cost(why, usd)) == line


@pytest.mark.parametrize("usage, pricing, expected", [
    (None, Pricing("FARGATE"), None),
    (SimpleNamespace(calls=0, wall_s=0.0, vcpus=1.0, memory_mib=2048), Pricing("FARGATE"), None),
    (SimpleNamespace(calls=3, wall_s=3600.0, vcpus=1.0, memory_mib=2048), Pricing("FARGATE"),
     0.04048 + 2 * 0.004445),
    (SimpleNamespace(calls=1, wall_s=3600.0, vcpus=None, memory_mib=None), Pricing("FARGATE"),
     0.04048 + 2 * 0.004445),  # not reserved (yet): 1 vCPU, 2 GiB as report.py prices it
    (SimpleNamespace(calls=1, wall_s=3600.0, vcpus=1.0, memory_mib=2048),
     Pricing("EC2", instance_type="m6i.large"), 0.048),
])
def test_a_jobs_estimate_from_its_usage(usage: Any, pricing: Pricing, expected: Any) -> None:
    estimate = costs.of_usage(usage, pricing)
    if expected is None:
        assert estimate is None
    else:
        assert estimate is not None and estimate.usd == pytest.approx(expected)


@pytest.mark.parametrize("estimate, text", [
    (Estimate(0.0123, "Fargate x86_64, AWS Price List, eu-west-1, read 2026-12-06"),
     "~$0.0123 (Fargate x86_64, AWS Price List, eu-west-1, read 2026-12-06)"),
    (Estimate(0.0, "Fargate x86_64, the shipped table"), "$0 (Fargate x86_64, the shipped table)"),
])
def test_cost_text(estimate: Estimate, text: str) -> None:
    assert costs.cost_text(estimate) == text


@pytest.fixture
def ex(tmp_path):
    env = LocalEnvironment(tmp_path / "work", max_vcpus=2)
    executor = BatchExecutor(env)
    yield executor
    executor.shutdown(wait=False, cancel_futures=True)
    env.emulator.close()


@pytest.mark.slow
def test_progress_and_status_show_the_estimate_of_the_calls(ex, tmp_path) -> None:
    futures = ex.map_futures(square, range(6), chunksize=2)  # 3 children of 2 items
    stream = io.StringIO()
    batchfutures.progress(futures, file=stream, desc="square")
    assert [f.result() for f in futures] == [x * x for x in range(6)]
    # each call once, as ex.cost (the done callbacks) counts them
    assert cost_of(futures) > 0 and cost_of(futures) == pytest.approx(ex.cost)
    assert cost_of(futures + futures) == pytest.approx(ex.cost)
    assert stream.getvalue().splitlines()[-1].endswith(" | " + costs.usd_text(ex.cost))

    job_id = futures[0].job_id.partition(":")[0]
    command = [sys.executable, "-m", "batchfutures", "--workdir", str(tmp_path / "work"),
               "status", job_id]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHFUTURES_JOB")}
    text = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env,
                          check=True).stdout
    cost_lines = [line for line in text.splitlines() if line.startswith("cost ")]
    assert len(cost_lines) == 1 and "the local emulator, priced as" in cost_lines[0]
    shown = json.loads(subprocess.run(command + ["-o", "json"], capture_output=True, text=True,
                                      timeout=120, env=env, check=True).stdout)["cost"]
    # the whole job's estimate is what its calls' future.cost add up to
    assert shown["usd"] == pytest.approx(ex.cost) and "shipped table" in shown["basis"]
