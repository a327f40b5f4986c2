"""sft/ranks/patches/adamw8bit.py: the one-pass step of bitsandbytes' 8-bit AdamW, slice by slice from the 16-bit
gradient, leaves the weights and the state exactly as bitsandbytes' own step from the fp32 gradient does: on the host
bitsandbytes' own CPU kernel, on the GPU the job's Triton kernel (adamw8bit_kernel.py) against bitsandbytes' CUDA one,
bit for bit, odd gradients included."""

from __future__ import annotations

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")

from sft.ranks.patches import adamw8bit  # noqa: E402


CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                        reason="needs a CUDA GPU")])


def _pair(n: int, weight_decay: float, device: str = "cpu"):
    g = torch.Generator().manual_seed(n)
    start = torch.randn(n, generator=g).to(device)
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    make = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay, optim_bits=8)
    return ours, bnb.optim.AdamW([ours], **make), theirs, bnb.optim.AdamW([theirs], **make)


def _gradient(n: int, g: torch.Generator, odd: bool) -> torch.Tensor:
    """Normal, or spread over seven decades with what a real step can hold: NaN, infinities, a block of zeros,
    negative zeros, values at bf16's smallest."""
    gradient = torch.randn(n, generator=g)
    if odd:
        gradient *= 10.0 ** torch.randint(-7, 1, (n,), generator=g)
        gradient[3], gradient[4], gradient[5] = float("nan"), float("inf"), -float("inf")
        gradient[512:768] = 0.0
        gradient[1000:1010] = -0.0
        gradient[2000:2010] = torch.finfo(torch.bfloat16).tiny
    return gradient.bfloat16()


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("n,slice_,odd", [(70_001, 4096, False), (70_001, 1 << 26, False), (1000, 4096, False),
                                          (70_001, 1 << 26, True)])
def test_the_state_and_weights_are_bitsandbytes_own(monkeypatch, n, slice_, odd, device):
    """70,001 elements: 8-bit state in slices of 16 blocks (a last block short), or in one; 1,000: under
    bitsandbytes' min_8bit_size, its 32-bit state; odd gradients. On the host's kernels and on the GPU's."""
    monkeypatch.setattr(adamw8bit, "SLICE", slice_)
    ours, ours_opt, theirs, theirs_opt = _pair(n, weight_decay=0.1, device=device)
    weights = ours.detach().bfloat16()
    assert adamw8bit.supports(ours_opt, ours.device)
    g = torch.Generator().manual_seed(7)
    for _ in range(3):
        gradient = _gradient(n, g, odd).to(device)  # as DeepSpeed's flattened partition holds it
        scale = torch.tensor(0.5, device=device)  # the clipping factor
        theirs.grad = gradient.float() * scale
        theirs_opt.step()
        adamw8bit.step(ours_opt, 0, ours, gradient, weights, scale)  # DeepSpeed passes its fp32 partition, the state's key
    same = dict(rtol=0, atol=0, equal_nan=True)  # bit for bit; a NaN where bitsandbytes leaves one
    torch.testing.assert_close(ours.data, theirs.data, **same)
    torch.testing.assert_close(weights, theirs.data.bfloat16(), **same)
    mine, reference = ours_opt.state[ours], theirs_opt.state[theirs]
    assert mine["step"] == reference["step"] == 3
    assert mine["state1"].dtype == (torch.uint8 if n >= 4096 else torch.float32)
    for key in reference:
        if torch.is_tensor(reference[key]):
            torch.testing.assert_close(mine[key], reference[key], **same, msg=key)


def test_what_it_does_not_serve():
    """Paged, 32-bit or another optimizer: DeepSpeed's own step (zero_step.py)."""
    p = torch.nn.Parameter(torch.zeros(8))
    assert not adamw8bit.supports(bnb.optim.AdamW([p], optim_bits=32), p.device)
    assert not adamw8bit.supports(bnb.optim.PagedAdamW8bit([p]), p.device)
    assert not adamw8bit.supports(bnb.optim.Lion8bit([p]), p.device)
    assert not adamw8bit.supports(torch.optim.AdamW([p]), p.device)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_one_pass_kernel_agrees_with_bitsandbytes_on_this_gpu():
    """The step on a GPU is the Triton kernel only where it agrees bit for bit (else the tests above would pass on
    bitsandbytes' own path): here it must."""
    from sft.ranks.patches import adamw8bit_kernel

    assert adamw8bit_kernel.agrees(torch.device("cuda"))


def test_where_the_kernel_cannot_run_bitsandbytes_steps_and_it_is_said(capfd):
    """Here (no GPU; Triton absent on a CPU host, or unable to run on host tensors) the check says why, once per
    device, and the step would keep bitsandbytes' kernel."""
    adamw8bit._kernel_agrees.cache_clear()
    assert adamw8bit._kernel_agrees(torch.device("cpu")) is False
    assert adamw8bit._kernel_agrees(torch.device("cpu")) is False
    said = capfd.readouterr().err
    assert said.count("8-bit AdamW: the one-pass kernel does not run here") == 1, said
    assert "bitsandbytes' kernel steps instead" in said
