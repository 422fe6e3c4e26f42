"""Who may call the emulator's HTTP endpoint: requests SigV4-signed with its own credentials.

The endpoint runs commands (SubmitJob's `containerOverrides.command`), so it answers only a
request that

- has no `Origin` header (a browser sends one with every cross-site request; boto3 never does),
- names the address it serves in `Host` (a DNS-rebound name is refused),
- carries the protocol's JSON content type when it has a body (a browser's "simple" cross-site
  POST can only be text/plain, form-encoded or multipart),
- has a body no larger than the server's limit (413), and
- is signed (SigV4, as botocore signs) with the server's access key and secret, dated within
  15 minutes of now (AWS's window).

The signature is checked with botocore's own SigV4 code: a botocore `AWSRequest` is rebuilt
from the received method, path, query, signed headers and body, signed by `SigV4Auth` with the
request's own `X-Amz-Date` and the region and service of its credential scope, and the two
signatures are compared with `hmac.compare_digest`.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import ipaddress
import re
import secrets
import socket
import string
from typing import Any, Iterable, Optional, Tuple

MAX_CLOCK_SKEW = datetime.timedelta(minutes=15)
DEFAULT_MAX_BODY = 8 * 1024 * 1024  # bytes; Batch's and Logs' requests are far smaller
_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "localhost.localdomain"}
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


def check_signature(method: str, path: str, headers: Any, body: bytes, access_key_id: str,
                    secret_access_key: str, now: Optional[datetime.datetime] = None) -> None:
    """Refuse (403) a request not SigV4-signed with this pair, or dated outside the window."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

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
    if abs(now - when) > MAX_CLOCK_SKEW:
        raise Refused(403, "InvalidSignatureException",
                      f"Signature expired: {amz_date} is more than 15 minutes from now")
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
    request = AWSRequest(method=method, url=f"http://{headers.get('Host')}{path}",
                         headers=rebuilt, data=body)
    request.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(access_key_id, secret_access_key), service, region)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(expected.encode(), match.group("signature").lower().encode()):
        raise Refused(403, "InvalidSignatureException",
                      "The request signature we calculated does not match the signature you "
                      "provided. Check your AWS Secret Access Key and signing method.")


__all__ = ["DEFAULT_MAX_BODY", "MAX_CLOCK_SKEW", "MIN_REMOTE_SECRET", "Refused",
           "allowed_host_names", "check_content_type", "check_host", "check_secret_strength",
           "check_signature", "is_loopback", "new_credentials"]
