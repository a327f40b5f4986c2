"""The training, carried out: the epoch(s) in the probe's launch where it goes on, else a launch of its own, with the
uploader and the time limit's watch running meanwhile; then how it ended (job.py closes the run with it)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import exitcodes
from ..checkpoints import remove_retired
from ..console import say
from ..events import StopRequested, TrainStarted
from ..planner.decision import Decision
from . import budget, failure, figures, reshard, summary, timekeeper, uploads
from .output import plot_ahead
from .runs import Held, Runner


@dataclass(frozen=True)
class Ending:
    """How a start ends: its exit code and status, and what the closing must still end or flush."""

    code: int
    status: str
    held: Held | None = None  # the training's launch, left waiting after the probe: it ends, saving nothing
    uploader: Any = None  # the checkpoints' uploader, running since the training began
    clock: timekeeper.TimeKeeper | None = None  # the time limit's watch: a stop for time uploads in what is left


def train(job: Runner, parts: summary.Parts, target, held: Held | None, resume: Path | None) -> Ending:
    """The epoch(s), from the probe's launch where it goes on (else a launch of its own), the uploader and the time
    limit's watch running meanwhile; how it ended."""
    s, d, stopper = job.s, parts.decision, job.stopper
    probed = (parts.probe.figures if parts.probe else None) or {}  # the probe's figures (none on a resume)
    max_steps = d.max_steps or s.max_steps
    if held is not None and max_steps != held.spec.max_steps:  # its schedule is for more steps
        say("train: launched again, for the steps the budget capped; the probe's launch ends")
        held.end("the budget capped the run's steps")
        held = None
    if stopper.requested:
        return Ending(exitcodes.STOPPED, "stopped", held)
    clock = watch(job, parts, d)
    if clock is not None and (call := clock.before_training(probed.get("seconds_per_step"))).stop:
        say(f"error: time limit: no time left to train before {clock.deadline.text()}: {call.reason}")
        job.events.emit(StopRequested(reason="time limit", detail=call.reason))
        return Ending(exitcodes.TIME_LIMIT, "stopped for time", held)
    probed_at = probed.get("steps")  # the probe's steps, fewer where the run is shorter
    where = (f"resuming from {resume}" if resume else f"going on from the probe's step {probed_at}, in its launch"
             if held else "from the start")
    say(f"train: ZeRO {d.stage.name}, {where}")
    uploader = uploads.start(s, target, job.paths, job.events)
    plot_ahead()  # the loss plot's library loaded meanwhile: the end then only draws it
    job.events.emit(TrainStarted(stage=d.stage.name, max_steps=max_steps, resumed_from=parts.resumed_from and
                                 str(parts.resumed_from)))
    started = held.began if held else time.time()  # a launch that went on from the probe: from its start
    with timekeeper.watching(clock, uploader):
        if held is not None:
            held.go_on()
            code, reports = held.finish()
        else:
            code, reports = job.run(job.spec(d, "train", job.paths.out, max_steps, resume))
    remove_retired(job.paths.out)  # what a finished run's ranks left to a removal behind their end: gone before the job
    parts.train = result = summary.TrainResult.of(reports, time.time() - started, probed_at if held else None)
    parts.phases.done("train")
    if d.reshard is not None:
        reshard.tidy(job.paths)
    planned = budget.sizes(d, job.total_params, s.extra_trainer_args)[0] if job.total_params else None
    return Ending(*ended(job, parts, code, result, planned), uploader=uploader, clock=clock)


def watch(job: Runner, parts: summary.Parts, d: Decision) -> timekeeper.TimeKeeper | None:
    """With a time limit: its watch for training (None without one)."""
    if parts.time_limit is None:
        return None
    checkpoint, final = budget.sizes(d, job.total_params, job.s.extra_trainer_args)
    return timekeeper.TimeKeeper(parts.time_limit, job.paths.run, job.stopper, checkpoint, final, uploads=job.uploads)


def ended(job: Runner, parts: summary.Parts, code: int, result: summary.TrainResult,
          checkpoint_bytes: int | None = None) -> tuple[int, str]:
    """How the training ended, as an exit code and a status (the probe's prediction checked against it);
    checkpoint_bytes: a checkpoint's planned size, to tell a full disk by where none was saved yet."""
    probed = (parts.probe.figures if parts.probe else None) or {}
    if (check := figures.against_run(probed, result.to_dict())) is not None:
        parts.probe_check = check
        say(figures.against_run_line(check))
    stopper = job.stopper
    if stopper.reason == "time limit":
        return exitcodes.TIME_LIMIT, "stopped for time"
    if result.stop_reason and not stopper.requested:  # the ranks stopped before the disk filled
        say(f"error: {result.stop_reason}")
        return exitcodes.PREFLIGHT, "stopped: disk"
    if stopper.requested or result.status == "stopped":
        return exitcodes.STOPPED, "stopped"
    if code != 0 or result.status != "done":
        failure.after(job.paths.out, checkpoint_bytes, result.error)
        why = f": {result.error}" if result.error else failure.no_report(code) if result.status is None else ""
        say(f"error: training failed (launcher exit code {code}{why}); complete checkpoints are kept and a new start "
            "resumes from the newest")
        return exitcodes.TRAIN_FAILED, "failed"
    return exitcodes.DONE, "done"
