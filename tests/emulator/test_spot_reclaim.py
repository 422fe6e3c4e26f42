"""The Spot reclaim fault: SIGTERM to the attempt's process, SIGKILL after the interruption
notice, and the attempt ended with AWS's reason for the Spot capacity it ran on (Fargate Spot:
"Your Spot Task was interrupted.", EC2 Spot: "Host EC2 (instance i-...) terminated."), which the
client's classify_failure reads as a lost host. The decisions are table-tested; the slow tests
run real processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from emulator_harness import py

from batchfutures import errors
from batchfutures.emulator import BatchEmulator
from batchfutures.emulator.faults import SPOT_NOTICE, FaultInjector, FaultProfile
from batchfutures.emulator.jobstate import EXITED, HOST_TERMINATED, SPOT_TASK_INTERRUPTED
from batchfutures.emulator.runtime.attempts import KillReason
from batchfutures.emulator.runtime.outcomes import AttemptEnd, attempt_outcome

FARGATE = {"type": "FARGATE_SPOT", "maxvCpus": 2, "subnets": ["s"], "securityGroupIds": ["g"]}


@pytest.mark.parametrize("exit_code, platform, container, reason, succeeded", [
    (137, "FARGATE_SPOT", {"exitCode": 137}, SPOT_TASK_INTERRUPTED, False),  # killed at the end
    (143, "FARGATE_SPOT", {"exitCode": 143}, SPOT_TASK_INTERRUPTED, False),  # left on SIGTERM
    (137, "SPOT", {}, HOST_TERMINATED, False),  # still there when the host went: no exit code
    (3, "SPOT", {"exitCode": 3}, HOST_TERMINATED, False),  # ended within the notice
    (0, "FARGATE_SPOT", {"exitCode": 0}, EXITED, True),  # exit 0 is a success, as on AWS
    (0, "SPOT", {"exitCode": 0}, EXITED, True),
])
def test_how_a_reclaimed_attempt_ends(exit_code, platform, container, reason, succeeded):
    outcome = attempt_outcome(AttemptEnd(exit_code=exit_code, killed=KillReason.SPOT_RECLAIM,
                                         spot_platform=platform))
    assert (outcome.container, outcome.status_reason, outcome.succeeded) == (
        container, reason, succeeded)
    assert outcome.retryable  # the retry strategy decides, as for a lost host


@pytest.mark.parametrize("profile, queue, spot_type, on_demand, expected", [
    (FaultProfile(), "q", None, False, None),  # off by default
    (FaultProfile(spot_reclaim_rate=1.0), "q", None, False, (1.0, "FARGATE_SPOT")),
    (FaultProfile(spot_reclaim_rate=1.0, spot_platform="SPOT"), "q", None, False, (1.0, "SPOT")),
    (FaultProfile(spot_reclaim_rate=1.0), "q", "SPOT", False, (1.0, "SPOT")),  # its environment's
    (FaultProfile(spot_reclaim_rate=1.0), "q", None, True, None),  # on-demand is never reclaimed
    (FaultProfile(spot_reclaim_rate=1.0, spot_queues=frozenset({"spot"})), "q", None, False, None),
    (FaultProfile(spot_reclaim_rate=1.0, spot_queues=frozenset({"spot"}), spot_reclaim_after=2),
     "spot", None, False, (2.0, "FARGATE_SPOT")),
])
def test_which_attempts_spot_reclaims(profile, queue, spot_type, on_demand, expected):
    assert FaultInjector(profile).spot_reclaim(queue, spot_type, on_demand) == expected


def test_the_notice_is_two_minutes_unless_told_and_bad_profiles_are_refused():
    assert FaultProfile().spot_notice == SPOT_NOTICE == 120.0
    with pytest.raises(ValueError, match="spot_platform"):
        FaultProfile(spot_platform="EC2")
    with pytest.raises(ValueError, match="spot_reclaim_rate"):
        FaultProfile(spot_reclaim_rate=2)
    with pytest.raises(ValueError, match="spot_notice"):
        FaultProfile(spot_notice=-1)
    injector = FaultInjector(FaultProfile(spot_reclaim_rate=0.5, seed=3))
    drawn = [injector.spot_reclaim("q", None, False) for _ in range(200)]
    assert 60 < sum(d is not None for d in drawn) < 140 and injector.spot_reclaims == sum(
        d is not None for d in drawn)


def stubborn(marker: Path, code: int = 0, stay: bool = True):
    """A job that notes the SIGTERM it gets; then stays (to be killed) or exits with `code`."""
    return py("import signal, sys, time\n"
              "def noticed(signum, frame):\n"
              f"    open({str(marker)!r}, 'a').write(f'{{time.time()}}\\n')\n"
              f"    {'return' if stay else f'sys.exit({code})'}\n"
              "signal.signal(signal.SIGTERM, noticed)\n"
              "time.sleep(60)\n")


@pytest.fixture
def spot(make_emulator):
    def make(**profile):
        profile.setdefault("spot_reclaim_rate", 1.0)
        profile.setdefault("spot_reclaim_after", 1.5)
        profile.setdefault("spot_notice", 0.5)
        return make_emulator(faults=FaultProfile(**profile), control_plane_delay=0)
    return make


@pytest.mark.slow
def test_fargate_spot_sends_sigterm_then_kills_after_the_notice(spot, tmp_path):
    emu = spot()
    marker = tmp_path / "sigterm"
    detail = emu.run(stubborn(marker))
    assert detail["status"] == "FAILED"
    assert detail["statusReason"] == "Your Spot Task was interrupted."
    attempt = detail["attempts"][-1]
    assert attempt["statusReason"] == "Your Spot Task was interrupted."
    assert attempt["container"]["exitCode"] == 137  # it stayed: SIGKILL at the notice's end
    noticed = float(marker.read_text().split()[0])
    assert attempt["stoppedAt"] / 1000 - noticed >= 0.5 - 0.05  # the notice was given in full
    assert emu.emulator.faults.spot_reclaims == 1
    failure = errors.classify_failure(detail)
    assert type(failure) is errors.HostTerminatedError


@pytest.mark.slow
def test_ec2_spot_loses_the_host_and_the_retry_strategy_retries(spot, tmp_path):
    emu = spot(spot_platform="SPOT")
    marker = tmp_path / "sigterm"
    detail = emu.run(stubborn(marker, code=3, stay=False), retryStrategy={"attempts": 2})
    assert detail["status"] == "FAILED" and len(detail["attempts"]) == 2
    for attempt in detail["attempts"]:
        assert attempt["statusReason"] == "Host EC2 (instance i-0123456789abcdef0) terminated."
        assert attempt["container"]["exitCode"] == 3  # it left within the notice
    assert len(marker.read_text().split()) == 2  # each attempt had its SIGTERM
    assert type(errors.classify_failure(detail)) is errors.HostTerminatedError


@pytest.mark.slow
def test_a_job_that_leaves_cleanly_on_the_notice_succeeded(spot, tmp_path):
    emu = spot()
    detail = emu.run(stubborn(tmp_path / "sigterm", code=0, stay=False))
    assert detail["status"] == "SUCCEEDED"  # as AWS records an essential container's exit 0
    assert (tmp_path / "sigterm").exists()


@pytest.mark.slow
def test_only_spot_capacity_is_reclaimed(spot, tmp_path):
    emu = spot(spot_queues=frozenset({"spot-queue"}), spot_reclaim_after=0.2)
    emu.create_compute_environment(computeEnvironmentName="on-demand", type="MANAGED",
                                   computeResources=dict(FARGATE, type="FARGATE"))
    emu.create_job_queue(jobQueueName="od", priority=1,
                         computeEnvironmentOrder=[{"order": 1, "computeEnvironment": "on-demand"}])
    emu.create_job_queue(jobQueueName="spot-queue", priority=1, computeEnvironmentOrder=[])
    quick = py("import time; time.sleep(1)")
    assert emu.run(quick, queue="od")["status"] == "SUCCEEDED"
    assert emu.run(quick)["status"] == "SUCCEEDED"  # the emulator's own queue: not listed
    reclaimed = emu.run(quick, queue="spot-queue")
    assert reclaimed["statusReason"] == "Your Spot Task was interrupted."
    # a created Spot environment's type decides the reason, whatever the profile says
    emu.create_compute_environment(computeEnvironmentName="ec2-spot", type="MANAGED",
                                   computeResources={"type": "SPOT", "maxvCpus": 2,
                                                     "instanceRole": "r", "subnets": ["s"]})
    emu.create_job_queue(jobQueueName="ec2-spot-queue", priority=1,
                         computeEnvironmentOrder=[{"order": 1, "computeEnvironment": "ec2-spot"}])
    emu.emulator.set_faults(FaultProfile(spot_reclaim_rate=1.0, spot_reclaim_after=0.2,
                                         spot_notice=0.5))
    detail = emu.run(quick, queue="ec2-spot-queue")
    assert detail["statusReason"].startswith("Host EC2 (instance ")


def test_the_endpoint_takes_the_reclaim_flags(tmp_path):
    from batchfutures.emulator.__main__ import fault_profile, parse_args

    profile = fault_profile(parse_args(["--spot-reclaim-rate", "1", "--spot-notice", "2",
                                        "--spot-platform", "SPOT", "--spot-queues", "a,b"]))
    assert (profile.spot_reclaim_rate, profile.spot_notice, profile.spot_platform,
            profile.spot_queues) == (1.0, 2.0, "SPOT", frozenset({"a", "b"}))
    assert fault_profile(parse_args([])).spot_reclaim_rate == 0.0
    with BatchEmulator(tmp_path / "e", max_vcpus=1, faults=profile) as emulator:
        assert emulator.fault_profile.spot_notice == 2.0
