"""docs/aws.md's first run, in a box that plays the account (issue 28, point 1).

The doc's own shell blocks ("Before you start", "3. Set the variables", "4. Check, then run"),
read from docs/aws.md at test time so the doc and the code cannot drift apart, are run by bash
exactly as written, with the real AWS CLI (awscli v1 from the test extra, on PATH as `aws`):

    aws sts / cloudformation / secretsmanager / s3 / ecr ──> moto's server on 127.0.0.1
                                                             (AWS_ENDPOINT_URL)
    aws batch, boto3's batch and logs clients ──────────> the emulator's endpoint, a process
                                                             (`python -m batchfutures.emulator`;
                                                             AWS_ENDPOINT_URL_BATCH / _CLOUDWATCH_LOGS)

"The stack's outputs answered": the stack `batchfutures` is created from the shipped template
in moto's CloudFormation (test_setup_resources' helpers: the network, Batch's service role, and
the signing secret made first, as moto's CloudFormation makes no secret). Its outputs name
moto's Batch resources; the emulator is given the same: the queue `batchfutures-ec2` (the
same ARN: one account and region) and the definition `batchfutures-worker` with the image the
stack's definition names, which is pushed to moto's ECR with its `py<X.Y>` tag. The bucket and
the secret are moto's, the ones the outputs name.

The box's own variables are the credentials (fake), the endpoints, and nothing else: no region,
no config file. Every variable the client then has is one the doc's blocks exported. The
emulator's jobs (local processes) get what a Batch container gets: the region variables (ECS
sets AWS_REGION and AWS_DEFAULT_REGION) and the endpoints, and reach the signing key through
Secrets Manager as a job role would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

import pytest

pytestmark = [pytest.mark.slow,  # moto's server, an emulator process, bash, the CLI, workers
              pytest.mark.filterwarnings("ignore:Tried to parse AWS.*:UserWarning")]

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "aws.md"
REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's and the emulator's
STACK = "batchfutures"  # the name docs/aws.md deploys
MINOR = "%d.%d" % sys.version_info[:2]
CHECK_NAMES = ["credentials", "region", "job queue", "signing key", "bucket", "job definition",
               "image"]
SHELL_NOISE = {"PWD", "OLDPWD", "SHLVL", "_"}  # what bash itself puts in a child's environment


# -- the doc's blocks ---------------------------------------------------------------------------
def section(markdown: str, heading: str) -> str:
    """The text under ``## <heading>`` up to the next heading of level 2 or 3."""
    lines = markdown.splitlines()
    start = lines.index(f"## {heading}") + 1
    end = next((i for i in range(start, len(lines)) if re.match(r"#{2,3} ", lines[i])),
               len(lines))
    return "\n".join(lines[start:end])


def shell_blocks(text: str) -> List[str]:
    """The bodies of the ```sh fenced blocks of ``text`` (dedented by their fence's indent)."""
    blocks = []
    for match in re.finditer(r"^( *)```sh\n(.*?)^\1```$", text, re.M | re.S):
        blocks.append(textwrap.dedent(match[2]))
    return blocks


def doc_blocks(*headings: str) -> str:
    markdown = DOC.read_text(encoding="utf-8")
    blocks = [block for heading in headings for block in shell_blocks(section(markdown, heading))]
    assert blocks, f"docs/aws.md has no sh block under {headings}"
    return "\n".join(blocks)


@pytest.mark.parametrize("markdown, heading, expected", [
    ("## A\n\n```sh\nexport X=1\n```\n\n## B\n```sh\nno\n```\n", "A", ["export X=1\n"]),
    ("## A\n- item:\n\n  ```sh\n  export X=1\n  ```\n", "A", ["export X=1\n"]),
    ("## A\n```sh\na\n```\n### Sub\n```sh\nb\n```\n", "A", ["a\n"]),  # subsections apart
    ("## A\n```python\nx = 1\n```\n```sh\nb\nc\n```\n", "A", ["b\nc\n"]),
])
def test_shell_blocks_are_read_from_their_section(markdown, heading, expected):
    assert shell_blocks(section(markdown, heading)) == expected


