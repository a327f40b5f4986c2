"""Fixes for bugs of the libraries the ranks run, each until its library fixes it (say when to remove it).

Written here, not worked around in the planner, because each keeps a combination the planner needs: the
alternative is to refuse it.
"""

from __future__ import annotations

import functools


def fused_head_with_offloaded_checkpoints() -> None:
    """TRL 1.16's fused LM head under ZeRO-3 with checkpoints kept in host memory (activation offloading).

    The head's backward gathers `lm_head.weight` again with `maybe_gather_lm_head_ctx`, which reads ZeRO-3's
    `ds_status` from it. With offloading on, autograd hands the saved weight to the offload hooks as a plain
    tensor (a detached alias, not the Parameter), TRL's hooks copy it to host memory as an activation, and the
    backward gets back a plain tensor holding the full, gathered weight: `AttributeError: 'Tensor' object has
    no attribute 'ds_status'` (seen on an H200, 2026-12-01, ZeRO-3 with SFT_GRADIENT_CHECKPOINTING=offload,
    2,048 tokens a row; docs/long-rows.md). A tensor that is not ZeRO-3's needs no gathering: it is passed by.
    Remove when TRL's maybe_gather_lm_head_ctx skips tensors without ds_status."""
    from trl.trainer import utils

    original = utils.maybe_gather_lm_head_ctx
    if getattr(original, "passes_plain_tensors", False):
        return

    @functools.wraps(original)
    def gather_zero3_parameters_only(*params):
        for p in params:
            if p is not None and not hasattr(p, "ds_status") and p.numel() == 0:
                raise RuntimeError("the LM head's saved weight is empty and not ZeRO-3's to gather: "
                                   "ZeRO-3 freed it before the backward (sft/ranks/upstream.py)")
        return original(*(p for p in params if p is None or hasattr(p, "ds_status")))

    gather_zero3_parameters_only.passes_plain_tensors = True
    # trl.trainer.utils calls it by its global name, and trl.kernels.chunked_logprob imports it from there
    # at each backward, so replacing the module's attribute reaches both.
    utils.maybe_gather_lm_head_ctx = gather_zero3_parameters_only
