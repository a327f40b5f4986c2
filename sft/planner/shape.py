"""The numbers of a model the planner needs, read from its config.json (no weights)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a model the planner needs; build one by hand or with model_shape()."""

    name: str
    total_params: int  # counted once, tied embeddings included once
    largest_layer_params: int  # the largest single parameter tensor (Qwen3: the embedding)
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)

    def splits_heads(self, n: int) -> bool:
        """Whether DeepSpeed's Ulysses can split this model's attention over n GPUs: each takes heads / n query
        heads, and the key/value heads divide by n or are copied n / kv times (ulysses_sp.py's own checks)."""
        kv = self.num_kv_heads
        return self.num_heads % n == 0 and (kv % n == 0 or n % kv == 0)

    def sequence_parallel_degrees(self, gpus: int) -> tuple[int, ...]:
        """Every n > 1 over which rows can be split on a node of `gpus` GPUs (n divides them), smallest first."""
        return tuple(n for n in range(2, gpus + 1) if gpus % n == 0 and self.splits_heads(n))


def model_shape(model: str, revision: str | None = None) -> ModelShape:
    """Read a model's config.json (folder or Hub name) and count its parameters on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(model, revision=revision)
    with torch.device("meta"):  # shapes only: no memory, no weights downloaded
        net = AutoModelForCausalLM.from_config(cfg)
    named = list(net.named_parameters())  # tied weights appear once
    text = cfg.get_text_config()
    heads = text.num_attention_heads
    return ModelShape(
        name=model,
        total_params=sum(p.numel() for _, p in named),
        largest_layer_params=max(p.numel() for _, p in named),
        hidden_size=text.hidden_size,
        intermediate_size=text.intermediate_size,
        num_layers=text.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        vocab_size=text.vocab_size,
        qk_norm=any(n.endswith("q_norm.weight") for n, _ in named),
    )
