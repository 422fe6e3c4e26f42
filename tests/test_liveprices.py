"""Prices read from AWS (batchfutures/liveprices.py): GetProducts' PriceList documents and EC2's
Spot price history parsed (recorded answers in AWS's documented shape), the Spot history read
from moto's EC2 on 127.0.0.1, the day-long cache, and the fallback to the shipped table."""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import boto3
import pytest
from botocore.stub import Stubber
from s3server import (  # noqa: F401
    aws_env,
    emulator_endpoint,
    emulator_environment,
    moto_server,
    new_bucket,
)

from batchfutures import costs, liveprices, prices, spending
from batchfutures.costs import Pricing
from batchfutures.prices import LiveRates


def product(attributes: Dict[str, str], usd: str, unit: str = "Hrs", sku: str = "SKU1") -> str:
    """One PriceList entry as GetProducts returns it (FormatVersion aws_v1): a JSON string."""
    return json.dumps({
        "product": {"productFamily": "Compute", "attributes": attributes, "sku": sku},
        "serviceCode": attributes.get("servicecode", "AmazonEC2"),
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
            "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                "unit": unit, "endRange": "Inf", "beginRange": "0",
                "description": f"${usd} per {unit}", "appliesTo": [],
                "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7", "pricePerUnit": {"USD": usd}}},
            "sku": sku, "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": "JRTCKXETXF",
            "termAttributes": {}}}},
        "version": "20261101000000", "publicationDate": "2026-11-01T00:00:00Z"})


def fargate(usage: str, usd: str) -> str:
    return product({"servicecode": "AmazonECS", "regionCode": "eu-west-1", "usagetype": usage,
                    "location": "EU (Ireland)"}, usd, sku=usage.replace(":", ""))


ECS_EU_WEST_1 = [
    fargate("EU-Fargate-vCPU-Hours:perCPU", "0.0404800000"),
    fargate("EU-Fargate-GB-Hours", "0.0044450000"),
    fargate("EU-Fargate-ARM-vCPU-Hours:perCPU", "0.0323800000"),
    fargate("EU-Fargate-ARM-GB-Hours", "0.0035600000"),
    fargate("EU-Fargate-EphemeralStorage-GB-Hours", "0.0001110000"),
]


def ec2(instance_type: str, usd: str, vcpu: str, memory: str, gpu: str = "") -> str:
    attributes = {"instanceType": instance_type, "vcpu": vcpu, "memory": memory,
                  "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
                  "capacitystatus": "Used", "regionCode": "eu-west-1"}
    if gpu:
        attributes["gpu"] = gpu
    return product(attributes, usd, sku=instance_type.replace(".", ""))


@pytest.mark.parametrize("price_list, architecture, expected", [
    (ECS_EU_WEST_1, "X86_64", prices.FargateRate(0.04048, 0.004445)),
    (ECS_EU_WEST_1, "ARM64", prices.FargateRate(0.03238, 0.00356)),
    (ECS_EU_WEST_1[:1], "X86_64", None),  # no GB-hour product: not a rate
    ([fargate("EU-Fargate-vCPU-Hours:perCPU", "0.0000000000"),
      fargate("EU-Fargate-GB-Hours", "0.0044450000")], "X86_64", None),  # a zero price is none
    ([], "X86_64", None),
])
def test_fargate_rates(price_list: List[str], architecture: str, expected: Any) -> None:
    assert liveprices.fargate_rates(price_list, architecture) == expected


@pytest.mark.parametrize("price_list, instance_type, expected", [
    ([ec2("m6i.large", "0.1070000000", "2", "8 GiB")], "m6i.large", prices.Instance(0.107, 2, 8.0)),
    ([ec2("c6i.large", "0.0960000000", "2", "4 GiB"), ec2("m6i.2xlarge", "0.4280000000", "8",
                                                          "32 GiB")],
     "m6i.2xlarge", prices.Instance(0.428, 8, 32.0)),
    ([ec2("g5.xlarge", "1.1230000000", "4", "16 GiB", gpu="1")], "g5.xlarge",
     prices.Instance(1.123, 4, 16.0, 1)),
    ([ec2("r6i.large", "0.1260000000", "2", "16 GiB")], "m6i.large", None),  # not the type asked
    ([ec2("m6i.large", "bad", "2", "8 GiB")], "m6i.large", None),
])
def test_instance_from_products(price_list: List[str], instance_type: str, expected: Any) -> None:
    assert liveprices.instance_from_products(price_list, instance_type) == expected


