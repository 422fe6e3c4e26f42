"""The seams are declared and kept: every environment capability the core uses is a member of
environments.Environment (no getattr probe of an environment is left), each implementation has
every member its Protocol declares, the API Protocols name real operations of botocore's
models, and a future's binding is read only in futures.py (under its lock).

mypy proves the same structurally (environments._seams_hold, dryrun._seams_hold, the typed
returns of env.batch/.logs and sqsapi.client_for); these tests hold it at run time, where
mypy's `Any` (boto3's clients) cannot, and keep new code from probing again.
"""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import boto3
import botocore.session
import pytest
from botocore import xform_name

import batchfutures
from batchfutures.batchapi import BatchAPI
from batchfutures.dryrun import DryRunEnvironment, RecordingBatch
from batchfutures.emulator.logservice import LogsService
from batchfutures.emulator.service import BatchEmulator
from batchfutures.emulator.sqs import LocalSQS
from batchfutures.environments import AWSBatchEnvironment, BaseEnvironment, Environment, LocalEnvironment
from batchfutures.futures import BatchFuture, Binding
from batchfutures.logs import LogsAPI
from batchfutures.sqsapi import SQSAPI

PACKAGE = Path(batchfutures.__file__).parent
ENVIRONMENT_NAMES = {"env", "environment", "_env"}  # a name, or an attribute of that name
PROBES = {"getattr", "hasattr"}


def package_modules() -> Iterator[Tuple[str, ast.AST]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield str(path.relative_to(PACKAGE.parent)), ast.parse(path.read_text(), str(path))


def protocol_members(protocol: type) -> Set[str]:
    """The public members a Protocol declares (methods, properties, annotated attributes),
    its Protocol bases' included."""
    names: Set[str] = set()
    for klass in protocol.__mro__:
        if klass in (object, typing.Protocol, typing.Generic) or not getattr(klass, "_is_protocol", False):
            continue
        names |= {name for name in vars(klass) if not name.startswith("_")}
        names |= {name for name in getattr(klass, "__annotations__", {}) if not name.startswith("_")}
    return names


def names_environment(node: ast.AST) -> bool:
    """``env``, ``environment``, ``self._env``, ``session.env``, ``self._session.env``..."""
    if isinstance(node, ast.Name):
        return node.id in ENVIRONMENT_NAMES
    return isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT_NAMES


def environment_probes(tree: ast.AST) -> List[Tuple[int, str]]:
    """(line, text) of each getattr/hasattr whose object is an environment, called or handed
    on (``functools.partial(getattr, env, "batch")``)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        args = list(node.args)
        if isinstance(node.func, ast.Name) and node.func.id in PROBES:
            target = args[0] if args else None
        elif any(isinstance(a, ast.Name) and a.id in PROBES for a in args[:1]):
            target = args[1] if len(args) > 1 else None  # partial(getattr, env, ...)
        else:
            continue
        if target is not None and names_environment(target):
            found.append((node.lineno, ast.unparse(node)))
    return found


# -- the scans, and that they can fail ---------------------------------------------------------
@pytest.mark.parametrize("source, probes", [
    ('getattr(env, "stack", None)', 1),
    ('getattr(self._env, "job_tags", dict)()', 1),
    ('getattr(self._session.env, "gpus", None)', 1),
    ('hasattr(environment, "subscribe")', 1),
    ('functools.partial(getattr, env, "batch")', 1),
    ('getattr(future, "_upstream", None)', 0),  # not an environment
    ('env.stack', 0),
])
def test_the_probe_scan_finds_what_it_should(source, probes):
    assert len(environment_probes(ast.parse(source))) == probes


def test_no_getattr_probe_of_an_environment_is_left():
    found = [f"{module}:{line}: {text}" for module, tree in package_modules()
             for line, text in environment_probes(tree)]
    assert not found, "declare these on environments.Environment instead:\n" + "\n".join(found)


CONCRETE = {"LocalEnvironment", "AWSBatchEnvironment", "DryRunEnvironment"}


def concrete_decisions(tree: ast.AST) -> List[int]:
    """Lines that decide by ``isinstance(x, <a concrete environment class>)``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "isinstance" and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if any(isinstance(k, (ast.Name, ast.Attribute)) and
                   (k.id if isinstance(k, ast.Name) else k.attr) in CONCRETE for k in kinds):
                found.append(node.lineno)
    return found


def test_the_core_decides_by_flags_not_by_an_environments_class():
    assert concrete_decisions(ast.parse("isinstance(env, (int, environments.LocalEnvironment))"))
    assert not concrete_decisions(ast.parse("isinstance(env, BaseEnvironment)"))
    found = [f"{module}:{line}" for module, tree in package_modules()
             for line in concrete_decisions(tree)]
    assert not found, "use a flag of environments.Environment (is_local, ...):\n" + "\n".join(found)


def binding_reads(tree: ast.AST) -> List[int]:
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in ("_job", "_child")]


