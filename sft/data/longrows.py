"""Rows longer than SFT_MAX_LENGTH (SFT_LONG_ROWS): every training row counted in the data step, before any
rank starts, then truncated, dropped or refused.

Counted in tokens as TRL's SFTTrainer prepares a row (tokens.Labeller: its own tokenisation, the chat template
with the row's tools, every dataset shape), before truncation. Truncation is TRL's own: its truncation with
SFT_PACKING=false and its packing ("bfd", which cuts each sequence at max_length) both cut a long row to its
first max_length tokens. Drop: the rows that fit are kept, by their position in the training rows as the
ranks draw them (DataPlan.dropped), so the ranks count nothing again. Error: the data step's refusal.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import asdict, dataclass
from pathlib import Path
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


SPAN = 2_048  # rows a worker tokenises at a time
_WORK: tuple[Dataset, Labeller, Path] | None = None  # what forked workers read (set just before the fork)


def tokenise(dataset: Dataset, labeller: Labeller, folder: Path, processes: int | None = None) -> Dataset:
    """Every row's tokens and labels before truncation (Labeller.tokenise), a part per span saved under `folder`
    (nothing cached next to the data), read back as one dataset in the rows' order: their lengths are the long-row
    count's, and the rows themselves what the ranks train on (cache.py).

    TRL's preparation is one process (and the chat template's rendering is Python): 100,000 short conversations
    took about 2 minutes of one busy core here, before any rank starts. So the rows are tokenised by as many
    forked processes as the ranks prepare them with (tokens.processes); forked, so the tokenizer and the rows
    are inherited, not pickled, and each writes its part where the others can read it, not back through a pipe."""
    from datasets import Dataset, concatenate_datasets, load_from_disk

    from .tokens import processes as preparing

    global _WORK
    if not (rows := len(dataset)):  # TRL's preparation reads a first row
        return Dataset.from_dict({"input_ids": [], "labels": []})
    workers = processes or preparing(rows)
    size = max(1, min(SPAN, -(-rows // workers)))  # at least one span per worker
    spans = [(start, min(start + size, rows)) for start in range(0, rows, size)]
    _WORK = (dataset, labeller, folder)
    try:
        if workers <= 1:
            parts = [_part(span) for span in spans]
        else:
            with multiprocessing.get_context("fork").Pool(min(workers, len(spans))) as pool:
                parts = pool.map(_part, spans)
    finally:
        _WORK = None
    return concatenate_datasets([load_from_disk(p) for p in parts])


def measure(dataset: Dataset, labeller: Labeller, processes: int | None = None) -> list[int]:
    """Every row's tokens before truncation."""
    import tempfile

    from .cache import lengths

    with tempfile.TemporaryDirectory(prefix="sft-lengths-") as folder:
        return lengths(tokenise(dataset, labeller, Path(folder), processes))


def _part(span: tuple[int, int]) -> str:
    assert _WORK is not None, "tokenise() sets the work before it forks"
    from .tokens import in_memory

    dataset, labeller, folder = _WORK
    path = folder / f"part-{span[0]:012d}"
    labeller.tokenise(in_memory(dataset, *span)).save_to_disk(str(path))
    return str(path)


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
