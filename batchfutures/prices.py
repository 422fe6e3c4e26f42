"""The shipped price table: what a vCPU, a GiB and an instance cost an hour (costs.py reads it).

Source and date: AWS's public pricing pages, US East (N. Virginia), Linux, on-demand, as listed
in 2025-2026 (aws.amazon.com/fargate/pricing and aws.amazon.com/ec2/pricing/on-demand; the
Fargate rates and g5.xlarge checked against third-party copies of those pages dated 2026-03 and
2026-06). Prices change and differ by Region: these are an estimate, never a bill. Spot prices
move by the hour and the Availability Zone (EC2 DescribeSpotPriceHistory), so there is no Spot
column: an EC2 Spot call is estimated at the on-demand price (an upper bound), Fargate Spot at
FARGATE_SPOT_FRACTION of Fargate's ("up to 70% off", the Fargate pricing page).

Sizes: every family here doubles vCPUs, memory and price from one size to the next (large = 2
vCPUs), so a family's price per vCPU-hour and its memory per vCPU give every size; the GPU
families do not scale that way and are listed by the one size the stack's GPU types start at.
The families are the project's own: oomretry.DEFAULT_FAMILIES (what "optimal",
"default_x86_64" and "default_arm64" mean) and the template's GpuInstanceTypes (g4dn, g5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional

__all__ = ["PRICES_AS_OF", "REGION", "FARGATE", "FARGATE_SPOT_FRACTION", "Family", "FAMILIES",
           "INSTANCES", "Instance", "LiveRates"]

PRICES_AS_OF = "2026-06"
REGION = "us-east-1"


class FargateRate(NamedTuple):
    vcpu_hour: float  # USD per vCPU-hour
    gb_hour: float  # USD per GB-hour of memory


FARGATE: Dict[str, FargateRate] = {
    "X86_64": FargateRate(0.04048, 0.004445),
    "ARM64": FargateRate(0.03238, 0.00356),
}
FARGATE_SPOT_FRACTION = 0.3  # Fargate Spot: "up to 70% off" Fargate's on-demand price


class Family(NamedTuple):
    vcpu_hour: float  # USD per vCPU-hour of the family's instances (the large's price / 2)
    gib_per_vcpu: float


FAMILIES: Dict[str, Family] = {
    # on-demand large (2 vCPU): m6i $0.096, c6i $0.085, r6i $0.126, c7i $0.08925
    "m6i": Family(0.048, 4), "c6i": Family(0.0425, 2), "r6i": Family(0.063, 8),
    "c7i": Family(0.044625, 2),
    # Graviton large: m6g $0.077, c6g $0.068, r6g $0.1008, c7g $0.0725
    "m6g": Family(0.0385, 4), "c6g": Family(0.034, 2), "r6g": Family(0.0504, 8),
    "c7g": Family(0.03625, 2),
}


class Instance(NamedTuple):
    hour: float  # USD per instance-hour
    vcpus: int
    gib: float
    gpus: int = 0


INSTANCES: Dict[str, Instance] = {
    "g4dn.xlarge": Instance(0.526, 4, 16, 1),
    "g5.xlarge": Instance(1.006, 4, 16, 1),
}


@dataclass(frozen=True)
class LiveRates:
    """Prices read from AWS for one queue (liveprices.read_rates); None where a read gave nothing.
    costs.estimate prefers them to the table above and names their source."""

    source: str  # "AWS Price List, eu-west-1, read 2026-12-06"
    fargate: Optional[FargateRate] = None
    instance: Optional[Instance] = None  # its hour is the Spot price on a Spot queue
