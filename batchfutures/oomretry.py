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
every child of a job with K = 0, settles as before. A MemoryLimitExceeded is the kernel's kill
(Batch's ``OutOfMemoryError`` reason) or the worker's MemoryError: exit 137 with no reason and
its out-of-memory marker in storage (storage.write_oom_marker, read by reconcile, classified by
errors.classify_failure); both are retried alike, with the memory Batch describes for the try.
The next try is sized as the queue's
platform sizes (``Placement``, from ``placement_of(env)``):

    LOCAL    the memory doubled, capped at the machine's (what LocalEnvironment allows)
    EC2      the memory doubled, but kept below the instance size it would land on by AWS's
             headroom (an instance of 4096 MiB installed cannot hold a 4096 MiB container),
             capped at what the queue's compute environments can place
             (``AWSBatchEnvironment.max_memory_mib()``: ``max_memory=`` or learned once)
    FARGATE  the next (vCPU, memory) pair Fargate offers that holds the doubled memory, at no
             fewer vCPUs, capped at the largest pair (32 vCPU, 249856 MiB) and at the vCPUs one
             job can get (``Placement.max_vcpus``): the account's Fargate vCPU quota (Service
             Quotas, ``fargate_vcpu_cap``) and the compute environments' maxvCpus. A job over the
             quota stays RUNNABLE with no reason for ever; past the cap the retry gives up at once.

