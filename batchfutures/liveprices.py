"""Prices read from AWS when on AWS, the shipped table (prices.py) as the fallback (docs/cost.md).

    Fargate        Price List GetProducts (AmazonECS, the Region's code): per vCPU-hour, per GB-hour
    EC2 on demand  Price List GetProducts (AmazonEC2, the instance type, Linux, shared, no
                   pre-installed software, capacity "Used"): the instance-hour, its vCPUs and memory
    EC2 Spot       EC2 DescribeSpotPriceHistory of the type (Linux/UNIX): the latest price of each
                   Availability Zone, the highest of them (the host's zone is not known)

The Price List is served from three Regions' endpoints only (us-east-1, ap-south-1, eu-central-1:
botocore's endpoint data), so its client is made for the nearest of them. What is read is kept
per process and on disk (<workdir>/prices/, a private folder) with the date it was read, for a
day. Any failure to read (no credentials, AccessDenied, a stack's policy from before these
actions, no answer within READ_DEADLINE_S) is logged once at DEBUG and the table is used: a price
never fails a future. A failure is kept in the process (not on disk) for FAILURE_AGE_S, so a
refused or unreachable Price List costs one wait, not one per executor, report or status.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from botocore.config import Config

from . import prices
from .costs import instance_of
from .prices import LiveRates

__all__ = ["PRICE_LIST_REGIONS", "price_list_region", "on_demand_usd",
           "fargate_rates", "instance_from_products", "latest_spot", "read_rates", "MAX_AGE_S"]

logger = logging.getLogger("batchfutures")

PRICE_LIST_REGIONS = ("us-east-1", "ap-south-1", "eu-central-1")
MAX_AGE_S = 86400.0  # prices read are kept a day
FAILURE_AGE_S = 600.0  # a read that failed or found nothing is not tried again for 10 minutes
READ_DEADLINE_S = 5.0  # one read (every page, both APIs) is waited for this long at most
# a price is not worth a wait: one attempt, short timeouts (the table is the fallback)
_ONE_TRY = Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=4)
_FARGATE_USAGE = {  # the end of a Fargate product's usagetype ("USE1-Fargate-vCPU-Hours:perCPU")
    ("X86_64", "vcpu"): "-Fargate-vCPU-Hours:perCPU", ("X86_64", "gb"): "-Fargate-GB-Hours",
    ("ARM64", "vcpu"): "-Fargate-ARM-vCPU-Hours:perCPU", ("ARM64", "gb"): "-Fargate-ARM-GB-Hours",
}


def price_list_region(region: Optional[str]) -> str:
    """The Price List endpoint's Region nearest to ``region``."""
    if region in PRICE_LIST_REGIONS:
        return str(region)
    if region and region.startswith(("ap-", "me-", "af-", "il-")):
        return "ap-south-1"
    if region and region.startswith("eu-"):
        return "eu-central-1"
    return "us-east-1"


def _documents(price_list: Iterable[Any]) -> List[Mapping[str, Any]]:
    # GetProducts' PriceList entries are JSON documents in strings
    return [json.loads(entry) if isinstance(entry, str) else entry for entry in price_list]


def on_demand_usd(document: Mapping[str, Any]) -> Optional[float]:
    """The first nonzero USD per unit of a product's OnDemand terms, None when it has none."""
    for term in (document.get("terms") or {}).get("OnDemand", {}).values():
        for dimension in (term.get("priceDimensions") or {}).values():
            try:
                usd = float((dimension.get("pricePerUnit") or {}).get("USD", ""))
            except ValueError:
                continue
            if usd > 0:
                return usd
    return None


def fargate_rates(price_list: Iterable[Any], architecture: str = "X86_64"
                  ) -> Optional[prices.FargateRate]:
    """Fargate's per vCPU-hour and per GB-hour of ``architecture`` from AmazonECS products."""
    found: Dict[str, float] = {}
    for document in _documents(price_list):
        usage = str(((document.get("product") or {}).get("attributes") or {}).get("usagetype", ""))
        for unit in ("vcpu", "gb"):
            if usage.endswith(_FARGATE_USAGE[(architecture.upper(), unit)]) and unit not in found:
                usd = on_demand_usd(document)
                if usd is not None:
                    found[unit] = usd
    if len(found) < 2:
        return None
    return prices.FargateRate(found["vcpu"], found["gb"])


