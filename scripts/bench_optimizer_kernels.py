#!/usr/bin/env python3
"""The kernels of DeepSpeed's ZeRO-2 bf16 optimizer step on one GPU, timed alone on gradients of a model's
shape, beside the cheaper ways of doing the same work: how much of a step the optimizer could still give back.

DeepSpeed 0.19.8's step, one rank, bf16, clipping on (deepspeed/runtime/zero/stage_1_and_2.py): the gradient
norm one parameter at a time in fp64 (a copy, then a norm, 398 times for Qwen3-4B), a cat of the bf16
gradients and a cast to fp32, the clipping's multiply, torch's fused AdamW, the copy of the fp32 weights back
to bf16; and the job's step, which does the last four in one pass (sft/ranks/patches/adamw.py). Each is timed as the
mean of 3 runs after one warm-up, between CUDA events.

    python scripts/bench_optimizer_kernels.py [--shape qwen3-4b]

And the step of the options with 8-bit state (bitsandbytes' blockwise AdamW), where bitsandbytes is installed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from make_synthetic import SHAPES, qwen3_config  # noqa: E402

from sft.ranks.patches import adamw  # noqa: E402


def shapes_of(shape: str) -> list[torch.Size]:
    """The parameters of the Qwen3 model of a shape, as Transformers builds it (on the meta device: no memory)."""
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(qwen3_config(shape))
    return [p.shape for p in model.parameters()]  # tied weights once


def timed(fn, runs: int = 3) -> float:
    """Milliseconds per run of fn, after one warm-up."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / runs


