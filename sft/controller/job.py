"""The job, in the controlling process: hub -> decide -> preflight -> probe -> train -> close.

The decision is made once, by planner/decide.py; this module carries it out. The ranks run
sft/ranks/train.py, started through the launcher (launch.py); the Hub side is uploads.py.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from .. import checkpoints, exitcodes, nodes
from ..console import say
from ..events import (EVENTS_FILE, BudgetChecked, Decided, Ended, EventLog, SettingsResolved, StopRequested,
                      TrainStarted)
from ..handoff import Summary, write_json
from ..planner import decide
from ..planner import disk, restart, rules
from ..planner.decide import Decision
from ..planner.inputs import CannotRun, Inputs
from ..planner.plan import format_table
from ..settings import Settings, refusal
from ..units import gib
from . import (budget, coordinate, data, figures, inputs, machine, outlock, preflight, probe, reshard,
               timekeeper, uploads)
from .launch import Stopper
from .output import Paths, eval_results, losses, plot_loss
from .runs import Held, Runner
from .standby import Standby


def run(s: Settings, import_check: machine.ImportCheck | None = None, standby: Standby | None = None,
        probe_only: bool = False) -> int:
    """The whole job; returns its exit code. Node 0 leads; the other nodes start their ranks as node 0 says.
    What the entrypoint started before reading the settings' inputs: `import_check`, FlashAttention-4's; `standby`,
    the ranks, for the first launch (ended with the job if none took them over)."""
    try:
        return _run(s, import_check, standby, probe_only)
    finally:
        if standby is not None:
            standby.end()


def _run(s: Settings, import_check: machine.ImportCheck | None, standby: Standby | None, probe_only: bool) -> int:
    started_at = machine.process_started_at()  # the job's figures count from it: what a user waits
    where = nodes.from_env(os.environ)
    facts = machine.measure(s.output_dir, where.nnodes, s.attention, early=import_check)
    try:
        ranks, _ = rules.choose_ranks(s, facts.machine)
        team = coordinate.join(s, where, ranks)
    except CannotRun as e:
        say(f"error: {e}")
        return e.exit_code
    except coordinate.NodesFailed as e:
        say(f"error: {e}")
        return exitcodes.PREFLIGHT
    if not team.leads:
        return team.follow(Stopper())
    code = exitcodes.FAILED  # an exception here must still release the other nodes
    try:
        code = Job(s, team, facts, started_at, standby).run(probe_only)
    finally:
        team.finish(code)
    return code


class Job:
    """One start of the job on node 0: its steps in order, and the summary they fill."""

    def __init__(self, s: Settings, team: coordinate.Team, facts: machine.Facts, started_at: float,
                 standby: Standby | None = None):
        self.s, self.team, self.facts = s, team, facts
        self.paths, self.stopper = Paths(s.output_path), Stopper()
        self.runner = Runner(s, team, self.paths, self.stopper, started_at)
        self.runner.standby = standby
        self.summary = Summary(settings=s.to_dict(), nodes=team.nodes.nnodes, started_at=started_at)
        self._phase_began = started_at
        self.target = self.uploader = None  # the Hub repo once checked, and its uploader while training
        self.events = EventLog(self.paths.run / EVENTS_FILE)
        self.stopper.on_request = lambda reason, detail: self.events.emit(StopRequested(reason=reason, detail=detail))
        self.deadline, self.timekeeper = None, None  # the time limit, if any, and its watch while training
        self.data: data.Found | None = None
        self.held: Held | None = None  # the training's launch, waiting after the probe's steps for a verdict

    def run(self, probe_only: bool) -> int:
        """The job, holding the output folder's lock from its first write: a second job on the folder stops
        at once. A start refused before (a finished run, the Hub's refusal) writes nothing."""
        from ..hub.errors import HubError

        if not probe_only and (code := self._finished_before()) is not None:
            return code
        try:
            self.target = uploads.connect(self.s)
            if not probe_only and uploads.already_done(self.target):
                return exitcodes.DONE
            if (code := self._read_data()) is not None:  # bad data writes nothing, not even the lock
                return code
        except HubError as e:
            say(f"error: {e.message}")
            return e.exit_code
        try:
            lock = outlock.take(self.paths.out)
        except outlock.Busy as e:
            say(f"error: {e}")
            return exitcodes.OUTPUT_BUSY
        except OSError as e:
            return self._unwritable(e)
        with lock:
            return self._run(probe_only)

    def _finished_before(self) -> int | None:
        """A finished run in the folder (read only): with these settings nothing to do, with others an error."""
        before = self.paths.finished_settings()
        if before is None:
            return None
        same, message = restart.verdict(before, self.s.to_dict(), Settings().to_dict(), str(self.paths.out))
        say(message if same else f"error: {message}")
        return exitcodes.DONE if same else exitcodes.BAD_SETTINGS

    def _run(self, probe_only: bool) -> int:
        from ..hub.errors import HubError

        try:
            self.stopper.install()
            self.paths.stop_file.unlink(missing_ok=True)  # a stop of an earlier start must not stop this one
            write_json(self.paths.run / "settings.json", self.s.to_dict())
            self._resolved()
            resume = uploads.resume_point(self.paths, self.target)
        except HubError as e:
            say(f"error: {e.message}")
            return e.exit_code
        except OSError as e:
            return self._unwritable(e)
        self.summary.resumed_from = str(resume) if resume else None
        try:
            self.facts = machine.settled(self.facts)  # FlashAttention-4's import check, run meanwhile
            given = inputs.read(self.s, self.facts.machine, resume, self.data.facts)
            d = self._decided(decide.decide(given))
            self.runner.total_params, self.runner.uploads = given.shape.total_params, self.target is not None
        except CannotRun as e:
            say(f"error: {e}")
            return self._close(e.exit_code, "preflight failed")
        self.facts = machine.measure_links(self.facts, d.ranks)
        self._phase("start_to_decision")
        if (code := self._preflight(given, d, probe_only)) is not None:
            return self._close(code, "preflight failed", d)
        if self.s.probe_steps > 0 and resume is None:
            self._phase("preflight")
            outcome = probe.probe(self.runner, given, d, recheck=lambda nxt: self._preflight(given, nxt, probe_only),
                                  train_on=not probe_only)
            self.held = outcome.held
            d = self._probed(outcome)
            self._phase("batch_search_and_probe")
            if outcome.code == exitcodes.DONE:
                d, refused = self._budget(d, probe_only)
                if refused:
                    return self._close(exitcodes.OVER_BUDGET, "over budget", d)
            if outcome.code != exitcodes.DONE or probe_only:
                status = {exitcodes.DONE: "probed", exitcodes.STOPPED: "stopped"}.get(outcome.code, "probe failed")
                return self._close(outcome.code, status, d)
        elif probe_only:
            say("nothing to probe (SFT_PROBE_STEPS=0, or resuming a run already probed)")
            return exitcodes.DONE
        if d.reshard is not None:  # written by another number of ranks: converted first
            try:
                converted = reshard.convert(resume, d.reshard, self.paths)
            except reshard.Failed as e:
                say(f"error: {e}")
                stopped = self.stopper.requested  # the converter got the signal too
                return self._close(exitcodes.STOPPED if stopped else e.exit_code, "reshard failed", d)
            self.summary.reshard, resume = converted.summary, converted.path
            self._phase("reshard")
        return self._train(d, resume, given.shape.total_params)

    def _resolved(self) -> None:
        """The time limit found, and the settings' event."""
        self.deadline = timekeeper.find_deadline(self.s, os.environ, time.time())
        if self.deadline is not None:
            say(f"time limit: {self.deadline.text()} ({self.deadline.source}); a checkpoint is saved and uploaded "
                f"before it, then exit {exitcodes.TIME_LIMIT}")
            self.summary.time_limit = {"at": self.deadline.text(), "source": self.deadline.source}
        self.events.emit(SettingsResolved(settings=self.s.to_dict(), deadline=self.deadline and self.deadline.text(),
                                          deadline_source=self.deadline and self.deadline.source))

    def _budget(self, d: Decision, probe_only: bool) -> tuple[Decision, bool]:
        """The budget gate on the probe's projection: (the decision, capped if truncated; whether refused)."""
        call = budget.check(self.s, self.summary.probe or {}, self.runner.overheads(d), d.ranks.world)
        budget.report(call, refusing=not probe_only)
        if call.verdict != "none":
            self.summary.budget = {"verdict": call.verdict, "reason": call.reason, "max_steps": call.max_steps,
                                   "fits": list(call.fits)}
            fig = self.summary.probe or {}
            self.events.emit(BudgetChecked(verdict=call.verdict, projected_hours=fig.get("projected_hours", 0.0),
                                           projected_cost=fig.get("projected_cost"), max_steps=call.max_steps,
                                           reason=call.reason))
        if call.verdict == "truncate" and not probe_only:
            d = decide.cap_steps(d, call.max_steps, "the steps that fit the budget (SFT_BUDGET_ACTION=truncate)")
        return d, call.verdict == "refuse" and not probe_only

    def _unwritable(self, e: OSError) -> int:
        """The output folder cannot be written (a full disk): nothing has run yet."""
        say(f"error: cannot write in {self.paths.out} ({e.strerror or e}): free space or fix its permissions, "
              "then start again")
        return exitcodes.PREFLIGHT

    def _read_data(self) -> int | None:
        """The data, loaded and checked before anything is written; exit 2 listing every problem."""
        from ..data import DataError

        try:
            self.data = data.read(self.s, self.team.ranks)
        except DataError as e:
            say(refusal("data is", e.problems))
            return exitcodes.BAD_SETTINGS
        say("\n".join(self.data.notes))
        return None

    def _decided(self, d: Decision) -> Decision:
        say(format_table(d.plan))
        say("decided:\n" + d.explain())
        self.summary.plan = d.plan.to_dict()
        self.events.emit(Decided(stage=d.stage.name, ranks=d.ranks.world, resolved=d.resolved(),
                                 reasons=dict(d.reasons)))
        self.summary.data, self.summary.model_revision = data.summary(self.data, d.data), d.model_revision
        return d

    def _preflight(self, given: Inputs, d: Decision, probe_only: bool) -> int | None:
        """The machine's facts against this decision's needs; an exit code when it cannot run."""
        # the probe alone writes no checkpoint: its disk needs are not the run's
        needs = preflight.Needs.of(d, None if probe_only else given.shape.total_params, self.s.save_total_limit,
                                   self.s.extra_trainer_args)
        checks = preflight.run(self.facts, needs)
        say("preflight:\n" + preflight.format_checks(checks))
        self.summary.preflight = [dict(name=c.name, status=c.status, message=c.message) for c in checks]
        if preflight.failed(checks):
            say("error: preflight found problems that make this run impossible (above)")
            return exitcodes.PREFLIGHT
        return None

    def _probed(self, outcome: probe.Outcome) -> Decision:
        self.summary.batch_search = outcome.batch_search
        self.summary.escalations = outcome.escalations
        self.summary.probe = outcome.figures
        return outcome.decision

    def _train(self, d: Decision, resume: Path | None, total_params: int) -> int:
        max_steps = d.max_steps or self.s.max_steps
        if self.held is not None and max_steps != self.held.spec.max_steps:  # its schedule is for more steps
            say("train: launched again, for the steps the budget capped; the probe's launch ends")
            self.held.end("the budget capped the run's steps")
            self.held = None
        if self.stopper.requested:
            return self._close(exitcodes.STOPPED, "stopped", d)
        if self._out_of_time(d, total_params):
            return self._close(exitcodes.TIME_LIMIT, "stopped for time", d)
        held, self.held = self.held, None
        held_at = (self.summary.probe or {}).get("steps")  # the probe's steps, fewer where the run is shorter
        where = (f"resuming from {resume}" if resume else f"going on from the probe's step {held_at}, in its launch"
                 if held else "from the start")
        say(f"train: ZeRO {d.stage.name}, {where}")
        self.uploader = uploads.start(self.s, self.target, self.paths, self.events)
        self.events.emit(TrainStarted(stage=d.stage.name, max_steps=max_steps, resumed_from=self.summary.resumed_from))
        if self.timekeeper is not None:
            self.timekeeper.uploader = self.uploader
            self.timekeeper.start()
        started = held.began if held else time.time()  # a launch that went on from the probe: from its start
        try:
            if held is not None:
                held.go_on()
                code, reports = held.finish()
            else:
                code, reports = self.runner.run(self.runner.spec(d, "train", self.paths.out, max_steps, resume))
        finally:
            if self.timekeeper is not None:
                self.timekeeper.stop()
        self.summary.train = train = train_results(reports, time.time() - started)
        if held is not None:
            train["went_on_from_probe_step"] = held_at
        self._phase("train")
        if d.reshard is not None:
            reshard.tidy(self.paths)
        if (check := figures.against_run(self.summary.probe or {}, train)) is not None:
            self.summary.probe_check = check
            say(figures.against_run_line(check))
        if self.stopper.reason == "time limit":
            return self._close(exitcodes.TIME_LIMIT, "stopped for time", d)
        if train.get("stop_reason") and not self.stopper.requested:  # the ranks stopped before the disk filled
            say(f"error: {train['stop_reason']}")
            return self._close(exitcodes.PREFLIGHT, "stopped: disk", d)
        if self.stopper.requested or train.get("status") == "stopped":
            return self._close(exitcodes.STOPPED, "stopped", d)
        if code != 0 or train.get("status") != "done":
            failed_save(self.paths.out)
            why = f": {train['error']}" if train.get("error") else ""
            say(f"error: training failed (launcher exit code {code}{why}); complete checkpoints are kept and a new "
                "start resumes from the newest")
            return self._close(exitcodes.TRAIN_FAILED, "failed", d)
        return self._close(exitcodes.DONE, "done", d)

    def _phase(self, name: str) -> None:
        """The seconds since the last phase ended, as the summary's record of where the time went."""
        now = time.time()
        self.summary.phases[name] = round(now - self._phase_began, 1)
        self._phase_began = now

    def _out_of_time(self, d: Decision, total_params: int) -> bool:
        """With a time limit: its watch for training; True when not even a step and a save fit before it."""
        if self.deadline is None:
            return False
        checkpoint, final = budget.sizes(d, total_params, self.s.extra_trainer_args)
        self.timekeeper = timekeeper.TimeKeeper(self.deadline, self.paths.run, self.stopper, checkpoint, final,
                                                uploads=self.runner.uploads)
        call = self.timekeeper.before_training((self.summary.probe or {}).get("seconds_per_step"))
        if call.stop:
            say(f"error: time limit: no time left to train before {self.deadline.text()}: {call.reason}")
            self.events.emit(StopRequested(reason="time limit", detail=call.reason))
        return call.stop

    def _close(self, code: int, status: str, d: Decision | None = None) -> int:
        """The summary and the loss plot; with a repo, the last uploads. Returns the job's exit code."""
        if self.held is not None:  # the training's launch, left waiting after the probe: it ends, saving nothing
            self.held.end(status)
            self.held = None
        summary = self.summary
        summary.status, summary.exit_code = status, code
        if d is not None:
            summary.stage, summary.ranks = d.stage.name, d.ranks.world
            summary.resolved, summary.decisions = d.resolved(), dict(d.reasons)
        history = (summary.train or {}).get("log_history") or []
        points, summary.eval = losses(history), eval_results(history)
        if points:
            summary.final_loss = points[-1][1]
        try:  # on a full disk the exit code and the log must still come out, naming what was not written
            if points:
                plot_loss(points, self.paths.run / "loss.png", f"{self.s.model} (ZeRO {summary.stage})",
                          losses(history, "eval_loss"))
            summary.save(self.paths.summary)
        except OSError as e:
            say(f"error: could not write {self.paths.summary} or the loss plot ({e.strerror or e}): this "
                "log is the only record of this start")
        if self.uploader is None and code == exitcodes.STOPPED:  # a stop among the probe's steps, in the
            # training's launch, saved them before the uploader began (at the verdict): the flush below sends them
            self.uploader = uploads.start(self.s, self.target, self.paths, self.events, begin=False)
        if self.uploader is not None:
            grace = (self.timekeeper.seconds_left() if self.stopper.reason == "time limit" and self.timekeeper
                     else uploads.grace_left(self.s, self.stopper.requested_at))
            code = uploads.finish(self.uploader, code, self.paths, summary, grace)
            self._phase("final_uploads")
            summary.save(self.paths.summary)
        say(f"{status}: exit code {code}; summary in {self.paths.summary}")
        self.events.emit(Ended(status=status, exit_code=code))
        return code


def failed_save(out: Path) -> None:
    """After a failed training: say so when the disk is full, and remove the checkpoints the failure tore
    (a resume never trusts them; gone, they give the summary room)."""
    newest = checkpoints.latest_complete(out)
    size, free = (checkpoints.folder_bytes(newest) if newest else None), checkpoints.free_disk(str(out))
    if disk.full_after_failure(free, size):
        say(f"error: the disk of {out} is full ({free / 1e9:.3g} GB free, less than one checkpoint: "
              f"{size / 1e9:.3g} GB), so the save failed: free space or mount a larger volume")
    for torn in checkpoints.torn(out):
        shutil.rmtree(torn, ignore_errors=True)
        say(f"removed {torn.name}: the failure left it incomplete; a new start resumes from "
              f"{newest.name if newest else 'the beginning'}")


def train_results(reports: list, wall: float) -> dict:
    """The training's figures for the summary, from the ranks' reports (rank 0 holds the step times)."""
    main = next((r for r in reports if r.rank == 0), None)
    result: dict = {"wall_seconds": round(wall, 1), "peak_reserved_gib": [gib(r.peak_reserved_bytes) for r in reports]}
    if main is None:
        return {"status": None, **result}
    result.update(status=main.status, global_step=main.global_step, train_runtime=main.train_runtime,
                  train_loss=main.train_loss, num_tokens=main.num_tokens, tokens_before=main.tokens_before,
                  stop_reason=main.stop_reason, error=main.error, log_history=main.log_history,
                  eval_seconds=round(main.eval_seconds, 3))
    if main.num_tokens and main.train_runtime:  # this start's tokens in this start's time
        result["tokens_per_second"] = round((main.num_tokens - main.tokens_before) / main.train_runtime, 1)
    if rates := figures.steady_rates(main.steps):
        result["steady_tokens_per_second"] = rates["tokens_per_second"]
    return result
