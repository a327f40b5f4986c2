"""ZeRO-1/2's optimizer step in one pass (zero_step.py) for bitsandbytes' 8-bit AdamW, the optimizer of the options with
8-bit state (stages.py): its own kernel, fed the 16-bit gradient slice by slice, into the fp32 master weights, then
the 16-bit weights from them.

Why by hand: DeepSpeed's step (stage_1_and_2.py::step) first casts the whole gradient partition to a new fp32 buffer,
4 bytes a parameter: for Qwen3-8B on one GPU, 30 GiB beside the states at the step's peak, the difference between
fitting ZeRO-2 on one H200 and not (docs/memory-planner.md). bitsandbytes' kernel wants the gradient in the master
weights' dtype, so here it gets one fp32 slice at a time (SLICE elements, 256 MiB), cast and clipped, the slices whole
blocks of its quantisation: each block of 256 and its absmax are updated by the same kernel as in
`Optimizer2State.update_step`, so the state is bitsandbytes' own, element for element (tests/test_adamw8bit.py), and
checkpoints, their resume and bitsandbytes' state_dict read it as before. It also skips bitsandbytes' step's
`sync_gpu` after each parameter.
"""

from __future__ import annotations

import functools
import sys

import torch

BLOCK = 256  # bitsandbytes' 8-bit blockwise optimizers quantise the state in blocks of this many elements
SLICE = 1 << 26  # elements per kernel call: whole blocks, and a bounded fp32 gradient (256 MiB)


def supports(optimizer: torch.optim.Optimizer, device: torch.device) -> bool:
    """bitsandbytes' AdamW as the Trainer makes it for `adamw_bnb_8bit` (8-bit, not paged, no update-norm clipping),
    on a GPU or the host."""
    try:
        from bitsandbytes.optim.optimizer import Optimizer2State
    except ImportError:
        return False
    if not isinstance(optimizer, Optimizer2State) or optimizer.optimizer_name != "adam" or optimizer.is_paged:
        return False
    args = optimizer.args
    return args.optim_bits == 8 and args.max_unorm == 0.0 and device.type in ("cuda", "cpu")


@functools.cache
def _kernel_agrees(device: torch.device) -> bool:
    """The one-pass kernel where it proved itself against bitsandbytes' on this GPU (adamw8bit_kernel.agrees), once
    per process; else bitsandbytes' kernel, said on stderr."""
    try:
        from . import adamw8bit_kernel  # Triton: CUDA builds of torch bring it

        if adamw8bit_kernel.agrees(device):
            return True
        why = "differs from bitsandbytes' here"
    except Exception as e:  # Triton cannot compile for this GPU, say: bitsandbytes' own kernel may still step
        why = f"does not run here ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    print(f"8-bit AdamW: the one-pass kernel {why}; bitsandbytes' kernel steps instead", file=sys.stderr, flush=True)
    return False


@torch.no_grad()
def step(optimizer: torch.optim.Optimizer, group_index: int, master: torch.Tensor, gradient: torch.Tensor,
         weights: torch.Tensor, scale: torch.Tensor) -> None:
    """One step of `master` (the group's fp32 partition, its only parameter) from `gradient` x `scale`, as
    bitsandbytes' `Optimizer2State.update_step` makes it, then `weights` (its 16-bit partition) from it."""
    from bitsandbytes import functional as F

    group = optimizer.param_groups[group_index]
    state = optimizer.state[master]
    if not state:
        optimizer.init_state(group, master, group_index, 0)
    config = optimizer.get_config(group_index, 0, group)
    state["step"] += 1
    beta1, beta2 = config["betas"][:2]
    one_pass = master.is_cuda and state["state1"].dtype == torch.uint8 and not config["skip_zeros"] \
        and _kernel_agrees(master.device)
    if one_pass:
        from .adamw8bit_kernel import update
    for start in range(0, master.numel(), SLICE):
        part, blocks = slice(start, start + SLICE), slice(start // BLOCK, (start + SLICE) // BLOCK)
        if one_pass:  # one kernel reads the 16-bit slice and writes both weights (adamw8bit_kernel.py)
            update(gradient[part], scale, master[part], weights[part], state["state1"][part], state["state2"][part],
                   state["absmax1"][blocks], state["absmax2"][blocks], state["qmap1"], state["qmap2"],
                   (beta1, beta2), config["eps"], config["lr"], config["weight_decay"], state["step"])
            continue
        grad = gradient[part].float().mul_(scale)
        if state["state1"].dtype == torch.uint8:
            F.optimizer_update_8bit_blockwise(
                "adam", grad, master[part], state["state1"][part], state["state2"][part], beta1, beta2, 0.0, 0.0,
                config["eps"], state["step"], config["lr"], state["qmap1"], state["qmap2"], state["absmax1"][blocks],
                state["absmax2"][blocks], config["weight_decay"], gnorm_scale=1.0, skip_zeros=config["skip_zeros"])
        else:  # a partition under bitsandbytes' min_8bit_size keeps 32-bit state, as bitsandbytes keeps it
            F.optimizer_update_32bit(
                "adam", grad, master[part], state["state1"][part], beta1, config["eps"], state["step"], config["lr"],
                state["state2"][part], beta2, 0.0, 0.0, config["weight_decay"], 1.0, None, max_unorm=0.0,
                skip_zeros=config["skip_zeros"])
        weights[part].copy_(master[part])
