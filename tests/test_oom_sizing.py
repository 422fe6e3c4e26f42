"""retry_on_oom sized as AWS sizes (Fargate pairs, EC2 headroom, the queue's cap), and a queue's
time-limit cancel read in AWS's words: table tests, then the AWS path through the emulator's
endpoint and moto's EC2."""

import dataclasses

import pytest

from batchfutures import BatchExecutor, MemoryLimitExceeded
from batchfutures.errors import (
    BatchError,
    JobAbortedError,
    JobUnplaceableError,
    classify_failure,
    time_limit_reason,
    time_limit_status_reason,
)
from batchfutures.futures import BatchFuture
from batchfutures.jobs import Actions, JobFacts, JobStatus, TrackedJob
from batchfutures.oomretry import (
    FARGATE_MAX_MIB,
    ChildHistory,
    Decision,
    OomRetry,
    Placement,
    Try,
    Verdict,
    decide,
    ec2_next_memory,
    ec2_usable_mib,
    fargate_next_pair,
    fargate_pairs,
    instance_type_queries,
    queue_max_memory_mib,
)
from batchfutures.reconcile import Reads, reconcile
from batchfutures.settings import JobSettings

EC2, FARGATE = Placement("EC2"), Placement("FARGATE")


# -- EC2: doubling with headroom below instance sizes -------------------------------------------
@pytest.mark.parametrize("last, expected", [
    (256, 512),        # far from an instance size: doubled
    (512, 972),        # 1024 would be all of a 1 GiB instance
    (1000, 1945),      # 2000 is within the headroom of 2048
    (1200, 2400),
    (2048, 3891),      # not 4096: an instance of 4096 MiB installed cannot hold it
    (3891, 7782),      # and so on below each size, never onto it
    (4096, 7782),
    (7782, 15564),
    (8192, 15564),
])
def test_ec2_doubling_keeps_headroom_below_instance_sizes(last, expected):
    assert ec2_next_memory(last) == expected
    assert expected > last


@pytest.mark.parametrize("installed, usable", [(1024, 972), (4096, 3891), (8192, 7782),
                                               (786432, 747110)])
def test_ec2_usable_memory_is_below_the_installed_size(installed, usable):
    assert ec2_usable_mib(installed) == usable


@pytest.mark.parametrize("tried, placement, expected", [
    ([2048], EC2, Decision(Verdict.RESUBMIT, memory_mib=3891)),
    ([2048, 3891], Placement("EC2", 6000), Decision(Verdict.RESUBMIT, memory_mib=6000)),
    ([2048, 3891, 6000], Placement("EC2", 6000),
     Decision(Verdict.GIVE_UP, why="the queue can place at most 6000 MiB")),
    ([8192], Placement("EC2", 8192), Decision(Verdict.GIVE_UP, why="the queue can place at most 8192 MiB")),
    # locally the machine's memory is exact: plain doubling
    ([2048], Placement("LOCAL", None), Decision(Verdict.RESUBMIT, memory_mib=4096)),
    ([2048], None, Decision(Verdict.RESUBMIT, memory_mib=4096)),
])
def test_decide_on_ec2(tried, placement, expected):
    assert decide(tried, 5, placement) == expected


# -- Fargate: the next valid (vCPU, memory) pair ------------------------------------------------
@pytest.mark.parametrize("vcpus, last, cap, expected", [
    (1, 8192, None, (2.0, 16384)),        # the case: 1 vCPU has no 16384
    (0.25, 2048, None, (0.5, 4096)),      # and 0.25 vCPU no 4096
    (0.25, 512, None, (0.25, 1024)),      # the same vCPUs when they offer it
    (0.5, 3072, None, (1.0, 6144)),
    (2, 4096, None, (2.0, 8192)),
    (4, 30720, None, (8.0, 61440)),
    (8, 61440, None, (16.0, 122880)),     # more than 8 vCPU's largest
    (16, 65536, None, (32.0, 249856)),    # more than 16 vCPU's largest
    (16, 163840, None, (32.0, 249856)),   # capped at the largest pair
    (32, 249856, None, None),             # nothing larger
    (16, 65536, 122880, (16.0, 122880)),  # a Fargate queue capped by max_memory=
    (2, 4096, 6144, (2.0, 6144)),         # a given cap: the largest pair under it
    (2, 6144, 6144, None),
])
def test_fargate_next_pair(vcpus, last, cap, expected):
    assert fargate_next_pair(vcpus, last, cap) == expected


