"""The job, in the controlling process: a recipe that reads top to bottom.

    run      every node: the machine measured, the other nodes joined; node 0 leads, the others follow its launches
    lead     node 0, before anything is written (a refusal here leaves the output folder as it was): a finished run,
             the Hub, the data; then, holding the output folder's lock:
    recipe   prepare (decide) -> preflight -> probe -> budget -> reshard -> train -> close

The decision is made once (prepare.py -> planner/decide.py); this module carries it out. The ranks run
sft/ranks/train.py through the launcher (launch.py, runs.py); the Hub side is uploads.py. Each step hands back a
typed part, and the summary is built from them at the end (summary.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from .. import exitcodes, nodes
from ..console import say
from ..data import DataError
from ..events import EVENTS_FILE, BudgetChecked, Decided, Ended, EventLog, SettingsResolved, StopRequested, TrainStarted
from ..handoff import write_json
from ..hub.errors import HubError
from ..planner import decide, restart
from ..planner.decision import Decision
from ..planner.inputs import GPU, CannotRun, Ranks
from ..planner.plan import format_table
from ..settings import Settings, refusal
from . import (budget, coordinate, data, failure, figures, machine, outlock, preflight, probe, reshard, summary,
               timekeeper, uploads)
from .launch import Stopper
from .output import Paths
from .prepare import prepare
from .runs import Held, Runner
from .standby import Standby


def run(s: Settings, ranks: Ranks, gpus: tuple[GPU, ...], import_check: machine.ImportCheck | None = None,
        standby: Standby | None = None, probe_only: bool = False) -> int:
    """The whole job; its exit code. What the entrypoint started before reading the settings' inputs:
    `import_check`, FlashAttention-4's; `standby`, the ranks, for the first launch (ended with the job if none took
    them over)."""
    started_at = machine.process_started_at()  # the job's figures count from it: what a user waits
    where = nodes.from_env(os.environ)
    try:
        facts = machine.measure(s.output_dir, where.nnodes, s.attention, early=import_check, found=gpus)
        team = coordinate.join(s, where, ranks)
        if not team.leads:
            return team.follow(Stopper())
        code = exitcodes.FAILED  # an exception here must still release the other nodes
        try:
            code = lead(Job(s, team, Paths(s.output_path), Stopper(), started_at, standby), facts, probe_only)
        finally:
            team.finish(code)
        return code
    except coordinate.NodesFailed as e:
        say(f"error: {e}")
        return exitcodes.PREFLIGHT
    finally:
        if standby is not None:
            standby.end()


@dataclass(frozen=True)
class Job:
    """What every step of one start on node 0 works with."""

    s: Settings
    team: coordinate.Team
    paths: Paths
    stopper: Stopper
    started_at: float
    standby: Standby | None = None

    @property
    def events(self) -> EventLog:
        return EventLog(self.paths.run / EVENTS_FILE)


def lead(job: Job, facts: machine.Facts, probe_only: bool) -> int:
    """Node 0: nothing is written until the data is read and checked, then the output folder's lock is held."""
    s, paths = job.s, job.paths
    if not probe_only and (code := finished_before(s, paths)) is not None:
        return code
    try:
        target = uploads.connect(s)
        if not probe_only and uploads.already_done(target):
            return exitcodes.DONE
        found = data.read(s, job.team.ranks)  # bad data writes nothing, not even the lock
    except HubError as e:
        say(f"error: {e.message}")
        return e.exit_code
    except DataError as e:
        say(refusal("data is", e.problems))
        return exitcodes.BAD_SETTINGS
    say("\n".join(found.notes))
    try:
        with outlock.take(paths.out):
            return recipe(job, facts, target, found, probe_only)
    except outlock.Busy as e:
        say(f"error: {e}")
        return exitcodes.OUTPUT_BUSY
    except OSError as e:  # the output folder cannot be written (a full disk): nothing has run yet
        say(f"error: cannot write in {paths.out} ({e.strerror or e}): free space or fix its permissions, then "
            "start again")
        return exitcodes.PREFLIGHT


