"""The LM head with its logits tiles kept for the backward (sft/ranks/patches/lm_head.py) gives what TRL's own fused
head gives, whatever share of the tiles its budget keeps: the same log-probabilities, entropy, top-1 flags and
gradients, bit for bit (the tiles are the same GEMM's output, kept or computed again). On CPU, through TRL's torch fold
of each tile; the GPU's Triton fold is the same kernel in both (tests/test_gpu.py runs the job there)."""

from __future__ import annotations

import pytest
import torch
from trl.kernels import ChunkedLogProbFunction
from trl.kernels import chunked_logprob as trl_head

from sft.ranks.patches.lm_head import TilesKeptLogProb, tile_bounds

TOKENS, HIDDEN, VOCAB, CHUNK = trl_head.TOKEN_CHUNK_SIZE + 77, 16, 300, 128  # 2 token chunks x 3 vocab chunks
OUTPUTS = ("entropy", "is_top1")


def _run(function, hidden, weight, targets, chunk=CHUNK):
    hidden, weight = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logprobs, entropy, _, _, is_top1 = function.apply(hidden, weight, None, targets, 1.0, chunk, None, 1.0, OUTPUTS)
    per_token = torch.linspace(0.5, 1.5, len(targets), device=hidden.device)  # a weight per token
    loss = -(logprobs * per_token).sum() / len(targets)
    loss.backward()
    return logprobs.detach(), entropy.detach(), is_top1, hidden.grad, weight.grad


def _tile_bytes(tokens=TOKENS, vocab=VOCAB, chunk=CHUNK) -> list[int]:
    return [(t1 - t0) * (v1 - v0) * 2 for t0, t1, v0, v1 in tile_bounds(tokens, vocab, chunk)]


def compare(kept: int, device: str = "cpu", tokens=TOKENS, hidden_size=HIDDEN, vocab=VOCAB, chunk=CHUNK,
            exact: bool = True) -> None:
    """Ours with the first `kept` tiles' bytes as its budget against TRL's, on `device` (tests/test_gpu.py: the
    GPU's Triton folds)."""
    torch.manual_seed(0)
    hidden = torch.randn(tokens, hidden_size, dtype=torch.bfloat16, device=device)
    weight = torch.randn(vocab, hidden_size, dtype=torch.bfloat16, device=device) * 0.5
    targets = torch.randint(0, vocab, (tokens,), device=device)
    TilesKeptLogProb.budget = sum(_tile_bytes(tokens, vocab, chunk)[:kept])
    try:
        ours = _run(TilesKeptLogProb, hidden, weight, targets, chunk)
    finally:
        TilesKeptLogProb.budget = 0
    trls = _run(ChunkedLogProbFunction, hidden, weight, targets, chunk)
    for name, a, b in zip(("log_probs", "entropy", "is_top1", "hidden's gradient", "weight's gradient"), ours, trls):
        if exact:
            assert torch.equal(a, b), f"{name} differs with {kept} tiles kept"
        else:  # cuBLAS may pick another kernel for a tile's own buffer than for TRL's wider one
            torch.testing.assert_close(a, b, msg=lambda m, name=name: f"{name}, {kept} tiles kept: {m}")
    assert trls[3].abs().sum() > 0 and trls[4].abs().sum() > 0  # the comparison is of gradients that exist


@pytest.mark.parametrize("kept", [0, 1, 3, 6], ids=lambda n: f"{n}-of-6-tiles-kept")
def test_kept_tiles_give_trls_numbers(kept):
    assert len(_tile_bytes()) == 6
    compare(kept)


def test_the_budget_keeps_whole_tiles():
    budget = sum(_tile_bytes()[:2]) + 1  # two tiles and a byte: the third does not fit
    seen = []

    class Counting(TilesKeptLogProb):
        @staticmethod
        def backward(ctx, *grads):
            seen.extend(t is not None for t in ctx.kept)
            return TilesKeptLogProb.backward(ctx, *grads)

    TilesKeptLogProb.budget = budget
    try:
        hidden = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)
        weight = torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16)
        _run(Counting, hidden, weight, torch.randint(0, VOCAB, (TOKENS,)))
    finally:
        TilesKeptLogProb.budget = 0
    assert seen == [True, True, False, False, False, False]
