"""Multi-node parallel jobs from the client: nodes=N submits one Batch multi-node job.

Pure parts first (node(), build_request against botocore's model, the reconcile step and the
combination of node results), then real 3-node jobs on the emulator whose nodes talk to the main
node over TCP on 127.0.0.1.
"""

from __future__ import annotations

import time

import pytest
from botocore.session import get_session
from botocore.validate import ParamValidator

import batchfutures
from batchfutures import BatchExecutor, LocalEnvironment, wire
from batchfutures.errors import (
    ConfigurationError,
    JobFailedError,
    MemoryLimitExceeded,
    RemoteError,
    classify_failure,
)
from batchfutures.futures import BatchFuture
from batchfutures.jobs import JobStatus, TrackedJob, combine_node_results
from batchfutures.reconcile import Reads, reconcile
from batchfutures.settings import JobSettings
from batchfutures.submission import build_request
from batchfutures.worker.nodes import NodeInfo, node

MODEL = get_session().get_service_model("batch")


# -- node() --------------------------------------------------------------------------------------
@pytest.mark.parametrize("environ, expected", [
    ({}, NodeInfo(0, 1, 0, "127.0.0.1")),  # not a multi-node job: one node
    ({"AWS_BATCH_JOB_NODE_INDEX": "2", "AWS_BATCH_JOB_NUM_NODES": "4",
      "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
      "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.3.7"}, NodeInfo(2, 4, 0, "10.0.3.7")),
    # the main node is not told its address: locally it is the loopback
    ({"AWS_BATCH_JOB_NODE_INDEX": "1", "AWS_BATCH_JOB_NUM_NODES": "3",
      "AWS_BATCH_JOB_MAIN_NODE_INDEX": "1"}, NodeInfo(1, 3, 1, "127.0.0.1")),
])
def test_node_reads_batchs_variables(environ, expected):
    info = node(environ)
    assert info == expected
    assert info.is_main == (expected.index == expected.main_index)


def test_on_an_ecs_container_the_main_node_gives_its_host_address(monkeypatch):
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "ip-10-0-3-7")
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "10.0.3.7" if name == "ip-10-0-3-7" else "")
    info = node({"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_NUM_NODES": "2",
                 "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
                 # no metadata answers there: the host name's address
                 "ECS_CONTAINER_METADATA_URI_V4": "http://127.0.0.1:9/v4/x"})
    assert info.main_address == "10.0.3.7" and info.is_main


def test_node_is_exported_lazily():
    assert batchfutures.node is node and "node" in dir(batchfutures)


# -- the SubmitJob request -------------------------------------------------------------------------
def test_build_request_for_three_nodes_is_a_valid_multinode_submit_job():
    settings = JobSettings.from_kwargs(nodes=3, vcpus=2, environment={"A": "b"})
    built = build_request(settings, name="bf-f", job_queue="q", job_definition="mnp",
                          command=["python", "-m", "batchfutures.worker", "u"], size=1,
                          memory_mib=4096, run_id="run-1", user="me")
    report = ParamValidator().validate(built, MODEL.operation_model("SubmitJob").input_shape)
    assert not report.has_errors(), report.generate_report()
    assert "containerOverrides" not in built and "arrayProperties" not in built
    overrides = built["nodeOverrides"]
    assert overrides["numNodes"] == 3
    [group] = overrides["nodePropertyOverrides"]
    assert group["targetNodes"] == "0:"
    container = group["containerOverrides"]
    assert container["command"] == ["python", "-m", "batchfutures.worker", "u"]
    assert {"type": "VCPU", "value": "2"} in container["resourceRequirements"]
    assert {"type": "MEMORY", "value": "4096"} in container["resourceRequirements"]
    assert {"name": "A", "value": "b"} in container["environment"]
    # the same overrides a one-node job would carry, now under the node group
    single = build_request(JobSettings.from_kwargs(vcpus=2, environment={"A": "b"}), name="bf-f",
                           job_queue="q", job_definition="d",
                           command=["python", "-m", "batchfutures.worker", "u"], size=1,
                           memory_mib=4096, run_id="run-1", user="me")
    assert container == single["containerOverrides"]


