"""`EmulatorServer`: the emulator over HTTP, so a stock boto3 client can drive it unmodified.

    boto3.client("batch", endpoint_url=server.endpoint_url)  ─ REST-JSON, POST /v1/submitjob ...
    boto3.client("logs",  endpoint_url=server.endpoint_url)  ─ JSON 1.1, POST / + X-Amz-Target
    boto3.client("sqs",   endpoint_url=server.endpoint_url)  ─ JSON 1.0, POST / + X-Amz-Target
                 │
    ThreadingHTTPServer (standard library, one thread per connection)
                 │  route from botocore's models -> operation -> xform_name -> method
    service.submit_job(**params), service.logs.get_log_events(**params), ...

Only requests SigV4-signed with the server's own pair (`access_key_id`, `secret_access_key`),
without an `Origin` header, with a `Host` naming the address served, the protocol's JSON
content type and a body within `max_body` are served; any other is refused with 4xx before it is
routed (auth.py). Before a request is authenticated nothing it sends is unbounded:

    body          Content-Length digits only, at most `max_body`; chunked bodies with chunk
                  sizes of 1-8 hex digits, the total at most `max_body`, CRLF after each chunk;
                  Content-Length with Transfer-Encoding, or any other coding: 400
    time          `request_deadline` seconds (default 30) from a request's first byte to the end
                  of its body, however slowly it trickles in (slowloris); then the connection
                  is closed. A kept-alive connection may wait IDLE_CONNECTION_TIMEOUT for its
                  next request
    connections   at most `max_connections` (default 64) at once; one more is closed at once

Nothing is routed by hand: every operation of botocore's Batch model is a route (its
`http.method` and `http.requestUri`), every operation of the CloudWatch Logs model a target
(`Logs_20140328.<Operation>`), every operation of SQS's a target (`AmazonSQS.<Operation>`,
answered by emulator/sqs.py's LocalSQS over `sqs_folder`, by default the service's folder's
`sqs`; queue URLs `<endpoint_url>/<account>/<QueueName>`), and a request is answered by
whichever method of the service object has the operation's snake_case name; an operation it
does not implement is an unknown route. Errors are encoded as each protocol's parser in botocore reads them:

    REST-JSON (Batch)  status, header `x-amzn-ErrorType: <Code>`, body {"message": ...}
    JSON 1.1 (Logs)    status, body {"__type": <Code>, "message": ...}
    JSON 1.0 (SQS)     status, body {"__type": <error shape>, "message": ...} and header
                       `x-amzn-query-error: <query code>;Sender` (the model's
                       `awsQueryCompatible`: botocore raises the query code, e.g.
                       AWS.SimpleQueueService.NonExistentQueue, as QueueDoesNotExist)

Time: `request_deadline` bounds reading a request, not answering it: a ReceiveMessage's long
poll (WaitTimeSeconds up to 20) runs after its body is read, and is never cut by it.

A service `ClientError` keeps its code and status (without a status: 429 for throttling codes,
else the model's status for the code, else 400; `TooManyRequestsException` is 429, which
botocore's standard and legacy retry handlers both treat as throttling); a
`ParamValidationError`, a request that does not fit the model, or a member the method does not
take is a 400 `ClientException` (Logs: `InvalidParameterException`); an unknown route or an
operation the service does not implement a 404 `UnknownOperationException`; any other
exception a 500 `ServerException`, logged to the `batchfutures` logger. The server thread
never dies of a request. Values are put on the wire by the output shape: datetimes in long
members as epoch milliseconds (Batch's and Logs' times), bytes as base64, Decimals as numbers;
keys the model does not have are passed through as the service returned them.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import functools
import inspect
import io
import json
import logging
import re
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

import botocore.session
from botocore import xform_name
from botocore.exceptions import ClientError, ParamValidationError
from botocore.validate import ParamValidator

from .auth import (
    DEFAULT_MAX_BODY,
    Refused,
    ReplayGuard,
    Signed,
    allowed_host_names,
    check_content_type,
    check_host,
    check_secret_strength,
    check_signature,
    may_repeat,
    new_credentials,
)
from .sqs import LocalSQS

logger = logging.getLogger("batchfutures")

IDLE_CONNECTION_TIMEOUT = 60.0  # seconds a keep-alive connection may sit unused
REQUEST_DEADLINE = 30.0  # seconds from a request's first byte to the end of its body
MAX_CONNECTIONS = 64  # connections served at once (a thread each)
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,8})(;[^\r\n]*)?\r?\n")  # hex digits, extensions
_CONTENT_LENGTH = re.compile(r"[0-9]{1,19}")
_VALIDATOR = ParamValidator()
_THROTTLING_CODES = {"TooManyRequestsException", "ThrottlingException", "Throttling",
                     "ThrottledException", "RequestThrottledException", "RequestLimitExceeded"}


class _Answer(Exception):
    """An error answer: HTTP status, error code, message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@functools.lru_cache(maxsize=None)
