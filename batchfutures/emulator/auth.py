"""Who may call the emulator's HTTP endpoint: requests SigV4-signed with its own credentials.

The endpoint runs commands (SubmitJob's `containerOverrides.command`), so it answers only a
request that

- has no `Origin` header (a browser sends one with every cross-site request; boto3 never does),
- names the address it serves in `Host` (a DNS-rebound name is refused),
- carries the protocol's JSON content type when it has a body (a browser's "simple" cross-site
  POST can only be text/plain, form-encoded or multipart),
- has a body no larger than the server's limit (413), and
- is signed (SigV4, as botocore signs) with the server's access key and secret, dated at most
  15 minutes ago (AWS's window) and at most 5 minutes ahead (FUTURE_SKEW, below), and
- for an operation that changes anything (every one but Describe*, List*, Get*, Filter* and
  SQS's ReceiveMessage: may_repeat), was not seen before: its signature is single-use
  (ReplayGuard remembers every one it let through until its date leaves the window; bounded,
  see MAX_SEEN_SIGNATURES).

The signature is checked with botocore's own SigV4 code: a botocore `AWSRequest` is rebuilt
from the received method, the request line's own path and query (never a URL rebuilt from the
Host header), the signed headers and body, signed by `SigV4Auth` with the request's own
`X-Amz-Date` and the region and service of its credential scope, and the two signatures are
compared with `hmac.compare_digest`.

Why reads are not single-use, and why a repeat is a 429: botocore signs only `content-type`,
`host` and `x-amz-date` (its `amz-sdk-invocation-id` is added after signing), dated to the
second, so two equal calls in one second carry one signature. A client polls DescribeJobs with
the same ids several times a second; refusing those would break it, and replaying a read shows
an eavesdropper only what the original answer already showed. A repeated *change* (SubmitJob
runs a command) is refused with 429 TooManyRequestsException, which runs nothing: a replayer
gets nothing, and a legitimate client that really sent the same change twice in one second
retries, as botocore does on 429, with a fresh date and so a fresh signature.
"""

from __future__ import annotations

import datetime
import hashlib
import heapq
import hmac
import ipaddress
import re
import secrets
import socket
import string
import threading
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Tuple

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

MAX_CLOCK_SKEW = datetime.timedelta(minutes=15)  # how old a signed request may be (AWS's window)
# How far ahead of this clock a request may be dated: client and server share one clock on the
# loopback, and NTP keeps machines within seconds of each other; 5 minutes (AWS's own tolerance
# for clock skew on many services) leaves room for a badly set clock while keeping a request
# signed for later (to be sent by whoever intercepts it) useful for at most 20 minutes in all.
FUTURE_SKEW = datetime.timedelta(minutes=5)
MAX_SEEN_SIGNATURES = 200_000  # ~220 requests a second for the whole 15-minute window
DEFAULT_MAX_BODY = 8 * 1024 * 1024  # bytes; Batch's and Logs' requests are far smaller
_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "localhost.localdomain"}
_HOST_CHARACTERS = re.compile(r"[A-Za-z0-9.\-\[\]:%_]{1,300}")
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<credential>[^,\s]+)\s*,\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+)\s*,\s*Signature=(?P<signature>[0-9a-fA-F]+)\s*$")


class Refused(Exception):
    """A request the endpoint will not serve: HTTP status, error code, message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def new_credentials() -> Tuple[str, str]:
    """A fresh (access key id, secret access key) pair, shaped like AWS's."""
    alphabet = string.ascii_uppercase + string.digits
    key_id = "BFEMU" + "".join(secrets.choice(alphabet) for _ in range(15))
    return key_id, secrets.token_urlsafe(30)


MIN_REMOTE_SECRET = 20  # characters of a secret that guards an endpoint other machines reach


