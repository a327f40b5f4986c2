"""Rows that teach nothing (SFT_EMPTY_ROWS): an empty or blank text, an empty completion, an assistant turn with no
content and no tool call. Trained on, such a row teaches the model to answer nothing; TRL trains on it silently.

Found through Arrow, whole columns at once, in each source as loaded: refused with their row numbers (error, the
default: checks.row_problems), or left out of the source before its rows are drawn (drop), by the controller and
every rank through `without`, so both see the same rows.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .shapes import Shape, shape_of

if TYPE_CHECKING:
    import pyarrow as pa
    from datasets import Dataset

WHAT = "an empty text, an empty completion or an assistant turn with no content"


def positions(dataset: Dataset, shape: Shape) -> list[int]:
    """The rows (from 0) of one source that teach nothing."""
    import numpy as np

    table = dataset.with_format("arrow")[:]
    empty = np.zeros(len(dataset), dtype=bool)
    for column in shape.columns:
        col = table.column(column).combine_chunks()
        if column in shape.message_columns:
            if column != "prompt":  # a prompt's turns teach nothing by design
                empty |= _silent_turns(col, shape)
        elif column != "prompt":
            empty |= _blank(col)
    return np.flatnonzero(empty).tolist()


def without(dataset: Dataset) -> tuple[Dataset, int]:
    """The source without its rows that teach nothing, and how many were left out (datasets' select: an index
    mapping, nothing copied or written)."""
    shape = shape_of(dataset)
    if shape is None:
        return dataset, 0
    gone = set(positions(dataset, shape))
    if not gone:
        return dataset, 0
    return dataset.select([i for i in range(len(dataset)) if i not in gone]), len(gone)


def _blank(col: pa.Array):
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return False  # checks.row_problems names a column of another type
    trimmed = pc.utf8_trim_whitespace(col)
    return pc.fill_null(pc.equal(pc.utf8_length(trimmed), 0), False).to_numpy(zero_copy_only=False)


def _silent_turns(col: pa.Array, shape: Shape):
    """Per row: an assistant turn with no content and no tool call (a ShareGPT row's 'gpt' turn is one)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    found = np.zeros(len(col), dtype=bool)
    kind = col.type
    item = kind.value_type if pa.types.is_list(kind) or pa.types.is_large_list(kind) else None
    if item is None:
        return found  # checks.row_problems names it
    flat, parents = pc.list_flatten(col), pc.list_parent_indices(col).to_numpy()
    if isinstance(item, pa.JsonType):  # messages of differing keys, kept as JSON text: read one by one
        silent = [_silent(json.loads(m) if m is not None else None, shape) for m in flat.storage.to_pylist()]
    elif pa.types.is_struct(item) and item.get_field_index(shape.role_key) >= 0:
        silent = [_silent(m, shape) for m in _assistant_turns(flat, shape)]
    else:
        return found
    hit = np.asarray(silent, dtype=bool)
    found[parents[hit]] = True
    return found


def _assistant_turns(flat: pa.Array, shape: Shape) -> list[dict | None]:
    """Each message as a dict where it is an assistant's turn (None for the others: never silent); only those are
    made Python objects."""
    import pyarrow as pa
    import pyarrow.compute as pc

    roles = pc.struct_field(flat, shape.role_key).to_pylist()
    wanted = [i for i, r in enumerate(roles) if shape.roles.get(r, r) == "assistant"]
    turns: list[dict | None] = [None] * len(roles)
    for i, message in zip(wanted, flat.take(pa.array(wanted, pa.int64())).to_pylist(), strict=True):
        turns[i] = message
    return turns


def _silent(message: Any, shape: Shape) -> bool:
    if not isinstance(message, dict):
        return False
    role = message.get(shape.role_key)
    if shape.roles.get(role, role) != "assistant" or message.get("tool_calls"):
        return False
    content = message.get(shape.content_key)
    if content is None:
        return True
    if isinstance(content, str):
        return not content.strip()
    if isinstance(content, list):  # parts: [{"type": "text", "text": ...}]
        return not any((p.get("text") or "").strip() if isinstance(p, dict) else str(p).strip() for p in content)
    return False