# -- reconcile and the combined outcome -----------------------------------------------------------
def ok(value):
    return wire.pack_result([wire.encode_ok(value)], {})


def raised(error):
    return wire.pack_result([wire.encode_error(error, "Traceback ...")], {})


def multinode_job(nodes=3):
    future = BatchFuture(None)
    return TrackedJob("mnp-1", "file:///nowhere", [[future]], array=False, nodes=nodes,
                      submitted_at=0.0), future


def settle_from(job, description, results, failed_nodes=(), nodes=None):
    """One reconcile of the job, answering its reads from these; the reads asked, in order."""
    view = job.view(1.0)
    reads = Reads(description)
    asked = []
    while True:
        step = reconcile(view, reads)
        if not step.needs:
            break
        if step.needs.results:
            asked.append(step.needs.results)
        for index in step.needs.results:
            reads.results[index] = results.get(index)
        if step.needs.failed_nodes:
            asked.append("failed nodes")
            reads.failed_nodes = list(failed_nodes)
        for index in step.needs.nodes:
            asked.append(f"node {index}")
            reads.nodes[index] = (nodes or {}).get(index, {})
    job.apply(step.actions, failure_for=lambda i, d: RuntimeError(d.get("statusReason")),
              no_result_error=lambda i: RuntimeError("no result"),
              expired_error=lambda i: RuntimeError("expired"),
              unplaceable_error=lambda i, r: RuntimeError(r))
    return asked


def test_a_succeeded_multinode_job_reads_every_nodes_result_and_gives_the_list():
    job, future = multinode_job(3)
    asked = settle_from(job, {"jobId": "mnp-1", "status": "SUCCEEDED"},
                        {0: ok("a"), 1: ok("b"), 2: ok("c")})
    assert asked == [(0, 1, 2)]  # one round of reads, every node's result
    assert future.result(timeout=0) == ["a", "b", "c"] and future.status == "SUCCEEDED"


def test_a_node_whose_function_raised_fails_the_future_with_that_exception():
    job, future = multinode_job(3)
    settle_from(job, {"jobId": "mnp-1", "status": "SUCCEEDED"},
                {0: ok(0), 1: raised(KeyError("node one")), 2: raised(ValueError("two"))})
    error = future.exception(timeout=0)
    assert type(error) is KeyError and error.args == ("node one",)  # the first by index
    assert "node 1 of the 3 nodes of Batch job mnp-1" in " ".join(getattr(error, "__notes__", []))


def test_a_running_multinode_job_reads_nothing_and_a_failed_one_is_typed_from_its_description():
    job, future = multinode_job(2)
    job.checked_at = 0.5  # its failed nodes were listed a moment ago (see the tests below)
    assert settle_from(job, {"jobId": "mnp-1", "status": "RUNNING"}, {}) == []
    assert not future.done() and job.status is JobStatus.RUNNING
    settle_from(job, {"jobId": "mnp-1", "status": "FAILED",
                      "statusReason": "Essential container in task exited"}, {})
    assert str(future.exception(timeout=0)) == "Essential container in task exited"


# -- a node other than the main one dies: Batch does nothing, the client ends the job ------------
RUNNING_MNP = {"jobId": "mnp-1", "status": "RUNNING", "nodeProperties": {"numNodes": 3, "mainNode": 0}}


def node_summary(index, status="FAILED", exit_code=3, **extra):
    return {"jobId": f"mnp-1#{index}", "status": status, "statusReason": "Essential container in task exited",
            "container": {"exitCode": exit_code},
            "nodeProperties": {"isMainNode": index == 0, "numNodes": 3, "nodeIndex": index}, **extra}


def oom_node(index):
    return {**node_summary(index, exit_code=137), "attempts": [{"container": {
        "exitCode": 137, "reason": "OutOfMemoryError: Container killed due to memory usage"}}]}


