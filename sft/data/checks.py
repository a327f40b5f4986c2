"""Every problem in the rows, found before any rank starts, one line each naming the source, the rows and the
fix. The row checks read whole columns through Arrow (a 100,000-row file in well under a second); the checks
that need tokens tokenise only as many rows as it takes to settle them (tokens.Labeller).

TRL itself looks at the first row only and fails inside every rank on the first bad one (KeyError: 'text'
for a message without 'role', IndexError for an empty conversation): hence these checks, by hand.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .shapes import Shape

if TYPE_CHECKING:
    import pyarrow as pa
    from datasets import Dataset

    from .tokens import Labeller

ROLES = ("system", "user", "assistant", "tool")
SHOWN = 3  # row numbers named per problem
FIRST_CHUNK, LAST_CHUNK = 64, 4096  # rows tokenised at a time by the checks that need tokens, doubling


def rows_named(rows: list[int]) -> str:
    """'row 4', 'rows 4, 9, 12 and 40 more' (counted from 1, as a user counts lines)."""
    shown = ", ".join(str(r + 1) for r in rows[:SHOWN])
    more = f" and {len(rows) - SHOWN} more" if len(rows) > SHOWN else ""
    return f"row{'s' if len(rows) > 1 else ''} {shown}{more}"


def row_problems(dataset: Dataset, shape: Shape, label: str, loss_on: str, empty_rows: str = "error") -> list[str]:
    """What is wrong in the rows of one source of this shape (with SFT_EMPTY_ROWS=error, the rows that teach
    nothing too: empty.py)."""
    from . import empty

    table = dataset.with_format("arrow")[:]
    found = []
    if empty_rows == "error" and (silent := empty.positions(dataset, shape)):
        found.append(f"{label}: {len(silent)} row(s) teach nothing ({empty.WHAT}: {rows_named(silent)}): such a row "
                     "teaches the model to answer nothing: fill or remove them, or set SFT_EMPTY_ROWS=drop to leave "
                     "them out")
    for column in shape.columns:
        if column in shape.message_columns:
            learned = loss_on == "assistant" and column != "prompt"
            found += _messages(table.column(column).combine_chunks(), column, shape, label, need_assistant=learned)
        else:
            found += _strings(table.column(column).combine_chunks(), column, label)
    return found


def _strings(col: pa.Array, column: str, label: str) -> list[str]:
    import pyarrow as pa

    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return [f"{label}: {column!r} holds {col.type} values, not text: write them as strings"]
    nulls = _where(col.is_null())
    return [f"{label}: {column!r} is missing or null in {rows_named(nulls)}"] if nulls else []


def _messages(col: pa.Array, column: str, shape: Shape, label: str, need_assistant: bool) -> list[str]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if (messages := _flat(col, shape.role_key)) is None:
        return [f"{label}: {column!r} holds {col.type}, not lists of messages with a {shape.role_key!r}"]
    flat, parents, parsed, item = messages
    found = []
    lengths = pc.list_value_length(col)
    if empty := _where(pc.or_kleene(lengths.is_null(), pc.equal(lengths, 0))):
        found.append(f"{label}: {len(empty)} empty conversation(s) in {column!r} ({rows_named(empty)}): remove them")
    roles = pa.array([_role(m, shape.role_key) for m in parsed], pa.string()) if parsed is not None \
        else pc.struct_field(flat, shape.role_key)
    for alias, role in shape.aliases:  # ShareGPT's human and gpt: what sources.combine gives the template
        roles = pc.if_else(pc.fill_null(pc.equal(roles, alias), False), pa.scalar(role), roles)
    bad = pc.invert(pc.fill_null(pc.is_in(roles, value_set=pa.array(ROLES)), False)).to_numpy(zero_copy_only=False)
    if bad.any():
        seen = pc.unique(pc.filter(roles, pa.array(bad))).to_pylist()
        names = sorted({"(none)" if r is None else str(r) for r in seen})
        rows = sorted(set(parents[bad].tolist()))
        hint = " (ShareGPT's human and gpt are user and assistant)" if {"human", "gpt"} & set(names) else ""
        found.append(f"{label}: role {', '.join(names)} in {column!r} of {rows_named(rows)}: a role must be one of "
                     f"{', '.join(ROLES)}{hint}")
    found += _contents(flat, parsed, parents, roles, item, shape, f"{label}: in {column!r} of")
    if need_assistant:
        said = np.zeros(len(col), dtype=bool)
        said[parents[pc.fill_null(pc.equal(roles, "assistant"), False).to_numpy(zero_copy_only=False)]] = True
        said[empty] = True  # already named
        if silent := np.flatnonzero(~said).tolist():
            found.append(f"{label}: no assistant turn in {rows_named(silent)}: with SFT_LOSS_ON=assistant such a "
                         "row has no token to learn (TRL stops on it)")
    return found


def _flat(col: pa.Array, role_key: str):
    """(every row's messages in one array, the row of each, the messages read where they are JSON text (else None),
    their Arrow type); None where the column holds no lists of messages with a role."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = col.type
    item = kind.value_type if pa.types.is_list(kind) or pa.types.is_large_list(kind) else None
    as_json = isinstance(item, pa.JsonType)  # datasets keeps messages of differing keys as JSON text
    if item is None or not (as_json or (pa.types.is_struct(item) and item.get_field_index(role_key) >= 0)):
        return None
    flat, parents = pc.list_flatten(col), pc.list_parent_indices(col).to_numpy()
    parsed = [json.loads(m) if m is not None else None for m in flat.storage.to_pylist()] if as_json else None
    return flat, parents, parsed, item


