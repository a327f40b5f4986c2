"""Ranks that have made no step for a long time, said in the log while the job waits for them.

A rank that hangs (a lock a killed process left, a collective one rank never joined, a filesystem that stopped
answering) prints nothing, and neither does a job waiting on it: a CI run's demo sat silent for 89 minutes. The
controller already waits on the launcher once a second (launch.Launch.wait); it also looks at rank 0's progress
(run/progress.json, rewritten at least every few seconds while steps run) and events, and after STALLED_AFTER_S
without either says so once, then again each time the silence has doubled, with what to run to see where the
ranks wait. It stops nothing: a save or an evaluation of a large model may be slow, not stuck; a supervisor decides
with `status --check` (the same threshold by default; docs/running.md).
"""

from __future__ import annotations

import time
from pathlib import Path

from ..console import say
from ..events import EVENTS_FILE, PROGRESS_FILE, Progress
from .status import STALLED_AFTER_S

class Silence:
    """Watches one training launch's ranks from the launcher's wait loop (`look`, once a second: a stat and a small
    JSON file read)."""

    def __init__(self, run_dir: Path, launcher_pid: int, after_s: float = STALLED_AFTER_S):
        self.run_dir, self.launcher_pid, self.after_s = run_dir, launcher_pid, after_s
        self.began = time.time()
        self.said_at: float | None = None  # the silence (seconds) the last warning was for; None: none said since

    def look(self, now: float | None = None) -> str | None:
        """The warning said now, if one is due; None otherwise."""
        now = time.time() if now is None else now
        progress = Progress.load(self.run_dir / PROGRESS_FILE)
        signs = [self.began, progress.updated if progress else 0.0, _mtime(self.run_dir / EVENTS_FILE)]
        quiet = now - max(signs)
        if quiet < self.after_s:
            self.said_at = None
            return None
        if self.said_at is not None and quiet < 2 * self.said_at:
            return None
        self.said_at = quiet
        where = (f"the last at step {progress.step} of {progress.max_steps}" if progress and progress.updated >= self.began
                 else "none since the ranks started")
        message = (f"warning: the ranks have made no training step for {quiet / 60:.0f} min ({where}). A save or an "
                   f"evaluation of a large model can take long; if nothing moves, they may hang: `ps --ppid "
                   f"{self.launcher_pid}` lists them and `py-spy dump --pid PID` shows where one waits "
                   "(docs/troubleshooting.md). The job waits on.")
        say(message)
        return message


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
