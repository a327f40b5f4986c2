"""When to stop for a time limit: pure rules, no clock and no file. The limit is read by sft/settings/times.py;
the controller measures (controller/timekeeper.py) and asks here at every tick of training whether to save,
upload and stop now.

    stop_for_time(clock)         stop now, or train on; and why

A stop must leave room for the step in progress, the checkpoint's save and its upload, each as measured in
this run (the controller falls back to estimates from the checkpoint's size until one was measured), times
SAFETY, plus MARGIN_S. A run that can finish, final model included, before the limit is never stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

SAFETY = 1.5  # measured times vary (a slower disk write, a busier link): stop with half as much again to spare
MARGIN_S = 10.0  # and this much besides: the controller looks once a second, the uploader's round has a start-up
# Before a save or an upload was measured in this run, their times are estimated from the checkpoint's size at
# these rates: a network disk's write rate, and an upload from a cloud VM to the Hub (both on the slow side).
ASSUMED_SAVE_BYTES_PER_S = 500e6
ASSUMED_UPLOAD_BYTES_PER_S = 50e6

@dataclass(frozen=True)
class Deadline:
    """When the job must be done by, and what said so."""

    at: float  # epoch seconds
    source: str  # "SFT_TIME_LIMIT=3h30m", "SLURM_JOB_END_TIME", ...

    def text(self) -> str:
        return datetime.fromtimestamp(self.at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def earliest(*found: Deadline | None) -> Deadline | None:
    """The first of the limits that are set: each one kills the job when it comes."""
    known = [d for d in found if d is not None]
    return min(known, key=lambda d: d.at) if known else None


@dataclass(frozen=True)
class Clock:
    """What stop_for_time weighs, all in seconds, as the controller measured or estimated them."""

    left: float  # until the deadline
    step: float  # one optimizer step (the one in progress must end before a save)
    save: float  # saving a checkpoint
    upload: float = 0.0  # uploading it (0: no Hub repo)
    steps_left: int | None = None  # to the end of the run; None: unknown
    final: float = 0.0  # at the end: the final model's save and upload
    measured: str = ""  # which figures were measured (the rest estimated), for the reason


@dataclass(frozen=True)
class TimeCall:
    """The rule's answer: stop now or not, the seconds a stop needs, and why."""

    stop: bool
    needed: float
    reason: str


def stop_for_time(c: Clock) -> TimeCall:
    """Stop when what a stop needs (a step, a save, an upload; times SAFETY, plus MARGIN_S) no longer fits in
    the time left, unless the whole rest of the run fits."""
    needed = SAFETY * (c.step + c.save + c.upload) + MARGIN_S
    how = f"a step {c.step:.1f} s, a save {c.save:.1f} s" + (f", an upload {c.upload:.1f} s" if c.upload else "")
    how += f"{f' ({c.measured})' if c.measured else ''}, x{SAFETY:g} + {MARGIN_S:.0f} s = {needed:.0f} s"
    if c.steps_left is not None:
        to_end = SAFETY * (c.steps_left * c.step + c.save + c.final) + MARGIN_S
        if to_end <= c.left:
            return TimeCall(False, needed, f"the run ends before the limit ({to_end:.0f} s needed, {c.left:.0f} s "
                                           "left)")
    if c.left <= needed:
        return TimeCall(True, needed, f"{c.left:.0f} s left before the time limit, and a stop needs {how}")
    return TimeCall(False, needed, f"{c.left:.0f} s left; a stop needs {how}")