# -- the box ------------------------------------------------------------------------------------
@dataclass
class Box:
    env: Dict[str, str]  # the box's variables: credentials and endpoints only
    outputs: Dict[str, str]
    clients: object  # clients("ecr"): moto's
    batch: object  # boto3's batch client of the emulator
    image: str  # the stack definition's image
    tmp: Path


def box_variables(moto_url: str, emulator_url: str, home: Path) -> Dict[str, str]:
    no_proxy = "127.0.0.1,localhost"
    return {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
        "HOME": str(home), "LANG": "C.UTF-8",
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL": moto_url,
        "AWS_ENDPOINT_URL_BATCH": emulator_url,
        "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": emulator_url,
        "NO_PROXY": no_proxy, "no_proxy": no_proxy,
    }


def push_image(ecr, repository: str, tag: str) -> None:
    """An image in moto's ECR under ``repository:tag`` (a manifest of its own per tag)."""
    try:
        ecr.create_repository(repositoryName=repository)
    except ecr.exceptions.RepositoryAlreadyExistsException:
        pass
    manifest = {"schemaVersion": 2,
                "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                           "size": 1, "digest": "sha256:" + tag.encode().hex().ljust(64, "0")[:64]},
                "layers": []}
    try:
        ecr.put_image(repositoryName=repository, imageManifest=json.dumps(manifest), imageTag=tag)
    except ecr.exceptions.ImageAlreadyExistsException:  # moto's state is the process's
        pass


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    import boto3
    from s3server import admin_clients, private_moto_server
    from test_setup_resources import create_stack, load_template, make_network

    from batchfutures.emulator.__main__ import ACCESS_KEY_VARIABLE, SECRET_KEY_VARIABLE

    tmp = tmp_path_factory.mktemp("first-run")
    with private_moto_server() as moto_url:
        clients = admin_clients(moto_url)
        outputs, _ = create_stack(clients, make_network(clients), STACK, load_template())
        (stack_definition,) = clients("batch").describe_job_definitions(
            jobDefinitionName=outputs["JobDefinition"], status="ACTIVE")["jobDefinitions"]
        image = stack_definition["containerProperties"]["image"]
        repository, _, tag = image.split("/", 1)[1].partition(":")
        push_image(clients("ecr"), repository, tag)

        # the emulator's endpoint, as a user starts it; its jobs get a container's variables
        folder = tmp / "emulator"
        folder.mkdir(mode=0o700)
        home = tmp / "home"
        home.mkdir(mode=0o700)
        base = box_variables(moto_url, "http://127.0.0.1:0", home)
        container = dict(base, AWS_REGION=REGION, AWS_DEFAULT_REGION=REGION,
                         PYTHONPATH=str(ROOT), **{ACCESS_KEY_VARIABLE: "testing",
                                                  SECRET_KEY_VARIABLE: "testing"})
        errors = tmp / "emulator.stderr"  # a file: a pipe nobody reads could fill and stall it
        with open(errors, "w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "batchfutures.emulator", "--folder", str(folder),
                 "--max-vcpus", "2"], stdout=subprocess.PIPE, stderr=stderr, text=True,
                env=container, cwd=tmp)
        try:
            emulator_url = process.stdout.readline().strip()
            assert emulator_url.startswith("http://127.0.0.1:"), errors.read_text()
            batch = boto3.client("batch", endpoint_url=emulator_url, region_name=REGION,
                                 aws_access_key_id="testing", aws_secret_access_key="testing")
            queue_name = outputs["JobQueue"].rsplit("/", 1)[1]
            made = batch.create_job_queue(
                jobQueueName=queue_name, priority=1,
                computeEnvironmentOrder=[{"order": 1, "computeEnvironment": "batchfutures-local"}])
            assert made["jobQueueArn"] == outputs["JobQueue"]  # the output names it
            batch.register_job_definition(
                jobDefinitionName=outputs["JobDefinition"], type="container",
                containerProperties={
                    "image": image, "command": ["python", "-m", "batchfutures.worker"],
                    "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                             {"type": "MEMORY", "value": "1024"}]})
            yield Box(box_variables(moto_url, emulator_url, home), outputs, clients, batch,
                      image, tmp)
        finally:
            process.terminate()
            process.communicate(timeout=60)


def run_bash(script: str, env: Dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def exported_by_the_doc(box: Box) -> Dict[str, str]:
    """Run "Before you start" and "3. Set the variables" as written; the variables they left in
    the shell's environment that the box did not have (or had otherwise)."""
    dump = box.tmp / "exported.env"
    script = doc_blocks("Before you start", "3. Set the variables")
    done = run_bash(f'{script}\nenv -0 > "{dump}"\n', box.env, box.tmp)
    assert done.returncode == 0, done.stderr
    after = dict(entry.split("=", 1) for entry in dump.read_text().split("\0") if "=" in entry)
    return {key: value for key, value in after.items()
            if key not in SHELL_NOISE and box.env.get(key) != value}


@pytest.fixture(scope="module")
def exported(box):
    return exported_by_the_doc(box)


def check(env: Dict[str, str], cwd: Path):
    done = subprocess.run([sys.executable, "-m", "batchfutures", "check"], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    verdicts = {}
    for line in done.stdout.splitlines():
        state, rest = line.split(None, 1)
        name, detail = rest.split(": ", 1)
        verdicts[name] = (state, detail)
    return done.returncode, verdicts, done


# -- the tests ----------------------------------------------------------------------------------
def test_the_doc_blocks_export_what_the_client_needs(box, exported):
    outputs = box.outputs
    assert exported == {
        "AWS_DEFAULT_REGION": REGION,
        "BATCHFUTURES_JOB_QUEUE": outputs["JobQueue"],
        "BATCHFUTURES_JOB_DEFINITION": outputs["JobDefinition"],
        "BATCHFUTURES_IO_BUCKET": outputs["IoBucket"],
        "BATCHFUTURES_STACK": STACK,
        "BATCHFUTURES_SIGNING_SECRET": outputs["SigningSecret"],
    }
    assert outputs["SigningSecret"].startswith(f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:")
    # and what the doc says they print when right: the caller, then the five variables
    done = run_bash(doc_blocks("Before you start", "3. Set the variables"), box.env, box.tmp)
    assert done.returncode == 0, done.stderr
    identity = json.loads(done.stdout[:done.stdout.index("}") + 1])
    assert identity["Account"] == ACCOUNT
    printed = done.stdout[done.stdout.index("}") + 1:].split()
    assert printed == sorted(f"{k}={v}" for k, v in exported.items() if k.startswith("BATCHF"))
    # the CLI honours AWS_ENDPOINT_URL_BATCH over AWS_ENDPOINT_URL: the emulator's own queue
    # (moto's Batch has only the stack's) is listed
    listed = run_bash("aws batch describe-job-queues --query 'jobQueues[].jobQueueName' "
                      "--output text", dict(box.env, **exported), box.tmp)
    assert "batchfutures" in listed.stdout.split(), listed.stdout + listed.stderr


def test_check_passes_with_exactly_the_doc_variables(box, exported):
    code, verdicts, done = check(dict(box.env, **exported), box.tmp)
    assert code == 0, done.stdout + done.stderr
    assert list(verdicts) == CHECK_NAMES
    assert all(state == "ok" for state, _ in verdicts.values()), verdicts
    assert verdicts["region"][1] == f"{REGION} (from AWS_DEFAULT_REGION)"
    assert verdicts["signing key"][1] == (
        f"read from Secrets Manager secret {box.outputs['SigningSecret']}")
    assert "a signed object written, read back, deleted" in verdicts["bucket"][1]
    assert verdicts["image"][1].startswith(f"{box.image} is in ECR, tagged py{MINOR}")
    secret = box.clients("secretsmanager").get_secret_value(
        SecretId=box.outputs["SigningSecret"])["SecretString"]
    assert secret not in done.stdout + done.stderr  # the key is never printed


@pytest.mark.parametrize("region_variables, source", [
    ({"AWS_REGION": REGION}, "AWS_REGION"),  # the old doc's export: boto3 alone ignores it
    ({}, "the job queue ARN"),  # no region anywhere: the queue's ARN says it
])
def test_the_region_comes_from_aws_region_or_the_queue_arn(box, exported, region_variables,
                                                          source):
    env = {k: v for k, v in dict(box.env, **exported).items() if k != "AWS_DEFAULT_REGION"}
    code, verdicts, done = check(dict(env, **region_variables), box.tmp)
    assert code == 0, done.stdout + done.stderr
    assert verdicts["region"] == ("ok", f"{REGION} (from {source})")


def test_without_the_signing_secret_check_fails_naming_the_signing_key(box, exported):
    env = {k: v for k, v in dict(box.env, **exported).items()
           if k != "BATCHFUTURES_SIGNING_SECRET"}
    code, verdicts, done = check(env, box.tmp)
    assert code == 1, done.stdout
    state, detail = verdicts["signing key"]
    assert state == "FAIL" and "BATCHFUTURES_SIGNING_SECRET" in detail and "SigningSecret" in detail
    failed = [name for name, (state, _) in verdicts.items() if state != "ok"]
    assert failed == ["signing key"], verdicts  # the bucket is still probed, unsigned
    assert "an unsigned object written" in verdicts["bucket"][1]


def test_a_wrong_image_fails_check_naming_the_image(box, exported):
    repository = box.image.split("/", 1)[1].split(":")[0]
    registry = box.image.split("/", 1)[0]
    push_image(box.clients("ecr"), repository, "py3.1")  # a py tag of another Python
    cases = {  # definition name -> (image, what the image line must say)
        "first-run-missing": (f"{registry}/{repository}:py{MINOR}-nope", "is not in ECR: push it"),
        "first-run-other-python": (f"{registry}/{repository}:py3.1",
                                   f"tagged py3.1 but this client runs Python {MINOR}"),
        "first-run-no-repository": (f"{registry}/no-such-repository:py{MINOR}",
                                    "ECR repository no-such-repository does not exist"),
    }
    for name, (image, expected) in cases.items():
        box.batch.register_job_definition(
            jobDefinitionName=name, type="container",
            containerProperties={"image": image, "command": ["python", "-m", "batchfutures.worker"],
                                 "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                                          {"type": "MEMORY", "value": "1024"}]})
        code, verdicts, done = check({**box.env, **exported, "BATCHFUTURES_JOB_DEFINITION": name},
                                     box.tmp)
        assert code == 1, done.stdout
        state, detail = verdicts["image"]
        assert state == "FAIL" and image in detail and expected in detail, detail
        assert [n for n, (s, _) in verdicts.items() if s != "ok"] == ["image"], verdicts


def test_an_image_of_another_registry_is_said_not_checked(box, exported):
    box.batch.register_job_definition(
        jobDefinitionName="first-run-ghcr", type="container",
        containerProperties={"image": f"ghcr.io/me/worker:py{MINOR}",
                             "command": ["python", "-m", "batchfutures.worker"],
                             "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                                      {"type": "MEMORY", "value": "1024"}]})
    code, verdicts, done = check({**box.env, **exported,
                                      "BATCHFUTURES_JOB_DEFINITION": "first-run-ghcr"}, box.tmp)
    assert code == 0, done.stdout
    assert verdicts["image"] == ("ok", f"ghcr.io/me/worker:py{MINOR} is not in ECR: not checked "
                                       f"(it must exist and run Python {MINOR})")


@pytest.mark.parametrize("by", ["arn", "name"])
def test_batch_executor_from_the_doc_variables_alone_runs_a_map(box, exported, by):
    if by == "name":  # the secret by name: the jobs find it in their region (ECS sets it)
        exported = dict(exported, BATCHFUTURES_SIGNING_SECRET=f"{STACK}/signing-key")
    script = textwrap.dedent("""
        from batchfutures import BatchExecutor

        def square(x):
            return x * x

        with BatchExecutor() as ex:
            print(type(ex.environment).__name__, ex.environment.region_name)
            print(list(ex.map(square, range(10), chunksize=3)))
    """)
    done = subprocess.run([sys.executable, "-c", script], env=dict(box.env, **exported),
                          cwd=box.tmp, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"AWSBatchEnvironment {REGION}",
                                        str([x * x for x in range(10)])]


def test_step_4_runs_as_written(box, exported):
    """"4. Check, then run": `batchfutures check`, then `batchfutures demo`, by bash."""
    done = run_bash(doc_blocks("4. Check, then run"), dict(box.env, **exported), box.tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:len(CHECK_NAMES)]] == [
        f"ok   {name}" for name in CHECK_NAMES]
    assert any(re.fullmatch(r"\d+ results in [\d.]+ s", line) for line in lines), lines