def test_a_running_multinode_job_lists_its_failed_nodes_once_per_check_interval():
    job, future = multinode_job(3)
    view = job.view(100.0, check_interval=30.0)
    reads = Reads(RUNNING_MNP)
    assert reconcile(view, reads).needs.failed_nodes
    reads.failed_nodes = []
    step = reconcile(view, reads)
    assert not step.needs and step.actions.checked_at == 100.0
    assert not step.actions.failed and not step.actions.terminate
    job.checked_at = 100.0
    assert not reconcile(job.view(129.0, check_interval=30.0), Reads(RUNNING_MNP)).needs
    assert reconcile(job.view(130.0, check_interval=30.0), Reads(RUNNING_MNP)).needs.failed_nodes


def test_a_failed_node_fails_the_call_typed_from_its_own_description_and_ends_the_job():
    job, future = multinode_job(3)
    reads = Reads(RUNNING_MNP, failed_nodes=[node_summary(2), node_summary(1)], nodes={1: oom_node(1)})
    actions = reconcile(job.view(1.0), reads).actions
    assert actions.failed == {0: oom_node(1)}
    [(target, reason)] = actions.terminate
    assert target == "mnp-1" and "node 1 of 3 failed" in reason and reason.startswith("batchfutures:")
    assert len(reason) <= 250
    asked = settle_from(job, RUNNING_MNP, {}, failed_nodes=[node_summary(2), node_summary(1)],
                        nodes={1: oom_node(1)})
    assert asked == ["failed nodes", "node 1"]  # the first failed node by index, described
    # settle_from's failure_for gives the description's statusReason: the node's, not the job's
    assert str(future.exception(timeout=0)) == "Essential container in task exited"
    assert future.status == "FAILED" and future.exit_code == 137


def test_the_listing_types_a_failed_node_batch_did_not_describe():
    job, future = multinode_job(3)
    settle_from(job, RUNNING_MNP, {}, failed_nodes=[node_summary(2, exit_code=9)], nodes={})
    assert future.done() and future.exit_code == 9


def test_a_failed_main_node_is_left_to_the_job_and_a_node_is_found_by_its_id_alone():
    job, future = multinode_job(3)
    main_listed = node_summary(0)
    assert settle_from(job, RUNNING_MNP, {}, failed_nodes=[main_listed]) == ["failed nodes"]
    assert not future.done()  # the main node's end is the job's: its own status says it
    job2, future2 = multinode_job(3)
    bare = {"jobId": "mnp-1#2", "status": "FAILED", "statusReason": "Host EC2 (instance i-1) terminated."}
    settle_from(job2, RUNNING_MNP, {}, failed_nodes=[bare], nodes={2: bare})
    assert str(future2.exception(timeout=0)) == "Host EC2 (instance i-1) terminated."


def test_combine_names_a_node_that_wrote_no_result():
    ok_, error = combine_node_results([ok(1), None], "mnp-9")
    assert not ok_ and isinstance(error, RemoteError) and "node 1 of Batch job mnp-9" in str(error)
    assert combine_node_results([ok(1), ok(2)], "mnp-9") == (True, [1, 2])


def test_a_forgotten_multinode_job_is_resolved_from_every_nodes_stored_result():
    job, future = multinode_job(2)
    view = job.view(1e6)
    reads = Reads(None, stored=frozenset({0, 1}))
    step = reconcile(view, reads)
    assert step.needs.results == (0, 1)
    reads.results.update({0: ok("x"), 1: ok("y")})
    assert reconcile(view, reads).actions.node_results == {0: (ok("x"), ok("y"))}


def test_nodes_that_cannot_all_run_at_once_here_are_refused_before_anything_is_sent(tmp_path):
    env = LocalEnvironment(tmp_path / "work", max_vcpus=2)
    with pytest.raises(ConfigurationError, match="nodes=3"):
        BatchExecutor(env).with_settings(nodes=3)


def test_map_with_nodes_is_refused_before_anything_is_uploaded(tmp_path):
    env = LocalEnvironment(tmp_path / "work", max_vcpus=2)
    try:
        with BatchExecutor(env) as ex:
            with pytest.raises(ConfigurationError, match="use submit"):
                ex.with_settings(nodes=2).map_futures(abs, [1])
        assert not list((tmp_path / "work").glob("storage/runs/*/jobs/*"))
    finally:
        env.emulator.close()


