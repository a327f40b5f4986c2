"""One run of the ranks on every node: the decision written down as a RunSpec, the launch, the reports back;
and a training launch that is also the probe (Held), which waits after the probe's steps for the verdict."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from ..events import EVENTS_FILE, EventLog
from ..handoff import RankReport, RunSpec, Verdict, write_json
from ..planner.arguments import Run, arguments
from ..planner import disk
from ..planner.budget import Overheads
from ..planner.decision import Decision
from ..settings import Settings
from . import budget
from .coordinate import Team
from .launch import Launch, Stopper
from .output import Paths
from .standby import Standby


class Runner:
    """Starts the ranks of every node on one RunSpec and collects what they report."""

    def __init__(self, s: Settings, team: Team, paths: Paths, stopper: Stopper, started_at: float,
                 standby: Standby | None = None):
        self.s, self.team, self.paths, self.stopper = s, team, paths, stopper
        self.started_at = started_at  # time.time() when the job began: what a user waits is counted from it
        self.events = EventLog(paths.run / EVENTS_FILE)  # the probe's tries go there
        self.total_params = 0  # the model's, for the projection's saves (set by the job once it has read the model)
        self.uploads = False  # the final model is uploaded (a Hub repo): the projection counts the upload
        self.standby = standby  # the ranks started before the decision: the first launch's, if they fit
        self.tokens = ""  # the training rows' tokens kept in the output folder (tokens.keep): the ranks read them

    @property
    def end_saves(self) -> bool:
        """Whether the run's last step saves a checkpoint (SFT_SAVE_STEPS), or writes the model alone (by time)."""
        return disk.end_checkpoint(self.s.save_steps is not None)

    def overheads(self, d: Decision) -> Overheads:
        """What a run of this decision spends besides its steps (its saves, the final model), for the probe's
        projection: the stage the probe ends on sets a checkpoint's size."""
        if not self.total_params:
            return Overheads()
        return budget.overheads(d, self.total_params, self.s.extra_trainer_args, self.uploads)

    def spec(self, d: Decision, mode: str, output_dir: Path, max_steps: int, resume: Path | None = None,
             hold_at: int = 0) -> RunSpec:
        """The decision as the ranks read it; its DeepSpeed config is written to run/ds_config.json."""
        ds_path = write_json(self.paths.run / "ds_config.json", dict(d.ds_config))
        return make_spec(self.s, d, self.paths, mode, output_dir, max_steps, resume, str(ds_path), hold_at,
                         self.tokens)

    def run(self, spec: RunSpec) -> tuple[int, list[RankReport]]:
        """Launch the ranks here and on every other node; the launcher's exit code and the ranks' reports."""
        code = self._finished(self._start(spec))
        return code, self.paths.rank_reports(spec.mode)

    def hold(self, spec: RunSpec) -> Held:
        """Start a training launch that is also the probe (spec.hold_at): it waits after the probe's steps."""
        self.paths.verdict_file.unlink(missing_ok=True)  # an earlier launch's verdict is not this one's
        self.paths.clear_reports("probe")
        return Held(self, spec, self._start(spec))

    def _start(self, spec: RunSpec) -> Launch:
        self.paths.clear_reports(spec.mode)
        standby, self.standby = self.standby, None  # it serves one launch, the first
        if standby is not None and not standby.fits(self.team.ranks):
            standby.end()  # started for other ranks (or its launcher died): this launch starts its own
            standby = None
        if standby is not None:
            spec = standby.spec(spec)
        path = spec.save(self.paths.run / f"spec-{spec.mode}.json")
        self.team.announce(path, self.paths.stop_file)  # the other nodes start their ranks on the same spec
        launch = Launch(self.s, self.team.ranks, path, self.paths.stop_file, self.team.nodes, standby)
        self.stopper.started(launch)
        return launch

    def _finished(self, launch: Launch) -> int:
        """Wait for the launch's end: its exit code, the other nodes told, a later stop no longer sent to it."""
        try:
            code = launch.wait()
        finally:
            self.stopper.launch = None
        self.team.after_launch(code)
        return code


class Held:
    """A training launch whose first steps are the probe: its ranks report as a probe after them, then wait for
    the controller's Verdict and go on as the training, or end there. What changes nothing in the decision
    costs nothing: the model is loaded and compiled once, and the probe's steps are the run's first."""

    POLL_SECONDS = 0.5

    def __init__(self, runner: Runner, spec: RunSpec, launch: Launch):
        self.runner, self.spec, self.launch = runner, spec, launch
        self.began = time.time()
        self.code: int | None = None  # the launcher's exit code, once it ended

    @property
    def live(self) -> bool:
        return self.code is None

    def probed(self) -> tuple[int, list[RankReport]]:
        """Wait until every rank reported the probe's steps: (0, their reports); or until the launch ended before
        (an out-of-memory, a failure, a stop): (its exit code, the ranks' reports of how it ended)."""
        world = self.spec.record.world_size
        while True:
            if len(reports := self.runner.paths.rank_reports("probe")) == world:
                return 0, reports
            if self.launch.wait(self.POLL_SECONDS) is not None:
                return self.finish()

    def go_on(self) -> None:
        Verdict(go_on=True).save(self.runner.paths.verdict_file)

    def end(self, why: str) -> int:
        """End the launch after the probe's steps, saving nothing; its exit code. Once a stop was asked the ranks
        are told nothing: they save the steps they made and stop, as a training launch does."""
        if self.live and not self.runner.stopper.requested:
            Verdict(go_on=False, why=why).save(self.runner.paths.verdict_file)
        return self.finish()[0]

    def finish(self) -> tuple[int, list[RankReport]]:
        """Wait for the launch's end: the launcher's exit code and the ranks' reports."""
        if self.code is None:
            self.code = self.runner._finished(self.launch)
        return self.code, self.runner.paths.rank_reports(self.spec.mode)


def make_spec(s: Settings, d: Decision, paths: Paths, mode: str, output_dir: Path, max_steps: int,
              resume: Path | None = None, ds_config: str = "", hold_at: int = 0, tokens: str = "") -> RunSpec:
    """The settings and the decision, as the ranks read them (writes nothing); `tokens`: the folder of the training
    rows' tokens."""
    trainer = arguments(Run(s, d, mode, str(output_dir), max_steps, ds_config))
    return RunSpec(
        mode=mode, model=s.model, trainer=trainer,
        data=dataclasses.replace(d.data, tokens=tokens) if d.data is not None else None,
        stage=d.stage.name, attention=d.attention,
        compile=d.compile, report_dir=str(paths.reports), stop_file=str(paths.stop_file), final_dir=str(paths.final),
        record=d.record(), resume=str(resume) if resume else None, report_to=s.report_to, run_dir=str(paths.run),
        sequence_parallel=d.sequence_parallel, head_tiles_kept_bytes=d.row.head_kept, hold_at=hold_at,
        save_background=d.save_background and mode == "train",
        snapshot_bytes=d.snapshot_bytes // max(d.ranks.count, 1) if d.save_background and mode == "train" else 0,
        verdict_file=str(paths.verdict_file) if hold_at else "",
        save_seconds=(s.save_seconds or 0.0) if mode == "train" else 0.0,
        attention_lock=str(paths.attention_lock.absolute()) if d.attention == "flash_attention_4" else "")
