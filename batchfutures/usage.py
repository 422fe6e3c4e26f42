"""What a call used, and what a job used and reserved (docs/usage.md): pure, no I/O.

    worker (calls.Meter, per item)        result object's JSON meta
      wall_s, cpu_s, peak MiB  ──────────> "usage": [[wall_s, cpu_s, peak_mib | null] | null, ...]
                                                     one entry per item, in item order
    client
      future.usage   = Usage.from_raw(entry)            None until the call ended, for a call
                                                        that left no outcome, and for objects
                                                        whose meta has no "usage" (older ones)
      ex.job(id).usage = JobUsage: calls' cpu_s summed, their largest peak, and what the job
                         reserved (vCPU-seconds, GiB-seconds: its VCPU and MEMORY times the
                         run time of each child, startedAt to stoppedAt: what Fargate bills
                         and what an EC2 instance was held for)
      JobUsage.advice  the memory setting next to the peak: far above it, or close to it

The entries are kept packed per job (ItemUsage: three floats an item), not on the futures: a
Usage is made only when `future.usage` is read, so a million futures pay for no object they are
not asked about.
"""

from __future__ import annotations

import array
import math
from dataclasses import dataclass
from typing import Any, Dict, Iterable, NamedTuple, Optional, Sequence

__all__ = ["Usage", "ItemUsage", "Totals", "JobUsage", "run_seconds", "suggest_memory", "memory_text",
           "advice", "FAR_ABOVE", "CLOSE_TO", "HEADROOM"]

# advice: the requested memory is "far above" the peak when a setting half of it or less would
# hold the peak with HEADROOM; "close to" it when the peak is CLOSE_TO of it or more
FAR_ABOVE = 2.0
CLOSE_TO = 0.9
HEADROOM = 1.25
# memory settings advice suggests (MiB): round values a user would write
_STEPS = (128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576,
          32768, 49152, 65536, 98304, 131072, 196608, 262144)


class Usage(NamedTuple):
    """What one call used in its container, as the worker measured it.

    ``wall_s``: seconds from the call's start to its end (its arguments' resolving and its
    outcome's pickling included); ``cpu_s``: user + system CPU seconds of the process (or, on
    the emulator's thread launcher, of the thread) that ran it, plus those of the child
    processes it waited for; ``peak_memory_mib``: the largest resident set (VmHWM) of that
    process while the call ran, the interpreter and what earlier calls left included; None
    where it cannot be measured (the emulator's thread launcher).
    """

    wall_s: float
    cpu_s: float
    peak_memory_mib: Optional[float]

    @classmethod
    def from_raw(cls, raw: Any) -> Optional["Usage"]:
        """A result object's entry ``[wall_s, cpu_s, peak_mib or None]``; None for anything else."""
        if not isinstance(raw, (list, tuple)) or len(raw) != 3:
            return None
        wall, cpu, peak = raw
        if not _number(wall) or not _number(cpu) or not (peak is None or _number(peak)):
            return None
        return cls(float(wall), float(cpu), None if peak is None else float(peak))

    def as_dict(self) -> Dict[str, Any]:
        return {"wall_s": self.wall_s, "cpu_s": self.cpu_s, "peak_memory_mib": self.peak_memory_mib}