def spot(zone: str, usd: str, when: str, instance_type: str = "c6i.large") -> Dict[str, Any]:
    return {"AvailabilityZone": zone, "InstanceType": instance_type,
            "ProductDescription": "Linux/UNIX", "SpotPrice": usd, "Timestamp": when}


@pytest.mark.parametrize("history, expected", [
    ([spot("eu-west-1a", "0.0300", "2026-12-06T01:00:00Z"),
      spot("eu-west-1a", "0.0350", "2026-12-06T03:00:00Z")], 0.035),  # the latest of a zone
    ([spot("eu-west-1a", "0.0350", "2026-12-06T03:00:00Z"),
      spot("eu-west-1b", "0.0410", "2026-12-06T02:00:00Z")], 0.041),  # the highest zone
    ([spot("eu-west-1a", "0.0350", "2026-12-06T03:00:00Z", "m6i.large")], None),  # another type
    ([], None),
])
def test_latest_spot(history: List[Dict[str, Any]], expected: Any) -> None:
    assert liveprices.latest_spot(history, "c6i.large") == expected


@pytest.mark.parametrize("region, endpoint", [
    ("us-east-1", "us-east-1"), ("us-west-2", "us-east-1"), ("eu-west-1", "eu-central-1"),
    ("eu-central-1", "eu-central-1"), ("ap-northeast-1", "ap-south-1"), (None, "us-east-1"),
])
def test_price_list_region(region: Any, endpoint: str) -> None:
    assert liveprices.price_list_region(region) == endpoint
    assert set(liveprices.PRICE_LIST_REGIONS) == set(
        boto3.session.Session().get_available_regions("pricing"))


@pytest.mark.parametrize("pricing, usd, basis", [
    (Pricing("FARGATE", rates=LiveRates("AWS Price List, eu-west-1, read 2026-12-06",
                                        fargate=prices.FargateRate(0.05, 0.005))),
     0.05 + 2 * 0.005, "Fargate x86_64, AWS Price List, eu-west-1, read 2026-12-06"),
    (Pricing("EC2", spot=True, instance_type="c6i.large",
             rates=LiveRates("AWS Price List and Spot price history, eu-west-1, read 2026-12-06",
                             instance=prices.Instance(0.04, 2, 4.0))),
     0.02, "EC2 c6i.large on Spot, share 0.5, AWS Price List and Spot"),
    (Pricing("FARGATE"), 0.04048 + 2 * 0.004445, "the shipped table"),
])
def test_estimate_names_its_source(pricing: Pricing, usd: float, basis: str) -> None:
    estimate = costs.estimate(3600, 1, 2048, pricing)
    assert estimate.usd == pytest.approx(usd)
    assert basis in estimate.basis


class StubbedSession:
    """A boto3 Session whose pricing client answers recorded GetProducts pages (moto has no
    Price List) and whose other clients are boto3's, on moto's server."""

    def __init__(self, pages: List[List[str]]) -> None:
        self.session = boto3.session.Session()
        self.pricing = self.session.client("pricing", region_name="us-east-1")
        self.stubber = Stubber(self.pricing)
        for number, page in enumerate(pages, 1):
            more = {"NextToken": f"page{number + 1}"} if number < len(pages) else {}
            self.stubber.add_response("get_products",
                                      {"PriceList": page, "FormatVersion": "aws_v1", **more})
        self.stubber.activate()
        self.regions: List[str] = []

    def client(self, service: str, region_name: str, config: Any = None) -> Any:
        self.regions.append(region_name)
        if service == "pricing":
            return self.pricing
        return self.session.client(service, region_name=region_name, config=config)


@pytest.fixture(autouse=True)
def fresh_cache() -> None:
    liveprices._cache.clear()


