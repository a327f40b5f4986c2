"""Rows longer than SFT_MAX_LENGTH (SFT_LONG_ROWS): every training row counted in the data step, before any
rank starts, then truncated, dropped or refused.

Counted in tokens as TRL's SFTTrainer prepares a row (tokens.Labeller: its own tokenisation, the chat template
with the row's tools, every dataset shape), before truncation. Truncation is TRL's own: its truncation with
SFT_PACKING=false and its packing ("bfd", which cuts each sequence at max_length) both cut a long row to its
first max_length tokens. Drop: the rows that fit are kept, by their position in the training rows as the
ranks draw them (DataPlan.dropped), so the ranks count nothing again. Error: the data step's refusal.
"""

from __future__ import annotations

import itertools
import multiprocessing
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import checks

if TYPE_CHECKING:
    from datasets import Dataset

    from .tokens import Labeller

DONE = {"truncate": "will be cut to it", "drop": "are left out", "error": "are refused"}
COVER = 99  # the percent of the rows an SFT_MAX_LENGTH suggested for long rows fits at least
ROUND = 128  # a suggested SFT_MAX_LENGTH is whole blocks of flex attention's (planner/memory.py's MASK_BLOCK)
SUMMARY = ("rows", "longer", "longest", "shortest", "max_length", "action")  # run/summary.json's long_rows