def test_a_futures_binding_is_read_only_in_futures_py():
    found = [f"{module}:{line}" for module, tree in package_modules()
             if module != "batchfutures/futures.py" for line in binding_reads(tree)]
    assert not found, "read it with future._bound() (job and child together):\n" + "\n".join(found)
    assert binding_reads(ast.parse("upstream._child")) == [1]


def test_the_binding_is_read_with_its_job_and_child_together():
    future = BatchFuture()
    assert future._bound() is None and future.job_id is None

    class Job:
        def child_id(self, index):
            return f"job-1:{index}"

    job = Job()
    future._bind(job, 3)
    assert future._bound() == Binding(job, 3) and future.job_id == "job-1:3"


# -- each implementation has every member its Protocol declares --------------------------------
def missing_members(protocol: type, implementation: object) -> List[str]:
    """Members ``protocol`` declares that ``implementation`` lacks, looked up without running
    properties (a LocalEnvironment's ``batch`` would start the emulator); a declared method
    must be callable there."""
    missing = []
    for name in sorted(protocol_members(protocol)):
        try:
            found = inspect.getattr_static(implementation, name)
        except AttributeError:
            if name not in getattr(implementation, "__dict__", {}):
                missing.append(name)
            continue
        declared = inspect.getattr_static(protocol, name)
        if inspect.isfunction(declared) and not callable(found):
            missing.append(f"{name} (not callable)")
    return missing


