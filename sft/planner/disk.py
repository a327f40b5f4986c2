"""What the output folder's disk must hold: a checkpoint's size before the first save (from the precision,
the ZeRO stage and the optimizer), and after each save whether the rest of the run still fits. Pure.

A checkpoint, as the Trainer and DeepSpeed write it (on the demo model's 103,040 parameters in fp32, 20
bytes/param predicted at ZeRO-2 and 16 at ZeRO-3, 2.35 and 1.84 MB measured: the rest is the tokenizer,
RNG states and scripts every checkpoint holds; docs/how-it-works.md):
    model.safetensors        the weights in the run's precision (ZeRO-3: gathered, as the shipped configs say)
    mp_rank_00_model_states  the weights again in the run's precision, at ZeRO-1 and 2 only
    *_optim_states           DeepSpeed's fp32 master weights (4 bytes/param, in fp32 runs too) and the
                             optimizer's own state (AdamW: two fp32 moments, 8 bytes/param)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..stages import Stage

MASTER_BYTES = 4  # DeepSpeed's fp32 copy of the weights, which ZeRO keeps whatever the precision
DEFAULT_OPTIMIZER = "adamw_torch"  # the Trainer's, unless SFT_TRAINER_ARGS or the DeepSpeed file name another
# The optimizer's state tensors per parameter, by a word in its name (the Trainer's `optim` or DeepSpeed's
# optimizer type); the first word found counts, and a name with none is taken as Adam-like (two).
STATES = (("ademamix", 3), ("adafactor", 0), ("lomo", 0), ("lion", 1), ("sgd", 1), ("rmsprop", 1), ("adagrad", 1),
          ("adam", 2), ("lamb", 2))


def weight_bytes(bf16: bool) -> int:
    return 2 if bf16 else 4


def end_checkpoint(by_steps: bool) -> bool:
    """Whether the run's last step saves a whole checkpoint. With SFT_SAVE_STEPS it does, as the Trainer's steps
    strategy always has. By time (SFT_SAVE_MINUTES) the end writes the model alone, final/, as torchtitan's
    last_save_model_only does by default: training is over, so the optimizer's state (six times the 16-bit weights
    with AdamW) would be written only to be waited for, and it is never uploaded (final/ is). SIGTERM and the time
    limit still save whole checkpoints: those runs go on."""
    return by_steps


def final_linked(load_best_model_at_end: bool, end_saves: bool) -> bool:
    """Whether final/ takes no room of its own: where the run's last step saves a checkpoint (`end_saves`,
    end_checkpoint), final/ is hard links to its model files (ranks/final.py), but where the Trainer loads the best
    checkpoint at the end (SFT_TRAINER_ARGS' load_best_model_at_end) and writes that model again."""
    return end_saves and not load_best_model_at_end


def optimizer_of(ds_config: Mapping[str, Any], trainer_args: Mapping[str, Any], stage: Stage | None = None) -> str:
    """The optimizer the ranks will run: the option's (8-bit AdamW), else the DeepSpeed file's own, else
    SFT_TRAINER_ARGS' optim, else the Trainer's."""
    if stage is not None and stage.optimizer:
        return stage.optimizer
    section = ds_config.get("optimizer")
    if isinstance(section, Mapping) and isinstance(section.get("type"), str):
        return section["type"]
    return str(trainer_args.get("optim", DEFAULT_OPTIMIZER))


def optimizer_state_bytes(optimizer: str) -> tuple[float, str]:
    """Bytes per parameter of the optimizer's state, and what they are."""
    name = optimizer.lower()
    states = next((n for word, n in STATES if word in name), None)
    width = 1.0 if "8bit" in name else 0.5 if "4bit" in name else 4.0
    if states is None:
        return 2 * width, f"{optimizer}: taken as Adam-like, 2 states"
    return states * width, f"{optimizer}: {states} state(s) of {width:g} byte(s)"


def checkpoint_bytes_per_param(bf16: bool, zero: int, optimizer: str) -> tuple[float, str]:
    """A checkpoint's bytes per parameter, and the sum that makes them."""
    weights = weight_bytes(bf16) * (1 if zero >= 3 else 2)  # ZeRO-1 and 2 also save the module's weights
    state, what = optimizer_state_bytes(optimizer)
    total = weights + MASTER_BYTES + state
    copies = "once" if zero >= 3 else "twice"
    return total, (f"{total:g} bytes/param: {'bf16' if bf16 else 'fp32'} weights {copies} ({weights}), fp32 master "
                   f"weights ({MASTER_BYTES}), optimizer state ({what}: {state:g})")


def snapshot_bytes(total_params: int | None, bf16: bool, zero: int, optimizer: str, nodes: int = 1) -> int | None:
    """Host memory one node's ranks keep for a checkpoint written in the background (ranks/patches/background.py):
    one checkpoint's files (DeepSpeed's and the Trainer's model.safetensors)."""
    if total_params is None:
        return None
    per_param, _ = checkpoint_bytes_per_param(bf16, zero, optimizer)
    return int(total_params * per_param / max(nodes, 1))


def steps_between_saves(save_steps: int | None, save_seconds: float | None, seconds_per_step: float | None) -> int:
    """Optimizer steps from one checkpoint to the next: SFT_SAVE_STEPS, or the steps that fill SFT_SAVE_MINUTES at
    `seconds_per_step` (the ranks count the interval from the end of the last save, so whole steps, rounded up).
    Speed unknown: 1, the most checkpoints there can be (the safe side for the disk and the time)."""
    if save_steps is not None:
        return save_steps
    if not seconds_per_step or seconds_per_step <= 0 or save_seconds is None:
        return 1
    return max(1, math.ceil(save_seconds / seconds_per_step))


def saves_left(step: int, max_steps: int, save_steps: int, at_end: bool = True) -> int:
    """Checkpoints the run still writes after `step`: every save_steps before the last step, and one at the last
    step where the end saves one (`at_end`, end_checkpoint)."""
    if max_steps <= step:
        return 0
    return (max_steps - 1) // save_steps - step // save_steps + (1 if at_end else 0)


def room_after_save(checkpoint_bytes: int, free_bytes: int, kept: int, save_total_limit: int, left: int,
                    final_bytes: int) -> tuple[bool, str]:
    """After a save: whether the disk holds the rest of the run (the checkpoints still to come, up to
    save_total_limit + 1 at once, since a new one is written before the oldest goes, then final/)."""
    more = max(min(kept + left, save_total_limit + 1) - kept, 0)
    needed = more * checkpoint_bytes + final_bytes
    gb = 1e9
    final = f"the {final_bytes / gb:.3g} GB final model" if final_bytes else "final/ as links to the last one's files"
    shown = (f"a checkpoint takes {checkpoint_bytes / gb:.3g} GB on disk; {free_bytes / gb:.3g} GB free, the rest of "
             f"the run needs {needed / gb:.3g} GB ({more} more checkpoint(s) at once and {final})")
    if free_bytes >= needed:
        return True, shown
    return False, (f"{shown}: the disk would fill before the run ends, so it stops now, at this complete "
                   "checkpoint. Free space or mount a larger volume (or lower SFT_SAVE_TOTAL_LIMIT), then start "
                   "again: it resumes from here")


def full_after_failure(free_bytes: int, checkpoint_bytes: int | None) -> bool:
    """A failed run whose disk has not room for one more checkpoint failed for room, most likely."""
    return checkpoint_bytes is not None and free_bytes < checkpoint_bytes