def test_every_fargate_retry_is_a_pair_fargate_offers_with_no_fewer_vcpus():
    offered = set(fargate_pairs())
    # the Batch API reference's MEMORY table: 32 vCPU with 61440, 122880 or 249856 MiB
    assert max(m for _, m in offered) == FARGATE_MAX_MIB == 249856
    assert max(v for v, _ in offered) == 32
    assert (1.0, 16384) not in offered and (0.25, 4096) not in offered
    for vcpus, memory in offered:
        pair = fargate_next_pair(vcpus, memory)
        if pair is None:
            assert memory == FARGATE_MAX_MIB
            continue
        assert pair in offered and pair[0] >= vcpus
        assert pair[1] >= min(2 * memory, FARGATE_MAX_MIB) and pair[1] > memory


@pytest.mark.parametrize("tried, vcpus, expected", [
    ([8192], 1.0, Decision(Verdict.RESUBMIT, memory_mib=16384, vcpus=2.0)),
    ([2048], 0.25, Decision(Verdict.RESUBMIT, memory_mib=4096, vcpus=0.5)),
    ([249856], 32.0, Decision(Verdict.GIVE_UP,
                              why="Fargate offers at most 249856 MiB (32 vCPU), and 249856 MiB was tried")),
    ([65536], 16.0, Decision(Verdict.RESUBMIT, memory_mib=249856, vcpus=32.0)),
])
def test_decide_on_fargate(tried, vcpus, expected):
    assert decide(tried, 3, FARGATE, vcpus) == expected


def test_a_fargate_retry_gets_the_vcpus_of_its_pair():
    retry = OomRetry(JobSettings(vcpus=1, memory=8192, retry_on_oom=2), placeable_mib=FARGATE,
                     resubmit=lambda *args: None)
    settings = retry.with_memory(16384)
    assert (settings.vcpus, settings.memory_mib()) == (2.0, 16384)
    on_ec2 = OomRetry(JobSettings(vcpus=1, memory=2048, retry_on_oom=2), placeable_mib=EC2,
                      resubmit=lambda *args: None)
    assert on_ec2.with_memory(3891).vcpus == 1


def test_the_retry_is_resubmitted_with_the_pair_and_no_try_past_the_largest():
    calls = []
    futures = [[BatchFuture()], [BatchFuture()]]
    job = TrackedJob("J", "file:///store/runs/r/jobs/k", futures, array=True, memory_mib=8192)
    job.retry = OomRetry(JobSettings(vcpus=1, memory=8192, retry_on_oom=3), placeable_mib=FARGATE,
                         resubmit=lambda *args: calls.append(args))
    oom = {"status": "FAILED", "statusReason": "Essential container in task exited",
           "attempts": [{"container": {"exitCode": 137, "reason": "OutOfMemoryError: x"}}]}
    job.apply(Actions(failed={0: dict(oom, jobId="J:0")}, changed=True),
              failure_for=lambda i, d: classify_failure(d, job_id=job.child_id(i), memory_mib=8192),
              no_result_error=BatchError, expired_error=BatchError,
              unplaceable_error=lambda i, r: BatchError(r))
    ((_, children, memory, _, retry),) = calls
    assert (children, memory, retry.with_memory(memory).vcpus) == ([0], 16384, 2.0)


# -- the queue's cap, learned from its compute environments --------------------------------------
@pytest.mark.parametrize("types, exact, families", [
    (["m5.large", "c5.xlarge"], ("m5.large", "c5.xlarge"), ()),
    (["m5", "r5.2xlarge"], ("r5.2xlarge",), ("m5",)),
    # since 2025-11 "optimal" is default_x86_64 (botocore's ComputeResource.instanceTypes)
    (["optimal"], (), ("m6i", "c6i", "r6i", "c7i")),
    (["default_x86_64"], (), ("m6i", "c6i", "r6i", "c7i")),
    (["default_x86_64", "m4"], (), ("m6i", "c6i", "r6i", "c7i", "m4")),
    (["optimal", "default_x86_64", "c6i"], (), ("m6i", "c6i", "r6i", "c7i")),
    (["default_arm64"], (), ("m6g", "c6g", "r6g", "c7g")),
    (["default_arm64", "r7g.16xlarge"], ("r7g.16xlarge",), ("m6g", "c6g", "r6g", "c7g")),
])
def test_instance_types_become_exact_types_and_families(types, exact, families):
    assert instance_type_queries(types) == (exact, families)