def parameters(function: object) -> List[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


@pytest.fixture
def environments(tmp_path, monkeypatch) -> Dict[str, object]:
    """Each implementation, built against nothing remote (no request is made to build them)."""
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(variable, "testing")
    local = LocalEnvironment(tmp_path / "workdir")
    aws = AWSBatchEnvironment("q", "some-bucket", "worker-definition:1", region_name="us-east-1")
    return {"local": local, "aws": aws, "dry run (local)": DryRunEnvironment(local),
            "dry run (aws)": DryRunEnvironment(aws)}


def test_every_environment_has_every_declared_capability(environments):
    members = protocol_members(Environment)
    # the capabilities the core asks for, as the issue counted them (a member dropped fails here)
    assert {"batch", "logs", "storage", "job_queue", "job_definition", "is_local", "workdir",
            "gpus", "stack", "given_definition", "session", "region_name", "job_tags",
            "worker_environment", "multinode_definition", "planned_definition",
            "definition_tags", "describe_definition", "oom_placement", "max_memory_mib",
            "client", "subscribe", "unsubscribe"} <= members
    for label, env in environments.items():
        assert missing_members(Environment, env) == [], label


def test_declared_methods_take_the_declared_parameters(environments):
    for name in sorted(protocol_members(Environment)):
        declared = inspect.getattr_static(Environment, name)
        if not inspect.isfunction(declared):
            continue
        for label, env in environments.items():
            assert parameters(getattr(env, name)) == parameters(declared), (label, name)


def test_the_flags_replace_isinstance(environments):
    assert environments["local"].is_local and environments["dry run (local)"].is_local
    assert not environments["aws"].is_local and not environments["dry run (aws)"].is_local
    assert environments["local"].workdir is not None and environments["aws"].workdir is None
    assert isinstance(environments["local"], BaseEnvironment)
    assert not isinstance(environments["dry run (local)"], BaseEnvironment)  # outside, declared


def test_a_dry_run_names_the_definitions_a_run_would_use(environments):
    aws = environments["aws"]
    assert environments["dry run (aws)"].job_definition == aws.planned_definition() == \
        "worker-definition:1"
    local = environments["local"]
    assert environments["dry run (local)"].job_definition == local.job_definition
    assert environments["dry run (local)"].multinode_definition(2) == local.planned_definition(2)


MODELS = {protocol: botocore.session.get_session().get_service_model(service)
          for protocol, service in ((BatchAPI, "batch"), (LogsAPI, "logs"), (SQSAPI, "sqs"))}


@pytest.mark.parametrize("protocol", [BatchAPI, LogsAPI, SQSAPI], ids=lambda p: p.__name__)
def test_each_api_protocol_names_operations_of_botocores_model(protocol):
    operations = {xform_name(name) for name in MODELS[protocol].operation_names}
    assert protocol_members(protocol) and protocol_members(protocol) <= operations


@pytest.mark.parametrize("protocol, implementation", [
    (BatchAPI, BatchEmulator), (BatchAPI, RecordingBatch()), (LogsAPI, LogsService),
    (SQSAPI, LocalSQS),
], ids=["emulator", "dry run's recorder", "emulator's logs", "emulator's SQS"])
def test_our_implementations_have_every_operation(protocol, implementation):
    assert missing_members(protocol, implementation) == []


@pytest.mark.parametrize("protocol, service", [(BatchAPI, "batch"), (LogsAPI, "logs"),
                                               (SQSAPI, "sqs")])
def test_boto3s_clients_have_every_operation(protocol, service, monkeypatch):
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(variable, "testing")
    client = boto3.session.Session(region_name="us-east-1").client(service)
    assert isinstance(client, protocol)  # names only: the operations exist on the client
    assert [name for name in protocol_members(protocol) if not callable(getattr(client, name))] == []


def test_the_recorder_records_submit_job_and_refuses_every_other_request():
    recorder = RecordingBatch()
    assert isinstance(recorder, BatchAPI)
    assert recorder.submit_job(jobName="a", jobQueue="q")["jobId"] == "dry-run-1"
    assert recorder.requests == [{"jobName": "a", "jobQueue": "q"}]
    for name in sorted(protocol_members(BatchAPI) - {"submit_job"}):
        with pytest.raises(batchfutures.ConfigurationError, match="a dry run sends no"):
            getattr(recorder, name)()


class Registering:
    """A Batch client that knows no definition and records the names registered."""

    class meta:  # what jobdefinitions reads of a boto3 client: its Region
        region_name = "us-east-1"

    def __init__(self):
        self.names = []

    def describe_job_definitions(self, **params):
        return {"jobDefinitions": []}

    def register_job_definition(self, **params):
        self.names.append(params["jobDefinitionName"])
        return {"jobDefinitionArn": f"arn:aws:batch:us-east-1:123456789012:job-definition/"
                                    f"{params['jobDefinitionName']}:1"}


@pytest.mark.parametrize("stack", [None, "research"])
@pytest.mark.parametrize("nodes", [1, 3])
def test_the_planned_definition_is_the_one_a_run_registers(nodes, stack, monkeypatch):
    from batchfutures.jobdefinitions import ensure_job_definition

    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(variable, "testing")
    env = AWSBatchEnvironment("q", "some-bucket", image="example/worker:1", stack=stack,
                              region_name="us-east-1", job_role_arn="arn:aws:iam::123456789012:role/r")
    batch = Registering()
    ensure_job_definition(batch, env.image, nodes=nodes, stack=env.stack, **env.definition_options)
    assert batch.names == [env.planned_definition(nodes)]
    assert DryRunEnvironment(env).multinode_definition(nodes) == env.planned_definition(nodes)
