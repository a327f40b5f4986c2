"""Checkpoints by time (SFT_SAVE_MINUTES): when one is due, by rank 0's clock, for every rank at the same step.

A save is a collective in DeepSpeed (every rank writes its own shards), so no rank may decide alone: rank 0 asks
in the flag all-reduce the ranks already make at every step for a stop (progress.StopRequest), and all of them
save at the step where the answer arrives. The interval runs from the end of the last save (or the start of
training): at least SFT_SAVE_MINUTES of training lie between two checkpoints, so at the default (SFT_UPLOAD_MINUTES)
checkpoints come no faster than the uploader sends them, and none costs the GPU a save only to be deleted unseen.
"""

from __future__ import annotations

import time

# No checkpoint by time when the run's end comes within this share of the interval: the end writes the model
# (final/) moments later, and a checkpoint saved just before it only made the end wait for its write (11.8 s held
# for Qwen3-1.7B on an H100, two steps after one by time). The cost: up to this share more of an interval lost to a
# kill in those last steps.
END_NEAR = 0.1


class SaveClock:
    """Rank 0's clock since the last save; the other ranks' never asks (they hear rank 0's answer)."""

    def __init__(self, interval_s: float = 0.0, hold_at: int = 0, rank0: bool = False, evaluates: bool = False):
        self.interval_s = interval_s  # 0: not by time (the Trainer's save_steps, or a probe that saves nothing)
        self.hold_at = hold_at  # a launch that is also the probe saves nothing before the controller's verdict
        self.rank0 = rank0
        self.evaluates = evaluates  # evaluation goes with each checkpoint saved by time, and the end (no SFT_EVAL_STEPS)
        self.since = time.monotonic()
        self.asked = False  # rank 0 asked for a save whose answer is still on its way (the agreement is lagged)

    @property
    def on(self) -> bool:
        return self.interval_s > 0

    def started(self) -> None:
        self.since, self.asked = time.monotonic(), False

    def ask(self, step: int, left_s: float | None = None) -> bool:
        """Whether this rank asks the others for a save after `step`: rank 0 alone, once per interval, unless the
        run's end (`left_s` seconds of steps away, where known) comes first or nearly (END_NEAR)."""
        if not self.on or not self.rank0 or self.asked or step <= self.hold_at:
            return False
        if left_s is not None and left_s < END_NEAR * self.interval_s:
            return False
        self.asked = time.monotonic() - self.since >= self.interval_s
        return self.asked

    def saved(self) -> None:
        """After every checkpoint (by time, at a stop, or at the end): the next is an interval from now."""
        self.started()

    def last_step(self, state) -> bool:
        """The run's last step evaluates by time too, as the Trainer's steps strategy does at its end; it saves no
        checkpoint by time: training is over, and final/ holds the model (planner/disk.py, end_checkpoint)."""
        return self.on and state.global_step >= state.max_steps
