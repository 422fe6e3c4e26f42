"""vCPUs, dependencies and retries: what decides when (and whether) an attempt runs."""

import json

import pytest
from emulator_harness import py

TOO_BIG = "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT"
DEPENDENT = "Dependent Job failed"

# A child that records the interval it ran in (from inside the process) and its attempt.
INTERVAL = ("import json, os, sys, time\n"
            "start = time.monotonic()\n"
            "time.sleep(0.15)\n"
            "name = (os.environ['AWS_BATCH_JOB_ID'].replace(':', '_') + '_'\n"
            "        + os.environ['AWS_BATCH_JOB_ATTEMPT'])\n"
            "with open(os.path.join(sys.argv[1], name), 'w') as f:\n"
            "    json.dump([start, time.monotonic()], f)\n")


def most_at_once(folder):
    events = []
    for path in folder.iterdir():
        start, end = json.loads(path.read_text())
        events += [(start, 1), (end, -1)]
    running = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        running += step
        peak = max(peak, running)
    return peak


def running_vcpus(emu, array, size):
    """vCPUs of the children in STARTING or RUNNING, and whether the array is over."""
    found = emu.describe_jobs(jobs=[array] + [f"{array}:{i}" for i in range(size)])["jobs"]
    total = 0.0
    for job in found[1:]:
        if job["status"] in ("STARTING", "RUNNING"):
            vcpus = [r for r in job["container"]["resourceRequirements"] if r["type"] == "VCPU"]
            total += float(vcpus[0]["value"])
    return total, found[0]["status"] in ("SUCCEEDED", "FAILED")


@pytest.mark.slow
@pytest.mark.parametrize("max_vcpus, vcpus, size", [(2, 1, 6), (3, 2, 4), (1, 0.5, 6)])
def test_never_more_than_max_vcpus_run_at_once(make_emulator, tmp_path, max_vcpus, vcpus, size):
    emu = make_emulator(max_vcpus=max_vcpus)
    out = tmp_path / "out"
    out.mkdir()
    array = emu.job(py(INTERVAL) + [str(out)], size=size, vcpus=vcpus)
    peak = 0.0
    while True:  # observed through DescribeJobs (bounded: the array ends)
        total, done = running_vcpus(emu, array, size)
        assert total <= max_vcpus
        peak = max(peak, total)
        if done:
            break
    assert emu.wait(array)["status"] == "SUCCEEDED"
    # and from inside the processes: the intervals they really ran in
    assert most_at_once(out) <= max_vcpus // vcpus
    assert peak > 0


@pytest.mark.slow
def test_a_job_bigger_than_the_environment_waits_runnable_and_others_pass(make_emulator):
    emu = make_emulator(max_vcpus=2)
    big = emu.job(py("pass"), name="big", vcpus=4)
    detail = emu.wait(big, ["RUNNABLE"], check=lambda d: d.get("statusReason", "").startswith(TOO_BIG))
    assert detail["statusReason"].startswith(TOO_BIG)
    small = emu.run(py("pass"), name="small")
    assert small["status"] == "SUCCEEDED"
    assert emu.status(big) == "RUNNABLE"
    emu.cancel_job(jobId=big, reason="it will never fit")
    assert emu.wait(big)["statusReason"] == "it will never fit"


@pytest.mark.slow
def test_a_job_waits_pending_for_its_dependency(emu, tmp_path):
    marker = tmp_path / "first-done"
    first = emu.job(py(f"import time; time.sleep(0.3); open({str(marker)!r}, 'w').close()"))
    second = emu.job(py(f"import os, sys; sys.exit(0 if os.path.exists({str(marker)!r}) else 1)"),
                     dependsOn=[{"jobId": first}])
    emu.wait(first, ["RUNNING"])
    assert emu.status(second) == "PENDING"
    detail = emu.wait(second)
    assert detail["status"] == "SUCCEEDED"
    assert detail["dependsOn"] == [{"jobId": first}]
    assert detail["startedAt"] >= emu.detail(first)["stoppedAt"]


