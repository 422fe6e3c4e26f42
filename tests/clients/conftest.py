"""The real-clients tier (issue 20, point 8): the emulator's HTTP endpoint, started as its users
start it (`python -m batchfutures.emulator`, a process of its own), driven by clients that know
nothing of batchfutures: the AWS CLI (`awscli`, v1, from PyPI) and Metaflow's AWS Batch client.
Both are in the `test` extra of setup.cfg.

    endpoint   (module)  the running endpoint: `.url`, `.access_key_id`, `.secret_access_key`,
                         `.folder`; one emulator process per test module, stopped at its end

The emulator signs nothing and trusts nothing: every request must be SigV4-signed with the pair
it was started with (here given explicitly, as a user sharing one pair with a setup would).
All traffic is on 127.0.0.1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("emulator")
    key_id, secret = "AKIDCLIENTTIER", "client-tier-secret"
    path = [str(REPO), os.environ.get("PYTHONPATH")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHFUTURES_EMULATOR_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    env["BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY"] = secret  # never in argv (issue 29)
    process = subprocess.Popen(
        [sys.executable, "-m", "batchfutures.emulator", "--folder", str(folder),
         "--max-vcpus", str(MAX_VCPUS), "--access-key-id", key_id],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url or process.stderr.read()
        yield Endpoint(url, key_id, secret, folder)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
