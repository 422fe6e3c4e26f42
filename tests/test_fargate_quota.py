"""Issue 28 point 4: the account's Fargate vCPU quota caps retry_on_oom's Fargate steps.

A Fargate job of more vCPUs than the account's quota ("Fargate On-Demand vCPU resource count",
Service Quotas fargate/L-3032A538; new accounts may start at 6) waits RUNNABLE for ever with no
reason, so a retry never steps past it: table tests of the cap and the steps, the quota read
through Service Quotas (moto's server refuses the fargate code: the cap is then maxvCpus alone),
and a retry that gives up at the quota instead of waiting.
"""

from __future__ import annotations

import uuid

import boto3
import pytest
from botocore.stub import Stubber

from batchfutures import AWSBatchEnvironment
from batchfutures.errors import BatchError, ConfigurationError, MemoryLimitExceeded, classify_failure
from batchfutures.futures import BatchFuture
from batchfutures.jobs import Actions, TrackedJob
from batchfutures.oomretry import (
    FARGATE_VCPU_QUOTAS,
    Decision,
    OomRetry,
    Placement,
    Verdict,
    decide,
    fargate_next_pair,
    fargate_vcpu_cap,
    learn_fargate_vcpus,
    read_fargate_quotas,
)
from batchfutures.settings import JobSettings


def _ce(kind, max_vcpus=256, state="ENABLED"):
    resources = {"type": kind, **({"maxvCpus": max_vcpus} if max_vcpus is not None else {})}
    return {"computeEnvironmentName": kind.lower(), "state": state, "computeResources": resources}


# -- the most vCPUs one job can get --------------------------------------------------------------
@pytest.mark.parametrize("environments, quotas, cap", [
    ([], {}, None),
    ([_ce("EC2")], {"FARGATE": 6.0}, None),                              # not Fargate: no cap here
    ([_ce("FARGATE")], {"FARGATE": 6.0}, 6.0),                            # a new account's quota
    ([_ce("FARGATE")], {"FARGATE": None}, 256.0),                         # unread: maxvCpus alone
    ([_ce("FARGATE")], {}, 256.0),
    ([_ce("FARGATE", max_vcpus=4)], {"FARGATE": 6.0}, 4.0),               # the environment's less
    ([_ce("FARGATE", max_vcpus=None)], {}, 32.0),                        # nothing says: Fargate's
    ([_ce("FARGATE"), _ce("FARGATE_SPOT")], {"FARGATE": 6.0, "FARGATE_SPOT": 20.0}, 20.0),
    ([_ce("FARGATE"), _ce("FARGATE_SPOT", state="DISABLED")],
     {"FARGATE": 6.0, "FARGATE_SPOT": 20.0}, 6.0),
    ([_ce("FARGATE_SPOT")], {"FARGATE": 4000.0, "FARGATE_SPOT": 8.0}, 8.0),  # its own kind's
])
def test_the_cap_is_the_least_of_quota_and_maxvcpus_on_the_best_environment(environments,
                                                                             quotas, cap):
    assert fargate_vcpu_cap(environments, quotas) == cap


# -- retry_on_oom's steps under the cap ----------------------------------------------------------
@pytest.mark.parametrize("vcpus, last, max_vcpus, expected", [
    (4, 8192, 6.0, (4.0, 16384)),        # under the quota: as before
    (2, 16384, 6.0, (4.0, 30720)),       # 32768 needs 8 vCPUs: the largest pair of 4 instead
    (4, 30720, 6.0, None),               # 4 vCPUs' largest tried: 8 would wait for ever
    (8, 61440, 16.0, (16.0, 122880)),
    (16, 65536, 16.0, (16.0, 122880)),   # not the step to 32 vCPUs
    (16, 65536, None, (32.0, 249856)),   # unknown: Fargate's own largest
    (16, 65536, 40.0, (32.0, 249856)),
    (0.25, 512, 0.5, (0.25, 1024)),
])
def test_fargate_steps_stay_within_the_vcpu_cap(vcpus, last, max_vcpus, expected):
    assert fargate_next_pair(vcpus, last, None, max_vcpus) == expected


def test_a_retry_at_the_quota_gives_up_naming_it():
    quota = Placement("FARGATE", None, 6.0)
    decision = decide([30720], 3, quota, 4.0)
    assert decision.verdict is Verdict.GIVE_UP
    assert "at most 6 vCPUs" in decision.why and FARGATE_VCPU_QUOTAS["FARGATE"] in decision.why
    assert "30720 MiB" in decision.why and "RUNNABLE" in decision.why
    assert decide([16384], 3, quota, 2.0) == Decision(Verdict.RESUBMIT, memory_mib=30720, vcpus=4.0)
    # Fargate's own largest is still said as before when the quota is not what stops it
    assert "Fargate offers at most 249856 MiB" in decide([249856], 3, Placement(
        "FARGATE", None, 64.0), 32.0).why


