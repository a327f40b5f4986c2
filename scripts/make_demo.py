#!/usr/bin/env python3
"""Build the embedded demo: a tiny Qwen3 model and a small chat dataset, offline.

The image and the tests run the whole job on these when there is no GPU and no Hub.
Everything is deterministic (fixed seeds), so running this again rewrites the same files.

    python scripts/make_demo.py [--out demo]
"""

import json
import random
from pathlib import Path

import click

# Qwen3's chat template without its thinking (its first lines say why it is not byte for byte the same): the tiny
# model formats "messages" the way Qwen3 does, tool calls (<tool_call> and the call as JSON), tool responses and the
# tools' definitions included
CHAT_TEMPLATE = r"""{#- The demo's template: Qwen3's without its thinking, as Qwen3-Instruct-2507 ships it (TRL's copy:
    trl/chat_templates/qwen3_instruct_2507.jinja), so that tool calls, tool results and tools render as Qwen3's.
    This comment keeps it from being that template to TRL, which would swap in its own version marking the assistant's
    tokens: the demo stands for a model whose template TRL cannot mark (SFT_LOSS_ON=assistant then needs
    SFT_CHAT_TEMPLATE, demo/chatml-assistant-mask.jinja), as the tests and docs use it. -#}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

COLOURS = ["red", "green", "blue", "yellow", "black", "white", "orange", "purple"]
THINGS = ["apple", "sky", "grass", "sun", "coal", "snow", "carrot", "plum"]
CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
            "Egypt": "Cairo", "Peru": "Lima", "Kenya": "Nairobi", "Chile": "Santiago"}


def conversation(rng: random.Random) -> dict:
    """One conversation with learnable structure (so the demo's loss visibly falls)."""
    turns = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        kind = rng.choice(["colour", "capital", "sum", "echo"])
        if kind == "colour":
            i = rng.randrange(len(THINGS))
            q, a = f"What colour is the {THINGS[i]}?", f"The {THINGS[i]} is {COLOURS[i]}."
        elif kind == "capital":
            country = rng.choice(sorted(CAPITALS))
            q, a = f"What is the capital of {country}?", f"The capital of {country} is {CAPITALS[country]}."
        elif kind == "sum":
            x, y = rng.randrange(10), rng.randrange(10)
            q, a = f"What is {x} plus {y}?", f"{x} plus {y} is {x + y}."
        else:
            words = " ".join(rng.choice(THINGS) for _ in range(rng.randrange(2, 12)))
            q, a = f"Repeat after me: {words}", words
        turns += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return {"messages": turns}


def build_tokenizer(texts: list[str], out: Path):
    """A byte-level BPE tokenizer trained on the demo texts (tokenizers trains it in a second)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL_TOKENS,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(tokenizer, out: Path) -> None:
    """A Qwen3 with about 100k parameters: same architecture class as Qwen3-8B, tiny shapes."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                      tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    Qwen3ForCausalLM(cfg).save_pretrained(out)


@click.command()
@click.option("--out", default="demo", type=click.Path(file_okay=False, path_type=Path), help="Folder to write.")
@click.option("--conversations", default=512, help="How many conversations the dataset holds.")
def main(out: Path, conversations: int) -> None:
    rng = random.Random(0)
    rows = [conversation(rng) for _ in range(conversations)]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "chat.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    texts = [m["content"] for r in rows for m in r["messages"]] + ["user assistant system"]
    tokenizer = build_tokenizer(texts, out / "tiny-qwen3")
    build_model(tokenizer, out / "tiny-qwen3")
    click.echo(f"wrote {out}/chat.jsonl ({len(rows)} conversations) and {out}/tiny-qwen3")


if __name__ == "__main__":
    main()
