"""A tiny HTTP proxy on 127.0.0.1 in front of one endpoint, to give clients AWS's harsher answers.

    boto3 / s3fs ──> LoopbackProxy(upstream).url ──rule(request)──> upstream (emulator, moto)
                                                   │
          Forward()                 pass the request on, return upstream's answer
          Answer(status, body)      answer without passing it on (throttling, a refusal)
          ForwardThen(status, body) pass it on, then answer this instead (the job was made, the
                                    client sees a 500: AWS's ambiguous failure)
          ForwardThenClose()        pass it on, then close the connection without an answer

Every request is kept in ``requests`` (method, path, headers, body) for assertions. The proxy
speaks HTTP/1.1 with keep-alive, as botocore and aiohttp do; bodies by Content-Length only.
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, List, Optional, Union
from urllib.parse import urlsplit


@dataclass
class Request:
    method: str
    path: str
    headers: Dict[str, str]
    body: bytes

    def header(self, name: str) -> Optional[str]:
        return {k.lower(): v for k, v in self.headers.items()}.get(name.lower())


@dataclass
class Forward:
    pass


@dataclass
class Answer:
    status: int
    body: bytes = b""
    headers: Dict[str, str] = field(default_factory=dict)


@dataclass
class ForwardThen(Answer):
    pass


@dataclass
class ForwardThenClose:
    pass


Action = Union[Forward, Answer, ForwardThen, ForwardThenClose]
Rule = Callable[[Request], Action]


class LoopbackProxy:
    def __init__(self, upstream: str, rule: Optional[Rule] = None) -> None:
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname or "127.0.0.1", parts.port or 80
        self.rule: Rule = rule or (lambda request: Forward())
        self.requests: List[Request] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                request = Request(self.command, self.path, dict(self.headers.items()), body)
                with proxy._lock:
                    proxy.requests.append(request)
                    action = proxy.rule(request)
                if isinstance(action, Answer) and not isinstance(action, ForwardThen):
                    return self._answer(action.status, action.headers, action.body)
                status, headers, payload = proxy._forward(request)
                if isinstance(action, ForwardThenClose):
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return None
                if isinstance(action, ForwardThen):
                    return self._answer(action.status, action.headers, action.body)
                return self._answer(status, headers, payload)

            def _answer(self, status: int, headers: Dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection",
                                           "date", "server"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def _forward(self, request: Request):
        connection = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in request.headers.items()
                       if k.lower() not in ("connection", "expect", "host")}
            # the client's own Host, which its SigV4 signature covers (the emulator checks it)
            headers["Host"] = request.header("Host") or f"{self.upstream_host}:{self.upstream_port}"
            connection.request(request.method, request.path, body=request.body or None,
                               headers=headers)
            response = connection.getresponse()
            payload = response.read()
            return response.status, dict(response.getheaders()), payload
        finally:
            connection.close()

    def start(self) -> "LoopbackProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "LoopbackProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
