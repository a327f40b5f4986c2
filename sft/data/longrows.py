"""Rows longer than SFT_MAX_LENGTH (SFT_LONG_ROWS): every training row counted in the data step, before any
rank starts, then truncated, dropped or refused.

Counted in tokens as TRL's SFTTrainer prepares a row (tokens.Labeller: its own tokenisation, the chat template
with the row's tools, every dataset shape), before truncation. Truncation is TRL's own: its truncation with
SFT_PACKING=false and its packing ("bfd", which cuts each sequence at max_length) both cut a long row to its
first max_length tokens. Drop: the rows that fit are kept, by their position in the training rows as the
ranks draw them (DataPlan.dropped), so the ranks count nothing again. Error: the data step's refusal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from . import checks

if TYPE_CHECKING:
    from datasets import Dataset

    from .tokens import Labeller

DONE = {"truncate": "will be cut to it", "drop": "are left out", "error": "are refused"}


@dataclass(frozen=True)
class LongRows:
    """How many training rows are longer than max_length, the longest, and what is done with them."""

    rows: int
    longer: int
    longest: int  # tokens of the longest row
    shortest: int
    max_length: int
    action: str  # SFT_LONG_ROWS: truncate, drop, error

    def line(self) -> str:
        """One line for the log."""
        if not self.longer:
            return (f"data: long rows: none of the {self.rows:,} training rows is longer than SFT_MAX_LENGTH="
                    f"{self.max_length} tokens (the longest: {self.longest:,})")
        return (f"data: long rows: {self.longer:,} of {self.rows:,} training rows are longer than SFT_MAX_LENGTH="
                f"{self.max_length} tokens and {DONE[self.action]} (the longest: {self.longest:,}; "
                f"SFT_LONG_ROWS={self.action})")

    def problem(self, packing: bool) -> str | None:
        """Why these rows cannot be trained on as asked, with what would do; None: they can."""
        every = self.longer == self.rows and self.rows > 0
        if self.action == "error" and self.longer:
            return (f"SFT_LONG_ROWS=error: {self.longer:,} of {self.rows:,} training rows are longer than "
                    f"SFT_MAX_LENGTH={self.max_length} tokens (the longest: {self.longest:,}): raise SFT_MAX_LENGTH "
                    f"to {self.longest}, or set SFT_LONG_ROWS=truncate or drop")
        if self.action == "drop" and every:
            return (f"SFT_LONG_ROWS=drop: every one of the {self.rows:,} training rows is longer than "
                    f"SFT_MAX_LENGTH={self.max_length} tokens, so none is left: raise SFT_MAX_LENGTH (the longest: "
                    f"{self.longest:,}) or set SFT_LONG_ROWS=truncate")
        if self.action == "truncate" and every and not packing:
            return (f"SFT_DATASET: all {self.rows} rows are longer than SFT_MAX_LENGTH={self.max_length} tokens "
                    f"(shortest {self.shortest}, longest {self.longest}): {checks.CUT.format(limit=self.max_length)}")
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure(dataset: Dataset, labeller: Labeller) -> list[int]:
    """Every row's tokens before truncation, a chunk at a time (nothing cached next to the data)."""
    from .tokens import in_memory

    lengths: list[int] = []
    for start, stop in checks.chunks(len(dataset)):
        lengths += labeller.lengths(in_memory(dataset, start, stop))
    return lengths


def count(lengths: list[int], max_length: int, action: str) -> LongRows:
    return LongRows(rows=len(lengths), longer=sum(n > max_length for n in lengths), longest=max(lengths, default=0),
                    shortest=min(lengths, default=0), max_length=max_length, action=action)


def dropped(lengths: list[int], max_length: int) -> list[int]:
    """The positions of the rows SFT_LONG_ROWS=drop leaves out."""
    return [i for i, n in enumerate(lengths) if n > max_length]


def without(dataset: Dataset, drop: list[int]) -> Dataset:
    """The rows but those at `drop` (what the controller checked and what the ranks train on)."""
    if not drop:
        return dataset
    gone = set(drop)
    return dataset.select([i for i in range(len(dataset)) if i not in gone])
