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
from ..handoff import Summary, write_json
from ..planner import decide
from ..planner import disk, restart, rules
from ..planner.decide import Decision
from ..planner.inputs import CannotRun, Inputs
from ..planner.plan import format_table
from ..settings import Settings
from ..units import gib
from . import coordinate, figures, inputs, machine, outlock, preflight, probe, uploads
from .launch import Stopper
from .output import Paths, losses, plot_loss
from .runs import Runner


def run(s: Settings, probe_only: bool = False) -> int:
    """The whole job; returns its exit code. Node 0 leads; the other nodes start their ranks as node 0 says."""
    started_at = time.time()
    where = nodes.from_env(os.environ)
    facts = machine.measure(s.output_dir, where.nnodes)
    try:
        ranks, _ = rules.choose_ranks(s, facts.machine)
        team = coordinate.join(s, where, ranks)
    except CannotRun as e:
        print(f"error: {e}", flush=True)
        return e.exit_code
    except coordinate.NodesFailed as e:
        print(f"error: {e}", flush=True)
        return exitcodes.PREFLIGHT
    if not team.leads:
        return team.follow(Stopper())
    code = exitcodes.FAILED  # an exception here must still release the other nodes
    try:
        code = Job(s, team, facts, started_at).run(probe_only)
    finally:
        team.finish(code)
    return code


class Job:
    """One start of the job on node 0: its steps in order, and the summary they fill."""

    def __init__(self, s: Settings, team: coordinate.Team, facts: machine.Facts, started_at: float):
        self.s, self.team, self.facts = s, team, facts
        self.paths, self.stopper = Paths(s.output_path), Stopper()
        self.runner = Runner(s, team, self.paths, self.stopper, started_at)
        self.summary = Summary(settings=s.to_dict(), nodes=team.nodes.nnodes, started_at=started_at)
        self._phase_began = started_at
        self.target = self.uploader = None  # the Hub repo once checked, and its uploader while training

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
        except HubError as e:
            print(f"error: {e.message}", flush=True)
            return e.exit_code
        try:
            lock = outlock.take(self.paths.out)
        except outlock.Busy as e:
            print(f"error: {e}", flush=True)
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
        print(message if same else f"error: {message}", flush=True)
        return exitcodes.DONE if same else exitcodes.BAD_SETTINGS

    def _run(self, probe_only: bool) -> int:
        from ..hub.errors import HubError

        try:
            self.stopper.install()
            self.paths.stop_file.unlink(missing_ok=True)  # a stop of an earlier start must not stop this one
            write_json(self.paths.run / "settings.json", self.s.to_dict())
            resume = uploads.resume_point(self.paths, self.target)
        except HubError as e:
            print(f"error: {e.message}", flush=True)
            return e.exit_code
        except OSError as e:
            return self._unwritable(e)
        self.summary.resumed_from = str(resume) if resume else None
        try:
            given = inputs.read(self.s, self.facts.machine, resume)
            d = self._decided(decide.decide(given))
        except CannotRun as e:
            print(f"error: {e}", flush=True)
            return self._close(e.exit_code, "preflight failed")
        self.facts = machine.measure_links(self.facts, d.ranks)
        self._phase("start_to_decision")
        if (code := self._preflight(given, d, probe_only)) is not None:
            return self._close(code, "preflight failed", d)
        if self.s.probe_steps > 0 and resume is None:
            self._phase("preflight")
            outcome = probe.probe(self.runner, given, d, recheck=lambda nxt: self._preflight(given, nxt, probe_only))
            d = self._probed(outcome)
            self._phase("batch_search_and_probe")
            if outcome.code != exitcodes.DONE or probe_only:
                return self._close(outcome.code, "probed" if outcome.code == exitcodes.DONE else "probe failed", d)
        elif probe_only:
            print("nothing to probe (SFT_PROBE_STEPS=0, or resuming a run already probed)", flush=True)
            return exitcodes.DONE
        return self._train(d, resume)

    def _unwritable(self, e: OSError) -> int:
        """The output folder cannot be written (a full disk): nothing has run yet."""
        print(f"error: cannot write in {self.paths.out} ({e.strerror or e}): free space or fix its permissions, "
              "then start again", flush=True)
        return exitcodes.PREFLIGHT

    def _decided(self, d: Decision) -> Decision:
        print(format_table(d.plan), flush=True)
        print("decided:\n" + d.explain(), flush=True)
        self.summary.plan = d.plan.to_dict()
        return d

    def _preflight(self, given: Inputs, d: Decision, probe_only: bool) -> int | None:
        """The machine's facts against this decision's needs; an exit code when it cannot run."""
        # the probe alone writes no checkpoint: its disk needs are not the run's
        needs = preflight.Needs.of(d, None if probe_only else given.shape.total_params, self.s.save_total_limit,
                                   self.s.extra_trainer_args)
        checks = preflight.run(self.facts, needs)
        print("preflight:\n" + preflight.format_checks(checks), flush=True)
        self.summary.preflight = [dict(name=c.name, status=c.status, message=c.message) for c in checks]
        if preflight.failed(checks):
            print("error: preflight found problems that make this run impossible (above)", flush=True)
            return exitcodes.PREFLIGHT
        return None

    def _probed(self, outcome: probe.Outcome) -> Decision:
        self.summary.batch_search = outcome.batch_search
        self.summary.escalations = outcome.escalations
        self.summary.probe = outcome.figures
        return outcome.decision

    def _train(self, d: Decision, resume: Path | None) -> int:
        if self.stopper.requested:
            return self._close(exitcodes.STOPPED, "stopped", d)
        print(f"train: ZeRO {d.stage.name}, " + (f"resuming from {resume}" if resume else "from the start"),
              flush=True)
        self.uploader = uploads.start(self.s, self.target, self.paths)
        started = time.time()
        code, reports = self.runner.run(self.runner.spec(d, "train", self.paths.out, self.s.max_steps, resume))
        self.summary.train = train = train_results(reports, time.time() - started)
        self._phase("train")
        if (check := figures.against_run(self.summary.probe or {}, train)) is not None:
            self.summary.probe_check = check
            print(figures.against_run_line(check), flush=True)
        if train.get("stop_reason") and not self.stopper.requested:  # the ranks stopped before the disk filled
            print(f"error: {train['stop_reason']}", flush=True)
            return self._close(exitcodes.PREFLIGHT, "stopped: disk", d)
        if self.stopper.requested or train.get("status") == "stopped":
            return self._close(exitcodes.STOPPED, "stopped", d)
        if code != 0 or train.get("status") != "done":
            failed_save(self.paths.out)
            why = f": {train['error']}" if train.get("error") else ""
            print(f"error: training failed (launcher exit code {code}{why}); complete checkpoints are kept and a new "
                  f"start resumes from the newest", flush=True)
            return self._close(exitcodes.TRAIN_FAILED, "failed", d)
        return self._close(exitcodes.DONE, "done", d)

    def _phase(self, name: str) -> None:
        """The seconds since the last phase ended, as the summary's record of where the time went."""
        now = time.time()
        self.summary.phases[name] = round(now - self._phase_began, 1)
        self._phase_began = now

    def _close(self, code: int, status: str, d: Decision | None = None) -> int:
        """The summary and the loss plot; with a repo, the last uploads. Returns the job's exit code."""
        summary = self.summary
        summary.status, summary.exit_code = status, code
        if d is not None:
            summary.stage, summary.ranks = d.stage.name, d.ranks.world
            summary.resolved, summary.decisions = d.resolved(), dict(d.reasons)
        points = losses((summary.train or {}).get("log_history") or [])
        if points:
            summary.final_loss = points[-1][1]
        try:  # on a full disk the exit code and the log must still come out, naming what was not written
            if points:
                plot_loss(points, self.paths.run / "loss.png", f"{self.s.model} (ZeRO {summary.stage})")
            summary.save(self.paths.summary)
        except OSError as e:
            print(f"error: could not write {self.paths.summary} or the loss plot ({e.strerror or e}): this "
                  "log is the only record of this start", flush=True)
        if self.uploader is not None:
            code = uploads.finish(self.uploader, code, self.paths, summary,
                                  uploads.grace_left(self.s, self.stopper.requested_at))
            self._phase("final_uploads")
            summary.save(self.paths.summary)
        print(f"{status}: exit code {code}; summary in {self.paths.summary}", flush=True)
        return code


