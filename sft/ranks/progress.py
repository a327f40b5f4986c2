"""In every rank: a stop asked for (SIGTERM or the controller's stop file), and each step's time and tokens;
in rank 0 of a training run also what `status` and the time limit read: run/progress.json, and the events
of each checkpoint saved (with how long the save took) and each evaluation."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from ..checkpoints import freed_by_removal, retire, step_of
from ..events import EVENTS_FILE, PROGRESS_FILE, CheckpointSaved, CheckpointWritten, Evaluated, EventLog, Progress
from ..handoff import CheckpointRecord, RankReport, write_json
from ..planner import disk
from .cadence import SaveClock
from .patches import background
from .patches.reads import Read

PROGRESS_EVERY_S = 2.0  # run/progress.json is rewritten at most this often (and after each save)
RATE_WINDOW = 20  # steps over which seconds per step are taken
SETTLE_S, SETTLE_POLL_S = 60.0, 0.5  # the wait for a removal's blocks to count as free (room_after)


class StopRequest:
    """A stop asked for by SIGTERM to this rank, or by the controller's stop file."""

    def __init__(self, stop_file: Path):
        self.stop_file = stop_file
        self.requested = False
        self._asked: Read | None = None  # the lagged question on its way

    def on_signal(self, signum, frame) -> None:
        print(f"[rank {os.environ.get('RANK', '?')}] SIGTERM: saving a checkpoint at the end of this step",
              file=sys.stderr, flush=True)
        self.requested = True

    def agreed(self, lagged: bool = False) -> bool:
        """True on every rank once any rank was asked to stop (all ranks must save at the same step)."""
        return self.agree(lagged)[0]

    def agree(self, lagged: bool = False, save_due: bool = False) -> tuple[bool, bool]:
        """(stop, save): each true on every rank once any rank asked for it; `save_due`: this rank asks for a
        checkpoint (rank 0's clock, ranks/cadence.py), which the same all-reduce carries.

        lagged: what the ranks agreed at the previous lagged call, this call's question sent on its way, so the
        host never waits for the step the GPU is still running (reads.py says why that matters); at each step,
        where a stop then comes one step later. One rank has no one to agree with: nothing is sent."""
        local = self.requested or self.stop_file.exists()
        if not dist.is_initialized() or dist.get_world_size() == 1:
            self.requested = local
            return local, save_due
        device = "cuda" if torch.cuda.is_available() else "cpu"
        flags = torch.tensor([float(local), float(save_due)], device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)  # two floats per step: negligible next to a step's traffic
        asked = Read(flags)
        if lagged:
            asked, self._asked = self._asked, asked
        stop, save = (False, False) if asked is None else (v > 0 for v in asked.value().tolist())
        self.requested = local or stop
        return stop, save


class LossNotFinite(RuntimeError):
    """The loss or the gradient norm is NaN or infinite: the weights are no longer usable."""


def not_finite(logs: dict, step: int, step_applied: bool = True) -> LossNotFinite | None:
    """The error for a logged loss that is NaN or infinite, or a gradient norm that says a NaN or infinite
    gradient reached the weights, else None. `step_applied`: DeepSpeed's `was_step_applied()` for that step."""
    # DeepSpeed 0.19 reports a NaN or infinite gradient as an infinite norm (combine_grad_norm_groups turns its
    # helpers' -1 mark into +inf; -1 itself is read the same). Where its overflow check skips that step (fp32,
    # fp16, ZeRO-3, a user's bf16 config that keeps the check) the weights are as before and training goes on.
    # bf16 at ZeRO-1/2 in the shipped configs has the check off (sft/stages.py): the step is applied, its
    # gradients clipped by an infinite norm (NaN x 0 is NaN), and the weights hold NaN from then on.
    def bad(key: str, value: float) -> bool:
        if key == "loss":
            return not math.isfinite(value)
        return key == "grad_norm" and (math.isnan(value) or (step_applied and (math.isinf(value) or value < 0)))

    shown = ", ".join(f"{k} {v}" + (" (a NaN or infinite gradient, applied to the weights)" if k == "grad_norm"
                                    and not math.isnan(v) else "")
                      for k, v in logs.items() if isinstance(v, float) and bad(k, v))
    if not shown:
        return None
    return LossNotFinite(
        f"{shown} at step {step}: training diverged and the weights are no longer usable, so the ranks stopped "
        "without saving them (the checkpoints before stay). Try SFT_COMPILE=false if the model was compiled, "
        "a lower SFT_LEARNING_RATE, or SFT_PRECISION=fp32 to tell a bf16 overflow from a bad row.")


