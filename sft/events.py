"""Watching a run: run/events.jsonl (one JSON line per event, for `tail -f`, a scheduler or a dashboard), and the
two small files `entrypoint.py status` reads while a run goes on, each a typed record:

    Event subclasses   the controller and rank 0 -> run/events.jsonl, appended, never rewritten
    Progress           rank 0 -> run/progress.json: the step, the steps in all, seconds per step, the last save
    UploadProgress     the uploader -> run/upload.json: the folder going up, bytes sent, rate, ETA

Every event line reads {"time": "2026-12-01T10:00:00Z", "event": KIND, ...its fields}, time in UTC.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .console import stamp
from .handoff import Record

_UNWRITABLE: set[Path] = set()  # event logs that could not be appended to (said once each)

EVENTS_FILE = "events.jsonl"  # under OUTPUT/run/
PROGRESS_FILE = "progress.json"
UPLOAD_FILE = "upload.json"


@dataclass(frozen=True)
class Event(Record):
    """One line of run/events.jsonl; KIND names it there ("event")."""

    KIND: ClassVar[str] = ""

    def line(self) -> dict[str, Any]:
        return {"time": stamp(), "event": self.KIND, **self.to_dict()}


@dataclass(frozen=True)
class SettingsResolved(Event):
    KIND: ClassVar[str] = "settings"
    settings: dict[str, Any]
    deadline: str | None = None  # the time limit, UTC, and where it came from
    deadline_source: str | None = None


@dataclass(frozen=True)
class Decided(Event):
    KIND: ClassVar[str] = "decided"
    stage: str
    ranks: int
    resolved: dict[str, Any]
    reasons: dict[str, str]


@dataclass(frozen=True)
class ProbeTry(Event):
    """One short run of the batch search, or the probe: what it ran and how it ended."""

    KIND: ClassVar[str] = "probe_try"
    what: str  # "batch search" or "probe"
    stage: str
    split: str
    outcome: str  # "ok", "out of memory", "failed", "stopped"
    tokens_per_second: float | None = None
    seconds_per_step: float | None = None
    wall_seconds: float | None = None


@dataclass(frozen=True)
class Escalated(Event):
    KIND: ClassVar[str] = "escalation"
    before: str  # the stage, or "checkpointing off"
    after: str
    why: str


@dataclass(frozen=True)
class BudgetChecked(Event):
    KIND: ClassVar[str] = "budget"
    verdict: str  # within, refuse, truncate
    projected_hours: float
    projected_cost: float | None
    max_steps: int | None
    reason: str


@dataclass(frozen=True)
class TrainStarted(Event):
    KIND: ClassVar[str] = "train_started"
    stage: str
    max_steps: int
    resumed_from: str | None = None


@dataclass(frozen=True)
class CheckpointSaved(Event):
    """Rank 0, once the Trainer and DeepSpeed finished writing it (every rank passed the save's barrier)."""

    KIND: ClassVar[str] = "checkpoint_saved"
    step: int
    seconds: float  # from the step's end to the save's end: what a stop for time must leave room for
    path: str


@dataclass(frozen=True)
class CheckpointWritten(Event):
    """Rank 0, once its files of a checkpoint written in the background are all written (ranks/patches/background.py);
    the checkpoint is complete when every rank's are."""

    KIND: ClassVar[str] = "checkpoint_written"
    step: int
    seconds: float  # from the first file's copy to the last file's rename, while the steps went on
    bytes: int
    path: str


@dataclass(frozen=True)
class UploadStarted(Event):
    KIND: ClassVar[str] = "upload_started"
    folder: str
    bytes: int


@dataclass(frozen=True)
class UploadFinished(Event):
    KIND: ClassVar[str] = "upload_finished"
    folder: str
    bytes: int
    seconds: float  # snapshot, hashing and both commits
    mb_per_s: float | None
    ok: bool = True
    error: str | None = None


@dataclass(frozen=True)
class HubBehind(Event):
    """After each upload round: how far the Hub trails the disk."""

    KIND: ClassVar[str] = "hub_behind"
    checkpoints: int
    minutes: float
    newest_on_hub: str | None


@dataclass(frozen=True)
class Evaluated(Event):
    KIND: ClassVar[str] = "eval"
    step: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class StopRequested(Event):
    KIND: ClassVar[str] = "stop_requested"
    reason: str  # "SIGTERM", "SIGINT" or "time limit"
    detail: str = ""


@dataclass(frozen=True)
class Ended(Event):
    KIND: ClassVar[str] = "end"
    status: str
    exit_code: int


KINDS: dict[str, type[Event]] = {cls.KIND: cls for cls in Event.__subclasses__()}


class EventLog:
    """Appends events to run/events.jsonl from any process or thread; None path: a log that writes nothing."""

    def __init__(self, path: Path | str | None):
        self.path = Path(path) if path else None

    def emit(self, event: Event) -> None:
        if self.path is None:
            return
        data = (json.dumps(event.line(), default=str) + "\n").encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # One write() on an O_APPEND descriptor: lines from rank 0, the controller and its uploader thread never
            # interleave, and a reader never sees half a line but at the very end while it is written.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as e:  # a full or read-only disk: the job's own exit code and message say what happened;
            # the watchers' line is lost, said once
            if self.path not in _UNWRITABLE:
                _UNWRITABLE.add(self.path)
                print(f"warning: could not append to {self.path} ({e.strerror or e}): its watchers miss the "
                      "events from here on", file=sys.stderr, flush=True)


def read_events(path: Path) -> list[tuple[str, Event]]:
    """(time, event) for every whole line of a known kind, oldest first."""
    found: list[tuple[str, Event]] = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line being written
        kind = KINDS.get(data.get("event")) if isinstance(data, dict) else None
        if kind is not None:
            found.append((data.get("time", ""), kind.from_dict(data)))
    return found


@dataclass
class Progress(Record):
    """Where training is, as rank 0 last wrote it (run/progress.json)."""

    step: int = 0
    max_steps: int = 0
    epoch: float = 0.0
    updated: float = field(default_factory=time.time)  # wall clock, seconds since the epoch
    seconds_per_step: float | None = None  # over the last steps, saves excluded
    last_save_step: int | None = None
    last_save_seconds: float | None = None

    def eta_seconds(self) -> float | None:
        if not self.seconds_per_step or not self.max_steps:
            return None
        return max(self.max_steps - self.step, 0) * self.seconds_per_step


@dataclass
class UploadProgress(Record):
    """The upload going on now, as the uploader last wrote it (run/upload.json); done once it finished."""

    folder: str = ""
    bytes_total: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0
    phase: str = "uploading"  # hashing, uploading, done
    updated: float = field(default_factory=time.time)

    @property
    def rate(self) -> float | None:
        """Bytes per second so far."""
        return self.bytes_sent / self.seconds if self.seconds > 0 and self.bytes_sent else None

    def eta_seconds(self) -> float | None:
        rate = self.rate
        return (self.bytes_total - self.bytes_sent) / rate if rate else None

    def text(self) -> str:
        """'checkpoint-8: 1.2 GB of 4.0 GB (30%), 95.1 MB/s, about 29 s left'."""
        from .units import size_text

        share = f" ({self.bytes_sent / self.bytes_total:.0%})" if self.bytes_total else ""
        rate, eta = self.rate, self.eta_seconds()
        speed = f", {rate / 1e6:.1f} MB/s" if rate else ""
        left = f", about {eta:.0f} s left" if eta is not None and self.phase == "uploading" else ""
        return f"{self.folder}: {self.phase} {size_text(self.bytes_sent)} of {size_text(self.bytes_total)}" \
               f"{share}{speed}{left}"