# installed MiB of the largest size of each family (EC2 DescribeInstanceTypes): r6i.32xlarge,
# m6i.32xlarge, c6i.32xlarge, c7i.48xlarge; r6g.16xlarge, m6g.16xlarge, c6g.16xlarge, c7g.16xlarge
LARGEST = {"r6i": 1048576, "m6i": 524288, "c6i": 262144, "c7i": 393216, "r4": 499712,
           "m4": 262144, "c4": 61440, "r5": 786432, "m5": 393216, "c5": 196608,
           "r6g": 524288, "m6g": 262144, "c6g": 131072, "c7g": 131072}


@pytest.mark.parametrize("types, cap_mib", [
    # the old reading (C4/M4/R4/C5/M5/R5) capped "optimal" at r5's 768 GiB; r6i has 1 TiB
    (["optimal"], int(1048576 * 0.95)),
    (["default_x86_64"], int(1048576 * 0.95)),
    (["default_arm64"], int(524288 * 0.95)),
])
def test_the_default_bundles_cap_at_their_largest_family(types, cap_mib):
    def installed(names):
        exact, families = instance_type_queries(names)
        return max(LARGEST[family] for family in families)

    assert queue_max_memory_mib([_ce("EC2", types)], installed) == ("EC2", cap_mib)


INSTALLED = {"m5.large": 8192, "m5": 393216, "c5.xlarge": 8192, "r5": 786432}


def _installed(types):
    sizes = [INSTALLED.get(name) for name in types]
    return None if None in sizes else max(sizes)


def _ce(kind, types=None, state="ENABLED"):
    resources = {"type": kind, "maxvCpus": 256}
    if types is not None:
        resources["instanceTypes"] = types
    return {"computeEnvironmentName": kind, "state": state, "type": "MANAGED",
            "computeResources": resources}


@pytest.mark.parametrize("environments, expected", [
    ([_ce("EC2", ["m5.large"])], ("EC2", 7782)),              # 8 GiB installed, not 8192
    ([_ce("EC2", ["m5.large"]), _ce("SPOT", ["c5.xlarge", "m5"])], ("EC2", 373555)),
    ([_ce("EC2", ["r5"], state="DISABLED"), _ce("EC2", ["m5.large"])], ("EC2", 7782)),
    ([_ce("FARGATE"), _ce("FARGATE_SPOT")], ("FARGATE", 249856)),
    ([_ce("EC2", ["m5.large"]), _ce("EC2", ["x9.huge"])], ("EC2", None)),  # unknown: no cap
    ([{"computeEnvironmentName": "mine", "type": "UNMANAGED"}], ("EC2", None)),
    ([], ("EC2", None)),
])
def test_the_queue_cap_is_the_largest_usable_memory_of_its_environments(environments, expected):
    assert queue_max_memory_mib(environments, _installed) == expected


# -- a queue's time-limit cancel, in AWS's words -------------------------------------------------
CAPACITY = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
TOO_LARGE = "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT"
MAX_RESOURCE = "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE"


@pytest.mark.parametrize("status_reason, expected", [
    (f"Canceled by JobStateTimeLimit action due to reason: {CAPACITY}", CAPACITY),
    (f"Canceled by JobStateTimeLimit action due to reason: {TOO_LARGE}", TOO_LARGE),
    (f"Canceled by JobStateTimeLimit action due to reason: {MAX_RESOURCE}", MAX_RESOURCE),
    (f"Terminated by JobStateTimeLimit action due to reason: {CAPACITY}", CAPACITY),
    (CAPACITY, None),
    ("batchfutures: aborted", None),
    (None, None),
])
def test_the_time_limit_reason_is_read_from_batchs_wording(status_reason, expected):
    assert time_limit_reason(status_reason) == expected