def test_the_tracked_job_fails_at_the_quota_instead_of_resubmitting():
    calls = []
    futures = [[BatchFuture()]]
    job = TrackedJob("J", "file:///store/runs/r/jobs/k", futures, array=False, memory_mib=30720)
    job.retry = OomRetry(JobSettings(vcpus=4, memory=30720, retry_on_oom=3),
                         placeable_mib=Placement("FARGATE", None, 6.0),
                         resubmit=lambda *args: calls.append(args))
    oom = {"status": "FAILED", "statusReason": "Essential container in task exited", "jobId": "J",
           "attempts": [{"container": {"exitCode": 137, "reason": "OutOfMemoryError: x"}}]}
    job.apply(Actions(failed={0: oom}, changed=True),
              failure_for=lambda i, d: classify_failure(d, job_id="J", memory_mib=30720),
              no_result_error=BatchError, expired_error=BatchError,
              unplaceable_error=lambda i, r: BatchError(r))
    assert calls == []  # no retry that would wait RUNNABLE for ever
    error = futures[0][0].exception(timeout=0)
    assert type(error) is MemoryLimitExceeded and error.tried_mib == (30720,)
    assert "at most 6 vCPUs" in str(error)


# -- reading the quota ---------------------------------------------------------------------------
def test_the_quota_is_read_from_service_quotas():
    client = boto3.client("service-quotas", region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    with Stubber(client) as stub:  # botocore checks the request and answer against its model
        for code, value in (("L-3032A538", 6.0), ("L-36FBB829", 12.0)):
            stub.add_response("get_service_quota", {"Quota": {"Value": value}},
                              {"ServiceCode": "fargate", "QuotaCode": code})
        assert read_fargate_quotas(client, ["FARGATE", "FARGATE_SPOT"]) == {
            "FARGATE": 6.0, "FARGATE_SPOT": 12.0}
    with Stubber(client) as stub:  # a client policy without servicequotas:GetServiceQuota
        stub.add_client_error("get_service_quota", "AccessDeniedException", http_status_code=400)
        assert read_fargate_quotas(client, ["FARGATE", "EC2"]) == {"FARGATE": None}


def test_a_quota_service_that_does_not_know_the_code_leaves_it_unread(s3_endpoint):
    # moto's server (AWS_ENDPOINT_URL) answers NoSuchResourceException for fargate's codes
    client = boto3.client("service-quotas", region_name="us-east-1")
    assert read_fargate_quotas(client, ["FARGATE"]) == {"FARGATE": None}


def test_an_ec2_queue_asks_no_quota(local_env):
    made = []
    assert learn_fargate_vcpus(local_env.batch, local_env.job_queue,
                               lambda: made.append(1)) is None
    assert made == []  # the emulator's one compute environment is EC2: no Service Quotas client


# -- the first submit, not only the retries ----------------------------------------------------
def fargate_queue(max_vcpus: int) -> str:
    """A Fargate compute environment of ``max_vcpus`` and its queue in moto's Batch (the
    emulator's compute environments are EC2); returns the queue's ARN."""
    session = boto3.session.Session(region_name="us-east-1")  # reads the endpoint variables now
    ec2 = session.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName=f"fg-{uuid.uuid4().hex[:8]}", Description="fg",
                                      VpcId=vpc)["GroupId"]
    role = session.client("iam").create_role(
        RoleName=f"batch-{uuid.uuid4().hex[:8]}", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    batch = session.client("batch")
    name = f"fargate-{uuid.uuid4().hex[:8]}"
    environment = batch.create_compute_environment(
        computeEnvironmentName=name, type="MANAGED", state="ENABLED", serviceRole=role,
        computeResources={"type": "FARGATE", "maxvCpus": max_vcpus, "subnets": [subnet],
                          "securityGroupIds": [group]})
    return batch.create_job_queue(
        jobQueueName=name, state="ENABLED", priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment":
                                  environment["computeEnvironmentArn"]}])["jobQueueArn"]


def test_a_fargate_job_over_the_queues_vcpu_cap_is_refused_before_anything_runs(s3_endpoint,
                                                                                monkeypatch):
    """Batch would hold it RUNNABLE for ever with no reason; the executor refuses it when made.
    (moto's Service Quotas does not know fargate's codes: the cap is the maxvCpus here.)"""
    for variable in ("AWS_ENDPOINT_URL_BATCH", "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS"):
        monkeypatch.delenv(variable, raising=False)  # Batch too is moto's here, not an emulator
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    env = AWSBatchEnvironment(job_queue=fargate_queue(4), io_bucket="bucket-fargate-cap",
                              image="python:3.11", platform="FARGATE", region_name="us-east-1",
                              signing_secret="batchfutures/signing-key")
    env.validate_settings(JobSettings(vcpus=4, memory=8192))  # within the cap
    with pytest.raises(ConfigurationError, match=r"vcpus=8 .* at most 4 vCPUs.*L-3032A538"):
        env.validate_settings(JobSettings(vcpus=8, memory=16384))
    assert env.fargate_vcpu_cap() == 4.0
