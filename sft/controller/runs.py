"""One run of the ranks on every node: the decision written down as a RunSpec, the launch, the reports back."""

from __future__ import annotations

from pathlib import Path

from ..events import EVENTS_FILE, EventLog
from ..handoff import RankReport, RunSpec, write_json
from ..planner.budget import Overheads
from ..planner.decide import Decision
from ..settings import Settings
from . import budget
from .coordinate import Team
from .launch import Launch, Stopper
from .output import Paths


class Runner:
    """Starts the ranks of every node on one RunSpec and collects what they report."""

    def __init__(self, s: Settings, team: Team, paths: Paths, stopper: Stopper, started_at: float):
        self.s, self.team, self.paths, self.stopper = s, team, paths, stopper
        self.started_at = started_at  # time.time() when the job began: what a user waits is counted from it
        self.events = EventLog(paths.run / EVENTS_FILE)  # the probe's tries go there
        self.total_params = 0  # the model's, for the projection's saves (set by the job once it has read the model)
        self.uploads = False  # the final model is uploaded (a Hub repo): the projection counts the upload

    def overheads(self, d: Decision) -> Overheads:
        """What a run of this decision spends besides its steps (its saves, the final model), for the probe's
        projection: the stage the probe ends on sets a checkpoint's size."""
        if not self.total_params:
            return Overheads()
        return budget.overheads(d, self.total_params, self.s.extra_trainer_args, self.uploads)

    def spec(self, d: Decision, mode: str, output_dir: Path, max_steps: int, resume: Path | None = None) -> RunSpec:
        """The decision as the ranks read it; its DeepSpeed config is written to run/ds_config.json."""
        ds_path = write_json(self.paths.run / "ds_config.json", dict(d.ds_config))
        return make_spec(self.s, d, self.paths, mode, output_dir, max_steps, resume, str(ds_path))

    def run(self, spec: RunSpec) -> tuple[int, list[RankReport]]:
        """Launch the ranks here and on every other node; the launcher's exit code and the ranks' reports."""
        self.paths.clear_reports(spec.mode)
        path = spec.save(self.paths.run / f"spec-{spec.mode}.json")
        self.team.announce(path, self.paths.stop_file)  # the other nodes start their ranks on the same spec
        code = self.stopper.running(Launch(self.s, self.team.ranks, path, self.paths.stop_file, self.team.nodes))
        self.team.after_launch(code)
        return code, self.paths.rank_reports(spec.mode)


def make_spec(s: Settings, d: Decision, paths: Paths, mode: str, output_dir: Path, max_steps: int,
              resume: Path | None = None, ds_config: str = "") -> RunSpec:
    """The settings and the decision, as the ranks read them (writes nothing)."""
    return RunSpec(
        mode=mode, model=s.model, data=d.data, max_length=s.max_length,
        packing=s.packing, epochs=s.epochs, max_steps=max_steps, learning_rate=s.learning_rate,
        save_steps=s.save_steps, save_total_limit=s.save_total_limit, logging_steps=s.logging_steps,
        seed=s.seed, bf16=d.bf16, attention=d.attention, liger_kernels=d.liger, compile=d.compile,
        micro_batch=d.split.micro_batch, grad_accum=d.split.grad_accum,
        gradient_checkpointing=d.split.gradient_checkpointing, offload_activations=d.split.offload_activations,
        trainer_args=s.extra_trainer_args, node_timeout_seconds=s.node_timeout_seconds,
        stage=d.stage.name, ds_config=ds_config, output_dir=str(output_dir),
        report_dir=str(paths.reports), stop_file=str(paths.stop_file), final_dir=str(paths.final),
        record=d.record(), resume=str(resume) if resume else None, report_to=s.report_to, run_name=s.run_name,
        run_dir=str(paths.run), model_revision=d.model_revision, chat_template=s.chat_template,
        sequence_parallel=d.sequence_parallel)
