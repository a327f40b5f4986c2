"""Conversations longer than SFT_MAX_LENGTH: counted before training, then truncated, dropped or refused as
SFT_LONG_ROWS says.

Counted in tokens as TRL renders a conversation: the tokenizer's chat template, with the row's tools and
chat_template_kwargs (trl.data_utils._tokenize, called from SFTTrainer's dataset preparation). Truncation is
TRL's own (its packing and its truncation both cut at max_length); this module only counts, and drops by
selecting the rows that fit. Two callers: each rank on the data it trains on (ranks/train.py), and the
controller's input checks for SFT_LONG_ROWS=error (controller/inputs.py), so a refusal comes before any
rank starts.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datasets import Dataset

COLUMN = "sft_tokens"  # the count, in a column datasets caches with the data (dropped before training)
DONE = {"truncate": "truncated to it", "drop": "dropped", "error": "refused"}


class LongRowsError(Exception):
    """SFT_LONG_ROWS=error and some conversations are longer than SFT_MAX_LENGTH, or drop leaves none."""


@dataclass(frozen=True)
class LongRows:
    """How many conversations are longer than max_length, the longest, and what was done with them."""

    conversations: int
    longer: int
    longest: int  # tokens of the longest conversation
    max_length: int
    action: str  # SFT_LONG_ROWS: truncate, drop, error

    def line(self) -> str:
        """One line for the log."""
        if not self.longer:
            return (f"long rows: none of the {self.conversations:,} conversations is longer than SFT_MAX_LENGTH="
                    f"{self.max_length} tokens (the longest: {self.longest:,})")
        return (f"long rows: {self.longer:,} of {self.conversations:,} conversations are longer than "
                f"SFT_MAX_LENGTH={self.max_length} tokens (the longest: {self.longest:,}): "
                f"{DONE[self.action]} (SFT_LONG_ROWS={self.action})")

    def problem(self) -> str | None:
        """Why these rows cannot be trained on as asked, with what would do; None: they can."""
        if self.action == "error" and self.longer:
            return (f"SFT_LONG_ROWS=error: {self.longer:,} of {self.conversations:,} conversations are longer than "
                    f"SFT_MAX_LENGTH={self.max_length} tokens (the longest: {self.longest:,}): raise SFT_MAX_LENGTH "
                    f"to {self.longest}, or set SFT_LONG_ROWS=truncate or drop")
        if self.action == "drop" and self.longer == self.conversations:
            return (f"SFT_LONG_ROWS=drop: every one of the {self.conversations:,} conversations is longer than "
                    f"SFT_MAX_LENGTH={self.max_length} tokens, so none is left: raise SFT_MAX_LENGTH (the longest: "
                    f"{self.longest:,}) or set SFT_LONG_ROWS=truncate")
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def count(dataset: Dataset, tokenizer: Any, max_length: int, action: str) -> tuple[list[int], LongRows]:
    """Each conversation's tokens, and what they come to. In a process group rank 0 counts first and the
    others read datasets' cache of its count."""
    with _first_on_rank_0():
        counted = dataset.map(_tokens, fn_kwargs={"tokenizer": tokenizer}, desc="Counting tokens per conversation")
    tokens = counted[COLUMN]
    found = LongRows(conversations=len(tokens), longer=sum(n > max_length for n in tokens),
                     longest=max(tokens, default=0), max_length=max_length, action=action)
    return tokens, found


def apply(dataset: Dataset, tokenizer: Any, max_length: int, action: str) -> tuple[Dataset, LongRows]:
    """The dataset to train on and what was found: all of it (truncate: TRL cuts each row at max_length), or
    without the long conversations (drop). Raises LongRowsError where the setting refuses the data."""
    tokens, found = count(dataset, tokenizer, max_length, action)
    if (problem := found.problem()) is not None:
        raise LongRowsError(problem)
    if action == "drop" and found.longer:
        dataset = dataset.select([i for i, n in enumerate(tokens) if n <= max_length])
    return dataset, found


def prepare(dataset: Dataset, model: str, max_length: int, action: str) -> tuple[Dataset, dict[str, Any]]:
    """In a rank: `apply` with the model's tokenizer, said in the log by rank 0 before training."""
    import os

    from transformers import AutoTokenizer

    dataset, found = apply(dataset, AutoTokenizer.from_pretrained(model), max_length, action)
    if int(os.environ.get("RANK", "0")) == 0:
        print(found.line(), flush=True)
    return dataset, found.to_dict()


def _tokens(example: dict[str, Any], tokenizer: Any) -> dict[str, int]:
    tools = example.get("tools")
    tools = json.loads(tools) if isinstance(tools, str) else tools
    rendered = tokenizer.apply_chat_template(example["messages"], tools=tools, tokenize=True, return_dict=True,
                                             **(example.get("chat_template_kwargs") or {}))
    return {COLUMN: len(rendered["input_ids"])}


def _first_on_rank_0():
    import torch.distributed as dist

    if not dist.is_initialized():
        return contextlib.nullcontext()
    from accelerate import PartialState

    return PartialState().main_process_first()
