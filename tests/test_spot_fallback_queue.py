"""spot_attempts' fallback queue: fallback_queue=, else the environment's own (the stack's
on-demand-only <stack>-multinode queue when the job queue is its <stack>-ec2 one), else refused
when the settings are made."""

import pytest
from spotcases import add_on_demand_queue, steps_to

from batchfutures import AWSBatchEnvironment, BatchExecutor, ConfigurationError, LocalEnvironment
from batchfutures.dryrun import DryRunEnvironment
from batchfutures.emulator.faults import FaultProfile
from batchfutures.settings import JobSettings
from batchfutures.spot import check_fallback

ARN = "arn:aws:batch:us-east-1:123456789012:job-queue/{}"


@pytest.fixture
def credentials(monkeypatch):
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(variable, "testing")


@pytest.mark.parametrize("job_queue, stack, fallback", [
    (ARN.format("bf-ec2"), "bf", ARN.format("bf-multinode")),  # the stack's EC2 queue (the output)
    ("bf-ec2", "bf", "bf-multinode"),                           # by name
    (ARN.format("bf-fargate"), "bf", None),                     # the Fargate CE is not Spot
    (ARN.format("bf-ec2"), None, None),                         # no stack=: nothing is assumed
    (ARN.format("other-ec2"), "bf", None),                      # another stack's or queue
    (ARN.format("bf-multinode"), "bf", None),                   # already on demand
])
def test_the_stacks_on_demand_queue_is_the_fallback(credentials, job_queue, stack, fallback):
    env = AWSBatchEnvironment(job_queue, "some-bucket", "worker:1", stack=stack,
                              region_name="us-east-1")
    assert env.fallback_queue == fallback
    assert DryRunEnvironment(env).fallback_queue == fallback


@pytest.mark.parametrize("spot_attempts, given, environments, refused", [
    (0, None, None, False),
    (2, "on-demand", None, False),
    (2, None, "bf-multinode", False),
    (2, "on-demand", "bf-multinode", False),
    (2, None, None, True),
])
def test_check_fallback(spot_attempts, given, environments, refused):
    if refused:
        with pytest.raises(ConfigurationError, match="pass fallback_queue="):
            check_fallback(spot_attempts, given, environments)
    else:
        check_fallback(spot_attempts, given, environments)


def test_spot_attempts_without_a_fallback_is_refused_when_the_executor_is_made(local_env):
    with pytest.raises(ConfigurationError, match="spot_attempts=2 needs an on-demand job queue"):
        BatchExecutor(local_env, spot_attempts=2)
    with BatchExecutor(local_env) as ex:
        with pytest.raises(ConfigurationError, match="pass fallback_queue="):
            ex.with_settings(spot_attempts=1)
        assert ex.with_settings(spot_attempts=1, fallback_queue="on-demand").settings.spot_attempts == 1


def test_the_stack_environment_takes_spot_attempts_without_fallback_queue(credentials):
    stack_env = AWSBatchEnvironment(ARN.format("bf-ec2"), "some-bucket", "worker:1", stack="bf",
                                    region_name="us-east-1")
    stack_env.validate_settings(JobSettings.from_kwargs(spot_attempts=2))  # not refused
    other = AWSBatchEnvironment(ARN.format("mine"), "some-bucket", "worker:1",
                                region_name="us-east-1")
    with pytest.raises(ConfigurationError, match="pass fallback_queue="):
        other.validate_settings(JobSettings.from_kwargs(spot_attempts=2))
    other.validate_settings(JobSettings.from_kwargs(spot_attempts=2, fallback_queue="od"))


class OnDemandFallback(LocalEnvironment):
    """The emulator with an on-demand queue of its own, as the stack's environment has."""

    @property
    def fallback_queue(self):
        return "on-demand"


@pytest.mark.slow
def test_without_fallback_queue_the_environments_on_demand_queue_takes_the_call(tmp_path):
    env = OnDemandFallback(tmp_path / "work", max_vcpus=2)
    try:
        batch = env.batch
        queue = add_on_demand_queue(batch, env.job_queue)
        env.emulator.set_faults(FaultProfile(
            spot_reclaim_rate=1.0, spot_reclaim_after=0.5, spot_notice=0.5,
            spot_queues=frozenset({queue["jobQueueName"], queue["jobQueueArn"]})))
        with BatchExecutor(env, spot_attempts=1) as ex:  # no fallback_queue=
            future = ex.submit(steps_to, 40)  # 2 s: Spot reclaims it within 0.5 s
            assert future.result(timeout=120) == 40
            assert future.reclaims == 1
            (described,) = batch.describe_jobs(jobs=[future.job_id])["jobs"]
            assert described["jobQueue"].endswith("on-demand")
    finally:
        env.emulator.close()