def test_the_emulator_and_the_client_share_one_wording():
    assert time_limit_status_reason(CAPACITY) == \
        "Canceled by JobStateTimeLimit action due to reason: CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
    assert time_limit_status_reason(CAPACITY, "TERMINATE").startswith("Terminated by ")
    assert time_limit_reason(time_limit_status_reason(TOO_LARGE)) == TOO_LARGE


@pytest.mark.parametrize("reason", [CAPACITY, TOO_LARGE])
def test_a_job_the_queue_cancelled_is_unplaceable_not_aborted(reason):
    described = {"jobId": "j", "status": "FAILED", "isCancelled": True, "attempts": [],
                 "statusReason": time_limit_status_reason(reason)}
    error = classify_failure(described)
    assert type(error) is JobUnplaceableError
    assert error.reason == reason and error.status_reason == described["statusReason"]
    assert reason in str(error)


@pytest.mark.parametrize("status_reason", ["batchfutures: shutdown", "Cancelled by the operator",
                                           f"{CAPACITY} is why I cancelled it"])
def test_other_cancels_stay_aborts(status_reason):
    described = {"jobId": "j", "status": "FAILED", "isCancelled": True, "attempts": [{}],
                 "statusReason": status_reason}
    assert type(classify_failure(described)) is JobAbortedError


def test_a_retry_the_queue_cancelled_fails_for_memory_naming_the_tries():
    futures = [[BatchFuture()]]
    job = TrackedJob("R", "file:///store/runs/r/jobs/retry", futures, array=True, memory_mib=3891)
    job.retry = OomRetry(JobSettings(memory=3891, retry_on_oom=3), placeable_mib=EC2,
                         resubmit=lambda *args: None,
                         history={0: ChildHistory(("file:///store/runs/r/jobs/k", 2),
                                                  (Try(2048, "K:2"),))})
    described = {"jobId": "R:0", "status": "FAILED", "isCancelled": True, "attempts": [],
                 "statusReason": time_limit_status_reason(TOO_LARGE)}
    job.apply(Actions(failed={0: described}, changed=True),
              failure_for=lambda i, d: classify_failure(d, job_id=job.child_id(i)),
              no_result_error=BatchError, expired_error=BatchError,
              unplaceable_error=lambda i, r: BatchError(r))
    error = futures[0][0].exception(timeout=0)
    assert type(error) is MemoryLimitExceeded and error.tried_mib == (2048,)
    assert "3891 MiB cannot be placed" in str(error) and TOO_LARGE in str(error)


# -- a retry of equal children: one child shows the reason, the whole job goes -----------------
def _retry_view(size=5, started=()):
    return JobFacts(job_id="retry-1", array=True, size=size, open=frozenset(range(size)),
                   started=frozenset(started), status=JobStatus.PENDING,
                   summary={"RUNNABLE": 1, "PENDING": size - 1}, submitted_at=0.0, now=100.0,
                   memory_raised=True)


def _description(size):
    return {"jobId": "retry-1", "status": "PENDING",
            "arrayProperties": {"size": size, "statusSummary": {"RUNNABLE": 1, "PENDING": size - 1}},
            "container": {"resourceRequirements": [{"type": "MEMORY", "value": "3891"},
                                                   {"type": "VCPU", "value": "1"}]}}


def _head_only_listing():
    # Batch gives the reason to the job at the head of the queue only
    return [{"jobId": "retry-1:0", "arrayProperties": {"index": 0}, "status": "RUNNABLE",
             "statusReason": f"{TOO_LARGE} - The job resource requirement is higher than ..."}]


def test_a_retry_of_equal_children_is_cancelled_whole_when_one_child_shows_the_reason():
    view = _retry_view()
    reads = Reads(description=_description(5))
    step = reconcile(view, reads)
    assert JobStatus.RUNNABLE in step.needs.listings
    reads.listings[JobStatus.RUNNABLE] = _head_only_listing()
    actions = reconcile(view, reads).actions
    assert sorted(actions.unplaceable) == [0, 1, 2, 3, 4]
    assert [target for target, _ in actions.cancel] == ["retry-1"]