def failed_save(out: Path) -> None:
    """After a failed training: say so when the disk is full, and remove the checkpoints the failure tore
    (a resume never trusts them; gone, they give the summary room)."""
    newest = checkpoints.latest_complete(out)
    size, free = (machine.folder_bytes(newest) if newest else None), machine.free_disk(str(out))
    if disk.full_after_failure(free, size):
        print(f"error: the disk of {out} is full ({free / 1e9:.3g} GB free, less than one checkpoint: "
              f"{size / 1e9:.3g} GB), so the save failed: free space or mount a larger volume", flush=True)
    for torn in checkpoints.torn(out):
        shutil.rmtree(torn, ignore_errors=True)
        print(f"removed {torn.name}: the failure left it incomplete; a new start resumes from "
              f"{newest.name if newest else 'the beginning'}", flush=True)


def train_results(reports: list, wall: float) -> dict:
    """The training's figures for the summary, from the ranks' reports (rank 0 holds the step times)."""
    main = next((r for r in reports if r.rank == 0), None)
    result: dict = {"wall_seconds": round(wall, 1), "peak_reserved_gib": [gib(r.peak_reserved_bytes) for r in reports]}
    if main is None:
        return {"status": None, **result}
    result.update(status=main.status, global_step=main.global_step, train_runtime=main.train_runtime,
                  train_loss=main.train_loss, num_tokens=main.num_tokens, tokens_before=main.tokens_before,
                  stop_reason=main.stop_reason, error=main.error, log_history=main.log_history,
                  long_rows=main.long_rows)
    if main.num_tokens and main.train_runtime:  # this start's tokens in this start's time
        result["tokens_per_second"] = round((main.num_tokens - main.tokens_before) / main.train_runtime, 1)
    if rates := figures.steady_rates(main.steps):
        result["steady_tokens_per_second"] = rates["tokens_per_second"]
    return result