# -- real multi-node jobs on the emulator ----------------------------------------------------------
def talk_over_tcp(folder):
    """The main node listens on a port it picks and writes to ``folder``; every other node
    connects to the main node's address, sends its index and gets an answer back."""
    import os
    import socket

    import batchfutures

    info = batchfutures.node()
    port_file = os.path.join(folder, "port")
    if info.is_main:
        with socket.socket() as server:
            server.bind((info.main_address, 0))
            server.listen(info.count)
            server.settimeout(60)
            with open(port_file + ".tmp", "w") as f:
                f.write(str(server.getsockname()[1]))
            os.replace(port_file + ".tmp", port_file)  # whole, or not there
            print(f"main node {info.index} listening", flush=True)
            heard = []
            for _ in range(info.count - 1):
                connection, _ = server.accept()
                with connection:
                    connection.settimeout(60)
                    sender = int(connection.recv(64).decode())
                    heard.append(sender)
                    connection.sendall(f"welcome {sender}".encode())
        return {"node": info.index, "of": info.count, "main": info.main_index,
                "heard": sorted(heard)}
    deadline = time.time() + 60
    while not os.path.exists(port_file) and time.time() < deadline:
        time.sleep(0.02)
    with open(port_file) as f:
        port = int(f.read())
    with socket.create_connection((info.main_address, port), timeout=60) as connection:
        connection.sendall(str(info.index).encode())
        answer = connection.recv(64).decode()
    return {"node": info.index, "of": info.count, "main": info.main_index,
            "address": info.main_address, "answer": answer}


def refuse_on_node(bad):
    def call():
        import batchfutures

        info = batchfutures.node()
        if info.index == bad:
            raise ValueError(f"node {info.index} says no")
        return info.index
    return call


def slow_other_node(crash=False):
    def call():
        import os
        import time

        import batchfutures

        info = batchfutures.node()
        if not info.is_main:
            time.sleep(1.0)  # the main node has long returned: it must wait for this one
            if crash:
                os._exit(3)  # no result at all
        return info.index
    return call


@pytest.fixture
def three_vcpus(tmp_path):
    env = LocalEnvironment(tmp_path / "work", max_vcpus=3)
    yield env
    env.emulator.close()


@pytest.mark.slow
def test_three_nodes_talk_to_the_main_node_over_tcp_and_the_future_lists_each_nodes_value(
        three_vcpus, tmp_path):
    folder = tmp_path / "rendezvous"
    folder.mkdir()
    with BatchExecutor(three_vcpus) as ex:
        future = ex.with_settings(nodes=3, timeout=120).submit(talk_over_tcp, str(folder))
        result = future.result(timeout=120)
        described = three_vcpus.batch.describe_jobs(jobs=[future.job_id])["jobs"][0]
        assert "main node 0 listening" in future.log()  # the parent's log is its main node's
    assert result == [
        {"node": 0, "of": 3, "main": 0, "heard": [1, 2]},
        {"node": 1, "of": 3, "main": 0, "address": "127.0.0.1", "answer": "welcome 1"},
        {"node": 2, "of": 3, "main": 0, "address": "127.0.0.1", "answer": "welcome 2"},
    ]
    assert described["nodeProperties"]["numNodes"] == 3 and "arrayProperties" not in described
    definition = three_vcpus.batch.describe_job_definitions(
        jobDefinitions=[described["jobDefinition"]])["jobDefinitions"][0]
    assert definition["type"] == "multinode"
    # every node's value is there: the main node waited for the others' results before it ended
    # the job (a node still exiting then may be stopped and show FAILED; its result is written)
    nodes = three_vcpus.batch.list_jobs(
        multiNodeJobId=future.job_id, filters=[{"name": "JOB_NAME", "values": ["*"]}]
    )["jobSummaryList"]
    assert sorted(n["nodeProperties"]["nodeIndex"] for n in nodes) == [0, 1, 2]


