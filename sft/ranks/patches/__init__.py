"""Fixes of the libraries the ranks run, for their bugs and their costs, each written for one version and kept
until that library changes (each function says when to remove it). Written here, not worked around in the
planner, because each keeps a combination the planner needs: the alternative is to refuse it, or to wait minutes.

    trl_head.py           TRL 1.16's fused LM head: ZeRO-3 with offloaded checkpoints, every position scored, the
                          logits tiles kept for the backward (lm_head.py, the restatement that keeps them)
    masks.py              Transformers 5.24's masks: flex attention's block mask uncompiled, packed rows unchecked
    flash_attention_4.py  Transformers 5.24's FlashAttention-4 forward: outside the compiled graph, after the
                          kernels compiled ahead
    zero_step.py          DeepSpeed 0.19.8's ZeRO-1/2 step: the gradient norm in fp32, the optimizer's pass as one
                          (adamw.py)
    checkpoints.py        DeepSpeed's checkpoint engine: no CRC32 of each record, storages through a pinned ring
                          (saving.py) or written while the steps go on (background.py, weights.py for the
                          Trainer's model.safetensors); ZeRO-1/2's weights not cloned to the host first; the
                          Trainer's rotation keeping a complete checkpoint while the newest is written
    reads.py              the Trainer's step without waiting on the GPU for the numbers it logs
    universal.py          DeepSpeed 0.19's ZeRO-3 universal load: one Adam step count per sub-group
    seqpar.py             DeepSpeed's Ulysses batch adapter as the Trainer reads it

`apply(spec)` is the one place that says which of them a run takes.
"""

from __future__ import annotations

from ...handoff import RunSpec
from . import background, checkpoints, flash_attention_4, masks, trl_head, zero_step


def apply(spec: RunSpec) -> None:
    """The patches this run's stage, attention and loss need, applied before the Trainer is made."""
    if spec.stage.startswith("3"):
        trl_head.fused_head_with_offloaded_checkpoints()  # a no-op for ZeRO-3's own parameters
    else:
        zero_step.gradient_norm_in_fp32()
        zero_step.zero_step_in_one_pass()
    if spec.attention == "flex_attention":  # the mask is built in the model's forward, never compiled
        masks.flex_block_mask_uncompiled()
    if spec.attention == "flash_attention_4":  # outside the compiled graph; its kernels compiled ahead
        flash_attention_4.flash_attention_4(outside_compile=spec.compile, kernels_ahead_lock=spec.attention_lock)
        masks.packed_rows_unchecked()  # the packed rows' mask is None whatever it is asked
    if spec.data is not None and spec.data.loss_on == "all":  # nothing worth a wait to skip in the LM head
        trl_head.every_position_scored()
    trl_head.lm_head_tiles_kept(spec.head_tiles_kept_bytes)  # what the plan counted (planner/memory.py)
    checkpoints.checkpoints_without_crc32()
    checkpoints.checkpoints_by_records(background=spec.save_background, reserve_bytes=spec.snapshot_bytes)
    if not spec.stage.startswith("3"):  # ZeRO-3's module state holds no weights, and its model is gathered
        checkpoints.weights_saved_where_they_are()
    if spec.save_background:
        checkpoints.rotation_keeps_a_complete_one()
        checkpoints.checkpoint_weights_in_background()