@dataclass(frozen=True)
class LongRows:
    """How many training rows are longer than max_length, the longest, and what is done with them; for a refusal,
    the first of them and an SFT_MAX_LENGTH that fits most rows (count() says which)."""

    rows: int
    longer: int
    longest: int  # tokens of the longest row
    shortest: int
    max_length: int
    action: str  # SFT_LONG_ROWS: truncate, drop, error
    first: tuple[tuple[int, int], ...] = ()  # (position in the training rows, tokens) of the first long rows
    longest_at: int = 0  # the longest row's position
    suggested: int = 0  # an SFT_MAX_LENGTH above max_length for them (0: none is reasonable)
    over_suggested: int = 0  # the rows still longer than it

    def line(self) -> str:
        """One line for the log."""
        if not self.longer:
            return (f"data: long rows: none of the {self.rows:,} training rows is longer than SFT_MAX_LENGTH="
                    f"{self.max_length} tokens (the longest: {self.longest:,})")
        return (f"data: long rows: {self.longer:,} of {self.rows:,} training rows are longer than SFT_MAX_LENGTH="
                f"{self.max_length} tokens and {DONE[self.action]} (the longest: {self.longest:,}; "
                f"SFT_LONG_ROWS={self.action})")

    def problem(self, packing: bool, where: str = "") -> str | None:
        """Why these rows cannot be trained on as asked, with what would do; None: they can. `where`: the source
        whose rows the training rows are, in order (its path), to name the long ones by its rows."""
        every = self.longer == self.rows and self.rows > 0
        if self.action == "error" and self.longer:
            return (f"SFT_LONG_ROWS=error: {self.longer:,} of {self.rows:,} training rows are longer than "
                    f"SFT_MAX_LENGTH={self.max_length} tokens, {self.named(where)}: {self.advice()}")
        if self.action == "drop" and every:
            return (f"SFT_LONG_ROWS=drop: every one of the {self.rows:,} training rows is longer than "
                    f"SFT_MAX_LENGTH={self.max_length} tokens, so none is left: {self._raise()}"
                    f"{' (the others left out)' if self.over_suggested else ''}, or set SFT_LONG_ROWS=truncate")
        if self.action == "truncate" and every and not packing:
            return (f"SFT_DATASET: all {self.rows} rows are longer than SFT_MAX_LENGTH={self.max_length} tokens "
                    f"(shortest {self.shortest}, longest {self.longest}): {checks.CUT.format(limit=self.max_length)}")
        return None

    def named(self, where: str = "") -> str:
        """The first long rows and the longest, counted from 1: 'in chat.jsonl rows 4 (95 tokens), 9 (70) and 12
        more, the longest row 300 (10,000,000 tokens)'; by their place in the training rows where no one source's
        rows are the training rows in order (`where` empty: a mixture, rows held out or left out)."""
        row = "row" if where else "training row"
        shown = ", ".join(f"{i + 1} ({n:,}{' tokens' if k == 0 else ''})" for k, (i, n) in enumerate(self.first))
        more = f" and {self.longer - len(self.first):,} more" if self.longer > len(self.first) else ""
        longest = ("" if self.longest_at in (i for i, _ in self.first) else
                   f", the longest {row} {self.longest_at + 1} ({self.longest:,} tokens)")
        return f"{f'in {where} ' if where else ''}{row}{'s' if self.longer > 1 else ''} {shown}{more}{longest}"

    def advice(self) -> str:
        """What would train on them: a longer SFT_MAX_LENGTH where one fits them all or most, and truncate or drop for
        those it does not."""
        either = "SFT_LONG_ROWS=truncate (each cut to SFT_MAX_LENGTH) or drop (left out)"
        if not self.suggested:
            return (f"{self._fit(self.longer)} of the rows fit SFT_MAX_LENGTH={self.max_length} (the longest would "
                    f"need {self.longest:,}): set {either}")
        if not self.over_suggested:
            return f"{self._raise()}, or set {either}"
        return (f"{self._raise()}, with {either} for the {self.over_suggested:,} still longer; or keep "
                f"{self.max_length} with either")

    def _raise(self) -> str:
        """'raise SFT_MAX_LENGTH to 128 (every row fits)', or '... to 512, which 99.9% of the rows fit'."""
        if not self.over_suggested:
            return f"raise SFT_MAX_LENGTH to {self.suggested:,} (every row fits)"
        return f"raise SFT_MAX_LENGTH to {self.suggested:,}, which {self._fit(self.over_suggested)} of the rows fit"

    def _fit(self, longer: int) -> str:
        """The share of the rows that fit, rounded down: 99.9%, not 100%, while a row does not."""
        return f"{int(1000 * (self.rows - longer) / self.rows) / 10:g}%"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k in SUMMARY}


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
    """The long rows of these lengths: how many, in the same pass the first checks.SHOWN of them, and where there are
    any, the longest's position and a longer SFT_MAX_LENGTH for them (suggest)."""
    at = (i for i, n in enumerate(lengths) if n > max_length)
    first = tuple((i, lengths[i]) for i in itertools.islice(at, checks.SHOWN))
    longer, longest = len(first) + sum(1 for _ in at), max(lengths, default=0)
    found = LongRows(rows=len(lengths), longer=longer, longest=longest, shortest=min(lengths, default=0),
                     max_length=max_length, action=action, first=first)
    if not longer:
        return found
    suggested = suggest(lengths, max_length)
    return replace(found, longest_at=lengths.index(longest), suggested=suggested,
                   over_suggested=sum(n > suggested for n in lengths) if suggested else 0)


def suggest(lengths: list[int], max_length: int) -> int:
    """An SFT_MAX_LENGTH for rows longer than max_length, in whole ROUNDs: the longest row's, where it is at most twice
    the one that fits COVER of the rows (or max_length); else that one; 0 where neither is above max_length (a few
    outliers: truncate or drop them)."""
    def whole(n: int) -> int:
        return -(-n // ROUND) * ROUND

    most = whole(sorted(lengths)[-(-COVER * len(lengths) // 100) - 1])  # the COVER-th percentile, rounded up
    every = whole(max(lengths))
    chosen = every if every <= 2 * max(most, max_length) else most
    return chosen if chosen > max_length else 0


def dropped(lengths: list[int], max_length: int) -> list[int]:
    """The positions of the rows SFT_LONG_ROWS=drop leaves out."""
    return [i for i, n in enumerate(lengths) if n > max_length]


def without(dataset: Dataset, drop: list[int]) -> Dataset:
    """The rows but those at `drop` (what the controller checked and what the ranks train on)."""
    if not drop:
        return dataset
    gone = set(drop)
    return dataset.select([i for i in range(len(dataset)) if i not in gone])
