"""The 8-bit AdamW step on the GPU in one kernel: the 16-bit gradient slice, times the clipping factor, into
bitsandbytes' blockwise state and the fp32 master weights, and the 16-bit weights from them (adamw8bit.py).

Why by hand: bitsandbytes' CUDA kernel (csrc/kernels.cu, kOptimizerStatic8bit2StateBlockwise) wants the gradient in
the master weights' dtype, so the step around it cast the bf16 gradient to a fp32 slice, scaled it, and copied the
weights back afterwards: three passes over memory beside the kernel's own, the kernel itself one thread block of
256 threads per quantisation block. Here one pass reads what the step needs once (the bf16 gradient, the fp32
weights, the two 8-bit states and their absmax) and writes it once; bitsandbytes' own Triton kernel
(backends/triton/kernels_optim.py) reads fp32 gradients too and rounds another way.

The arithmetic is bitsandbytes' CUDA kernel's, operation for operation, as its --use_fast_math build compiles it:
`__powf`, `__fdividef` and the approximate square root are libdevice's fast functions here, and the multiply-adds
nvcc contracts are spelled `tl.fma` with Triton's own contraction off, so the state and weights come out bit for
bit as bitsandbytes' (tests/test_adamw8bit.py on the GPU), and its checkpoints, resume and state_dict read them.
That includes its quantisation: a binary search over the 256-entry map (quantize_2D), rounding to the nearer
neighbour by the midpoint, and the first moment's code moved one step where rounding flipped its sign. Which of a
sum's two products nvcc contracts is not in the source: the kernel's forms F1, F2, FD and FP spell each choice, and
scripts/adamw8bit_forms.py finds the one that agrees on a GPU; for bitsandbytes 0.50.2 it is 1, 1, 0, 0 (the moments'
`(1 - beta) * g` terms fused, their `s * beta` rounded first). adamw8bit.step uses the kernel only
where `agrees` found it bit for bit with bitsandbytes' there, once per process. Under TRITON_INTERPRET=1 (Triton's
CPU interpreter, for reading it step by step) exact division and powers stand in for libdevice's fast ones.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

QBLOCK = 256  # bitsandbytes' quantisation block of its 8-bit blockwise optimizers
BLOCKS = 2  # quantisation blocks per program
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter (reading it on a host): no libdevice


@triton.jit
def _fast_div(x, y, INTERPRETED: tl.constexpr):
    if INTERPRETED:
        return x / y
    else:
        return tl.extra.cuda.libdevice.fast_dividef(x, y)


@triton.jit
def _quantize(x, q_ptr, LOWER: tl.constexpr):
    """bitsandbytes' quantize_2D: the code of `x` (in -1..1, or 0..1) in the 256-entry map at q_ptr, and its value.
    The search's first three levels test 7 entries, read once; the last four read the map per element."""
    pivot = tl.full(x.shape, 127, tl.int32)
    upper_pivot = tl.full(x.shape, 255, tl.int32)
    lower_pivot = tl.zeros(x.shape, tl.int32)
    lower = tl.full(x.shape, LOWER, tl.float32)
    upper = tl.full(x.shape, 1.0, tl.float32)
    val = tl.full(x.shape, 0.0, tl.float32) + tl.load(q_ptr + 127)
    for k in tl.static_range(7):
        higher = x > val
        lower_pivot = tl.where(higher, pivot, lower_pivot)
        lower = tl.where(higher, val, lower)
        upper_pivot = tl.where(higher, upper_pivot, pivot)
        upper = tl.where(higher, upper, val)
        pivot = tl.where(higher, pivot + (64 >> k), pivot - (64 >> k))
        if k == 0:
            val = tl.where(higher, tl.load(q_ptr + 191), tl.load(q_ptr + 63))
        elif k == 1:
            val = tl.where(pivot < 127, tl.where(pivot < 63, tl.load(q_ptr + 31), tl.load(q_ptr + 95)),
                           tl.where(pivot < 191, tl.load(q_ptr + 159), tl.load(q_ptr + 223)))
        else:
            val = tl.load(q_ptr + pivot)
    higher = x > val
    up = x > (upper + val) * 0.5
    down = x < (lower + val) * 0.5
    code = tl.where(higher, tl.where(up, upper_pivot, pivot), tl.where(down, lower_pivot, pivot))
    value = tl.where(higher, tl.where(up, upper, val), tl.where(down, lower, val))  # of the sign's test
    return code, value


