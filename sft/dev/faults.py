"""The one seam where tests inject faults into a rank: a machine with no GPU cannot run out of GPU memory,
so the controller's answers to it (escalation, the batch search passing a split over) are tested end to
end by raising the real error here; a disk that another writer fills just before a save, so the save
meets a real full disk; and a CPU step lasts milliseconds, so the time limit's and the budget's answers
to a run of hours are tested on steps slowed down here. Also where a test reads what a rank computed (each
token's loss). Read from SFTTEST_* variables, which no user sets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..handoff import RunSpec


def inject(spec: RunSpec) -> None:
    """In a probe: raise torch's OutOfMemoryError for the stages in SFTTEST_OOM_STAGES and the micro-batches
    in SFTTEST_OOM_MICRO_BATCHES (comma-separated); a training launch that is also the probe counts as one."""
    if not spec.probes:
        return
    if spec.stage in _listed("SFTTEST_OOM_STAGES"):
        raise torch.OutOfMemoryError(f"CUDA out of memory (simulated for ZeRO {spec.stage} by SFTTEST_OOM_STAGES)")
    if str(spec.micro_batch) in _listed("SFTTEST_OOM_MICRO_BATCHES"):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated for this micro-batch by SFTTEST_OOM_MICRO_BATCHES)")


def slow_writes() -> None:
    """SFTTEST_WRITE_SECONDS: each checkpoint file written in the background waits that long before its bytes are
    written (a slow disk), so a test can stop or kill the job while a checkpoint is being written."""
    seconds = float(os.environ.get("SFTTEST_WRITE_SECONDS") or 0)
    if seconds > 0:
        from ..ranks.patches import background

        if (writer := background.writer()) is not None:
            writer.slower_s = seconds


def _listed(variable: str) -> list[str]:
    return os.environ.get(variable, "").split(",")


def fill_disk(step: int) -> None:
    """SFTTEST_FILL_DISK=STEP:LEFT:PATH: at that step, before its checkpoint, another writer fills the disk that
    holds PATH with a file there, leaving LEFT bytes free."""
    at, left, path = (os.environ.get("SFTTEST_FILL_DISK", "").split(":", 2) + ["", ""])[:3]
    if not path or int(at) != step:
        return
    st = os.statvfs(Path(path).parent)
    with open(path, "wb") as filler:
        os.posix_fallocate(filler.fileno(), 0, max(st.f_bavail * st.f_frsize - int(left), 1))


def slow_steps() -> list:
    """SFTTEST_STEP_SECONDS makes every optimizer step last that much longer (a slower machine), in the probe and in
    training alike: a callback ahead of the rank's own, so the step times count it."""
    seconds = float(os.environ.get("SFTTEST_STEP_SECONDS") or 0)
    if seconds <= 0:
        return []
    import time

    from transformers import TrainerCallback

    class SlowSteps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(seconds)

    return [SlowSteps()]


def read_only(step: int) -> None:
    """SFTTEST_READ_ONLY=STEP:FOLDER: at that step, before its checkpoint, FOLDER turns read-only, as a storage fault
    or an operator does it mid-run: a read-only bind mount of it over itself (a remount of the whole filesystem is
    refused while the job holds its lock file open for writing; every path opened from now on is refused)."""
    at, _, folder = os.environ.get("SFTTEST_READ_ONLY", "").partition(":")
    if folder and int(at) == step:
        import subprocess

        subprocess.run(["mount", "--bind", folder, folder], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", folder], check=True)


def full_disk() -> list:
    """SFTTEST_FILL_DISK (fill_disk) and SFTTEST_READ_ONLY (read_only): a callback after the rank's own, so it sees
    the save they asked for."""
    if not (os.environ.get("SFTTEST_FILL_DISK") or os.environ.get("SFTTEST_READ_ONLY")):
        return []
    from transformers import TrainerCallback

    class FillDisk(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if control.should_save and state.is_world_process_zero:
                fill_disk(state.global_step)
                read_only(state.global_step)

    return [FillDisk()]


def record_token_losses(model, spec: RunSpec) -> None:
    """SFTTEST_TOKEN_LOSSES=FOLDER: in training, each rank appends the per-token log-probabilities of every
    forward (TRL's fused LM head: 0 where a token has no label) to FOLDER/rankN.jsonl, one line a forward, so a
    test can put a split row's shards together and compare them with the unsplit run's row. Observes only."""
    folder = os.environ.get("SFTTEST_TOKEN_LOSSES")
    if not folder or spec.mode != "train":
        return
    path = Path(folder) / f"rank{os.environ.get('RANK', '0')}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(module, args, output) -> None:
        if module.training and getattr(output, "log_probs", None) is not None:
            with path.open("a") as f:
                f.write(json.dumps(output.log_probs.detach().float().tolist()) + "\n")

    model.register_forward_hook(write)