def recipe(job: Job, facts: machine.Facts, target, found: data.Found, probe_only: bool) -> int:
    """The job holding its output folder: every step in order; each exit closes with the summary of the parts."""
    s, paths, stopper, events = job.s, job.paths, job.stopper, job.events
    parts = summary.Parts(s, job.team.nodes.nnodes, job.started_at, summary.Phases(job.started_at), found=found)
    try:
        stopper.on_request = lambda reason, detail: events.emit(StopRequested(reason=reason, detail=detail))
        stopper.install()
        paths.stop_file.unlink(missing_ok=True)  # a stop of an earlier start must not stop this one
        write_json(paths.run / "settings.json", s.to_dict())
        parts.time_limit = time_limit(s, events)
        parts.resumed_from = resume = uploads.resume_point(paths, target)
    except HubError as e:
        say(f"error: {e.message}")
        return e.exit_code
    runner = Runner(s, job.team, paths, stopper, job.started_at, job.standby)  # the standby: its first launch's
    try:
        facts = machine.settled(facts)  # FlashAttention-4's import check, run meanwhile
        prepared = prepare(s, facts, job.team.ranks, found=found, resume=resume)
    except CannotRun as e:
        say(f"error: {e}")
        return close(job, parts, target, e.exit_code, "preflight failed")
    parts.decision = d = decided(prepared.decision, events)
    parts.plan = d.plan  # the plan the start decided on, whatever the probe changes after
    runner.total_params, runner.uploads = prepared.inputs.shape.total_params, target is not None
    facts = machine.measure_links(facts, d.ranks)
    parts.phases.done("start_to_decision")
    def recheck(nxt: Decision) -> int | None:  # each decision the probe moves to is checked as this one is
        return preflight_of(job, facts, nxt, prepared.inputs, probe_only, parts)

    if (code := recheck(d)) is not None:
        return close(job, parts, target, code, "preflight failed")
    held = None
    if s.probe_steps > 0 and resume is None:
        parts.phases.done("preflight")
        d, held, ending = probed(job, runner, parts, prepared.inputs, recheck, probe_only)
        if ending is not None:
            return close(job, parts, target, *ending, held=held)
    elif probe_only:
        say("nothing to probe (SFT_PROBE_STEPS=0, or resuming a run already probed)")
        return exitcodes.DONE
    if d.reshard is not None:  # written by another number of ranks: converted first
        try:
            converted = reshard.convert(resume, d.reshard, paths)
        except reshard.Failed as e:
            say(f"error: {e}")
            stopped = stopper.requested  # the converter got the signal too
            return close(job, parts, target, exitcodes.STOPPED if stopped else e.exit_code, "reshard failed")
        parts.reshard, resume = converted.summary, converted.path
        parts.phases.done("reshard")
    return train(job, runner, parts, target, held, resume)


def probed(job: Job, runner: Runner, parts: summary.Parts, given, recheck, probe_only: bool
           ) -> tuple[Decision, Held | None, tuple[int, str] | None]:
    """The batch search and the probe, then the budget gate on its projection: the decision as they leave it, the
    training's launch where it waits after the probe's steps, and (exit code, status) where the job ends here."""
    parts.probe = outcome = probe.probe(runner, given, parts.decision, recheck, train_on=not probe_only)
    parts.decision = d = outcome.decision
    parts.phases.done("batch_search_and_probe")
    if outcome.code == exitcodes.DONE:
        parts.budget = call = budget_of(job.s, outcome, runner, d, job.events, probe_only)
        if call.verdict == "truncate" and not probe_only:
            parts.decision = d = decide.cap_steps(d, call.max_steps, "the steps that fit the budget "
                                                                     "(SFT_BUDGET_ACTION=truncate)")
        if call.verdict == "refuse" and not probe_only:
            return d, outcome.held, (exitcodes.OVER_BUDGET, "over budget")
    if outcome.code != exitcodes.DONE or probe_only:
        status = {exitcodes.DONE: "probed", exitcodes.STOPPED: "stopped"}.get(outcome.code, "probe failed")
        return d, outcome.held, (outcome.code, status)
    return d, outcome.held, None


def finished_before(s: Settings, paths: Paths) -> int | None:
    """A finished run in the folder (read only): with these settings nothing to do, with others an error."""
    before = paths.finished_settings()
    if before is None:
        return None
    same, message = restart.verdict(before, s.to_dict(), Settings().to_dict(), str(paths.out))
    say(message if same else f"error: {message}")
    return exitcodes.DONE if same else exitcodes.BAD_SETTINGS


def time_limit(s: Settings, events: EventLog):
    """The time limit found (SFT_TIME_LIMIT, SLURM's end time), said, and the settings' event."""
    deadline = timekeeper.find_deadline(s, os.environ, time.time())
    if deadline is not None:
        say(f"time limit: {deadline.text()} ({deadline.source}); a checkpoint is saved and uploaded before it, then "
            f"exit {exitcodes.TIME_LIMIT}")
    events.emit(SettingsResolved(settings=s.to_dict(), deadline=deadline and deadline.text(),
                                 deadline_source=deadline and deadline.source))
    return deadline


def decided(d: Decision, events: EventLog) -> Decision:
    """The decision in the log (the plan's table, then one line per choice: the stage's is the one choice line)."""
    say(format_table(d.plan))
    say("decided:\n" + d.explain())
    events.emit(Decided(stage=d.stage.name, ranks=d.ranks.world, resolved=d.resolved(), reasons=dict(d.reasons)))
    return d


def preflight_of(job: Job, facts: machine.Facts, d: Decision, given, probe_only: bool, parts: summary.Parts
                 ) -> int | None:
    """The machine's facts against this decision's needs; an exit code when it cannot run."""
    # the probe alone writes no checkpoint: its disk needs are not the run's
    needs = preflight.Needs.of(d, None if probe_only else given.shape.total_params, job.s.save_total_limit,
                               job.s.extra_trainer_args)
    parts.preflight = checks = preflight.run(facts, needs)
    say("preflight:\n" + preflight.format_checks(checks))
    if preflight.failed(checks):
        say("error: preflight found problems that make this run impossible (above)")
        return exitcodes.PREFLIGHT
    return None


