#!/usr/bin/env python3
"""A Qwen3-shaped model with random weights and chat data with realistic lengths, offline.

For GPU runs and benchmarks where no Hub is reachable. The shapes are Qwen3's published configs;
the tokenizer is the demo's small BPE (its ids fill the low end of Qwen3's 151,936-token vocabulary,
so the embedding and the logits cost what they cost in the real model).

Conversation lengths: multi-turn, log-normal total length with a median of about 900 tokens and a
long tail cut at 8k, like trl-lib/Capybara's multi-turn conversations (the benchmark data of docs/facts.md).

    python scripts/make_synthetic.py --shape qwen3-4b --out /tmp/synth [--conversations 2000]
"""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent
# Qwen3's published shapes (config.json of Qwen/Qwen3-*).
SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, tie_word_embeddings=False),
    "qwen3-14b": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
                      num_key_value_heads=8, tie_word_embeddings=False),
    "qwen3-32b": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, tie_word_embeddings=False),
}
# Words the demo tokenizer encodes as one token each (after a space), so words = tokens, near enough.
WORDS = ("purple Spain capital red Chile system Italy after Egypt Nairobi sun plum Tokyo sky Santiago Rome "
         "orange apple green coal France Paris Madrid assistant white blue Kenya").split()


def qwen3_config(shape: str, max_positions: int = 40960):
    """The Qwen3Config of a shape: Qwen3's published numbers, bf16."""
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=151936, head_dim=128, max_position_embeddings=max_positions, rope_theta=1000000,
                       rms_norm_eps=1e-6, dtype="bfloat16", **SHAPES[shape])


def build_model(shape: str, out: Path, max_positions: int = 40960) -> None:
    import torch
    from transformers import Qwen3ForCausalLM

    cfg = qwen3_config(shape, max_positions)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        torch.set_default_dtype(torch.bfloat16)  # build in bf16 directly: no fp32 copy of billions of weights
        model = Qwen3ForCausalLM(cfg)
        torch.set_default_dtype(torch.float32)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(REPO / "demo" / "tiny-qwen3" / name, out / name)
    click.echo(f"{shape}: {sum(p.numel() for p in model.parameters()):,} parameters in {out}")


def conversation(rng: random.Random, median_tokens: int, spread: float = 0.8, most: int = 8192) -> dict:
    total = min(int(math.exp(rng.gauss(math.log(median_tokens), spread))), most)
    turns = rng.choice([1, 2, 2, 3, 4])
    messages = []
    for _ in range(turns):
        q = max(8, total // turns // 5)
        a = max(8, total // turns - q)
        messages.append({"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(q))})
        messages.append({"role": "assistant", "content": " ".join(rng.choice(WORDS) for _ in range(a))})
    return {"messages": messages}


@click.command()
@click.option("--shape", type=click.Choice(sorted(SHAPES)), default="qwen3-4b", help="Model shape.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Folder to write.")
@click.option("--conversations", default=2000, help="Rows of chat data.")
@click.option("--median-tokens", default=900, help="Median tokens per conversation.")
@click.option("--spread", default=0.8, help="Sigma of the log-normal lengths (0.8: Capybara-like; 0.05: all "
              "about the median, e.g. long documents that fill a row).")
@click.option("--max-tokens", default=8192, help="The longest conversation.")
@click.option("--max-positions", default=40960, help="The model's max_position_embeddings (Qwen3's: 40960).")
@click.option("--no-model", is_flag=True, help="Only the data.")
def main(shape: str, out: Path, conversations: int, median_tokens: int, spread: float, max_tokens: int,
         max_positions: int, no_model: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    with open(out / "chat.jsonl", "w") as f:
        for _ in range(conversations):
            f.write(json.dumps(conversation(rng, median_tokens, spread, max_tokens)) + "\n")
    click.echo(f"{conversations} conversations in {out / 'chat.jsonl'}")
    if not no_model:
        build_model(shape, out / shape, max_positions)


if __name__ == "__main__":
    main()
