"""What a call cost in dollars: its share of what ran it, over its run time (pure; docs/cost.md).

    Fargate (and the emulator)   vCPUs x hours x per-vCPU-hour + GB x hours x per-GB-hour
    Fargate Spot                 the same x prices.FARGATE_SPOT_FRACTION
    EC2 (on-demand or Spot)      instance price x the call's share of the instance x hours;
                                 share = max(vCPUs / its vCPUs, memory / its memory), since a
                                 call holding half the memory keeps half the host from others

The hours are the call's measured wall time (usage.Usage.wall_s, from the worker), not the
task's: container start, image pull and the one-minute minimum Fargate bills per task are not
counted. Where the instance type is unknown (Batch does not report it), an EC2 call is priced
at the cheapest vCPU of the general-purpose family of "optimal" (m6i); the basis says so.
The emulator's local run costs what the equivalent Fargate task (x86_64) would, and says so.
Prices: those read from AWS (Pricing.rates, liveprices.py) when there are, else the shipped
table, prices.py (its source and date); the basis names which.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from . import prices

__all__ = ["Pricing", "Estimate", "estimate", "instance_of", "share_of", "LOCAL", "DEFAULT_FAMILY",
           "pricing_from", "CallPricing", "usd_text",
           "of_usage", "cost_text"]

DEFAULT_FAMILY = "m6i"  # "optimal"'s general-purpose family (oomretry.DEFAULT_FAMILIES)
_SIZE_RE = re.compile(r"^([a-z0-9-]+)\.(medium|large|xlarge|([0-9]+)xlarge)$")
_HOUR = 3600.0


@dataclass(frozen=True)
class Pricing:
    """What runs an executor's calls: "FARGATE" or "EC2", on Spot or not, the instance type or
    family when known, the CPU architecture; ``local``: the emulator (priced as Fargate)."""

    platform: str = "FARGATE"
    spot: bool = False
    instance_type: Optional[str] = None
    architecture: str = "X86_64"
    local: bool = False
    rates: Optional[prices.LiveRates] = None  # read from AWS (liveprices.py), else the table


LOCAL = Pricing(platform="FARGATE", local=True)


@dataclass(frozen=True)
class Estimate:
    usd: float
    basis: str  # how it was priced, for status and docs: "Fargate x86_64, us-east-1 prices of ..."


def instance_of(instance_type: Optional[str]) -> Optional[prices.Instance]:
    """The table's instance of a type ("c6i.4xlarge", "g5.xlarge"), None when not in it."""
    if not instance_type:
        return None
    if instance_type in prices.INSTANCES:
        return prices.INSTANCES[instance_type]
    match = _SIZE_RE.match(instance_type)
    if not match or match.group(1) not in prices.FAMILIES:
        return None
    family = prices.FAMILIES[match.group(1)]
    size = match.group(2)
    vcpus = {"medium": 1, "large": 2, "xlarge": 4}.get(size) or 4 * int(match.group(3))
    return prices.Instance(family.vcpu_hour * vcpus, vcpus, family.gib_per_vcpu * vcpus)


def share_of(vcpus: float, memory_mib: float, instance: prices.Instance) -> float:
    """The part of ``instance`` a call of ``vcpus`` and ``memory_mib`` keeps from others (<= 1)."""
    return min(1.0, max(vcpus / instance.vcpus, memory_mib / 1024.0 / instance.gib))


def _as_of() -> str:
    return f"the shipped table, {prices.REGION} prices of {prices.PRICES_AS_OF}"


