"""future.cost: a call's share of what ran it, priced from the shipped table (pure)."""

import ast
import inspect

import pytest

from batchfutures import costs, prices
from batchfutures.costs import Pricing


@pytest.mark.parametrize("instance_type, hour, vcpus, gib", [
    ("m6i.large", 0.096, 2, 8),
    ("c6i.4xlarge", 0.68, 16, 32),
    ("r6i.xlarge", 0.252, 4, 32),
    ("c7g.medium", 0.03625, 1, 2),
    ("g5.xlarge", 1.006, 4, 16),
    ("m5.large", None, None, None),  # not in the table
    ("nonsense", None, None, None),
    (None, None, None, None),
])
def test_instances_of_the_table(instance_type, hour, vcpus, gib):
    instance = costs.instance_of(instance_type)
    if hour is None:
        assert instance is None
    else:
        assert instance.hour == pytest.approx(hour) and (instance.vcpus, instance.gib) == (vcpus, gib)


@pytest.mark.parametrize("vcpus, memory_mib, instance_type, share", [
    (1, 2048, "m6i.large", 0.5),  # half the vCPUs, a quarter of the memory
    (1, 6144, "m6i.large", 0.75),  # memory is the larger part
    (4, 1024, "m6i.large", 1.0),  # never more than the instance
    (0.25, 512, "c6i.xlarge", 0.0625),
])
def test_a_calls_share_is_the_larger_of_its_vcpu_and_memory_parts(vcpus, memory_mib, instance_type, share):
    assert costs.share_of(vcpus, memory_mib, costs.instance_of(instance_type)) == pytest.approx(share)


@pytest.mark.parametrize("wall_s, vcpus, memory_mib, pricing, gpus, usd, basis", [
    # Fargate: 1 vCPU 2 GiB for an hour
    (3600, 1, 2048, Pricing("FARGATE"), 0, 0.04048 + 2 * 0.004445, "Fargate x86_64"),
    (1800, 2, 4096, Pricing("FARGATE", architecture="ARM64"), 0, 0.5 * (2 * 0.03238 + 4 * 0.00356),
     "Fargate arm64"),
    (3600, 1, 2048, Pricing("FARGATE", spot=True), 0, 0.3 * (0.04048 + 2 * 0.004445), "Fargate Spot"),
    (3600, 1, 2048, costs.LOCAL, 0, 0.04048 + 2 * 0.004445, "the local emulator, priced as"),
    # EC2: half an m6i.large for an hour
    (3600, 1, 2048, Pricing("EC2", instance_type="m6i.large"), 0, 0.048, "EC2 m6i.large on demand"),
    (3600, 1, 2048, Pricing("EC2", spot=True, instance_type="m6i.large"), 0, 0.048, "upper bound"),
    (3600, 1, 2048, Pricing("EC2", instance_type="c6i"), 0, 0.0425, "EC2 c6i"),  # a family
    (3600, 1, 2048, Pricing("EC2"), 0, 0.048, "m6i (type unknown)"),
    (3600, 1, 4096, Pricing("EC2", instance_type="g5.xlarge"), 1, 1.006, "g5.xlarge"),  # its one GPU
    (0, 1, 2048, Pricing("FARGATE"), 0, 0.0, "Fargate"),
    (-5, 1, 2048, Pricing("FARGATE"), 0, 0.0, "Fargate"),
])
def test_estimates(wall_s, vcpus, memory_mib, pricing, gpus, usd, basis):
    estimate = costs.estimate(wall_s, vcpus, memory_mib, pricing, gpus)
    assert estimate.usd == pytest.approx(usd)
    assert basis in estimate.basis and prices.PRICES_AS_OF in estimate.basis


def test_the_table_covers_the_projects_instance_families_and_says_where_it_comes_from():
    from batchfutures.oomretry import DEFAULT_FAMILIES

    for families in DEFAULT_FAMILIES.values():
        for family in families:
            assert costs.instance_of(f"{family}.large") is not None, family
    assert {"g4dn.xlarge", "g5.xlarge"} <= set(prices.INSTANCES)  # the template's GpuInstanceTypes
    doc = ast.get_docstring(ast.parse(inspect.getsource(prices)))
    assert "Source and date" in doc and prices.PRICES_AS_OF[:4] in doc


def _ce(kind, state="ENABLED", types=None):
    resources = {"type": kind}
    if types is not None:
        resources["instanceTypes"] = types
    return {"state": state, "computeResources": resources}


@pytest.mark.parametrize("environments, expected", [
    ([_ce("FARGATE")], Pricing("FARGATE")),
    ([_ce("FARGATE_SPOT"), _ce("FARGATE")], Pricing("FARGATE", spot=True)),
    ([_ce("SPOT", types=["optimal"])], Pricing("EC2", spot=True)),
    ([_ce("EC2", types=["c6i.2xlarge", "m6i"])], Pricing("EC2", instance_type="c6i.2xlarge")),
    ([_ce("EC2", types=["r6i"])], Pricing("EC2", instance_type="r6i")),
    ([_ce("SPOT", state="DISABLED"), _ce("EC2", types=["m5"])], Pricing("EC2")),  # m5: not priced
    ([], Pricing("FARGATE")),
])
def test_pricing_from_the_queues_first_enabled_compute_environment(environments, expected):
    assert costs.pricing_from(environments) == expected
