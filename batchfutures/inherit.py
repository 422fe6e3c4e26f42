"""Environment variables the script set reach its calls, as a ProcessPoolExecutor's children
inherit ``os.environ``.

A container does not start from the client's environment, so the executor sends what the script
changed: the variables whose value in ``os.environ`` when the executor is made differs from the
process's environment at interpreter start (``/proc/self/environ`` on Linux; elsewhere the
environment when batchfutures was first imported). They go in the job's ``environment`` (so in
SubmitJob's containerOverrides, shown by the dry run), under what ``environment=`` names, which
wins. What the shell exported before the script started is the machine's, not the script's, and
is not sent.

Never sent (``decide``, pure): names that look like credentials (AWS_*, and any name containing
SECRET, TOKEN, PASSWORD or KEY, in any case; their values would appear in SubmitJob and
DescribeJobs: pass them with ``environment=`` or ``secrets=`` knowingly), batchfutures' own
settings (BATCHFUTURES_*), names that describe this machine rather than the job (PATH, HOME,
PYTHONPATH, LD_*, ...), names Batch reserves or refuses, values that look like an access key id,
and values over ``MAX_VALUE`` characters (SubmitJob's overrides are bounded). A variable the
script removed stays whatever the image sets.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

__all__ = ["MAX_VALUE", "MAX_TOTAL", "Inherited", "decide", "looks_like_credential",
           "start_environment", "inherited", "with_inherited"]

logger = logging.getLogger("batchfutures")

MAX_VALUE = 1024  # characters of one value sent
MAX_TOTAL = 4096  # characters of names and values, environment='s included (ECS's overrides: 8,192)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CREDENTIAL_PARTS = ("SECRET", "TOKEN", "PASSWORD", "KEY")
_ACCESS_KEY_VALUE = re.compile(r"^(AKIA|ASIA)[A-Z0-9]{16}$")
# The machine's, not the job's: the container's own values are right for it.
_MACHINE_NAMES = frozenset({
    "PATH", "HOME", "PWD", "OLDPWD", "SHELL", "USER", "LOGNAME", "HOSTNAME", "TERM", "TMPDIR",
    "TEMP", "TMP", "LANG", "DISPLAY", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP",
    "PYTHONEXECUTABLE", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "SSH_AUTH_SOCK",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "_",  # proxies: this machine's network
})
_MACHINE_PREFIXES = ("LD_", "DYLD_", "XDG_", "SSH_", "CONDA_", "PYTEST_", "COV_CORE_")


def looks_like_credential(name: str) -> bool:
    upper = name.upper()
    return upper.startswith("AWS_") or any(part in upper for part in _CREDENTIAL_PARTS)


def _refusal(name: str, value: str) -> Optional[str]:
    """Why ``name=value`` is not sent (a few words), or None to send it."""
    upper = name.upper()
    if not _NAME.match(name):
        return "not a valid variable name"
    if looks_like_credential(name) or _ACCESS_KEY_VALUE.match(value):
        return "looks like a credential"
    if upper.startswith("BATCHFUTURES_"):
        return "batchfutures' own setting"
    if upper in _MACHINE_NAMES or upper.startswith(_MACHINE_PREFIXES):
        return "describes this machine"
    if len(value) > MAX_VALUE:
        return f"value over {MAX_VALUE} characters"
    return None


@dataclass(frozen=True)
class Inherited:
    """What ``decide`` chose: the variables to send, and the names withheld and why."""

    send: Dict[str, str] = field(default_factory=dict)
    withheld: Dict[str, str] = field(default_factory=dict)  # name -> reason (never the value)


def decide(current: Mapping[str, str], at_start: Mapping[str, str],
           explicit: Mapping[str, str] = {}) -> Inherited:
    """The variables set or changed since start (``current`` vs ``at_start``) to send with a
    job whose ``environment=`` is ``explicit`` (explicit names are its own: not inherited)."""
    send: Dict[str, str] = {}
    withheld: Dict[str, str] = {}
    total = sum(len(name) + len(str(value)) for name, value in explicit.items())  # the room left
    for name in sorted(current):
        value = current[name]
        if at_start.get(name) == value or name in explicit:
            continue
        reason = _refusal(name, value)
        if reason is None and total + len(name) + len(value) > MAX_TOTAL:
            reason = f"over {MAX_TOTAL} characters sent in all"
        if reason is not None:
            withheld[name] = reason
            continue
        send[name] = value
        total += len(name) + len(value)
    return Inherited(send, withheld)


def _read_proc_environ(path: str = "/proc/self/environ") -> Optional[Dict[str, str]]:
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    environ: Dict[str, str] = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            environ[os.fsdecode(name)] = os.fsdecode(value)
    return environ


_AT_IMPORT: Dict[str, str] = dict(os.environ)  # the fallback where /proc is not there


def start_environment() -> Dict[str, str]:
    """The process's environment at interpreter start (``/proc/self/environ``), else as it was
    when batchfutures was imported."""
    environ = _read_proc_environ()
    return _AT_IMPORT if environ is None else environ


def inherited(explicit: Mapping[str, str] = {}) -> Tuple[Tuple[str, str], ...]:
    """The (name, value) pairs this process's calls inherit now (``decide`` on os.environ);
    the names withheld are logged (at INFO, names only)."""
    choice = decide(os.environ, start_environment(), explicit)
    if choice.withheld:
        logger.info("os.environ changes not sent to the calls (pass them with environment= to "
                    "send them): %s", ", ".join(f"{name} ({why})" for name, why in
                                               sorted(choice.withheld.items())))
    return tuple(sorted(choice.send.items()))


def with_inherited(settings: Mapping[str, Any]) -> Dict[str, Any]:
    """Job settings (keyword arguments) with the inherited variables added under the explicit
    ``environment=``, which wins; unchanged when nothing is inherited or ``environment`` is not
    a mapping (JobSettings says what is wrong with it)."""
    explicit = settings.get("environment")
    if explicit is not None and not isinstance(explicit, Mapping):
        return dict(settings)
    given = dict(explicit or {})
    sent = dict(inherited(given))
    if not sent:
        return dict(settings)
    return {**settings, "environment": {**sent, **given}}
