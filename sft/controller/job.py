"""The job, in the controlling process: a recipe that reads top to bottom.

    run      every node: the machine measured, the other nodes joined; node 0 leads, the others follow its launches
    lead     node 0, before anything is written (a refusal here leaves the output folder as it was): a finished run,
             the Hub, the data; then, holding the output folder's lock:
    recipe   prepare (decide) -> preflight -> probe -> budget -> reshard -> train -> close

The decision is made once (prepare.py -> planner/decide.py); this module carries it out. The ranks run
sft/ranks/train.py through the launcher (launch.py, runs.py's Runner, which every step works with); the training
itself is training.py, the Hub side uploads.py. Each step hands back a typed part, and the summary is built from them
at the end (summary.py).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time

from .. import exitcodes, nodes
from ..console import say
from ..data import DataError
from ..events import BudgetChecked, Decided, Ended, EventLog, SettingsResolved, StopRequested
from ..checkpoints import free_disk
from ..handoff import write_json
from ..hub.errors import HubError
from ..planner import decide, restart
from ..planner.budget import Projection
from ..planner.decision import Decision
from ..planner.inputs import GPU, CannotRun, Ranks
from ..planner.plan import format_table
from ..settings import Settings, refusal
from . import (budget, buildlocks, coordinate, data, figures, heartbeat, machine, outlock, preflight, probe, reshard,
               summary, timekeeper, tokens, training, uploads)
from .launch import Stopper
from .output import Paths
from .prepare import prepare
from .runs import Held, Runner
from .standby import Standby
from .training import Ending


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
            runner = Runner(s, team, Paths(s.output_path), Stopper(), started_at, standby)  # what every step works with
            code = lead(runner, facts, probe_only)
        finally:
            team.finish(code)
        return code
    except coordinate.NodesFailed as e:
        say(f"error: {e}")
        return exitcodes.PREFLIGHT
    finally:
        if standby is not None:
            standby.end()


def lead(job: Runner, facts: machine.Facts, probe_only: bool) -> int:
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
        lock = outlock.take(paths.out)
    except outlock.Busy as e:
        say(f"error: {e}")
        return exitcodes.OUTPUT_BUSY
    except OSError as e:
        return unwritable(paths, e)
    with lock, heartbeat.Pulse(paths.run):  # `status --check`'s sign that this start lives
        return recipe(job, facts, target, found, probe_only)


def unwritable(paths: Paths, e: OSError) -> int:
    """The output folder cannot be written (a full disk): nothing has run yet."""
    say(f"error: cannot write in {paths.out} ({e.strerror or e}): free space or fix its permissions, then start "
        "again")
    return exitcodes.PREFLIGHT


def recipe(job: Runner, facts: machine.Facts, target, found: data.Found, probe_only: bool) -> int:
    """The job holding its output folder: every step in order; each exit closes with the summary of the parts."""
    s, paths, stopper, events = job.s, job.paths, job.stopper, job.events
    parts = summary.Parts(s, job.team.nodes.nnodes, job.started_at, summary.Phases(job.started_at), found=found)
    try:
        stopper.on_request = lambda reason, detail: events.emit(StopRequested(reason=reason, detail=detail))
        stopper.install()
        paths.clear_leftovers()
        write_json(paths.run / "settings.json", s.to_dict())
        job.tokens = tokens.keep(found.tokens)  # for the ranks and the next start: no start tokenises twice
        parts.time_limit = time_limit(s, events)
        parts.resumed_from = resume = uploads.resume_point(paths, target)
    except HubError as e:
        say(f"error: {e.message}")
        return e.exit_code
    except OSError as e:
        return unwritable(paths, e)
    try:
        facts = machine.settled(facts)  # FlashAttention-4's import check, run meanwhile
        prepared = prepare(s, facts, job.team.ranks, found=found, resume=resume)
    except CannotRun as e:
        say(f"error: {e}")
        return close(job, parts, target, Ending(e.exit_code, "preflight failed"))
    parts.decision = d = decided(prepared.decision, events)
    parts.plan = d.plan  # the plan the start decided on, whatever the probe changes after
    job.total_params, job.uploads = prepared.inputs.shape.total_params, target is not None
    facts = machine.measure_links(facts, d.ranks)
    parts.phases.done("start_to_decision")
    recheck = functools.partial(preflight_of, job, facts, prepared.inputs, probe_only, parts)  # each decision
    if (code := recheck(d)) is not None:
        return close(job, parts, target, Ending(code, "preflight failed"))
    held = None
    if s.probe_steps > 0 and resume is None:
        parts.phases.done("preflight")
        d, held, ending = probed(job, parts, prepared.inputs, recheck, probe_only, facts)
        if ending is not None:
            return close(job, parts, target, ending)
    elif probe_only:
        say("nothing to probe (SFT_PROBE_STEPS=0, or resuming a run already probed)")
        return exitcodes.DONE
    if d.reshard is not None:  # written by another number of ranks: converted first
        try:
            converted = reshard.convert(resume, d.reshard, paths)
        except reshard.Failed as e:
            say(f"error: {e}")
            stopped = stopper.requested  # the converter got the signal too
            return close(job, parts, target, Ending(exitcodes.STOPPED if stopped else e.exit_code, "reshard failed"))
        parts.reshard, resume = converted.summary, converted.path
        parts.phases.done("reshard")
    return close(job, parts, target, training.train(job, parts, target, held, resume))


def probed(job: Runner, parts: summary.Parts, given, recheck, probe_only: bool, facts: machine.Facts
           ) -> tuple[Decision, Held | None, Ending | None]:
    """The batch search and the probe, then the budget's and the disk's gates on its projection: the decision as
    they leave it, the training's launch where it waits after the probe's steps, and how the job ends where it ends
    here."""
    parts.probe = outcome = probe.probe(job, given, parts.decision, recheck, train_on=not probe_only)
    parts.decision = d = outcome.decision
    parts.phases.done("batch_search_and_probe")
    if outcome.code == exitcodes.DONE:
        # the run ahead at the probe's speed, once: the budget's gate and the disk's room both read it
        p = figures.projection(outcome.figures or {}, job.s, job.overheads(d))
        parts.budget = call = budget_of(job.s, p, outcome, d, job.events, probe_only)
        if call.verdict == "truncate" and not probe_only:
            parts.decision = d = decide.cap_steps(d, call.max_steps, "the steps that fit the budget "
                                                                     "(SFT_BUDGET_ACTION=truncate)")
        if call.verdict == "refuse" and not probe_only:
            return d, outcome.held, Ending(exitcodes.OVER_BUDGET, "over budget", outcome.held)
        if not probe_only and not disk_after_probe(job, p, d, given, facts, parts.preflight):
            return d, outcome.held, Ending(exitcodes.PREFLIGHT, "preflight failed", outcome.held)
    if outcome.code != exitcodes.DONE or probe_only:
        status = {exitcodes.DONE: "probed", exitcodes.STOPPED: "stopped"}.get(outcome.code, "probe failed")
        return d, outcome.held, Ending(outcome.code, status, outcome.held)
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


def preflight_of(job: Runner, facts: machine.Facts, given, probe_only: bool, parts: summary.Parts, d: Decision
                 ) -> int | None:
    """The machine's facts against this decision's needs (the start's, and each the probe moves to); an exit code
    when it cannot run. Where the probe runs first, the disk's room for the run's checkpoints is counted after it."""
    # the probe alone writes no checkpoint: its disk needs are not the run's
    probe_follows = not probe_only and job.s.probe_steps > 0 and parts.resumed_from is None  # as recipe() probes
    needs = preflight.Needs.of(d, None if probe_only else given.shape.total_params, job.s.save_total_limit,
                               job.s.extra_trainer_args, probe_follows, end_saves=job.end_saves)
    parts.preflight = checks = preflight.run(facts, needs)
    say("preflight:\n" + preflight.format_checks(checks))
    if preflight.failed(checks):
        say("error: preflight found problems that make this run impossible (above)")
        return exitcodes.PREFLIGHT
    for lock in buildlocks.remove(facts.build_locks):  # before the ranks load an op: each would wait on it forever
        say(f"removed {lock}: a torch extension build lock that a killed build left")
    return None


def disk_after_probe(job: Runner, p: Projection | None, d: Decision, given, facts: machine.Facts,
                     at_start: list[preflight.Check] | None) -> bool:
    """The disk against the checkpoints this run saves at the probe's speed (SFT_SAVE_MINUTES' cadence, and its
    end's where it saves one): a run shorter than the limit's saves keeps fewer at once, so the start asked room for
    one only. Said where the start's check was short; False (exit 3) where the disk cannot hold them."""
    saves = None if p is None else p.saves(d.max_steps)  # d.max_steps: the budget's cap; unknown: the limit's
    needs = dataclasses.replace(preflight.Needs.of(d, given.shape.total_params, job.s.save_total_limit,
                                                   job.s.extra_trainer_args, end_saves=job.end_saves), saves=saves)
    now = dataclasses.replace(facts, free_disk_bytes=free_disk(facts.output_dir))
    check = preflight.disk_for(now, needs)
    started = next((c for c in at_start or [] if c.name == "disk"), None)
    if check.status == preflight.FAIL or (started is not None and started.status == preflight.WARN):
        say("after the probe:\n" + preflight.format_checks([check]))
    return check.status != preflight.FAIL


def budget_of(s: Settings, p: Projection | None, outcome: probe.Outcome, d: Decision, events: EventLog,
              probe_only: bool):
    """The budget gate on the probe's projection, said, and its event."""
    call = budget.check(s, p, d.ranks.world)
    budget.report(call, refusing=not probe_only)
    if call.verdict != "none":
        fig = outcome.figures or {}
        events.emit(BudgetChecked(verdict=call.verdict, projected_hours=fig.get("projected_hours", 0.0),
                                  projected_cost=fig.get("projected_cost"), max_steps=call.max_steps,
                                  reason=call.reason))
    return call


def close(job: Runner, parts: summary.Parts, target, ending: Ending) -> int:
    """The summary and the loss plot; with a repo, the last uploads. Returns the job's exit code."""
    code, status, uploader, clock = ending.code, ending.status, ending.uploader, ending.clock
    if ending.held is not None:  # the training's launch, left waiting after the probe: it ends, saving nothing
        ending.held.end(status)
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
