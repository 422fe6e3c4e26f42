"""Where a job's environment is unpacked: the host cache the stack's EC2 definitions mount
(template, jobdefinitions.with_stack_defaults) and the worker's trust in a folder found there
(worker/envs.py: only a real folder of its own that nobody else can write)."""

from __future__ import annotations

import os
import stat
import sys

import pytest
import test_setup_resources as setup

from batchfutures import envarchive, signing
from batchfutures.jobdefinitions import definition_properties, with_stack_defaults
from batchfutures.storage import Storage
from batchfutures.worker import envs

ME = 1000


@pytest.mark.parametrize("mode, uid, problem", [
    (stat.S_IFDIR | 0o700, ME, None),
    (stat.S_IFDIR | 0o755, ME, None),  # readable by others: nobody else can plant anything
    (stat.S_IFDIR | 0o770, ME, "writable by group or others (mode 770)"),
    (stat.S_IFDIR | 0o702, ME, "writable by group or others (mode 702)"),
    (stat.S_IFDIR | 0o700, 0, "owned by uid 0, not this job's 1000"),
    (stat.S_IFDIR | 0o700, 1001, "owned by uid 1001"),
    (stat.S_IFLNK | 0o777, ME, "symbolic link"),
    (stat.S_IFREG | 0o600, ME, "not a folder"),
])
def test_cached_folder_problem(mode, uid, problem):
    found = envs.cached_folder_problem(mode, uid, ME)
    assert (found is None) if problem is None else (problem in found)


@pytest.fixture
def storage(tmp_path):
    root = tmp_path / "storage"
    root.mkdir()
    return Storage(root.as_uri(), signer=signing.Signer(lambda: b"k" * 32, "test"))


@pytest.fixture
def archive_url(storage, tmp_path, monkeypatch):
    """A sealed archive of `cachedpkg` (VALUE = "real"); this process's path restored after."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "cachedpkg", raising=False)
    monkeypatch.setattr(envs.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    source = tmp_path / "site"
    (source / "cachedpkg").mkdir(parents=True)
    (source / "cachedpkg" / "__init__.py").write_text("VALUE = 'real'\n")
    url = storage.url(envarchive.FOLDER, envarchive.archive_name("ab" * 32))
    storage.put_bytes(url, storage.signer.seal(envarchive.SEAL_KIND, storage.name_of(url),
                                               envarchive.pack(source), root=storage.mac_root))
    return url


def _plant(folder, mode):
    (folder / "cachedpkg").mkdir(parents=True)
    (folder / "cachedpkg" / "__init__.py").write_text("VALUE = 'planted'\n")
    os.chmod(folder, mode)


@pytest.mark.parametrize("how, used", [
    ("mine, 0700", "planted"),  # trusted by its name: what this user unpacked before
    ("group-writable", "real"),
    ("world-writable", "real"),
    ("a link", "real"),
    ("cache not private", "real"),
])
def test_a_cached_folder_is_used_only_when_trusted(storage, archive_url, tmp_path, how, used):
    cache = tmp_path / "host-cache"
    cache.mkdir(mode=0o700)
    folder = cache / ("ab" * 32)
    if how == "a link":
        _plant(tmp_path / "elsewhere", 0o700)
        folder.symlink_to(tmp_path / "elsewhere")
    elif how == "cache not private":
        _plant(folder, 0o700)
        os.chmod(cache, 0o777)
    else:
        _plant(folder, {"mine, 0700": 0o700, "group-writable": 0o770,
                        "world-writable": 0o777}[how])
    got = envs.activate(storage, {envarchive.POINTER_VARIABLE: archive_url,
                                  envs.CACHE_VARIABLE: str(cache)})
    import cachedpkg

    assert cachedpkg.VALUE == used
    if used == "real":  # unpacked again in this user's private temp folder
        assert got == os.path.join(envs.private_root(), "ab" * 32)
        assert got.startswith(str(tmp_path / "tmp"))
        assert os.stat(got).st_mode & 0o077 == 0
    else:
        assert got == str(folder)


# -- the host cache in the stack's definitions --------------------------------------------------
def _container_names(container):
    return ({v["name"]: v.get("host", {}).get("sourcePath") for v in container.get("volumes", [])},
            {m["sourceVolume"]: m["containerPath"] for m in container.get("mountPoints", [])},
            {e["name"]: e["value"] for e in container.get("environment", [])})


def test_template_ec2_definition_mounts_the_host_cache():
    resources = setup.load_template()["Resources"]
    ec2 = resources["Ec2JobDefinition"]["Properties"]["ContainerProperties"]
    volumes = {v["Name"]: v["Host"]["SourcePath"] for v in ec2["Volumes"]}
    mounts = {m["SourceVolume"]: (m["ContainerPath"], m["ReadOnly"]) for m in ec2["MountPoints"]}
    variables = {e["Name"]: e["Value"] for e in ec2["Environment"]}
    assert volumes[envarchive.HOST_CACHE_VOLUME] == envarchive.HOST_CACHE
    assert mounts[envarchive.HOST_CACHE_VOLUME] == (envarchive.HOST_CACHE, False)
    assert variables[envarchive.CACHE_VARIABLE] == envarchive.HOST_CACHE
    fargate = resources["FargateJobDefinition"]["Properties"]["ContainerProperties"]
    assert "Volumes" not in fargate and "MountPoints" not in fargate
    assert envarchive.CACHE_VARIABLE not in {e["Name"] for e in fargate["Environment"]}
    # the launch template makes the folder, the jobs' user's (uid 1000) alone
    user_data = resources["LaunchTemplate"]["Properties"]["LaunchTemplateData"]["UserData"]
    text = user_data["Fn::Base64"]
    assert f"chown 1000:1000 {envarchive.HOST_CACHE}" in text
    assert f"chmod 0700 {envarchive.HOST_CACHE}" in text


@pytest.mark.parametrize("platform, nodes, mounted", [
    ("EC2", 1, True), ("EC2", 3, True), ("FARGATE", 1, False)])
def test_client_registered_definitions_of_a_stack(platform, nodes, mounted):
    properties = definition_properties("image:1", platform=platform, nodes=nodes,
                                       execution_role_arn="arn:aws:iam::1:role/x")
    made = with_stack_defaults(properties, "stack")
    container = (made["containerProperties"] if nodes == 1 else
                 made["nodeProperties"]["nodeRangeProperties"][0]["container"])
    volumes, mounts, variables = _container_names(container)
    assert (volumes.get(envarchive.HOST_CACHE_VOLUME) == envarchive.HOST_CACHE) is mounted
    assert (mounts.get(envarchive.HOST_CACHE_VOLUME) == envarchive.HOST_CACHE) is mounted
    assert (variables.get(envarchive.CACHE_VARIABLE) == envarchive.HOST_CACHE) is mounted
    again = with_stack_defaults(made, "stack")  # a copy of such a definition: not twice
    assert again == made
    assert with_stack_defaults(properties, None) == properties  # no stack: as given


def test_host_cache_mount_is_valid_for_register_job_definition():
    import botocore.session

    model = botocore.session.get_session().get_service_model("batch")
    shape = model.operation_model("RegisterJobDefinition").input_shape.members[
        "containerProperties"]
    container: dict = {}
    envarchive.with_host_cache(container)
    for key, value in container.items():
        member = shape.members[key].member
        assert set(value[0]) <= set(member.members), key
