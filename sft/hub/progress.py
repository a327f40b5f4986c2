"""An upload's progress while it runs: bytes sent, rate, ETA, in run/upload.json (rewritten every second, for
`status`) and in the log every `every_s` seconds (not per file nor per percent: a log file must stay readable).

huggingface_hub reads an LFS file through CommitOperationAdd.as_file(with_tqdm=True) to send it; its own
progress bars are tqdm's, which either draw on a terminal or print a line per update into a log, and are off
in the job. CountedAdd is that operation with as_file counting the bytes read instead: the one hook the
client offers for it, so the counting is written here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from huggingface_hub import CommitOperationAdd

from ..events import UploadProgress
from ..handoff import write_json

WRITE_EVERY_S = 1.0


class UploadWatch:
    """The upload in progress: fed by CountedAdd, written to `path` and the log by a thread while it runs."""

    def __init__(self, path: Path | None, log: Callable[[str], None], every_s: float = 30.0):
        self.path, self._log, self.every_s = path, log, every_s
        self._lock = threading.Lock()
        self._positions: dict[str, int] = {}
        self._now: UploadProgress | None = None
        self._began = 0.0
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, folder: str, total: int, phase: str) -> None:
        with self._lock:
            self._positions.clear()
            self._now = UploadProgress(folder=folder, bytes_total=total, phase=phase)
            self._began = time.monotonic()
        if self._thread is None or not self._thread.is_alive():
            self._done.clear()
            self._thread = threading.Thread(target=self._report, name="upload-progress", daemon=True)
            self._thread.start()
        self._write()

    def at(self, path: str, position: int) -> None:
        """`path` was read up to `position` (a retry seeks back: its bytes count again as they go again)."""
        with self._lock:
            self._positions[path] = position

    def end(self) -> None:
        with self._lock:
            if self._now is not None:
                self._now.phase, self._now.bytes_sent = "done", self._now.bytes_total
        self._done.set()
        self._write()

    def snapshot(self) -> UploadProgress | None:
        with self._lock:
            if self._now is None:
                return None
            now = self._now
            if now.phase != "done":
                now.bytes_sent = min(sum(self._positions.values()), now.bytes_total)
                now.seconds = round(time.monotonic() - self._began, 1)
            now.updated = time.time()
            return UploadProgress(**now.to_dict())

    def _write(self) -> None:
        if self.path is not None and (now := self.snapshot()) is not None:
            write_json(self.path, now.to_dict())

    def _report(self) -> None:
        last_line = time.monotonic()
        while not self._done.wait(WRITE_EVERY_S):
            self._write()
            if time.monotonic() - last_line >= self.every_s and (now := self.snapshot()) is not None:
                self._log(now.text())
                last_line = time.monotonic()


class CountedAdd(CommitOperationAdd):
    """CommitOperationAdd whose file, as huggingface_hub reads it to send it, tells `watch` how far it got."""

    watch: UploadWatch | None = None

    @contextmanager
    def as_file(self, with_tqdm: bool = False) -> Iterator[BinaryIO]:
        path = self.path_or_fileobj
        if self.watch is None or not isinstance(path, str):
            with super().as_file(with_tqdm=False) as file:
                yield file
            return
        with open(path, "rb") as file:
            read, watch = file.read, self.watch

            def counted(size: int | None = -1) -> bytes:
                data = read(size)
                watch.at(path, file.tell())
                return data

            file.read = counted  # type: ignore[method-assign]  (what huggingface_hub's tqdm_stream_file does)
            yield file


def counted_add(path_in_repo: str, path: Path, watch: UploadWatch | None) -> CountedAdd:
    op = CountedAdd(path_in_repo=path_in_repo, path_or_fileobj=str(path))
    op.watch = watch
    return op
