"""Transformers 5.24's attention masks for packed rows: flex attention's block mask built without compiling, and
FlashAttention's packed-rows question not asked; each until Transformers changes (its "Remove when")."""

from __future__ import annotations

import torch

# MASK_ELEMENTS_AT_ONCE: elements of the boolean mask evaluated at once (64 MB; the planner counts its
# temporaries, planner/memory.py): a band of query rows at a time, so a row of 131,072 tokens never holds its
# whole 131,072^2 mask (17 GB) beside the training's own peak. Bands of 2^24 to 2^28 elements took the same time
# on CPU (2.7 s at 16,384 tokens).
from ...planner.memory import MASK_ELEMENTS_AT_ONCE


def block_mask_by_rows(mask_mod, batch: int, heads: int, q_length: int, kv_length: int, device,
                       elements: int = MASK_ELEMENTS_AT_ONCE):
    """The BlockMask `create_block_mask(mask_mod, ..., _compile=False)` makes, built from the mask evaluated a
    band of query rows at a time instead of whole (then torch's own block reduction)."""
    from torch.nn.attention import flex_attention as fa

    block = fa._DEFAULT_SPARSE_BLOCK_SIZE
    band = max(block, elements // max(1, batch * heads * kv_length) // block * block)
    partial, full = [], []
    for start in range(0, q_length, band):
        dense = dense_mask(mask_mod, batch, heads, start, min(band, q_length - start), kv_length, device)
        p, f = fa._convert_mask_to_block_mask(dense, Q_BLOCK_SIZE=block, KV_BLOCK_SIZE=block,
                                              separate_full_blocks=True)
        partial.append(p)
        full.append(f)
        del dense
    return fa._create_sparse_block_from_block_mask((torch.cat(partial, 2), torch.cat(full, 2)), mask_mod,
                                                   (q_length, kv_length), block, block)


def dense_mask(mask_mod, batch: int, heads: int, start: int, rows: int, kv_length: int, device) -> torch.Tensor:
    """mask_mod over query rows start .. start + rows - 1, as a (batch, heads, rows, kv_length) boolean tensor,
    evaluated once on broadcast index tensors. torch's create_mask vmaps it over the four indices instead: that re-ran
    the mask's Python under four vmap levels at every forward, with the GPU idle (a large part of a default step's idle
    time; measured: docs/speed.md, 'where an idle GPU waits'). Transformers' mask functions are written for both (its
    sdpa_mask evaluates them broadcast); tests/test_block_mask.py holds the result to torch's."""
    b = torch.arange(batch, device=device).view(batch, 1, 1, 1)
    h = torch.arange(heads, device=device).view(1, heads, 1, 1)
    q = torch.arange(start, start + rows, device=device).view(1, 1, rows, 1)
    kv = torch.arange(kv_length, device=device).view(1, 1, 1, kv_length)
    return torch.as_tensor(mask_mod(b, h, q, kv), dtype=torch.bool, device=device).expand(
        batch, heads, rows, kv_length)


def flex_block_mask_uncompiled() -> None:
    """Transformers 5.24 builds flex attention's block mask with `create_block_mask(..., _compile=True)`: a new row
    length compiles a Triton kernel whose build grows with the length: the first step at 16,384 tokens a row spent
    minutes there with the GPU idle (py-spy: ptxas, called from create_block_mask), and with the mask built here the job
    reached its first step several times sooner (measured: docs/long-rows.md,
    'ZeRO-3 with the checkpoints in host memory, fixed'). The mask is evaluated directly instead, a band of query rows
    at a time, with nothing to compile; it costs O(length^2) element operations a step, on the GPU. The preparation
    around it (padding, offsets) is Transformers' own helpers', as in its `flex_attention_mask`. Registered for
    "flex_attention" through Transformers' AttentionMaskInterface; remove when Transformers stops compiling the mask or
    its compile no longer grows with the row."""
    from transformers import masking_utils as mu

    def flex_attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                            mask_function=mu.causal_mask_function, attention_mask=None, device="cpu", **kwargs):
        if attention_mask is not None and not mu.fast_all(attention_mask):
            padding = mu.prepare_padding_mask(attention_mask, kv_length, kv_offset)
            mask_function = mu.and_masks(mask_function, mu.padding_mask_function(padding))
        mask_function = mu.add_offsets_to_mask_function(mask_function, q_offset, kv_offset)
        return block_mask_by_rows(mask_function, batch_size, 1, q_length, kv_length, device)

    mu.AttentionMaskInterface.register("flex_attention", flex_attention_mask)


def packed_rows_unchecked() -> None:
    """Transformers 5.24's causal mask, for each forward of packed rows, asks the GPU whether the row holds more than
    one sequence (`find_packed_sequence_indices`: `.all()` on a GPU tensor, a wait for the GPU's queue; reads.py
    says what such a wait costs). FlashAttention's mask (`flash_attention_mask`) is None for rows without padding
    whatever the answer: the kernel takes the sequences' bounds from TRL's collator (cu_seq_lens). So with
    FlashAttention-4 the question is not asked. Remove when Transformers skips it for FlashAttention itself."""
    from transformers import masking_utils as mu

    mu.find_packed_sequence_indices = lambda position_ids: None
