"""In every rank: a stop asked for (SIGTERM or the controller's stop file), and each step's time and tokens."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from ..handoff import CheckpointRecord, RankReport
from . import faults


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

    def on_step_end(self, args, state, control, **kwargs):
        tokens = getattr(self.trainer, "_total_train_tokens", 0)  # TRL's non-padding count, all ranks
        self.report.steps.append([state.global_step, time.perf_counter(), int(tokens)])
        if self.report.first_step_wall is None:
            self.report.first_step_wall = time.time()
        if self.stop.agreed():
            control.should_save = args.save_strategy != "no"
            control.should_training_stop = True
        if control.should_save and state.is_world_process_zero:
            faults.fill_disk(state.global_step)
            # Before the Trainer writes the checkpoint (trainer_state.json last), so a complete checkpoint
            # always says which stage and how many ranks wrote it (a resume must use the same), and the
            # tokens so far (TRL counts from zero in each process: a resume counts on from these).
            record = dataclasses.replace(self.record, tokens=int(tokens))
            record.save(Path(args.output_dir) / f"checkpoint-{state.global_step}" / CheckpointRecord.FILE)
        return control

    def on_save(self, args, state, control, **kwargs):
        """After each checkpoint: when the disk cannot hold the rest of the run, every rank stops here, at a
        complete checkpoint, instead of failing at a later save (the controller then exits 3)."""
        if state.is_world_process_zero:
            check = room_after(args, state, kwargs["model"])
            print(f"[rank 0] disk after checkpoint-{state.global_step}: {check.message}", flush=True)
            if check.status == "fail":
                self.report.stop_reason = check.message
                self.stop.requested = True
        if self.stop.agreed():  # every rank takes part: one rank's verdict stops them all
            control.should_training_stop = True
        return control


def room_after(args, state, model):
    """The newest checkpoint's real size against the room the rest of the run needs (a preflight Check)."""
    from ..checkpoints import all_checkpoints
    from ..controller.machine import folder_bytes, free_disk
    from ..controller.preflight import check_room
    from ..planner import disk

    out = Path(args.output_dir)
    params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())  # ZeRO-3 holds a shard
    return check_room(folder_bytes(out / f"checkpoint-{state.global_step}"), free_disk(str(out)),
                      len(all_checkpoints(out)), args.save_total_limit,
                      disk.saves_left(state.global_step, state.max_steps, args.save_steps),
                      params * disk.weight_bytes(args.bf16))