@click.command()
@click.option("--shape", type=click.Choice(sorted(SHAPES)), default="qwen3-4b", help="Model shape.")
def main(shape: str) -> None:
    if not torch.cuda.is_available():
        raise click.ClickException("needs a CUDA GPU: these are the GPU kernels of an optimizer step")
    sizes = shapes_of(shape)
    counts = [int(torch.tensor(s).prod()) for s in sizes]
    total = sum(counts)
    flat_bf16 = torch.randn(total, device="cuda", dtype=torch.bfloat16).mul_(1e-3)
    grads = [t.view(s) for t, s in zip(flat_bf16.split(counts), sizes)]
    flat = [g.reshape(-1) for g in grads]
    click.echo(f"{shape}: {len(sizes)} parameters, {total:,} elements")

    def fp64_each():  # DeepSpeed's get_grad_norm_direct
        return torch.stack([torch.linalg.vector_norm(g.double()) for g in grads]).pow(2).sum().sqrt()

    def foreach_fp32():
        return torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)).double().pow(2).sum().sqrt()

    fp32 = torch.cat(flat).float()
    rows = [("gradient norm, fp64 one parameter at a time (DeepSpeed)", fp64_each),
            ("gradient norm, torch._foreach_norm in fp32", foreach_fp32),
            ("gradient norm, one fp32 norm of the flat fp32 gradients", lambda: torch.linalg.vector_norm(fp32)),
            ("cat of the bf16 gradients and cast to fp32 (DeepSpeed)", lambda: torch.cat(flat).float()),
            ("copy of the bf16 gradients into a kept fp32 buffer", lambda: torch._foreach_copy_(
                list(fp32.split(counts)), flat))]
    norms = {}
    for name, fn in rows:
        ms = timed(fn)
        value = fn()
        norms[name] = float(value) if isinstance(value, torch.Tensor) and value.dim() == 0 else None
        click.echo(f"{ms:8.2f} ms  {name}" + (f" (norm {norms[name]:.6f})" if norms[name] is not None else ""))
    scale = torch.tensor(1.7, device="cuda")
    weights, exp_avg, exp_avg_sq = fp32.clone(), torch.zeros_like(fp32), torch.zeros_like(fp32)
    step = torch.zeros((), device="cuda")
    bf16_weights = torch.empty_like(flat_bf16)

    def adam(grad_scale=None):
        torch._fused_adamw_([weights], [fp32], [exp_avg], [exp_avg_sq], [], [step], amsgrad=False, lr=1e-5,
                            beta1=0.9, beta2=0.95, weight_decay=0.0, eps=1e-8, maximize=False,
                            grad_scale=grad_scale, found_inf=None)

    for name, fn in [("clipping's multiply of the fp32 gradients (DeepSpeed)", lambda: fp32.mul_(1.0 / scale)),
                     ("torch's fused AdamW (DeepSpeed calls it)", adam),
                     ("torch's fused AdamW with the clipping as its grad_scale", lambda: adam(scale)),
                     ("copy of the fp32 weights to bf16 (DeepSpeed)", lambda: bf16_weights.copy_(weights))]:
        click.echo(f"{timed(fn):8.2f} ms  {name}")
    optimizer = torch.optim.AdamW([weights], lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    clip = 1.0 / scale
    began = time.perf_counter()
    adamw.step(optimizer, 0, weights, flat_bf16, bf16_weights, clip)
    torch.cuda.synchronize()
    first = time.perf_counter() - began
    ms = timed(lambda: adamw.step(optimizer, 0, weights, flat_bf16, bf16_weights, clip))
    click.echo(f"{ms:8.2f} ms  the job's step (sft/ranks/patches/adamw.py, compiled): AdamW from the bf16 gradients x the "
               "clipping into the fp32 and the bf16 weights, in place of the cast, the multiply, AdamW and the copy; "
               f"its first call {first:.2f} s (Inductor's compilation of this size, unless its cache had it)")
    del optimizer, exp_avg, exp_avg_sq, fp32  # room for the 8-bit state on an 80 GB card
    torch.cuda.empty_cache()
    eight_bit(weights, flat_bf16, bf16_weights, clip)


def eight_bit(weights: torch.Tensor, gradients: torch.Tensor, bf16_weights: torch.Tensor, clip: torch.Tensor) -> None:
    """The step of the options with 8-bit state (sft/ranks/patches/adamw8bit.py: one kernel from the bf16
    gradients into bitsandbytes' blockwise state), against what its memory traffic alone would take at the copy's
    speed, and beside bitsandbytes' own kernel fed fp32 slices of the gradients (the step before that kernel)."""
    try:
        import bitsandbytes as bnb
        from bitsandbytes import functional as F
    except ImportError:
        click.echo("bitsandbytes not installed: no 8-bit row")
        return
    from sft.ranks.patches import adamw8bit

    optimizer = bnb.optim.AdamW([weights], lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                optim_bits=8, is_paged=False)
    ms = timed(lambda: adamw8bit.step(optimizer, 0, weights, gradients, bf16_weights, clip))
    state = optimizer.state[weights]

    def theirs():  # bitsandbytes' kernel wants the gradient in the master weights' dtype: a fp32 slice at a time
        for start in range(0, weights.numel(), adamw8bit.SLICE):
            part = slice(start, start + adamw8bit.SLICE)
            blocks = slice(start // adamw8bit.BLOCK, (start + adamw8bit.SLICE) // adamw8bit.BLOCK)
            F.optimizer_update_8bit_blockwise(
                "adam", gradients[part].float().mul_(clip), weights[part], state["state1"][part],
                state["state2"][part], 0.9, 0.95, 0.0, 0.0, 1e-8, state["step"], 1e-5, state["qmap1"],
                state["qmap2"], state["absmax1"][blocks], state["absmax2"][blocks], 0.1)
            bf16_weights[part].copy_(weights[part])

    bnb_ms = timed(theirs)
    copy = timed(lambda: bf16_weights.copy_(weights))  # 6 bytes an element: read fp32, write bf16
    # per element: the bf16 gradient read (2), the fp32 master read and written (8), two 8-bit moments read and
    # written (4), the bf16 weights written (2): 16 bytes
    floor = copy * 16 / 6
    click.echo(f"{ms:8.2f} ms  the job's 8-bit step (sft/ranks/patches/adamw8bit.py: bitsandbytes' blockwise AdamW in "
               f"one kernel from the bf16 gradients x the clipping); its traffic at the copy's speed: {floor:.2f} ms")
    click.echo(f"{bnb_ms:8.2f} ms  bitsandbytes' own kernel, fed fp32 slices of the bf16 gradients x the clipping, "
               "then the bf16 weights copied")


if __name__ == "__main__":
    main()
