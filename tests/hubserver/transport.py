"""The HTTP side of a request: its body (Content-Length or chunked) and its answer, over a keep-alive
connection, with the hooks that let a fault cut either short."""

from __future__ import annotations

import json
import secrets
import socket
import struct
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from .common import CHUNK, HubError, _header_value

if TYPE_CHECKING:
    from .server import HubServer


class Transport(BaseHTTPRequestHandler):
    """Request bodies and responses; the routing and the endpoints are mixed in on top of it."""

    protocol_version = "HTTP/1.1"  # keep-alive, like the real Hub; every answer has a Content-Length
    server_version = "hubserver/1.0"
    timeout = 120  # idle keep-alive connections end eventually

    @property
    def hub(self) -> HubServer:
        return self.server.hub

    def log_message(self, format, *args):  # noqa: A002 (the base class's signature)
        pass  # the request log replaces http.server's stderr lines

    def _log_outcome(self) -> None:
        """Complete the log entry once, *before* the client can see the outcome (tests never race)."""
        if self._entry is not None:
            self.hub._close_entry(self._entry, self._status, self._user)
            self._entry = None

    # -- request bodies ----------------------------------------------------------------------

    def _iter_body(self):
        """Yield the request body in pieces (Content-Length or chunked), marking it consumed."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            yield from self._iter_chunked()
        else:
            remaining = int(self.headers.get("Content-Length") or 0)
            while remaining > 0:
                data = self.rfile.read(min(CHUNK, remaining))
                if not data:
                    raise ConnectionError("client closed the connection mid-body")
                remaining -= len(data)
                yield data
        self._body_done = True

    def _iter_chunked(self):
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return
            data = self.rfile.read(size)
            if len(data) < size:
                raise ConnectionError("client closed the connection mid-body")
            self.rfile.readline()
            yield data

    def _read_body(self) -> bytes:
        if self._body is None:
            self._body = b"" if self._body_done else b"".join(self._iter_body())
        return self._body

    def _json_body(self) -> dict:
        try:
            body = json.loads(self._read_body() or b"{}")
        except ValueError:
            raise HubError(400, "Request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise HubError(400, "Request body must be a JSON object")
        return body

    def _discard_body(self) -> None:
        """Keep the keep-alive connection usable: drain a small unread body, or close."""
        if self._body_done:
            return
        if int(self.headers.get("Content-Length") or 0) > 4 * CHUNK:
            self.close_connection = True
            return
        try:
            self._read_body()
        except (ConnectionError, ValueError):
            self.close_connection = True

    # -- responses ---------------------------------------------------------------------------

    def send_response(self, code, message=None):
        self._status = code
        super().send_response(code, message)

    def _start(self, status: int, headers: dict, length: int, content_type: str) -> None:
        self._discard_body()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        self.send_header("X-Request-Id", self.headers.get("X-Amzn-Trace-Id") or secrets.token_hex(8))
        for name, value in headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self._log_outcome()
        self.end_headers()  # flushes the status line and headers to the client

    def _send(self, status: int, body: bytes = b"", headers=None, content_type="application/json") -> None:
        self._start(status, headers or {}, len(body), content_type)
        if self.command != "HEAD":
            self._write(body)

    def _json(self, obj, status: int = 200, headers=None, content_type="application/json") -> None:
        self._send(status, json.dumps(obj).encode(), headers, content_type)

    def _send_error(self, err: HubError) -> None:
        headers = dict(err.headers)
        headers["X-Error-Message"] = _header_value(err.message)
        if err.code:
            headers["X-Error-Code"] = err.code
        self._json({"error": err.message, **err.extra}, err.status, headers)

    def _write(self, data: bytes) -> None:
        """Write response body bytes, honouring a `truncate` fault."""
        if self._truncate_at is not None:
            keep = max(0, self._truncate_at)
            self.wfile.write(data[:keep])
            self._truncate_at = keep - min(keep, len(data))
            if len(data) > keep:
                self.wfile.flush()
                self._abort_connection(reset=False)  # FIN: the client gets the bytes sent so far
                raise ConnectionError("truncated by fault")
            return
        self.wfile.write(data)

    def _abort_connection(self, reset: bool = True) -> None:
        """End the connection without (completing) an answer; `reset` sends a RST, like a crash."""
        self._log_outcome()
        self.close_connection = True
        try:
            if reset:  # linger 0 turns close() into a RST instead of a polite FIN
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{self.headers.get('Host') or f'{host}:{port}'}"

    def _paginated(self, items: list) -> None:
        """Answer a page of `items` with a GitHub-style Link header to the next one."""
        size = self.hub.page_size
        cursor = int(self.query.get("cursor", ["0"])[0] or 0)
        headers = {}
        if cursor + size < len(items):
            query = {k: v[0] for k, v in self.query.items()} | {"cursor": str(cursor + size)}
            headers["Link"] = f'<{self._base_url()}{self.route_path}?{urlencode(query)}>; rel="next"'
        self._json(items[cursor : cursor + size], headers=headers)