def estimate(wall_s: float, vcpus: float, memory_mib: float, pricing: Pricing = LOCAL,
             gpus: int = 0) -> Estimate:
    """The cost of one call that ran ``wall_s`` seconds holding ``vcpus`` and ``memory_mib``."""
    hours = max(0.0, wall_s) / _HOUR
    live = pricing.rates
    if pricing.platform.upper() == "FARGATE":
        rate = prices.FARGATE.get(pricing.architecture.upper(), prices.FARGATE["X86_64"])
        source = _as_of()
        if live is not None and live.fargate is not None and not pricing.local:
            rate, source = live.fargate, live.source
        usd = hours * (vcpus * rate.vcpu_hour + memory_mib / 1024.0 * rate.gb_hour)
        what = f"Fargate {pricing.architecture.lower()}"
        if pricing.spot:
            usd *= prices.FARGATE_SPOT_FRACTION
            what = f"Fargate Spot {pricing.architecture.lower()} (x{prices.FARGATE_SPOT_FRACTION})"
        if pricing.local:
            what = f"the local emulator, priced as the equivalent {what} task"
        return Estimate(usd, f"{what}, {source}")
    if live is not None and live.instance is not None:
        read = live.instance
        share = max(share_of(vcpus, memory_mib, read), gpus / read.gpus if read.gpus else 0)
        spot = " on Spot" if pricing.spot else " on demand"
        return Estimate(hours * read.hour * min(1.0, share), f"EC2 {pricing.instance_type}{spot}, "
                        f"share {min(1.0, share):.3g}, {live.source}")
    instance = instance_of(pricing.instance_type)
    if instance is None and pricing.instance_type and pricing.instance_type in prices.FAMILIES:
        instance = instance_of(f"{pricing.instance_type}.large")
    named = pricing.instance_type if instance is not None else None
    if instance is None and gpus:
        instance, named = prices.INSTANCES["g4dn.xlarge"], "g4dn.xlarge (GPU, type unknown)"
    if instance is None:
        instance, named = instance_of(f"{DEFAULT_FAMILY}.large"), f"{DEFAULT_FAMILY} (type unknown)"
    assert instance is not None
    share = max(share_of(vcpus, memory_mib, instance), gpus / instance.gpus if instance.gpus else 0)
    usd = hours * instance.hour * min(1.0, share)
    spot = " on Spot, at the on-demand price (an upper bound)" if pricing.spot else " on demand"
    return Estimate(usd, f"EC2 {named}{spot}, share {min(1.0, share):.3g}, {_as_of()}")


def usd_text(usd: Optional[float]) -> str:
    """``"~$0.0123"`` (status, the progress bar): 4 decimals under a dollar, cents above; "" when
    nothing was measured yet."""
    if not usd or usd <= 0:
        return ""
    if usd < 0.0001:
        return "<$0.0001"
    return f"~${usd:.4f}" if usd < 1 else f"~${usd:,.2f}"


def of_usage(usage: Any, pricing: Pricing) -> Optional[Estimate]:
    """A job's estimate so far from its usage.JobUsage (`status`: what future.cost sums, priced
    over its calls' measured wall time); None before a call was measured."""
    if usage is None or not usage.calls:
        return None
    return estimate(usage.wall_s, usage.vcpus or 1.0, usage.memory_mib or 2048, pricing)


def cost_text(estimate: Estimate) -> str:
    """``"~$0.0123 (Fargate x86_64, AWS Price List, eu-west-1, read 2026-12-06)"``."""
    return f"{usd_text(estimate.usd) or '$0'} ({estimate.basis})"


def pricing_from(environments: Sequence[Mapping[str, Any]]) -> Pricing:
    """How a queue's calls are priced, from its compute environments (DescribeComputeEnvironments,
    in the queue's order): the first one ENABLED decides (Batch fills it first). Its
    ``computeResources.type`` says Fargate or EC2 and Spot or not; an EC2 one's first
    ``instanceTypes`` entry, when it is a type or family of the table, names the instance."""
    usable = [e for e in environments if e.get("state", "ENABLED") == "ENABLED"] or list(environments)
    if not usable:
        return Pricing("FARGATE")
    resources = usable[0].get("computeResources") or {}
    kind = str(resources.get("type") or "EC2").upper()
    if kind.startswith("FARGATE"):
        return Pricing("FARGATE", spot=kind == "FARGATE_SPOT")
    named = None
    for entry in resources.get("instanceTypes") or ():
        if instance_of(entry) is not None or entry in prices.FAMILIES:
            named = str(entry)
            break
    return Pricing("EC2", spot=kind == "SPOT", instance_type=named)


@dataclass(frozen=True)
class CallPricing:
    """What prices a job's calls: how its queue is priced and what each call holds."""

    pricing: Pricing
    vcpus: float
    memory_mib: float
    gpus: int = 0

    def cost(self, usage: Any) -> Optional[float]:
        """USD of one call from its usage.Usage (its wall_s); None when it was not measured."""
        wall_s = getattr(usage, "wall_s", None)
        if wall_s is None:
            return None
        return estimate(float(wall_s), self.vcpus, self.memory_mib, self.pricing, self.gpus).usd
