"""A node's heartbeat to node 0's store (sft/controller/coordinate.py)."""

from __future__ import annotations

import threading
from typing import Any


class Heartbeat:
    """Tells node 0's store this node is alive until stopped, and is joined before exit: a daemon thread inside
    the store's C++ call at finalization aborts the process (exit -6 after a finished job, seen once in CI)."""

    def __init__(self, store: Any, key: str, every_s: float):
        self.store, self.key, self.every_s, self.stopped = store, key, every_s, threading.Event()
        self.thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.thread.start()
        return self

    def _beat(self) -> None:
        while not self.stopped.is_set():
            try:
                self.store.add(self.key, 1)
            except RuntimeError:
                return  # node 0 is gone; the main loop finds out at its next look and says so
            self.stopped.wait(self.every_s)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=self.every_s + 10)  # a store call in flight returns or times out first