def test_spot_history_read_from_moto_with_the_price_list(aws_env: Dict[str, str],  # noqa: F811
                                                         tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # moto's first EC2 request can take seconds on a busy machine: not the deadline's test
    monkeypatch.setattr(liveprices, "READ_DEADLINE_S", 120.0)
    session = StubbedSession([[ec2("c6i.large", "0.0960000000", "2", "4 GiB")]])
    ec2_client = boto3.client("ec2", region_name="us-east-1")
    rates = liveprices.read_rates(session, ec2_client, "us-east-1", "EC2", "X86_64", "c6i.large",
                                  True, tmp_path)
    assert rates is not None and rates.instance is not None
    assert rates.instance.vcpus == 2 and rates.instance.gib == 4.0
    assert rates.instance.hour == pytest.approx(0.00001)  # moto's recorded Spot price
    assert "Spot price history, us-east-1, read " in rates.source
    assert session.regions == ["us-east-1"]
    session.stubber.assert_no_pending_responses()
    # cached on disk for a day: a new process (an empty memory cache) reads no AWS
    liveprices._cache.clear()
    again = liveprices.read_rates(StubbedSession([]), ec2_client, "us-east-1", "EC2", "X86_64",
                                  "c6i.large", True, tmp_path)
    assert again == rates
    # a day later it is read again
    liveprices._cache.clear()
    later = StubbedSession([[ec2("c6i.large", "0.0970000000", "2", "4 GiB")]])
    assert liveprices.read_rates(later, ec2_client, "us-east-1", "EC2", "X86_64", "c6i.large",
                                 False, tmp_path, now=2e10) is not None
    later.stubber.assert_no_pending_responses()


def test_fargate_rates_read_and_paged(tmp_path: Path) -> None:
    session = StubbedSession([ECS_EU_WEST_1[:2], ECS_EU_WEST_1[2:]])
    rates = liveprices.read_rates(session, None, "eu-west-1", "FARGATE", "ARM64", None, False,
                                  tmp_path)
    assert rates is not None and rates.fargate == prices.FargateRate(0.03238, 0.00356)
    assert session.regions == ["eu-central-1"]
    session.stubber.assert_no_pending_responses()


def test_a_refused_read_falls_back_once_at_debug(aws_env: Dict[str, str],  # noqa: F811
                                                 tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """moto serves no Price List: the read fails, None (the table), logged at DEBUG, no file."""
    liveprices._logged = False
    caplog.set_level(logging.DEBUG, logger="batchfutures")
    session = boto3.session.Session()
    for _ in range(2):
        assert liveprices.read_rates(session, None, "us-east-1", "FARGATE", "X86_64", None, False,
                                     tmp_path) is None
    assert len([r for r in caplog.records if "shipped table is used" in r.getMessage()]) == 1
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == "batchfutures")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("endpoint, aws", [
    ("https://batch.eu-west-1.amazonaws.com", True),
    ("https://batch.cn-north-1.amazonaws.com.cn", True),
    ("http://127.0.0.1:5123", False),  # the emulator's endpoint: the shipped table
    ("https://batch.example.amazonaws.com.evil.test", False),
])
def test_only_aws_endpoints_read_aws_prices(endpoint: str, aws: bool) -> None:
    assert spending._is_aws(endpoint) is aws


def test_the_emulators_endpoint_keeps_the_shipped_table(tmp_path: Path, s3_endpoint: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """On the AWS path against the emulator's endpoint no AWS price applies: no read, no cache."""
    monkeypatch.setenv("BATCHFUTURES_WORKDIR", str(tmp_path / "work"))
    with emulator_endpoint(tmp_path / "emulator", max_vcpus=2):
        env = emulator_environment("bf-prices")
        pricing = spending.pricing_of(env)
    assert pricing.rates is None and not pricing.local
    assert "the shipped table" in costs.estimate(60, 1, 2048, pricing).basis
    assert not (tmp_path / "work" / "prices").exists()


class SlowPriceList:
    """A Price List client whose every GetProducts answers after ``seconds`` (a stand-in for
    an unreachable endpoint: botocore's Stubber cannot wait), then fails or answers ``pages``."""

    def __init__(self, seconds: float, pages: Optional[List[List[str]]] = None) -> None:
        self.seconds, self.pages, self.calls = seconds, pages, 0
        self.released = threading.Event()  # set: answer at once (a test's end)
        self.asked = threading.Event()  # set: the first GetProducts was sent
        self.in_flight = self.most_in_flight = 0
        self._count = threading.Lock()

    def get_paginator(self, operation: str) -> Any:
        assert operation == "get_products"
        return self

    def paginate(self, **request: Any) -> Iterator[Dict[str, Any]]:
        for number, page in enumerate(self.pages or [[]], 1):
            with self._count:
                self.calls += 1
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.asked.set()
            self.released.wait(self.seconds)
            with self._count:
                self.in_flight -= 1
            if self.pages is None:
                raise TimeoutError("read timeout on the Price List endpoint")
            more = {"NextToken": f"page{number + 1}"} if number < len(self.pages) else {}
            yield {"PriceList": page, **more}


class SlowSession:
    def __init__(self, pricing: SlowPriceList) -> None:
        self.pricing = pricing

    def client(self, service: str, region_name: str, config: Any = None) -> Any:
        assert service == "pricing" and config is not None
        return self.pricing


def read(session: Any, instance_type: str, folder: Path) -> Any:
    return liveprices.read_rates(session, None, "eu-west-1", "EC2", "X86_64", instance_type,
                                 False, folder)


def test_slow_reads_of_different_keys_run_side_by_side_and_failures_are_kept(
        tmp_path: Path) -> None:
    """The review's case: GetProducts takes 1 s then times out. Two types asked at once end
    together (not one after the other), and asking again answers at once (the failure is kept
    in the process, not written to disk)."""
    pricing = SlowPriceList(1.0)
    session = SlowSession(pricing)
    with ThreadPoolExecutor(2) as pool:
        reads = [pool.submit(read, session, kind, tmp_path)
                 for kind in ("c6i.large", "m6i.large")]
        results = [done.result() for done in reads]
    assert results == [None, None]
    assert pricing.most_in_flight == 2  # side by side: serialised, one at a time
    assert pricing.calls == 2
    assert read(session, "c6i.large", tmp_path) is None and pricing.calls == 2  # no read again
    assert list(tmp_path.iterdir()) == []


def test_a_failure_is_tried_again_after_its_age(tmp_path: Path) -> None:
    session = SlowSession(SlowPriceList(0.0))
    assert liveprices.read_rates(session, None, "eu-west-1", "FARGATE", "X86_64", None, False,
                                 tmp_path, now=1000.0) is None
    later = StubbedSession([ECS_EU_WEST_1])
    rates = liveprices.read_rates(later, None, "eu-west-1", "FARGATE", "X86_64", None, False,
                                  tmp_path, now=1000.0 + liveprices.FAILURE_AGE_S + 1)
    assert rates is not None and rates.fargate == prices.FargateRate(0.04048, 0.004445)


def test_callers_of_one_key_share_one_read_within_the_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read that hangs: every caller of that key is answered (the table) by the read's
    deadline, with one GetProducts between them; no new read until the failure's age."""
    monkeypatch.setattr(liveprices, "READ_DEADLINE_S", 0.5)
    pricing = SlowPriceList(30.0)
    session = SlowSession(pricing)
    try:
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(lambda _: read(session, "c6i.large", tmp_path), range(3)))
        assert results == [None] * 3
        assert pricing.in_flight == 1  # answered while the read still hangs: by the deadline
        assert pricing.calls == 1
        assert read(session, "c6i.large", tmp_path) is None and pricing.calls == 1
    finally:
        pricing.released.set()  # the abandoned read ends


def test_the_deadline_stops_paging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages that answer slowly: no page is asked for past the read's deadline."""
    monkeypatch.setattr(liveprices, "READ_DEADLINE_S", 0.3)
    pricing = SlowPriceList(0.2, pages=[[]] * 20)
    assert read(SlowSession(pricing), "c6i.large", tmp_path) is None
    reading = liveprices._reading.get("eu-west-1-EC2-X86_64-c6i.large-od")
    if reading is not None:  # the read's own thread stops at its next page
        assert reading[0].wait(5)
    assert pricing.calls <= 3


@pytest.mark.slow
def test_a_submit_does_not_wait_for_prices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    """Pricing is read when a cost is first asked, not on the submitting thread: while the
    price read hangs, submit returns; once it answers, the ended call's cost is given."""
    from batchfutures import BatchExecutor, LocalEnvironment
    askers: List[threading.Thread] = []
    answer = threading.Event()

    def hanging_pricing_of(env: Any) -> Pricing:
        askers.append(threading.current_thread())
        answer.wait(60)
        return costs.LOCAL

    monkeypatch.setattr(spending, "pricing_of", hanging_pricing_of)
    env = LocalEnvironment(tmp_path / "work", max_vcpus=2)
    executor = BatchExecutor(env)
    try:
        futures = [executor.submit(pow, 2, n) for n in range(3)]
        assert threading.current_thread() not in askers  # submit did not ask for prices
        answer.set()
        assert [f.result(timeout=120) for f in futures] == [1, 2, 4]
        assert all(f.cost is not None and f.cost > 0 for f in futures)
        assert askers and threading.current_thread() not in askers
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        env.emulator.close()


class PriceListSession(boto3.session.Session):
    """boto3's Session (Batch, S3 and Logs at the test's endpoints) whose Price List client is
    ``price_list`` (moto serves no Price List)."""

    def __init__(self, price_list: SlowPriceList) -> None:
        super().__init__(region_name="us-east-1")
        self.price_list = price_list

    def client(self, service_name: str, *args: Any, **kwargs: Any) -> Any:
        if service_name == "pricing":
            return self.price_list
        return super().client(service_name, *args, **kwargs)


def ec2_queue(instance_type: str) -> str:
    """An EC2 compute environment of ``instance_type`` and its queue, in the emulator boto3 is
    pointed at (its own environment is "optimal": no type to price); the queue's name."""
    batch = boto3.client("batch", region_name="us-east-1")
    made = batch.create_compute_environment(
        computeEnvironmentName="priced", type="MANAGED", computeResources={
            "type": "EC2", "maxvCpus": 2, "minvCpus": 0, "instanceRole": "ecsInstanceRole",
            "instanceTypes": [instance_type], "subnets": ["subnet-1"],
            "securityGroupIds": ["sg-1"]})
    batch.create_job_queue(jobQueueName="priced", priority=1, computeEnvironmentOrder=[
        {"order": 1, "computeEnvironment": made["computeEnvironmentArn"]}])
    return "priced"


@pytest.mark.slow
def test_the_poller_settles_futures_while_a_price_read_hangs(
        tmp_path: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first call's end starts the price read, which hangs; another call still resolves
    through the poller meanwhile (its done callback counts without waiting), and once the read
    answers both calls are priced at the prices read, on the reading thread."""
    from batchfutures import AWSBatchEnvironment, BatchExecutor
    monkeypatch.setenv("BATCHFUTURES_WORKDIR", str(tmp_path / "work"))
    monkeypatch.setattr(liveprices, "READ_DEADLINE_S", 600.0)  # it hangs until released below
    # the emulator's endpoint stands in for AWS's (whose endpoints alone read AWS prices)
    monkeypatch.setattr(spending, "_is_aws", lambda endpoint: True)
    live_hour = 2 * prices.FAMILIES["c6i"].vcpu_hour * 2  # twice the table's c6i.large
    price_list = SlowPriceList(600.0, pages=[[ec2("c6i.large", f"{live_hour:.10f}", "2",
                                                  "4 GiB")]])
    with emulator_endpoint(tmp_path / "emulator", max_vcpus=2, control_plane_delay=0.0):
        env = AWSBatchEnvironment(job_queue=ec2_queue("c6i.large"), io_bucket=new_bucket(),
                                  job_definition="batchfutures-worker", region_name="us-east-1",
                                  session=PriceListSession(price_list))
        executor = BatchExecutor(env, vcpus=1, memory=2048)
        try:
            first = executor.submit(pow, 2, 3)
            assert first.result(timeout=120) == 8
            assert price_list.asked.wait(120)  # its count started the read, which hangs
            second = executor.submit(pow, 2, 4)
            assert second.result(timeout=120) == 16  # the poller was not held by the read
            assert price_list.in_flight == 1 and not price_list.released.is_set()
            counted = executor._session.submitter.spending
            assert counted.counted == 0.0 and counted.unpriced == 2  # not priced yet

            price_list.released.set()  # the Price List answers
            readers = [t for t in threading.enumerate() if t.name == "batchfutures-pricing"]
            for reader in readers:
                reader.join(120)
            assert readers and counted.unpriced == 0
            expected = [f.usage.wall_s / 3600 * live_hour * 0.5 for f in (first, second)]
            assert [first.cost, second.cost] == pytest.approx(expected)  # the prices read
            assert counted.counted == pytest.approx(sum(expected))  # priced by the reader
            assert executor.cost == pytest.approx(sum(expected))
            assert price_list.calls == 1
        finally:
            price_list.released.set()
            executor.shutdown(wait=True)
