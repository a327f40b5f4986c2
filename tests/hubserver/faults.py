"""Fault injection: what a test can make the server do wrong, and how a request acts it out.

Faults (``HubServer.add_fault(kind, **fields)`` or ``POST /_test/faults``), matched against the
request method and a substring of the URL path, each used ``count`` times (None = forever) and
counted in ``hits``:
  status    answer ``status`` (default 500) instead of handling the request; a 429 carries
            ``Retry-After: retry_after`` (default 1).
  stall     sleep ``seconds`` before handling the request normally.
  drop      read ``after_bytes`` of the request body, then reset the connection without answering
            (a connection dropped mid-upload).
  truncate  handle the request, but reset the connection after ``after_bytes`` of the response body.

What the real client (huggingface_hub 2.4.0) retries by itself (``http_backoff``: 408/429/500/502/
503/504 and network errors, 5 retries, 1s, 2s, 4s... backoff; a 429 waits ``Retry-After`` + 1 s):
  retried:     preupload POST, LFS batch POST, LFS PUT (also on a dropped connection), LFS verify,
               tree/commits listing GETs (pagination), file download GET (only 408/429 and dropped
               connections; it resumes with a Range header from the last full 10 MiB
               DOWNLOAD_CHUNK_SIZE written, so a cut in the first 10 MiB restarts from 0); the
               HEAD on /resolve is retried by hf_hub_download with backoff after a first failed
               attempt, if the file is not already cached.
  not retried: whoami, create_repo, repo_info (so snapshot_download fails on a 5xx there, with
               LocalEntryNotFoundError when nothing is cached), settings, paths-info, validate-yaml
               and the commit POST (a 5xx or a dropped connection there surfaces as an exception to
               the caller).
"""

from __future__ import annotations

import dataclasses
import threading

from .common import HubError

FAULT_KINDS = ("status", "stall", "drop", "truncate")


@dataclasses.dataclass
class Fault:
    kind: str = "status"
    count: int | None = 1  # how many matching requests it hits; None = all of them
    method: str | None = None  # e.g. "PUT"; None = any
    path: str | None = None  # substring of the URL path; None = any
    status: int = 500  # kind=status
    retry_after: int | None = None  # kind=status: Retry-After header (a 429 defaults to 1)
    seconds: float = 0.0  # kind=stall
    after_bytes: int = 0  # kind=drop (request body) / truncate (response body)
    id: int = 0
    hits: int = 0

    @classmethod
    def from_dict(cls, spec: dict) -> Fault:
        names = {f.name for f in dataclasses.fields(cls)} - {"id", "hits"}
        unknown = set(spec) - names
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        fault = cls(**spec)
        if fault.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {fault.kind!r}; expected one of {FAULT_KINDS}")
        if fault.kind == "status" and fault.status == 429 and fault.retry_after is None:
            fault.retry_after = 1
        return fault

    def matches(self, method: str, path: str) -> bool:
        if self.count is not None and self.hits >= self.count:
            return False
        if self.method and self.method.upper() != method:
            return False
        return not self.path or self.path in path


class FaultInjector:
    """Thread-safe list of faults; the first matching, unexhausted fault wins."""

    def __init__(self):
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._next_id = 1

    def add(self, spec: dict) -> int:
        fault = Fault.from_dict(spec)
        with self._lock:
            fault.id, self._next_id = self._next_id, self._next_id + 1
            self._faults.append(fault)
        return fault.id

    def take(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path):
                    fault.hits += 1
                    return dataclasses.replace(fault)
        return None

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def snapshot(self) -> list[dict]:
        with self._lock:
            return [dataclasses.asdict(f) for f in self._faults]


class FaultActions:
    """How a request handler acts out the fault it drew (the `truncate` part lives in its `_write`)."""

    def _apply_fault(self, fault: Fault) -> bool:
        """Act out a fault; True if that answered (or killed) the request."""
        if fault.kind == "stall":
            self.hub._stopping.wait(fault.seconds)
            return False
        if fault.kind == "truncate":
            self._truncate_at = fault.after_bytes
            return False
        if fault.kind == "drop":
            self._drop(fault.after_bytes)
            return True
        headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
        self._send_error(HubError(fault.status, f"Injected fault #{fault.id}", headers=headers))
        return True

    def _drop(self, after_bytes: int) -> None:
        """Read up to `after_bytes` of the body, then reset the connection without answering."""
        seen = 0
        try:
            for piece in self._iter_body():
                seen += len(piece)
                if seen >= after_bytes:
                    break
        except ConnectionError:
            pass
        self._abort_connection()
