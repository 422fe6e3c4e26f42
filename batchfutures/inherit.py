"""Environment variables the script set reach its calls, as a ProcessPoolExecutor's children
inherit ``os.environ``.

A container does not start from the client's environment, so the executor sends what the script
changed: the variables whose value in ``os.environ`` when the executor is made differs from the
process's environment at interpreter start (``/proc/self/environ`` on Linux; elsewhere the
environment when batchfutures was first imported). They go in the job's ``environment`` (so in
SubmitJob's containerOverrides, shown by the dry run), under what ``environment=`` names, which
wins. What the shell exported before the script started is the machine's, not the script's, and
is not sent.

Never sent (``decide``, pure; secure by default: what is withheld is logged once at INFO by
name, never by value, with how to send it on purpose: ``environment=`` or ``secrets=``, knowing
that ``environment=`` values appear in SubmitJob, DescribeJobs, the console and CloudTrail):

- names that look like credentials (``looks_like_credential``): starting with AWS_, ending with
  _PAT, or containing, in any case, any of ``CREDENTIAL_PARTS`` (SECRET, TOKEN, PASSWORD, KEY,
  AUTH, SESSION, ...);
- values that look like one (``looks_secret``): an access key id, a URL with a user and password,
  a PEM block, a known token prefix, or a long random-looking run of base64 or hex;
- batchfutures' own settings (BATCHFUTURES_*); names that describe this machine rather than the
  job (PATH, HOME, PYTHONPATH, LD_*, proxies, CA bundle paths, ...); invalid names; values over
  ``MAX_VALUE`` characters and beyond ``MAX_TOTAL`` in all (SubmitJob's overrides are bounded).

A variable the script removed stays whatever the image sets.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Set, Tuple

__all__ = ["MAX_VALUE", "MAX_TOTAL", "CREDENTIAL_PARTS", "Inherited", "decide",
           "looks_like_credential", "looks_secret", "start_environment", "inherited",
           "with_inherited"]

logger = logging.getLogger("batchfutures")

MAX_VALUE = 1024  # characters of one value sent
MAX_TOTAL = 4096  # characters of names and values, environment='s included (ECS's overrides: 8,192)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A name containing any of these (any case) is withheld: MONKEY or PASSPORT too, on purpose.
CREDENTIAL_PARTS = ("SECRET", "TOKEN", "PASSWORD", "PASSWD", "PWD", "PASS", "KEY", "CREDENTIAL",
                    "AUTH", "PRIVATE", "COOKIE", "SESSION", "DSN")
# Searched anywhere in a value, any case: leading spaces or lower case do not hide them.
_SECRET_VALUE = re.compile(
    r"(?:AKIA|ASIA)[A-Z0-9]{16}"                   # an AWS access key id
    r"|[a-z][a-z0-9+.-]*://[^\s/@:]*:[^\s/@]*@"    # a URL with userinfo: scheme://user:pass@
    r"|-----BEGIN"                                 # a PEM block (private key, certificate)
    r"|(?<![a-z0-9])(?:ghp_|gho_|github_pat_|glpat-|xox[abpr]-|sk-[a-z0-9_-]{16})",  # tokens
    re.IGNORECASE)
_RUN = re.compile(r"[A-Za-z0-9+/=_-]{32,}")  # base64 (standard or URL-safe) or hex, no spaces
_HEX = re.compile(r"[0-9a-fA-F]+")
MIN_RUN_ENTROPY = 3.5  # bits per character; random base64 of 32 characters has 3.9 at the least
# The machine's, not the job's: the container's own values are right for it.
_MACHINE_NAMES = frozenset({
    "PATH", "HOME", "PWD", "OLDPWD", "SHELL", "USER", "LOGNAME", "HOSTNAME", "TERM", "TMPDIR",
    "TEMP", "TMP", "LANG", "DISPLAY", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP",
    "PYTHONEXECUTABLE", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "SSH_AUTH_SOCK",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "_",  # proxies: this machine's network
    # CA bundles: paths on this machine, not in the image
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
})
_MACHINE_PREFIXES = ("LD_", "DYLD_", "XDG_", "SSH_", "CONDA_", "PYTEST_", "COV_CORE_")


def looks_like_credential(name: str) -> bool:
    """Whether a variable's name says it holds a credential (see ``CREDENTIAL_PARTS``)."""
    upper = name.upper()
    return (upper.startswith("AWS_") or upper.endswith("_PAT")
            or any(part in upper for part in CREDENTIAL_PARTS))


def _entropy(text: str) -> float:
    """Shannon entropy in bits per character."""
    counts = Counter(text).values()
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts)


def _random_looking(run: str) -> bool:
    """A 32+ character base64/hex run that is a key rather than words: hex mixing digits and
    letters (a hex key or digest), or mixed case with digits and high entropy (base64). Paths
    in lower case, numbers and identifiers without digits are words."""
    has_digit = any(c.isdigit() for c in run)
    if _HEX.fullmatch(run):
        return has_digit and any(c.isalpha() for c in run)
    return (has_digit and any(c.isupper() for c in run) and any(c.islower() for c in run)
            and _entropy(run) >= MIN_RUN_ENTROPY)


def looks_secret(value: str) -> bool:
    """Whether a variable's value looks like a credential, whatever its name: an access key id
    (AKIA/ASIA and 16 letters or digits), a URL with ``user:password@``, a PEM block, a known
    token prefix (ghp_, gho_, github_pat_, glpat-, sk-, xoxa-/xoxb-/xoxp-/xoxr-), or a run of 32+
    base64/hex characters that looks random (``_random_looking``)."""
    if _SECRET_VALUE.search(value):
        return True
    return any(_random_looking(run.group()) for run in _RUN.finditer(value))


def _refusal(name: str, value: str) -> Optional[str]:
    """Why ``name=value`` is not sent (a few words), or None to send it."""
    upper = name.upper()
    if not _NAME.match(name):
        return "not a valid variable name"
    if upper in _MACHINE_NAMES:  # before the credential rules: PWD is the directory
        return "describes this machine"
    if looks_like_credential(name):
        return "name looks like a credential"
    if looks_secret(value):
        return "value looks like a credential"
    if upper.startswith("BATCHFUTURES_"):
        return "batchfutures' own setting"
    if upper.startswith(_MACHINE_PREFIXES):
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
_LOGGED: Set[str] = set()  # names already logged as withheld: once each per process


def start_environment() -> Dict[str, str]:
    """The process's environment at interpreter start (``/proc/self/environ``), else as it was
    when batchfutures was imported."""
    environ = _read_proc_environ()
    return _AT_IMPORT if environ is None else environ


def inherited(explicit: Mapping[str, str] = {}) -> Tuple[Tuple[str, str], ...]:
    """The (name, value) pairs this process's calls inherit now (``decide`` on os.environ);
    the names withheld are logged once each, at INFO, by name and reason (never the value)."""
    choice = decide(os.environ, start_environment(), explicit)
    new = sorted(name for name in choice.withheld if name not in _LOGGED)
    if new:
        _LOGGED.update(new)
        logger.info("os.environ changes not sent to the calls: %s. To send one deliberately, "
                    "pass it with environment={'NAME': value} (its value then shows in "
                    "SubmitJob and DescribeJobs), or secrets= for a credential",
                    ", ".join(f"{name} ({choice.withheld[name]})" for name in new))
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
