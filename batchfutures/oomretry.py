"""``retry_on_oom=K``: children killed for memory are submitted again with twice the memory.

    poller ─> TrackedJob.apply: failed children ─> failure_for ─> MemoryLimitExceeded
                 │                                                      │
                 └── job.retry (an OomRetry, set by the Submitter when K > 0) .decide(job, errors)
                        per child: decide(tried MiB, K, placeable MiB)      (pure, table-tested)
                          RESUBMIT M ─> Submitter.resubmit(job, children, M, history): one new
                                        Batch job per memory size, its children's futures
                                        re-bound to it (future.job_id changes); the worker reads
                                        each child's items from the ORIGINAL inputs object
                                        (header "sources"), so nothing is uploaded again
                          GIVE_UP   ─> final_error: the MemoryLimitExceeded names every try

Only children whose failure is a MemoryLimitExceeded are retried; every other failure, and
every child of a job with K = 0, settles as before. The largest memory the queue can place
caps the doubling: locally the machine's memory (what LocalEnvironment.validate_settings
allows), on AWS an environment's ``max_memory_mib()`` when it offers one, else no cap: a retry
that Batch then holds RUNNABLE with MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT (no compute
environment has that much memory) is cancelled at once and fails with ``unplaceable_error``
(reconcile._stuck, TrackedJob's ``memory_raised``), instead of waiting forever.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .errors import MemoryLimitExceeded
from .settings import JobSettings

__all__ = ["Verdict", "Decision", "Try", "ChildHistory", "OomRetry", "decide", "final_error",
           "unplaceable_error", "placeable_memory_mib"]

logger = logging.getLogger("batchfutures")


class Verdict(enum.Enum):
    RESUBMIT = "resubmit"
    GIVE_UP = "give up"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    memory_mib: Optional[int] = None  # with RESUBMIT: the next try's memory
    why: str = ""                     # with GIVE_UP: why no further try


@dataclass(frozen=True)
class Try:
    """One try of a child: the memory it had and the Batch job (child) id it ran as."""

    memory_mib: int
    job_id: str


@dataclass(frozen=True)
class ChildHistory:
    """A resubmitted child: where its items are stored, and its earlier tries (oldest first)."""

    origin: Tuple[str, int]  # (job_url, child index) of the inputs object holding its items
    tries: Tuple[Try, ...]


def decide(tried: Sequence[int], retry_on_oom: int, placeable_mib: Optional[int]) -> Decision:
    """What to do with a child just killed for memory.

    ``tried``: the MiB of every try so far, oldest first (the last one was just killed);
    ``placeable_mib``: the largest memory the queue can place, None when unknown.
    """
    if retry_on_oom <= 0:
        return Decision(Verdict.GIVE_UP, why="retry_on_oom=0")
    resubmissions = len(tried) - 1
    if resubmissions >= retry_on_oom:
        return Decision(Verdict.GIVE_UP, why=f"retry_on_oom={retry_on_oom} allows no further try")
    last = tried[-1]
    wanted = last * 2
    if placeable_mib is not None and wanted > placeable_mib:
        if last >= placeable_mib:
            return Decision(Verdict.GIVE_UP,
                            why=f"the queue can place at most {placeable_mib} MiB")
        wanted = placeable_mib
    return Decision(Verdict.RESUBMIT, memory_mib=wanted)


def tried_text(tries: Sequence[Try]) -> str:
    return ", ".join(f"{t.memory_mib} MiB (Batch job {t.job_id})" for t in tries)


def final_error(error: MemoryLimitExceeded, tries: Sequence[Try], why: str) -> MemoryLimitExceeded:
    """The last try's MemoryLimitExceeded, saying what was tried; ``.tried_mib`` lists them."""
    message = (f"killed for memory on every try with retry_on_oom: tried {tried_text(tries)}; "
               f"{why}.\n{error.args[0] if error.args else error}")
    final = MemoryLimitExceeded(message, memory_mib=error.memory_mib, job_id=error.job_id,
                                status_reason=error.status_reason, exit_code=error.exit_code,
                                log_tail=error.log_tail)
    final.tried_mib = tuple(t.memory_mib for t in tries)  # type: ignore[attr-defined]
    return final