def _load_model(service: str) -> Any:
    return botocore.session.get_session().get_service_model(service)


# -- values on the wire <-> values of a boto3 client, by shape -------------------------------
def _from_wire(shape: Any, value: Any) -> Any:
    """A JSON value of the wire as botocore's parser would hand it to the caller."""
    if shape is None or value is None:
        return value
    kind = shape.type_name
    if kind == "structure" and isinstance(value, dict):
        out = {}
        wire_names = {m.serialization.get("name", n): n for n, m in shape.members.items()}
        for key, item in value.items():
            name = wire_names.get(key, key)
            out[name] = _from_wire(shape.members.get(name), item)
        return out
    if kind == "list" and isinstance(value, list):
        return [_from_wire(shape.member, item) for item in value]
    if kind == "map" and isinstance(value, dict):
        return {key: _from_wire(shape.value, item) for key, item in value.items()}
    if kind == "blob" and isinstance(value, str):
        return base64.b64decode(value)
    return value


def _to_wire(shape: Any, value: Any) -> Any:
    """A value returned by the service as botocore's serializer would have put it in JSON."""
    if value is None:
        return None
    kind = shape.type_name if shape is not None else None
    if isinstance(value, dict):
        if kind == "structure":
            return {shape.members[k].serialization.get("name", k) if k in shape.members else k:
                    _to_wire(shape.members.get(k), v) for k, v in value.items()}
        return {k: _to_wire(shape.value if kind == "map" else None, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_wire(shape.member if kind == "list" else None, v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        if kind in ("integer", "long"):  # Batch's and Logs' times are longs: epoch milliseconds
            return int(value.timestamp() * 1000)
        if shape is not None and shape.serialization.get("timestampFormat") == "iso8601":
            return value.isoformat()
        return value.timestamp()
    if isinstance(value, decimal.Decimal):
        value = int(value) if value == value.to_integral_value() else float(value)
    if kind in ("integer", "long") and isinstance(value, float) and value.is_integer():
        return int(value)  # botocore's JSON 1.1 parser hands numbers over as they come
    return value


def _scalar(shape: Any, text: str) -> Any:
    """A value from a URI label, query string or header, typed by its shape."""
    kind = shape.type_name
    if kind in ("integer", "long"):
        return int(text)
    if kind in ("float", "double"):
        return float(text)
    if kind == "boolean":
        return text.lower() == "true"
    if kind == "blob":
        return base64.b64decode(text)
    return text


def _header_text(shape: Any, value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(_header_text(shape.member, v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(_to_wire(shape, value))


def _json_body(raw: bytes) -> Dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as error:
        raise _Answer(400, "SerializationException", f"request body is not JSON: {error}")
    if not isinstance(body, dict):
        raise _Answer(400, "SerializationException", "request body must be a JSON object")
    return body


# -- the two protocols ----------------------------------------------------------------------
class _Api:
    """One botocore service model answered by one target object."""

    protocol = ""
    content_type = "application/json"

    def __init__(self, model: Any, target: Any, validation_code: str) -> None:
        self.model = model
        self.target = target
        self.validation_code = validation_code

    def method(self, operation: Any) -> Any:
        name = xform_name(operation.name)
        method = getattr(self.target, name, None) if not name.startswith("_") else None
        if not callable(method):
            raise _Answer(404, "UnknownOperationException",
                          f"{self.model.service_name} operation {operation.name} is not emulated")
        return method

    def check_signature(self, operation: Any, method: Any, params: Dict[str, Any]) -> None:
        """A member the method does not take is the caller's error (400), not a server bug."""
        try:
            signature = inspect.signature(method, follow_wrapped=False)  # what is really called
        except (TypeError, ValueError):  # a builtin or some callable without a signature
            return
        try:
            signature.bind(**params)
        except TypeError as error:
            raise _Answer(400, self.validation_code,
                          f"{operation.name}: {error} (not supported by the emulator)")

    def error_status(self, code: str) -> int:
        """The HTTP status of an error code the service raised without one."""
        if code in _THROTTLING_CODES:
            return 429
        shape = next((s for s in self.model.error_shapes if s.name == code), None)
        status = shape.metadata.get("error", {}).get("httpStatusCode") if shape is not None else None
        return int(status or 400)

    def validate(self, operation: Any, params: Dict[str, Any]) -> None:
        """Check `params` as botocore does before sending (raw HTTP callers skip that check)."""
        if operation.input_shape is None:
            return
        report = _VALIDATOR.validate(params, operation.input_shape)
        if report.has_errors():
            raise ParamValidationError(report=report.generate_report())

    def error_answer(self, status: int, code: str, message: str) -> Tuple[Dict[str, str], Any]:
        raise NotImplementedError

    def response(self, operation: Any, result: Any) -> Tuple[int, Dict[str, str], bytes]:
        body = _to_wire(operation.output_shape, result or {})
        return 200, {}, json.dumps(body, separators=(",", ":")).encode()


class _RestJsonApi(_Api):
    """REST-JSON (Batch): the operation is the method and path of botocore's `requestUri`."""

    protocol = "rest-json"

    def __init__(self, model: Any, target: Any, validation_code: str = "ClientException") -> None:
        super().__init__(model, target, validation_code)
        routes = []
        for name in model.operation_names:
            operation = model.operation_model(name)
            path = operation.http["requestUri"].partition("?")[0]
            labels: List[str] = []

            def label(match: "re.Match[str]", labels: List[str] = labels) -> str:
                labels.append(match.group(1))
                greedy = match.group(2) == "+"
                return f"(?P<l{len(labels) - 1}>{'.+' if greedy else '[^/]+'})"

            pattern = ""
            for literal, placeholder in re.findall(r"([^{]*)(\{[^}]*\})?", path):
                pattern += re.escape(literal)
                if placeholder:
                    pattern += re.sub(r"\{([^}+]+)(\+?)\}", label, placeholder)
            routes.append((len(labels), operation.http["method"].upper(), re.compile(pattern),
                           labels, operation))
        routes.sort(key=lambda route: route[0])  # literal paths before labelled ones
        self.routes = [route[1:] for route in routes]

    def find(self, method: str, path: str) -> Optional[Tuple[Any, Dict[str, str]]]:
        for http_method, pattern, labels, operation in self.routes:
            if http_method != method:
                continue
            match = pattern.fullmatch(path)
            if match:
                values = {name: unquote(match.group(f"l{i}")) for i, name in enumerate(labels)}
                return operation, values
        return None

    def params(self, operation: Any, labels: Dict[str, str], query: Dict[str, List[str]],
               headers: Any, raw: bytes) -> Dict[str, Any]:
        shape = operation.input_shape
        if shape is None:
            return {}
        payload = shape.serialization.get("payload")
        params: Dict[str, Any] = {}
        if payload:
            member = shape.members[payload]
            if member.type_name == "structure":
                if raw.strip():
                    params[payload] = _from_wire(member, _json_body(raw))
            elif raw:
                params[payload] = raw if member.type_name == "blob" else raw.decode("utf-8")
        else:
            params = _from_wire(shape, _json_body(raw))
        bound: Set[str] = set()
        for name, member in shape.members.items():
            location = member.serialization.get("location")
            wire = member.serialization.get("name", name)
            if location == "uri" and wire in labels:
                params[name] = _scalar(member, labels[wire])
            elif location == "querystring":
                if member.type_name == "map":
                    continue  # takes whatever the named members leave, below
                bound.add(wire)
                if wire in query:
                    if member.type_name == "list":
                        params[name] = [_scalar(member.member, v) for v in query[wire]]
                    else:
                        params[name] = _scalar(member, query[wire][0])
            elif location == "header" and headers.get(wire) is not None:
                text = headers[wire]
                if member.type_name == "list":
                    params[name] = [_scalar(member.member, v.strip()) for v in text.split(",")]
                else:
                    params[name] = _scalar(member, text)
            elif location == "headers":
                prefix = wire.lower()
                found = {k[len(prefix):]: v for k, v in headers.items() if k.lower().startswith(prefix)}
                if found:
                    params[name] = found
        for name, member in shape.members.items():
            if member.serialization.get("location") == "querystring" and member.type_name == "map":
                rest = {k: (v if member.value.type_name == "list" else v[0])
                        for k, v in query.items() if k not in bound}
                if rest:
                    params[name] = rest
        return params

    def error_answer(self, status: int, code: str, message: str) -> Tuple[Dict[str, str], Any]:
        return {"x-amzn-ErrorType": code}, {"message": message}

    def response(self, operation: Any, result: Any) -> Tuple[int, Dict[str, str], bytes]:
        result = dict(result or {})
        result.pop("ResponseMetadata", None)
        shape = operation.output_shape
        status = int(operation.http.get("responseCode", 200))
        headers: Dict[str, str] = {}
        if shape is None:
            return status, headers, b"{}"
        payload = shape.serialization.get("payload")
        for name, member in shape.members.items():
            location = member.serialization.get("location")
            if name not in result or location is None:
                continue
            value = result.pop(name)
            wire = member.serialization.get("name", name)
            if location == "statusCode":
                status = int(value)
            elif location == "header":
                headers[wire] = _header_text(member, value)
            elif location == "headers":
                for key, item in value.items():
                    headers[wire + key] = str(item)
        if payload:
            member = shape.members[payload]
            value = result.get(payload)
            if member.type_name in ("blob", "string"):
                data = value if isinstance(value, (bytes, bytearray)) else str(value or "").encode()
                return status, headers, bytes(data)
            body = _to_wire(member, value or {})
        else:
            body = _to_wire(shape, result)
        return status, headers, json.dumps(body, separators=(",", ":")).encode()


class _JsonApi(_Api):
    """JSON 1.x (CloudWatch Logs): POST / with `X-Amz-Target: <targetPrefix>.<Operation>`."""

    protocol = "json"

    def __init__(self, model: Any, target: Any, validation_code: str = "InvalidParameterException") -> None:
        super().__init__(model, target, validation_code)
        self.prefix = model.metadata["targetPrefix"]
        self.content_type = f"application/x-amz-json-{model.metadata.get('jsonVersion', '1.0')}"

    def find(self, target: str) -> Optional[Any]:
        prefix, _, name = target.rpartition(".")
        if prefix != self.prefix or name not in self.model.operation_names:
            return None
        return self.model.operation_model(name)

    def params(self, operation: Any, raw: bytes) -> Dict[str, Any]:
        return _from_wire(operation.input_shape, _json_body(raw)) if operation.input_shape else {}

    def error_answer(self, status: int, code: str, message: str) -> Tuple[Dict[str, str], Any]:
        return {}, {"__type": code, "message": message}


_SQS_CODE_PREFIX = "AWS.SimpleQueueService."
_SQS_SHAPE_OF = {"NonExistentQueue": "QueueDoesNotExist"}  # the one whose name differs


class _QueryCompatibleJsonApi(_JsonApi):
    """JSON 1.0 of a service moved from the query protocol (SQS: `awsQueryCompatible` in its
    model's metadata). The service raises the query codes boto3 shows
    (`AWS.SimpleQueueService.NonExistentQueue`); the answer carries them as SQS does: the
    error shape's name in `__type` and `x-amzn-query-error: <code>;Sender`, which botocore's
    JSON parser turns back into the query code (`Error.Code`), and its SQS handler into the
    modeled exception (`client.exceptions.QueueDoesNotExist`) through the shape's name."""

    def __init__(self, model: Any, target: Any, validation_code: str = "InvalidParameterValue") -> None:
        super().__init__(model, target, validation_code)
        self.shape_names = {shape.name for shape in model.error_shapes}

    def error_type(self, code: str) -> str:
        """The error shape's name for a query code; the code itself when no shape has it."""
        bare = code[len(_SQS_CODE_PREFIX):] if code.startswith(_SQS_CODE_PREFIX) else code
        name = _SQS_SHAPE_OF.get(bare, bare)
        if name in self.shape_names:
            return f"com.amazonaws.{self.model.endpoint_prefix}#{name}"
        return code

    def error_answer(self, status: int, code: str, message: str) -> Tuple[Dict[str, str], Any]:
        fault = "Receiver" if status >= 500 else "Sender"
        return ({"x-amzn-query-error": f"{code};{fault}"},
                {"__type": self.error_type(code), "message": message})


def json_api_for(model: Any, target: Any) -> _JsonApi:
    """The JSON API of a model: query-compatible ones (SQS) answer errors their way."""
    if "awsQueryCompatible" in model.metadata:
        return _QueryCompatibleJsonApi(model, target)
    return _JsonApi(model, target)


# -- the HTTP server ------------------------------------------------------------------------
class _DeadlineReader(io.RawIOBase):
    """A socket's reads under two clocks: waiting for a request's first byte, the idle timeout;
    from that byte on, one deadline for the whole request (headers and body), however slowly
    its bytes come. `idle()` starts the wait for the next request."""

    def __init__(self, sock: socket.socket, idle_timeout: float, request_deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._idle_timeout = idle_timeout
        self._request_deadline = request_deadline
        self._deadline: Optional[float] = None

    def idle(self) -> None:
        self._deadline = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._deadline is None:
            timeout = self._idle_timeout
        else:
            timeout = self._deadline - time.monotonic()
            if timeout <= 0:
                raise socket.timeout(f"request not received within {self._request_deadline:g} s")
        self._sock.settimeout(timeout)
        try:
            count = self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self._idle_timeout)  # what the answer's writes wait at most
        if count and self._deadline is None:
            self._deadline = time.monotonic() + self._request_deadline
        return count


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as botocore's connection pool expects
    server_version = "batchfutures-emulator"
    timeout = IDLE_CONNECTION_TIMEOUT
    server: "_HTTPServer"

    def setup(self) -> None:
        super().setup()
        owner = self.server.owner
        self._reader = _DeadlineReader(self.connection, IDLE_CONNECTION_TIMEOUT,
                                       owner.request_deadline)
        self.rfile.close()  # the plain socket file setup() made: reads go through the clocks
        self.rfile = io.BufferedReader(self._reader)
        self.server.track(self.connection, True)

    def handle_one_request(self) -> None:
        self._reader.idle()  # the next request's clock starts with its first byte
        super().handle_one_request()

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("batchfutures emulator server: " + format, *args)

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_GET

    def _read_body(self, limit: int) -> bytes:
        """The request body; `Refused` (413) past `limit` bytes, before reading them all, and
        (400) for a length or chunk size that is not plain digits (see the module doc)."""
        codings = [c.strip().lower() for c in self.headers.get_all("Transfer-Encoding") or []]
        lengths = self.headers.get_all("Content-Length") or []
        if codings:
            if codings != ["chunked"] or lengths:
                raise Refused(400, "BadRequest", "only one Transfer-Encoding, chunked, and "
                                                 "without Content-Length, is accepted")
            return self._read_chunked(limit)
        if len(lengths) > 1 or (lengths and not _CONTENT_LENGTH.fullmatch(lengths[0].strip())):
            raise Refused(400, "BadRequest", "Content-Length must be one decimal number")
        length = int(lengths[0]) if lengths else 0
        if length > limit:
            raise Refused(413, "RequestEntityTooLarge",
                          f"request body of {length} bytes is over the limit of {limit} bytes")
        body = self.rfile.read(length) if length > 0 else b""
        if len(body) != length:
            raise Refused(400, "BadRequest", "the body ended before its Content-Length")
        return body

    def _read_chunked(self, limit: int) -> bytes:
        chunks: List[bytes] = []
        total = 0
        while True:
            match = _CHUNK_SIZE.fullmatch(self.rfile.readline(1024))
            if match is None:
                raise Refused(400, "BadRequest", "malformed chunk size (1 to 8 hex digits)")
            size = int(match.group(1), 16)
            if size == 0:
                for _ in range(64):  # trailers, up to the blank line, each bounded
                    line = self.rfile.readline(8192)
                    if line in (b"\r\n", b"\n"):
                        return b"".join(chunks)
                    if not line.endswith(b"\n"):
                        break
                raise Refused(400, "BadRequest", "malformed or too many trailers")
            total += size
            if total > limit:
                raise Refused(413, "RequestEntityTooLarge",
                              f"request body over the limit of {limit} bytes")
            chunk = self.rfile.read(size)
            if len(chunk) != size or self.rfile.readline(3) not in (b"\r\n", b"\n"):
                raise Refused(400, "BadRequest", "a chunk is not followed by CRLF")
            chunks.append(chunk)

    def _admit(self, owner: "EmulatorServer", api: "_Api", target: Optional[str]
               ) -> Tuple[bytes, Signed]:
        """The body and signature of a request the endpoint serves; `Refused` (4xx) for any
        other, before anything is run (auth.py)."""
        if self.headers.get("Origin") is not None:
            raise Refused(403, "AccessDeniedException",
                          "requests from web pages (with an Origin header) are refused")
        check_host(self.headers.get("Host"), owner.host, owner._host_names)
        length = self.headers.get("Content-Length")
        chunked = self.headers.get("Transfer-Encoding") is not None
        has_body = chunked or bool(length and length.strip() not in ("", "0"))
        expected = api.content_type if target else owner.rest_api.content_type
        check_content_type(self.headers.get("Content-Type"), expected, has_body)
        raw = self._read_body(owner.max_body)
        signed = check_signature(self.command, self.path, self.headers, raw, owner.access_key_id,
                                 owner.secret_access_key)
        return raw, signed

    def _handle(self) -> None:
        owner = self.server.owner
        target = self.headers.get("X-Amz-Target")
        api: _Api = owner.rest_api
        if target and owner.json_apis:  # the target's API, for its content type and errors
            api = next((a for a in owner.json_apis if a.find(target)), owner.json_apis[0])
        request_id = str(uuid.uuid4())
        code: Optional[str]  # the error's, None for an answer
        try:
            try:
                try:
                    raw, signed = self._admit(owner, api, target)
                except Refused as refused:
                    self.close_connection = True  # its body may be unread: end the connection
                    raise _Answer(refused.status, refused.code, refused.message)
                except (ValueError, OSError) as error:
                    self.close_connection = True
                    raise _Answer(400, "SerializationException", f"unreadable request: {error}")
                if target:
                    if not isinstance(api, _JsonApi) or (operation := api.find(target)) is None:
                        raise _Answer(404, "UnknownOperationException", f"unknown operation {target}")
                    params = api.params(operation, raw)
                else:
                    api = owner.rest_api
                    url = urlsplit(self.path)
                    found = api.find(self.command, url.path)
                    if found is None:
                        raise _Answer(404, "UnknownOperationException",
                                      f"no operation at {self.command} {url.path}")
                    operation, labels = found
                    query = parse_qs(url.query, keep_blank_values=True)
                    params = api.params(operation, labels, query, self.headers, raw)
                if not may_repeat(operation.name):  # a change: its signature is single-use
                    try:
                        owner.replay_guard.admit(signed.signature, signed.signed_at,
                                                 signed.checked_at)
                    except Refused as refused:
                        raise _Answer(refused.status, refused.code, refused.message)
                method = api.method(operation)
                api.validate(operation, params)
                api.check_signature(operation, method, params)
                result = method(**params)
                status, headers, body = api.response(operation, result)
                headers["Content-Type"] = api.content_type
            except _Answer as answer:
                status, code, message = answer.status, answer.code, answer.message
            except ClientError as error:
                info = error.response.get("Error") or {}
                code = info.get("Code") or "ClientException"
                message = info.get("Message") or str(error)
                status = int((error.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
                             or api.error_status(code))
            except ParamValidationError as error:
                status, code, message = 400, api.validation_code, str(error)
            except Exception as error:
                logger.exception("batchfutures emulator server: %s %s failed", self.command, self.path)
                status, code = 500, "ServerException"
                message = f"internal error: {type(error).__name__}: {error}"
            else:
                code = None
            if code is not None:
                headers, document = api.error_answer(status, code, message)
                headers["Content-Type"] = api.content_type
                body = json.dumps(document).encode()
            headers["x-amzn-RequestId"] = request_id
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except (ConnectionError, socket.timeout, OSError) as error:  # the client went away
            logger.debug("batchfutures emulator server: connection lost: %s", error)
            self.close_connection = True


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: Tuple[str, int], owner: "EmulatorServer") -> None:
        self.owner = owner
        self._connections: Set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(owner.max_connections)
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection while under `max_connections`; else it is closed now."""
        if not self._slots.acquire(blocking=False):
            logger.warning("batchfutures emulator server: %d connections open; refused one "
                           "from %s", self.owner.max_connections, client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def track(self, connection: socket.socket, open_: bool) -> None:
        with self._connections_lock:
            if open_:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections, self._connections = list(self._connections), set()
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.exception("batchfutures emulator server: request from %s failed", client_address)


class EmulatorServer:
    """`service` (a `BatchEmulator`) served over HTTP on `host`:`port` (0: a free port).

    It serves only requests SigV4-signed with `access_key_id` and `secret_access_key` (a fresh
    pair when not given; both are attributes, for building a client), with no `Origin` header,
    a `Host` naming the address served, the protocol's JSON content type and a body of at most
    `max_body` bytes, each signature once; anything else is refused with 4xx and runs nothing
    (auth.py). A request must arrive whole within `request_deadline` seconds of its first byte;
    at most `max_connections` connections are served at once (the module doc).

        boto3.client("batch", endpoint_url=server.endpoint_url, region_name="us-east-1",
                     aws_access_key_id=server.access_key_id,
                     aws_secret_access_key=server.secret_access_key)

    `start()` serves from a background thread and returns the server; `stop()` stops it and
    closes its connections (the service itself stays open: its owner closes it). Usable as a
    context manager, which starts it if needed and stops it on exit.
    """

    def __init__(self, service: Any, host: str = "127.0.0.1", port: int = 0,
                 access_key_id: Optional[str] = None, secret_access_key: Optional[str] = None,
                 max_body: int = DEFAULT_MAX_BODY, request_deadline: float = REQUEST_DEADLINE,
                 max_connections: int = MAX_CONNECTIONS, sqs_folder: Any = None) -> None:
        if (access_key_id is None) != (secret_access_key is None):
            raise ValueError("give both access_key_id and secret_access_key, or neither")
        if access_key_id is None or secret_access_key is None:
            access_key_id, secret_access_key = new_credentials()
        if not access_key_id or not secret_access_key:
            raise ValueError("access_key_id and secret_access_key must not be empty")
        check_secret_strength(secret_access_key, host)  # off the loopback: 20 characters or more
        self.service = service
        self.host = host
        self.port = int(port)
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.max_body = int(max_body)
        if not request_deadline > 0 or int(max_connections) < 1:
            raise ValueError("request_deadline must be positive and max_connections at least 1")
        self.request_deadline = float(request_deadline)
        self.max_connections = int(max_connections)
        self.replay_guard = ReplayGuard()  # a change's signature is single-use in the window
        self._host_names = allowed_host_names(host)
        self.rest_api = _RestJsonApi(_load_model("batch"), service)
        # a service without `logs` still answers Logs' protocol: every operation unknown (404)
        self.json_apis: List[_JsonApi] = [_JsonApi(_load_model("logs"), getattr(service, "logs", None))]
        # SQS over a folder (emulator/sqs.py); its queue URLs name this endpoint once started
        if sqs_folder is None and getattr(service, "folder", None) is not None:
            sqs_folder = Path(service.folder) / "sqs"
        self.sqs: Optional[Any] = None
        if sqs_folder is not None:
            self.sqs = LocalSQS(sqs_folder)
        self.json_apis.append(json_api_for(_load_model("sqs"), self.sqs))
        self._httpd: Optional[_HTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    @property
    def credentials(self) -> Dict[str, str]:
        """`aws_access_key_id` and `aws_secret_access_key`, as boto3.client takes them."""
        return {"aws_access_key_id": self.access_key_id,
                "aws_secret_access_key": self.secret_access_key}

    @property
    def endpoint_url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the emulator server is not started")
        host = self.host if self.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def start(self) -> "EmulatorServer":
        with self._lock:
            if self._httpd is not None:
                return self
            httpd = _HTTPServer((self.host, self.port), self)
            self.port = httpd.server_address[1]
            self._httpd = httpd
            if self.sqs is not None:
                self.sqs.endpoint = self.endpoint_url
            self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                            name=f"bf-emulator-http-{self.port}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            httpd, thread = self._httpd, self._thread
            self._httpd = self._thread = None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.close_connections()
        httpd.server_close()
        if thread is not None:
            thread.join()

    @property
    def running(self) -> bool:
        return self._httpd is not None

    def __enter__(self) -> "EmulatorServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.endpoint_url if self._httpd is not None else "stopped"
        return f"EmulatorServer({where})"


__all__ = ["EmulatorServer"]
