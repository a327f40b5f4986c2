"""TRL's fused LM head, with the forward's logits tiles kept for the backward instead of computed again.

TRL 1.16's `ChunkedLogProbFunction` (trl/kernels/chunked_logprob.py) scores [4096 tokens x 32768 vocabulary] tiles of
`hidden @ lm_head.weight.T` one at a time through one buffer, and its backward projects every tile again: for Qwen3-4B
at 8,192 tokens a step that is 6.4 TFLOP, milliseconds of every step spent making logits the forward already made
(measured: docs/speed.md, 'the LM head's logits kept for its backward'). Here the forward writes each tile into a buffer
of its own and keeps it, up to `budget` bytes (the planner's choice, planner/memory.py::head_tiles_kept, counted in the
plan's logits); the backward turns each kept tile into its gradient in place, and computes again only the tiles the
budget left out, in TRL's one buffer. The tiles are the same GEMM's output either way, so the loss and the gradients are
TRL's (tests/test_lm_head.py compares them). TRL's kernels, constants and fp32 accumulation are used as they are; only
the loops over tiles are restated. Remove when TRL keeps the tiles.
"""

from __future__ import annotations

import torch
from trl.kernels import chunked_logprob as chunked


def tile_bounds(n_tokens: int, vocab: int, chunk_size: int) -> list[tuple[int, int, int, int]]:
    """The tiles in TRL's order: token chunks outer, vocabulary chunks inner, as (token_start, token_end, start,
    end)."""
    return [(t, min(t + chunked.TOKEN_CHUNK_SIZE, n_tokens), v, min(v + chunk_size, vocab))
            for t in range(0, n_tokens, chunked.TOKEN_CHUNK_SIZE) for v in range(0, vocab, chunk_size)]


def _project(out: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, t0: int, t1: int,
             v0: int, v1: int) -> torch.Tensor:
    """One tile of `hidden @ weight.T (+ bias)` into `out`, as TRL projects it (`hidden` already in the compute
    dtype)."""
    torch.mm(hidden[t0:t1], weight[v0:v1].to(out.dtype).t(), out=out)
    if bias is not None:
        out.add_(bias[v0:v1].to(out.dtype))
    return out


def _shared_buffer(n_tokens: int, chunk_size: int, device, dtype) -> torch.Tensor:
    """TRL's one tile buffer, through which the tiles not kept are projected."""
    return torch.empty((min(n_tokens, chunked.TOKEN_CHUNK_SIZE), chunk_size), device=device, dtype=dtype)


