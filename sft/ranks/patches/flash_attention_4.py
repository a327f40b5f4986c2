"""Transformers 5.24's FlashAttention-4 forward, outside the compiled graph and after the kernels compiled ahead;
until flash-attn-4 registers its kernels as torch custom ops (its "Remove when")."""

from __future__ import annotations

import functools
import os

import torch


def flash_attention_4(outside_compile: bool, kernels_ahead_lock: str = "") -> None:
    """Transformers 5.24's FlashAttention-4 forward, registered for "flash_attention_4" through its
    AttentionInterface with two changes.

    Outside the compiled graph (`outside_compile`, where the layers are compiled): Dynamo traces into Transformers'
    forward and flash-attn-4 4.0.0b36's Python interface, which break its graph several times and guard on what
    changes from layer to layer and batch to batch (`module.layer_idx`, the packed sequences' count, their longest
    length): it recompiled each layer until its recompile limit (8) and left the later layers' frames uncompiled.
    The attention call is a CuTe kernel either way, so it is run as it is, outside the compiled graph, which breaks
    there once. The first run's warm-up and its start to the first step fell, the steady rate and the losses
    unchanged (measured: docs/speed.md, 'start to first step 57.5 s with nothing cached, 47.6 s cached'). Remove
    when flash-attn-4 registers its kernels as torch custom ops.

    After the kernels compiled ahead (`kernels_ahead_lock`: RunSpec.attention_lock): the first call waits for
    the process compiling them beside the rank's start (ranks/attention_ahead.py), then loads them from the
    persistent cache instead of compiling them again."""
    from transformers.integrations.flash_attention import flash_attention_forward
    from transformers.modeling_utils import AttentionInterface

    forward = flash_attention_forward
    if kernels_ahead_lock:
        forward = _after_kernels_ahead(forward, kernels_ahead_lock)
    if outside_compile:
        forward = torch.compiler.disable(forward)
    AttentionInterface.register("flash_attention_4", forward)


def _after_kernels_ahead(forward, lock: str):
    from ..attention_ahead import wait

    waited = []

    @functools.wraps(forward)
    def after(*args, **kwargs):
        if not waited:
            waited.append(wait(lock))
            if waited[0] >= 0.1 and int(os.environ.get("RANK", "0")) == 0:
                print(f"waited {waited[0]:.1f} s for FlashAttention-4's kernels compiled ahead", flush=True)
        return forward(*args, **kwargs)

    return after
