"""What the controller says to the processes it started and leaves waiting: a training launch after the probe's
steps (Verdict), and the standby's processes before the decision (Start, in a StandbyFolder)."""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from .records import Record

@dataclass(frozen=True)
class Verdict(Record):
    """The controller's word to a training launch waiting after the probe's steps: go on as the training, or end
    there (an escalation, the budget's cap or refusal, a stop: the job relaunches or closes)."""

    go_on: bool
    why: str = ""


@dataclass(frozen=True)
class Start(Record):
    """The controller's word to a process it started before deciding (sft/ranks/standby.py): the RunSpec it runs."""

    spec: str  # the RunSpec's path


def lock_held(path: Path | str) -> bool:
    """Whether a live process holds `path` locked (flock, exclusively): the kernel frees a dead holder's lock.
    False where the file is missing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # and with it a shared lock taken just now


@dataclass(frozen=True)
class StandbyFolder:
    """The standby's private folder (controller/standby.py), as the controller and its processes share it."""

    path: Path

    @property
    def ranks(self) -> Path:  # the ranks' Start
        return self.path / "ranks.json"

    @property
    def controller(self) -> Path:  # locked by the controller while it lives (`waits`)
        return self.path / "controller.lock"

    def waits(self) -> bool:
        """Whether the controller that made this folder still lives, and has not ended its standby (the folder
        removed, or the lock free: the controller died without a word)."""
        return lock_held(self.controller)

    @property
    def ahead(self) -> Path:  # FlashAttention-4's process's Start
        return self.path / "ahead.json"

    @property
    def lock(self) -> Path:  # that process's lock (RunSpec.attention_lock)
        return self.path / "attention-kernels.lock"

    @property
    def cache(self) -> Path:  # a link, through which the processes find the compiled kernels (their environment)
        return self.path / "compile-cache"

    @property
    def cache_before_start(self) -> Path:  # where the link points until the Start: not yet the output folder
        return self.path / "compile-cache-before-start"
