"""A node's heartbeat to node 0's store (sft/controller/coordinate.py), and the job's pulse in its output folder
(`status --check`)."""

from __future__ import annotations

import threading
from pathlib import Path
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


PULSE_FILE = "heartbeat"  # under OUTPUT/run/: its modification time is the controller's last sign of life
PULSE_S = 15.0


class Pulse:
    """The controller's sign of life for `status --check` (a Kubernetes exec probe, a cron job): OUTPUT/run/heartbeat
    touched every PULSE_S seconds while the job holds the output folder, from a thread, so a long download or data
    step that writes nothing else still shows the process alive. It says the controller lives, not that training
    moves: the check reads the steps (run/progress.json) for that."""

    def __init__(self, run_dir: Path, every_s: float = PULSE_S):
        self.path, self.every_s, self.stopped = Path(run_dir) / PULSE_FILE, every_s, threading.Event()
        self.thread = threading.Thread(target=self._beat, name="pulse", daemon=True)

    def __enter__(self) -> Pulse:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join(timeout=self.every_s + 5)

    def _beat(self) -> None:
        while not self.stopped.is_set():
            try:
                self.path.touch()  # its modification time set to now
            except OSError:
                pass  # a full or read-only disk: the check then finds the pulse old, which is what it is
            self.stopped.wait(self.every_s)