@pytest.mark.slow
def test_two_multinode_submits_are_two_jobs_and_a_raising_node_fails_only_its_future(
        three_vcpus):
    with BatchExecutor(three_vcpus) as ex:
        view = ex.with_settings(nodes=3)
        failing = view.submit(refuse_on_node(2))  # close together: never one array job
        fine = view.submit(refuse_on_node(-1))
        error = failing.exception(timeout=120)
        assert fine.result(timeout=120) == [0, 1, 2]
    assert type(error) is ValueError and error.args == ("node 2 says no",)
    assert failing.job_id != fine.job_id and ":" not in failing.job_id
    with BatchExecutor(three_vcpus) as other:  # attach: from Batch and every node's result
        attached = other.attach(fine.job_id)
        assert attached.result(timeout=60) == [0, 1, 2]


@pytest.mark.slow
def test_a_multinode_future_as_an_argument_is_the_list_of_every_nodes_value(three_vcpus):
    from batchfutures.errors import DependencyFailedError

    with BatchExecutor(three_vcpus) as ex:
        view = ex.with_settings(nodes=3)
        nodes = view.submit(refuse_on_node(-1))
        total = ex.submit(sum, nodes)  # sent at once: it depends on the multi-node job
        both = ex.map_futures(len, [nodes, nodes])
        assert total.result(timeout=120) == 0 + 1 + 2
        assert [f.result(timeout=120) for f in both] == [3, 3]
        failing = view.submit(refuse_on_node(1))
        later = ex.submit(sum, failing)
        error = later.exception(timeout=120)
        (dependent,) = three_vcpus.batch.describe_jobs(jobs=[total.job_id])["jobs"]
    assert dependent["dependsOn"] == [{"jobId": nodes.job_id}]
    assert type(error) is DependencyFailedError
    assert type(error.__cause__) is ValueError and error.__cause__.args == ("node 1 says no",)


def test_the_worker_reads_a_multinode_upstream_from_every_nodes_result(tmp_path):
    from batchfutures.dependencies import FutureRef, Resolver
    from batchfutures.storage import Storage

    storage = Storage(tmp_path.as_uri())
    job_url = storage.job_url("run", "mnp")
    for index, value in enumerate("abc"):
        storage.write_result(job_url, index, ok(value))
    ref = FutureRef(job_url, 0, 0, "mnp-1", nodes=3)
    assert Resolver(storage).resolve((ref,), {}) == ((["a", "b", "c"],), {})
    other = storage.job_url("run", "mnp-raised")
    for index, data in enumerate([ok("a"), raised(KeyError("one")), ok("c")]):
        storage.write_result(other, index, data)
    with pytest.raises(Exception) as failed:
        Resolver(storage).resolve((FutureRef(other, 0, 0, "mnp-1", nodes=3),), {})
    assert type(failed.value).__name__ == "UpstreamFailed" and failed.value.ref.job_id == "mnp-1#1"


# -- the AWS path: stock boto3 against the emulator's HTTP endpoint, S3 on moto's server ---------
def node_index():
    import batchfutures

    info = batchfutures.node()
    return (info.index, info.count)


@pytest.mark.slow
def test_on_the_aws_path_image_registers_a_multinode_definition_and_submits_node_overrides(
        tmp_path, s3_endpoint, monkeypatch):
    import json
    import uuid

    import boto3
    from s3server import emulator_endpoint, emulator_environment, new_bucket

    bucket = new_bucket()
    seen = []
    original = boto3.session.Session.client

    def client(self, service, *args, **kwargs):
        made = original(self, service, *args, **kwargs)
        if service == "batch":
            made.meta.events.register(
                "provide-client-params.batch.*",
                lambda params, model, **_: seen.append((model.name, json.loads(json.dumps(params)))))
        return made
    monkeypatch.setattr(boto3.session.Session, "client", client)
    with emulator_endpoint(tmp_path / "aws-emulator", max_vcpus=2):
        env = emulator_environment(bucket, image=f"example/worker:{uuid.uuid4().hex[:8]}")
        with BatchExecutor(env) as ex:
            assert ex.with_settings(nodes=2).submit(node_index).result(timeout=120) == [
                (0, 2), (1, 2)]
    registered = [p for name, p in seen if name == "RegisterJobDefinition"
                  and p.get("type") == "multinode"]
    assert len(registered) == 1 and registered[0]["nodeProperties"]["numNodes"] == 2
    [submitted] = [p for name, p in seen if name == "SubmitJob"]
    assert submitted["nodeOverrides"]["numNodes"] == 2 and "containerOverrides" not in submitted
    for name, params in seen:
        if name in ("SubmitJob", "RegisterJobDefinition"):
            report = ParamValidator().validate(params, MODEL.operation_model(name).input_shape)
            assert not report.has_errors(), report.generate_report()