class ItemUsage:
    """Each item's usage in one job, packed: three floats an item in one array for the whole job
    (NaN where unknown), made when the first measured result arrives, read by the futures through
    their job, child and position. A list per future cost ~150 bytes each, an object and an array
    per child ~35 bytes a future; this costs 24 bytes an item and 8 a child."""

    __slots__ = ("_starts", "_values")

    def __init__(self, item_counts: Iterable[int]) -> None:
        starts = array.array("q", [0])  # where each child's items start; the end last
        for count in item_counts:
            starts.append(starts[-1] + count)
        self._starts = starts
        self._values: Optional[array.array] = None

    def items_in(self, child: int) -> int:
        if not 0 <= child < len(self._starts) - 1:
            return 0
        return self._starts[child + 1] - self._starts[child]

    def record(self, child: int, position: int, raw: Any) -> None:
        """Item ``position`` of ``child`` used ``raw`` (a result object's entry, see
        Usage.from_raw); an entry that does not read leaves the item unmeasured."""
        found = Usage.from_raw(raw)
        if found is None or not 0 <= position < self.items_in(child):
            return
        if self._values is None:
            self._values = array.array("d", [math.nan]) * (3 * self._starts[-1])
        at = 3 * (self._starts[child] + position)
        peak = found.peak_memory_mib
        self._values[at:at + 3] = array.array(
            "d", (found.wall_s, found.cpu_s, math.nan if peak is None else peak))

    def at(self, child: int, position: int) -> Optional[Usage]:
        """Item ``position`` of ``child``'s usage; None when it was not measured."""
        if self._values is None or not 0 <= position < self.items_in(child):
            return None
        at = 3 * (self._starts[child] + position)
        wall, cpu, peak = self._values[at:at + 3]
        if math.isnan(wall) or math.isnan(cpu):
            return None
        return Usage(wall, cpu, None if math.isnan(peak) else peak)


def _number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


class Totals:
    """Calls' usage added up: how many were measured, wall and CPU summed, the largest peak."""

    __slots__ = ("calls", "wall_s", "cpu_s", "peak_memory_mib")

    def __init__(self) -> None:
        self.calls = 0
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self.peak_memory_mib: Optional[float] = None

    def add(self, usage: Optional[Usage]) -> None:
        if usage is None:
            return
        self.calls += 1
        self.wall_s += usage.wall_s
        self.cpu_s += usage.cpu_s
        if usage.peak_memory_mib is not None and (self.peak_memory_mib is None
                                                  or usage.peak_memory_mib > self.peak_memory_mib):
            self.peak_memory_mib = usage.peak_memory_mib

    def add_raw(self, entries: Iterable[Any]) -> None:
        for entry in entries:
            self.add(Usage.from_raw(entry))


def run_seconds(spans: Iterable[Sequence[Optional[float]]], now: Optional[float] = None) -> float:
    """The summed run time of (started, stopped) spans, epoch seconds; a span still running
    counts up to ``now`` (left out when ``now`` is None), one never started counts 0."""
    total = 0.0
    for started, stopped in spans:
        if started is None:
            continue
        end = stopped if stopped is not None else now
        if end is not None and end > started:
            total += end - started
    return total


def memory_text(mib: int) -> str:
    """A memory setting as a user writes it: ``"512MiB"``, ``"4GiB"``."""
    return f"{mib // 1024}GiB" if mib >= 1024 and mib % 1024 == 0 else f"{mib}MiB"


def suggest_memory(peak_mib: float, processes: int = 1) -> int:
    """The smallest round setting (MiB) holding ``processes`` x the peak with HEADROOM."""
    needed = peak_mib * max(1, processes) * HEADROOM
    for step in _STEPS:
        if step >= needed:
            return step
    return int(math.ceil(needed / 1024.0)) * 1024


def advice(peak_mib: Optional[float], memory_mib: Optional[int], processes: int = 1) -> Optional[str]:
    """One line about the memory setting against the peak, or None when it fits the peak.

    ``processes``: the calls that ran at once in one container (the inner pool of a job of N
    vCPUs runs N): the container held about that many peaks at once.
    """
    if peak_mib is None or not memory_mib:
        return None
    processes = max(1, processes)
    held = peak_mib * processes
    each = f" ({processes} processes at once)" if processes > 1 else ""
    peak = f"peak {peak_mib:.0f} MiB{each} of {memory_mib} MiB"
    suggested = suggest_memory(peak_mib, processes)
    if held >= CLOSE_TO * memory_mib:
        return (f"{peak}: close to the limit (a larger input may be killed for memory); "
                f"memory={memory_text(max(suggested, memory_mib + 1))!r} leaves room")
    if suggested * FAR_ABOVE <= memory_mib:
        return f"{peak}: memory={memory_text(suggested)!r} would hold it"
    return None