def check_secret_strength(secret: str, host: str) -> None:
    """ValueError for a secret too weak to guard an endpoint listening off the loopback: fewer
    than MIN_REMOTE_SECRET characters, or fewer than half as many distinct ones ("aaaa...")."""
    if is_loopback(host):
        return
    if len(secret) < MIN_REMOTE_SECRET or len(set(secret)) < MIN_REMOTE_SECRET // 2:
        raise ValueError(
            f"refusing a secret access key of {len(secret)} characters ({len(set(secret))} "
            f"distinct) for {host}, not a loopback address: anyone who reaches the port may "
            f"guess it; use at least {MIN_REMOTE_SECRET} random characters (e.g. "
            "`python -c 'import secrets; print(secrets.token_urlsafe(30))'`)")


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) is this machine only."""
    name = host.strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(value: str) -> str:
    """The name part of a Host header: `name[:port]` or `[v6]:port`."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def allowed_host_names(bind: str) -> frozenset:
    """The names a Host header may give for a server bound to `bind`."""
    bind = bind.strip("[]").lower()
    names = {bind}
    if is_loopback(bind) or bind in ("", "0.0.0.0", "::"):
        names |= _LOOPBACK_NAMES
    if bind in ("", "0.0.0.0", "::"):  # every interface: this machine's own names too
        for name in (socket.gethostname(), socket.getfqdn()):
            names.add(name.lower())
    names.discard("")
    return frozenset(names)


def check_host(host_header: Optional[str], bind: str, names: Iterable[str]) -> None:
    """Refuse a Host other than the address served (DNS rebinding). The port is not compared:
    the Host a client signed is covered by its signature."""
    if not host_header:
        raise Refused(400, "MissingHostHeader", "request has no Host header")
    if not _HOST_CHARACTERS.fullmatch(host_header.strip()):  # a name, an address, a port
        raise Refused(400, "InvalidHostHeader", "the Host header is not a host name and port")
    name = _host_name(host_header)
    if name in names:
        return
    if bind.strip("[]") in ("", "0.0.0.0", "::"):  # an IP literal cannot be DNS-rebound
        try:
            ipaddress.ip_address(name)
            return
        except ValueError:
            pass
    raise Refused(400, "InvalidHostHeader", f"this endpoint does not serve host {host_header!r}")


def check_content_type(content_type: Optional[str], expected: str, has_body: bool) -> None:
    """A body must come as the protocol's JSON type; a request without one may omit the type."""
    if not content_type:
        if has_body:
            raise Refused(415, "UnsupportedMediaType",
                          f"a request body must be sent as {expected}")
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media != expected:
        raise Refused(415, "UnsupportedMediaType",
                      f"content type {media!r} is not accepted here (expected {expected})")


class ReplayGuard:
    """The signatures let through whose date is still inside the window: a signature seen again
    is a replay (403). Entries expire with the window; at most ``limit`` are kept, and a request
    that would need more is refused as throttled (429, which clients retry) rather than let in
    unremembered."""

    def __init__(self, limit: int = MAX_SEEN_SIGNATURES) -> None:
        self.limit = int(limit)
        self._seen: Dict[bytes, datetime.datetime] = {}
        self._expiry: List[Tuple[datetime.datetime, bytes]] = []  # a heap of (expires, key)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, signature: str, signed_at: datetime.datetime, now: datetime.datetime) -> None:
        key = hashlib.sha256(signature.lower().encode()).digest()[:16]
        expires = signed_at + MAX_CLOCK_SKEW
        with self._lock:
            while self._expiry and self._expiry[0][0] < now:
                _, old = heapq.heappop(self._expiry)
                self._seen.pop(old, None)
            if key in self._seen:
                raise Refused(429, "TooManyRequestsException",
                              "this signature was already used, and a change is single-use: "
                              "sign the request again (a new X-Amz-Date)")
            if len(self._seen) >= self.limit:
                raise Refused(429, "TooManyRequestsException",
                              "too many signed requests inside the signature window; retry later")
            self._seen[key] = expires
            heapq.heappush(self._expiry, (expires, key))


_READ_ONLY = re.compile(r"^(Describe|List|Get|Filter)[A-Z]")
# Reads by another name: SQS's ReceiveMessage is polled in a loop (a warm worker, the pool's
# completions thread), so two equal receives often fall in one second. A replayed receive runs
# nothing and shows only what the original answer showed; at worst it hides a message for its
# visibility timeout, after which the message comes back (SQS's at-least-once delivery).
REPEATABLE_OPERATIONS = frozenset({"ReceiveMessage"})


def is_read_only(operation: str) -> bool:
    """Whether an operation of Batch's, Logs' or SQS's API only reads (Describe*, List*, Get*,
    Filter*)."""
    return bool(_READ_ONLY.match(operation))


