"""The training rows' tokens: found in OUTPUT/run/tokens/ when a start before made them from the same rows, tokenizer
and labels, else made by the data step (which needs every row's length anyway); kept there once the job holds the
output folder, for the ranks and the next start (sft/data/cache.py says what is kept and what its key holds)."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..console import say
from ..data import cache
from ..settings import Settings

if TYPE_CHECKING:
    from datasets import Dataset

    from ..handoff import DataSource
    from ..data.tokens import Labeller


@dataclass
class Tokens:
    """The training rows' tokens (before SFT_LONG_ROWS=drop), their key, and where they came from."""

    rows: Dataset
    key: dict[str, Any]
    folder: Path  # OUTPUT/run/tokens: where they are kept
    reused: bool  # found there, made by an earlier start
    seconds: float  # to tokenise them, or to find and load them

    def line(self) -> str:
        if self.reused:
            return (f"data: tokens: the {len(self.rows):,} training rows' tokens reused from {self.folder} "
                    f"({self.seconds:.1f} s; the same rows, tokenizer and labels as the start that made them)")
        return f"data: tokens: {len(self.rows):,} training rows tokenised in {self.seconds:.1f} s"

    def to_dict(self) -> dict[str, Any]:
        return {"reused": self.reused, "seconds": round(self.seconds, 3), "rows": len(self.rows),
                "path": str(self.folder)}


def find(s: Settings, rows: Dataset, sources: list[DataSource], labeller: Labeller) -> Tokens:
    """The rows' tokens: those kept in the output folder when their key matches, else made now (in a private folder
    until the job keeps them: keep)."""
    from ..data import longrows

    began = time.perf_counter()
    folder = s.output_path / "run" / cache.FOLDER
    wanted = cache.key(rows, sources, labeller)
    if (kept := cache.load(folder, wanted)) is not None:
        return Tokens(kept, wanted, folder, True, time.perf_counter() - began)
    made = longrows.tokenise(rows, labeller, cache.staging())
    return Tokens(made, wanted, folder, False, time.perf_counter() - began)


def keep(tokens: Tokens | None) -> str:
    """The folder the ranks read the tokens from ("": none to read), written first where they are new. The job calls
    it holding the output folder's lock."""
    if tokens is None:
        return ""
    if not tokens.reused:
        began = time.perf_counter()
        try:
            cache.save(tokens.rows, tokens.folder, tokens.key)
        except OSError as e:  # the job says it as a folder it cannot write in; what the tokens needed, with it
            free = shutil.disk_usage(tokens.folder.parent).free
            raise OSError(e.errno, f"{e.strerror or e}: the tokenised rows take {tokens.rows.data.nbytes / 1e6:.1f} "
                                   f"MB, {free / 1e6:.1f} MB free there") from e
        seconds = time.perf_counter() - began
        say(f"data: tokens kept in {tokens.folder} for the ranks and later starts ({seconds:.1f} s)")
    return str(tokens.folder)
