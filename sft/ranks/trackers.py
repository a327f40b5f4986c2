"""In rank 0 of a training run: the W&B and MLflow runs the Trainer's integrations started, recorded so that a
restart of the job logs on in the same runs (sft/tracking.py hands them back to the next start)."""

from __future__ import annotations

import sys
from pathlib import Path

from transformers import TrainerCallback

from ..tracking import TrackerRuns


class RecordRuns(TrainerCallback):
    """Called after the Trainer's own tracker callbacks (the Trainer puts them first), which start their runs in
    on_train_begin: their run ids are known here."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def on_train_begin(self, args, state, control, **kwargs):
        known = TrackerRuns.load(self.run_dir)  # a tracker left out of this start keeps its run for a later one
        runs = TrackerRuns(wandb=_wandb_run() or known.wandb, mlflow=_mlflow_run() or known.mlflow)
        if runs != known:
            runs.save(self.run_dir)


def _wandb_run() -> str | None:
    wandb = sys.modules.get("wandb")  # imported by the Trainer's WandbCallback only where report_to names it
    return wandb.run.id if wandb is not None and getattr(wandb, "run", None) is not None else None


def _mlflow_run() -> str | None:
    mlflow = sys.modules.get("mlflow")
    run = mlflow.active_run() if mlflow is not None else None
    return run.info.run_id if run is not None else None


def close(code: int) -> None:
    """Finish the tracker runs this rank started. The rank leaves by os._exit, where no atexit hook runs: without
    this W&B's offline run file stays empty (its header alone), and MLflow's queued metrics are lost."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=code)
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None and mlflow.active_run() is not None:  # MLflowCallback ends it at the training's end
        mlflow.end_run("FINISHED" if code == 0 else "FAILED")
