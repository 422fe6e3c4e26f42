"""The settings of issue 33: retries=Retries(...), consumes=, spot_attempts=, fallback_queue=."""

import pytest

from batchfutures.errors import ConfigurationError
from batchfutures.retrypolicy import Retries
from batchfutures.settings import JobSettings


class Throttled(Exception):
    pass


def test_retries_takes_a_policy_and_an_int_keeps_its_meaning():
    policy = Retries(4, on=(Throttled,), backoff=0.5)
    settings = JobSettings.from_kwargs(retries=policy)
    assert (settings.retries, settings.retry_policy) == (4, policy)
    assert settings.as_dict()["retries"] == 4 and settings.as_dict()["retry_on"] == ["Throttled"]
    again = JobSettings.from_kwargs(settings, retries=2)  # an int replaces the policy
    assert (again.retries, again.retry_policy) == (2, None) and "retry_on" not in again.as_dict()
    assert hash(settings) != hash(again) and settings == JobSettings.from_kwargs(retries=policy)


@pytest.mark.parametrize("kwargs, expected", [
    (dict(consumes={"licence": 1, "db": 2}), dict(consumes=(("db", 2), ("licence", 1)))),
    (dict(consumes=None), dict(consumes=())),
    (dict(spot_attempts=2), dict(spot_attempts=2)),
    (dict(spot_attempts=None), dict(spot_attempts=0)),
    (dict(fallback_queue="arn:aws:batch:us-east-1:123456789012:job-queue/od"),
     dict(fallback_queue="arn:aws:batch:us-east-1:123456789012:job-queue/od")),
])
def test_valid(kwargs, expected):
    settings = JobSettings.from_kwargs(**kwargs)
    for name, value in expected.items():
        assert getattr(settings, name) == value


@pytest.mark.parametrize("kwargs, message", [
    (dict(consumes=["licence"]), "consumes must be a mapping"),
    (dict(consumes={"licence": 0}), r"consumes\['licence'\]=0 must be at least 1"),
    (dict(consumes={"": 1}), "resource's name or ARN"),
    (dict(consumes={"licence": "one"}), "must be an integer"),
    (dict(spot_attempts=-1), "spot_attempts=-1"),
    (dict(spot_attempts=11), "at most 10 attempts"),
    (dict(fallback_queue=""), "fallback_queue"),
    (dict(fallback_queue=3), "fallback_queue"),
])
def test_invalid(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        JobSettings.from_kwargs(**kwargs)


@pytest.mark.parametrize("kwargs, check", [
    (dict(consumes={"licence": 1, "arn:aws:batch:us-east-1:123456789012:consumable-resource/db": 2}),
     lambda r: r["consumableResourcePropertiesOverride"] == {"consumableResourceList": [
         {"consumableResource": "arn:aws:batch:us-east-1:123456789012:consumable-resource/db",
          "quantity": 2},
         {"consumableResource": "licence", "quantity": 1}]}),
    (dict(), lambda r: "consumableResourcePropertiesOverride" not in r),
    (dict(retries=Retries(4, on=(Throttled,))), lambda r: r["retryStrategy"]["attempts"] == 4),
    (dict(retries=3), lambda r: r["retryStrategy"]["attempts"] == 3),
])
def test_the_request_carries_consumes_and_the_policys_attempts(kwargs, check):
    import botocore.session
    from botocore.validate import ParamValidator

    from batchfutures.submission import build_request

    built = build_request(JobSettings.from_kwargs(**kwargs), name="bf-f", job_queue="q",
                          job_definition="d", command=["python"], size=2, memory_mib=2048,
                          run_id="r", user="u")
    assert check(built), built
    model = botocore.session.get_session().get_service_model("batch")
    report = ParamValidator().validate(built, model.operation_model("SubmitJob").input_shape)
    assert not report.has_errors(), report.generate_report()
