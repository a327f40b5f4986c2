"""When to stop for a time limit: pure rules, no clock and no file. The controller measures (controller/timekeeper.py)
and asks here at every tick of training whether to save, upload and stop now.

    parse_limit(text, started)   SFT_TIME_LIMIT: a duration from the job's start, or an end time -> epoch seconds
    parse_slurm_end(text)        SLURM's job end time (SLURM_JOB_END_TIME, or squeue's %e) -> epoch seconds
    stop_for_time(clock)         stop now, or train on; and why

A stop must leave room for the step in progress, the checkpoint's save and its upload, each as measured in
this run (the controller falls back to estimates from the checkpoint's size until one was measured), times
SAFETY, plus MARGIN_S. A run that can finish, final model included, before the limit is never stopped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

SAFETY = 1.5  # measured times vary (a slower disk write, a busier link): stop with half as much again to spare
MARGIN_S = 10.0  # and this much besides: the controller looks once a second, the uploader's round has a start-up
# Before a save or an upload was measured in this run, their times are estimated from the checkpoint's size at
# these rates: a network disk's write rate, and an upload from a cloud VM to the Hub (both on the slow side).
ASSUMED_SAVE_BYTES_PER_S = 500e6
ASSUMED_UPLOAD_BYTES_PER_S = 50e6

DURATION = re.compile(r"^(?:(?P<d>\d+(?:\.\d+)?)d)?(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?"
                      r"(?:(?P<s>\d+(?:\.\d+)?)s)?$")
UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_limit(text: str, started: float) -> float:
    """SFT_TIME_LIMIT as epoch seconds: '3h30m', '90m', '45s', '1d2h' from `started`, or an ISO 8601 end time
    ('2026-12-01T18:00:00Z'; one without a zone is UTC). Raises ValueError saying what is accepted."""
    text = text.strip()
    match = DURATION.match(text.lower())
    if text and match and any(match.groupdict().values()):
        seconds = sum(float(v) * UNIT_SECONDS[k] for k, v in match.groupdict().items() if v)
        if seconds <= 0:
            raise ValueError("expected a duration above zero")
        return started + seconds
    try:
        end = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError("expected a duration such as 3h30m, 90m or 45s, or an end time such as "
                         "2026-12-01T18:00:00Z") from None
    if end.tzinfo is None:
        end = end.replace(tzinfo=timezone.utc)
    return end.timestamp()


def parse_slurm_end(text: str | None, local_zone: timezone | None = None) -> float | None:
    """SLURM's end time of the job: SLURM_JOB_END_TIME's epoch seconds, or squeue's %e ('2026-10-07T15:36:06',
    in the cluster's local time); None when there is none (unset, 'N/A', 'Unknown', an unlimited job)."""
    if not text or not text.strip():
        return None
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return float(text) if int(text) > 0 else None
    try:
        end = datetime.fromisoformat(text)
    except ValueError:
        return None
    if end.tzinfo is None:
        end = end.replace(tzinfo=local_zone) if local_zone else end.astimezone()  # naive: the local time
    return end.timestamp()


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