@triton.jit
def _moments(s1, s2, g, beta1, beta2, F1: tl.constexpr, F2: tl.constexpr):
    """Adam's two moments, multiply-adds as nvcc contracts bitsandbytes' `s * beta + (1 - beta) * g` (F1, F2: 1)."""
    if F1 == 0:
        s1 = tl.fma(s1, beta1, (1.0 - beta1) * g)
    elif F1 == 1:
        s1 = tl.fma(1.0 - beta1, g, s1 * beta1)
    else:
        s1 = s1 * beta1 + (1.0 - beta1) * g
    if F2 == 0:
        s2 = tl.fma(s2, beta2, (1.0 - beta2) * g * g)
    elif F2 == 1:
        s2 = tl.fma((1.0 - beta2) * g, g, s2 * beta2)
    else:
        s2 = s2 * beta2 + (1.0 - beta2) * g * g
    return s1, s2


@triton.jit
def _weights(p, s1, s2, beta1, beta2, eps, lr, decay, step, INTERPRETED: tl.constexpr, FD: tl.constexpr,
             FP: tl.constexpr):
    """The fp32 weights after the step: bitsandbytes' bias corrections, update, then the decoupled weight decay."""
    if INTERPRETED:
        correction1 = 1.0 - tl.exp2(step * tl.log2(beta1))
        correction2 = tl.sqrt(1.0 - tl.exp2(step * tl.log2(beta2)))
    else:
        correction1 = 1.0 - tl.extra.cuda.libdevice.fast_powf(beta1, step)
        correction2 = tl.sqrt(1.0 - tl.extra.cuda.libdevice.fast_powf(beta2, step))
    step_size = _fast_div(-lr * correction2, correction1, INTERPRETED)
    if FD == 0:
        denominator = tl.fma(correction2, eps, tl.sqrt(s2))
    else:
        denominator = tl.sqrt(s2) + correction2 * eps
    if FP == 0:
        updated = tl.fma(step_size, _fast_div(s1, denominator, INTERPRETED), p)
    else:
        updated = p + step_size * _fast_div(s1, denominator, INTERPRETED)
    if decay > 0.0:
        if FP == 0:
            updated = updated * tl.fma(-lr, decay, 1.0)
        else:
            updated = updated * (1.0 - lr * decay)
    return updated


@triton.jit
def _adamw8bit(g_ptr, scale_ptr, p_ptr, w_ptr, c1_ptr, c2_ptr, a1_ptr, a2_ptr, q1_ptr, q2_ptr,
               beta1, beta2, eps, lr, decay, step, n,
               BLOCKS: tl.constexpr, QBLOCK: tl.constexpr, INTERPRETED: tl.constexpr,
               F1: tl.constexpr = 1, F2: tl.constexpr = 1, FD: tl.constexpr = 0, FP: tl.constexpr = 0):
    rows = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    offsets = rows[:, None] * QBLOCK + tl.arange(0, QBLOCK)[None, :]
    valid = offsets < n
    in_rows = rows * QBLOCK < n
    # as bitsandbytes loads a short last block: gradient 0, codes 128 and 0, all counted in the block's absmax
    g = tl.load(g_ptr + offsets, mask=valid, other=0.0).to(tl.float32) * tl.load(scale_ptr)
    c1 = tl.load(c1_ptr + offsets, mask=valid, other=128).to(tl.int32)
    c2 = tl.load(c2_ptr + offsets, mask=valid, other=0).to(tl.int32)
    finite = (g == g) & (tl.abs(g) != float("inf"))  # elsewhere bitsandbytes zeroes the moments, keeps the weight
    s1, s2 = _moments(tl.load(q1_ptr + c1) * tl.load(a1_ptr + rows, mask=in_rows, other=0.0)[:, None],
                      tl.load(q2_ptr + c2) * tl.load(a2_ptr + rows, mask=in_rows, other=0.0)[:, None],
                      g, beta1, beta2, F1, F2)
    s1 = tl.where(finite, s1, 0.0)
    s2 = tl.where(finite, s2, 0.0)
    absmax1 = tl.max(tl.abs(s1), axis=1)
    absmax2 = tl.max(tl.abs(s2), axis=1)
    p = tl.load(p_ptr + offsets, mask=valid, other=0.0)
    p = tl.where(finite, _weights(p, s1, s2, beta1, beta2, eps, lr, decay, step, INTERPRETED, FD, FP), p)
    tl.store(p_ptr + offsets, p, mask=valid)
    tl.store(w_ptr + offsets, p.to(w_ptr.dtype.element_ty), mask=valid)
    code1, value1 = _quantize(_fast_div(s1, absmax1[:, None], INTERPRETED), q1_ptr, -1.0)
    flipped = (value1.to(tl.int32, bitcast=True) < 0) != (s1.to(tl.int32, bitcast=True) < 0)  # signbit
    code1 = tl.where(flipped, tl.where(s1 > 0.0, code1 + 1, code1 - 1), code1)  # the sign survives quantisation
    code2, _ = _quantize(_fast_div(s2, absmax2[:, None], INTERPRETED), q2_ptr, 0.0)
    tl.store(c1_ptr + offsets, code1.to(tl.uint8), mask=valid)
    tl.store(c2_ptr + offsets, code2.to(tl.uint8), mask=valid)
    tl.store(a1_ptr + rows, absmax1, mask=in_rows)
    tl.store(a2_ptr + rows, absmax2, mask=in_rows)