def may_repeat(operation: str) -> bool:
    """Whether a signature seen before may call ``operation`` again: the reads and
    REPEATABLE_OPERATIONS; every other operation (SubmitJob, SendMessage, DeleteMessage,
    DeleteQueue, ...) is a change, and its signature is single-use."""
    return is_read_only(operation) or operation in REPEATABLE_OPERATIONS


class Signed(NamedTuple):
    """What a request checked by check_signature was signed with."""

    signature: str
    signed_at: datetime.datetime
    checked_at: datetime.datetime


def check_signature(method: str, path: str, headers: Any, body: bytes, access_key_id: str,
                    secret_access_key: str, now: Optional[datetime.datetime] = None) -> Signed:
    """Refuse (403) a request not SigV4-signed with this pair, or dated outside the window;
    its signature and date, for ReplayGuard.admit once the operation is known."""
    authorization = headers.get("Authorization")
    if not authorization:
        raise Refused(403, "MissingAuthenticationTokenException",
                      "request is not signed: sign it (SigV4) with the emulator's credentials")
    match = _AUTHORIZATION.match(authorization.strip())
    if match is None:
        raise Refused(403, "IncompleteSignatureException", "malformed Authorization header")
    parts = match.group("credential").split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        raise Refused(403, "IncompleteSignatureException", "malformed credential scope")
    key_id, scope_date, region, service = parts[:4]
    if not hmac.compare_digest(key_id.encode(), access_key_id.encode()):
        raise Refused(403, "UnrecognizedClientException",
                      "the security token included in the request is invalid")
    amz_date = headers.get("X-Amz-Date") or ""
    try:
        when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(
            tzinfo=datetime.timezone.utc)
    except ValueError:
        raise Refused(403, "IncompleteSignatureException", "missing or malformed X-Amz-Date")
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if now - when > MAX_CLOCK_SKEW:
        raise Refused(403, "InvalidSignatureException",
                      f"Signature expired: {amz_date} is more than 15 minutes before now")
    if when - now > FUTURE_SKEW:
        raise Refused(403, "InvalidSignatureException",
                      f"Signature not yet current: {amz_date} is more than 5 minutes ahead of now")
    if not path.startswith("/"):  # origin-form only: the path signed is the path routed
        raise Refused(400, "InvalidRequestPath", "the request target must be a path ('/...')")
    if scope_date != amz_date[:8]:
        raise Refused(403, "InvalidSignatureException", "credential scope date is not X-Amz-Date's")
    signed = match.group("signed").lower().split(";")
    if "host" not in signed or "x-amz-date" not in signed:
        raise Refused(403, "InvalidSignatureException", "host and x-amz-date must be signed")
    claimed = headers.get("X-Amz-Content-SHA256")
    if claimed is not None and not hmac.compare_digest(
            claimed.encode(), hashlib.sha256(body).hexdigest().encode()):
        raise Refused(403, "InvalidSignatureException", "X-Amz-Content-SHA256 is not the body's")
    rebuilt = {}
    for name in signed:
        values = headers.get_all(name) if hasattr(headers, "get_all") else [headers.get(name)]
        if not values or values[0] is None:
            raise Refused(403, "InvalidSignatureException", f"signed header {name} is missing")
        rebuilt[name] = ",".join(v.strip() for v in values)
    # the request line's own path and query; the signed Host is in `rebuilt`, never in the URL
    request = AWSRequest(method=method, url=f"http://emulator.invalid{path}", headers=rebuilt,
                         data=body)
    request.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(access_key_id, secret_access_key), service, region)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(expected.encode(), match.group("signature").lower().encode()):
        raise Refused(403, "InvalidSignatureException",
                      "The request signature we calculated does not match the signature you "
                      "provided. Check your AWS Secret Access Key and signing method.")
    return Signed(match.group("signature").lower(), when, now)


__all__ = ["DEFAULT_MAX_BODY", "FUTURE_SKEW", "MAX_CLOCK_SKEW", "MAX_SEEN_SIGNATURES",
           "MIN_REMOTE_SECRET", "REPEATABLE_OPERATIONS", "Refused", "ReplayGuard", "Signed",
           "is_read_only", "may_repeat",
           "allowed_host_names", "check_content_type", "check_host", "check_secret_strength",
           "check_signature", "is_loopback", "new_credentials"]
