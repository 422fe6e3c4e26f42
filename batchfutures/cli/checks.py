"""`batchfutures check`: verify an environment end to end, one verdict per part.

Each check returns (name, ok, one line saying what is wrong or what was found); a broken part
does not stop the others, so one run lists everything to fix.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, List, Tuple

Verdict = Tuple[str, bool, str]


def _credentials(env: Any) -> str:
    session = getattr(env, "session", None)
    if session is None:
        return "not needed (local emulator)"
    credentials = session.get_credentials()
    if credentials is None:
        raise RuntimeError("no AWS credentials found (set a profile, environment variables or a role)")
    method = getattr(credentials, "method", "unknown source")
    return f"found ({method})"


def _queue(env: Any) -> str:
    env.check_queue()
    return f"{env.job_queue} is ENABLED and VALID"


def _bucket(env: Any) -> str:
    storage = env.storage
    probe = storage.url("check", uuid.uuid4().hex)
    storage.put_bytes(probe, b"batchfutures check")
    if storage.get_bytes(probe) != b"batchfutures check":
        raise RuntimeError(f"wrote {probe} but could not read it back")
    storage.delete(probe)
    return f"{storage.root_url} is writable and readable"


def _definition(env: Any) -> str:
    name = env.job_definition
    definition = env._describe_definition()
    if definition is None:
        raise RuntimeError(f"job definition {name} does not exist or is not ACTIVE")
    image = (definition.get("containerProperties") or {}).get("image", "?")
    return f"{definition.get('jobDefinitionArn', name)} (image {image})"


CHECKS: List[Tuple[str, Callable[[Any], str]]] = [
    ("credentials", _credentials),
    ("job queue", _queue),
    ("bucket", _bucket),
    ("job definition", _definition),
]


def run_checks(env: Any) -> List[Verdict]:
    verdicts = []
    for name, check in CHECKS:
        try:
            verdicts.append((name, True, check(env)))
        except Exception as error:  # each broken part gets its own line
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            verdicts.append((name, False, message))
    return verdicts
