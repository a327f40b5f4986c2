"""Evaluation in the ranks, beyond what the Trainer does at every SFT_EVAL_STEPS: one pass at the end (the
Trainer's own schedule skips it when the last step is not a multiple), and in the probe a few timed batches,
so the projection of the run's duration counts the evaluation passes too."""

from __future__ import annotations

from ..handoff import RankReport, RunSpec

PROBE_BATCHES = 4  # batches per rank the probe times, after one to warm up


def at_the_end(trainer, spec: RunSpec, stopped: bool) -> None:
    """Evaluate after the last step, unless the Trainer just did (or the run was stopped: it resumes later)."""
    if spec.mode != "train" or spec.data is None or not spec.data.evaluates or stopped:
        return
    step = trainer.state.global_step
    if any(e.get("step") == step and "eval_loss" in e for e in trainer.state.log_history):
        return
    trainer.evaluate()


def timed(trainer, report: RankReport) -> None:
    """The probe's measure of evaluation: seconds per batch over PROBE_BATCHES batches (after one batch that
    pays for the switch to evaluation), and the batches of one whole pass on this rank."""
    import time

    full = trainer.eval_dataset
    report.eval_batches = len(trainer.get_eval_dataloader())
    per_batch = trainer.args.per_device_eval_batch_size * trainer.args.world_size
    try:
        trainer.eval_dataset = full.select(range(min(len(full), per_batch)))
        trainer.evaluate(metric_key_prefix="probe_warmup")
        trainer.eval_dataset = full.select(range(min(len(full), PROBE_BATCHES * per_batch)))
        batches = len(trainer.get_eval_dataloader())
        began = time.perf_counter()
        trainer.evaluate(metric_key_prefix="probe_eval")
        report.eval_seconds_per_batch = round((time.perf_counter() - began) / batches, 4)
    finally:
        trainer.eval_dataset = full