class TilesKeptLogProb(torch.autograd.Function):
    """`trl.kernels.ChunkedLogProbFunction` (the same arguments and outputs), its tiles kept up to `budget`."""

    budget = 0  # bytes of tiles the forward may keep for the backward (set by trl_head.lm_head_tiles_kept)

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None,
                logit_scale=1.0, outputs=chunked.OPTIONAL_OUTPUTS):
        ctx.set_materialize_grads(False)
        device, n_tokens, vocab = hidden.device, hidden.shape[0], weight.shape[0]
        compute_dtype = (torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type)
                         else hidden.dtype)
        kernel_args = {"logit_scale": logit_scale, "softcap": final_logit_softcapping or 1.0,
                       "inv_t": 1 / temperature, "HAS_SOFTCAP": final_logit_softcapping is not None}
        flags = {f"HAS_{name.upper()}": name in outputs for name in chunked.OPTIONAL_OUTPUTS}
        stats = {name: torch.full((n_tokens,), value, device=device, dtype=torch.float32) for name, value in
                 (("running_max", float("-inf")), ("sum_exp", 0.0), ("x_sum_exp", 0.0), ("sq_sum_exp", 0.0),
                  ("z_sum", 0.0), ("max_before_target", float("-inf")), ("target_logit", 0.0))}
        hidden_c = hidden.to(compute_dtype)  # once, not once a tile (a no-op in the compute dtype)
        shared = None  # TRL's one buffer, for the tiles not kept
        kept, left = [], TilesKeptLogProb.budget
        for t0, t1, v0, v1 in tile_bounds(n_tokens, vocab, chunk_size):
            size = (t1 - t0) * (v1 - v0) * torch.finfo(compute_dtype).bits // 8
            if size <= left:
                tile, left = torch.empty((t1 - t0, v1 - v0), device=device, dtype=compute_dtype), left - size
                kept.append(tile)
            else:
                if shared is None:
                    shared = _shared_buffer(n_tokens, chunk_size, device, compute_dtype)
                tile = shared[:t1 - t0, :v1 - v0]
                kept.append(None)
            _project(tile, hidden_c, weight, bias, t0, t1, v0, v1)
            fold = chunked._forward_kernel[(t1 - t0,)] if chunked._use_triton(device) else chunked._forward_tile
            fold(tile, tile.stride(0), targets[t0:t1], *(s[t0:t1] for s in stats.values()), v0, v1 - v0,
                 BLOCK_SIZE=chunked._BLOCK_SIZE, **flags, **kernel_args)
        running_max, sum_exp, x_sum_exp, sq_sum_exp, z_sum, max_before_target, target_logit = stats.values()
        log_z = running_max + torch.log(sum_exp)
        logprobs = target_logit - log_z
        entropy = log_z - x_sum_exp / sum_exp if "entropy" in outputs else None
        log_sum_sq_probs = torch.log(sq_sum_exp) - 2 * torch.log(sum_exp) if "log_sum_sq_probs" in outputs else None
        mean_logits = z_sum / vocab if "mean_logits" in outputs else None
        is_top1 = ((target_logit >= running_max) & (target_logit > max_before_target) if "is_top1" in outputs
                   else None)
        ctx.save_for_backward(hidden, weight, bias, targets, log_z, log_z if entropy is None else entropy)
        ctx.kept, ctx.compute_dtype, ctx.chunk_size, ctx.kernel_args = kept, compute_dtype, chunk_size, kernel_args
        ctx.mark_non_differentiable(*(x for x in (log_sum_sq_probs, mean_logits, is_top1) if x is not None))
        return logprobs, entropy, log_sum_sq_probs, mean_logits, is_top1

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy, *_):
        from trl.trainer.utils import maybe_gather_lm_head_ctx  # at call time, as TRL does: ZeRO-3's gather

        hidden, weight, bias, targets, log_z, entropy = ctx.saved_tensors
        kept, ctx.kept = ctx.kept, None
        dtype, n_tokens = ctx.compute_dtype, hidden.shape[0]
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        with maybe_gather_lm_head_ctx(weight, bias):
            vocab = weight.shape[0]
            grad_hidden = torch.zeros(hidden.shape, device=hidden.device, dtype=torch.float32) if needs_hidden else None
            grad_weight = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32) if needs_weight else None
            grad_bias = torch.zeros(bias.shape, device=bias.device, dtype=torch.float32) if needs_bias else None
            grad_logprobs = grad_logprobs.float().contiguous() if grad_logprobs is not None else None
            grad_entropy = grad_entropy.float().contiguous() if grad_entropy is not None else None
            hidden_c, shared = hidden.to(dtype), None
            for i, (t0, t1, v0, v1) in enumerate(tile_bounds(n_tokens, vocab, ctx.chunk_size)):
                hidden_chunk, w_chunk = hidden_c[t0:t1], weight[v0:v1].to(dtype)
                tile, kept[i] = kept[i], None  # each kept tile is freed once used
                if tile is None:
                    if shared is None:
                        shared = _shared_buffer(n_tokens, ctx.chunk_size, hidden.device, dtype)
                    tile = _project(shared[:t1 - t0, :v1 - v0], hidden_c, weight, bias, t0, t1, v0, v1)
                fold = (chunked._backward_kernel[(t1 - t0, -(-(v1 - v0) // chunked._BLOCK_SIZE))]
                        if chunked._use_triton(hidden.device) else chunked._backward_tile)
                fold(tile, tile.stride(0), targets[t0:t1], log_z[t0:t1], entropy[t0:t1],
                     grad_logprobs[t0:t1] if grad_logprobs is not None else log_z,
                     grad_entropy[t0:t1] if grad_entropy is not None else log_z, v0, v1 - v0,
                     HAS_LOGPROB_GRAD=grad_logprobs is not None, HAS_ENTROPY_GRAD=grad_entropy is not None,
                     BLOCK_SIZE=chunked._BLOCK_SIZE, **ctx.kernel_args)
                if grad_hidden is not None:
                    chunked._addmm_fp32(grad_hidden[t0:t1], tile, w_chunk)
                if grad_weight is not None:
                    chunked._addmm_fp32(grad_weight[v0:v1], tile.t(), hidden_chunk)
                if grad_bias is not None:
                    grad_bias[v0:v1] += tile.sum(dim=0, dtype=torch.float32)
        return (grad_hidden.to(hidden.dtype) if grad_hidden is not None else None,
                grad_weight.to(weight.dtype) if grad_weight is not None else None,
                grad_bias.to(bias.dtype) if grad_bias is not None else None, None, None, None, None, None, None)
