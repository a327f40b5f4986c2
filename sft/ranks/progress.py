"""In every rank: a stop asked for (SIGTERM or the controller's stop file), and each step's time and tokens."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from ..handoff import CheckpointRecord, RankReport


class StopRequest:
    """A stop asked for by SIGTERM to this rank, or by the controller's stop file."""

    def __init__(self, stop_file: Path):
        self.stop_file = stop_file
        self.requested = False

    def on_signal(self, signum, frame) -> None:
        print(f"[rank {os.environ.get('RANK', '?')}] SIGTERM: saving a checkpoint at the end of this step",
              file=sys.stderr, flush=True)
        self.requested = True

    def agreed(self) -> bool:
        """True on every rank once any rank was asked to stop (all ranks must save at the same step)."""
        local = self.requested or self.stop_file.exists()
        if not dist.is_initialized():
            return local
        device = "cuda" if torch.cuda.is_available() else "cpu"
        flag = torch.tensor([1.0 if local else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # one float per step: negligible next to a step's traffic
        self.requested = bool(flag.item())
        return self.requested


class ProgressCallback(TrainerCallback):
    """Records time and tokens at every optimizer step; turns a stop request into save-and-stop; writes the
    CheckpointRecord into each checkpoint before the Trainer saves it."""

    def __init__(self, stop: StopRequest, report: RankReport, record: CheckpointRecord):
        self.stop, self.report, self.record, self.trainer = stop, report, record, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.report.train_began = time.perf_counter()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        # The steps' clock leaves evaluation out, so the run's steady speed compares with the probe's
        self.report.eval_seconds += (metrics or {}).get("eval_runtime", 0.0)

    def on_step_end(self, args, state, control, **kwargs):
        tokens = getattr(self.trainer, "_total_train_tokens", 0)  # TRL's non-padding count, all ranks
        now = time.perf_counter() - self.report.eval_seconds
        self.report.steps.append([state.global_step, now, int(tokens)])
        if self.report.first_step_wall is None:
            self.report.first_step_wall = time.time()
        if self.stop.agreed():
            control.should_save = args.save_strategy != "no"
            control.should_training_stop = True
        if control.should_save and state.is_world_process_zero:
            # Before the Trainer writes the checkpoint (trainer_state.json last), so a complete checkpoint
            # always says which stage and how many ranks wrote it: a resume must use the same.
            self.record.save(Path(args.output_dir) / f"checkpoint-{state.global_step}" / CheckpointRecord.FILE)
        return control
