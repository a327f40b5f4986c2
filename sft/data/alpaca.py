"""Alpaca's rows (instruction, input, output; optionally system and history) as TRL's conversational
prompt/completion, the way LLaMA-Factory reads its 'alpaca' format: the instruction and the input, joined by a new
line, are the user's turn, the output the assistant's; history's [question, answer] pairs come before them.

Why by hand: TRL reads prompt/completion, messages and text, not Alpaca, which many datasets (and every
LLaMA-Factory or Axolotl user's own data) are in. Read so, the rows learn the output only (SFT_LOSS_ON=auto on
prompt/completion), as LLaMA-Factory trains them, and go through the same checks as any other rows.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from . import DataError

if TYPE_CHECKING:
    from datasets import Dataset

COLUMNS = ("instruction", "output")  # what makes a dataset Alpaca's: both, and none of TRL's own columns
OPTIONAL = ("input", "system", "history")
TRL_COLUMNS = ("prompt", "completion", "messages", "conversations", "text")
SHOWN = 5  # rows named in a problem; the rest counted


def is_alpaca(dataset: Dataset) -> bool:
    names = set(dataset.column_names)
    return set(COLUMNS) <= names and not names & set(TRL_COLUMNS)


def as_prompt_completion(dataset: Dataset, label: str) -> Dataset:
    """The rows as conversational prompt/completion, every other column kept; held in memory, nothing written.
    Raises DataError naming the rows whose history is not a list of [question, answer] pairs."""
    present = [c for c in (*COLUMNS, *OPTIONAL) if c in dataset.column_names]
    if "history" in present and (bad := _bad_history(dataset["history"])):
        shown = ", ".join(str(n) for n in bad[:SHOWN]) + (f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else "")
        raise DataError([f"{label}: Alpaca's 'history' of row(s) {shown} is not a list of [question, answer] "
                         "pairs of text: fix those rows, or drop the column"])

    def convert(batch: dict[str, list]) -> dict[str, list]:
        rows = [dict(zip(present, values, strict=True)) for values in zip(*(batch[c] for c in present), strict=True)]
        return {"prompt": [_prompt(r) for r in rows],
                "completion": [[{"role": "assistant", "content": _text(r["output"])}] for r in rows]}

    return dataset.map(convert, batched=True, remove_columns=present, keep_in_memory=True,
                       desc="Alpaca's columns as prompt/completion")


def _bad_history(histories: list) -> list[int]:
    """The rows (numbered from 1) whose history is neither empty nor pairs of text."""
    def pairs(h) -> bool:
        return h is None or (isinstance(h, list) and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(t, str) for t in p) for p in h))

    return [n for n, h in enumerate(histories, start=1) if not pairs(h)]


def _prompt(row: dict[str, Any]) -> list[dict[str, str]]:
    turns = [{"role": "system", "content": _text(row["system"])}] if row.get("system") else []
    for question, answer in row.get("history") or []:
        turns += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    asked = "\n".join(_text(row[c]) for c in ("instruction", "input") if row.get(c))
    return [*turns, {"role": "user", "content": asked}]


def _text(value: Any) -> str:
    """A cell as text: a string as it is, nothing as '' (the empty-row check then names the row), any other value
    as JSON (a number, a list: what a CSV or a loose JSON file may hold)."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
