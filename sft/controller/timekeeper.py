"""The time limit, carried out: find the deadline at start (SFT_TIME_LIMIT, SLURM's end time), and while the
ranks train, measure what a stop needs and stop them in time (the planner's rule, planner/deadline.py).

A stop goes the way a SIGTERM's does: the stop file every rank polls (launch.Stopper), a checkpoint saved at
the end of the step, the uploader's flush; then the job exits exitcodes.TIME_LIMIT and a new start resumes.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from ..console import say
from ..events import PROGRESS_FILE, Progress
from ..planner.deadline import (ASSUMED_SAVE_BYTES_PER_S, ASSUMED_UPLOAD_BYTES_PER_S, Clock, Deadline, TimeCall,
                                earliest, stop_for_time)
from ..settings import Settings
from ..settings.times import parse_limit, parse_slurm_end
from .launch import Stopper

TICK_S = 1.0  # how often training is looked at
SQUEUE_TIMEOUT_S = 10


def find_deadline(s: Settings, environ: Mapping[str, str], started: float) -> Deadline | None:
    """The earliest of SFT_TIME_LIMIT (from `started`) and SLURM's end time for this job, if any is set."""
    mine = Deadline(parse_limit(s.time_limit, started), f"SFT_TIME_LIMIT={s.time_limit}") if s.time_limit else None
    return earliest(mine, slurm_deadline(environ))


def slurm_deadline(environ: Mapping[str, str]) -> Deadline | None:
    """SLURM_JOB_END_TIME (exported in the job's environment by SLURM 20.11 and later), else squeue's %e."""
    if at := parse_slurm_end(environ.get("SLURM_JOB_END_TIME")):
        return Deadline(at, "SLURM_JOB_END_TIME")
    job = environ.get("SLURM_JOB_ID")
    if not job or shutil.which("squeue") is None:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True, text=True,
                             timeout=SQUEUE_TIMEOUT_S, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    at = parse_slurm_end(out.strip())
    return Deadline(at, f"squeue's end time of SLURM job {job}") if at else None


class TimeKeeper:
    """Watches the run against its deadline; asks the planner's rule once a second while the ranks train."""

    def __init__(self, deadline: Deadline, run_dir: Path, stopper: Stopper, checkpoint_bytes: int,
                 final_bytes: int, uploads: bool, uploader=None):
        self.deadline, self.run_dir, self.stopper, self.uploader = deadline, run_dir, stopper, uploader
        self.ckpt_bytes, self.final_bytes, self.uploads = checkpoint_bytes, final_bytes, uploads
        self.step_s: float | None = None  # the probe's, until training measures its own
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._since = time.time()

    def seconds_left(self) -> float:
        return self.deadline.at - time.time()

    def clock(self) -> Clock:
        """What a stop needs now: measured in this run where it was (progress.json, the uploader), else estimated."""
        progress = Progress.load(self.run_dir / PROGRESS_FILE)
        if progress is not None and progress.updated < self._since:
            progress = None  # an earlier start's
        measured = []
        step = progress.seconds_per_step if progress and progress.seconds_per_step else self.step_s
        save = progress.last_save_seconds if progress and progress.last_save_seconds else None
        if save is not None:
            measured.append("save measured")
        upload = self.uploader.last_upload_seconds() if self.uploader is not None else None
        if upload is not None:
            measured.append("upload measured")
        steps_left = progress.max_steps - progress.step if progress and progress.max_steps else None
        if upload is None:
            upload = self.ckpt_bytes / ASSUMED_UPLOAD_BYTES_PER_S if self.uploads else 0.0
        final = self.final_bytes / ASSUMED_SAVE_BYTES_PER_S
        final += self.final_bytes / ASSUMED_UPLOAD_BYTES_PER_S if self.uploads else 0.0
        return Clock(left=self.seconds_left(), step=step or 0.0,
                     save=save if save is not None else self.ckpt_bytes / ASSUMED_SAVE_BYTES_PER_S,
                     upload=upload, steps_left=steps_left, final=final,
                     measured=", ".join(measured) or "estimated from the checkpoint's size")

    def before_training(self, step_s: float | None) -> TimeCall:
        """Whether training can start at all: one step, a save and an upload must fit before the limit."""
        self.step_s = step_s
        return stop_for_time(self.clock())

    def start(self) -> None:
        """Watch while the ranks train (a thread: the main thread waits on the launcher)."""
        self._since = time.time()
        self._thread = threading.Thread(target=self._watch, name="time-limit", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(5)

    def _watch(self) -> None:
        while not self._done.wait(TICK_S):
            if self.stopper.requested:
                return
            call = stop_for_time(self.clock())
            if call.stop:
                say(f"time limit: stopping now to save and upload a checkpoint before {self.deadline.text()} "
                    f"({self.deadline.source}): {call.reason}")
                self.stopper.request("time limit", call.reason)
                return


@contextlib.contextmanager
def watching(keeper: TimeKeeper | None, uploader=None) -> Iterator[None]:
    """The keeper's watch while the ranks train (nothing without a time limit); it knows the uploader's last
    upload, to leave room for the next."""
    if keeper is None:
        yield
        return
    keeper.uploader = uploader
    keeper.start()
    try:
        yield
    finally:
        keeper.stop()
