"""The server object tests hold: it starts and stops the HTTP server in a background thread, and keeps
what outlives one request (tokens, faults, the request log, LFS upload tickets)."""

from __future__ import annotations

import secrets
import sys
import threading
import time
from http.server import ThreadingHTTPServer

from .account import Principal
from .common import DEFAULT_TOKENS, LFS_THRESHOLD, HubError
from .faults import FaultInjector
from .handler import _Handler
from .store import RepoStore


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def handle_error(self, request, client_address):
        pass  # connection resets are expected under fault injection; real errors are answered 500


class HubServer:
    """The fake Hub, in a background thread. Use as a context manager or start()/stop()."""

    def __init__(self, root, tokens: dict | None = None, host: str = "127.0.0.1", port: int = 0,
                 lfs_threshold: int = LFS_THRESHOLD, page_size: int = 1000, verbose: bool = False):  # fmt: skip
        self.store = RepoStore(root)
        self.faults = FaultInjector()
        self.lfs_threshold = lfs_threshold  # files above this many bytes must go through LFS
        self.page_size = page_size  # items per page of tree/commits listings
        self.verbose = verbose
        self._address = (host, port)
        self._tokens: dict[str, Principal] = {}
        for token, cfg in (DEFAULT_TOKENS if tokens is None else tokens).items():
            self.add_token(token, cfg["user"], cfg.get("role", "write"), cfg.get("orgs", ()))
        self._tickets: dict[str, tuple[str, int]] = {}
        self._log: list[dict] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> HubServer:
        self._httpd = _HTTPServer(self._address, _Handler)
        self._httpd.hub = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="hubserver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes up stalled requests
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5)
            self._httpd = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self._httpd.server_address[0]}:{self.port}"

    # -- configuration at runtime ----------------------------------------------------------------

    def add_token(self, token: str, user: str, role: str = "write", orgs=()) -> None:
        if role not in ("read", "write"):
            raise ValueError(f"role must be 'read' or 'write', not {role!r}")
        self._tokens[token] = Principal(user=user, role=role, orgs=tuple(orgs))

    def add_fault(self, kind: str = "status", **fields) -> int:
        """Register a fault (see the module docstring); returns its id."""
        return self.faults.add({"kind": kind, **fields})

    def fault(self, fault_id: int) -> dict:
        """The current state of one fault, including its `hits`."""
        return next(f for f in self.faults.snapshot() if f["id"] == fault_id)

    def clear_faults(self) -> None:
        self.faults.clear()

    def reset(self) -> None:
        self.faults.clear()
        self.clear_log()

    # -- request log -----------------------------------------------------------------------------

    def _open_entry(self, handler: _Handler) -> dict:
        """Log a request on arrival (status None until answered; stays None if dropped)."""
        entry = {
            "method": handler.command, "path": handler.route_path, "status": None,
            "fault": None, "fault_id": None, "user": None, "range": handler.headers.get("Range"),
            "content_length": handler.headers.get("Content-Length"), "duration_s": None,
            "_started": time.monotonic(),
        }  # fmt: skip
        with self._lock:
            entry["seq"] = len(self._log)
            self._log.append(entry)
        return entry

    def _close_entry(self, entry: dict, status: int | None, user: str | None) -> None:
        with self._lock:
            entry.update(status=status, user=user, duration_s=round(time.monotonic() - entry["_started"], 3))
        if self.verbose:
            fault = f" [fault {entry['fault']}]" if entry["fault"] else ""
            print(f"hubserver: {entry['method']} {entry['path']} -> {status}{fault}", file=sys.stderr, flush=True)

    def request_log(self, method: str | None = None, path: str | None = None, status: int | None = None) -> list:
        """Logged requests (oldest first), filtered by method, path substring and status."""
        with self._lock:
            entries = [{k: v for k, v in e.items() if not k.startswith("_")} for e in self._log]
        return [
            e for e in entries
            if (method is None or e["method"] == method)
            and (path is None or path in e["path"])
            and (status is None or e["status"] == status)
        ]  # fmt: skip

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    # -- LFS upload tickets ----------------------------------------------------------------------

    def _new_ticket(self, oid: str, size: int) -> str:
        """An unguessable upload URL component: LFS PUTs carry no Authorization, like S3 URLs."""
        ticket = secrets.token_hex(16)
        with self._lock:
            self._tickets[ticket] = (oid, size)
        return ticket

    def _ticket(self, ticket: str) -> tuple[str, int]:
        with self._lock:
            if ticket not in self._tickets:
                raise HubError(404, "Unknown or expired LFS upload URL")
            return self._tickets[ticket]