def test_a_first_try_waiting_on_capacity_is_not_cancelled_for_its_head_child():
    view = dataclasses.replace(_retry_view(), memory_raised=False)
    reads = Reads(description=_description(5), listings={JobStatus.RUNNABLE: _head_only_listing()})
    actions = reconcile(view, reads).actions
    assert not actions.unplaceable and not actions.cancel  # no runnable_timeout: it waits


# -- the AWS path: a real boto3 Batch client against the emulator's endpoint ---------------------
def allocate(mib):
    return len(bytearray(mib * 1024 * 1024)) // (1024 * 1024)


def _memory_of(job_id):
    import boto3

    (description,) = boto3.client("batch", region_name="us-east-1").describe_jobs(
        jobs=[job_id])["jobs"]
    return int(next(r["value"] for r in description["container"]["resourceRequirements"]
                    if r["type"] == "MEMORY"))


@pytest.mark.slow
def test_on_aws_retries_keep_headroom_and_stop_at_max_memory(tmp_path, s3_endpoint):
    from s3server import emulator_endpoint, emulator_environment, new_bucket

    with emulator_endpoint(tmp_path / "emulator", max_vcpus=2, max_memory_mib=1100):
        env = emulator_environment(new_bucket(), max_memory="1000MiB")
        assert env.max_memory_mib() == 1000
        with BatchExecutor(env, memory=400, retry_on_oom=3) as ex:
            fits = ex.submit(allocate, 500)     # killed at 400; 800 holds it
            never = ex.submit(allocate, 1200)   # 400, 800, then the cap: 1000
            assert fits.result(timeout=180) == 500
            error = never.exception(timeout=180)
            assert _memory_of(fits.job_id) == 800
            # 500 MiB, with headroom: 1000 would be nearly all of a 1 GiB instance
            headroom = ex.with_settings(memory=500, retry_on_oom=1).submit(allocate, 600)
            assert headroom.result(timeout=180) == 600
            assert _memory_of(headroom.job_id) == 972
    assert isinstance(error, MemoryLimitExceeded) and error.tried_mib == (400, 800, 1000)
    assert "the queue can place at most 1000 MiB" in str(error)


@pytest.mark.slow
def test_on_aws_a_queue_time_limit_cancel_raises_unplaceable_with_its_reason(tmp_path, s3_endpoint):
    import boto3
    from s3server import emulator_endpoint, emulator_environment, new_bucket
    from test_session_threads import wait_until

    with emulator_endpoint(tmp_path / "emulator", max_vcpus=2):
        batch = boto3.client("batch", region_name="us-east-1")
        batch.create_job_queue(jobQueueName="limited", priority=1, computeEnvironmentOrder=[],
                               jobStateTimeLimitActions=[{"reason": TOO_LARGE, "state": "RUNNABLE",
                                                          "maxTimeSeconds": 1, "action": "CANCEL"}])
        # a new queue is CREATING for a moment, and takes no jobs until VALID (as on AWS)
        assert wait_until(lambda: batch.describe_job_queues(jobQueues=["limited"])
                          ["jobQueues"][0]["status"] == "VALID")
        env = emulator_environment(new_bucket())
        env.job_queue = "limited"
        with BatchExecutor(env, vcpus=4) as ex:  # more than the emulator's 2: held RUNNABLE
            error = ex.submit(allocate, 1).exception(timeout=180)
    assert type(error) is JobUnplaceableError
    assert error.reason == TOO_LARGE
    assert error.status_reason == f"Canceled by JobStateTimeLimit action due to reason: {TOO_LARGE}"


@pytest.mark.slow
def test_instance_memory_is_read_from_ec2(s3_endpoint):
    import boto3

    from batchfutures.environments import instance_memory_mib

    ec2 = boto3.client("ec2", region_name="us-east-1")  # moto's EC2, AWS_ENDPOINT_URL
    assert instance_memory_mib(ec2, ("m5.large",), ()) == 8192
    assert instance_memory_mib(ec2, ("m5.large",), ("c5",)) == 196608  # c5.24xlarge
    assert instance_memory_mib(ec2, (), ("zz9",)) is None
