"""The final model (OUTPUT/final/): where the end's checkpoint already holds its files, they are linked, not written
again; by time (SFT_SAVE_MINUTES, the default) the end saves no checkpoint and save_model writes final/ alone.

The Trainer's save_model writes final/ as save_pretrained does (the 16-bit weights, config, generation config,
tokenizer, training_args.bin). The checkpoint saved at the same last step holds those very files, written by the same
save_model (Trainer._save_checkpoint calls it first), and it is whole by now (ProgressCallback.on_train_end waits for
its background write). A hard link of each gives the same folder without writing the weights a second time while the
GPU waits: 3.4 GB for Qwen3-1.7B, 16 GB for Qwen3-8B, and no second copy on the disk. Where no checkpoint was saved
at the last step, or where the Trainer loaded the best checkpoint at the end (load_best_model_at_end, through
SFT_TRAINER_ARGS), save_model writes final/ as before. Every checkpoint holds the weights: at ZeRO-3 DeepSpeed gathers
them for save_model (stage3_gather_16bit_weights_on_model_save, in every shipped config; a user's file without it is
refused before any rank starts, controller/dsfile.py).

Why by hand: neither the Trainer nor transformers makes a model folder out of a checkpoint's files.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..handoff import CheckpointRecord

# A checkpoint's files that are training state, not the model: DeepSpeed's (its `latest`, its recovery scripts, its
# global_stepN/ folder) and the Trainer's (its state, the scheduler's and RNGs' torch files), and the job's record.
TRAINING_STATE = ("latest", "trainer_state.json", CheckpointRecord.FILE)
TRAINING_STATE_SUFFIXES = (".pt", ".pth")
DEEPSPEED_SCRIPTS = "zero_to_"  # zero_to_fp32.py, zero_to_torch.py (DeepSpeed's engine copies them in)


def save(trainer, final_dir: str, saved_step: int | None) -> None:
    """final/ for the model `trainer` ended with; every rank calls it (save_model gathers ZeRO-3's weights)."""
    checkpoint = Path(trainer.args.output_dir) / f"checkpoint-{trainer.state.global_step}"
    if saved_step != trainer.state.global_step or trainer.args.load_best_model_at_end:  # the best one's weights, loaded
        trainer.save_model(final_dir)  # at the end, are the model; by time the end saves no checkpoint (cadence.py)
        if trainer.args.should_save:
            print(f"[rank 0] final model: {final_dir}, written (the end saved no checkpoint to link)", flush=True)
    elif trainer.args.should_save:
        link_model(checkpoint, Path(final_dir))
        print(f"[rank 0] final model: {final_dir}, the model files of {checkpoint.name} (hard links: not written twice)",
              flush=True)


def model_files(checkpoint: Path) -> list[Path]:
    """The files of `checkpoint` that save_model wrote for the model, as it writes them into final/."""
    return sorted(p for p in checkpoint.iterdir() if p.is_file() and p.name not in TRAINING_STATE
                  and not p.name.endswith(TRAINING_STATE_SUFFIXES)
                  and not (p.name.startswith(DEEPSPEED_SCRIPTS) and p.suffix == ".py"))


def link_model(checkpoint: Path, final_dir: Path) -> None:
    """final/ as hard links of the checkpoint's model files; a copy where the two are on different disks. Made beside
    its place and renamed into it, so a final/ (which a second start takes for a finished run) is never half made."""
    if not (checkpoint / "config.json").is_file():
        raise FileNotFoundError(f"{checkpoint} holds no saved model (config.json) to make {final_dir} from")
    building = final_dir.with_name(f".{final_dir.name}-linking")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    for source in model_files(checkpoint):
        try:
            os.link(source, building / source.name)
        except OSError:  # another file system (a mount at final/), or one without hard links
            shutil.copy2(source, building / source.name)
    shutil.rmtree(final_dir, ignore_errors=True)
    building.rename(final_dir)

