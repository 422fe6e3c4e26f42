"""The real-clients tier (issue 20, point 8): the emulator's HTTP endpoint, started as its users
start it (`python -m batchfutures.emulator`, a process of its own), driven by clients that know
nothing of batchfutures: the AWS CLI (`awscli`, v1, from PyPI), Metaflow's AWS Batch client and
Lithops' `aws_batch` backend. All are in the `test` extra of setup.cfg.

    endpoint   (module)  the running endpoint: `.url`, `.access_key_id`, `.secret_access_key`,
                         `.folder`; one emulator process per test module, stopped at its end

    serve      (session) `serve(folder, *arguments, env=...)`, a context manager: one more
                         endpoint, with more flags or another environment (the one its jobs'
                         containers see, e.g. an S3 endpoint)

The emulator signs nothing and trusts nothing: every request must be SigV4-signed with the pair
it was started with (here given explicitly, as a user sharing one pair with a setup would).
All traffic is on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
QUEUE = "batchfutures"
GROUP = "/aws/batch/job"
MAX_VCPUS = 4  # a 3-node job fits at once; 8 vCPUs never does (the cancel tests' RUNNABLE job)


@dataclass
class Endpoint:
    url: str
    access_key_id: str
    secret_access_key: str
    folder: Path


@contextlib.contextmanager
def serve(folder: Path, *arguments: str,
          env: Optional[Mapping[str, str]] = None) -> Iterator[Endpoint]:
    """`python -m batchfutures.emulator --folder FOLDER ... *arguments` with `env` (default
    this process's), stopped (and checked to exit 0) at the end."""
    key_id, secret = "AKIDCLIENTTIER", "client-tier-secret"
    base = os.environ if env is None else env
    path = [str(REPO), base.get("PYTHONPATH")]
    child = {k: v for k, v in base.items() if not k.startswith("BATCHFUTURES_EMULATOR_")}
    child["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    child["BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY"] = secret  # never in argv (issue 29)
    process = subprocess.Popen(
        [sys.executable, "-m", "batchfutures.emulator", "--folder", str(folder),
         "--max-vcpus", str(MAX_VCPUS), "--access-key-id", key_id, *arguments],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child)
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url or process.stderr.read()
        yield Endpoint(url, key_id, secret, folder)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=60)
        assert process.returncode == 0, err


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("emulator")) as running:
        yield running


@pytest.fixture(name="serve", scope="session")
def serve_fixture():
    return serve