@pytest.mark.slow
def test_n_to_n_between_arrays(make_emulator, tmp_path):
    emu = make_emulator(max_vcpus=3)
    # in `first`, child 0 is slow: `second`'s child 0 must wait for it, the others need not
    first = emu.job(py("import os, time\n"
                       "index = os.environ['AWS_BATCH_JOB_ARRAY_INDEX']\n"
                       f"while index == '0' and not os.path.exists({str(tmp_path / 'go')!r}): "
                       "time.sleep(0.01)\n"
                       f"open(os.path.join({str(tmp_path)!r}, 'first-' + index), 'w').close()\n"),
                    size=3)
    second = emu.job(py("import os, sys\n"
                        "index = os.environ['AWS_BATCH_JOB_ARRAY_INDEX']\n"
                        f"sys.exit(0 if os.path.exists(os.path.join({str(tmp_path)!r}, 'first-' + index)) "
                        "else 1)\n"),
                     size=3, dependsOn=[{"jobId": first, "type": "N_TO_N"}])
    emu.wait(f"{second}:1")
    emu.wait(f"{second}:2")
    assert emu.status(f"{second}:0") == "PENDING"
    (tmp_path / "go").touch()
    assert emu.wait(second)["status"] == "SUCCEEDED"
    for index in range(3):
        assert emu.detail(f"{second}:{index}")["startedAt"] >= emu.detail(f"{first}:{index}")["stoppedAt"]


@pytest.mark.slow
def test_sequential_children_run_one_after_another(make_emulator, tmp_path):
    emu = make_emulator(max_vcpus=4)
    order = tmp_path / "order"
    array = emu.job(py("import os, time\n"
                       f"with open({str(order)!r}, 'a') as f:\n"
                       "    f.write(os.environ['AWS_BATCH_JOB_ARRAY_INDEX'] + ' start\\n')\n"
                       "time.sleep(0.05)\n"
                       f"with open({str(order)!r}, 'a') as f:\n"
                       "    f.write(os.environ['AWS_BATCH_JOB_ARRAY_INDEX'] + ' end\\n')\n"),
                    size=4, dependsOn=[{"type": "SEQUENTIAL"}])
    assert emu.wait(array)["status"] == "SUCCEEDED"
    expected = []
    for index in range(4):
        expected += [f"{index} start", f"{index} end"]
    assert order.read_text().split("\n")[:-1] == expected


@pytest.mark.slow
def test_a_failed_dependency_fails_its_dependents_in_cascade(emu):
    first = emu.job(py("raise SystemExit(3)"))
    second = emu.job(py("pass"), dependsOn=[{"jobId": first}])
    third = emu.job(py("pass"), size=2, dependsOn=[{"jobId": second}])
    for job in (second, third):
        detail = emu.wait(job)
        assert detail["status"] == "FAILED"
        assert detail["statusReason"].startswith(DEPENDENT)
        assert detail["attempts"] == []
    assert emu.detail(f"{third}:1")["statusReason"].startswith(DEPENDENT)


@pytest.mark.slow
def test_n_to_n_fails_only_the_matching_child(emu):
    first = emu.job(py("import os; raise SystemExit(os.environ['AWS_BATCH_JOB_ARRAY_INDEX'] == '1')"),
                    size=3)
    second = emu.job(py("pass"), size=3, dependsOn=[{"jobId": first, "type": "N_TO_N"}])
    assert emu.wait(second)["status"] == "FAILED"
    children = emu.describe_jobs(jobs=[f"{second}:{i}" for i in range(3)])["jobs"]
    assert [c["status"] for c in children] == ["SUCCEEDED", "FAILED", "SUCCEEDED"]
    assert children[1]["statusReason"].startswith(DEPENDENT)


@pytest.mark.slow
def test_sequential_failure_fails_the_rest(emu):
    array = emu.job(py("import os; raise SystemExit(os.environ['AWS_BATCH_JOB_ARRAY_INDEX'] == '1')"),
                    size=4, dependsOn=[{"type": "SEQUENTIAL"}])
    assert emu.wait(array)["status"] == "FAILED"
    children = emu.describe_jobs(jobs=[f"{array}:{i}" for i in range(4)])["jobs"]
    assert [c["status"] for c in children] == ["SUCCEEDED", "FAILED", "FAILED", "FAILED"]
    assert children[1]["statusReason"] == "Essential container in task exited"
    assert children[2]["statusReason"].startswith(DEPENDENT)
    assert children[3]["attempts"] == []


@pytest.mark.slow
def test_a_dependency_already_finished_is_no_wait(emu):
    first = emu.run(py("pass"))
    assert emu.run(py("pass"), dependsOn=[{"jobId": first["jobId"]}])["status"] == "SUCCEEDED"
    failed = emu.run(py("raise SystemExit(1)"))
    late = emu.run(py("pass"), dependsOn=[{"jobId": failed["jobId"]}])
    assert late["status"] == "FAILED" and late["statusReason"].startswith(DEPENDENT)


# -- retries ------------------------------------------------------------------------------------
EXIT_WITH = ("import os, sys\n"
             "attempt = int(os.environ['AWS_BATCH_JOB_ATTEMPT'])\n"
             "codes = {codes!r}\n"
             "sys.exit(codes[attempt - 1])\n")