@pytest.mark.slow
def test_the_main_node_waits_for_a_slower_node_and_names_one_that_died(three_vcpus):
    with BatchExecutor(three_vcpus, nodes=2) as ex:
        assert ex.submit(slow_other_node()).result(timeout=120) == [0, 1]
        died = ex.with_settings(environment={"BATCHFUTURES_NODE_WAIT": "3"}).submit(
            slow_other_node(crash=True))
        error = died.exception(timeout=120)
    assert isinstance(error, RemoteError) and "node 1 of Batch job" in str(error)


@pytest.mark.slow
def test_a_node_that_dies_fails_the_call_at_once_and_the_job_is_terminated(three_vcpus):
    """No BATCHFUTURES_NODE_WAIT and a long timeout: without the client's check the main node
    would wait for node 1's result for 300 s."""
    from batchfutures.errors import JobFailedError

    with BatchExecutor(three_vcpus, nodes=2, timeout=300) as ex:
        ex._session.poller.check_interval = 0.5  # the test's clock; CHECK_INTERVAL is 30 s
        died = ex.submit(slow_other_node(crash=True))
        error = died.exception(timeout=120)  # well before the job's 300 s timeout
        assert type(error) is JobFailedError, repr(error)
        assert error.job_id == f"{died.job_id}#1" and error.exit_code == 3
        job = three_vcpus.batch.describe_jobs(jobs=[died.job_id])["jobs"][0]
        deadline = time.monotonic() + 60
        while job["status"] not in ("SUCCEEDED", "FAILED"):
            assert time.monotonic() < deadline, job["status"]
            time.sleep(0.2)
            job = three_vcpus.batch.describe_jobs(jobs=[died.job_id])["jobs"][0]
    assert job["status"] == "FAILED" and "node 1 of 2 failed" in job["statusReason"]


def test_a_failed_multinode_job_without_its_outcome_is_typed_from_its_main_node():
    """Batch takes a multi-node job's end from its main node; a parent described without it
    (no attempts, no container) is typed by describing the main node: here, an OOM kill."""
    job, _ = multinode_job(3)
    bare = {"jobId": "mnp-1", "status": "FAILED", "statusReason": "Essential container in task exited",
            "nodeProperties": {"numNodes": 3, "mainNode": 0}}
    view, reads = job.view(1.0), Reads(bare)
    assert reconcile(view, reads).needs.nodes == (0,)
    reads.nodes[0] = oom_node(0)
    step = reconcile(view, reads)
    assert not step.needs
    error = classify_failure(step.actions.failed[0], job_id="mnp-1", memory_mib=2048)
    assert isinstance(error, MemoryLimitExceeded) and error.exit_code == 137
    # the plain parent alone would have been a plain failure
    assert type(classify_failure(bare, job_id="mnp-1")) is JobFailedError


def test_a_failed_multinode_job_with_its_outcome_reads_no_node():
    job, future = multinode_job(2)
    with_outcome = {"jobId": "mnp-1", "status": "FAILED",
                    "statusReason": "Essential container in task exited",
                    "nodeProperties": {"numNodes": 2, "mainNode": 0},
                    "attempts": [{"container": {"exitCode": 3}}]}
    assert settle_from(job, with_outcome, {}) == []
    assert future.done()
