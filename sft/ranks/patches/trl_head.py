"""TRL 1.16's fused LM head (its chunked log-probabilities): three patches, each until TRL changes (its "Remove
when"). The restatement that keeps the logits tiles is lm_head.py."""

from __future__ import annotations

import functools


def fused_head_with_offloaded_checkpoints() -> None:
    """TRL 1.16's fused LM head under ZeRO-3 with checkpoints kept in host memory (activation offloading).

    The head's backward gathers `lm_head.weight` again with `maybe_gather_lm_head_ctx`, which reads ZeRO-3's `ds_status`
    from it. With offloading on, autograd hands the saved weight to the offload hooks as a plain tensor (a detached
    alias, not the Parameter), TRL's hooks copy it to host memory as an activation, and the backward gets back a plain
    tensor holding the full, gathered weight: `AttributeError: 'Tensor' object has no attribute 'ds_status'` (seen with
    ZeRO-3, SFT_GRADIENT_CHECKPOINTING=offload, 2,048 tokens a row; docs/long-rows.md,
    'ZeRO-3 with the checkpoints in host memory, fixed'). A tensor that is not ZeRO-3's needs no gathering: it is passed
    by. Remove when TRL's maybe_gather_lm_head_ctx skips tensors without ds_status."""
    from trl.trainer import utils

    original = utils.maybe_gather_lm_head_ctx
    if getattr(original, "passes_plain_tensors", False):
        return

    @functools.wraps(original)
    def gather_zero3_parameters_only(*params):
        for p in params:
            if p is not None and not hasattr(p, "ds_status") and p.numel() == 0:
                raise RuntimeError("the LM head's saved weight is empty and not ZeRO-3's to gather: "
                                   "ZeRO-3 freed it before the backward (sft/ranks/patches/)")
        return original(*(p for p in params if p is None or hasattr(p, "ds_status")))

    gather_zero3_parameters_only.passes_plain_tensors = True
    # trl.trainer.utils calls it by its global name, and trl.kernels.chunked_logprob imports it from there
    # at each backward, so replacing the module's attribute reaches both.
    utils.maybe_gather_lm_head_ctx = gather_zero3_parameters_only


def every_position_scored() -> None:
    """TRL 1.16's fused LM head scores only the positions with a label (`hidden_states[mask]`), a boolean index whose
    size the host must read from the GPU: four waits for the GPU's queue a micro-step, two in the forward and two
    in the backward (reads.py says what such a wait costs). With the loss on every token the positions without a
    label are one per packed conversation, so scoring all of them (TRL's own path off Triton devices: the same
    losses, the unlabelled positions zeroed) costs about nothing and waits for nothing. Only then: with the loss
    on the assistant's turns or completions the skipped prompt tokens are worth the waits. Remove when TRL's
    compact path no longer reads the count."""
    from trl.trainer import utils

    utils._use_triton = lambda device: False


def lm_head_tiles_kept(budget: int) -> None:
    """TRL 1.16's fused LM head projects every logits tile twice, once in the forward and again in its backward
    (6.4 TFLOP a step for Qwen3-4B at 8,192 tokens). lm_head.py's restatement keeps up to `budget` bytes of the
    forward's tiles for the backward (the planner's choice, RunSpec.head_tiles_kept_bytes; 0 keeps none and is
    TRL's own). Remove when TRL keeps the tiles."""
    from trl.trainer import utils

    from .lm_head import TilesKeptLogProb

    TilesKeptLogProb.budget = budget
    utils._ChunkedLogProbFunction = TilesKeptLogProb  # _fused_forward calls it by its global name
