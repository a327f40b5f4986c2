"""A 'system' column beside the conversations (one string a row: the system prompt), as many ShareGPT datasets carry
it and LLaMA-Factory's dataset_info reads it: made the conversation's first message, with role system.

Why by hand: TRL reads the messages alone, and a source keeps only its shape's columns (sources.combine), so the
system prompt was left out of training, silently. The same for the other conversational shapes ('messages', and a
prompt of messages: its first turn), so that a column means one thing whatever the shape. A null or blank value
adds nothing. A conversation that already opens with a system turn keeps it: the same text is one turn, not two;
a different one is refused with its rows, since keeping either would drop the other silently (LLaMA-Factory keeps
the turn and drops the column's). Text rows have no chat template to give it to: the column stays ignored there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import DataError

if TYPE_CHECKING:
    from datasets import Dataset

    from .shapes import Shape

COLUMN = "system"
SHOWN = 5  # rows named in a problem; the rest counted


def folded(dataset: Dataset, label: str) -> Dataset:
    """The rows with their system column as each conversation's first message, the column removed; rows of no
    conversational shape as they are. Held in memory, nothing written. Raises DataError naming the rows whose
    column is not text or differs from the conversation's own system turn."""
    from datasets import Features

    from .shapes import shape_of

    shape = shape_of(dataset) if COLUMN in dataset.column_names else None
    if shape is None or not shape.conversational:
        return dataset
    column = shape.columns[0]  # 'messages', 'conversations', or the prompt's messages
    if problems := _problems(dataset, column, shape, label):
        raise DataError(problems)

    def fold(batch: dict[str, list]) -> dict[str, list]:
        return {column: [_with_system(turns, text, shape) for turns, text in zip(batch[column], batch[COLUMN],
                                                                                 strict=True)]}

    # the messages keep their types: the system turn gets every other key a message of the source has, as None
    features = Features({k: v for k, v in dataset.features.items() if k != COLUMN})
    return dataset.map(fold, batched=True, remove_columns=[COLUMN], features=features, keep_in_memory=True,
                       desc="the system column as the first message")


def _with_system(turns: list | None, text: Any, shape: Shape) -> list | None:
    if not turns or not _given(text) or _opening(turns, shape) is not None:
        return turns  # an empty conversation stays empty: the checks name it
    return [{shape.role_key: "system", shape.content_key: text}, *turns]


def _given(text: Any) -> bool:
    return isinstance(text, str) and bool(text.strip())


def _opening(turns: list, shape: Shape) -> str | None:
    """The conversation's own system prompt ('' for a system turn without text), None where it opens otherwise."""
    first = turns[0] if isinstance(turns[0], dict) else {}
    if first.get(shape.role_key) != "system":
        return None
    content = first.get(shape.content_key)
    return content if isinstance(content, str) else ""


def _problems(dataset: Dataset, column: str, shape: Shape, label: str) -> list[str]:
    """The rows (from 1) whose system column is not text, and those whose conversation opens with another."""
    not_text, differ = [], []
    for start, batch in enumerate(dataset.select_columns([COLUMN, column]).iter(batch_size=1000)):
        for n, (text, turns) in enumerate(zip(batch[COLUMN], batch[column], strict=True), start=start * 1000 + 1):
            if text is not None and not isinstance(text, str):
                not_text.append(n)
            elif _given(text) and turns and (own := _opening(turns, shape)) is not None and own.strip() != text.strip():
                differ.append(n)
    found = []
    if not_text:
        found.append(f"{label}: the {COLUMN!r} column of {_named(not_text)} is not text: write each row's system "
                     "prompt as a string (or null for none)")
    if differ:
        found.append(f"{label}: in {_named(differ)}, the {COLUMN!r} column and the system turn the conversation "
                     "opens with differ, and keeping one would drop the other: make them the same, or keep one (null "
                     "the column, or remove the turn)")
    return found


def _named(rows: list[int]) -> str:
    shown = ", ".join(str(n) for n in rows[:SHOWN]) + (f" and {len(rows) - SHOWN} more" if len(rows) > SHOWN else "")
    return f"row{'s' if len(rows) > 1 else ''} {shown}"
