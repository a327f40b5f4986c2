"""Packing keeps sequences apart: per-sequence losses packed equal the losses of each sequence alone.

TRL's padding-free collator concatenates sequences into one row and restarts position_ids at each;
transformers turns restarting position_ids into a block-diagonal causal mask for SDPA. If either
stopped doing its part, tokens would attend across sequence boundaries and these losses would differ.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from conftest import DEMO_MODEL


def _token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:-1].float(), labels[1:], reduction="none")


def test_packed_losses_equal_unpacked():
    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, attn_implementation="sdpa").eval()
    gen = torch.Generator().manual_seed(0)
    sequences = [torch.randint(5, model.config.vocab_size, (n,), generator=gen).tolist() for n in (17, 40, 9)]
    collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    batch = collator([{"input_ids": s} for s in sequences])
    assert batch["input_ids"].shape == (1, sum(map(len, sequences)))  # one row, no padding
    with torch.no_grad():
        # use_cache=False as SFTTrainer.compute_loss sets it: transformers skips the packed mask when a cache exists
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits[0]
        start = 0
        for seq in sequences:
            ids = torch.tensor([seq])
            alone = model(input_ids=ids, use_cache=False).logits[0]
            inside = packed[start:start + len(seq)]
            torch.testing.assert_close(_token_losses(inside, ids[0]), _token_losses(alone, ids[0]),
                                       rtol=1e-5, atol=1e-5)
            start += len(seq)


def test_without_restarting_positions_sequences_would_leak():
    """The control: the same row with plain positions mixes sequences, so the test above can fail."""
    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, attn_implementation="sdpa").eval()
    gen = torch.Generator().manual_seed(1)
    first, second = (torch.randint(5, model.config.vocab_size, (n,), generator=gen) for n in (20, 20))
    row = torch.cat([first, second])[None]
    with torch.no_grad():
        leaked = model(input_ids=row, use_cache=False).logits[0, 20:]
        alone = model(input_ids=second[None], use_cache=False).logits[0]
    assert not torch.allclose(leaked, alone, atol=1e-3)