def _number(text: Any) -> Optional[float]:
    try:  # "16 GiB", "4", "1,024 GiB"
        return float(str(text).split()[0].replace(",", ""))
    except (ValueError, IndexError):
        return None


def instance_from_products(price_list: Iterable[Any], instance_type: str
                           ) -> Optional[prices.Instance]:
    """An EC2 instance type's on-demand hour, vCPUs, memory and GPUs from AmazonEC2 products."""
    for document in _documents(price_list):
        attributes = (document.get("product") or {}).get("attributes") or {}
        if attributes.get("instanceType") != instance_type:
            continue
        usd, vcpus, gib = on_demand_usd(document), _number(attributes.get("vcpu")), \
            _number(attributes.get("memory"))
        if usd is not None and vcpus and gib:
            return prices.Instance(usd, int(vcpus), gib, int(_number(attributes.get("gpu")) or 0))
    return None


def latest_spot(history: Iterable[Mapping[str, Any]], instance_type: str) -> Optional[float]:
    """The Spot price of a type: the latest of each Availability Zone, the highest of those."""
    latest: Dict[str, Tuple[Any, float]] = {}
    for entry in history:
        if entry.get("InstanceType") != instance_type:
            continue
        zone, when = str(entry.get("AvailabilityZone", "")), entry.get("Timestamp")
        try:
            usd = float(entry["SpotPrice"])
        except (KeyError, ValueError):
            continue
        if zone not in latest or str(when) > str(latest[zone][0]):
            latest[zone] = (when, usd)
    return max((usd for _, usd in latest.values()), default=None)


# key -> (when read, the rates; None: nothing could be read, kept FAILURE_AGE_S, never on disk)
_cache: Dict[str, Tuple[float, Optional[LiveRates]]] = {}
# key -> (set when its read ended, its deadline on time.monotonic): one read per key at a time
_reading: Dict[str, Tuple[threading.Event, float]] = {}
_lock = threading.Lock()  # guards the dicts only: no network read is made while holding it
_logged = False


def _log_once(error: BaseException) -> None:
    global _logged
    if not _logged:
        _logged = True
        logger.debug("prices: read from AWS failed, the shipped table is used: %r", error)


def _to_json(rates: LiveRates, read_at: float) -> str:
    return json.dumps({"read_at": read_at, "source": rates.source,
                       "fargate": list(rates.fargate) if rates.fargate else None,
                       "instance": list(rates.instance) if rates.instance else None})


def _from_json(text: str) -> Tuple[float, LiveRates]:
    data = json.loads(text)
    fargate = prices.FargateRate(*data["fargate"]) if data.get("fargate") else None
    instance = prices.Instance(*data["instance"]) if data.get("instance") else None
    return float(data["read_at"]), LiveRates(str(data["source"]), fargate, instance)


