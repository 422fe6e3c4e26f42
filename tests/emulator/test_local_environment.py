"""LocalEnvironment's side of "nothing waits forever": GPUs detected, impossible jobs refused early."""

import os

import pytest

from batchfutures import BatchExecutor, ConfigurationError, LocalEnvironment
from batchfutures.emulator.runtime import host


@pytest.mark.slow
def test_gpus_are_detected_from_nvidia_smi_when_not_given(tmp_path, monkeypatch):
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho 'GPU 0: Tesla T4 (UUID: GPU-1)'\necho 'GPU 1: Tesla T4 (UUID: GPU-2)'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    if not os.path.isdir("/proc/driver/nvidia/gpus"):
        assert host.gpu_count() == 2
    assert LocalEnvironment(tmp_path / "w", gpus=1).gpus == 1


def test_this_machine_without_a_gpu_tool_has_what_proc_says(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    expected = (len(os.listdir("/proc/driver/nvidia/gpus"))
                if os.path.isdir("/proc/driver/nvidia/gpus") else 0)
    assert LocalEnvironment(tmp_path / "w").gpus == expected


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_gpus_must_be_a_whole_number(tmp_path, bad):
    with pytest.raises(ConfigurationError):
        LocalEnvironment(tmp_path, gpus=bad)


def test_more_vcpus_than_the_environment_runs_is_refused_when_the_executor_is_made(tmp_path):
    env = LocalEnvironment(tmp_path, max_vcpus=1, gpus=0)
    with pytest.raises(ConfigurationError, match=r"vcpus=2 .*at most 1 vCPUs"):
        BatchExecutor(env, vcpus=2)
    with BatchExecutor(env) as executor:
        with pytest.raises(ConfigurationError, match="vcpus=4"):
            executor.with_settings(vcpus=4)


def test_more_gpus_than_the_environment_has_is_refused_saying_how_many_it_has(tmp_path):
    with pytest.raises(ConfigurationError, match="has 0 GPUs"):
        BatchExecutor(LocalEnvironment(tmp_path, gpus=0), gpus=1)
    with pytest.raises(ConfigurationError, match="has 1 GPU\\b"):
        BatchExecutor(LocalEnvironment(tmp_path / "one", gpus=1), gpus=2)
    BatchExecutor(LocalEnvironment(tmp_path / "two", gpus=2), gpus=2).shutdown()


def test_more_memory_than_the_machine_has_is_refused(tmp_path):
    total = host.memory_mib()
    assert total
    with pytest.raises(ConfigurationError, match=f"this machine has {total} MiB"):
        BatchExecutor(LocalEnvironment(tmp_path, gpus=0), memory=total + 1)


def test_the_emulator_gets_the_environments_gpus_and_path_setting(tmp_path):
    env = LocalEnvironment(tmp_path, gpus=3, inherit_client_path=True)
    assert env.emulator.gpus == 3
    assert env.emulator.inherit_client_path is True