def update(gradient: torch.Tensor, scale: torch.Tensor, master: torch.Tensor, weights: torch.Tensor,
           state1: torch.Tensor, state2: torch.Tensor, absmax1: torch.Tensor, absmax2: torch.Tensor,
           qmap1: torch.Tensor, qmap2: torch.Tensor, betas: tuple[float, float], eps: float, lr: float,
           weight_decay: float, step: int, **forms) -> None:
    """One AdamW step of `master` (fp32) and `weights` (its 16-bit copy) from `gradient` x `scale`, the state
    bitsandbytes' blockwise 8-bit (`state1`/`state2` codes of `qmap1`/`qmap2`, `absmax1`/`absmax2` per 256)."""
    n = master.numel()
    grid = (triton.cdiv(n, QBLOCK * BLOCKS),)
    _adamw8bit[grid](gradient, scale.float(), master, weights, state1, state2, absmax1, absmax2, qmap1, qmap2,
                     betas[0], betas[1], eps, lr, weight_decay, float(step), n,  # a float: Triton fixes an int 1
                     BLOCKS=BLOCKS, QBLOCK=QBLOCK, INTERPRETED=INTERPRET, num_warps=4, enable_fp_fusion=False, **forms)


def agrees(device: torch.device) -> bool:
    """Whether this kernel, on this GPU and with the Triton and bitsandbytes installed, leaves the state and weights
    bit for bit as bitsandbytes' own CUDA kernel does: three steps of 70,001 elements (a short last block, a NaN,
    an infinity, a block of zeros). adamw8bit.step asks once per process, and keeps bitsandbytes' path where it does not."""
    from bitsandbytes import functional as F

    n, g = 70_001, torch.Generator().manual_seed(0)
    start = torch.randn(n, generator=g).to(device)
    qmap1, qmap2 = F.create_dynamic_map(signed=True).to(device), F.create_dynamic_map(signed=False).to(device)
    blocks = triton.cdiv(n, QBLOCK)
    ours = [start.clone(), start.bfloat16()] + [torch.zeros(n, dtype=torch.uint8, device=device) for _ in range(2)] \
        + [torch.zeros(blocks, device=device) for _ in range(2)]
    theirs = [start.clone(), None] + [t.clone() for t in ours[2:]]
    for step in (1, 2, 3):
        gradient = (torch.randn(n, generator=g) * 10.0 ** torch.randint(-7, 1, (n,), generator=g)).bfloat16()
        gradient[3], gradient[4], gradient[512:768] = float("nan"), float("inf"), 0.0
        gradient, scale = gradient.to(device), torch.tensor(0.5, device=device)
        update(gradient, scale, ours[0], ours[1], *ours[2:], qmap1, qmap2, (0.9, 0.95), 1e-8, 1e-2, 0.1, step)
        F.optimizer_update_8bit_blockwise("adam", gradient.float() * scale, theirs[0], theirs[2], theirs[3], 0.9, 0.95,
                                          0.0, 0.0, 1e-8, step, 1e-2, qmap1, qmap2, theirs[4], theirs[5], 0.1)
    theirs[1] = theirs[0].bfloat16()
    return all(torch.equal(a, b) for a, b in zip(ours, theirs))
