"""The numbers of a model the planner needs (controller/inputs.py reads them from its config.json)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a model the planner needs; build one by hand or with controller/inputs.py::model_shape."""

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
    # The attention kernels (fields.ATTENTIONS) its transformers class runs, by the class's own _supports_* flags
    # (Gemma2 has no sdpa, GPT-2 no flex attention); empty: not known (a shape built by hand), none refused
    attentions: tuple[str, ...] = ()
    model_class: str = ""  # transformers' class for it (Qwen3ForCausalLM); "" where not known

    @property
    def class_name(self) -> str:
        """How messages name the model's class."""
        return self.model_class or f"{self.name}'s model class"

    def runs(self, attention: str) -> bool:
        """Whether the model's class runs this attention kernel (unknown: assumed)."""
        return not self.attentions or attention in self.attentions

    def splits_heads(self, n: int) -> bool:
        """Whether DeepSpeed's Ulysses can split this model's attention over n GPUs: each takes heads / n query
        heads, and the key/value heads divide by n or are copied n / kv times (ulysses_sp.py's own checks)."""
        kv = self.num_kv_heads
        return self.num_heads % n == 0 and (kv % n == 0 or n % kv == 0)

    def sequence_parallel_degrees(self, gpus: int) -> tuple[int, ...]:
        """Every n > 1 over which rows can be split on a node of `gpus` GPUs (n divides them), smallest first."""
        return tuple(n for n in range(2, gpus + 1) if gpus % n == 0 and self.splits_heads(n))