class ProgressCallback(TrainerCallback):
    """Records time and tokens at every optimizer step; turns a stop request into save-and-stop; writes the
    CheckpointRecord into each checkpoint before the Trainer saves it."""

    def __init__(self, stop: StopRequest, report: RankReport, record: CheckpointRecord, run_dir: Path | None = None,
                 clock: SaveClock | None = None):
        self.stop, self.report, self.record, self.trainer = stop, report, record, None
        self.clock = clock or SaveClock()  # checkpoints by time (SFT_SAVE_MINUTES); off: the Trainer's save_steps
        # rank 0 of a training run only (None elsewhere): the run's events and progress
        self.run_dir = run_dir
        self.events = EventLog(run_dir / EVENTS_FILE if run_dir else None)
        self.progress = Progress()
        self._written = 0.0
        self._save_began: float | None = None
        self.saved_step: int | None = None  # the step of the newest checkpoint this run saved (every rank)
        self.hold = None  # a Hold (ranks/hold.py) where this training launch is also the probe
        self._retired_bytes = 0  # rank 0: what removing the checkpoints this save retired gives back

    def on_train_begin(self, args, state, control, **kwargs):
        self.report.train_began, self.report.train_began_wall = time.perf_counter(), time.time()
        self.clock.started()

    def on_step_end(self, args, state, control, **kwargs):
        self._written_in_background(state)
        tokens = getattr(self.trainer, "_total_train_tokens", 0)  # TRL's non-padding count, all ranks
        now = time.perf_counter() - self.report.eval_seconds - self.report.held_seconds
        self.report.steps.append([state.global_step, now, int(tokens)])
        if self.report.first_step_wall is None:
            self.report.first_step_wall = time.time()
        if self.hold is not None and self.hold.due(state.global_step, state.max_steps):
            flags = dataclasses.asdict(control)
            self.hold.wait(self.trainer, state.global_step)
            for name, value in flags.items():  # the probe's timed evaluation clears the step's own log and evaluation
                setattr(control, name, value)
        per_step = self.progress.seconds_per_step  # rank 0's, the one that asks
        left_s = (state.max_steps - state.global_step) * per_step if per_step and state.max_steps > 0 else None
        stop, save_due = self.stop.agree(lagged=True, save_due=self.clock.ask(state.global_step, left_s))
        if save_due:
            control.should_save = True
        if save_due or self.clock.last_step(state):  # the end evaluates; its model is final/ (cadence.py)
            control.should_evaluate = control.should_evaluate or self.clock.evaluates
        if stop:
            control.should_save = args.save_strategy != "no" or self.clock.on  # a probe saves nothing
            control.should_training_stop = True
        if self.hold is not None and self.report.status == "ended":  # the probe's verdict (hold.py): keep nothing
            control.should_save, control.should_training_stop = False, True
        if control.should_save:
            self._refuse_to_save_diverged(state)
            self._save_began = time.monotonic()
            self._previous_written_and_rotated(args, state)  # before this checkpoint's folder exists
        if control.should_save and state.is_world_process_zero:
            # Before the Trainer writes the checkpoint (trainer_state.json last), so a complete checkpoint
            # always says which stage and how many ranks wrote it (a resume must use the same), and the
            # tokens so far (TRL counts from zero in each process: a resume counts on from these).
            record = dataclasses.replace(self.record, tokens=int(tokens))
            record.save(Path(args.output_dir) / f"checkpoint-{state.global_step}" / CheckpointRecord.FILE)
        self._write_progress(state, force=False)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        error = not_finite(logs or {}, state.global_step, self._step_applied())
        if error:
            raise error

    def _last_step(self) -> tuple[float | None, bool]:
        """DeepSpeed's gradient norm of the last optimizer step, and whether that step changed the weights."""
        engine = getattr(self.trainer, "model_wrapped", None)
        norm = getattr(engine, "get_global_grad_norm", lambda: None)()  # waits for the step: before a save only
        return (None if norm is None else float(norm)), self._step_applied()

    def _step_applied(self) -> bool:
        engine = getattr(self.trainer, "model_wrapped", None)
        return bool(getattr(engine, "was_step_applied", lambda: True)())

    def _refuse_to_save_diverged(self, state) -> None:
        """Before a checkpoint: the loss summed since the last log (the Trainer's own running sum, which holds
        a NaN once one step had it) must be finite, and the last step must not have applied a NaN or infinite
        gradient (DeepSpeed's norm), so a diverged model never replaces a good checkpoint at a step not logged."""
        running = getattr(self.trainer, "_tr_loss", None)
        norm, applied = self._last_step()
        norm_error = not_finite({"grad_norm": norm}, state.global_step, applied) if norm is not None else None
        loss_bad = isinstance(running, torch.Tensor) and not bool(torch.isfinite(running.detach()).all())
        bad = torch.tensor([float(loss_bad), float(norm_error is not None)])
        if dist.is_initialized():  # one rank's NaN stops them all here, before the save's collectives
            bad = bad.to("cuda" if torch.cuda.is_available() else "cpu")
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if bad[0].item():
            raise not_finite({"loss": float("nan")}, state.global_step)
        if bad[1].item():
            raise norm_error or not_finite({"grad_norm": float("nan")}, state.global_step)

    def on_save(self, args, state, control, **kwargs):
        """After each checkpoint: its save time and event (rank 0 of a training run); and when the disk cannot
        hold the rest of the run, every rank stops here, at a complete checkpoint, instead of failing at a
        later save (the controller then exits 3)."""
        if (writer := background.writer()) is not None:
            writer.seal()
        self.saved_step = state.global_step
        self._saved(args, state)
        self._written_in_background(state)
        self.clock.saved()
        if state.is_world_process_zero:
            every = disk.steps_between_saves(args.save_steps if args.save_strategy == "steps" else None,
                                             self.clock.interval_s, self.progress.seconds_per_step)
            fits, message = room_after(args, state, kwargs["model"], every, self._retired_bytes)
            print(f"[rank 0] disk after checkpoint-{state.global_step}: {message}", flush=True)
            if not fits:
                self.report.stop_reason = message
                self.stop.requested = True
        if self.stop.agreed():  # every rank takes part: one rank's verdict stops them all
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        """The checkpoint still being written is whole before the rank goes on: to the final model, or its end."""
        self._previous_written_and_rotated(args, state)

    def _previous_written_and_rotated(self, args, state) -> None:
        """The checkpoint still being written made whole, then the rotation its save could not finish: that kept
        one more while the newest was being written (patches/checkpoints.py). Run before the next save (a save waits
        for the write in flight anyway) and at the end, so the disk holds at most SFT_SAVE_TOTAL_LIMIT complete
        checkpoints and the one being written, as the disk preflight counts: with the rotation left to the next
        save's end, the oldest was still there while the next one's files were written, one checkpoint more (on a
        GPU machine whose disk held two checkpoints of Qwen3-1.7B, the third save filled it). The retired ones are
        renamed here and removed by the writer's thread before it writes the next checkpoint's files."""
        if (writer := background.writer()) is None:
            return
        writer.wait()
        self._written_in_background(state)
        if dist.is_initialized():
            dist.barrier()  # every rank's files of the newest are written before it counts as complete
        if args.should_save and args.save_total_limit:
            retire(Path(args.output_dir), args.save_total_limit, state.best_model_checkpoint)
        if dist.is_initialized():
            dist.barrier()  # renamed before any rank looks for them
        if state.is_world_process_zero:
            self._retired_bytes = freed_by_removal(Path(args.output_dir))
        writer.clear(Path(args.output_dir), remover=args.should_save)  # behind the steps, before the next files

    def _written_in_background(self, state) -> None:
        """A background write's failure (a full disk) raised here, in the training's thread, as a save at once
        raised it; each checkpoint written told (rank 0), and a stop for time leaves room for the whole write."""
        if (writer := background.writer()) is None:
            return
        writer.check()
        for done in writer.written():
            if self.run_dir is None or not state.is_world_process_zero:
                continue
            step = step_of(Path(done.folder))
            self.events.emit(CheckpointWritten(step=step, seconds=done.seconds, bytes=done.bytes, path=done.folder))
            if self.progress.last_save_step == step:
                self.progress.last_save_seconds = round((self.progress.last_save_seconds or 0) + done.seconds, 2)

    def _saved(self, args, state) -> None:
        if self._save_began is None or self.run_dir is None or not state.is_world_process_zero:
            return
        seconds = round(time.monotonic() - self._save_began, 2)
        self._save_began = None
        self.progress.last_save_step, self.progress.last_save_seconds = state.global_step, seconds
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        self.events.emit(CheckpointSaved(step=state.global_step, seconds=seconds, path=str(path)))
        self._write_progress(state, force=True)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        # The steps' clock leaves evaluation out, so the run's steady speed compares with the probe's
        self.report.eval_seconds += (metrics or {}).get("eval_runtime", 0.0)
        if self.run_dir is not None and state.is_world_process_zero and metrics and "eval_loss" in metrics:
            numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
            self.events.emit(Evaluated(step=state.global_step, metrics=numbers))

    def _write_progress(self, state, force: bool) -> None:
        """run/progress.json: the step, and seconds per step over the last steps without a save in them."""
        if self.run_dir is None or not state.is_world_process_zero:
            return
        now = time.time()
        if not force and now - self._written < PROGRESS_EVERY_S:
            return
        p = self.progress
        p.step, p.max_steps, p.epoch, p.updated = state.global_step, state.max_steps, state.epoch or 0.0, now
        recent = self.report.steps[-RATE_WINDOW:]
        if len(recent) >= 2:  # the median: a save or an evaluation lands in one step's interval
            p.seconds_per_step = round(statistics.median(
                (b[1] - a[1]) / max(b[0] - a[0], 1) for a, b in zip(recent, recent[1:])), 4)
        write_json(self.run_dir / PROGRESS_FILE, p.to_dict())
        self._written = now