def budget_of(s: Settings, outcome: probe.Outcome, runner: Runner, d: Decision, events: EventLog,
              probe_only: bool):
    """The budget gate on the probe's projection, said, and its event."""
    call = budget.check(s, outcome.figures or {}, runner.overheads(d), d.ranks.world)
    budget.report(call, refusing=not probe_only)
    if call.verdict != "none":
        fig = outcome.figures or {}
        events.emit(BudgetChecked(verdict=call.verdict, projected_hours=fig.get("projected_hours", 0.0),
                                  projected_cost=fig.get("projected_cost"), max_steps=call.max_steps,
                                  reason=call.reason))
    return call


def close(job: Job, parts: summary.Parts, target, code: int, status: str, held: Held | None = None,
          uploader=None, clock: timekeeper.TimeKeeper | None = None) -> int:
    """The summary and the loss plot; with a repo, the last uploads. Returns the job's exit code."""
    if held is not None:  # the training's launch, left waiting after the probe: it ends, saving nothing
        held.end(status)
    written = summary.build(parts, code, status)
    summary.write(written, job.paths, job.s.model)
    if uploader is None and code == exitcodes.STOPPED:  # a stop among the probe's steps, in the training's launch,
        # saved them before the uploader began (at the verdict): the flush below sends them
        uploader = uploads.start(job.s, target, job.paths, job.events, begin=False)
    if uploader is not None:
        stopper = job.stopper
        grace = (clock.seconds_left() if stopper.reason == "time limit" and clock
                 else uploads.grace_left(job.s, stopper.requested_at))
        after, parts.hub = uploads.finish(uploader, code, job.paths, written, grace)
        parts.phases.done("final_uploads")
        summary.write(summary.build(parts, code, status), job.paths)  # its exit code: the training's
        code = after
    say(f"{status}: exit code {code}; summary in {job.paths.summary}")
    job.events.emit(Ended(status=status, exit_code=code))
    return code


def train(job: Job, runner: Runner, parts: summary.Parts, target, held: Held | None, resume: Path | None) -> int:
    """The epoch(s), from the probe's launch where it goes on (else a launch of its own), the uploader and the time
    limit's watch running meanwhile; then close."""
    s, d, stopper = job.s, parts.decision, job.stopper
    probed = (parts.probe.figures if parts.probe else None) or {}  # the probe's figures (none on a resume)
    max_steps = d.max_steps or s.max_steps
    if held is not None and max_steps != held.spec.max_steps:  # its schedule is for more steps
        say("train: launched again, for the steps the budget capped; the probe's launch ends")
        held.end("the budget capped the run's steps")
        held = None
    if stopper.requested:
        return close(job, parts, target, exitcodes.STOPPED, "stopped", held=held)
    clock = watch(job, parts, d, runner.total_params, runner.uploads)
    if clock is not None and (call := clock.before_training(probed.get("seconds_per_step"))).stop:
        say(f"error: time limit: no time left to train before {clock.deadline.text()}: {call.reason}")
        job.events.emit(StopRequested(reason="time limit", detail=call.reason))
        return close(job, parts, target, exitcodes.TIME_LIMIT, "stopped for time", held=held)
    probed_at = probed.get("steps")  # the probe's steps, fewer where the run is shorter
    where = (f"resuming from {resume}" if resume else f"going on from the probe's step {probed_at}, in its launch"
             if held else "from the start")
    say(f"train: ZeRO {d.stage.name}, {where}")
    uploader = uploads.start(s, target, job.paths, job.events)
    job.events.emit(TrainStarted(stage=d.stage.name, max_steps=max_steps, resumed_from=parts.resumed_from and
                                 str(parts.resumed_from)))
    started = held.began if held else time.time()  # a launch that went on from the probe: from its start
    with timekeeper.watching(clock, uploader):
        if held is not None:
            held.go_on()
            code, reports = held.finish()
        else:
            code, reports = runner.run(runner.spec(d, "train", job.paths.out, max_steps, resume))
    parts.train = result = summary.TrainResult.of(reports, time.time() - started, probed_at if held else None)
    parts.phases.done("train")
    if d.reshard is not None:
        reshard.tidy(job.paths)
    planned = budget.sizes(d, runner.total_params, s.extra_trainer_args)[0] if runner.total_params else None
    return close(job, parts, target, *ended(job, parts, code, result, planned), uploader=uploader, clock=clock)


def watch(job: Job, parts: summary.Parts, d: Decision, total_params: int, uploads_on: bool
          ) -> timekeeper.TimeKeeper | None:
    """With a time limit: its watch for training (None without one)."""
    if parts.time_limit is None:
        return None
    checkpoint, final = budget.sizes(d, total_params, job.s.extra_trainer_args)
    return timekeeper.TimeKeeper(parts.time_limit, job.paths.run, job.stopper, checkpoint, final, uploads=uploads_on)


def ended(job: Job, parts: summary.Parts, code: int, result: summary.TrainResult, checkpoint_bytes: int | None = None
          ) -> tuple[int, str]:
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