def _calls(flat, parsed, item) -> list[bool]:
    """Whether each message carries a tool call (a non-empty 'tool_calls')."""
    import pyarrow.compute as pc

    if parsed is not None:
        return [bool(m.get("tool_calls")) if isinstance(m, dict) else False for m in parsed]
    if item.get_field_index("tool_calls") < 0:
        return [False] * len(flat)
    return pc.fill_null(pc.greater(pc.list_value_length(pc.struct_field(flat, "tool_calls")), 0), False).to_pylist()


def tool_rows(dataset: Dataset, shape: Shape) -> tuple[list[int], list[int]]:
    """(the rows with a tool call in a message, the rows with tools defined in a 'tools' column), counted from 0."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = dataset.with_format("arrow")[:]
    calls: set[int] = set()
    for column in shape.message_columns:
        if (messages := _flat(table.column(column).combine_chunks(), shape.role_key)) is not None:
            flat, parents, parsed, item = messages
            calls.update(int(parents[i]) for i, called in enumerate(_calls(flat, parsed, item)) if called)
    if "tools" not in table.column_names:
        return sorted(calls), []
    tools = table.column("tools").combine_chunks()
    listed = pa.types.is_list(tools.type) or pa.types.is_large_list(tools.type)
    given = pc.fill_null(pc.greater(pc.list_value_length(tools), 0), False) if listed else tools.is_valid()
    return sorted(calls), _where(given)


def _contents(flat, parsed, parents, roles, item, shape: Shape, where: str) -> list[str]:
    """Messages whose content no chat template renders: null or missing (an assistant's aside: empty.py), a list of
    parts (OpenAI's [{"type": "text", ...}]), which Qwen3's template renders as nothing, silently, and ChatML's fails
    on, or an object or a number. `item`: the messages' Arrow type (a struct, or JSON text where their keys differ:
    `parsed` holds them read)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    key = shape.content_key
    calls = _calls(flat, parsed, item)
    if parsed is not None:
        contents = [m.get(key) if isinstance(m, dict) else None for m in parsed]
    else:
        has = item.get_field_index(key) >= 0
        field = pc.struct_field(flat, key) if has else pa.nulls(len(flat))
        if isinstance(field.type, pa.JsonType):  # strings in some messages, lists in others
            contents = [json.loads(c) if c is not None else None for c in field.storage.to_pylist()]
        elif pa.types.is_string(field.type) or pa.types.is_large_string(field.type) or not has:
            contents = [None if n else "" for n in field.is_null().to_pylist()]
        else:
            contents = field.to_pylist()
    roles = roles.to_pylist()
    # an assistant's turn without content is a row that teaches nothing (empty.py: SFT_EMPTY_ROWS may drop it)
    absent = [c is None and not calls[i] and roles[i] != "assistant" for i, c in enumerate(contents)]
    missing = sorted({int(parents[i]) for i, a in enumerate(absent) if a})
    parts = sorted({int(parents[i]) for i, c in enumerate(contents) if isinstance(c, list)})
    # an object ({"text": ...}) or a number: Qwen3's template renders it as '', ChatML's as Python's repr
    others = sorted({int(parents[i]) for i, c in enumerate(contents)
                     if c is not None and not isinstance(c, (str, list))})
    named = sorted({str(roles[i]) for i, a in enumerate(absent) if a})
    found = []
    if missing:
        article = "an" if named[0].startswith("a") else "a"  # system, user, tool; or a role the checks named
        found.append(f"{where} {rows_named(missing)}: {article} {'/'.join(named)} message with no {key!r} (null or "
                     "missing): give each message its text")
    if parts:
        found.append(f"{where} {rows_named(parts)}: {key!r} is a list of parts (OpenAI's [{{\"type\": \"text\", "
                     "\"text\": ...}]), which a text model's chat template renders as nothing or fails on: write "
                     "each message's content as one string")
    if others:
        found.append(f"{where} {rows_named(others)}: {key!r} is an object or a number, not text, which a chat template "
                     "renders as nothing or as Python would print it: write each message's content as one string")
    return found


def _role(message: dict | None, key: str) -> str | None:
    value = message.get(key) if isinstance(message, dict) else None
    return value if isinstance(value, str) else None


def _where(mask) -> list[int]:
    import numpy as np

    return np.flatnonzero(mask.to_numpy(zero_copy_only=False)).tolist()


def shapes_differ(shapes: dict[str, Shape], var: str) -> list[str]:
    """A mixture trains as one shape: every source must have it."""
    if len({s.name for s in shapes.values()}) <= 1:
        return []
    listed = "; ".join(f"{name}: {s.name}" for name, s in shapes.items())
    return [f"{var}: the sources have different shapes ({listed}): mix sources of one shape"]


def chunks(rows: int):
    """(start, stop) of the rows to tokenise in turn: few first, since the first usually settle a check."""
    start, size = 0, FIRST_CHUNK
    while start < rows:
        yield start, min(start + size, rows)
        start, size = start + size, min(size * 2, LAST_CHUNK)


def fewer(on_gpu: bool) -> str:
    """What fits one optimizer step in the rows. A rank a GPU; with no GPU, SFT_CPU_RANKS says how many ranks."""
    ranks = "use fewer GPUs" if on_gpu else "start fewer CPU ranks (SFT_CPU_RANKS)"
    return (f"take fewer rows per step (SFT_TOKENS_PER_STEP, or SFT_MICRO_BATCH and SFT_GRAD_ACCUM), {ranks}, "
            "or bring more rows")


def too_few_rows(rows: int, needed: int, per_step: str, label: str, on_gpu: bool) -> list[str]:
    """Unpacked: one optimizer step takes `needed` rows."""
    if rows >= needed:
        return []
    return [f"{label}: {rows} training row(s), and one optimizer step takes {needed} ({per_step}): {fewer(on_gpu)}"]


def too_few_packed(dataset: Dataset, lengths: list[int], labeller: Labeller, needed: int, per_step: str,
                   label: str, on_gpu: bool) -> list[str]:
    """Packed: one step takes `needed` rows of max_length tokens. Rows holding that many tokens (`lengths`, each
    row's, as the long-row count measured them) pack into at least as many rows; else all of them are packed as
    TRL packs them."""
    from .tokens import in_memory

    tokens = sum(lengths)
    if tokens >= needed * labeller.max_length:
        return []
    packed = len(labeller.prepare(in_memory(dataset, 0, len(dataset)), packing=True))
    if packed >= needed:
        return []
    return [f"{label}: its {len(dataset)} training rows ({tokens} tokens) pack into {packed} row(s) of "
            f"SFT_MAX_LENGTH={labeller.max_length} tokens, and one optimizer step takes {needed} ({per_step}): "
            f"{fewer(on_gpu)}"]


def all_too_long(dataset: Dataset, labeller: Labeller, label: str) -> tuple[list[str], str | None]:
    """Packing off: (a problem when every row is longer than max_length, a note on the first rows otherwise).
    Rows are tokenised until one fits."""
    from .tokens import in_memory

    limit, lengths = labeller.max_length, []
    for start, stop in chunks(len(dataset)):
        lengths += labeller.lengths(in_memory(dataset, start, stop))
        if min(lengths) <= limit:
            over = sum(n > limit for n in lengths)
            note = (f"{label}: {over} of the first {len(lengths)} rows are longer than SFT_MAX_LENGTH={limit} "
                    "tokens and will be cut to it") if over else None
            return [], note
    return [f"{label}: all {len(lengths)} rows are longer than SFT_MAX_LENGTH={limit} tokens (shortest "
            f"{min(lengths)}, longest {max(lengths)}): {CUT.format(limit=limit)}"], None


CUT = ("with SFT_PACKING=false TRL cuts each to its first {limit} tokens and drops the rows left with no token to "
       "learn; raise SFT_MAX_LENGTH")
