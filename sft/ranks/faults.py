"""The one seam where tests inject faults into a rank: a machine with no GPU cannot run out of GPU memory,
so the controller's answers to it (escalation, the batch search passing a split over) are tested end to
end by raising the real error here; and a CPU step lasts milliseconds, so the time limit's and the budget's
answers to a run of hours are tested on steps slowed down here. Read from SFTTEST_* variables, which no
user sets."""

from __future__ import annotations

import os

import torch

from ..handoff import RunSpec


def inject(spec: RunSpec) -> None:
    """In a probe: raise torch's OutOfMemoryError for the stages in SFTTEST_OOM_STAGES and the micro-batches
    in SFTTEST_OOM_MICRO_BATCHES (comma-separated)."""
    if spec.mode != "probe":
        return
    if spec.stage in _listed("SFTTEST_OOM_STAGES"):
        raise torch.OutOfMemoryError(f"CUDA out of memory (simulated for ZeRO {spec.stage} by SFTTEST_OOM_STAGES)")
    if str(spec.micro_batch) in _listed("SFTTEST_OOM_MICRO_BATCHES"):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated for this micro-batch by SFTTEST_OOM_MICRO_BATCHES)")


def _listed(variable: str) -> list[str]:
    return os.environ.get(variable, "").split(",")


def callbacks() -> list:
    """Trainer callbacks for the faults asked for: SFTTEST_STEP_SECONDS makes every optimizer step last that much
    longer (a slower machine), in the probe and in training alike."""
    seconds = float(os.environ.get("SFTTEST_STEP_SECONDS") or 0)
    if seconds <= 0:
        return []
    import time

    from transformers import TrainerCallback

    class SlowSteps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(seconds)

    return [SlowSteps()]