A cap that is already reached gives up at once, naming the tries. With no known cap, a retry that
Batch then holds RUNNABLE with MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT (no compute environment
has that much memory), or that the queue's time limit cancels, fails at once with
``unplaceable_error`` (reconcile._stuck, TrackedJob's ``memory_raised``), instead of waiting.
"""

from __future__ import annotations

import enum
import logging
import math
from dataclasses import dataclass, replace
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Literal,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
)

from . import batchapi  # its retries (throttling, 5xx); the clients' own are off
from .errors import JobUnplaceableError, MemoryLimitExceeded
from .jobdefinitions import FARGATE_MEMORY
from .settings import JobSettings

if TYPE_CHECKING:
    from .batchapi import BatchAPI

__all__ = ["Verdict", "Decision", "Try", "ChildHistory", "OomRetry", "Placement", "decide",
           "final_error", "unplaceable_error", "placeable_memory_mib", "placement_of",
           "ec2_usable_mib", "ec2_next_memory", "fargate_pairs", "fargate_next_pair",
           "instance_type_queries", "queue_max_memory_mib", "DEFAULT_FAMILIES",
           "FARGATE_VCPU_QUOTAS", "fargate_vcpu_cap", "read_fargate_quotas", "learn_fargate_vcpus"]

logger = logging.getLogger("batchfutures")

Platform = Literal["LOCAL", "EC2", "FARGATE"]

# AWS Batch's memory-management guidance: the ECS agent registers less than the installed
# memory (kernel, platform overhead, 32 MiB reserved), and AWS recommends leaving a 5% buffer.
EC2_HEADROOM = 0.05
# AWS Batch's Fargate pairs (ResourceRequirement's MEMORY table): jobdefinitions.FARGATE_MEMORY
FARGATE_MAX_MIB = max(max(sizes) for sizes in FARGATE_MEMORY.values())
FARGATE_MAX_VCPUS = max(FARGATE_MEMORY)
# The instance families behind the instanceTypes Batch picks for you. Source: botocore's Batch
# model (ComputeResource.instanceTypes) and the AWS Batch User Guide's "Instance type compute
# table" (instance-type-compute-table.html): default_x86_64 is m6i/c6i/r6i/c7i, default_arm64
# (Graviton) m6g/c6g/r6g/c7g, and since 2025-11-01 "optimal" means what default_x86_64 means (it
# was C4/M4/R4, or C5/M5/R5 where a Region lacked them). Batch may pick an older family of a
# bundle where that is cheaper: less memory, never more, so the cap stays at or over the truth.
DEFAULT_FAMILIES: Dict[str, Tuple[str, ...]] = {
    "default_x86_64": ("m6i", "c6i", "r6i", "c7i"),
    "default_arm64": ("m6g", "c6g", "r6g", "c7g"),
    "optimal": ("m6i", "c6i", "r6i", "c7i"),
}
OPTIMAL_FAMILIES = DEFAULT_FAMILIES["optimal"]


# Service Quotas' codes (service code "fargate") of the vCPUs an account may run at once on
# Fargate, per kind of compute environment: "Fargate On-Demand vCPU resource count" and
# "Fargate Spot vCPU resource count". New accounts may start low (6 is often seen); a job of
# more vCPUs than the quota is held RUNNABLE, with no statusReason, for ever.
FARGATE_SERVICE_CODE = "fargate"
FARGATE_VCPU_QUOTAS = {"FARGATE": "L-3032A538", "FARGATE_SPOT": "L-36FBB829"}


class Verdict(enum.Enum):
    RESUBMIT = "resubmit"
    GIVE_UP = "give up"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    memory_mib: Optional[int] = None  # with RESUBMIT: the next try's memory
    why: str = ""                     # with GIVE_UP: why no further try
    vcpus: Optional[float] = None     # with RESUBMIT on Fargate: the next try's vCPUs


@dataclass(frozen=True)
class Placement:
    """How a queue sizes jobs: its platform, the most memory (MiB) it can place and, on
    Fargate, the most vCPUs one job can get (the account's quota; None: unknown)."""

    platform: Platform = "LOCAL"
    max_mib: Optional[int] = None
    max_vcpus: Optional[float] = None


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


def decide(tried: Sequence[int], retry_on_oom: int,
           placeable: Union[Placement, int, None], vcpus: float = 1.0) -> Decision:
    """What to do with a child just killed for memory.

    ``tried``: the MiB of every try so far, oldest first (the last one was just killed);
    ``placeable``: the queue's Placement (an int or None: LOCAL with that cap); ``vcpus``: the
    last try's, which Fargate's pairs depend on.
    """
    placement = as_placement(placeable)
    if retry_on_oom <= 0:
        return Decision(Verdict.GIVE_UP, why="retry_on_oom=0")
    resubmissions = len(tried) - 1
    if resubmissions >= retry_on_oom:
        return Decision(Verdict.GIVE_UP, why=f"retry_on_oom={retry_on_oom} allows no further try")
    last = tried[-1]
    if placement.platform == "FARGATE":
        pair = fargate_next_pair(vcpus, last, placement.max_mib, placement.max_vcpus)
        if pair is None:
            return Decision(Verdict.GIVE_UP, why=_fargate_limit(last, vcpus, placement))
        return Decision(Verdict.RESUBMIT, memory_mib=pair[1], vcpus=pair[0])
    cap = placement.max_mib
    wanted = ec2_next_memory(last) if placement.platform == "EC2" else last * 2
    if cap is not None and wanted > cap:
        if last >= cap:
            return Decision(Verdict.GIVE_UP, why=f"the queue can place at most {cap} MiB")
        wanted = cap
    return Decision(Verdict.RESUBMIT, memory_mib=wanted)


def _fargate_limit(last: int, vcpus: float, placement: Placement) -> str:
    """Why no Fargate pair holds more than ``last`` MiB here: the quota, the queue or Fargate."""
    unquoted = fargate_next_pair(vcpus, last, placement.max_mib)  # what the vCPU cap took away
    if placement.max_vcpus is not None and unquoted is not None:
        most = max((m for v, m in fargate_pairs() if v <= placement.max_vcpus), default=0)
        return (f"one job gets at most {placement.max_vcpus:g} vCPUs here (the account's Fargate "
                f"vCPU quota, Service Quotas {FARGATE_VCPU_QUOTAS['FARGATE']} on demand, or the "
                f"compute environments' maxvCpus), which hold at most {most} MiB, and {last} MiB "
                f"was tried; a larger pair would wait RUNNABLE for ever: ask AWS to raise the quota")
    most = min(placement.max_mib or FARGATE_MAX_MIB, FARGATE_MAX_MIB)
    where = (f"Fargate offers at most {FARGATE_MAX_MIB} MiB ({FARGATE_MAX_VCPUS:g} vCPU)"
             if most == FARGATE_MAX_MIB else f"the queue can place at most {most} MiB")
    return f"{where}, and {last} MiB was tried"


def as_placement(placeable: Union[Placement, int, None]) -> Placement:
    return placeable if isinstance(placeable, Placement) else Placement("LOCAL", placeable)


# -- sizing on EC2 -------------------------------------------------------------------------------
def ec2_usable_mib(installed_mib: int) -> int:
    """The container memory an instance of ``installed_mib`` can hold, with AWS's headroom."""
    return int(installed_mib * (1 - EC2_HEADROOM))


def ec2_next_memory(last_mib: int) -> int:
    """Twice ``last_mib``, lowered below the power-of-two instance size it would land on or just
    under (4096 -> 3891): most instance types have 2^k GiB installed, and a container of all of
    it makes Batch pick the next larger type, or none."""
    wanted = last_mib * 2
    size = max(1024, 1 << max(0, math.ceil(math.log2(wanted))))
    return min(wanted, ec2_usable_mib(size))


def instance_type_queries(instance_types: Iterable[str]) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """A compute environment's ``instanceTypes`` as (exact types, families): "m5.large" is a
    type, "m5" a family (every size of it), "optimal"/"default_x86_64"/"default_arm64" the
    families of DEFAULT_FAMILIES."""
    exact: List[str] = []
    families: List[str] = []
    for name in instance_types:
        if name in DEFAULT_FAMILIES:
            families.extend(f for f in DEFAULT_FAMILIES[name] if f not in families)
        elif "." in name:
            exact.append(name)
        elif name not in families:
            families.append(name)
    return tuple(exact), tuple(families)


def queue_max_memory_mib(compute_environments: Sequence[Mapping[str, Any]],
                         installed: Callable[[Sequence[str]], Optional[int]]
                         ) -> Tuple[Platform, Optional[int]]:
    """The platform of a queue's ENABLED compute environments (DescribeComputeEnvironments
    entries) and the most container memory one of them can place; None when some cannot say
    (unmanaged, unknown instance types), since it might place more.

    ``installed(instance_types)``: the largest installed memory (MiB) of those instanceTypes
    entries (EC2 DescribeInstanceTypes), None when unknown.
    """
    platform: Platform = "EC2"
    best: Optional[int] = 0
    for environment in compute_environments:
        if environment.get("state", "ENABLED") != "ENABLED":
            continue
        resources = environment.get("computeResources") or {}
        kind = str(resources.get("type") or "")
        mib: Optional[int] = None  # unmanaged (any instance may join) or unknown types
        if kind.startswith("FARGATE"):
            platform, mib = "FARGATE", FARGATE_MAX_MIB
        elif resources.get("instanceTypes"):
            most = installed(list(resources["instanceTypes"]))
            mib = ec2_usable_mib(most) if most else None
        best = None if best is None or mib is None else max(best, mib)
    return platform, (best or None)


# -- sizing on Fargate ---------------------------------------------------------------------------
def fargate_pairs() -> List[Tuple[float, int]]:
    """Every (vCPU, memory MiB) pair AWS Batch accepts on Fargate, by memory then vCPU."""
    return sorted(((float(v), m) for v, sizes in FARGATE_MEMORY.items() for m in sizes),
                  key=lambda pair: (pair[1], pair[0]))


def fargate_next_pair(vcpus: float, last_mib: int, cap_mib: Optional[int] = None,
                      max_vcpus: Optional[float] = None) -> Optional[Tuple[float, int]]:
    """The smallest pair with at least ``vcpus`` (and at most ``max_vcpus``, the vCPUs one job
    can get) that holds twice ``last_mib``; past the cap (``cap_mib``, and Fargate's largest),
    the largest pair under it if that is more than ``last_mib``; None when no pair is."""
    cap = min(cap_mib or FARGATE_MAX_MIB, FARGATE_MAX_MIB)
    most_vcpus = FARGATE_MAX_VCPUS if max_vcpus is None else max_vcpus
    fitting = [(v, m) for v, m in fargate_pairs() if vcpus <= v <= most_vcpus and m <= cap]
    for pair in fitting:
        if pair[1] >= last_mib * 2:
            return pair
    larger = [pair for pair in fitting if pair[1] > last_mib]
    if not larger:
        return None
    most = max(m for _, m in larger)
    return min((pair for pair in larger if pair[1] == most), key=lambda pair: pair[0])


def fargate_vcpu_cap(compute_environments: Sequence[Mapping[str, Any]],
                     quotas: Mapping[str, Optional[float]]) -> Optional[float]:
    """The most vCPUs one job can get on a queue's ENABLED Fargate compute environments
    (DescribeComputeEnvironments entries): per environment the least of its maxvCpus and the
    account's quota for its kind (``quotas``: "FARGATE"/"FARGATE_SPOT" -> vCPUs, None or absent
    when unread), the most over them; None when none is Fargate."""
    best: Optional[float] = None
    for environment in compute_environments:
        resources = environment.get("computeResources") or {}
        kind = str(resources.get("type") or "")
        if environment.get("state", "ENABLED") != "ENABLED" or not kind.startswith("FARGATE"):
            continue
        limits = [float(value) for value in (resources.get("maxvCpus"), quotas.get(kind))
                  if value is not None]
        most = min(limits) if limits else float(FARGATE_MAX_VCPUS)
        best = most if best is None else max(best, most)
    return best


def read_fargate_quotas(service_quotas: Any, kinds: Iterable[str]) -> Dict[str, Optional[float]]:
    """The account's Fargate vCPU quota of each kind ("FARGATE", "FARGATE_SPOT") from Service
    Quotas' GetServiceQuota (the applied value); None for one that cannot be read (refused:
    the caller needs servicequotas:GetServiceQuota), logged once."""
    found: Dict[str, Optional[float]] = {}
    for kind in kinds:
        code = FARGATE_VCPU_QUOTAS.get(kind)
        if code is None:
            continue
        try:
            answer = batchapi.call(service_quotas.get_service_quota,
                                   ServiceCode=FARGATE_SERVICE_CODE, QuotaCode=code)
            found[kind] = float(answer["Quota"]["Value"])
        except Exception as error:  # refused or unknown: the steps are capped by maxvCpus alone
            found[kind] = None
            logger.info("batchfutures: cannot read the account's %s vCPU quota (Service Quotas "
                        "%s/%s: %s); retry_on_oom's Fargate steps are capped by the compute "
                        "environments' maxvCpus only. Allow servicequotas:GetServiceQuota, or see "
                        "docs/aws.md on the Fargate vCPU quota.", kind, FARGATE_SERVICE_CODE, code,
                        getattr(error, "response", {}).get("Error", {}).get("Code") or error)
    return found


def learn_fargate_vcpus(batch: BatchAPI, job_queue: str, service_quotas: Callable[[], Any]
                        ) -> Optional[float]:
    """``fargate_vcpu_cap`` of ``job_queue``: DescribeJobQueues, DescribeComputeEnvironments,
    then GetServiceQuota for each kind of Fargate environment it has (``service_quotas()``:
    the Service Quotas client, made only then)."""
    queues = batchapi.call(batch.describe_job_queues, jobQueues=[job_queue]).get("jobQueues") or []
    names = [entry["computeEnvironment"]
             for queue in queues[:1] for entry in queue.get("computeEnvironmentOrder") or []]
    if not names:
        return None
    described = list(batchapi.call(batch.describe_compute_environments,
                                   computeEnvironments=names).get("computeEnvironments") or [])
    kinds = sorted({str((e.get("computeResources") or {}).get("type") or "") for e in described}
                   & set(FARGATE_VCPU_QUOTAS))
    quotas = read_fargate_quotas(service_quotas(), kinds) if kinds else {}
    return fargate_vcpu_cap(described, quotas)


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


class PlacementSource(Protocol):
    """What `placement_of` asks of an environment (environments.Environment declares it all)."""

    @property
    def batch(self) -> BatchAPI: ...

    @property
    def job_queue(self) -> str: ...

    def oom_placement(self) -> Placement: ...

    def max_memory_mib(self) -> Optional[int]: ...

    def client(self, service: str) -> Any: ...


def placement_of(env: PlacementSource) -> Placement:
    """How ``env``'s queue sizes jobs: its ``oom_placement()`` (AWSBatchEnvironment: learned
    from the queue; a LocalEnvironment: LOCAL capped at the machine's memory, what
    validate_settings allows), else LOCAL capped at its ``max_memory_mib()``."""
    try:
        return with_fargate_vcpus(env.oom_placement(), env)
    except Exception as error:  # unknown then: the doubling is not capped
        logger.debug("batchfutures: oom_placement() failed: %r", error)
    return Placement("LOCAL", placeable_memory_mib(env))


def with_fargate_vcpus(placement: Placement, env: PlacementSource) -> Placement:
    """A Fargate placement with ``max_vcpus`` learned once from ``env``'s queue and account
    (``learn_fargate_vcpus``: its ``batch``, ``job_queue`` and ``client("service-quotas")``);
    as it is when that cannot be read (then no vCPU cap but Fargate's own)."""
    if placement.platform != "FARGATE" or placement.max_vcpus is not None:
        return placement
    try:
        most = learn_fargate_vcpus(env.batch, env.job_queue, lambda: env.client("service-quotas"))
    except Exception as error:  # the queue unreadable here: SubmitJob still says what is wrong
        logger.debug("batchfutures: cannot learn the Fargate vCPU cap: %r", error)
        return placement
    return replace(placement, max_vcpus=most)


def placeable_memory_mib(env: PlacementSource) -> Optional[int]:
    """The largest memory (MiB) a job of ``env``'s queue can be placed with; None: unknown."""
    try:
        return env.max_memory_mib()
    except Exception as error:  # unknown then: the doubling is not capped
        logger.debug("batchfutures: max_memory_mib() failed: %r", error)
        return None


# Submitter.resubmit(source job, its children, memory MiB, their histories, retry): the new job
Resubmit = Callable[[Any, List[int], int, List[ChildHistory], "OomRetry"], Any]


class OomRetry:
    """A TrackedJob's ``retry`` when its settings have ``retry_on_oom > 0``.

    ``history``: for the children of this job that are retries, their origin and earlier tries.
    Called on the poller thread only (TrackedJob.apply).
    """

    def __init__(self, settings: JobSettings, *, placeable_mib: Union[Placement, int, None],
                 resubmit: Resubmit, history: Optional[Mapping[int, ChildHistory]] = None,
                 name: str = "bf-retry") -> None:
        self.settings = settings
        self.name = name  # the Batch job name, kept by the retries
        self.placement = as_placement(placeable_mib)
        self._resubmit = resubmit
        self.history = dict(history or {})

    @property
    def placeable_mib(self) -> Optional[int]:
        return self.placement.max_mib

    def with_memory(self, memory_mib: int) -> JobSettings:
        """The settings of a retry with ``memory_mib``; on Fargate with the vCPUs of its pair."""
        if self.placement.platform == "FARGATE":
            vcpus = min((v for v, m in fargate_pairs()
                         if m == memory_mib and v >= self.settings.vcpus), default=None)
            if vcpus is not None:
                return replace(self.settings, memory=memory_mib, vcpus=vcpus)
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
            if isinstance(error, JobUnplaceableError) and index in self.history \
                    and self.history[index].tries:
                # the queue's time limit cancelled a retry it could not place: the memory is why
                decided[index] = self.unplaceable_error(
                    index, job.memory_mib, error.reason or error.status_reason or "")
                continue
            if not isinstance(error, MemoryLimitExceeded):
                continue
            earlier = self.history.get(index)
            memory = error.memory_mib or job.memory_mib  # Batch's own account first
            if memory is None:  # nothing to double
                continue
            tries = (earlier.tries if earlier else ()) + (Try(int(memory), job.child_id(index)),)
            origin = earlier.origin if earlier else (job.job_url, index)
            decision = decide([t.memory_mib for t in tries], self.settings.retry_on_oom,
                              self.placement, self.settings.vcpus)
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