def unplaceable_error(tries: Sequence[Try], memory_mib: Optional[int],
                      reason: str) -> MemoryLimitExceeded:
    """A retry whose raised memory no compute environment can hold: the last kill, saying so."""
    last = tries[-1]
    asked = f"{memory_mib} MiB" if memory_mib else "more memory"
    message = (f"killed for memory with retry_on_oom: tried {tried_text(tries)}; the retry with "
               f"{asked} cannot be placed by the job queue and was cancelled (Batch's reason: "
               f"{reason}). Use a job queue whose compute environments offer more memory, or "
               f"make the call need less.")
    error = MemoryLimitExceeded(message, memory_mib=last.memory_mib, job_id=last.job_id,
                                status_reason=reason)
    error.tried_mib = tuple(t.memory_mib for t in tries)  # type: ignore[attr-defined]
    return error


def placeable_memory_mib(env: Any) -> Optional[int]:
    """The largest memory (MiB) a job of ``env``'s queue can be placed with; None: unknown."""
    offered = getattr(env, "max_memory_mib", None)
    if callable(offered):
        try:
            return offered()
        except Exception as error:  # unknown then: the doubling is not capped
            logger.debug("batchfutures: max_memory_mib() failed: %r", error)
            return None
    from .environments import LocalEnvironment

    if isinstance(env, LocalEnvironment):  # what validate_settings lets through
        from .emulator import host

        return host.memory_mib()
    return None


# Submitter.resubmit(source job, its children, memory MiB, their histories, retry): the new job
Resubmit = Callable[[Any, List[int], int, List[ChildHistory], "OomRetry"], Any]


class OomRetry:
    """A TrackedJob's ``retry`` when its settings have ``retry_on_oom > 0``.

    ``history``: for the children of this job that are retries, their origin and earlier tries.
    Called on the poller thread only (TrackedJob.apply).
    """

    def __init__(self, settings: JobSettings, *, placeable_mib: Optional[int], resubmit: Resubmit,
                 history: Optional[Mapping[int, ChildHistory]] = None,
                 name: str = "bf-retry") -> None:
        self.settings = settings
        self.name = name  # the Batch job name, kept by the retries
        self.placeable_mib = placeable_mib
        self._resubmit = resubmit
        self.history = dict(history or {})

    def with_memory(self, memory_mib: int) -> JobSettings:
        return replace(self.settings, memory=memory_mib)

    @property
    def raised(self) -> bool:
        """This job is a retry with more memory than was asked (a rerun of a dependent is not)."""
        return any(history.tries for history in self.history.values())

    def unplaceable_error(self, index: int, memory_mib: Optional[int],
                          reason: str) -> MemoryLimitExceeded:
        """Child ``index`` of this retry job waits for memory no compute environment has."""
        return unplaceable_error(self.history[index].tries, memory_mib, reason)

    def decide(self, job: Any, errors: Mapping[int, BaseException]) -> Dict[int, Optional[BaseException]]:
        """Per failed child of ``job`` this retry decides: None when it was resubmitted (its
        futures now belong to the new job), else the error to fail it with. Children left out
        (not killed for memory) fail as usual."""
        decided: Dict[int, Optional[BaseException]] = {}
        by_memory: Dict[int, List[int]] = {}
        histories: Dict[int, ChildHistory] = {}
        for index, error in sorted(errors.items()):
            if not isinstance(error, MemoryLimitExceeded):
                continue
            earlier = self.history.get(index)
            memory = error.memory_mib or job.memory_mib  # Batch's own account first
            if memory is None:  # nothing to double
                continue
            tries = (earlier.tries if earlier else ()) + (Try(int(memory), job.child_id(index)),)
            origin = earlier.origin if earlier else (job.job_url, index)
            decision = decide([t.memory_mib for t in tries], self.settings.retry_on_oom,
                              self.placeable_mib)
            if decision.verdict is Verdict.GIVE_UP:
                decided[index] = final_error(error, tries, decision.why)
                continue
            assert decision.memory_mib is not None
            histories[index] = ChildHistory(origin, tries)
            by_memory.setdefault(decision.memory_mib, []).append(index)
        for memory, children in by_memory.items():
            try:
                self._resubmit(job, children, memory, [histories[i] for i in children], self)
            except Exception as failure:  # the children fail with what was tried, and why not more
                logger.warning("batchfutures: could not resubmit %d child(ren) of %s with %d MiB: "
                               "%s", len(children), job.job_id, memory, failure)
                for index in children:
                    error = errors[index]
                    assert isinstance(error, MemoryLimitExceeded)
                    decided[index] = final_error(
                        error, histories[index].tries,
                        f"the retry with {memory} MiB could not be submitted: {failure}")
                continue
            logger.info("batchfutures: %d child(ren) of %s killed for memory; resubmitted with "
                        "%d MiB", len(children), job.job_id, memory)
            decided.update({index: None for index in children})
        return decided
