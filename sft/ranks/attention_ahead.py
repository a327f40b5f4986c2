"""FlashAttention-4's kernels compiled while the ranks start, in a process of their own on the first rank's GPU.

Started by the controller's launch beside the launcher (controller/launch.py), never by hand:
    python -m sft.ranks.attention_ahead RUN_SPEC.json
It holds the run's kernel lock (RunSpec.attention_lock, taken for it by the launch) until it ends; each rank
waits for that lock at its first attention call (`wait`), then finds the kernels in FlashAttention-4's own
persistent cache (OUTPUT/run/compile-cache/flash-attention, set by the launch for both).

Why: FlashAttention-4 compiles its CuTe kernels at their first call, in the first step's forward and backward: five
kernels for Qwen3-4B, seconds on the critical path of a new output folder's first step. A rank reaches its first
attention call only after its imports, the model, DeepSpeed and the compiled layer's first graph; this process had the
same five kernels ready in about that time, and no rank waited for it (measured: docs/speed.md,
'FlashAttention-4's kernels compiled while the ranks start'). The kernels the run asks for depend on the attention's
shape (heads, key/value heads, head size, dtype) and on how the rows reach it (packed sequences or padded rows), not on
the model's depth or width: so this process runs the run's model with only as many layers as it has kinds of layers, on
rows shaped as the run's (TRL's collator, the same padding), forward and backward, through Transformers' own
FlashAttention-4 path. Written by hand: none of these libraries compiles its kernels ahead. Should anything differ, the
rank compiles what is missing at its first call, as it would without this process: a failure here costs only time.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..handoff import lock_held

WAIT_SECONDS = 300  # a rank waits at most this long for this process, then compiles what it lacks itself


def wait(lock: str, timeout_s: float = WAIT_SECONDS) -> float:
    """Block until the process compiling the kernels ahead has ended (its lock is free): the seconds waited.
    After timeout_s it gives up waiting (the rank compiles itself)."""
    began = time.monotonic()
    while lock_held(lock) and time.monotonic() - began < timeout_s:
        time.sleep(0.05)
    return time.monotonic() - began


def layers_of_each_kind(config) -> int:
    """The fewest first layers with one of each kind the model has (full, sliding-window attention, ...)."""
    kinds = list(getattr(config, "layer_types", None) or [])
    return max(kinds.index(kind) for kind in set(kinds)) + 1 if kinds else 1


def rows(spec, vocab: int) -> list[dict]:
    """One micro-batch shaped as the run's: rows of max_length tokens, each two packed sequences (the run's
    packing), or padded rows of one sequence each, the first at max_length."""
    length, examples = spec.max_length, []
    for row in range(spec.micro_batch):
        n = length if spec.packing or row == 0 else max(length // (row + 1), 1)
        example = {"input_ids": [(7 * i + row) % vocab for i in range(n)]}
        if spec.packing:
            example["seq_lengths"] = [length - length // 4, length // 4] if length >= 4 else [length]
        examples.append(example)
    return examples


def compile_ahead(spec) -> str:
    """Run the run's kind of layers forward and backward on its kind of rows: FlashAttention-4 compiles (or loads)
    each kernel the run's first step will ask for. Returns what was run, for the log."""
    import torch
    from transformers import AutoConfig, AutoModel
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    config = AutoConfig.from_pretrained(spec.model, revision=spec.model_revision,
                                        trust_remote_code=spec.trust_remote_code)
    text = config.get_text_config()
    layers = layers_of_each_kind(text)
    text.num_hidden_layers = layers
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:layers]
    with torch.device("cuda"):  # the decoder without its LM head: the run's logits are no attention kernel's
        model = AutoModel.from_config(config, trust_remote_code=spec.trust_remote_code,
                                      attn_implementation=spec.attention,
                                      dtype=torch.bfloat16 if spec.bf16 else torch.float32)
    padding = spec.trainer["pad_to_multiple_of"]  # the ranks' (on GPUs)
    collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=spec.packing,
                                              pad_to_multiple_of=None if padding == "auto" else padding)
    batch = collate(rows(spec, text.vocab_size))
    batch.pop("labels")
    batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch.items()}
    model(**batch).last_hidden_state.float().square().mean().backward()
    torch.cuda.synchronize()
    return f"{layers} layer(s) of {spec.model}'s shape, {spec.micro_batch} row(s) of {spec.max_length:,} tokens"


def main(spec_path: str) -> int:
    from ..handoff import RunSpec, write_json
    from ..lifeline import die_with_parent

    die_with_parent()  # the controller's launch ends this process with itself
    began = time.monotonic()
    spec = RunSpec.load(Path(spec_path))
    try:
        what = compile_ahead(spec)
    except Exception as e:  # the ranks compile what they lack themselves
        print(f"FlashAttention-4's kernels were not compiled ahead ({type(e).__name__}: {e}); the ranks compile "
              "them at their first step", flush=True)
        return 1
    seconds = time.monotonic() - began
    cache = Path(os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "."))
    kernels = sorted(str(p.relative_to(cache)) for p in cache.rglob("*.o")) if cache.is_dir() else []
    print(f"FlashAttention-4's kernels ready in {seconds:.1f} s ({what}; {len(kernels)} in {cache})", flush=True)
    if spec.report_dir:  # what the ranks should find there, for the tests
        write_json(Path(spec.report_dir) / "attention-ahead.json", {"seconds": round(seconds, 1), "kernels": kernels})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