@dataclass(frozen=True)
class JobUsage:
    """A job's usage: its calls' (from its result objects) and what it reserved (from Batch).

    ``calls``: calls measured; ``cpu_s``/``wall_s``: their sums; ``peak_memory_mib``: the largest
    call's peak (None when none was measured); ``vcpus``/``memory_mib``: the job's VCPU and
    MEMORY; ``run_s``: its children's (or its attempts') run times summed; ``vcpu_s`` and
    ``gib_s``: vCPUs x run_s and GiB x run_s, what was reserved (billed on Fargate);
    ``processes``: calls run at once in one container (the inner pool); ``results_skipped``:
    result objects not read (beyond the limit): the call totals then cover only those read.
    """

    calls: int
    cpu_s: float
    wall_s: float
    peak_memory_mib: Optional[float]
    vcpus: Optional[float]
    memory_mib: Optional[int]
    run_s: float
    processes: int = 1
    results_skipped: int = 0
    ended: bool = True

    @property
    def vcpu_s(self) -> Optional[float]:
        return None if self.vcpus is None else self.vcpus * self.run_s

    @property
    def gib_s(self) -> Optional[float]:
        return None if self.memory_mib is None else self.memory_mib / 1024.0 * self.run_s

    @property
    def cpu_utilization(self) -> Optional[float]:
        """CPU seconds used per vCPU-second reserved (0 to 1, more with children on extra CPUs)."""
        reserved = self.vcpu_s
        return self.cpu_s / reserved if reserved else None

    @property
    def advice(self) -> Optional[str]:
        return advice(self.peak_memory_mib, self.memory_mib, self.processes)

    @classmethod
    def of(cls, totals: Totals, vcpus: Optional[float], memory_mib: Optional[int], run_s: float,
           *, processes: int = 1, results_skipped: int = 0, ended: bool = True) -> "JobUsage":
        return cls(calls=totals.calls, cpu_s=totals.cpu_s, wall_s=totals.wall_s,
                   peak_memory_mib=totals.peak_memory_mib, vcpus=vcpus, memory_mib=memory_mib,
                   run_s=run_s, processes=processes, results_skipped=results_skipped, ended=ended)

    def as_dict(self) -> Dict[str, Any]:
        return {"calls": self.calls, "cpu_s": self.cpu_s, "wall_s": self.wall_s,
                "peak_memory_mib": self.peak_memory_mib, "vcpus": self.vcpus,
                "memory_mib": self.memory_mib, "run_s": self.run_s, "vcpu_s": self.vcpu_s,
                "gib_s": self.gib_s, "processes": self.processes,
                "results_skipped": self.results_skipped, "ended": self.ended,
                "advice": self.advice}

    def lines(self) -> Sequence[str]:
        """What ``batchfutures status`` prints."""
        if self.calls:
            peak = "-" if self.peak_memory_mib is None else f"{self.peak_memory_mib:.0f} MiB"
            used = (f"{self.calls} calls measured: CPU {self.cpu_s:.2f} s, "
                    f"wall {self.wall_s:.2f} s, peak {peak}")
        else:
            used = "no call measured (not finished, or written before usage was recorded)"
        if self.results_skipped:
            used += f" ({self.results_skipped} result objects not read)"
        shown = [used]
        if self.vcpu_s is not None or self.gib_s is not None:
            parts = []
            if self.vcpu_s is not None:
                parts.append(f"{self.vcpu_s:.1f} vCPU-s ({self.vcpus:g} vCPU)")
            if self.gib_s is not None:
                parts.append(f"{self.gib_s:.1f} GiB-s ({self.memory_mib} MiB)")
            text = f"reserved {', '.join(parts)} over {self.run_s:.1f} s of run time"
            if not self.ended:
                text += " so far"
            shown.append(text)
        if self.advice:
            shown.append(self.advice)
        return shown