def retried(emu, codes, rules=None, attempts=3):
    strategy = {"attempts": attempts}
    if rules is not None:
        strategy["evaluateOnExit"] = rules
    detail = emu.run(py(EXIT_WITH.format(codes=codes)), retryStrategy=strategy)
    return detail, [a["container"].get("exitCode") for a in detail["attempts"]]


@pytest.mark.slow
def test_attempts_are_retried_until_success_with_the_attempt_number_incremented(emu, tmp_path):
    code = ("import os, sys\n"
            "attempt = os.environ['AWS_BATCH_JOB_ATTEMPT']\n"
            f"open(os.path.join({str(tmp_path)!r}, 'attempt-' + attempt), 'w').close()\n"
            "sys.exit(0 if attempt == '3' else 1)\n")
    detail = emu.run(py(code), retryStrategy={"attempts": 4})
    assert detail["status"] == "SUCCEEDED"
    assert [a["container"]["exitCode"] for a in detail["attempts"]] == [1, 1, 0]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("attempt-")) == \
        ["attempt-1", "attempt-2", "attempt-3"]
    streams = {a["container"]["logStreamName"] for a in detail["attempts"]}
    assert len(streams) == 3
    for earlier, later in zip(detail["attempts"], detail["attempts"][1:]):
        assert earlier["stoppedAt"] <= later["startedAt"]


@pytest.mark.slow
def test_attempts_run_out(emu):
    detail, codes = retried(emu, [1, 2, 3], attempts=3)
    assert detail["status"] == "FAILED" and codes == [1, 2, 3]
    assert detail["retryStrategy"] == {"attempts": 3}


@pytest.mark.slow
def test_an_exit_rule_stops_retries(emu):
    detail, codes = retried(emu, [3, 0, 0], [{"onExitCode": "3", "action": "EXIT"}])
    assert detail["status"] == "FAILED" and codes == [3]


@pytest.mark.slow
def test_a_trailing_star_is_a_prefix_match(emu):
    rules = [{"onExitCode": "4*", "action": "RETRY"}, {"onExitCode": "*", "action": "EXIT"}]
    detail, codes = retried(emu, [41, 42, 0], rules)
    assert detail["status"] == "SUCCEEDED" and codes == [41, 42, 0]
    detail, codes = retried(emu, [41, 5, 0], rules)
    assert detail["status"] == "FAILED" and codes == [41, 5]


@pytest.mark.slow
def test_no_matching_rule_means_retry(emu):
    detail, codes = retried(emu, [1, 1, 0], [{"onExitCode": "99", "action": "EXIT"}])
    assert detail["status"] == "SUCCEEDED" and codes == [1, 1, 0]


@pytest.mark.slow
def test_status_reason_rules_are_case_insensitive(emu):
    rules = [{"onStatusReason": "ESSENTIAL CONTAINER IN TASK*", "action": "EXIT"}]
    detail, codes = retried(emu, [1, 0, 0], rules)
    assert detail["status"] == "FAILED" and codes == [1]
    rules = [{"onStatusReason": "essential container in task exited", "onExitCode": "1",
              "action": "retry"}, {"onReason": "*", "action": "EXIT"}]
    detail, codes = retried(emu, [1, 2, 0], rules)
    assert detail["status"] == "FAILED" and codes == [1, 2]


@pytest.mark.slow
def test_reason_rules_see_the_out_of_memory_reason(emu):
    oom = py("import sys\ntry:\n    len(bytearray(600 * 1024 * 1024))\n"
             "except MemoryError:\n    sys.exit(137)\n")
    for action, expected in (("EXIT", 1), ("RETRY", 2)):
        rules = [{"onReason": "outofmemoryerror*", "action": action}]
        detail = emu.run(oom, memory=256, retryStrategy={"attempts": 2, "evaluateOnExit": rules})
        assert detail["status"] == "FAILED"
        assert len(detail["attempts"]) == expected
        assert all(a["container"]["reason"].startswith("OutOfMemoryError") for a in detail["attempts"])


@pytest.mark.slow
def test_the_definitions_retry_strategy_applies_when_the_job_has_none(emu):
    emu.register_job_definition(jobDefinitionName="retrying", type="container",
                                retryStrategy={"attempts": 2},
                                containerProperties={"image": "local", "command": py("raise SystemExit(1)"),
                                                     "resourceRequirements": [
                                                         {"type": "VCPU", "value": "1"},
                                                         {"type": "MEMORY", "value": "256"}]})
    job = emu.submit_job(jobName="r", jobQueue="batchfutures", jobDefinition="retrying")["jobId"]
    detail = emu.wait(job)
    assert len(detail["attempts"]) == 2
    assert detail["retryStrategy"]["attempts"] == 2
