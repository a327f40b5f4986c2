"""Flex attention's block mask built without compiling (sft/ranks/patches/): the same BlockMask torch's
create_block_mask makes, for the masks the job's packed rows get from Transformers, on CPU."""

import itertools

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from transformers import masking_utils as mu

from sft.ranks.patches import masks


def packed_mask(lengths_per_row: list[list[int]]):
    """Transformers' mask for packed rows: causal within each conversation, conversations kept apart (what
    create_causal_mask composes from position_ids restarting at each conversation)."""
    position_ids = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths_per_row])
    docs = mu.find_packed_sequence_indices(position_ids)
    mask = mu.remap_positions_for_packed_sequence(mu.causal_mask_function, position_ids)
    return mu.and_masks(mask, mu.packed_sequence_mask_function(docs)), position_ids.shape[1]


def assert_same(ours, torchs):
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        a, b = getattr(ours, name), getattr(torchs, name)
        n = getattr(torchs, "full_kv_num_blocks" if name.startswith("full") else "kv_num_blocks")
        if name.endswith("indices"):  # only the first num_blocks of each row are meaningful
            for idx in itertools.product(*(range(d) for d in n.shape)):
                k = int(n[idx])
                assert torch.equal(a[idx][:k], b[idx][:k]), name
        else:
            assert torch.equal(a, b), name
    assert ours.seq_lengths == torchs.seq_lengths


@pytest.mark.parametrize("rows, elements", [
    ([[300, 500, 200]], 1 << 28),                         # one band, a length not a multiple of 128
    ([[300, 500, 200]], 128 * 1000),                      # a band of 128 query rows at a time
    ([[1000], [100, 100, 800]], 2 * 256 * 1000),          # two rows, bands of 256
    ([[129, 1, 127, 255, 512]], 3 * 128 * 1024),          # conversations of one token, block edges
])
def test_same_block_mask_as_torch(rows, elements):
    mask_mod, length = packed_mask(rows)
    ours = masks.block_mask_by_rows(mask_mod, len(rows), 1, length, length, "cpu", elements=elements)
    torchs = create_block_mask(mask_mod, len(rows), None, length, length, device="cpu", _compile=False)
    assert_same(ours, torchs)


def test_attention_with_it_is_per_conversation():
    """Flex attention under the built mask equals attention computed one conversation at a time."""
    torch.manual_seed(0)
    rows = [[200, 57, 300]]
    mask_mod, length = packed_mask(rows)
    q, k, v = (torch.randn(1, 2, length, 16) for _ in range(3))
    out = flex_attention(q, k, v, block_mask=masks.block_mask_by_rows(mask_mod, 1, 1, length, length, "cpu"))
    start = 0
    for n in rows[0]:
        s = slice(start, start + n)
        alone = torch.nn.functional.scaled_dot_product_attention(q[:, :, s], k[:, :, s], v[:, :, s], is_causal=True)
        assert torch.allclose(out[:, :, s], alone, atol=1e-5)
        start += n


def test_registered_for_transformers_flex_attention():
    """After installing it, Transformers' flex mask (as create_causal_mask calls it) is the one built here,
    and equals torch's; padding is kept out as in Transformers' own."""
    masks.flex_block_mask_uncompiled()
    make = mu.ALL_MASK_ATTENTION_FUNCTIONS["flex_attention"]
    assert make is not mu.flex_attention_mask
    mask_mod, length = packed_mask([[100, 156]])
    padding = torch.ones(1, length, dtype=torch.bool)
    padding[0, -20:] = False
    ours = make(batch_size=1, q_length=length, kv_length=length, mask_function=mask_mod, attention_mask=padding,
                device="cpu")
    expected = mu.and_masks(mask_mod, mu.padding_mask_function(padding))
    assert_same(ours, create_block_mask(expected, 1, None, length, length, device="cpu", _compile=False))


def test_same_block_mask_as_torch_with_padding_and_heads():
    """Padded positions (Transformers' padding mask, which indexes a tensor by batch and kv index) and a mask
    that differs by head: evaluated broadcast, as torch's vmap evaluates them."""
    mask_mod, length = packed_mask([[300, 400], [700]])
    padding = torch.ones(2, length, dtype=torch.bool)
    padding[0, 650:] = False
    padded = mu.and_masks(mask_mod, mu.padding_mask_function(padding))

    def by_head(b, h, q_idx, kv_idx):  # head 1 sees only the last 64 tokens
        return padded(b, h, q_idx, kv_idx) & ((h == 0) | (q_idx - kv_idx < 64))

    for mod, heads in ((padded, 1), (by_head, 2)):
        ours = masks.block_mask_by_rows(mod, 2, heads, length, length, "cpu", elements=2 * heads * 256 * length)
        torchs = create_block_mask(mod, 2, heads, length, length, device="cpu", _compile=False)
        assert_same(ours, torchs)