def room_after(args, state, model, every: int, retired: int = 0) -> tuple[bool, str]:
    """The newest checkpoint's real size against the room the rest of the run needs, a checkpoint every `every`
    steps and one at the end where it saves one: (fits, why). The background write in flight counts as on the disk
    already, the retired checkpoints as gone. `retired`: the bytes this save's retired checkpoints held
    (freed_by_removal)."""
    from ..checkpoints import all_checkpoints, folder_bytes, free_after_writes, unwritten_bytes

    out = Path(args.output_dir)
    newest = out / f"checkpoint-{state.global_step}"
    params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())  # ZeRO-3 holds a shard
    size = folder_bytes(newest) + unwritten_bytes(newest)
    end_saves = disk.end_checkpoint(args.save_strategy == "steps")
    final = 0 if disk.final_linked(args.load_best_model_at_end, end_saves) else params * disk.weight_bytes(args.bf16)

    def verdict(uncounted: int = 0) -> tuple[bool, str]:
        left = disk.saves_left(state.global_step, state.max_steps, every, end_saves)
        return disk.room_after_save(size, free_after_writes(out, newest) + uncounted, len(all_checkpoints(out)),
                                    args.save_total_limit, left, final)

    fits, message = verdict()
    if fits or not retired or not verdict(retired)[0]:
        return fits, message
    # Some filesystems count a removed file's blocks as free only a while after the unlink: on an H100 machine's
    # disk, free space read during a 27.5 GB checkpoint's removal was 21 GB short, and a run that fit was stopped.
    # Where the retired checkpoints' bytes would make the room, the disk is given time to count them.
    print(f"[rank 0] disk after checkpoint-{state.global_step}: short, unless the {retired / 1e9:.3g} GB of "
          f"the checkpoints just removed are not yet counted free; waiting up to {SETTLE_S:.0f} s", flush=True)
    deadline = time.monotonic() + SETTLE_S
    while not fits and time.monotonic() < deadline:
        time.sleep(SETTLE_POLL_S)
        fits, message = verdict()
    return fits, message
