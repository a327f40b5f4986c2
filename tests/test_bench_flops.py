"""scripts/bench.py's attention FLOPs per token (its MFU+attn column) count each conversation's real tokens.

It once counted every conversation as 2 tokens: Transformers 5's apply_chat_template(tokenize=True) returns a
BatchEncoding, whose len is its 2 keys, and MFU+attn equalled MFU on every page of docs/ for weeks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer

from conftest import DEMO_MODEL

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from bench import attention_flops_per_token  # noqa: E402


def test_attention_flops_follow_the_conversations_lengths(tmp_path):
    rows = [[{"role": "user", "content": "hello " * n}, {"role": "assistant", "content": "Paris " * n}]
            for n in (10, 300, 2000)]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": m}) + "\n" for m in rows))
    tok, cfg = AutoTokenizer.from_pretrained(DEMO_MODEL), AutoConfig.from_pretrained(DEMO_MODEL)
    for cut in (100_000, 512):
        lengths = [min(len(tok.apply_chat_template(m, tokenize=True, return_dict=False)), cut) for m in rows]
        assert max(lengths) > 1000 if cut > 1000 else max(lengths) == cut
        context = sum(n * n for n in lengths) / (2 * sum(lengths))
        want = 12 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * context
        assert attention_flops_per_token(str(DEMO_MODEL), str(data), cut) == want