def _read(session: Any, ec2: Any, region: str, platform: str, architecture: str,
          instance_type: Optional[str], spot: bool, deadline: float) -> LiveRates:
    endpoint = price_list_region(region)
    pricing = session.client("pricing", region_name=endpoint, config=_ONE_TRY)
    fargate = instance = None

    def in_time() -> None:  # no new page or call once the read's deadline passed
        if time.monotonic() >= deadline:
            raise TimeoutError(f"prices not read within {READ_DEADLINE_S:g} s")

    def products(service: str, **terms: str) -> List[Any]:
        filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in terms.items()]
        found: List[Any] = []
        for page in pricing.get_paginator("get_products").paginate(
                ServiceCode=service, Filters=filters, FormatVersion="aws_v1"):
            found.extend(page.get("PriceList") or ())
            if page.get("NextToken"):
                in_time()
        return found

    if platform == "FARGATE":
        fargate = fargate_rates(products("AmazonECS", regionCode=region), architecture)
    elif instance_type:
        instance = instance_from_products(products(
            "AmazonEC2", regionCode=region, instanceType=instance_type, operatingSystem="Linux",
            tenancy="Shared", preInstalledSw="NA", capacitystatus="Used"), instance_type) \
            or instance_of(instance_type)
        if spot and instance is not None:
            in_time()
            if ec2 is None:
                ec2 = session.client("ec2", region_name=region, config=_ONE_TRY)
            history = ec2.describe_spot_price_history(
                InstanceTypes=[instance_type], ProductDescriptions=["Linux/UNIX"],
                StartTime=time.time() - 3 * 3600).get("SpotPriceHistory") or []
            usd = latest_spot(history, instance_type)
            instance = instance._replace(hour=usd) if usd is not None else None
    day = time.strftime("%Y-%m-%d", time.gmtime())
    spot_note = " and Spot price history" if spot and platform != "FARGATE" else ""
    return LiveRates(f"AWS Price List{spot_note}, {region}, read {day}", fargate, instance)


def read_rates(session: Any, ec2: Any, region: Optional[str], platform: str, architecture: str,
               instance_type: Optional[str], spot: bool, folder: Optional[Path],
               now: Optional[float] = None) -> Optional[LiveRates]:
    """The rates of a queue's calls from AWS (cached a day, per process and in ``folder``), None
    when they could not be read within READ_DEADLINE_S (logged once at DEBUG; not tried again
    for FAILURE_AGE_S): the caller keeps the shipped table. ``ec2``: an EC2 client, or None to
    make one with short timeouts. One read per key at a time, on its own daemon thread: callers
    asking for the same key wait for it (until its deadline), other keys are not held up."""
    if session is None or not region:
        return None
    key = f"{region}-{platform}-{architecture}-{instance_type or ''}-{'spot' if spot else 'od'}"
    now = time.time() if now is None else now
    path = folder / f"{key}.json" if folder is not None else None
    with _lock:
        cached = _cache.get(key)
        if cached is None and path is not None and path.is_file():
            try:
                cached = _from_json(path.read_text())
            except (OSError, ValueError, KeyError, TypeError):
                cached = None
        if cached is not None and now - cached[0] < (
                MAX_AGE_S if cached[1] is not None else FAILURE_AGE_S):
            _cache[key] = cached
            return cached[1]
        if key not in _reading:
            _reading[key] = (threading.Event(), time.monotonic() + READ_DEADLINE_S)
            threading.Thread(target=_read_into_cache, name=f"batchfutures-prices-{key}",
                             args=(key, path, now, _reading[key], session, ec2, region, platform,
                                   architecture, instance_type, spot), daemon=True).start()
        done, deadline = _reading[key]
    if not done.wait(max(0.0, deadline - time.monotonic())):
        with _lock:  # the read goes on alone; until it ends, the table (and no new read)
            if key in _reading:
                _cache[key] = (now, None)
        _log_once(TimeoutError(f"prices not read within {READ_DEADLINE_S:g} s"))
        return None
    with _lock:
        found = _cache.get(key)
    return found[1] if found is not None else None


def _read_into_cache(key: str, path: Optional[Path], now: float,
                     reading: Tuple[threading.Event, float], session: Any, ec2: Any, region: str,
                     platform: str, architecture: str, instance_type: Optional[str],
                     spot: bool) -> None:
    done, deadline = reading
    rates: Optional[LiveRates] = None
    try:
        rates = _read(session, ec2, region, platform, architecture, instance_type, spot, deadline)
        if rates.fargate is None and rates.instance is None:
            rates = None
    except Exception as error:  # no credentials, AccessDenied, an old stack's policy, too slow
        _log_once(error)
    if rates is not None and path is not None:
        try:
            path.write_text(_to_json(rates, now))
        except OSError as error:
            _log_once(error)
    with _lock:
        _cache[key] = (now, rates)
        del _reading[key]
    done.set()
